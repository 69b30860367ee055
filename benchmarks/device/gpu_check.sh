#!/usr/bin/env bash
# One-shot GPU check for ringcomm's CUDA path. Run from the repository root on a machine
# with a GPU and nvcc:
#
#     OUT=/some/dir benchmarks/device/gpu_check.sh
#
# It builds ringcomm with the CUDA module (RINGCOMM_CUDA=1), records the environment, runs
# tests/test_cuda.py, tests/test_cuda_reliability.py (dead peer, retired pins, send/recv memory;
# first in stage B) and benchmarks/device/cuda_bench.py, and leaves every log in $OUT:
#   env.txt  build.log  status.txt  tests_a.log  cuda_bench.log  cuda_bench.json  tests_b.log
#   summary.txt  (also printed at the end; 8 files at most, so a runner that returns a bounded
#   number of output files returns them all)
# Knobs: STAGE_A_TIMEOUT (s, default 150), TEST_TIMEOUT (stage B, s, default 300), BENCH_TIMEOUT
# (s, default 150), GPU_CHECK_K (a pytest -k expression: run only that, no stage B), BENCH_ARGS
# (default "-b 1M -e 256M -f 4 --iters 20"), RC_TEST_GPU_COMM_TIMEOUT / RC_TEST_GPU_CASE_TIMEOUT
# (per-collective and per-configuration limits of the GPU cases, default 30 s / 100 s here).
# Exit status: 0 when the build succeeded, CUDA was usable and the tests passed.
# Time: after the build, every stage runs under its own limit (STAGE_A_TIMEOUT, BENCH_TIMEOUT,
# TEST_TIMEOUT, MIXED_TIMEOUT for the 2-GPU mixed-device case, default 200 s), so a hung test or
# benchmark cannot hold the machine past their sum.
# The GPU tests run in priority order (tests/test_cuda.py), so a timeout cuts the least important.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
TEST_TIMEOUT="${TEST_TIMEOUT:-300}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-150}"
BENCH_ARGS="${BENCH_ARGS:--b 1M -e 256M -f 4 --iters 20}"
PY="${PYTHON:-$(command -v python > /dev/null 2>&1 && echo python || echo python3)}"  # PYTHON overrides
status=0
t_start=$(date +%s)
note() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

# ---- environment ----
{
  echo "date: $(date -Is)"; echo "host: $(hostname)"; echo "cwd: $PWD"
  echo "git: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) changed files"
  echo "nproc: $(nproc)"
  echo "--- nvidia-smi"; nvidia-smi 2>&1 || echo "nvidia-smi unavailable"
  echo "--- compute mode / topology"
  nvidia-smi --query-gpu=index,name,uuid,driver_version,compute_mode,memory.total --format=csv 2>&1 || true
  nvidia-smi topo -m 2>&1 || true
  echo "--- nvcc"; (command -v nvcc && nvcc --version) 2>&1 || /usr/local/cuda/bin/nvcc --version 2>&1 || echo "no nvcc"
  echo "--- python"; $PY --version 2>&1
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'gpus', torch.cuda.device_count())" 2>&1 || true
  $PY -c "import cupy; print('cupy', cupy.__version__)" 2>&1 || true
  $PY -c "import pybind11, cmake; print('pybind11', pybind11.__version__)" 2>&1 || true
  echo "--- /dev/shm"; df -h /dev/shm 2>&1 || true
} > "$OUT/env.txt" 2>&1
note "environment recorded in env.txt"

# ---- build ----
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
if RINGCOMM_CUDA=1 RINGCOMM_BUILD_JOBS="$(nproc)" $PY -m pip install --no-build-isolation --no-deps -v -e . > "$OUT/build.log" 2>&1; then
  note "build OK in $(( $(date +%s) - t0 )) s"
else
  note "BUILD FAILED after $(( $(date +%s) - t0 )) s (see build.log)"
  tail -40 "$OUT/build.log" | tee -a "$OUT/summary.txt"
  exit 1
fi

# ---- CUDA status ----
$PY - > "$OUT/status.txt" 2>&1 <<'EOF'
import ringcomm.cuda as c
print("is_available:", c.is_available())
print("reason:", c.unavailable_reason() or "-")
try:
    from ringcomm import _C_cuda
    print("runtime_status:", _C_cuda.runtime_status())
    print("compiled archs:", _C_cuda.COMPILED_ARCHS)
