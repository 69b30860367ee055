"""The measurement core shared by ``python -m ringcomm.bench``, its MPI worker and the
pytest-benchmark suites in ``benchmarks/suites/``.

One *measurement* is (library, mode, collective, dtype, reduce op, size) on every rank:

1. allocate the buffers in the library's native array type (``peers.Runner.array``);
2. **correctness check**: fill the inputs with rank-dependent small integers stored as the dtype
   (sums, products, minima and maxima of them are exact in every dtype, and the pattern's period
   of 7 is prime to every power-of-two chunk size, so a chunk sent to the wrong place, a missed
   peer or a doubled contribution changes values), outputs with a sentinel (0, never expected),
   run the collective once and count the wrong elements;
3. warm-up and timed calls whose counts adapt to the size: the check call's time (max over
   ranks, agreed through the library itself so every rank makes the same number of calls) sizes
   the warm-up (a quarter of ``budget``), the warm-up's mean sizes the first round of timed
   calls (``Policy.timed_calls``); more rounds follow until the rounds have taken ``budget``
   seconds on the slowest rank. So a cell times at least ``min_iters`` calls and at least
   ``budget`` seconds of them, whichever is more, at most ``iters`` calls;
4. barrier, then each rank times every call on its own clock. The parent takes, per call, the
   max over ranks (the call ends for the job when its last rank is done) and reports the spread
   of those: min, median, p90, p99 (with 100 calls or more), mean and max, and the count.
   With a separator (``apart``/``skew``) each rank also records when every call began, on
   ``time.perf_counter`` (CLOCK_MONOTONIC on Linux: one clock for every process of the machine,
   and the bench's ranks share one machine), and the parent adds the spread of the time *after
   the last arrival*: the last rank's end minus the last rank's start, per call. The call's time
   of an early rank includes its wait for the late ones (the separator's release spread, or the
   application's imbalance); the part after the last arrival is what the library adds to the
   job's step.

Arrival (``--arrival``): ``b2b`` times calls back to back. ``apart[:US]`` precedes every warm-up
and timed call with a *separator*: a barrier on another library (torch.distributed gloo in the
same processes, under mpiexec too, so every library's calls arrive as a gloo barrier releases
them; MPI's own barrier only where torch is missing there) and then US µs of compute (a spin on
the clock), as compute separates the collectives of a training or inference step; only the call
itself is timed. ``skew:US`` is the same with rank r computing r*US µs, so rank r arrives r*US µs
after rank 0 (the early ranks' times include the wait for the late ones).

Failures are agreed too: before and after the checked call every rank contributes its state to
a max-all-reduce, so an error on one rank only (gloo's reduce raising on the root alone) skips
the case on every rank instead of leaving the others waiting in a collective. An unsupported
case shows as n/a; any other error retires that library for the rest of the run, everywhere.

Nothing here imports torch, mpi4py or the ringcomm extension: the runners (``peers.py``) do.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import sys
import time
from dataclasses import dataclass

import numpy as np

from .peers import gloo_barrier, make_runner
from .spec import CHUNKED, DTYPES, REDUCING, ROOT, DType, element_count

# --------------------------------------------------------------------------------------------
# Data pattern and the correctness check.

PERIOD = 7                      # prime: never divides a power-of-two chunk offset
BLOCK = PERIOD * (1 << 16)      # elements filled/compared per vectorised step (bounded temporaries)


def rank_values(rank: int, redop: str) -> np.ndarray:
    """One period of rank ``rank``'s input (float64; small integers, exact in every dtype)."""
    k = (np.arange(PERIOD) + 3 * rank) % PERIOD
    if redop == "prod":
        return (1 + k % 2).astype(np.float64)      # {1, 2}: products stay exact powers of two
    return (1 + k).astype(np.float64)              # 1..7: sums of up to 36 ranks exact in bf16


