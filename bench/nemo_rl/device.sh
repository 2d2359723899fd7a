#!/usr/bin/env bash
# NeMo-RL main's own colocated GRPO (issue 33) on the lent GPU machine, staged from a bare machine.
# Bundles (git-ignored, built here): .vllm-bundle-0251/ (VLLM_VERSION=0.25.1 ../shared/tools/vllm-device-bundle.sh)
# and .nemo-bundle/ (bench/nemo_rl/build_bundle.sh); each has three parts, one of each per call (~55 MiB a call
# with the tree). Calls back to back, while the machine stays warm (README.md says which to carry):
#   bash bench/nemo_rl/device.sh part 0        # copies both part 0s to /tmp
#   bash bench/nemo_rl/device.sh part 1
#   bash bench/nemo_rl/device.sh part 2        # copies, checks, unpacks, builds TE's torch extension, makes inputs
#                                              # (carry .nemo-bundle/extra too: wheels the parts lack)
#   export CALL_T0=$(date +%s); bash bench/nemo_rl/device.sh run b,a 6     # b: COLO_SHIM=1, a: main as is, c: async_save false; in order
#   bash bench/nemo_rl/device.sh te-check      # alone, one call carrying the NeMo bundle's three parts: unpack, TE
#                                              # build, TE on the GPU, main's Megatron imports (te_check.py)
# Each run leaves $OUT/run_<X>.json (report.py), $OUT/run_<X>_logs.tar.gz and $OUT/stage.json on staging.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
VB=$(realpath -m "${VLLM_BUNDLE:-.vllm-bundle-0251}")
NB=$(realpath -m "${NEMO_BUNDLE:-.nemo-bundle}")
N=${NEMO_STAGE:-/tmp/nemo}  # NEMO_STAGE: a test points it elsewhere
what=${1:?part N | run a|b|c STEPS}
shift
NEMO_ONLY=""
if [ "$what" = te-check ]; then  # one call: the NeMo bundle alone, TE built and run on the GPU, main's imports
    cp "$NB"/nemo-bundle.part[012] /tmp/ || exit 1
    NEMO_ONLY=1; what=part; set -- 2
    # what the vLLM bundle would bring and TE/main import: pydantic (TE's recipes), pyzmq (main's policy utils)
    mkdir -p $N/check-site && for w in "$NB"/check-wheels/*.whl; do python3 -m zipfile -e "$w" $N/check-site; done
elif [ "$what" = part ]; then
    cp "$VB/vllm-site.part$1" "$NB/nemo-bundle.part$1" /tmp/ || exit 1
fi
if [ "$what" = part ]; then
    ls -l /tmp/vllm-site.part* /tmp/nemo-bundle.part*
    [ "$1" = 2 ] || exit 0
    t0=$(date +%s)
    (cd /tmp && { [ -n "$NEMO_ONLY" ] || sha256sum -c "$VB/vllm-site.SHA256SUMS"; } && sha256sum -c "$NB/nemo-bundle.SHA256SUMS") || exit 1
    mkdir -p /tmp/site $N
    [ -n "$NEMO_ONLY" ] || cat /tmp/vllm-site.part0 /tmp/vllm-site.part1 /tmp/vllm-site.part2 | xz -dc | tar -x -C /tmp/site || exit 1
    cat /tmp/nemo-bundle.part0 /tmp/nemo-bundle.part1 /tmp/nemo-bundle.part2 | xz -dc | tar -x -C $N || exit 1
    rm -f /tmp/vllm-site.part* /tmp/nemo-bundle.part*
    for w in "$NB"/extra/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" $N/site; done  # build_bundle.sh: extra/
    # runs d0/d1: main's tree with PR #3322 reversed (build_bundle.sh made the one file that differs)
    PRE3322=$NB/extra/pre3322/megatron_policy_worker.py
    if [ -f "$PRE3322" ]; then
        cp -r $N/src/rl $N/src/rl-pre3322 && cp "$PRE3322" $N/src/rl-pre3322/nemo_rl/models/policy/workers/ || exit 1
    fi
    t1=$(date +%s)
    CU=$(python3 -c 'import nvidia,os;print(os.path.join(list(nvidia.__path__)[0],"cu13"))')
    INC=$(python3 - <<'PY'
import nvidia, os, glob
root = list(nvidia.__path__)[0]
print(":".join(sorted({os.path.dirname(h) for n in ("cudnn.h", "nccl.h") for h in glob.glob(f"{root}/*/include/{n}")})))
PY
)
    # cuBLAS here may predate TE 2.15's grouped-GEMM symbol: preload a stub only then (cublaslt_grouped_stub.c)
    PRE=""
    if ! python3 -c "import ctypes,sys;ctypes.CDLL('$CU/lib/libcublasLt.so.13').cublasLtGroupedMatrixLayoutInit_internal" 2>/dev/null; then
        gcc -shared -fPIC -O2 -Wl,--version-script=$N/te/cublaslt_grouped_stub.map -o $N/te/libcublaslt_grouped_stub.so \
            $N/te/cublaslt_grouped_stub.c && PRE=$N/te/libcublaslt_grouped_stub.so
    fi
    cat > $N/env.sh <<ENV
