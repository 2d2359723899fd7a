#!/usr/bin/env bash
# main's Megatron policy worker as it would be without PR #3322 (e4b8f3e5e): 7ea279abf's file with that PR's own diff
# reversed. The PR changed only this file (and a test); 13 later commits touched the file, so the reverse applies with
# offsets and fuzz 1. Checked after: no refit offload names finalize_async_save, and #3322's helper is gone.
#   bash bench/nemo_rl/make_pre3322.sh RL_GIT OUT_DIR      # OUT_DIR/megatron_policy_worker.py
set -euo pipefail
RL_GIT=${1:?RL_GIT}; OUT=${2:?OUT_DIR}
F=nemo_rl/models/policy/workers/megatron_policy_worker.py
mkdir -p "$OUT"
git -C "$RL_GIT" show "7ea279abf:$F" > "$OUT/megatron_policy_worker.py"
git -C "$RL_GIT" diff e4b8f3e5e^ e4b8f3e5e -- "$F" | patch -R -s --no-backup-if-mismatch "$OUT/megatron_policy_worker.py"
python3 - "$OUT/megatron_policy_worker.py" <<'PY'
import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
impl = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "MegatronPolicyWorkerImpl")
methods = {n.name: n for n in impl.body if isinstance(n, ast.FunctionDef)}
for name in ("offload_before_refit", "offload_after_refit"):
    called = {a.attr for a in ast.walk(methods[name]) if isinstance(a, ast.Attribute)}
    assert "finalize_async_save" not in called, name
assert "_requires_nvrx_cuda_cache_release" not in methods and "finalize_async_save" in methods
print("pre-#3322 worker:", sys.argv[1])
PY
