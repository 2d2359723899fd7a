#!/usr/bin/env bash
# bench/offload on the lent H200 (one GPU), one call:
#   kind nvidia-h200, carry [".whl"], timeout_s 600, command: bash bench/offload/device.sh
# .whl/mcore holds megatron_core-0.19.2-*.whl (as for bench/e2e), installed into /tmp/e2esite/mcore.
# Extra arguments go to bench_offload.py (e.g. --paths mcore --rounds 5).
# Back under $OUT: offload_h200.json (copy it to bench/offload/results/) and offload_h200.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ ! -d /tmp/e2esite/mcore/megatron ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/e2esite/mcore .whl/mcore/*.whl || exit 1
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
grep -E "^(MemTotal|MemAvailable)" /proc/meminfo
python3 -c 'import torch, wrapt; print("torch", torch.__version__, "wrapt", wrapt.__version__)'
python3 bench/offload/bench_offload.py --site /tmp/e2esite --out "$OUT/offload_h200.json" "$@" 2>&1 \
    | tee "$OUT/offload_h200.log"
