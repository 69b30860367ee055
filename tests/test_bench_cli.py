"""Smoke test of ``python -m ringcomm.bench``: tiny sizes, 2 ranks, every collective; the tables,
the JSON and the PNG come out, every cell reports its count of timed calls (at least 20 by
default) and the spread of their times (min <= median <= p90 <= p99), the output states no
target or verdict, the correctness check runs, and the check can fail (a wrong element injected
through the CLI's test hook turns into FAIL cells and exit status 1). Plus fast in-process tests
of the pattern/check arithmetic, the call count rule, the spread and the table."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ringcomm
from ringcomm.bench import harness, report, spec
from ringcomm.bench.harness import (P99_MIN_CALLS, Policy, count_wrong, fill_pattern, host_dtype,
                                    rank_values, reduced_values, spread)
from ringcomm.bench.spec import DTYPES, parse_size, size_sweep

SRC = os.path.dirname(os.path.dirname(os.path.abspath(ringcomm.__file__)))
HAVE_TORCH = importlib.util.find_spec("torch") is not None
OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all"]
# What the bench must not print or contain: our own targets and verdicts live in benchmarks/report/.
VERDICT = re.compile(r"\b(targets?|verdicts?|not met|met|goals?)\b", re.IGNORECASE)


def run_bench(*args, timeout=120):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SRC] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    return subprocess.run([sys.executable, "-m", "ringcomm.bench", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# The arithmetic under the correctness check (in process, milliseconds).

@pytest.mark.parametrize("dtype", list(DTYPES))
def test_pattern_roundtrip_and_single_error_detected(dtype):
    dt = DTYPES[dtype]
    n = harness.BLOCK + 123                      # crosses a block boundary
    buf = np.empty(n, dtype=host_dtype(dt))
    for redop in ("sum", "prod", "max", "avg"):
        values = reduced_values(redop, 3)
        fill_pattern(buf, values, 5, dt)
        exact = redop != "avg"
        assert count_wrong(buf, values, 5, dt, exact) == 0
        assert count_wrong(buf, values, 6, dt, exact) > 0          # shifted by one: wrong
        buf[n - 1] = 0                                              # one damaged element
        assert count_wrong(buf, values, 5, dt, exact) == 1


def test_reduced_values_are_exact_and_rank_dependent():
    for world in (2, 3, 4, 8):
        s = reduced_values("sum", world)
        assert np.array_equal(s, np.round(s)) and s.max() <= 7 * world
        # a missed or doubled rank changes every sum
        assert not np.array_equal(s, reduced_values("sum", world - 1) if world > 1 else s * 0)
    assert len({tuple(rank_values(r, "sum")) for r in range(7)}) == 7


def test_sizes_and_parsing():
    assert parse_size("1K") == 1024 and parse_size("64M") == 64 << 20 and parse_size("8") == 8
    assert parse_size("4KiB") == 4096 and parse_size("1G") == 1 << 30
    assert size_sweep(8, 256 << 20, 4)[-2:] == [128 << 20, 256 << 20]
    assert size_sweep(1024, 64 << 20, 4) == [1024 << (2 * k) for k in range(9)]
    assert spec.element_count("all_gather", 8, DTYPES["float32"], 4) == 0
    assert spec.bus_factor("all_reduce", 4) == 1.5


def test_timed_calls_at_least_min_calls_and_budget():
    p = Policy(budget=0.05, min_iters=20, iters=200_000)
    assert p.timed_calls(1.0) == 20                  # slow calls: the call floor decides
    assert p.timed_calls(0.05 / 20) == 20
    assert p.timed_calls(1e-4) == 500                # fast calls: 0.05 s of them
    assert p.timed_calls(3e-4) * 3e-4 >= 0.05        # rounded up, never under the budget
    assert p.timed_calls(1e-12) == 200_000           # at most -n
    assert Policy(budget=0.05, min_iters=20, iters=5).timed_calls(1.0) == 5   # -n below the floor


def test_spread_orders_and_counts():
    rng = np.random.default_rng(1)
    for n in (1, 2, 20, 99, 100, 1000):
        x = rng.lognormal(-11, 0.5, n)
        s = spread(x)
        assert s["iters"] == n
        assert s["min_s"] == x.min() and s["max_s"] == x.max()
        assert s["min_s"] <= s["time_s"] <= s["p90_s"] <= s["max_s"]
        assert s["time_s"] == np.median(x)
        if n >= P99_MIN_CALLS:
            assert s["p90_s"] <= s["p99_s"] <= s["max_s"]
        else:
            assert s["p99_s"] is None
    # one slow call in 20 (a descheduled stretch) moves the p90's neighbourhood, not the median
    x = np.full(20, 2e-6)
    x[7] = 2e-5
    s = spread(x)
    assert s["time_s"] == 2e-6 and s["max_s"] == 2e-5
    with pytest.raises(ValueError):
        spread([])


def _record(lib, mode, size, times, wrong=0):
    r = {"lib": lib, "mode": mode, "op": "all_reduce", "dtype": "float32", "redop": "sum",
         "size": size, "nominal": size, "count": size // 4, "wrong": wrong, "warmup": 1,
         **spread(times)}
    return r


def test_table_shows_count_spread_speedup_and_no_verdict():
    records = [_record("ringcomm", "oop", 1024, [2e-6] * 150 + [9e-6] * 10),
               _record("ringcomm", "ip", 1024, [1.5e-6] * 30),
               _record("gloo", "ip", 1024, [3e-4] * 25),
               _record("ringcomm", "oop", 4096, [4e-6] * 40),
               _record("ringcomm", "ip", 4096, [3e-6] * 40, wrong=3),
               {"lib": "gloo", "mode": "ip", "op": "all_reduce", "dtype": "float32",
                "redop": "sum", "size": 4096, "nominal": 4096, "count": 1024,
                "na": "unsupported: x"}]
    report.enrich(records, 2)
    text, data = report.render(["# head"], records, {1024: {"gbps": 10.0}}, 2)
    assert not VERDICT.search(text), VERDICT.search(text)
    lines = text.splitlines()
    header = next(line for line in lines if "library" in line)
    assert header.split()[1:] == ["size", "elems", "library", "calls", "min", "median", "p90",
                                  "p99", "algbw", "busbw", "speedup", "memcpy", "check"]
    rows = [line for line in lines if not line.startswith("#")]
    assert len(rows) == 6
    rc_oop = rows[0].split()
    assert rc_oop[:5] == ["1024", "256", "ringcomm", "out-of-place", "160"]
    assert [float(x) for x in rc_oop[5:9]] == [2.0, 2.0, 2.0, 9.0]          # min median p90 p99
    assert rc_oop[-2:] == ["10.00", "ok"]                                     # memcpy, check
    gloo = rows[2].split()
    assert gloo[:3] == ["gloo", "(in-place)", "25"] and gloo[-1] == "ok"
    assert float(gloo[3]) == 300.0 and float(gloo[-2]) == 200.0               # speedup 300 / 1.5
    assert rows[1].split()[:3] == ["ringcomm", "in-place", "30"]
    assert len(rows[1].split()) == len(rc_oop) - 4                  # no size, elems, p99, memcpy
    assert rows[4].split()[-2:] == ["FAIL", "3"]
    assert rows[5].split() == ["gloo", "(in-place)", "n/a"]
    assert "# Out of bounds values : 3 FAILED" in text
    (sp,) = data["speedup"]
    assert (sp["table"], sp["peer"], sp["sizes"], sp["min_size"], sp["max_size"]) == (
        "all_reduce float32 sum", "gloo", 1, 1024, 1024)
    assert sp["min"] == sp["max"] == pytest.approx(200.0)
    # without any cell of >= 100 calls the p99 column is left out
    short = [r for r in records if r.get("iters", 0) < P99_MIN_CALLS]
    text, _ = report.render([], short, {}, 2)
    assert " p99 " not in next(line for line in text.splitlines() if "library" in line)


def test_bench_package_states_no_target_or_verdict():
    """Our targets and their verdicts live in benchmarks/report/check_targets.py, not in the bench."""
    bench_dir = Path(harness.__file__).parent
    found = []
    for path in sorted(bench_dir.glob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            m = VERDICT.search(line.replace("target=", ""))      # threading.Thread(target=...)
            if m:
                found.append(f"{path.name}:{i}: {line.strip()}")
    assert not found, found


def _check_cells(doc, min_calls):
    """Every measured cell: checked, counted, and its spread ordered; returns the cells."""
    cells = []
    for t in doc["tables"]:
        for row in t["rows"]:
            for name, cell in row["libs"].items():
                if "na" in cell:
                    continue
                assert cell["wrong"] == 0 and cell["iters"] >= min_calls, (name, cell)
                assert 0 < cell["min_us"] <= cell["time_us"] <= cell["p90_us"] <= cell["max_us"], \
                    (name, cell)
                if cell["iters"] >= P99_MIN_CALLS:
                    assert cell["p90_us"] <= cell["p99_us"] <= cell["max_us"], (name, cell)
                else:
                    assert cell["p99_us"] is None, (name, cell)
                assert cell["busbw"] >= 0 and "per_iter_s" not in cell
                cells.append((name, cell))
    return cells


# ---------------------------------------------------------------------------------------------
# The CLI end to end.

@pytest.mark.skipif(not HAVE_TORCH, reason="the gloo peer needs torch")
def test_cli_tables_json_plot(tmp_path):
    peers = "gloo,mpi" if importlib.util.find_spec("mpi4py") else "gloo"
    jpath, ppath = tmp_path / "bench.json", tmp_path / "bench.png"
    r = run_bench("-np", "2", "-b", "1K", "-e", "16K", "-f", "4", "-w", "1", "--time-budget",
                  "0.005", "--peers", peers, "--json", str(jpath), "--plot", str(ppath),
                  timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for op in OPS:
        assert f"# {op} float32" in out, out
    assert "ringcomm out-of-place" in out and "ringcomm in-place" in out
    assert "gloo (in-place)" in out and "speedup" in out and "memcpy" in out
    for col in ("calls", "min", "median", "p90", "busbw"):
        assert f" {col} " in out, col
    assert "at least 20 timed calls" in out
    assert "# avg bus bandwidth" in out and re.search(r"all_reduce float32 sum +vs gloo +[0-9.]+x", out)
    assert "# Out of bounds values : 0 OK" in out
    assert not VERDICT.search(out), VERDICT.search(out)

    doc = json.loads(jpath.read_text())
    assert doc["wrong"] == 0 and doc["errors"] == 0
    assert [t["op"] for t in doc["tables"]] == OPS
    assert len(doc["memcpy"]) == 3 and all(m["gbps"] > 0 for m in doc["memcpy"])
    assert "verdicts" not in doc and doc["speedup"]
    for t in doc["tables"]:
        assert [row["size"] for row in t["rows"]] == [1024, 4096, 16384]
    libs_seen = {name.split("/")[0] for name, _ in _check_cells(doc, 20)}
    assert {"ringcomm", "gloo"} <= libs_seen
    # the calls column of the printed rows: every measured cell's count, each at least 20
    printed = re.findall(r"(?:ringcomm (?:out-of-place|in-place)|\w+ \((?:in|out-of)-place\)) +"
                         r"(\d+) ", out)
    assert sorted(int(n) for n in printed) == sorted(c["iters"] for _, c in _check_cells(doc, 20))
    if "mpi" in peers:
        assert "mpi" in libs_seen or any("mpi: skipped" in n for n in doc["meta"]["notices"])
    assert ppath.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and ppath.stat().st_size > 10_000


def test_cli_check_can_fail(tmp_path):
    """A wrong element in ringcomm's result must show as FAIL and exit status 1."""
    jpath = tmp_path / "bad.json"
    r = run_bench("-np", "2", "-b", "4K", "-e", "4K", "-w", "1", "-n", "2", "--peers", "none",
                  "--ops", "all_reduce,all_gather", "--inject-wrong", "ringcomm",
                  "--json", str(jpath))
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r"ringcomm (out-of-place|in-place) .* FAIL [1-9]\d*$", r.stdout, re.MULTILINE)
    assert "Out of bounds values" in r.stdout
    assert "FAILED" in r.stdout
    doc = json.loads(jpath.read_text())
    cells = [c for t in doc["tables"] for row in t["rows"] for c in row["libs"].values()]
    assert cells and all(c["wrong"] > 0 for c in cells if "na" not in c)


