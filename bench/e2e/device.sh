#!/usr/bin/env bash
# The colocated e2e harness on the lent GPU machine. The vLLM bundle (../shared/tools/vllm-device-bundle.sh
# into .vllm-bundle/, git-ignored) travels in three calls back to back while the machine stays warm:
#   call 1: carry [.vllm-bundle/vllm-site.part0, .whl]      command: bash bench/e2e/device.sh part 0
#   call 2: carry [.vllm-bundle/vllm-site.part1]            command: bash bench/e2e/device.sh part 1
#   call 3: carry [.vllm-bundle/vllm-site.part2, .vllm-bundle/vllm-site.SHA256SUMS]
#           command: bash bench/e2e/device.sh run --runs shim@0.7.0:2,noshim@0.7.0:3 --budget-s 540
#   call 4..: (still warm) bash bench/e2e/device.sh run --runs shim@0.7.0:10,sync_save@0.7.0:10 --kv-free-gib F
#   ranks (issue 25), on nvidia-h200-x2 after the three calls: bash bench/e2e/device.sh run --runs
#           noshim@0.7.0:3:ranks=2,shim@0.7.0:10:ranks=2,sync_save@0.7.0:4:ranks=2 --budget-s 560 (never run yet)
#   sweep (issue 34), while warm: bash bench/e2e/device.sh sweep --call N [sweep.py's plan options]: call N of
#           `python bench/e2e/sweep.py plan` (runs, estimated seconds, host memory), --val-period 0,
#           --kv-free-gib 133.76 (measured at size full; other sizes: less their extra engine weights)
# vLLM 0.25.1: VLLM_VERSION=0.25.1 ../shared/tools/vllm-device-bundle.sh .vllm-bundle-0251, then the same calls with
# VLLM_BUNDLE=.vllm-bundle-0251 before bash and that folder's parts carried.
# .whl holds mcore/megatron_core-0.19.2-*.whl, nvrx060/ and nvrx070/ (NVRx 0.6.0 / 0.7.0 wheels), installed
# into /tmp/e2esite/{mcore,nvrx060,nvrx070} (one --target per library, as bench_fence_megatron.py uses).
# What comes back under $OUT: e2e.json (the runs of this call) and logs.tar.gz (per-run logs, progress).
# Then, here: python bench/e2e/run.py --merge FILES... --out bench/e2e/results/e2e_h200.json
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
B=${VLLM_BUNDLE:-.vllm-bundle}  # VLLM_BUNDLE=.vllm-bundle-0251 for the vLLM 0.25.1 build
what=${1:?part N | run ARGS... | sweep --call N ...}; shift
if [ "$what" = part ]; then
    bash bench/real_vllm/device.sh part "$1" || exit 1
    for lib in mcore nvrx060 nvrx070; do
        for w in .whl/$lib/*.whl; do
            [ -f "$w" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/e2esite/$lib "$w"
        done
    done
    ls /tmp/e2esite 2>/dev/null
    exit 0
fi
if [ "$what" = sweep ]; then
    RUNS=$(python3 bench/e2e/sweep.py specs "$@") || exit 1
    set -- --runs "$RUNS" --val-period 0 --kv-free-gib 133.76 --kv-free-size full
fi
if [ ! -d /tmp/site/vllm ]; then
    cp "$B/vllm-site.part2" /tmp/ || exit 1
    (cd /tmp && sha256sum -c "$REPO/$B/vllm-site.SHA256SUMS") || exit 1
    cat /tmp/vllm-site.part0 /tmp/vllm-site.part1 /tmp/vllm-site.part2 | python3 -c \
        "import sys,tarfile;tarfile.open(fileobj=sys.stdin.buffer,mode='r|xz').extractall('/tmp/site',filter='data')" || exit 1
    rm -f /tmp/vllm-site.part*
fi
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \
    VLLM_ALLOW_INSECURE_SERIALIZATION=1 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0 \
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LD_LIBRARY_PATH=$(python3 -c 'import nvidia,os;print(os.path.join(list(nvidia.__path__)[0],"cu13","lib"))'):${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
df -h /dev/shm | tail -1
R=/tmp/e2e_res/$(date +%s)
mkdir -p "$R"
python3 bench/e2e/run.py --site /tmp/e2esite --out "$R" --clean-shm "$@"
rc=$?
cp "$R/e2e.json" "$OUT/" 2>/dev/null
(cd "$R" && tar czf "$OUT/logs.tar.gz" progress-*.json log-*.txt 2>/dev/null)
for f in "$R"/log-*.txt; do echo "== $f"; grep -v "^\[e2e\] step" "$f" | grep -i "error\|Traceback\|out of memory" | sort | uniq -c | sort -rn | head -8; done
exit $rc
