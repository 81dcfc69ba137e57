#!/usr/bin/env bash
# latecast's GPU check (`make gpu-check`): on one NVIDIA GPU, with a Python that has torch,
# torchvision, matplotlib and pytest but no network and nothing else installed. Runs from
# the checkout (PYTHONPATH=src), installs nothing, and in well under 8 minutes runs:
#   1. the gpu-marked tests            (pytest -m gpu)
#   2. latecast profile                (every row, Chrome traces)
#   3. latecast bench                  (loader throughput, end to end, bytes)
#   4. a CIFAR-10-shaped run           (synthetic store: bench with augment off/on, ResNet-9)
#   5. a 1-GPU torchrun run            (NCCL, DDP, mid-epoch checkpoints)
#   6. time to 99% on MNIST            (one warm-up run, then the median of $SEEDS seeds)
#   7. a few other time-to-99% settings, one run each
# then prints the CUDA targets as a table (benchmarks/gpu_summary.py). A part that fails is
# recorded and the rest still runs; the exit status is non-zero if any part failed (a missed
# target is reported in the table, it is not a failure).
#
# Everything goes under $OUT when set, else gpu-results/: gpu_check.log (all output),
# parts.tsv (part, status, seconds), one folder per part, summary.md and summary.json.
#
# Environment overrides (defaults in brackets; tests/test_gpu_check.py runs it on CPU tiny):
#   PYTHON [python3]  DEVICE [cuda]  STEPS [20] profile steps per row
#   REPEATS [3] bench repeats  LIMIT_BATCHES [] bench batches per pass (empty: whole epochs)
#   E2E_EPOCHS [3] bench end-to-end epochs (0 skips)  SEEDS [5] time-to-99% seeds
#   TRAIN_ARGS [--transfer resident -b 512 --epochs 2 --lr 0.1] latecast train settings
#   PROFILE_ARGS [] BENCH_ARGS [] extra flags, e.g. "-b 16"
#   PYTEST_ARGS [-m gpu]  PART_TIMEOUT [300] seconds before a part is stopped
#   CIFAR_TRAIN [50000] CIFAR_TEST [10000] CIFAR_EPOCHS [2] CIFAR_ARGS [] CIFAR_BATCHES [40]
#   TORCHRUN_ARGS [--epochs 2 -b 512 --lr 0.2 --checkpoint-every 50] 1-GPU torchrun train
#   SWEEP ["-b 1024 --epochs 3 --lr 0.4|..."] time-to-99% settings, one run each; SWEEP_ARGS []
set -u
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-20}
REPEATS=${REPEATS:-3}
LIMIT_BATCHES=${LIMIT_BATCHES:-}
E2E_EPOCHS=${E2E_EPOCHS:-3}
SEEDS=${SEEDS:-5}
TRAIN_ARGS=${TRAIN_ARGS:---transfer resident -b 512 --epochs 2 --lr 0.1}
PROFILE_ARGS=${PROFILE_ARGS:-}
BENCH_ARGS=${BENCH_ARGS:-}
PYTEST_ARGS=${PYTEST_ARGS:--m gpu}
PART_TIMEOUT=${PART_TIMEOUT:-300}
RESULTS=${OUT:-gpu-results}

mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
LOG=$RESULTS/gpu_check.log
: > "$LOG"
printf 'part\tstatus\tseconds\n' > "$RESULTS/parts.tsv"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export MPLBACKEND=Agg
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
# The decoded-dataset cache stays out of $OUT (it is tens of MB that nobody needs back).
export LATECAST_CACHE=${LATECAST_CACHE:-$SCRATCH/cache}
TIMEOUT=""
command -v timeout > /dev/null && TIMEOUT="timeout $PART_TIMEOUT"
FAILED=()
T_START=$(date +%s)

log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

# part NAME CMD...: run CMD with a timeout, stdout to $RESULTS/NAME.out, both streams to the log.
part() {
    local name=$1; shift
    local t0 rc secs
    log "== $name: $*"
    t0=$(date +%s.%N)
    $TIMEOUT "$@" 2>> "$LOG" | tee "$RESULTS/$name.out" >> "$LOG"
    rc=${PIPESTATUS[0]}
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if [ "$rc" -eq 0 ]; then
        printf '%s\tok\t%s\n' "$name" "$secs" >> "$RESULTS/parts.tsv"
        log "   $name ok (${secs} s)"
    else
        printf '%s\tFAILED (exit %s)\t%s\n' "$name" "$rc" "$secs" >> "$RESULTS/parts.tsv"
        log "   $name FAILED with exit $rc after ${secs} s (see $LOG)"
        FAILED+=("$name")
    fi
    return "$rc"
}

# ---- environment -------------------------------------------------------------------------
{
    echo "date: $(date -Iseconds)"
    echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    "$PYTHON" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
    grep -m1 'model name' /proc/cpuinfo; echo "cores: $(nproc)"
} > "$RESULTS/env.txt" 2>&1
cat "$RESULTS/env.txt" >> "$LOG"

# ---- 1. gpu-marked tests -----------------------------------------------------------------
# pytest exits 5 when no test is selected: nothing to run is not a failure.
# shellcheck disable=SC2016,SC2086  # PYTEST_ARGS and TRAIN_ARGS are word lists on purpose
part gpu-tests bash -c '"$@"; rc=$?; if [ "$rc" -eq 5 ]; then echo "no gpu-marked tests selected"; exit 0; fi; exit "$rc"' \
    _ "$PYTHON" -m pytest $PYTEST_ARGS -p no:cacheprovider