def reduced_values(redop: str, world: int) -> np.ndarray:
    tabs = np.stack([rank_values(r, redop) for r in range(world)])
    if redop == "sum":
        return tabs.sum(0)
    if redop == "prod":
        return tabs.prod(0)
    if redop == "min":
        return tabs.min(0)
    if redop == "max":
        return tabs.max(0)
    if redop == "avg":
        return tabs.sum(0) / world
    raise ValueError(f"unknown reduce op {redop!r}")


def host_dtype(dtype: DType) -> np.dtype:
    """The numpy dtype of a buffer's host view (bfloat16 is viewed as its int16 bits)."""
    return np.dtype(np.int16) if dtype.name == "bfloat16" else np.dtype(dtype.np_name)


def to_host(values: np.ndarray, dtype: DType) -> np.ndarray:
    """float64 values -> the host-view representation of ``dtype`` (bf16: round-to-nearest-even bits)."""
    if dtype.name == "bfloat16":
        f = values.astype(np.float32).view(np.uint32)
        bits = (f + (((f >> 16) & 1) + 0x7FFF)) >> 16
        return bits.astype(np.uint16).view(np.int16)
    if dtype.is_int:
        return values.astype(np.int64).astype(dtype.np_name)     # wraps like C integer arithmetic
    return values.astype(dtype.np_name)


