#!/usr/bin/env bash
# One-shot CPU scaling check for ringcomm's host path. Run from the repository root, ideally on a
# machine with >= 16 cores:
#
#     OUT=/some/dir benchmarks/device/cpu_scale_check.sh            # [--quick] [--dry-run]
#
# It records the machine, builds the extension in place if this tree has none (setup.py
# build_ext --inplace, RINGCOMM_CUDA=0; ringcomm is run from src/), then runs
# `python -m ringcomm.bench` (all_reduce float32) at 2, 4, 8 and 16 ranks, each unbound and
# bound (--bind core), beside gloo (required) and MPICH / DeepSpeed where importable; then, most
# telling first, the thread A/B of the split kernels (benchmarks/ab/cpu_threads_ab.py, 64 MiB,
# 1 vs 2 and 4 threads), the all_reduce cost model judged on this machine (`python -m
# ringcomm.apps.tune`, then benchmarks/report/check_model.py at the same world sizes, 1 KiB to 4 MiB;
# docs/algorithms.md), where the pool's worker runs against its caller (the same A/B in 5 fresh
# processes, reduce at 1 MiB) and point-to-point with and without the rendezvous at 4 ranks
# (benchmarks/ab/p2p_rendezvous_ab.py).
# With fewer cores it says so and runs the world sizes that fit (one rank per core).
# Output, written as it goes (partial results survive a timeout), 7 files so that a runner that
# returns a bounded number of files returns them all:
#   env.txt  build.log  tables.txt (every bench's report, the rendezvous A/B's last)
#   results.json (every bench's JSON, merged after each run)  threads.txt  model.txt (the judged
#   table, then the profile)  summary.txt (also printed at the end)
# Time: <= TOTAL_BUDGET s (default 290): every section runs under `timeout` (BUILD_TIMEOUT 150,
# BENCH_TIMEOUT 30 per bench run, THREADS_TIMEOUT 30, P2P_TIMEOUT 30, MODEL_TIMEOUT 60), and a
# section whose limit would overrun the budget is skipped and named in the summary.
# --quick: 2 ranks only (bound and unbound), sizes 1K..64K, no thread or rendezvous A/B and no
# cost model (a smoke test).
# --dry-run: print the plan (the commands), run nothing.
# CPU_SCALE_CORES overrides the core count (to see the plan of another machine with --dry-run);
# CPU_SCALE_WORLDS (default "2 4 8 16", those that fit the cores) and CPU_SCALE_BINDS (default
# "none core") pick the bench runs, in that order (device_check.sh's cpu stage: "16 2", core).
# Exit status: 0 when the build (or the existing build) and every bench run that ran passed and
# gloo ran; 1 otherwise.
set -u
cd "$(dirname "$0")/../.."
QUICK=0
DRY=0
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    --dry-run) DRY=1 ;;
    *) echo "usage: $0 [--quick] [--dry-run]" >&2; exit 2 ;;
  esac
done
OUT="${OUT:-$PWD/cpu_scale_out}"
PY="${PYTHON:-$(command -v python > /dev/null 2>&1 && echo python || echo python3)}"  # PYTHON overrides
TOTAL_BUDGET="${TOTAL_BUDGET:-290}"
BUILD_TIMEOUT="${BUILD_TIMEOUT:-150}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-30}"
THREADS_TIMEOUT="${THREADS_TIMEOUT:-30}"
P2P_TIMEOUT="${P2P_TIMEOUT:-30}"
MODEL_TIMEOUT="${MODEL_TIMEOUT:-60}"
P2P="benchmarks/ab/p2p_rendezvous_ab.py -np 4 --sizes 256K,1M,4M,16M --reps 30 --rounds 5"
PLACEMENT="benchmarks/ab/cpu_threads_ab.py --procs 5 --kernels reduce --sizes 1M --reps 75"
CORES="${CPU_SCALE_CORES:-$(nproc)}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
status=0
t_start=$(date +%s)

worlds=""
for n in ${CPU_SCALE_WORLDS:-2 4 8 16}; do
  [ "$n" -le "$CORES" ] && worlds="$worlds $n"
done
BINDS="${CPU_SCALE_BINDS:-none core}"
[ "$QUICK" = 1 ] && worlds=" 2"
[ -z "$worlds" ] && worlds=" 2"  # one core: 2 oversubscribed ranks still show correctness
if [ "$QUICK" = 1 ]; then SIZES="-b 1K -e 64K -f 8"; else SIZES="-b 1K -e 4M -f 16"; fi
BENCH="$PY -m ringcomm.bench --ops all_reduce $SIZES --time-budget 0.05 --min-iters 10 -w 2 --peers gloo,mpi,deepspeed --timeout $BENCH_TIMEOUT"