# ---- 2. profile --------------------------------------------------------------------------
# shellcheck disable=SC2086
part profile "$PYTHON" -m latecast profile --device "$DEVICE" --steps "$STEPS" $PROFILE_ARGS \
    --output-dir "$RESULTS/profile" --json
# The traces record every op (the baseline rows: every per-image transform): gzip them;
# chrome://tracing and ui.perfetto.dev open .json.gz as they are.
gzip -f "$RESULTS"/profile/trace-*.json 2> /dev/null

# ---- 3. bench ----------------------------------------------------------------------------
# shellcheck disable=SC2086
part bench "$PYTHON" -m latecast bench --device "$DEVICE" --repeats "$REPEATS" \
    ${LIMIT_BATCHES:+--limit-batches "$LIMIT_BATCHES"} --e2e-epochs "$E2E_EPOCHS" $BENCH_ARGS \
    --output-dir "$RESULTS/bench" --json

# Every `latecast train` below passes --overwrite: a rerun into the same $RESULTS replaces
# the previous results' runs (latecast refuses that otherwise).

# ---- 4. CIFAR-10-shaped run --------------------------------------------------------------
# No CIFAR-10 files on the GPU machine (no network): a store of random uint8 images of the
# real shape (50,000 + 10,000 x 32x32x3) measures bytes and speed, never accuracy. Loader
# throughput with augmentation off and on, then ResNet-9 epochs with the cifar10 preset
# (crop+flip+cutout on the device, bf16, channels_last).
CIFAR_TRAIN=${CIFAR_TRAIN:-50000}
CIFAR_TEST=${CIFAR_TEST:-10000}
CIFAR_EPOCHS=${CIFAR_EPOCHS:-2}
CIFAR_ARGS=${CIFAR_ARGS:-}
CIFAR_BATCHES=${CIFAR_BATCHES:-40}  # batches of 256 per timed pass: torchvision's rows are slow
hook_cifar10() {
    local store=$SCRATCH/cifar10-shaped
    part cifar10-store "$PYTHON" benchmarks/synthetic_store.py "$store" --shape 32x32x3 \
        --train "$CIFAR_TRAIN" --test "$CIFAR_TEST" || return
    for aug in off crop,flip,cutout; do
        # shellcheck disable=SC2086
        part "cifar10-bench-${aug%%,*}" "$PYTHON" -m latecast bench "$store" --device "$DEVICE" \
            --repeats "$REPEATS" --limit-batches "${LIMIT_BATCHES:-$CIFAR_BATCHES}" \
            --e2e-epochs 0 --augment "$([ "$aug" = off ] || echo "$aug")" $BENCH_ARGS \
            --output-dir "$RESULTS/cifar10/bench-${aug%%,*}" --json
    done
    # shellcheck disable=SC2086
    part cifar10-train "$PYTHON" -m latecast train "$store" --device "$DEVICE" \
        --epochs "$CIFAR_EPOCHS" $CIFAR_ARGS --no-progress \
        --output-dir "$RESULTS/cifar10/train" --overwrite --json
}
hook_cifar10

# ---- 5. torchrun, one GPU, NCCL ----------------------------------------------------------
TORCHRUN_ARGS=${TORCHRUN_ARGS:---epochs 2 -b 512 --lr 0.2 --checkpoint-every 50}
hook_torchrun() {
    # shellcheck disable=SC2086
    part torchrun "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node=1 \
        -m latecast train --device "$DEVICE" $TORCHRUN_ARGS --no-progress \
        --output-dir "$RESULTS/torchrun" --overwrite --json
}
hook_torchrun

# ---- 6. time to 99% on MNIST -------------------------------------------------------------
# One warm-up run (CUDA context, cuDNN autotuning, dataset cache), then seeds 1..$SEEDS; the
# summary takes the median train_seconds and test accuracy of the seeded runs.
mkdir -p "$RESULTS/train"
for seed in warmup $(seq 1 "$SEEDS"); do
    s=$([ "$seed" = warmup ] && echo 0 || echo "$seed")
    # shellcheck disable=SC2086
    part "train-$seed" "$PYTHON" -m latecast train --device "$DEVICE" $TRAIN_ARGS --seed "$s" \
        --no-progress --output-dir "$RESULTS/train/$seed" --overwrite --json \
        && tail -n 1 "$RESULTS/train-$seed.out" > "$RESULTS/train/$seed.json"
done

# ---- 7. time-to-99% settings tried once each (informs the default; not in the table) --------
SWEEP=${SWEEP:-"-b 1024 --epochs 2 --lr 0.2|-b 512 --epochs 3 --lr 0.2|-b 256 --epochs 2 --lr 0.1"}
IFS='|' read -r -a SWEEP_RUNS <<< "$SWEEP"
mkdir -p "$RESULTS/sweep"
for i in "${!SWEEP_RUNS[@]}"; do
    # shellcheck disable=SC2086
    part "sweep-$i" "$PYTHON" -m latecast train --device "$DEVICE" --transfer resident \
        ${SWEEP_RUNS[$i]} ${SWEEP_ARGS:-} --no-progress --output-dir "$RESULTS/sweep/$i" \
        --overwrite --json \
        && tail -n 1 "$RESULTS/sweep-$i.out" > "$RESULTS/sweep/$i.json"
done

# ---- summary -----------------------------------------------------------------------------
part summary "$PYTHON" benchmarks/gpu_summary.py "$RESULTS" --failed "${FAILED[*]-}"
cat "$RESULTS/summary.out" 2> /dev/null
log "total $(( $(date +%s) - T_START )) s; results in $RESULTS"
if [ "${#FAILED[@]}" -gt 0 ]; then
    log "FAILED parts: ${FAILED[*]}"
    exit 1
fi
log "all parts ran"