export PYTHONPATH=$N/cs:$N/src/rl:$N/src/mb/src:$N/src/mlm:$N/site:$N/te/site:$N/te/torch_ext:$REPO/bench/nemo_rl/stubs:/tmp/site:$N/check-site
export LD_LIBRARY_PATH=$CU/lib:\${LD_LIBRARY_PATH:-}
export LD_PRELOAD=$PRE
export NEMO_RL_PY_EXECUTABLES_SYSTEM=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ALLOW_INSECURE_SERIALIZATION=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export RAY_USAGE_STATS_ENABLED=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ENV
    . $N/env.sh
    # the inputs (CPU) are made while TE's extension builds
    (PYTHONPATH=$REPO python3 -m colo_shim bundle $N/cs > $N/cs.log 2>&1 || tail -3 $N/cs.log
     python3 bench/nemo_rl/make_inputs.py $N/inputs > $N/inputs.log 2>&1; echo $? > $N/inputs.rc) &
    INPUTS=$!
    (cd $N/te && tar -xzf transformer_engine_torch-2.15.0.tar.gz && cd transformer_engine_torch-2.15.0 && \
        CPLUS_INCLUDE_PATH=$INC NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS=16 PYTHONPATH=$N/te/site \
        python3 -m pip install -q --no-build-isolation --no-deps --no-index --no-compile --target $N/te/torch_ext . \
        > $N/te_build.log 2>&1); te_rc=$?
    # pip --target leaves the extension in torch_ext/transformer_engine/wheel_lib, where TE's loader never looks (it
    # searches beside the imported transformer_engine package): seen on the H100, "Could not find shared object file"
    so=$(ls $N/te/torch_ext/transformer_engine/wheel_lib/transformer_engine_torch*.so 2>/dev/null | head -1)
    if [ $te_rc = 0 ]; then { [ -n "$so" ] && ln -sf "$so" $N/te/site/; } || te_rc=1; fi
    tail -5 $N/te_build.log; [ $te_rc = 0 ] || grep -m8 -i 'error' $N/te_build.log; cp $N/te_build.log "$OUT/"
    t2=$(date +%s)
    wait $INPUTS; in_rc=$(cat $N/inputs.rc)
    tail -1 $N/inputs.log
    if [ -n "$NEMO_ONLY" ]; then
        python3 bench/nemo_rl/te_check.py $N/inputs/model 2>&1 | grep -v Warning | tail -25 | cut -c1-1500
    else
        python3 -c "import transformer_engine.pytorch, megatron.bridge, nemo_rl.algorithms.grpo, vllm; print('imports ok')" 2>&1 | tail -2
    fi
    t3=$(date +%s)
    echo "{\"unpack_s\": $((t1-t0)), \"te_build_s\": $((t2-t1)), \"te_build_rc\": $te_rc, \"inputs_rc\": $in_rc, \"rest_s\": $((t3-t2)), \"cublas_stub\": \"$PRE\"}" | tee "$OUT/stage.json"
    exit $te_rc