model_cmd() {  # check_model.py's arguments at this run's world sizes, the profile in folder $1
  echo "benchmarks/report/check_model.py --profile $1/profile.json -np $(echo $worlds | tr ' ' ',') -b 1K -e 4M --rounds 5"
}

if [ "$DRY" = 1 ]; then
  echo "cores: $CORES; world sizes:$worlds"
  [ "$CORES" -lt 16 ] && echo "fewer than 16 cores: running the world sizes that fit (one rank per core)"
  for n in $worlds; do
    for bind in $BINDS; do echo "timeout $BENCH_TIMEOUT $BENCH -np $n --bind $bind --json <tmp>"; done
  done
  [ "$QUICK" = 1 ] || echo "timeout $THREADS_TIMEOUT $PY benchmarks/ab/cpu_threads_ab.py --threads {2,4} --sizes 64M --reps 5"
  [ "$QUICK" = 1 ] || echo "timeout $MODEL_TIMEOUT: $PY -m ringcomm.apps.tune -o <tmp>/profile.json; $PY $(model_cmd '<tmp>')"
  [ "$QUICK" = 1 ] || echo "timeout $THREADS_TIMEOUT $PY $PLACEMENT"
  [ "$QUICK" = 1 ] || [ "$CORES" -lt 4 ] || echo "timeout $P2P_TIMEOUT $PY $P2P"
  exit 0
fi

mkdir -p "$OUT"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
: > "$OUT/summary.txt"
: > "$OUT/tables.txt"
note() { echo "[cpu_scale $(date +%H:%M:%S) +$(( $(date +%s) - t_start ))s] $*" | tee -a "$OUT/summary.txt"; }
fits() {  # seconds: true when a section of that limit ends within the budget
  [ $(( $(date +%s) - t_start + $1 )) -le "$TOTAL_BUDGET" ]
}

# ---- environment ----
{
  echo "date: $(date -Is)"; echo "host: $(hostname)"; echo "cwd: $PWD"
  echo "git: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) changed files"
  echo "nproc: $(nproc)  (CPU_SCALE_CORES=${CPU_SCALE_CORES:-unset})"
  echo "--- lscpu"; lscpu 2>&1 || true
  echo "--- NUMA nodes"; for f in /sys/devices/system/node/node*/cpulist; do echo "$f: $(cat "$f")"; done 2>&1
  echo "--- affinity: $(grep Cpus_allowed_list /proc/self/status)"
  echo "--- python"; $PY --version 2>&1
  $PY -c "import torch; print('torch', torch.__version__, 'gloo', torch.distributed.is_gloo_available())" 2>&1 || true
  $PY -c "import mpi4py; print('mpi4py', mpi4py.__version__)" 2>&1 || true
  (command -v mpiexec && mpiexec --version | head -2) 2>&1 || echo "no mpiexec"
  $PY -c "import deepspeed; print('deepspeed', deepspeed.__version__)" 2>&1 | tail -1 || true
  echo "--- /dev/shm"; df -h /dev/shm 2>&1 || true
} > "$OUT/env.txt" 2>&1
note "cores: $CORES; world sizes:$worlds$([ "$CORES" -lt 16 ] && echo " (fewer than 16 cores: only the sizes that fit, one rank per core)")"

# ---- build ----
if $PY -c "import ringcomm._C" > /dev/null 2>&1; then
  note "build: ringcomm._C already importable from src/, not rebuilt" | tee "$OUT/build.log" > /dev/null
elif fits "$BUILD_TIMEOUT"; then
  t0=$(date +%s)
  if RINGCOMM_CUDA=0 RINGCOMM_BUILD_JOBS="$(nproc)" timeout -k 10 "$BUILD_TIMEOUT" \
      $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
    note "build OK in $(( $(date +%s) - t0 )) s"
  else
    note "BUILD FAILED after $(( $(date +%s) - t0 )) s (see build.log)"
    tail -30 "$OUT/build.log" | tee -a "$OUT/summary.txt"
    exit 1
  fi
else
  note "BUILD SKIPPED: its limit does not fit the budget"; exit 1
fi