def host_to_f64(block: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype.name == "bfloat16":
        return (block.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return block.astype(np.float64)


def _tolerance(dtype: DType) -> tuple[float, float]:
    """(rtol, atol) for the inexact ops (avg); the others are compared exactly."""
    if dtype.is_int:
        return 0.0, 1.0                 # integer avg may floor or round
    return {"float64": (1e-12, 0.0), "float32": (1e-6, 0.0), "float16": (2e-3, 0.0),
            "bfloat16": (1.6e-2, 0.0)}[dtype.name]


def fill_pattern(view: np.ndarray, values: np.ndarray, phase: int, dtype: DType) -> None:
    """view[i] = values[(phase + i) % PERIOD], vectorised in blocks."""
    n = view.shape[0]
    if n == 0:
        return
    block = np.resize(to_host(np.roll(values, -(phase % PERIOD)), dtype), min(BLOCK, n))
    for s in range(0, n, BLOCK):
        e = min(n, s + BLOCK)
        view[s:e] = block[:e - s]


def count_wrong(view: np.ndarray, values: np.ndarray, phase: int, dtype: DType,
                exact: bool = True) -> int:
    """Number of elements of ``view`` that differ from values[(phase + i) % PERIOD]."""
    n = view.shape[0]
    if n == 0:
        return 0
    rolled = np.roll(values, -(phase % PERIOD))
    wrong = 0
    if exact:
        block = np.resize(to_host(rolled, dtype), min(BLOCK, n))
        for s in range(0, n, BLOCK):
            e = min(n, s + BLOCK)
            wrong += int(np.count_nonzero(view[s:e] != block[:e - s]))
    else:
        rtol, atol = _tolerance(dtype)
        block = np.resize(rolled, min(BLOCK, n))
        for s in range(0, n, BLOCK):
            e = min(n, s + BLOCK)
            got = host_to_f64(view[s:e], dtype)
            ok = np.abs(got - block[:e - s]) <= atol + rtol * np.abs(block[:e - s])
            wrong += int(e - s - np.count_nonzero(ok))
    return wrong


class Case:
    """The buffers, the call and the check of one measurement on one rank."""

    def __init__(self, runner, op: str, mode: str, dtype: DType, redop: str, count: int,
                 rank: int, world: int, root: int = ROOT):
        self.runner, self.op, self.mode, self.dtype, self.redop = runner, op, mode, dtype, redop
        self.count, self.rank, self.world, self.root = count, rank, world, root
        self.chunk = count // world if op in CHUNKED else count
        self.pattern_op = redop if op in REDUCING else "sum"
        arr, view, c, ip = runner.array, runner.view, self.chunk, mode == "ip"
        if op in ("all_reduce", "reduce", "broadcast", "all_to_all"):
            self.inp = arr(count, dtype)
            self.out = self.inp if ip else arr(count, dtype)
        elif op == "reduce_scatter":
            self.inp = arr(count, dtype)
            self.out = view(self.inp, rank * c, (rank + 1) * c) if ip else arr(c, dtype)
        elif op == "all_gather":
            self.out = arr(count, dtype)
            self.inp = view(self.out, rank * c, (rank + 1) * c) if ip else arr(c, dtype)
        else:
            raise ValueError(f"unknown collective {op!r}")
        self.fn = runner.op_fn(op, mode, self.inp, self.out, redop, root)

    def prepare(self) -> None:
        """Sentinel (0) in the outputs, then this rank's pattern in the inputs."""
        with self.runner.host(self.out) as h:
            h[...] = 0
        with self.runner.host(self.inp) as h:
            fill_pattern(h, rank_values(self.rank, self.pattern_op), 0, self.dtype)

    def _expected(self):
        """[(start, stop, values, phase)] segments of the output to compare on this rank."""
        op, r, c, n = self.op, self.rank, self.chunk, self.world
        if op == "all_reduce":
            return [(0, self.count, reduced_values(self.redop, n), 0)]
        if op == "reduce":
            return [(0, self.count, reduced_values(self.redop, n), 0)] if r == self.root else []
        if op == "reduce_scatter":
            return [(0, c, reduced_values(self.redop, n), r * c)]
        if op == "all_gather":
            return [(s * c, (s + 1) * c, rank_values(s, "sum"), 0) for s in range(n)]
        if op == "broadcast":
            return [(0, self.count, rank_values(self.root, "sum"), 0)]
        if op == "all_to_all":
            return [(s * c, (s + 1) * c, rank_values(s, "sum"), r * c) for s in range(n)]
        raise ValueError(op)

    def check(self) -> int:
        exact = self.redop != "avg" or self.op not in REDUCING
        wrong = 0
        with self.runner.host(self.out) as h:
            for a, b, values, phase in self._expected():
                wrong += count_wrong(h[a:b], values, phase, self.dtype, exact)
        return wrong

    def corrupt(self) -> None:
        """Test hook: damage one checked output element (as a mis-reduction would)."""
        segs = self._expected()
        if segs:
            with self.runner.host(self.out) as h:
                h[segs[0][0]] = 0          # the sentinel: never an expected value


# --------------------------------------------------------------------------------------------
# One measurement.

@dataclass
class Policy:
    warmup: int = 5             # -w: at most this many warm-up calls (more if the budget allows)
    iters: int = 200_000        # -n: at most this many timed calls
    budget: float = 0.05        # at least this many seconds of timed calls per measurement
    min_iters: int = 20         # at least this many timed calls (if iters allows)
    inject_wrong: str = ""      # test hook: library whose check results get corrupted
    arrival: str = "b2b"        # b2b | apart | skew (see the module docstring)
    arrival_us: float = 0.0     # apart: compute before every call; skew: rank r computes r x this

    def timed_calls(self, est: float) -> int:
        """The first timed round's length for calls of ``est`` seconds each (the same on every
        rank, as ``est`` is agreed): enough calls to fill ``budget``, at least ``min_iters``, at
        most ``iters``."""
        lo = min(self.min_iters, self.iters)
        return max(lo, min(self.iters, math.ceil(self.budget / max(est, 1e-9))))


def parse_arrival(text: str) -> tuple[str, float]:
    """'b2b', 'apart', 'apart:50', 'skew:20' -> (kind, microseconds)."""
    kind, _, us = text.strip().lower().partition(":")
    if kind not in ("b2b", "apart", "skew"):
        raise ValueError(f"--arrival {text!r}: expected b2b, apart[:US] or skew:US")
    try:
        value = float(us) if us else 0.0
    except ValueError:
        raise ValueError(f"--arrival {text!r}: {us!r} is not a number of microseconds") from None
    if value < 0 or (kind == "b2b" and us):
        raise ValueError(f"--arrival {text!r}: microseconds must be >= 0 (and b2b takes none)")
    if kind == "skew" and value <= 0:
        raise ValueError(f"--arrival {text!r}: skew needs the per-rank delay, e.g. skew:20")
    return kind, value


def spin_us(us: float) -> None:
    """Keep this core busy for `us` microseconds (the calibrated compute between calls)."""
    if us <= 0:
        return
    perf = time.perf_counter
    end = perf() + us * 1e-6
    while perf() < end:
        pass


def make_separator(barrier, policy: Policy, rank: int):
    """The callable run before every call of an `apart`/`skew` measurement, or None (b2b)."""
    if policy.arrival == "b2b":
        return None
    us = policy.arrival_us * (rank if policy.arrival == "skew" else 1)

    def separate():
        barrier()
        spin_us(us)
    return separate


# Agreement codes: every rank contributes its state to a max-all-reduce (through the library
# under test) at two points, so a failure on one rank (e.g. gloo's reduce raising on the root
# only) is known to all and no rank is left waiting in a collective the others skipped.
_OK_LIMIT = 1e19
_FAILED_BENIGN = 1e20       # this case is unsupported somewhere: record, go on
_FAILED_FATAL = 2e20        # the library is broken somewhere: retire it on every rank


class MeasurementAborted(RuntimeError):
    """Raised on the ranks where a measurement did not fail itself but a peer rank's did."""

    def __init__(self, message: str, fatal: bool):
        super().__init__(message)
        self.fatal = fatal


def _failure_code(exc: BaseException | None) -> float:
    if exc is None:
        return 0.0
    if isinstance(exc, MeasurementAborted):
        return _FAILED_FATAL if exc.fatal else _FAILED_BENIGN
    return _FAILED_BENIGN if is_benign(exc) else _FAILED_FATAL


def _agree(runner, value: float, failure: BaseException | None) -> float:
    """All-reduce(max) of this rank's value (or failure code); raise if any rank failed."""
    agreed = runner.agree_max(_failure_code(failure) if failure is not None else value)
    if failure is not None:
        raise failure
    if agreed >= _OK_LIMIT:
        raise MeasurementAborted("failed on another rank (see that rank's error)",
                                 fatal=agreed >= _FAILED_FATAL)
    return agreed


def run_measurement(runner, build, policy: Policy, separator=None) -> dict:
    """Build the case, check once, warm up, time; returns this rank's figures (seconds).
    ``build()`` returns the Case. Failures are agreed across ranks (``_agree``). With a
    ``separator`` (``make_separator``) it runs before every warm-up and timed call, outside the
    timed interval; the iteration count is sized by the whole iteration (separator included)."""
    perf = time.perf_counter
    failure, case = None, None
    try:
        case = build()
        case.prepare()
    except Exception as e:  # noqa: BLE001 - agreed below, then re-raised
        failure = e
    _agree(runner, 0.0, failure)                 # also the barrier before the checked call
    fn = case.fn
    t_check, wrong = 0.0, 0
    try:
        t0 = perf()
        fn()
        t_check = perf() - t0
        if policy.inject_wrong == runner.name:
            case.corrupt()
        wrong = case.check()
    except Exception as e:  # noqa: BLE001
        failure = e
    est = _agree(runner, t_check, failure)
    # Warm up for a quarter of the time budget (at least -w calls, at most 1000): after the previous
    # library's measurement the cores may have idled in kernel waits, and a couple of calls are not
    # enough to get back to steady state. Every library gets the same treatment.
    n_warm = max(min(policy.warmup, 1), min(1000, max(policy.warmup, int(0.25 * policy.budget / max(est, 1e-9)))))
    if n_warm > 0:
        t0 = perf()
        for _ in range(n_warm):
            if separator is not None:
                separator()
            fn()
        est = runner.agree_max((perf() - t0) / n_warm)
    # Timed rounds: the first sized by the warm-up, each next one by the calls timed so far, until
    # the rounds have taken `budget` seconds on the slowest rank (or `iters` calls are timed). The
    # agreed loop time decides on every rank alike, so all ranks make the same calls; a warm-up
    # slowed by one descheduled stretch therefore cannot cut the cell short.
    rounds, done, spent = [], 0, 0.0
    n = policy.timed_calls(est)
    runner.barrier()
    starts_rounds = []
    while True:
        times = np.empty(n, dtype=np.float64)
        starts = np.empty(n, dtype=np.float64)
        t_round = perf()
        for i in range(n):
            if separator is not None:
                separator()
            t0 = perf()
            fn()
            times[i] = perf() - t0
            starts[i] = t0
        spent_here = perf() - t_round
        rounds.append(times)
        starts_rounds.append(starts)
        done += n
        spent = runner.agree_max(spent + spent_here)
        if spent >= policy.budget or done >= policy.iters:
            break
        per_call = max(spent, 1e-9) / done
        n = min(policy.iters - done, max(1, math.ceil((policy.budget - spent) / per_call)))
    out = {"times": np.concatenate(rounds), "wrong": wrong, "warmup": n_warm, "iters": done,
           "rounds": len(rounds), "check_s": t_check}
    if separator is not None:
        out["starts"] = np.concatenate(starts_rounds)
    return out


_BENIGN = re.compile(r"not support|unsupported|can't be cast|cannot be cast|cannot use|"
                     r"not implemented|invalid argument", re.IGNORECASE)


def is_benign(exc: BaseException) -> bool:
    """An error every rank raises the same way (unsupported dtype/op/form): skip the case and go on.
    Anything else (timeouts, peer failures) retires the library for the rest of the run."""
    if isinstance(exc, (TypeError, ValueError, NotImplementedError)):
        return True
    name = type(exc).__name__
    if "Unsupported" in name or "InvalidArgument" in name:
        return True
    return isinstance(exc, RuntimeError) and bool(_BENIGN.search(str(exc))) and \
        "Timeout" not in name and "PeerFailure" not in name


def is_unsupported(exc: BaseException) -> bool:
    """The library declines this dtype/op/form (shown as n/a, not as an error)."""
    return "Unsupported" in type(exc).__name__ or bool(
        re.search(r"not supported|unsupported|does not support", str(exc), re.IGNORECASE))


def short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:160]}"