except ImportError as e:
    print("no _C_cuda:", e)
EOF
cat "$OUT/status.txt" | tee -a "$OUT/summary.txt"
if ! grep -q "is_available: True" "$OUT/status.txt"; then
  note "CUDA NOT USABLE: the GPU tests would all skip (a driver older than the CUDA runtime the module was built with?)"
  status=2
fi

# ---- tests and benchmark, most decisive first ----
# Stage A: the kernels bit for bit, the module's report, one full collective sweep (2 ranks, every
# channel picked automatically). Then the benchmark. Then stage B: everything else on the GPU.
run_tests() {  # name, time limit, pytest -k expression, test files (default tests/test_cuda.py)
  local name=$1 limit=$2 expr=$3 files=${4:-tests/test_cuda.py} t0 rc
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout -k 10 "$limit" $PY -m pytest $files -v -rs -p no:cacheprovider --durations=15 \
      -k "$expr" > "$OUT/$name.log" 2>&1
  rc=$?
  note "$name: pytest exit $rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/$name.log")"
  grep -E "(PASSED|FAILED|SKIPPED|ERROR)" "$OUT/$name.log" | grep "::" | sed 's/^/    /' | head -60 >> "$OUT/summary.txt"
  [ $rc -ne 0 ] && status=1
  return 0
}
export RC_TEST_GPU_COMM_TIMEOUT="${RC_TEST_GPU_COMM_TIMEOUT:-30}"
export RC_TEST_GPU_CASE_TIMEOUT="${RC_TEST_GPU_CASE_TIMEOUT:-100}"
STAGE_A='reduce_kernels_match or imports_or_reports or compiled_archs or gpu_all_reduce_order or (gpu_all_collectives and 2-auto-tiny)'
# The reliability tests (GPU) and their host-side bookkeeping tests run with stage B, first.
RELIABILITY="tests/test_cuda_reliability.py tests/test_cuda_bookkeeping.py"
run_tests tests_a "${STAGE_A_TIMEOUT:-150}" "${GPU_CHECK_K:-$STAGE_A}" \
    "tests/test_cuda.py${GPU_CHECK_K:+ $RELIABILITY}"

t0=$(date +%s)
# shellcheck disable=SC2086
timeout -k 10 "$BENCH_TIMEOUT" $PY benchmarks/device/cuda_bench.py $BENCH_ARGS --timeout "$BENCH_TIMEOUT" \
    --json "$OUT/cuda_bench.json" > "$OUT/cuda_bench.log" 2>&1
brc=$?
note "benchmarks/device/cuda_bench.py exit $brc in $(( $(date +%s) - t0 )) s"
cat "$OUT/cuda_bench.log" >> "$OUT/summary.txt"

if [ -z "${GPU_CHECK_K:-}" ]; then
  run_tests tests_b "$TEST_TIMEOUT" \
      "(test_gpu_ and not reduce_kernels_match and not gpu_all_reduce_order and not 2-auto-tiny) or bookkeeping" \
      "$RELIABILITY tests/test_cuda.py"
fi

# Mixed device strings on 2 GPUs: CUDA tensors to NCCL under "cpu:ringcomm,cuda:nccl", to ringcomm
# under "cpu:gloo,cuda:ringcomm" (skips with fewer than 2 GPUs)
if [ -z "${GPU_CHECK_K:-}" ]; then
  t0=$(date +%s)
  timeout -k 10 "${MIXED_TIMEOUT:-200}" $PY -m pytest tests/test_torch_fsdp_mesh.py -v -rs \
      -p no:cacheprovider -k gpu_mixed_devices >> "$OUT/tests_b.log" 2>&1
  rc=$?
  note "test_torch_fsdp_mesh.py -k gpu_mixed_devices: pytest exit $rc in $(( $(date +%s) - t0 )) s"
  [ $rc -ne 0 ] && status=1
fi

note "done in $(( $(date +%s) - t_start )) s, status $status"
cat "$OUT/summary.txt"
exit $status
