#!/usr/bin/env bash
# DIAG (temporary): host-synchronous ordering on every CUDA channel, on the GPU.
set -u
cd "$(dirname "$0")/.."
PY=python3
O="${OUT:-/tmp/diag_out}"; mkdir -p "$O"
t0=$(date +%s)
B=${DIAG_BUDGET:-220}
say() { echo "[diag $(( $(date +%s) - t0 ))s] $*" | tee -a "$O/diag.txt"; }
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
RINGCOMM_CUDA=1 RINGCOMM_BUILD_JOBS=16 timeout 70 $PY -m pip install --no-build-isolation --no-deps -e . > "$O/build.log" 2>&1
say "build exit $?"
export RC_TEST_GPU_COMM_TIMEOUT=15 RC_TEST_GPU_CASE_TIMEOUT=50
timeout -k 5 60 $PY -m pytest tests/test_cuda.py -v -rs -p no:cacheprovider --durations=8 \
  -k 'gpu_all_reduce_order or (gpu_all_collectives and 2-auto-tiny)' > "$O/a.log" 2>&1
say "stage A exit $?: $(tail -1 "$O/a.log")"
grep -E "(PASSED|FAILED|ERROR)" "$O/a.log" | grep "::" | tee -a "$O/diag.txt"
grep -E "Error:" "$O/a.log" | head -6 | tee -a "$O/diag.txt"
left=$(( B - ($(date +%s) - t0) - 5 ))
say "stage B, limit $left s"
timeout -k 5 $left $PY -m pytest tests/test_cuda_reliability.py tests/test_cuda_bookkeeping.py tests/test_cuda.py \
  -v -rs -p no:cacheprovider -o timeout=60 --durations=10 \
  -k "(test_gpu_ and not reduce_kernels_match and not gpu_all_reduce_order and not 2-auto-tiny) or bookkeeping" > "$O/b.log" 2>&1
say "stage B exit $?: $(tail -1 "$O/b.log")"
grep -E "(PASSED|FAILED|ERROR|SKIPPED)" "$O/b.log" | grep "::" | grep -v "bookkeeping.py" | tee -a "$O/diag.txt"
grep -c "PASSED" "$O/b.log" | sed 's/^/passed lines: /' | tee -a "$O/diag.txt"
grep -E "^E .*Error" "$O/b.log" | head -8 | tee -a "$O/diag.txt"
say "done"