# --------------------------------------------------------------------------------------------
# The per-rank sweep.

def sweep_steps(cfg: dict) -> list[tuple]:
    """(op, dtype name, redop, nbytes, count) in run order, identical on every rank."""
    world = cfg["world_size"]
    steps = []
    for op in cfg["ops"]:
        for dname in cfg["dtypes"]:
            dtype = DTYPES[dname]
            for redop in (cfg["redops"] if op in REDUCING else ["-"]):
                for nbytes in cfg["sizes"]:
                    count = element_count(op, nbytes, dtype, world)
                    if count > 0:
                        steps.append((op, dname, redop, nbytes, count))
    return steps


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    # disable=None: shown on a terminal only, so piped output (a saved report) stays clean.
    return tqdm(total=total, desc=desc, file=sys.stderr, unit="case", disable=None, leave=False)


def rank_sweep(rank: int, world: int, cfg: dict, libs: list[str], desc: str = "bench") -> dict:
    """Run every step of the sweep for every library on this rank. Returns
    {"rank", "records": [..], "notices": [..], "libs": {name: description}}."""
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)   # torch's deprecation chatter

    # One intra-op thread per rank, as torchrun sets by default: torch's OpenMP workers spin after
    # each parallel region and would steal the cores the collectives run on.
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        pass
    nodes = int(cfg.get("nodes", 1))
    if nodes > 1:
        # Fake nodes on one machine: ranks are split into `nodes` contiguous groups.
        from ..hier.fake_nodes import fake_nodes_env
        os.environ.update(fake_nodes_env(rank, world, nodes, tag="bench"))

    policy = Policy(**cfg["policy"])
    runners, notices, described = [], [], {}
    separator = None
    if policy.arrival != "b2b":
        if libs == ["mpi"]:
            # mpiexec's processes: a gloo group of their own (its own store), the same separator
            # as the spawned ranks'; MPI's barrier where torch is not importable.
            try:
                barrier = gloo_barrier(rank, world, dict(cfg, torch_store=cfg["torch_store"] + ".mpi"))
            except ImportError as e:
                barrier = None
                notices.append(f"mpi: calls separated by MPI_Barrier, not gloo ({short_error(e)})")
        else:
            barrier = gloo_barrier(rank, world, cfg)
    for lib in libs:
        try:
            runner = make_runner(lib, rank, world, cfg)
        except Exception as e:  # noqa: BLE001 - a missing library is a notice, not a failure
            notices.append(f"{lib}: skipped ({short_error(e)})")
            continue
        runners.append(runner)
        described[lib] = runner.describe()
    if policy.arrival != "b2b":
        if barrier is None:
            barrier = next((r.barrier for r in runners if r.name == "mpi"), None)
        separator = make_separator(barrier, policy, rank) if barrier is not None else None
    # Untimed: lazy connection setup and first-call costs stay out of the first measurement. The
    # first library measured (ringcomm) warms up last, so the sweep does not start right after the
    # peers' kernel-sleeping waits.
    for runner in reversed(runners):
        try:
            for _ in range(200):
                runner.agree_max(0.0)
            runner.barrier()
        except Exception as e:  # noqa: BLE001
            runner.disabled = f"retired: warm-up failed ({short_error(e)})"
            notices.append(f"{runner.name}: {runner.disabled}")

    records = []
    steps = sweep_steps(cfg)
    bar = _progress(len(steps), desc, rank == 0)
    try:
        for op, dname, redop, nbytes, count in steps:
            dtype = DTYPES[dname]
            for runner in runners:
                for mode in runner.modes(op, cfg.get("inplace", True)):
                    rec = {"lib": runner.name, "mode": mode, "op": op, "dtype": dname,
                           "redop": redop, "size": count * dtype.itemsize, "nominal": nbytes,
                           "count": count}
                    reason = runner.disabled or runner.unsupported(op, dtype, redop, mode)
                    if reason:
                        rec["na"] = reason
                        records.append(rec)
                        continue
                    t_case = time.perf_counter()
                    try:
                        rec.update(run_measurement(runner, functools.partial(
                            Case, runner, op, mode, dtype, redop, count, rank, world), policy,
                            separator))
                    except Exception as e:  # noqa: BLE001 - recorded, reported in the table
                        if is_unsupported(e):
                            rec["na"] = f"unsupported: {short_error(e)}"
                        else:
                            rec["error"] = short_error(e)
                        fatal = e.fatal if isinstance(e, MeasurementAborted) else not is_benign(e)
                        if fatal:
                            runner.disabled = f"retired after {rec['error']}"
                            notices.append(f"{runner.name}: {op} {dname} {nbytes} B failed: "
                                           f"{rec.get('error') or rec.get('na')}; not measured "
                                           f"further")
                    rec["wall_s"] = time.perf_counter() - t_case
                    records.append(rec)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        for runner in reversed(runners):     # torch subgroups before the default group
            with contextlib.suppress(Exception):
                runner.close()
        if policy.arrival != "b2b" and libs != ["mpi"]:   # the separator's gloo group, if still up
            with contextlib.suppress(Exception):
                import torch.distributed as dist
                if dist.is_initialized():
                    dist.destroy_process_group()
    return {"rank": rank, "records": records, "notices": notices, "libs": described}