def test_cli_rejects_bad_arguments():
    r = run_bench("--ops", "all_reduce,bogus", timeout=30)
    assert r.returncode == 2 and "unknown collective" in r.stderr
    r = run_bench("--peers", "nonesuch", timeout=30)
    assert r.returncode == 2 and "unknown peer" in r.stderr


def test_cli_min_iters_times_that_many_calls(tmp_path):
    """--min-iters overrides the time budget: a 1e-9 s budget still times 4 calls per cell."""
    jpath = tmp_path / "min.json"
    r = run_bench("-np", "2", "-b", "64K", "-e", "256K", "-w", "0", "-n", "6", "--min-iters", "4",
                  "--time-budget", "1e-9", "--peers", "none", "--ops", "all_reduce", "--json", str(jpath))
    assert r.returncode == 0, r.stdout + r.stderr
    cells = [c for t in json.loads(jpath.read_text())["tables"] for row in t["rows"] for c in row["libs"].values()
             if "na" not in c]
    assert cells and all(c["iters"] == 4 for c in cells), [c["iters"] for c in cells]
    r = run_bench("--min-iters", "0", timeout=30)
    assert r.returncode == 2 and "--min-iters" in r.stderr


def test_mpi_phase_failure_names_mpiexecs_last_error_line_and_allows_root(tmp_path, monkeypatch, capfd):
    """A failing mpiexec: the notice quotes its last stderr line with words in it, not the closing
    rule of its banner (all of it is passed on to ours), and run as root the child sees Open MPI's
    two allow-root variables."""
    from ringcomm.bench import cli
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho \"root=${OMPI_ALLOW_RUN_AS_ROOT:-unset}/${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-unset}\" >&2\n"
                    "echo 'fake mpiexec: cannot start' >&2\necho '-----------' >&2\nexit 3\n")
    fake.chmod(0o755)
    from ringcomm.bench.drivers import locate
    monkeypatch.setattr(locate, "mpich", lambda: None)      # not the mpich wheel's launcher
    monkeypatch.setattr(cli, "find_mpiexec", lambda: str(fake))
    monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT", raising=False)
    monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", raising=False)
    notices = []
    assert cli.run_mpi_phase({"world_size": 2, "timeout": 30}, str(tmp_path), notices) is None
    assert len(notices) == 1 and "exited with 3: fake mpiexec: cannot start" in notices[0], notices
    err = capfd.readouterr().err
    assert "fake mpiexec: cannot start" in err
    assert ("root=1/1" if os.geteuid() == 0 else "root=unset/unset") in err, err


