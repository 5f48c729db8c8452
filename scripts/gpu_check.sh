#!/usr/bin/env bash
# The GPU check: one command, from the repository root, on a machine with one NVIDIA GPU
# and no network. It installs the wheels carried in .whl/ (bash scripts/gpu_wheels.sh
# prepares them where a package index is reachable) into a private folder, prints and
# records the environment, then runs, each step bounded by `timeout` (its cap: its estimate
# with a margin, scripts/gpu_check_tools.py PLAN) and the whole by a budget (default 420 s;
# the estimates add up to under 6 minutes, BENCHMARKS.md "The GPU check's time plan"):
#   kernels   scripts/compile_device_kernels.py for the GPU's architecture: registers and
#             spills of every kernel variant (the fastest sign that Triton works here)
#   tests     the CUDA cases of tests/test_device_aead.py, test_device_channel.py,
#             test_backend_device.py, test_bounce.py (the input path opened on the GPU),
#             test_pads.py and test_ordered_wire.py (the NCCL wire's calls on one GPU);
#             pytest --timeout 60 --durations=20. Not the two that would repeat a later
#             step: calibrate --device cuda --fast and bench channel --size 1M run once, as
#             the calibrate and bench-1M steps
#   collectives-device, collectives-staged
#             ccddp bench collectives --device cuda: 2 ranks on the one GPU, 64 MiB, gloo
#             with CUDA tensors beside the ccddp backend with each placement
#   train     ccddp train --device cuda on 1 rank: CC-off and CC-on in turns (bert-base,
#             a few iterations); they differ by the input's bounce path alone
#   calibrate ccddp calibrate --device cuda (skipped, and logged, where it has no --device)
#   bench-*   ccddp bench channel --device cuda at 4 KiB .. 64 MiB: seal and open with and
#             without pads, beside a device-to-device copy and OpenSSL on the host
# A step that fails or times out is recorded and the next one runs; summary.json's "rerun"
# (also printed at the end) is the one-line command that runs again just those steps.
# Files, all at the top
# of $OUT (default runs/gpu-check), at most 8:
#   gpu-check.log  env.json  kernels.json  tests.xml  cuda-runs.json  bench.json  summary.json
# cuda-runs.json holds the results of collectives-*, train and calibrate. It and
# summary.json (every step: command, status, exit code, seconds) are rewritten after each
# step, so they exist also when the check is cut short.
#
#   bash scripts/gpu_check.sh                   # on the GPU machine
#   bash scripts/gpu_check.sh --dry-run         # rehearsal without a GPU: the same steps,
#                                               # the CUDA parts skip or say there is no GPU
#                                               # (the commands' arguments are still checked)
#   bash scripts/gpu_check.sh --only tests,bench-64M   # some steps: a step's name or a
#                                               # group (kernels, tests, collectives, train,
#                                               # calibrate, bench); wheels and env always run
#
# Environment: OUT (results folder), PYTHON (default python3), CCDDP_GPU_CHECK_DRY_RUN=1
# (same as --dry-run), CCDDP_GPU_CHECK_BUDGET_S (default 420),
# CCDDP_GPU_CHECK_SIZES (default 4K,64K,1M,16M,64M), CCDDP_GPU_CHECK_PYTEST_ARGS (added to
# pytest's, e.g. "-n 4"), CCDDP_GPU_CHECK_COLLECTIVE_SIZE (default 64M),
# CCDDP_GPU_CHECK_WORKLOAD (default bert-base), CCDDP_GPU_CHECK_CALIBRATE_ARGS (default
# --fast), CCDDP_GPU_WHEELS (default .whl), CCDDP_GPU_SITE (where the wheels go; default a
# fresh temporary folder).
#
# Exit: 0 every step ok; 1 a step failed or timed out; 2 the environment cannot run the check
# (one line says why: no GPU, no Triton, cryptography not importable, torch too old, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

