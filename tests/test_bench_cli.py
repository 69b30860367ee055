"""Smoke test of ``python -m ringcomm.bench``: tiny sizes, 2 ranks, every collective; the tables,
the JSON and the PNG come out, the correctness check runs, and the check can fail (a wrong
element injected through the CLI's test hook turns into FAIL cells and exit status 1).
Plus fast in-process tests of the pattern/check arithmetic. About 15 s in all."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ringcomm
from ringcomm.bench import harness
from ringcomm.bench.harness import (DTYPES, count_wrong, fill_pattern, host_dtype, parse_size,
                                    rank_values, reduced_values, size_sweep)
from ringcomm.bench.report import Table, Target, _judge

SRC = os.path.dirname(os.path.dirname(os.path.abspath(ringcomm.__file__)))
HAVE_TORCH = importlib.util.find_spec("torch") is not None
OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all"]


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
    assert harness.element_count("all_gather", 8, DTYPES["float32"], 4) == 0
    assert harness.bus_factor("all_reduce", 4) == 1.5


def test_verdict_uses_worst_size_in_range():
    rec = lambda lib, t: {"lib": lib, "time_s": t, "wrong": 0}  # noqa: E731
    cells = {("ringcomm", "ip", 1024): rec("ringcomm", 1e-5), ("gloo", "ip", 1024): rec("gloo", 5e-4),
             ("ringcomm", "ip", 4096): rec("ringcomm", 2e-5), ("gloo", "ip", 4096): rec("gloo", 2e-4)}
    t = Table("all_reduce", "float32", "sum", [1024, 4096], cells, {1024: 256, 4096: 1024})
    j = _judge(t, "gloo", Target("faster", None, 64 << 10, 20.0))
    assert j["worst_size"] == 4096 and abs(j["value"] - 10.0) < 1e-9 and j["met"] is False


# ---------------------------------------------------------------------------------------------
# The CLI end to end.

@pytest.mark.skipif(not HAVE_TORCH, reason="the gloo peer needs torch")
def test_cli_tables_json_plot(tmp_path):
    peers = "gloo,mpi" if importlib.util.find_spec("mpi4py") else "gloo"
    jpath, ppath = tmp_path / "bench.json", tmp_path / "bench.png"
    r = run_bench("-np", "2", "-b", "1K", "-e", "16K", "-f", "4", "-w", "1", "-n", "2",
                  "--peers", peers, "--json", str(jpath), "--plot", str(ppath))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for op in OPS:
        assert f"# {op} float32" in out, out
    assert "ringcomm out-of-place" in out and "ringcomm in-place" in out
    assert "gloo (in-place)" in out and "speedup" in out and "memcpy" in out
    assert "# avg bus bandwidth" in out and "vs gloo:" in out
    assert "# Out of bounds values : 0 OK" in out

    doc = json.loads(jpath.read_text())
    assert doc["wrong"] == 0 and doc["errors"] == 0
    assert [t["op"] for t in doc["tables"]] == OPS
    assert len(doc["memcpy"]) == 3 and all(m["gbps"] > 0 for m in doc["memcpy"])
    libs_seen = set()
    for t in doc["tables"]:
        assert [row["size"] for row in t["rows"]] == [1024, 4096, 16384]
        for row in t["rows"]:
            for name, cell in row["libs"].items():
                libs_seen.add(name.split("/")[0])
                if "na" in cell:
                    continue
                # every measured cell was checked (wrong == 0) and timed >= 1 call
                assert cell["wrong"] == 0 and cell["iters"] >= 1 and cell["time_us"] > 0, (name, cell)
                assert cell["busbw"] >= 0 and len(cell["per_iter_s"]) == cell["iters"]
    assert {"ringcomm", "gloo"} <= libs_seen
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
    assert "FAIL ringcomm" in r.stdout and "Out of bounds values" in r.stdout
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
