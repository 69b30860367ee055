#!/usr/bin/env bash
# The hand-off probe (handoff_probe.cu, beside this script): each way in a process pair of its own,
# the kernel way first, each under `timeout` (WAY_LIMIT s) with its own budget of repetitions
# (WAY_BUDGET_MS), on non-blocking streams (STREAMS="nonblocking legacy" adds the legacy default
# stream); first without MPS (a private, empty MPS pipe folder, so that no system daemon is used),
# then, where nvidia-cuda-mps-control exists, under an MPS daemon of its own (benchmarks/device/lib.sh:
# private pipe and log folders under MPS_DIR, stopped by a trap on every exit that runs one, and by
# device_check.sh after the stage whatever happened). Never changes the GPU's compute mode. Run
# from the repository root:
#
#     OUT=/some/dir benchmarks/device/handoff_probe.sh
#
# Output in $OUT: handoff_no_mps.txt, handoff_mps.txt (or why MPS did not run), build.txt when it
# builds the probe (BIN: an already built probe, as device_check.sh's build stage leaves it).
# Knobs: ROUNDS (1000), REPS (5), TIMEOUT_MS (1000: a repetition's deadline), WAY_BUDGET_MS (3000),
# WAY_LIMIT (s, 6). Time: at most 2 x 4 x WAY_LIMIT s plus the MPS daemon's start.
# Exit status: 0 when every way ran every repetition it started in both modes, 1 otherwise
# (a way that timed out says after how many round trips in its RESULT line).
set -u
cd "$(dirname "$0")/../.."
. benchmarks/device/lib.sh
OUT="${OUT:-$PWD/handoff_out}"
mkdir -p "$OUT"
TMP="$(mktemp -d)"
MPS_DIR="${MPS_DIR:-$TMP/mps}"
WAYS="kernel memop-dev memop-host event"
STREAMS="${STREAMS:-nonblocking}"
ARGS="${ROUNDS:-1000} ${REPS:-5} ${TIMEOUT_MS:-1000} ${WAY_BUDGET_MS:-3000}"
LIMIT="${WAY_LIMIT:-6}"
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-32}"
trap 'mps_stop "$MPS_DIR"; rm -rf "$TMP"' EXIT
trap 'stop_bounded; exit 143' TERM INT

BIN="${BIN:-}"
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
  BIN="$TMP/handoff_probe"
  echo "[handoff $(date +%H:%M:%S)] build"
  if ! nvcc -O2 -std=c++17 -arch=native -o "$BIN" benchmarks/device/handoff_probe.cu > "$OUT/build.txt" 2>&1; then
    nvcc -O2 -std=c++17 -arch=sm_90 -o "$BIN" benchmarks/device/handoff_probe.cu >> "$OUT/build.txt" 2>&1 || {
      echo "build failed: see build.txt"; exit 1; }
  fi
fi

status=0
run_ways() {  # the report file; every way on every stream kind, each under its own limit
  local f=$1 way st rc
  for way in $WAYS; do
    for st in $STREAMS; do
      echo "probe $way $st $ARGS (limit $LIMIT s)" >> "$f"
      # shellcheck disable=SC2086
      bounded "$LIMIT" "$BIN" "$way" "$st" $ARGS >> "$f" 2>&1
      rc=$?
      echo "exit $rc" >> "$f"
      case $rc in
        0) ;;
        124|137) echo "RESULT way=$way stream=$st killed_after_s=$LIMIT" >> "$f"; status=1 ;;
        *) status=1 ;;
      esac
    done
  done
}

echo "[handoff $(date +%H:%M:%S)] without MPS"
{ nvidia-smi --query-gpu=name,compute_mode,driver_version --format=csv 2>&1; echo "without MPS"; } > "$OUT/handoff_no_mps.txt"
mkdir -p "$TMP/no_mps_pipe"
export CUDA_MPS_PIPE_DIRECTORY="$TMP/no_mps_pipe"
run_ways "$OUT/handoff_no_mps.txt"
unset CUDA_MPS_PIPE_DIRECTORY
cat "$OUT/handoff_no_mps.txt"

echo "[handoff $(date +%H:%M:%S)] with MPS"
if ! mps_start "$MPS_DIR" > "$OUT/handoff_mps.txt" 2>&1; then
  cat "$OUT/handoff_mps.txt"
  exit 1
fi
run_ways "$OUT/handoff_mps.txt"
{ echo "--- MPS control.log"; tail -20 "$MPS_DIR/log/control.log" 2>/dev/null
  echo "--- MPS server.log"; tail -20 "$MPS_DIR/log/server.log" 2>/dev/null; } >> "$OUT/handoff_mps.txt"
mps_stop "$MPS_DIR" >> "$OUT/handoff_mps.txt"
cat "$OUT/handoff_mps.txt"
exit $status
