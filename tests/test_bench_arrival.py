"""``python -m ringcomm.bench --arrival apart|skew``, ``--trace`` and the DeepSpeed peer.

In process: the separator runs before every warm-up and timed call and stays outside the timed
interval, and each timed call's start is recorded for the figure after the last arrival (the
last rank's end minus the last rank's start); skew delays rank r by r x US; timed rounds go on until they fill the time budget, even
after a warm-up slowed by a descheduled stretch. End to end (2 ranks, tiny sizes): the new modes produce
checked rows (the correctness check runs against the harness's numpy reference on every rank),
the trace table covers every case on every rank, and DeepSpeed's shm all_reduce is measured and
checked when its extension builds here (skipped with the reason otherwise)."""
import importlib.util
import json
import platform
import time

import numpy as np
import pytest

from ringcomm.bench import harness
from ringcomm.bench.harness import (Policy, after_arrival, make_separator, merge_ranks, parse_arrival,
                                    run_measurement, spin_us)

from test_bench_cli import VERDICT, _check_cells, run_bench

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def test_parse_arrival():
    assert parse_arrival("b2b") == ("b2b", 0.0)
    assert parse_arrival("apart") == ("apart", 0.0)
    assert parse_arrival("apart:50") == ("apart", 50.0)
    assert parse_arrival("SKEW:20") == ("skew", 20.0)
    for bad in ("skew", "skew:0", "apart:-1", "b2b:5", "later", "apart:x"):
        with pytest.raises(ValueError):
            parse_arrival(bad)


class _FakeRunner:
    name = "fake"

    def __init__(self):
        self.events = []

    def agree_max(self, x):
        return x

    def barrier(self):
        pass


class _FakeCase:
    def __init__(self, events):
        self.events = events

    def prepare(self):
        pass

    def fn(self):
        self.events.append("call")

    def check(self):
        return 0


