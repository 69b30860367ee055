"""The bench's rounds and its cross-CPU probe: each figure of a cell is the median over the rounds
of that figure, the order of launches reverses every other round, every launch is listed with
the probe taken around it, and the probe itself (``_C._cpu_pair``) measures a real pair of CPUs
or refuses a bad one with a clear error."""
import json
import os

import numpy as np
import pytest

from ringcomm import _C
from ringcomm.bench.harness import merge_ranks, spread
from ringcomm.bench.launches import FAR, Launch, Launches, order, pair_cpus, probe
from ringcomm.core.cpus import Topology
from ringcomm.core.errors import InvalidArgumentError

from test_bench_cli import run_bench

ALLOWED = sorted(os.sched_getaffinity(0))
TWO_CPUS = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs in this process's mask")


def _rec(times, **extra):
    return dict({"lib": "ringcomm", "mode": "oop", "op": "all_reduce", "dtype": "float32",
                 "redop": "sum", "size": 1024, "nominal": 1024, "count": 256, "warmup": 1,
                 "wrong": 0, "times": list(times), "wall_s": 0.5}, **extra)


def _round(k, per_rank_times, **extra):
    return [{"round": k, "records": [_rec(t, **extra)]} for t in per_rank_times]


def test_one_round_merges_as_before():
    t0, t1 = [1.0, 2.0, 3.0], [1.5, 1.0, 4.0]
    (m,) = merge_ranks(_round(0, [t0, t1]))
    assert m == {**m, **spread(np.maximum(t0, t1)), "wall_s": 0.5}
    assert "round_time_s" not in m


def test_rounds_take_each_figures_median_over_rounds():
    rng = np.random.default_rng(3)
    rounds = [rng.uniform(1, 2, (2, 40)), rng.uniform(5, 9, (2, 25)), rng.uniform(1, 2, (2, 60))]
    results = [res for k, r in enumerate(rounds) for res in _round(k, r)]
    (m,) = merge_ranks(results)
    per = [spread(r.max(axis=0)) for r in rounds]
    for key in ("time_s", "min_s", "p90_s", "mean_s", "max_s"):
        assert m[key] == pytest.approx(float(np.median([p[key] for p in per])))
    assert m["p99_s"] is None            # a round under 100 calls has no p99: neither has the cell
    assert m["iters"] == 125 and m["wall_s"] == 1.5
    assert m["round_time_s"] == [p["time_s"] for p in per]
    assert m["time_s"] < 2.0             # the slow round does not decide the median
    assert m["min_s"] <= m["time_s"] <= m["p90_s"] <= m["max_s"]


def test_rounds_merge_arrival_figures_and_refuse_uneven_ranks():
    starts = [[0.0, 1.0], [0.1, 1.2]]
    results = [res for k in range(3) for res in
               _round(k, [[0.2, 0.3], [0.1, 0.2]], starts=None)]
    for res, s in zip(results, starts * 3):
        res["records"][0]["starts"] = s
    (m,) = merge_ranks(results)
    assert m["after_p50_s"] is not None
    bad = _round(0, [[1.0, 2.0], [1.0, 2.0]]) + _round(1, [[1.0, 2.0], [1.0]])
    (m,) = merge_ranks(bad)
    assert "different iteration counts" in m["error"]


def test_launch_order_reverses_every_other_round():
    groups = ["ringcomm+gloo", "mpi", "impi"]
    assert order(0, groups) == groups and order(2, groups) == groups
    assert order(1, groups) == list(reversed(groups))


@pytest.mark.parametrize("bind,world,allowed,want", [
    ("none", 2, [0, 1], (0, 1)),
    ("core", 2, [0, 1, 2, 3], (0, 2)),       # each rank's share's first CPU
    ("core", 4, [4, 5, 6, 7], (4, 5)),
    ("none", 4, [2, 9], (2, 9)),
    ("core", 3, [0, 1], (0, 1)),             # fewer CPUs than ranks: nothing pinned
])
def test_pair_cpus_are_ranks_0_and_1s(bind, world, allowed, want):
    topo = Topology(allowed, allowed, [allowed])
    assert pair_cpus(world, bind, topo) == (want, "")


