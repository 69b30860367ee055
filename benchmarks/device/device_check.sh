#!/usr/bin/env bash
# The one prepared script for a lent accelerator machine (one GPU, 16 CPU cores): at most 5 minutes,
# six stages, each under `timeout` with its own budget, results written as each stage ends, and a
# state file so that a rerun repeats only the stages that did not pass. Run from the repository root:
#
#     benchmarks/device/device_check.sh [--fresh] [--list] [STAGE ...]
#
# Stages and budgets (s):
#   build  40  ringcomm with the CUDA module (pip install -e ., RINGCOMM_CUDA=1) and the hand-off probe
#              (build/device_check/handoff_probe), side by side
#   probe  50  benchmarks/device/handoff_probe.sh: every way of the hand-off probe, without and with MPS
#   ring   70  benchmarks/device/ring_check.py with RINGCOMM_CUDA_P2P=device at 2 and 3 processes,
#              1 KiB-256 MiB, bit-exact against the host ring with busbw, without and with MPS
#   graph  40  benchmarks/device/graph_check.py (device ring, under MPS where it exists): a graph
#              capture and 1000 replays with new inputs, a rank 200 ms late, kill -9 of a rank mid-wait
#   bench  60  benchmarks/device/device_bench.py: ringcomm on CUDA tensors beside gloo on CUDA, the
#              same-process floor and the roof, without and with MPS
#   cpu    40  benchmarks/device/cpu_scale_check.sh: the bench at 16 and 2 ranks bound to cores, beside gloo,
#              MPICH and DeepSpeed (its later sections where they fit)
# A stage is killed at its budget (TERM a little before, KILL at it) and recorded as failed
# (`timeout`). A stage whose budget exceeds what is left of TOTAL_BUDGET (s, default 300) runs with
# what is left, or, when that is less than half its budget, is recorded as not run (`skipped`).
# After every stage, an MPS daemon it started (pipe folder $WORK/mps-STAGE) is stopped, whatever
# happened to the stage, so none survives into the next.
#
# Output, written as it goes, in RESULTS (default results/<date>/device/check):
#   state        one line per stage that ran: STAGE ok|failed|timeout|skipped RC SECONDS
#   summary.txt  what each stage did, then each stage's own summary
#   STAGE/       the stage's files (console.txt, and what its programs write)
# When OUT is set (a runner's folder), the folder is also packed into $OUT/device_check.tgz and
# summary.txt and state are copied there at exit.
# A rerun with the same RESULTS runs only the stages whose state is not `ok` (build also when its
# products are gone, as on a fresh machine); --fresh forgets the state; STAGE ... picks stages.
# Where a runner copies the working tree to the machine and returns only $OUT, unpack the returned
# device_check.tgz into RESULTS before the rerun, so that the state travels with the tree.
# --list prints the stages, their budgets and commands, and runs nothing.
# DEVICE_CHECK_CMD_<STAGE> (a shell command) replaces a stage's command and DEVICE_CHECK_BUDGET_<STAGE>
# its budget (tests/test_device_check.py runs this script with short fake stages that way).
# Exit status: 0 when every stage is ok (now or in an earlier run), 1 otherwise, 2 bad arguments.
set -u
cd "$(dirname "$0")/../.."
SELF=benchmarks/device/device_check.sh
. benchmarks/device/lib.sh
STAGES="build probe ring graph bench cpu"
declare -A BUDGET=([build]=40 [probe]=50 [ring]=70 [graph]=40 [bench]=60 [cpu]=40)
PY="${PYTHON:-$(command -v python > /dev/null 2>&1 && echo python || echo python3)}"  # PYTHON overrides
RESULTS="${RESULTS:-results/$(date +%F)/device/check}"
PROBE_BIN=build/device_check/handoff_probe
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"   # this tree's ringcomm, built in place
export PYTHONUNBUFFERED=1

# ---- the stages' own work (run as `device_check.sh --run-stage STAGE`, under the stage's timeout) ----
# Each writes into $STAGE_OUT; an MPS daemon goes into $STAGE_MPS (stopped again by the caller);
# DEVICE_CHECK_STAGE_BUDGET is the stage's budget (s) as the driver runs it.
stage_build() {
  export PATH="$PATH:/usr/local/cuda/bin"
  mkdir -p "$(dirname "$PROBE_BIN")"
  ( nvcc -O2 -std=c++17 -arch=native -o "$PROBE_BIN" benchmarks/device/handoff_probe.cu > "$STAGE_OUT/probe_build.log" 2>&1 ||
    nvcc -O2 -std=c++17 -arch=sm_90 -o "$PROBE_BIN" benchmarks/device/handoff_probe.cu >> "$STAGE_OUT/probe_build.log" 2>&1 ) &
  local probe=$!
  RINGCOMM_CUDA=1 RINGCOMM_BUILD_JOBS="$(nproc)" $PY -m pip install --no-build-isolation --no-deps -v -e . \
      > "$STAGE_OUT/build.log" 2>&1
  local rc=$?
  wait $probe || { echo "hand-off probe: build failed (probe_build.log)"; rc=1; }
  [ $rc = 0 ] && $PY -c "import ringcomm.cuda as c; assert c.is_available(), c.unavailable_reason(); print('ringcomm CUDA usable')" ||
    { tail -30 "$STAGE_OUT/build.log"; rc=1; }
  return $rc
}
build_products_present() { [ -x "$PROBE_BIN" ] && $PY -c "import ringcomm._C_cuda" > /dev/null 2>&1; }