# --------------------------------------------------------------------------------------------
# Merging the ranks' records (parent side).

P99_MIN_CALLS = 100     # a p99 needs this many calls to say more than "the slowest call"


def spread(per_call) -> dict:
    """The figures of one cell from its per-call times (seconds): ``time_s`` (the median),
    ``min_s``, ``p90_s``, ``p99_s`` (None under ``P99_MIN_CALLS`` calls), ``mean_s``, ``max_s``
    and ``iters`` (the count). Percentiles interpolate linearly between order statistics, so
    min <= median <= p90 <= p99 <= max."""
    a = np.asarray(per_call, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no timed calls")
    q = np.percentile(a, [50, 90, 99])
    return {"time_s": float(q[0]), "min_s": float(a.min()), "p90_s": float(q[1]),
            "p99_s": float(q[2]) if a.size >= P99_MIN_CALLS else None,
            "mean_s": float(a.mean()), "max_s": float(a.max()), "iters": int(a.size)}


def after_arrival(starts, times) -> dict:
    """``after_p50_s``, ``after_p90_s``, ``after_p99_s`` (None under ``P99_MIN_CALLS`` calls) of
    the time after the last arrival: per call (column), the last rank's end minus the last rank's
    start. ``starts`` and ``times`` are [rank, call] arrays on one clock."""
    starts, times = np.asarray(starts, np.float64), np.asarray(times, np.float64)
    after = (starts + times).max(axis=0) - starts.max(axis=0)
    q = spread(after)
    return {"after_p50_s": q["time_s"], "after_p90_s": q["p90_s"], "after_p99_s": q["p99_s"]}


def merge_ranks(results: list[dict]) -> list[dict]:
    """Per measurement: per-call time = max over ranks; the spread of those (``spread``); with
    start times (calls that arrive apart), the spread after the last arrival (``after_arrival``);
    wrong = sum over ranks. Results tagged with a ``round`` (``--rounds``: the same ranks' sweep
    launched again) are merged round by round; then each figure is the median over the rounds of
    that figure (so their order, min <= median <= p90 <= p99 <= max, holds), ``iters`` the sum,
    and ``rounds`` keeps each round's median (``round_time_s``)."""
    by_key: dict[tuple, dict[int, list[dict]]] = {}
    for res in results:
        rnd = res.get("round", 0)
        for rec in res["records"]:
            key = (rec["lib"], rec["mode"], rec["op"], rec["dtype"], rec["redop"], rec["size"])
            by_key.setdefault(key, {}).setdefault(rnd, []).append(rec)
    merged = []
    for rounds in by_key.values():
        recs = [r for per_round in rounds.values() for r in per_round]
        first = recs[0]
        out = {k: first[k] for k in ("lib", "mode", "op", "dtype", "redop", "size", "nominal",
                                     "count")}
        na = next((r["na"] for r in recs if r.get("na")), None)
        errs = [r["error"] for r in recs if r.get("error")]
        # the failing rank's own error, not its peers' "failed on another rank"
        err = next((e for e in errs if not e.startswith("MeasurementAborted")),
                   errs[0] if errs else None)
        out["wall_s"] = sum(max(r.get("wall_s", 0.0) for r in per_round)
                            for per_round in rounds.values())
        if na:
            out["na"] = na
        elif err or any("times" not in r for r in recs):
            out["error"] = err or "missing on some ranks"
        else:
            figures = [_round_figures(per_round) for per_round in rounds.values()]
            bad = next((f for f in figures if isinstance(f, str)), None)
            if bad:
                out["error"] = bad
            else:
                out.update(_median_over_rounds(figures), warmup=int(first["warmup"]),
                           wrong=int(sum(r["wrong"] for r in recs)))
        merged.append(out)
    return merged


def _round_figures(recs: list[dict]) -> dict | str:
    """One round's figures from its ranks' records, or why they cannot be merged."""
    lens = {len(r["times"]) for r in recs}
    if len(lens) != 1:
        return f"ranks timed different iteration counts {sorted(lens)}"
    times = np.stack([np.asarray(r["times"]) for r in recs])
    out = spread(times.max(axis=0))
    if all("starts" in r for r in recs):
        out.update(after_arrival(np.stack([np.asarray(r["starts"]) for r in recs]), times))
    return out


def _median_over_rounds(figures: list[dict]) -> dict:
    if len(figures) == 1:
        return figures[0]
    out: dict = {}
    for k in figures[0]:
        vals = [f[k] for f in figures]
        if k == "iters":
            out[k] = int(sum(vals))
        elif any(v is None for v in vals):
            out[k] = None
        else:
            out[k] = float(np.median(vals))
    out["round_time_s"] = [f["time_s"] for f in figures]
    return out
