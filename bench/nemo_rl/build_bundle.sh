#!/usr/bin/env bash
# Build what NeMo-RL main's own GRPO needs on the lent GPU machine beyond its image (torch 2.11.0+cu130, Python 3.12)
# and beyond the vLLM 0.25.1 bundle (../shared/tools/vllm-device-bundle.sh), as xz parts that fit one device call each.
#
#   RL_GIT=... MB_GIT=... MLM_GIT=... bash bench/nemo_rl/build_bundle.sh .nemo-bundle
#
# RL_GIT, MB_GIT, MLM_GIT: git directories holding NVIDIA-NeMo/RL 7ea279abf, NVIDIA-NeMo/Megatron-Bridge 8c46dc42
# (main's 3rdparty submodule) and NVIDIA/Megatron-LM 14346b65 (the Bridge's submodule). Each is exported with
# `git archive` (main's code is never committed here) and only the trees the job imports travel: nemo_rl/, examples/;
# src/megatron/bridge; megatron/.
# Wheels (py3.12 manylinux x86_64, --no-deps, every one pinned): what main's GRPO Megatron path imports and the image
# lacks, found by importing main's modules on a CPU (README "Verified on CPU"). Trimmed, never patched: Ray without
# its Java jars, dashboard web client, rllib/serve/tune/train/data/llm (main imports none; Ray starts without the
# dashboard); pulp without its bundled CBC solver binaries (modelopt imports pulp for NAS search only).
# Transformer Engine 2.15.0 (main's lock): the cu13 core wheel with every non-sm_90 cubin zeroed (fatbin_keep.py),
# and the transformer_engine_torch sdist, built on the device (device.sh stage).
set -euo pipefail
DIR=${1:?usage: build_bundle.sh DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-python3}
mkdir -p "$DIR"; DIR=$(cd "$DIR" && pwd)
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
T0=$(date +%s)
mkdir -p "$WORK/b/src/rl" "$WORK/b/src/mb" "$WORK/b/src/mlm" "$WORK/whl" "$WORK/b/site" "$WORK/b/te"
git -C "${RL_GIT:?}" archive 7ea279abf nemo_rl examples pyproject.toml LICENSE | tar -x -C "$WORK/b/src/rl"
git -C "${MB_GIT:?}" archive 8c46dc42 src/megatron LICENSE | tar -x -C "$WORK/b/src/mb"
git -C "${MLM_GIT:?}" archive 14346b65 megatron LICENSE | tar -x -C "$WORK/b/src/mlm"
PLAT="--platform manylinux2014_x86_64 --platform manylinux1_x86_64"
for n in 17 24 26 27 28 31 34 35 39; do PLAT="$PLAT --platform manylinux_2_${n}_x86_64"; done
WHEELS="ray==2.56.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
transformers==5.8.1 tokenizers==0.22.2 datasets==5.0.0 dill==0.4.1 multiprocess==0.70.19 torchdata==0.11.0
hydra-core==1.3.2 omegaconf==2.3.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 tensordict==0.15.3 pyvers==0.2.3
nvidia-modelopt==0.46.0 pulp==3.3.2 nvidia-resiliency-ext==0.6.0 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12
uvicorn==0.55.0 colored==2.2.3"
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT \
    -d "$WORK/whl" $WHEELS
# omegaconf 2.3's antlr runtime exists only as an sdist: a pure-Python wheel built here
"$PY" -m pip wheel -q --no-deps -w "$WORK/whl" antlr4-python3-runtime==4.9.3
for w in "$WORK"/whl/*.whl; do "$PY" -m zipfile -e "$w" "$WORK/b/site"; done  # pip --target refuses glibc 2.39 tags here
rm -rf "$WORK"/b/site/bin "$WORK"/b/site/ray/{jars,rllib,serve,tune,train,data,llm} "$WORK/b/site/ray/dashboard/client/build" \
    "$WORK/b/site/pulp/solverdir/cbc"
find "$WORK/b/site" -name '*.so' -path '*/ray/*' -exec chmod +x {} +
chmod +x "$WORK"/b/site/ray/core/src/ray/*/* 2>/dev/null || true
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT \
    -d "$WORK/tewhl" transformer-engine==2.15.0 transformer-engine-cu13==2.15.0
# the sdist is taken from the index as a file: `pip download` of it would run its setup.py, which needs torch here
"$PY" - "$WORK/b/te" <<'PY'
import hashlib, re, sys, urllib.request
name = "transformer_engine_torch-2.15.0.tar.gz"
page = urllib.request.urlopen("https://pypi.org/simple/transformer-engine-torch/", timeout=60).read().decode()
url, digest = next(m for m in re.findall(r'href="([^"]+)#sha256=([0-9a-f]+)"', page) if m[0].endswith("/" + name))
data = urllib.request.urlopen(url, timeout=300).read()
assert hashlib.sha256(data).hexdigest() == digest, "sha256 mismatch: " + name
open(f"{sys.argv[1]}/{name}", "wb").write(data)
PY
for w in "$WORK"/tewhl/*.whl; do "$PY" -m zipfile -e "$w" "$WORK/b/te/site"; done
"$PY" "$HERE/fatbin_keep.py" "$WORK/b/te/site/transformer_engine/wheel_lib/libtransformer_engine.so" 90
cp "$HERE/cublaslt_grouped_stub.c" "$HERE/cublaslt_grouped_stub.map" "$WORK/b/te/"
du -sh "$WORK"/b/* "$WORK"/b/src/* | sed "s|$WORK/b/||"
cd "$WORK/b"
XZ_OPT="-6 -T${XZ_THREADS:-1}" tar -cJf "$WORK/nemo.tar.xz" src site te
cd "$DIR"
rm -f nemo-bundle.part*
split -n 3 -d -a 1 "$WORK/nemo.tar.xz" nemo-bundle.part
sha256sum nemo-bundle.part* > nemo-bundle.SHA256SUMS
# Found missing on the H100 after the parts were built (main's Policy.print_node_ip_and_gpu_id imports prettytable at
# setup): carried beside part 2 as wheels (`extra/`), unpacked into site/ by device.sh
rm -rf extra && "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT \
    -d extra prettytable==3.18.0 wcwidth==0.9.1
# Runs d0/d1 (issue 33's (d)): main 7ea279abf with PR #3322 reversed, made from upstream's own diff of its one file
# (git-ignored like the rest; device.sh builds the tree rl-pre3322 from main's with this file in place)
bash "$HERE/make_pre3322.sh" "$RL_GIT" extra/pre3322
ls -l nemo-bundle.part*
echo "built in $(( $(date +%s) - T0 )) s"