# 4 ways x 2 modes, each at most 5 s (a repetition's deadline 1 s, 2.5 s of repetitions), and an MPS start.
stage_probe() {
  BIN="$PROBE_BIN" OUT="$STAGE_OUT" MPS_DIR="$STAGE_MPS" WAY_LIMIT=5 WAY_BUDGET_MS=2500 TIMEOUT_MS=1000 \
      bash benchmarks/device/handoff_probe.sh
}

# Runs "$@" once without MPS and once under this stage's daemon, each under LIMIT s; the outputs
# go to $STAGE_OUT/NAME_{no_mps,mps}.txt. Status: 1 when a run failed or MPS could not start.
with_and_without_mps() {
  local name=$1 limit=$2 rc=0
  shift 2
  CUDA_MPS_PIPE_DIRECTORY="$STAGE_MPS/none" bounded "$limit" "$@" > "$STAGE_OUT/${name}_no_mps.txt" 2>&1 || rc=1
  echo "$name without MPS: $(tail -1 "$STAGE_OUT/${name}_no_mps.txt")"
  if mps_start "$STAGE_MPS" > "$STAGE_OUT/${name}_mps.txt" 2>&1; then
    bounded "$limit" "$@" >> "$STAGE_OUT/${name}_mps.txt" 2>&1 || rc=1
    mps_stop "$STAGE_MPS" >> "$STAGE_OUT/${name}_mps.txt"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  else
    rc=1
  fi
  echo "$name with MPS: $(tail -1 "$STAGE_OUT/${name}_mps.txt")"
  return $rc
}

stage_ring() {
  export RINGCOMM_CUDA_P2P=device
  local rc=0 w
  for w in 2 3; do
    with_and_without_mps "ring_w$w" 15 $PY benchmarks/device/ring_check.py --world $w -b 1K -e 256M \
        --json "$STAGE_OUT/ring_w$w.json" || rc=1
  done
  return $rc
}

stage_graph() {
  export RINGCOMM_CUDA_P2P=device
  local mps="without MPS"
  mps_start "$STAGE_MPS" > "$STAGE_OUT/mps.txt" 2>&1 && mps="under MPS"
  echo "graph check $mps"
  bounded 32 $PY benchmarks/device/graph_check.py --scenario all --replays 1000 --timeout 5 \
      --json "$STAGE_OUT/graph.json"
}

stage_bench() {
  export RINGCOMM_CUDA_P2P=device
  with_and_without_mps bench 27 $PY benchmarks/device/device_bench.py -np 2 -b 1K -e 256M \
      --json "$STAGE_OUT/bench.json"
}

# 16 ranks first (the check's point), then 2, bound to cores, beside gloo, MPICH and DeepSpeed; the
# script's later sections (thread A/B, cost model, rendezvous A/B) run only when they fit.
stage_cpu() {
  OUT="$STAGE_OUT" TOTAL_BUDGET=$(( ${DEVICE_CHECK_STAGE_BUDGET:-${BUDGET[cpu]}} - 4 )) BUILD_TIMEOUT=20 BENCH_TIMEOUT=16 \
      CPU_SCALE_WORLDS="16 2" CPU_SCALE_BINDS=core bash benchmarks/device/cpu_scale_check.sh
}

# ---- the driver ----
if [ "${1:-}" = "--run-stage" ]; then
  for b in $STAGES; do v="DEVICE_CHECK_BUDGET_$b"; [ -n "${!v:-}" ] && BUDGET[$b]=${!v}; done
  STAGE_OUT="${STAGE_OUT:-$RESULTS/$2}" STAGE_MPS="${DEVICE_CHECK_MPS_DIR:?}"
  trap 'mps_stop "$STAGE_MPS" > /dev/null' EXIT
  trap 'stop_bounded; exit 143' TERM INT
  "stage_$2"
  exit $?
fi

FRESH=0
LIST=0
PICK=""
for arg in "$@"; do
  case "$arg" in
    --fresh) FRESH=1 ;;
    --list) LIST=1 ;;
    build|probe|ring|graph|bench|cpu) PICK="$PICK $arg" ;;
    *) echo "usage: $0 [--fresh] [--list] [STAGE ...]   (stages: $STAGES)" >&2; exit 2 ;;
  esac
