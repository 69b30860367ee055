#!/usr/bin/env bash
# DIAG (temporary): the IPC-event probe, then the failing GPU tests under each candidate wait.
set -u
cd "$(dirname "$0")/.."
PY=python3
O="${OUT:-/tmp/diag_out}"; mkdir -p "$O"
t0=$(date +%s)
say() { echo "[diag $(( $(date +%s) - t0 ))s] $*" | tee -a "$O/diag.txt"; }
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
(nvcc -O2 -arch=sm_90 -o /tmp/ipc_probe diag/ipc_event_probe.cu && timeout 40 /tmp/ipc_probe) 2>&1 | tee -a "$O/diag.txt"
say "probe done"
RINGCOMM_CUDA=1 RINGCOMM_BUILD_JOBS=16 $PY -m pip install --no-build-isolation --no-deps -e . > "$O/build.log" 2>&1
say "build exit $?"
export RC_TEST_GPU_COMM_TIMEOUT=10 RC_TEST_GPU_CASE_TIMEOUT=60
K='gpu_all_reduce_order or (gpu_all_collectives and 2-auto-tiny)'
good=""
for mode in flush stream; do
  RC_DIAG_PEER_WAIT=$mode timeout -k 5 75 $PY -m pytest tests/test_cuda.py -q -x -p no:cacheprovider -k "$K" > "$O/a_$mode.log" 2>&1
  rc=$?
  say "stage A with $mode: exit $rc: $(tail -1 "$O/a_$mode.log")"
  grep -E "Error:|Timed out" "$O/a_$mode.log" | head -5 | tee -a "$O/diag.txt"
  if [ $rc = 0 ] && [ -z "$good" ]; then good=$mode; break; fi
done
if [ -n "$good" ]; then
  left=$(( ${DIAG_BUDGET:-300} - ($(date +%s) - t0) - 10 ))
  say "stage B with $good, limit $left s"
  RC_DIAG_PEER_WAIT=$good RC_TEST_GPU_COMM_TIMEOUT=30 RC_TEST_GPU_CASE_TIMEOUT=100 timeout -k 5 $left $PY -m pytest \
      tests/test_cuda_reliability.py tests/test_cuda_bookkeeping.py tests/test_cuda.py -v -rs -p no:cacheprovider \
      -k "(test_gpu_ and not reduce_kernels_match and not 2-auto-tiny) or bookkeeping" > "$O/b_$good.log" 2>&1
  say "stage B exit $?: $(tail -1 "$O/b_$good.log")"
  grep -E "(PASSED|FAILED|SKIPPED|ERROR)" "$O/b_$good.log" | grep "::" | sed 's/^/    /' | head -60 | tee -a "$O/diag.txt"
fi
say "done"
