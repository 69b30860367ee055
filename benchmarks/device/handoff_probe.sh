#!/usr/bin/env bash
# The hand-off probe (handoff_probe.cu, beside this script): builds it, runs it without MPS, then,
# where nvidia-cuda-mps-control exists, under an MPS daemon of its own (private pipe and log
# folders, stopped by a trap on every exit). Never changes the GPU's compute mode. Run from the
# repository root:
#
#     OUT=/some/dir benchmarks/device/handoff_probe.sh
#
# Output in $OUT: handoff_no_mps.txt, handoff_mps.txt (or why MPS did not run), build.txt.
# ROUNDS, REPS, TIMEOUT_MS pass to the probe (defaults 1000, 5, 2000); each run is bounded by
# PROBE_TIMEOUT seconds (default 120).
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/handoff_out}"
mkdir -p "$OUT"
BIN="$(mktemp -d)/handoff_probe"
ARGS="${ROUNDS:-1000} ${REPS:-5} ${TIMEOUT_MS:-2000}"
LIMIT="${PROBE_TIMEOUT:-120}"
echo "[handoff $(date +%H:%M:%S)] build"
if ! nvcc -O2 -std=c++17 -arch=native -o "$BIN" benchmarks/device/handoff_probe.cu > "$OUT/build.txt" 2>&1; then
  nvcc -O2 -std=c++17 -arch=sm_90 -o "$BIN" benchmarks/device/handoff_probe.cu >> "$OUT/build.txt" 2>&1 || {
    echo "build failed: see build.txt"; exit 1; }
fi
echo "[handoff $(date +%H:%M:%S)] without MPS"
{ nvidia-smi --query-gpu=name,compute_mode,driver_version --format=csv 2>&1; echo "probe $ARGS";
  timeout -k 5 "$LIMIT" "$BIN" $ARGS; echo "exit $?"; } > "$OUT/handoff_no_mps.txt" 2>&1
cat "$OUT/handoff_no_mps.txt"
if ! command -v nvidia-cuda-mps-control > /dev/null; then
  echo "nvidia-cuda-mps-control not found: no MPS run" | tee "$OUT/handoff_mps.txt"
  exit 0
fi
export CUDA_MPS_PIPE_DIRECTORY="$(mktemp -d)" CUDA_MPS_LOG_DIRECTORY="$(mktemp -d)"
stop_mps() { echo quit | nvidia-cuda-mps-control > /dev/null 2>&1; sleep 1; }
trap stop_mps EXIT
echo "[handoff $(date +%H:%M:%S)] with MPS (pipe $CUDA_MPS_PIPE_DIRECTORY)"
if ! nvidia-cuda-mps-control -d > "$OUT/handoff_mps.txt" 2>&1; then
  { echo "MPS daemon did not start"; cat "$CUDA_MPS_LOG_DIRECTORY"/* 2>/dev/null; } >> "$OUT/handoff_mps.txt"
  cat "$OUT/handoff_mps.txt"
  exit 0
fi
{ echo "probe $ARGS under MPS"; timeout -k 5 "$LIMIT" "$BIN" $ARGS; echo "exit $?";
  echo "--- MPS control log"; tail -20 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null; } >> "$OUT/handoff_mps.txt" 2>&1
cat "$OUT/handoff_mps.txt"