fi
[ "$what" = run ] || { echo "part N | run a|b|c[,..] STEPS"; exit 2; }
runs=${1//,/ }; steps=${2:-6}
[ -f $N/env.sh ] || { echo "not staged: run the three part calls first"; exit 1; }
. $N/env.sh
# Several runs may share one call (RUN_BUDGET_S, default 540 s): the next starts only if the last one's wall time
# still fits, and a job still running at the budget is stopped so that its logs and JSON come back.
# CALL_T0 (epoch seconds, exported by the call's command line before staging): the deadline is also 45 s before the
# call's own limit, so the read-back, report and logs come back (a run killed by the call limit returns nothing).
budget=${RUN_BUDGET_S:-540}; T=$(date +%s); last=0; rc_all=0
deadline=$(( T + budget ))
call_end=$(( ${CALL_T0:-T} + ${CALL_LIMIT_S:-600} - 45 ))
[ -n "${CALL_T0:-}" ] && [ $call_end -lt $deadline ] && deadline=$call_end
free_gib() { df -B1 --output=avail /tmp | tail -1 | awk '{printf "%.1f", $1/2^30}'; }
for run in $runs; do
    if [ $(( $(date +%s) + last )) -gt "$deadline" ]; then echo "run $run skipped: ${last}s would pass the deadline"; continue; fi
    # Every step's checkpoint stays until the read-back: 6 of this model's took 55.3 GiB of /tmp's 59.5 (H100, 2026-12-06),
    # so a run that cannot fit them is refused here instead of failing a save half way (CKPT_GIB: one step's checkpoint).
    free=$(free_gib)
    if awk -v f="$free" -v n="$steps" -v c="${CKPT_GIB:-9.3}" 'BEGIN { exit !(f < n * c + 2) }'; then
        echo "run $run refused: $free GiB free in /tmp, $steps checkpoints need ~$steps x ${CKPT_GIB:-9.3} GiB + 2"
        rc_all=1; continue
    fi
    ts=$(date +%s); R=${NEMO_RUNS:-/tmp/nemo_runs}/$run  # NEMO_RUNS: a test points it elsewhere
    rm -rf "$R"; mkdir -p "$R/shim_status"
    (
    # (d) sizes vLLM's share by the card (runs.d_util)
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
    [[ "$mib" =~ ^[0-9]+$ ]] && export GPU_TOTAL_MIB=$mib  # not an error text: runs.py would fail and d lose its tree
    # its exports, then main's argv; without them Ray would start and python3 run with no argv under this run's name
    CMD=$(python3 bench/nemo_rl/runs.py "$run" "$steps" $N/inputs "$R") || { echo "runs.py gave no command line for run $run"; exit 1; }
    eval "$(grep '^export' <<< "$CMD")"
    ARGS=$(grep -v '^export' <<< "$CMD")
    export COLO_SHIM_STATUS_DIR=$R/shim_status COLO_SHIM_LOG_LEVEL=INFO
    if [ -n "${NEMO_RL_TREE:-}" ]; then  # d0/d1: that tree in place of main's, before Ray starts, so every actor has it too
        [ -d "$N/src/$NEMO_RL_TREE" ] || { echo "no $N/src/$NEMO_RL_TREE: stage with extra/pre3322 carried"; exit 1; }
        export PYTHONPATH=${PYTHONPATH/$N\/src\/rl:/$N\/src\/$NEMO_RL_TREE:}
    fi
    python3 -c "from ray.scripts.scripts import main; main()" stop --force > /dev/null 2>&1
    python3 -c "from ray.scripts.scripts import main; main()" start --head --include-dashboard=false --num-gpus=1 \
        --resources='{"nrl_tag_ALL": 1}' --disable-usage-stats > "$R/ray_start.log" 2>&1 || { tail "$R/ray_start.log"; exit 1; }
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee "$R/gpu.txt"
    before=$(free_gib)
    t0=$(date +%s)
    left=$(( deadline - $(date +%s) )); [ $left -gt 0 ] || left=1  # timeout 0 would mean no limit at all
    (cd $N/src/${NEMO_RL_TREE:-rl} && exec timeout -k 10 $left python3 $ARGS) > "$R/driver.log" 2>&1 &
    DRV=$!
    python3 bench/nemo_rl/sampler.py "$R/samples.jsonl" $DRV > "$R/sampler.log" 2>&1 &
    python3 bench/nemo_rl/actor_status.py "$R/actor_status.json" $DRV > "$R/actor_status.log" 2>&1 &
    wait $DRV; rc=$?
    t1=$(date +%s)
    sleep 3
    python3 -c "from ray.scripts.scripts import main; main()" stop --force > /dev/null 2>&1
    echo "{\"before_run\": $before, \"after_run\": $(free_gib)}" > "$R/disk_free_gib.json"
    python3 bench/nemo_rl/ckpt_check.py "$R/ckpt" --initial $N/inputs/model --decay "$(cd bench/nemo_rl && python3 -c 'import runs; print(runs.DECAY)')" \
        > "$R/ckpt_check.json" 2> "$R/ckpt_check.log"
    python3 bench/nemo_rl/report.py --run "$run" --rc $rc --wall-s $((t1-t0)) --dir "$R" > "$OUT/run_$run.json"
    python3 bench/nemo_rl/report.py --table "$OUT/run_$run.json"
    (cd "$R" && tar czf "$OUT/run_${run}_logs.tar.gz" driver.log *.json *.jsonl *.log shim_status logs 2>/dev/null)
    # Each run's checkpoints (6 x model + optimizer) nearly fill the machine's /tmp: run (a) after (b) once failed
    # its first save with torch's "unexpected pos" (a short write on a full disk). They are checked above; drop them.
    rm -rf "$R/ckpt"
    grep -h "Error\|Traceback\|out of memory" "$R/driver.log" | sort | uniq -c | sort -rn | head -12
    [ $rc = 0 ] || grep -v "it/s]\|s/it]" "$R/driver.log" | tail -40 | cut -c1-400
    exit $rc
    ); rc=$?
    [ $rc = 0 ] || rc_all=$rc
    last=$(( $(date +%s) - ts ))
done
exit $rc_all