# ---- benches ----
merge_json() {  # every bench JSON so far -> results.json
  $PY - "$TMP" "$OUT/results.json" <<'EOF'
import glob, json, os, sys
runs = {}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    with open(p) as f:
        runs[os.path.basename(p)[:-5]] = json.load(f)
with open(sys.argv[2], "w") as f:
    json.dump(runs, f)
EOF
}
gloo_ran=0
for n in $worlds; do
  for bind in $BINDS; do
    name="np${n}_${bind}"
    if ! fits "$BENCH_TIMEOUT"; then note "$name: SKIPPED (budget)"; status=1; continue; fi
    t0=$(date +%s)
    echo "===== $name: $BENCH -np $n --bind $bind" >> "$OUT/tables.txt"
    # shellcheck disable=SC2086
    timeout -k 5 "$BENCH_TIMEOUT" $BENCH -np "$n" --bind "$bind" --json "$TMP/$name.json" \
        > "$TMP/$name.txt" 2> "$TMP/$name.err"
    rc=$?
    cat "$TMP/$name.txt" >> "$OUT/tables.txt"
    note "$name: exit $rc in $(( $(date +%s) - t0 )) s"
    if [ $rc -ne 0 ]; then status=1; tail -5 "$TMP/$name.err" | sed 's/^/    /' | tee -a "$OUT/summary.txt"; fi
    grep -q "gloo" "$TMP/$name.json" 2>/dev/null && gloo_ran=1
    grep -E "^# notice|avg bus bandwidth|libraries:" "$TMP/$name.txt" | sed 's/^/    /' >> "$OUT/summary.txt"
    merge_json
  done
done
if [ "$gloo_ran" = 0 ]; then note "gloo DID NOT RUN (required): see tables.txt notices"; status=1; fi

# ---- thread A/B of the split kernels ----
if [ "$QUICK" = 0 ]; then
  : > "$OUT/threads.txt"
  for t in 2 4; do
    if [ "$t" -gt "$CORES" ]; then note "threads $t: more than the cores, skipped"; continue; fi
    if ! fits "$THREADS_TIMEOUT"; then note "threads $t: SKIPPED (budget)"; continue; fi
    timeout -k 5 "$THREADS_TIMEOUT" $PY benchmarks/ab/cpu_threads_ab.py --threads "$t" --sizes 64M --reps 5 \
        >> "$OUT/threads.txt" 2>&1
    note "threads A/B 1 vs $t: exit $?"
  done
fi

# ---- the cost model, judged on this machine ----
if [ "$QUICK" = 0 ]; then
  if ! fits "$MODEL_TIMEOUT"; then note "cost model: SKIPPED (budget)"
  else
    timeout -k 5 "$MODEL_TIMEOUT" bash -c "$PY -m ringcomm.apps.tune -o '$TMP/profile.json' > /dev/null && \
        $PY $(model_cmd "$TMP") --json '$TMP/model.json' --out '$OUT/model.txt' > /dev/null" 2>> "$OUT/summary.txt"
    rc=$?
    [ -f "$TMP/profile.json" ] && cat "$TMP/profile.json" >> "$OUT/model.txt"
    note "cost model: exit $rc; $(grep -o 'Model within[^*]*' "$OUT/model.txt" 2>/dev/null || echo 'no result')"
  fi
fi

# ---- where the pool's worker runs against its caller ----
if [ "$QUICK" = 0 ]; then
  if fits "$THREADS_TIMEOUT"; then
    timeout -k 5 "$THREADS_TIMEOUT" $PY $PLACEMENT >> "$OUT/threads.txt" 2>&1
    note "pool placement (2 threads, 1 MiB): exit $?"
  else
    note "pool placement: SKIPPED (budget)"
  fi
  cat "$OUT/threads.txt" >> "$OUT/summary.txt"
fi

# ---- point-to-point: rendezvous against eager ----
if [ "$QUICK" = 0 ]; then
  if [ "$CORES" -lt 4 ]; then note "rendezvous A/B: fewer than 4 cores, skipped"
  elif ! fits "$P2P_TIMEOUT"; then note "rendezvous A/B: SKIPPED (budget)"
  else
    timeout -k 5 "$P2P_TIMEOUT" $PY $P2P >> "$OUT/tables.txt" 2>&1
    note "rendezvous A/B (4 ranks): exit $? (table at the end of tables.txt)"
  fi
fi

note "done in $(( $(date +%s) - t_start )) s, status $status"
cat "$OUT/summary.txt"
exit $status