DRY_RUN=${CCDDP_GPU_CHECK_DRY_RUN:-0}
STEP_GROUPS="kernels,tests,collectives,train,calibrate,bench"
ONLY=$STEP_GROUPS
while (($#)); do
    case $1 in
        --dry-run) DRY_RUN=1 ;;
        --only) ONLY=${2:?--only needs a list, e.g. tests,bench}; shift ;;
        --only=*) ONLY=${1#--only=} ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[[ $DRY_RUN == 0 || $DRY_RUN == 1 ]] || DRY_RUN=1

PY=${PYTHON:-python3}
OUT=${OUT:-runs/gpu-check}
SIZES=${CCDDP_GPU_CHECK_SIZES:-4K,64K,1M,16M,64M}
# Each step's cap, and the budget, from the plan (NAME SECONDS lines).
declare -A CAP
while read -r name secs; do CAP[$name]=$secs; done < <("$PY" scripts/gpu_check_tools.py plan --sizes "$SIZES")
BUDGET=${CCDDP_GPU_CHECK_BUDGET_S:-${CAP[budget]:-420}}
STEP_NAMES="$STEP_GROUPS,collectives-device,collectives-staged$(tr ',' '\n' <<<"$SIZES" | sed 's/^/,bench-/' | tr -d '\n')"
for s in ${ONLY//,/ }; do
    if [[ ,$STEP_NAMES, != *,$s,* ]]; then
        echo "gpu_check: --only takes steps or groups of ${STEP_NAMES//,/, }; not $s" >&2
        exit 2
    fi
done
# The rerun line must see the same sizes.
RERUN_ENV=""
[[ -n ${CCDDP_GPU_CHECK_SIZES:-} ]] && RERUN_ENV="CCDDP_GPU_CHECK_SIZES=$SIZES"
COLLECTIVE_SIZE=${CCDDP_GPU_CHECK_COLLECTIVE_SIZE:-64M}
WORKLOAD=${CCDDP_GPU_CHECK_WORKLOAD:-bert-base}
CALIBRATE_ARGS=${CCDDP_GPU_CHECK_CALIBRATE_ARGS---fast}
WHEELS=${CCDDP_GPU_WHEELS:-.whl}
RESERVE=10          # seconds kept back for the bench merge and the summary
MIN_STEP=15         # a step given less than this would only time out: it is not started
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# Only the files this check writes are replaced: $OUT may be a folder that holds others.
rm -f "$OUT"/{gpu-check.log,env.json,kernels.json,tests.xml,cuda-runs.json,bench.json,summary.json}
LOG=$OUT/gpu-check.log
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ccddp-gpu-check.XXXXXX")
SITE=${CCDDP_GPU_SITE:-$WORK/site}
trap 'rm -rf "$WORK"' EXIT
STEPS=$WORK/steps.tsv
: >"$STEPS"
START=$SECONDS

log() { printf '%s\n' "$*" | tee -a "$LOG"; }

write_summary() {   # $1: 1 once every step has had its turn
    local flags=()
    [[ ${1:-0} == 1 ]] && flags+=(--complete)
    [[ $DRY_RUN == 1 ]] && flags+=(--dry-run)
    [[ -n $RERUN_ENV ]] && flags+=(--rerun-env "$RERUN_ENV")
    "$PY" scripts/gpu_check_tools.py summary --steps "$STEPS" --out "$OUT/summary.json" \
        --elapsed $((SECONDS - START)) --budget "$BUDGET" "${flags[@]}" || log "summary: could not be written"
}

record() {  # name status rc seconds timeout note command...
    local name=$1 status=$2 rc=$3 secs=$4 t=$5 note=$6
    shift 6
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$secs" "$t" "${note//$'\t'/ }" "$*" >>"$STEPS"
    write_summary 0
}

selected() {  # the step, or its group (bench-4K -> bench), is in --only
    [[ ,$ONLY, == *,$1,* || ,$ONLY, == *,${1%%-*},* ]]
}

# Put before a command that needs a GPU: nothing on the GPU machine; in a dry run
# `gpu_check_tools.py no-gpu --`, which runs the command and takes its one-line "needs a
# CUDA GPU" refusal (exit 2, after every argument was checked) as a pass, so a rehearsal
# still catches a mistyped option. (An array, not a function: `timeout` runs programs.)
ON_GPU=()
[[ $DRY_RUN == 1 ]] && ON_GPU=("$PY" scripts/gpu_check_tools.py no-gpu --)

merge_runs() {  # $1: the step just run; cuda-runs.json from what those steps left so far
    "$PY" scripts/gpu_check_tools.py runs --dir "$WORK" --out "$OUT/cuda-runs.json" --step "$1" 2>&1 \
        | tee -a "$LOG" || log "runs: could not merge the results"
}

# run_step NAME COMMAND...: run it under `timeout` (its cap from the plan or what is left
# of the budget, whichever is less), its output to the log and to $WORK/NAME.out; record
# it. Never stops the check: the exit status is recorded, not propagated.
run_step() {
    local name=$1 cap=${CAP[$1]:-60} left t t0 rc status note=""
    shift
    left=$((BUDGET - (SECONDS - START) - RESERVE))
    if ((left < MIN_STEP)); then
        log "== $name: not run: out of time (${left}s left of the ${BUDGET}s budget)"
        record "$name" skipped "" 0 "" "not run: out of time" "$@"
        return 0
    fi
    t=$((cap < left ? cap : left))
    log "== $name (timeout ${t}s): $*"
    t0=$SECONDS
    set +e
    # -k 15: a step that ignores the TERM (ranks in the CLI's shutdown take up to ~9 s) is
    # killed before the next step needs the GPU. The stop line ("cannot run") goes to the
    # log and NAME.out here; the check prints it once, as its last line.
    timeout -k 15 "$t" "$@" 2>&1 | tee -a "$LOG" "$WORK/$name.out" | grep --line-buffered -v '^gpu_check: cannot run'
    rc=${PIPESTATUS[0]}
    set -e
    case $rc in
        0) status=ok ;;
        124|137) status=timeout; note="stopped after ${t}s" ;;
        *) status=failed ;;
    esac
    echo "$rc" >"$WORK/$name.rc"
    log "== $name: $status (exit $rc, $((SECONDS - t0))s)"
    record "$name" "$status" "$rc" $((SECONDS - t0)) "$t" "$note" "$@"
    LAST_RC=$rc
}