done
for s in $STAGES; do
  v="DEVICE_CHECK_BUDGET_$s"
  [ -n "${!v:-}" ] && BUDGET[$s]=${!v}
done
command_of() {
  local v="DEVICE_CHECK_CMD_$1"
  echo "${!v:-bash $SELF --run-stage $1}"
}
if [ "$LIST" = 1 ]; then
  for s in $STAGES; do echo "$s ${BUDGET[$s]} $(command_of "$s")"; done
  exit 0
fi

TOTAL_BUDGET="${TOTAL_BUDGET:-300}"
mkdir -p "$RESULTS"
STATE="$RESULTS/state"
[ "$FRESH" = 1 ] && rm -f "$STATE"
touch "$STATE"
WORK="$(mktemp -d)"
t_start=$(date +%s)
note() { echo "[device_check $(date +%H:%M:%S) +$(( $(date +%s) - t_start ))s] $*" | tee -a "$RESULTS/summary.txt"; }
finish() {
  local s
  for s in $STAGES; do mps_stop "$WORK/mps-$s" > /dev/null; done
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    tar czf "$OUT/device_check.tgz" -C "$RESULTS" . 2>/dev/null
    cp "$RESULTS/summary.txt" "$STATE" "$OUT/" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap finish EXIT
trap 'stop_bounded; exit 143' TERM INT
state_of() { awk -v s="$1" '$1 == s { v = $2 } END { print v }' "$STATE"; }
record() {  # stage status rc seconds: the stage's line replaces any earlier one
  awk -v s="$1" '$1 != s' "$STATE" > "$STATE.new"
  echo "$1 $2 $3 $4" >> "$STATE.new"
  mv "$STATE.new" "$STATE"
}

echo "==== device_check $(date -Is) (git $(git rev-parse --short HEAD 2>/dev/null))" >> "$RESULTS/summary.txt"
selected=${PICK:-$STAGES}
for s in $STAGES; do
  case " $selected " in *" $s "*) ;; *) continue ;; esac
  if [ "$(state_of "$s")" = ok ]; then
    v="DEVICE_CHECK_CMD_$s"
    if [ "$s" != build ] || [ -n "${!v:-}" ] || build_products_present; then
      note "$s: ok in an earlier run, not repeated"
      continue
    fi
    note "build: ok in an earlier run, but its products are gone: repeated"
  fi
  b=${BUDGET[$s]}
  left=$(( TOTAL_BUDGET - ($(date +%s) - t_start) ))
  if [ "$left" -lt "$b" ]; then
    if [ $(( 2 * left )) -lt "$b" ]; then
      record "$s" skipped - 0
      note "$s: not run: $left s are left of the $TOTAL_BUDGET s total, less than half its $b s"
      continue
    fi
    note "$s: its budget shrinks from $b s to the $left s left"
    b=$left
  fi
  mkdir -p "$RESULTS/$s"
  cmd=$(command_of "$s")
  # TERM a little before the budget, KILL at it: the stage never outlives its budget.
  grace_ms=$(( b * 100 < 3000 ? b * 100 : 3000 ))
  term=$(printf '%d.%03d' $(( (b * 1000 - grace_ms) / 1000 )) $(( (b * 1000 - grace_ms) % 1000 )))
  kill_after=$(printf '%d.%03d' $(( grace_ms / 1000 )) $(( grace_ms % 1000 )))
  note "$s: start (budget $b s): $cmd"
  t0=$(date +%s.%N)
  DEVICE_CHECK_MPS_DIR="$WORK/mps-$s" STAGE_OUT="$RESULTS/$s" DEVICE_CHECK_STAGE_BUDGET=$b \
      timeout -k "$kill_after" "$term" \
      bash -c "$cmd" > "$RESULTS/$s/console.txt" 2>&1 &
  BOUNDED_PIDS=" $!"   # so that a TERM to this script ends the stage's group at once (lib.sh)
  wait $!
  rc=$?
  BOUNDED_PIDS=""
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  left=$(mps_stop "$WORK/mps-$s")
  [ -n "$left" ] && note "$s: an MPS daemon outlived the stage: $left"
  case $rc in
    0) st=ok ;;
    124|137) st=timeout ;;
    *) st=failed ;;
  esac
  record "$s" "$st" "$rc" "$secs"
  note "$s: $st (exit $rc) in $secs s"
  tail -15 "$RESULTS/$s/console.txt" | sed 's/^/    /' >> "$RESULTS/summary.txt"
done

note "state:"
sed 's/^/    /' "$STATE" | tee -a "$RESULTS/summary.txt"
bad=0
for s in $selected; do [ "$(state_of "$s")" = ok ] || bad=1; done
note "done in $(( $(date +%s) - t_start )) s: $([ $bad = 0 ] && echo "every stage ok" || echo "some stages not ok (a rerun repeats them)")"
exit $bad