def test_pair_cpus_declines_one_rank_or_one_cpu():
    assert pair_cpus(1, "none", Topology([0, 1], [0, 1], [[0, 1]]))[0] is None
    cpus, why = pair_cpus(2, "none", Topology([3], [0, 1, 2, 3], [[0, 1, 2, 3]]))
    assert cpus is None and "one CPU" in why


def test_launch_lines_mark_far_launches_and_failed_probes():
    fast, slow = {"round_trip_ns": 70.0, "handoff_gbps": 8.0}, {"round_trip_ns": 340.0,
                                                               "handoff_gbps": 2.7}
    smt = {"round_trip_ns": 25.0, "handoff_gbps": 24.0}
    ls = Launches((0, 1))
    ls.done = [Launch(0, "ringcomm", fast, fast, True), Launch(0, "mpi", fast, slow, True),
               Launch(1, "mpi", {"error": "TimeoutError: x"}, None, False),
               Launch(1, "ringcomm", smt, fast, True)]
    lines = ls.lines(2)
    assert "2 round(s)" in lines[0] and "CPUs 0 and 1" in lines[1]
    # the lower quartile of the readings (70 ns), not the one 25 ns reading, is the yardstick
    assert "FAR" not in lines[2] and f"FAR: round trip > {FAR:g}x the run's lower quartile (70 ns)" in lines[3]
    assert "probe failed (TimeoutError: x)" in lines[4] and "(did not run)" in lines[4]
    assert "FAR" not in lines[5]
    assert "not taken (one rank" in Launches(None, "one rank: no hand-off to probe").lines(1)[1]


@TWO_CPUS
def test_cpu_pair_probe_measures_two_cpus():
    r = _C._cpu_pair(ALLOWED[0], ALLOWED[1], 64 << 10, 0.05)
    assert set(r) == {"round_trip_ns", "handoff_gbps"}
    # a cache line cannot cross between cores in under a nanosecond, nor take a millisecond
    # between two spinning threads; a hand-off moves data at a positive, finite rate
    assert 1.0 < r["round_trip_ns"] < 1e6 and 0.01 < r["handoff_gbps"] < 1e4
    assert probe((ALLOWED[0], ALLOWED[1]))["round_trip_ns"] > 1.0


def test_cpu_pair_probe_refuses_bad_cpus_and_sizes():
    with pytest.raises(InvalidArgumentError, match="two different CPUs"):
        _C._cpu_pair(0, 0)
    outside = max(ALLOWED) + 1
    with pytest.raises(InvalidArgumentError, match=f"cannot pin a thread to CPU .*{outside}"):
        _C._cpu_pair(ALLOWED[0], outside, 4096, 0.01)
    with pytest.raises(InvalidArgumentError, match="handoff_bytes"):
        _C._cpu_pair(0, 1, 0, 0.01)
    assert "error" in probe((ALLOWED[0], outside)) and probe(None) is None


@TWO_CPUS
def test_cli_rounds_list_every_launch_and_merge_rounds(tmp_path):
    jpath = tmp_path / "r.json"
    r = run_bench("-np", "2", "-b", "4K", "-e", "4K", "-w", "1", "--time-budget", "0.005",
                  "--peers", "gloo", "--ops", "all_reduce", "--rounds", "2", "--json", str(jpath),
                  timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# launches: 2 round(s)" in r.stdout
    assert len([ln for ln in r.stdout.splitlines() if ln.startswith("#   round ")]) == 2
    doc = json.loads(jpath.read_text())
    launches = doc["meta"]["launches"]
    assert [(ln["round"], ln["libs"], ln["ran"]) for ln in launches] == \
        [(1, "ringcomm+gloo", True), (2, "ringcomm+gloo", True)]
    assert all(ln["probe_before"]["round_trip_ns"] > 0 for ln in launches)
    cells = [c for t in doc["tables"] for row in t["rows"] for c in row["libs"].values() if "na" not in c]
    assert cells and all(len(c["round_time_s"]) == 2 for c in cells)
    assert all(c["time_s"] == pytest.approx(float(np.median(c["round_time_s"]))) for c in cells)
    r = run_bench("--rounds", "0", timeout=30)
    assert r.returncode == 2 and "--rounds" in r.stderr
