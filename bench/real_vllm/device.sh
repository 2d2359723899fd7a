#!/usr/bin/env bash
# Real-vLLM run of the discard family on the lent GPU machine (issue 9). Three calls back to back
# (the machine stays warm ~30 s), each carrying one part of the bundle built by
# ../shared/tools/vllm-device-bundle.sh into .vllm-bundle/ (git-ignored):
#   call 1: carry [.vllm-bundle/vllm-site.part0]  command: bash bench/real_vllm/device.sh part 0
#   call 2: carry [.vllm-bundle/vllm-site.part1]  command: bash bench/real_vllm/device.sh part 1
#   call 3: carry [.vllm-bundle/vllm-site.part2, .vllm-bundle/vllm-site.SHA256SUMS]
#           command: bash bench/real_vllm/device.sh run main_l1 main_l2 main_shim async_shim
#   call 4 (still warm): bash bench/real_vllm/device.sh run fp8_l1 fp8_shim draft_l1 draft_shim
#           FP8 needs compressed-tensors==0.17.0 and loguru (not in the bundle): pip download them
#           (--no-deps, pure Python) into .whl/colo_vllm/ and carry that folder too.
# Then, here: python3 bench/bench_discard.py --real-vllm DIR [DIR ...] merges the JSON files that came
# back into bench/results/discard_real_vllm.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
B=${VLLM_BUNDLE:-.vllm-bundle}  # VLLM_BUNDLE=.vllm-bundle-0251 for the vLLM 0.25.1 build
what=${1:?part N | run NAME...}; shift
if [ "$what" = part ]; then
    cp "$B/vllm-site.part$1" /tmp/ && ls -l /tmp/vllm-site.part*
    exit
fi
if [ ! -d /tmp/site/vllm ]; then
    cp "$B/vllm-site.part2" /tmp/ || exit 1
    (cd /tmp && sha256sum -c "$REPO/$B/vllm-site.SHA256SUMS") || exit 1
    cat /tmp/vllm-site.part0 /tmp/vllm-site.part1 /tmp/vllm-site.part2 | python3 -c \
        "import sys,tarfile;tarfile.open(fileobj=sys.stdin.buffer,mode='r|xz').extractall('/tmp/site',filter='data')" || exit 1
fi
for w in .whl/colo_vllm/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/site; done  # compressed-tensors (FP8)
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \
    VLLM_ALLOW_INSECURE_SERIALIZATION=1 TOKENIZERS_PARALLELISM=false
LD_LIBRARY_PATH=$(python3 -c 'import nvidia,os;print(os.path.join(list(nvidia.__path__)[0],"cu13","lib"))'):${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH BENCH_MODELS=/tmp/models
export BENCH_GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
export BENCH_MODEL_DESC="random Llama, hidden 2048, 16 layers, MLP 5632, bf16 (main); hidden 512, 4 layers (small)"
M=bench/real_vllm/make_random_llama.py
[ -f /tmp/models/main/config.json ] || python3 $M /tmp/models/main --hidden 2048 --layers 16 --inter 5632 >/tmp/mk_main.log 2>&1 &
[ -f /tmp/models/small/config.json ] || python3 $M /tmp/models/small --hidden 512 --layers 4 --inter 1024 >/tmp/mk_small.log 2>&1 &
wait
tail -n 2 /tmp/mk_*.log
python3 -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
R=/tmp/bench_runs_$$
mkdir -p $R
python3 bench/real_vllm/scenarios.py $R "$@"
for n in "$@"; do cp $R/$n.json "$OUT/" 2>/dev/null; tail -n 60 $R/$n.log; done > "$OUT/logs.txt"
grep -h "Error\|error\|Traceback" $R/*.log | sort | uniq -c | sort -rn | head -20
