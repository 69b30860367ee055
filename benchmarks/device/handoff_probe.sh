#!/usr/bin/env bash
# The hand-off probe (handoff_probe.cu, beside this script): builds it, runs it without MPS (with a
# private, empty MPS pipe folder, so that no system daemon is used), then, where
# nvidia-cuda-mps-control exists, under an MPS daemon of its own (private pipe and log folders,
# stopped by a trap on every exit, killed if it does not quit). Never changes the GPU's compute
# mode. Run from the repository root:
#
#     OUT=/some/dir benchmarks/device/handoff_probe.sh
#
# Output in $OUT: handoff_no_mps.txt, handoff_mps.txt (or why MPS did not run), build.txt.
# ROUNDS, REPS, TIMEOUT_MS pass to the probe (defaults 1000, 5, 2000); each run is bounded by
# PROBE_TIMEOUT seconds (default 120). Exit status: the probe's (the MPS run's where it ran).
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/handoff_out}"
mkdir -p "$OUT"
TMP="$(mktemp -d)"
BIN="$TMP/handoff_probe"
ARGS="${ROUNDS:-1000} ${REPS:-5} ${TIMEOUT_MS:-2000}"
LIMIT="${PROBE_TIMEOUT:-120}"
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-32}"
MPS_PID=""
stop_mps() {
  [ -n "$MPS_PID" ] || return 0
  local servers
  servers=$(echo get_server_list | timeout 5 nvidia-cuda-mps-control 2>/dev/null)
  echo quit | timeout 10 nvidia-cuda-mps-control > /dev/null 2>&1
  for _ in $(seq 20); do kill -0 $MPS_PID $servers 2>/dev/null || break; sleep 0.5; done
  kill -9 $MPS_PID $servers 2>/dev/null
  MPS_PID=""
}
trap 'stop_mps; rm -rf "$TMP"' EXIT

echo "[handoff $(date +%H:%M:%S)] build"
if ! nvcc -O2 -std=c++17 -arch=native -o "$BIN" benchmarks/device/handoff_probe.cu > "$OUT/build.txt" 2>&1; then
  nvcc -O2 -std=c++17 -arch=sm_90 -o "$BIN" benchmarks/device/handoff_probe.cu >> "$OUT/build.txt" 2>&1 || {
    echo "build failed: see build.txt"; exit 1; }
fi
echo "[handoff $(date +%H:%M:%S)] without MPS"
{ nvidia-smi --query-gpu=name,compute_mode,driver_version --format=csv 2>&1; echo "probe $ARGS";
  CUDA_MPS_PIPE_DIRECTORY="$TMP/no_mps_pipe" timeout -k 5 "$LIMIT" "$BIN" $ARGS; echo "exit $?"; } \
  > "$OUT/handoff_no_mps.txt" 2>&1
cat "$OUT/handoff_no_mps.txt"
rc=$(tail -1 "$OUT/handoff_no_mps.txt" | sed -n 's/^exit //p')
if ! command -v nvidia-cuda-mps-control > /dev/null; then
  echo "nvidia-cuda-mps-control not found: no MPS run" | tee "$OUT/handoff_mps.txt"
  exit "${rc:-1}"
fi
export CUDA_MPS_PIPE_DIRECTORY="$TMP/mps_pipe" CUDA_MPS_LOG_DIRECTORY="$TMP/mps_log"
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
echo "[handoff $(date +%H:%M:%S)] with MPS (pipe $CUDA_MPS_PIPE_DIRECTORY)"
if ! timeout 20 nvidia-cuda-mps-control -d > "$OUT/handoff_mps.txt" 2>&1; then
  { echo "MPS daemon did not start"; tail -20 "$CUDA_MPS_LOG_DIRECTORY"/*.log 2>/dev/null; } >> "$OUT/handoff_mps.txt"
  cat "$OUT/handoff_mps.txt"
  exit "${rc:-1}"
fi
sleep 1
MPS_PID=$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" 2>/dev/null)
MPS_PID=${MPS_PID:-$(pgrep -n -f "nvidia-cuda-mps-control -d")}
{ echo "probe $ARGS under MPS (control pid ${MPS_PID:-unknown})"; timeout -k 5 "$LIMIT" "$BIN" $ARGS; echo "exit $?";
  echo "--- MPS control.log"; tail -20 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null;
  echo "--- MPS server.log"; tail -20 "$CUDA_MPS_LOG_DIRECTORY/server.log" 2>/dev/null; } >> "$OUT/handoff_mps.txt" 2>&1
cat "$OUT/handoff_mps.txt"
rc=$(grep '^exit ' "$OUT/handoff_mps.txt" | tail -1 | sed -n 's/^exit //p')
exit "${rc:-1}"