@pytest.mark.skipif(not HAVE_TORCH, reason="the probe runs torch ranks")
@pytest.mark.timeout(900)
def test_torch_apart_probe_reports_each_call(tmp_path):
    """benchmarks/probes/torch_apart.py, tiny: per peer (dist.all_reduce on the ringcomm group,
    ringcomm.torch.all_reduce_, the torch.ops.ringcomm.all_reduce_ op, DeepSpeed's op where it is
    installed) the call and
    after-last-arrival figures of every timed call, their p50 <= p90 <= p99, no call shorter than
    its part after the last arrival, the ratio rows beside DeepSpeed, --trace's split of
    ringcomm's calls adding up to at most the part after the last arrival, and no DeepSpeed
    shared-memory segment left behind."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "probes" / "torch_apart.py"
    shm = lambda: {f for f in os.listdir("/dev/shm") if f.startswith("deepspeed_allreduce_buffer")}  # noqa: E731
    before = shm()
    out = tmp_path / "apart.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [SRC] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    r = subprocess.run([sys.executable, str(script), "--sizes", "1K", "--calls", "20", "--warmup", "5",
                        "--omp1", "--trace", "--timeout", "600", "--json", str(out)],
                       capture_output=True, text=True, timeout=840, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    ds = importlib.util.find_spec("deepspeed") is not None
    peers = ["ringcomm", "ringcomm_fn", "ringcomm_op"] + (["deepspeed"] if ds else [])
    assert doc["peers"] == peers and doc["omp_threads"] == 1 and len(doc["cpus"]) == 2
    for name in peers:
        cell = doc["cells"][f"1024/{name}"]
        assert len(cell["call"]) == len(cell["after"]) == 20
        assert all(c >= a > 0 for c, a in zip(cell["call"], cell["after"])), cell
        q = doc["summary"]["1024"][name]
        for k in ("call", "after"):
            assert len(q[k]) == 3 and 0 < q[k][0] <= q[k][1] <= q[k][2], (name, k, q)
    for name in ("ringcomm", "ringcomm_fn"):
        cell = doc["cells"][f"1024/{name}"]
        for i in range(20):
            parts = [cell[k][i] for k in ("torch_in", "core", "torch_out")]
            assert all(v > 0 for v in parts) and sum(parts) <= cell["call"][i] + 1e-3, (name, i, parts)
    # dist.all_reduce split at the backend's own allreduce(): its stamps lie between the Python
    # call and the core's entry, and between the core's exit and the return to Python
    cell = doc["cells"]["1024/ringcomm"]
    for i in range(20):
        way = [cell[k][i] for k in ("torch_way_in", "ours_in", "ours_out", "torch_way_out")]
        assert all(v > 0 for v in way), (i, way)
        assert abs(way[0] + way[1] - cell["torch_in"][i]) < 1e-3, (i, way, cell["torch_in"][i])
        assert abs(way[2] + way[3] - cell["torch_out"][i]) < 1e-3, (i, way, cell["torch_out"][i])
    assert "torch's way in" in r.stdout and "front_p50" in doc["summary"]["1024"]["ringcomm"]
    assert "| 1 KiB |" in r.stdout and "torch_in" in r.stdout
    if ds:
        assert len(doc["summary"]["1024"]["ratio"]["call"]) == 3
        assert len(doc["summary"]["1024"]["ratio_ringcomm_op"]["after"]) == 3
        assert len(doc["summary"]["1024"]["ratio_ringcomm_fn"]["after"]) == 3
        assert "ratio = peer / deepspeed" in r.stdout
    for name in peers:
        assert f"| 1 KiB | {name} |" in r.stdout
    assert shm() <= before, shm() - before


@pytest.mark.skipif(not HAVE_TORCH, reason="the probe runs torch ranks")
@pytest.mark.timeout(900)
def test_torch_apart_probe_runs_every_peer_on_the_dtype_asked(tmp_path):
    """torch_apart.py --dtype bfloat16: every peer (DeepSpeed's op where it is installed) runs on
    bfloat16 buffers (the ranks report the dtype they ran, every result checked), the header and
    the JSON say so, and a size that is no whole number of the dtype's elements is refused."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "probes" / "torch_apart.py"
    out = tmp_path / "apart.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [SRC] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    ds = importlib.util.find_spec("deepspeed") is not None
    peers = ["ringcomm", "ringcomm_fn"] + (["deepspeed"] if ds else [])
    r = subprocess.run([sys.executable, str(script), "--sizes", "6,1K", "--calls", "5", "--warmup", "2",
                        "--omp1", "--dtype", "bfloat16", "--peers", ",".join(peers), "--timeout", "600",
                        "--json", str(out)], capture_output=True, text=True, timeout=840, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["dtype"] == "bfloat16" and doc["sizes"] == [6, 1024] and doc["peers"] == peers
    assert doc["order"] == "shuffle" and "peers' order shuffle (seed 0)" in r.stdout
    assert "\nall_reduce bfloat16 SUM in place" in "\n" + r.stdout, r.stdout[:2000]
    assert "| 6 B |" in r.stdout
    for name in peers:
        assert len(doc["cells"][f"6/{name}"]["call"]) == 5
    bad = subprocess.run([sys.executable, str(script), "--sizes", "6", "--calls", "1"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "whole number of float32 elements" in bad.stderr, bad.stderr


def test_apart_summary_takes_the_median_over_runs(tmp_path):
    # Three hand-made runs: the summary's figures are the medians over them, per quantile.
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "probes" / "apart_summary.py"
    files = []
    for k, (mine, theirs) in enumerate([(10.0, 20.0), (30.0, 15.0), (20.0, 40.0)]):
        q = lambda v: {"call": [v, 2 * v, 3 * v], "after": [v / 2, v, 1.5 * v]}  # noqa: E731
        summary = {"1024": {"ringcomm_fn": q(mine), "deepspeed": q(theirs),
                            "ratio_ringcomm_fn": {"call": [mine / theirs] * 3, "after": [mine / theirs] * 3}}}
        f = tmp_path / f"run_{k}.json"
        f.write_text(json.dumps({"peers": ["ringcomm_fn", "deepspeed"], "summary": summary}))
        files.append(str(f))
    r = subprocess.run([sys.executable, str(script), *files], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    row = [line for line in r.stdout.splitlines() if line.startswith("| 1024 | ringcomm_fn |")][0]
    # medians: mine 20 (call 20/40/60, after 10/20/30), ratio median of 0.5, 2, 0.5 = 0.5
    assert row == "| 1024 | ringcomm_fn | 20.0 / 40.0 / 60.0 | 10.0 / 20.0 / 30.0 | 0.50 / 0.50 / 0.50 | 0.50 / 0.50 / 0.50 | 1 of 3 |", row
    assert "| 1024 | deepspeed | 20.0 / 40.0 / 60.0 |" in r.stdout
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"peers": ["deepspeed"], "summary": {"1024": {}}}))
    r = subprocess.run([sys.executable, str(script), files[0], str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "differ" in r.stderr


def test_ab_compare_paired_judges_the_pairs_ratios(tmp_path):
    # A machine in a slow state for some runs: the side medians (10 against 21) say 2.1x, the
    # pairs (1.05, 2.1, 1.05) say 1.05x; --paired judges the second, the default the first.
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "ab" / "ab_compare.py"

    def runs(side, values):
        out = []
        for k, v in enumerate(values):
            f = tmp_path / f"{side}{k}.json"
            f.write_text(json.dumps({"medians_us": {"all_reduce": {"1024": v}}}))
            out.append(str(f))
        return out

    old, new = runs("old", [10.0, 10.0, 20.0]), runs("new", [10.5, 21.0, 21.0])
    plain = subprocess.run([sys.executable, str(script), *old, "--", *new], capture_output=True, text=True, timeout=60)
    assert plain.returncode == 1 and "| all_reduce | 1 KiB | 10.0 | 21.0 | 2.100 | <= 1.10: OVER |" in plain.stdout, plain.stdout
    paired = subprocess.run([sys.executable, str(script), "--paired", *old, "--", *new],
                            capture_output=True, text=True, timeout=60)
    assert paired.returncode == 0, paired.stdout
    assert "| all_reduce | 1 KiB | 10.0 | 21.0 | 2.100 | 1.050 | <= 1.10: ok |" in paired.stdout, paired.stdout
    uneven = subprocess.run([sys.executable, str(script), "--paired", *old, "--", *new[:2]],
                            capture_output=True, text=True, timeout=60)
    assert uneven.returncode == 2 and "as many" in uneven.stdout


def test_ab_compare_near_keeps_the_pairs_run_near(tmp_path):
    # Pair 2's new run began far (420 ns) and is slow; pair 3's old run has no probe reading (an
    # older build): --near 150 judges pair 1 alone, and says how many pairs it kept.
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "ab" / "ab_compare.py"

    def run(name, us, probe):
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({"probe_ns": probe, "medians_us": {"all_reduce": {"65536": us}}}))
        return str(f)

    old = [run("o1", 10.0, [90, 88]), run("o2", 10.0, [91, 89]), run("o3", 10.0, [None, 90])]
    new = [run("n1", 10.2, [87, 92]), run("n2", 30.0, [420, 95]), run("n3", 10.1, [90, 90])]

    def compare(*flags):
        return subprocess.run([sys.executable, str(script), "--paired", *flags, *old, "--", *new],
                              capture_output=True, text=True, timeout=60)
    assert compare().returncode == 0                      # the pairs' median (1.02) hides pair 2
    near = compare("--near", "150")
    assert near.returncode == 0 and "probe <= 150 ns): 1 of 3" in near.stdout, near.stdout
    assert "| all_reduce | 64 KiB | 10.0 | 10.2 | 1.020 | 1.020 | <= 1.10: ok |" in near.stdout, near.stdout
    none = compare("--near", "50")
    assert none.returncode == 2 and "0 of 3" in none.stdout
    unpaired = subprocess.run([sys.executable, str(script), "--near", "150", *old, "--", *new],
                              capture_output=True, text=True, timeout=60)
    assert unpaired.returncode == 2 and "needs --paired" in unpaired.stdout