mode=""
[[ $DRY_RUN == 1 ]] && mode=", DRY RUN (no GPU needed: the CUDA parts skip)"
log "ccddp GPU check $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${BUDGET}s, steps: $ONLY$mode"

# Triton decides once, at its first import, whether kernels compile or run interpreted:
# the check compiles. (Without a GPU the tests' conftest sets it again for itself.)
unset TRITON_INTERPRET
export PYTHONUNBUFFERED=1 PIP_ROOT_USER_ACTION=ignore   # the machine runs commands as root
export PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# The NIST vectors the tests read, carried beside the wheels (cryptography_vectors itself
# is 56 MB, too big to carry).
if [[ -d $WHEELS/gcm-vectors && -z ${CCDDP_GCM_VECTORS:-} ]]; then
    CCDDP_GCM_VECTORS=$(cd "$WHEELS/gcm-vectors" && pwd)
    export CCDDP_GCM_VECTORS
fi

# -- wheels: what the image lacks, into a private folder first on PYTHONPATH ---------------
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
shopt -u nullglob
WHEEL_PY=$(cat "$WHEELS/python-version" 2>/dev/null || echo 3.12)
if ((${#wheels[@]} == 0)); then
    note="no wheel folder $WHEELS (or no wheels in it): using what this Python has;"
    note+=" prepare it with 'bash scripts/gpu_wheels.sh' and carry .whl"
    log "== wheels: skipped: $note"
    record wheels skipped "" 0 "" "$note" "pip install --target $SITE $WHEELS/*.whl"
else
    mkdir -p "$SITE"
    # --no-index --no-deps: nothing can be fetched there, and the folder holds every need.
    # --python-version: the wheels are for the GPU machine's Python (a rehearsal here may run
    # another; pip then still checks that the set installs for that one).
    run_step wheels "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --only-binary=:all: --python-version "$WHEEL_PY" --target "$SITE" "${wheels[@]}"
fi

# -- env: what is here; stop with one line if the check cannot run ------------------------
env_flags=(--out "$OUT/env.json" --site "$SITE")
[[ $DRY_RUN == 1 ]] && env_flags+=(--dry-run)
LAST_RC=0
run_step env "$PY" scripts/gpu_check_tools.py env "${env_flags[@]}"
if ((LAST_RC != 0)); then
    why=$(grep -h '^gpu_check: cannot run' "$WORK/env.out" 2>/dev/null || true)
    for s in kernels tests collectives-device collectives-staged train calibrate \
        $(tr ',' ' ' <<<"$SIZES" | sed 's/[^ ]*/bench-&/g'); do
        record "$s" skipped "" 0 "" "not run: the environment check failed" ""
    done
    write_summary 1
    # Once, and last (run_step kept it off the screen; the log has it from the step).
    echo "${why:-gpu_check: cannot run: the environment check failed (exit $LAST_RC), see $LOG}"
    exit 2
fi

# -- kernels: every variant compiled for this GPU (registers, spills) ----------------------
ARCH=$("$PY" scripts/gpu_check_tools.py arch "$OUT/env.json")
if selected kernels; then
    run_step kernels "$PY" scripts/compile_device_kernels.py --arch "$ARCH" --json "$OUT/kernels.json"
else
    record kernels skipped "" 0 "" "not selected (--only $ONLY)" ""
fi

# -- tests: the CUDA cases (ids naming cuda, and the pads' two-stream case; without a GPU
# they skip) ----------------------------------------------------------------------------
# Every file with CUDA cases that this tree has (some arrive with other branches).
test_files=()
for f in tests/test_device_aead.py tests/test_device_channel.py tests/test_backend_device.py \
    tests/test_bounce.py tests/test_calibrate.py tests/test_pads.py tests/test_ordered_wire.py; do
    if [[ -f $f ]]; then test_files+=("$f"); else log "tests: $f is not in this tree: its CUDA cases are left out"; fi
done
# Run once, by their own steps (calibrate, bench-1M), not here as well.
deselect=()
for id in tests/test_calibrate.py::test_calibrate_device_cuda_measures_the_engine_and_the_staging \
    tests/test_device_channel.py::test_bench_channel_on_cuda_measures_or_says_why_not; do
    [[ -f ${id%%::*} ]] && deselect+=(--deselect "$id")
done
if selected tests; then
    # shellcheck disable=SC2086  # extra pytest arguments are words on purpose
    # "two_streams": test_pads.py's GPU case (seal and refill on two CUDA streams) has no
    # "cuda" in its name.
    run_step tests "$PY" -m pytest -q -p no:cacheprovider -k "cuda or two_streams" --timeout 60 --durations=20 \
        --junitxml "$OUT/tests.xml" ${deselect[@]+"${deselect[@]}"} ${CCDDP_GPU_CHECK_PYTEST_ARGS:-} "${test_files[@]}"
else
    record tests skipped "" 0 "" "not selected (--only $ONLY)" ""
fi

# -- collectives: 2 ranks sharing the GPU, gloo beside the ccddp backend, per placement ---
# --timeout: a peer that never answers fails the step in 30 s instead of using its cap.
for placement in device staged; do
    if selected "collectives-$placement"; then
        run_step "collectives-$placement" ${ON_GPU[@]+"${ON_GPU[@]}"} "$PY" -m ccddp.cli bench collectives --device cuda \
            --placement "$placement" --world-size 2 --impl gloo,secure --sizes "$COLLECTIVE_SIZE" --timeout 30 \
            --json "$WORK/collectives-$placement.json"
        merge_runs "collectives-$placement"
    else
        record "collectives-$placement" skipped "" 0 "" "not selected (--only $ONLY)" ""
    fi
done

# -- train: one rank, CC-off and CC-on taking turns (only the input's bounce path differs)
if selected train; then
    run_step train ${ON_GPU[@]+"${ON_GPU[@]}"} "$PY" -m ccddp.cli train --device cuda --world-size 1 --workload "$WORKLOAD" \
        --cc off,on --steps 8 --warmup 2 --timeout 30 --json "$WORK/train.json"
    merge_runs train
else
    record train skipped "" 0 "" "not selected (--only $ONLY)" ""
fi

# -- calibrate: this GPU's profile, where ccddp calibrate measures a device ---------------
if ! selected calibrate; then
    record calibrate skipped "" 0 "" "not selected (--only $ONLY)" ""
elif ! "$PY" scripts/gpu_check_tools.py has-option calibrate device 2>>"$LOG"; then
    note="ccddp calibrate has no --device option in this tree: nothing to calibrate on the GPU"
    log "== calibrate: skipped: $note"
    record calibrate skipped "" 0 "" "$note" "$PY -m ccddp.cli calibrate --device cuda"
else
    # shellcheck disable=SC2086  # extra calibrate arguments are words on purpose
    run_step calibrate ${ON_GPU[@]+"${ON_GPU[@]}"} "$PY" -m ccddp.cli calibrate --device cuda $CALIBRATE_ARGS \
        --out "$WORK/calibrate.toml" --json "$WORK/calibrate.json"
    merge_runs calibrate
fi

# -- bench: seal/open GB/s with and without pads, beside a device copy -------------------
benched=0
for size in ${SIZES//,/ }; do
    if selected "bench-$size"; then
        benched=1
        run_step "bench-$size" "$PY" -m ccddp.cli bench channel --device cuda --size "$size" \
            --json "$WORK/bench-$size.json"
    else
        record "bench-$size" skipped "" 0 "" "not selected (--only $ONLY)" ""
    fi
done
if ((benched)); then
    log "== bench: merged into bench.json"
    "$PY" scripts/gpu_check_tools.py bench --dir "$WORK" --sizes "$SIZES" --out "$OUT/bench.json" 2>&1 \
        | tee -a "$LOG" || log "bench: could not merge the results"
fi

write_summary 1
failed=$(awk -F'\t' '$2 == "failed" || $2 == "timeout" || $6 ~ /^not run/ {printf "%s%s", sep, $1; sep = " "}' "$STEPS")
log "== done in $((SECONDS - START))s; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
if [[ -n $failed ]]; then
    rerun=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["rerun"] or "")' "$OUT/summary.json" \
        2>/dev/null || true)
    [[ -n $rerun ]] && log "gpu_check: rerun just these (also in summary.json): $rerun"
    log "gpu_check: not ok: $failed"
    exit 1
fi
log "gpu_check: ok"