def test_separator_precedes_every_call_and_is_not_timed():
    runner = _FakeRunner()
    policy = Policy(warmup=3, iters=5, budget=1e-9, min_iters=5, arrival="apart", arrival_us=0.0)

    spans = []                               # each separator's (start, end) on perf_counter

    def barrier():
        runner.events.append("sep")
        t0 = time.perf_counter()
        time.sleep(0.02)
        spans.append((t0, time.perf_counter()))

    sep = make_separator(barrier, policy, rank=0)
    res = run_measurement(runner, lambda: _FakeCase(runner.events), policy, sep)
    ev = runner.events
    assert ev[0] == "call"                   # the checked call is not separated
    rest = ev[1:]
    assert rest == ["sep", "call"] * (len(rest) // 2) and len(rest) == 2 * (res["warmup"] + res["iters"])
    assert res["iters"] == 5 and len(res["times"]) == len(res["starts"]) == 5
    # every timed interval lies between the end of its separator and the start of the next one,
    # on the clock the separators are read on
    timed = spans[-5:]
    for k, (start, took) in enumerate(zip(res["starts"], res["times"])):
        assert timed[k][1] <= start and took > 0, (k, timed[k], start)
        if k + 1 < len(timed):
            assert start + took <= timed[k + 1][0], (k, start, took, timed[k + 1])
    b2b = run_measurement(_FakeRunner(), lambda: _FakeCase([]), Policy(warmup=1, iters=3, budget=1e-9))
    assert "starts" not in b2b                # back to back: no arrival to measure after


def test_after_arrival_is_the_last_end_minus_the_last_start():
    # [rank, call]: call 0 - rank 1 arrives 30 us late and both end 5 us after it; call 1 -
    # both arrive together, rank 0 takes 7 us; call 2 - rank 0 arrives last and ends 2 us later
    # while rank 1 (early) ends 1 us after that
    us = 1e-6
    starts = np.array([[0.0, 100.0, 230.0], [30.0, 100.0, 200.0]]) * us
    ends = np.array([[35.0, 107.0, 232.0], [35.0, 104.0, 233.0]]) * us
    got = after_arrival(starts, ends - starts)
    after = np.array([5.0, 7.0, 3.0]) * us
    assert got["after_p50_s"] == pytest.approx(np.percentile(after, 50))
    assert got["after_p90_s"] == pytest.approx(np.percentile(after, 90))
    assert got["after_p99_s"] is None                    # under P99_MIN_CALLS calls
    # the call's figure (max over ranks of each rank's own time) includes the 30 us wait
    rec = {"lib": "x", "mode": "oop", "op": "all_reduce", "dtype": "float32", "redop": "sum",
           "size": 4, "nominal": 4, "count": 1, "warmup": 1, "wrong": 0}
    merged = merge_ranks([{"records": [dict(rec, times=ends[r] - starts[r], starts=starts[r])]}
                          for r in range(2)])[0]
    assert merged["max_s"] == pytest.approx(35 * us) and merged["after_p50_s"] == pytest.approx(5 * us)
    plain = merge_ranks([{"records": [dict(rec, times=ends[r] - starts[r])]} for r in range(2)])[0]
    assert "after_p50_s" not in plain


class _SlowStartCase(_FakeCase):
    """The checked call and the warm-up take 20 ms each (a descheduled stretch), the timed
    calls 0.1 ms: the warm-up's estimate alone would time far less than the budget."""

    def __init__(self, events, slow_calls):
        super().__init__(events)
        self.slow_calls = slow_calls

    def fn(self):
        self.events.append("call")
        spin_us(20_000 if len(self.events) <= self.slow_calls else 100)


def test_timed_rounds_fill_the_budget_after_a_slow_warm_up():
    runner = _FakeRunner()
    policy = Policy(warmup=1, iters=200_000, budget=0.05, min_iters=3)
    res = run_measurement(runner, lambda: _SlowStartCase(runner.events, 2), policy)
    assert res["warmup"] == 1 and res["rounds"] >= 2
    # the later rounds are sized by the timed calls, not by the slow warm-up (which alone would
    # give budget / 20 ms = 2 calls)
    assert res["iters"] == len(res["times"]) > 10
    assert res["times"].sum() >= 0.9 * policy.budget, res["times"].sum()
    # a cell whose first round already fills the budget takes one round, min_iters calls
    runner = _FakeRunner()
    res = run_measurement(runner, lambda: _SlowStartCase(runner.events, 10**9),
                          Policy(warmup=1, budget=0.01, min_iters=3))
    assert res["rounds"] == 1 and res["iters"] == 3


def test_skew_delays_rank_by_rank_times_us(monkeypatch):
    calls = []
    policy = Policy(arrival="skew", arrival_us=3000.0)
    assert make_separator(calls.append, Policy(), 1) is None        # b2b: no separator
    spins = []
    monkeypatch.setattr(harness, "spin_us", lambda us: (spins.append(us), spin_us(us)))
    for rank, lo in ((0, 0.0), (2, 0.006)):
        sep = make_separator(lambda: calls.append(rank), policy, rank)
        t0 = time.perf_counter()
        sep()
        dt = time.perf_counter() - t0
        assert dt >= lo, (rank, dt)
    assert calls == [0, 2] and spins == [0.0, 6000.0]   # rank 0 is not delayed, rank 2 by 2 x 3 ms


def _cells(doc):
    return [(name, c) for t in doc["tables"] for row in t["rows"] for name, c in row["libs"].items()]


@pytest.mark.skipif(not HAVE_TORCH, reason="the separator is a gloo barrier (torch)")
@pytest.mark.parametrize("arrival", ["apart:20", "skew:30"])
def test_cli_arrival_modes_rows_checked(tmp_path, arrival):
    jpath = tmp_path / "a.json"
    r = run_bench("-np", "2", "-b", "1K", "-e", "4K", "-w", "1", "--time-budget", "0.005",
                  "--ops", "all_reduce,broadcast", "-d", "float32,bfloat16", "--peers", "gloo",
                  "--arrival", arrival, "--json", str(jpath), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    kind = arrival.split(":")[0]
    assert f"# arrival: {kind} (before every call: a torch.distributed gloo barrier" in r.stdout
    doc = json.loads(jpath.read_text())
    assert doc["wrong"] == 0 and doc["errors"] == 0
    assert doc["meta"]["config"]["policy"]["arrival"] == kind
    assert {(t["op"], t["dtype"]) for t in doc["tables"]} == {
        (op, d) for op in ("all_reduce", "broadcast") for d in ("float32", "bfloat16")}
    measured = _check_cells(doc, 20)        # checked, >= 20 calls, min <= median <= p90
    assert {n.split("/")[0] for n, _ in measured} == {"ringcomm", "gloo"}
    # the part after the last arrival, per cell. Per call it is at most the call's figure (the
    # rank that ends last started no later than the last arrival), so its quantiles are too.
    for name, c in measured:
        assert 0 < c["after_p50_us"] <= c["after_p90_us"], (name, c)
        assert c["after_p50_us"] <= c["time_us"] and c["after_p90_us"] <= c["p90_us"], (name, c)
    assert "after p50" in r.stdout
    assert not VERDICT.search(r.stdout)


def test_cli_trace_table():
    r = run_bench("-np", "2", "--trace", "-n", "5", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line and not line.startswith("#")]
    arrivals = ("b2b", "apart") if HAVE_TORCH else ("b2b",)
    want = {(op, size, a, rank) for op in ("all_reduce", "broadcast") for size in ("1K", "64K")
            for a in arrivals for rank in ("0", "1")}
    assert {tuple(row[:4]) for row in rows} == want, r.stdout
    for row in rows:
        total = float(row[12])
        parts = [float(x) for x in row[5:12] if x != "-"]
        assert total > 0 and all(p >= 0 for p in parts), row
    assert "# check: ok" in r.stdout


def test_cli_trace_table_at_given_sizes():
    r = run_bench("-np", "2", "--trace", "-n", "3", "-b", "256", "-e", "1M", "-f", "64", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line and not line.startswith("#")]
    assert {(row[0], row[1]) for row in rows} == {
        (op, size) for op in ("all_reduce", "broadcast") for size in ("256B", "16K", "1M")}, r.stdout
    # algorithm/protocol each size takes at 2 ranks: the LL outbox, the direct exchange with the
    # header in the first slot, the ring over slots and the chain with its first piece in the slot
    algos = {(row[0], row[1]): row[4] for row in rows}
    assert algos[("all_reduce", "256B")] == "direct/ll" and algos[("all_reduce", "16K")] == "direct/header_in_slot"
    assert algos[("all_reduce", "1M")] == "ring/header_in_slot" and algos[("broadcast", "1M")] == "chain/header_in_slot"
    assert "# check: ok" in r.stdout


def test_cli_trace_table_of_the_named_collectives():
    r = run_bench("-np", "2", "--trace", "-n", "3", "--ops", "reduce,all_to_all,all_gather,reduce_scatter",
                  "-b", "1K", "-e", "64K", "-f", "64", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line and not line.startswith("#")]
    assert {(row[0], row[1]) for row in rows} == {
        (op, size) for op in ("reduce", "all_to_all", "all_gather", "reduce_scatter") for size in ("1K", "64K")}, r.stdout
    algos = {(row[0], row[1]): row[4] for row in rows}
    assert algos[("reduce", "1K")] == "direct/ll" and algos[("reduce", "64K")] == "chain/header_in_slot"
    assert algos[("all_to_all", "1K")] == "direct/simple" and algos[("all_gather", "64K")] == "ring/header_in_slot"
    assert "# check: ok" in r.stdout


def _deepspeed_reason():
    from ringcomm.bench.peers import probe
    return probe("deepspeed")


def test_deepspeed_kernel_level_and_the_reasons_it_gives():
    """The levels of DeepSpeed's shm kernels, from its own answer or the CPU's flags, and what
    each level leaves unmeasured, with the instruction set it lacks: every CPU's case is decided
    here, whatever this machine's instruction set."""
    from ringcomm.bench.peers import DeepSpeedRunner, ds_kernel_level, ds_unsupported
    from ringcomm.bench.spec import DTYPES
    avx512 = {"sse2", "avx", "avx2", "f16c", "avx512f", "avx512bw", "avx512vl"}
    assert ds_kernel_level(flags=avx512) == 2
    assert ds_kernel_level(flags=avx512 - {"avx512bw"}) == 1      # AVX2 only
    assert ds_kernel_level(flags={"sse2", "avx"}) == 0
    assert ds_kernel_level(flags=set()) == 0

    class Ext:                                # the extension's answer wins over the flags
        def vector_kernel_level(self):
            return 1
    assert ds_kernel_level(Ext(), flags=avx512) == 1
    assert ds_kernel_level(object(), flags=avx512) == 2          # an extension without one

    lacks = "deepspeed: the shm kernels for {} need {}, which this CPU lacks"
    for level, want in [(2, {}),
                        (1, {"bfloat16": lacks.format("bfloat16", "avx512bw"),
                             "float16": lacks.format("float16", "avx512bw")}),
                        (0, {d: lacks.format(d, "avx2" if d == "float32" else "avx512bw")
                             for d in ("float32", "bfloat16", "float16")})]:
        for d in ("float32", "bfloat16", "float16"):
            assert ds_unsupported("all_reduce", d, "sum", level) == want.get(d), (level, d)
        assert "all_reduce only" in ds_unsupported("broadcast", "float32", "sum", level)
        assert "sums only" in ds_unsupported("all_reduce", "float32", "max", level)
        assert "float32, bfloat16, float16 only" in ds_unsupported("all_reduce", "int32", "sum", level)
        # the runner answers with its level (set from the extension when it starts)
        runner = DeepSpeedRunner.__new__(DeepSpeedRunner)
        runner._level = level
        for d in ("float32", "bfloat16"):
            assert runner.unsupported("all_reduce", DTYPES[d], "sum", "ip") == want.get(d)


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
def test_cli_deepspeed_peer(tmp_path):
    """DeepSpeed's shm all_reduce measured and checked on every dtype its kernels run on this
    CPU: float32 with AVX2, bfloat16 with AVX-512 BW; where this CPU lacks that, the bfloat16
    cells are n/a and the bench says which instruction set is missing."""
    from ringcomm.core.machine import cpu_flags
    reason = _deepspeed_reason()
    if reason:
        pytest.skip(f"deepspeed peer unavailable: {reason}")
    # the instruction set each dtype's kernels need, on x86-64 (elsewhere DeepSpeed runs them all)
    x86 = platform.machine() in ("x86_64", "AMD64")
    need = {"float32": "avx2", "bfloat16": "avx512bw"}
    runs = {d: not x86 or isa in cpu_flags() for d, isa in need.items()}
    jpath = tmp_path / "ds.json"
    r = run_bench("-np", "2", "-b", "1K", "-e", "4K", "-w", "1", "--time-budget", "0.005",
                  "--ops", "all_reduce,broadcast", "-d", "float32,bfloat16", "--peers", "deepspeed",
                  "--arrival", "apart", "--json", str(jpath), timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(jpath.read_text())
    assert not [n for n in doc["meta"]["notices"] if n.startswith("deepspeed")], doc["meta"]["notices"]
    assert doc["wrong"] == 0 and doc["errors"] == 0
    ds = [(t["op"], t["dtype"], c) for t in doc["tables"] for row in t["rows"]
          for n, c in row["libs"].items() if n.startswith("deepspeed")]
    measured = {(op, d) for op, d, c in ds if "na" not in c}
    assert measured == {("all_reduce", d) for d, ok in runs.items() if ok}, ds
    lacks = "deepspeed: the shm kernels for {} need {}, which this CPU lacks".format
    for op, d, c in ds:
        if op == "broadcast":
            assert c["na"] == "deepspeed: the shm op is all_reduce only (not broadcast)", c
        elif not runs[d]:
            assert c["na"] == lacks(d, need[d]), (op, d, c)
    for d, ok in runs.items():
        assert (lacks(d, need[d]) in r.stdout) == (not ok), r.stdout
    _check_cells(doc, 20)          # deepspeed's cells too: checked, >= 20 calls, spread ordered
    assert "deepspeed (in-place)" in r.stdout


@pytest.mark.skipif(not HAVE_TORCH, reason="the separator is a gloo barrier (torch)")
def test_cli_mpi_apart_uses_the_gloo_separator(tmp_path):
    """Under mpiexec the calls follow the same gloo barrier as the other libraries' (no notice
    of MPI_Barrier), and the MPI rows are measured and checked."""
    from ringcomm.bench.peers import probe
    reason = probe("mpi")
    if reason:
        pytest.skip(f"mpi peer unavailable: {reason}")
    jpath = tmp_path / "mpi.json"
    r = run_bench("-np", "2", "-b", "1K", "-e", "4K", "-w", "1", "--time-budget", "0.005",
                  "--ops", "all_reduce", "-d", "float32", "--peers", "mpi", "--arrival", "apart",
                  "--json", str(jpath), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(jpath.read_text())
    assert not [n for n in doc["meta"]["notices"] if "MPI_Barrier" in n or n.startswith("mpi: skipped")], \
        doc["meta"]["notices"]
    assert doc["wrong"] == 0 and doc["errors"] == 0
    mpi = [c for n, c in _cells(doc) if n.startswith("mpi")]
    assert mpi and all("na" not in c for c in mpi), mpi
    _check_cells(doc, 20)
