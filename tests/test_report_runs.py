"""The report tools over several runs of one command: benchmarks/report/peers_table.py --runs (bench
JSONs) and benchmarks/probes/apart_summary.py (torch_apart.py JSONs). Hand-made runs whose median
of the runs' ratios differs from the ratio of the medians, so a table that took the wrong one fails.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python -m ringcomm.bench -np 2 -b 1K -e 4K -f 4 --ops all_reduce --peers mpi,impi,deepspeed"


def _load(rel: str):
    spec = importlib.util.spec_from_file_location(Path(rel).stem + "_under_test", ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _entry(t_us: float | None, wrong: int = 0, na: str = "") -> dict:
    if na:
        return {"na": na}
    return {"time_us": t_us, "wrong": wrong}


def _bench_run(path: Path, json_arg: str, cells: dict, settings: str = "10") -> str:
    """One bench JSON: all_reduce float32 at 1 KiB and 4 KiB; cells[size] = (ringcomm in place, mpi,
    impi, mpi's wrong count). ringcomm out of place is always 1 µs: the table must not take it."""
    rows = []
    for size, (rc, mpi, impi, mpi_wrong) in cells.items():
        rows.append({"size": size, "libs": {
            "ringcomm/out-of-place": _entry(1.0), "ringcomm/in-place": _entry(rc),
            "mpi": _entry(mpi, wrong=mpi_wrong), "impi": _entry(impi),
            "deepspeed": _entry(None, na="deepspeed: not installed")}})
    doc = {"meta": {"command": f"{COMMAND} --json {json_arg}",
                    "peer_settings": {"impi": {"fixed": {}, "used": {"I_MPI_SPIN_COUNT": settings},
                                               "tried": [], "chosen_by": "default"}}},
           "tables": [{"op": "all_reduce", "dtype": "float32", "rows": rows}]}
    path.write_text(json.dumps(doc))
    return str(path)


def _runs(tmp_path) -> list[str]:
    # 1 KiB: ringcomm / best peer per run 10/20 = 0.5, 30/15 = 2.0, 20/25 = 0.8 -> median 0.8, lost 1 of 3;
    # the medians (ringcomm 20, MPICH 20, Intel MPI 40) would say 1.00.
    # 4 KiB: MPICH's check fails in run 2, so that run's ratio does not count: 40/80 = 0.5 and 90/60 = 1.5.
    cells = [{1024: (10.0, 20.0, 40.0, 0), 4096: (40.0, 80.0, 100.0, 0)},
             {1024: (30.0, 15.0, 40.0, 0), 4096: (50.0, 70.0, 90.0, 1)},
             {1024: (20.0, 40.0, 25.0, 0), 4096: (90.0, 75.0, 60.0, 0)}]
    return [_bench_run(tmp_path / f"run{k}.json", f"out/run{k}.json", c, settings="10" if k < 2 else "100")
            for k, c in enumerate(cells)]


def _row(out: str, size: str) -> list[str]:
    line = [ln for ln in out.splitlines() if ln.startswith(f"| {size} |")]
    assert len(line) == 1, out
    return [c.strip() for c in line[0].strip("|").split("|")]


def test_peers_table_runs_take_the_median_of_the_runs_ratios(tmp_path, capsys):
    pytest.importorskip("ringcomm.bench.spec")
    pt = _load("benchmarks/report/peers_table.py")
    assert pt.main(["--runs", *_runs(tmp_path)]) == 0
    out = capsys.readouterr().out
    header = [ln for ln in out.splitlines() if ln.startswith("| size |")][0]
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "size", "ringcomm", "MPICH", "Intel MPI", "DeepSpeed", "ringcomm / best peer, median of the runs'",
        "runs ringcomm lost"]
    # Each library's median over the runs, the lowest in bold (a tie: both).
    assert _row(out, "1 KiB") == ["1 KiB", "**20.0**", "**20.0**", "40.0", "n/a", "0.80", "1 of 3"]
    # A failed check in any run makes the cell FAIL; the ratio counts the two runs where every peer ran.
    assert _row(out, "4 KiB") == ["4 KiB", "**50.0**", "FAIL", "90.0", "n/a", "1.00 (2 of 3)", "1 of 2"]
    assert "3 runs of: python -m ringcomm.bench" in out and "--json" not in out.split("-->")[0]
    # Settings that differ between runs are each listed with their runs.
    assert "- Intel MPI: I_MPI_SPIN_COUNT=10 (default) [runs 1,2]" in out
    assert "- Intel MPI: I_MPI_SPIN_COUNT=100 (default) [run 3]" in out


def test_peers_table_runs_refuse_another_command(tmp_path, capsys):
    pytest.importorskip("ringcomm.bench.spec")
    pt = _load("benchmarks/report/peers_table.py")
    files = _runs(tmp_path)
    other = json.loads(Path(files[2]).read_text())
    other["meta"]["command"] = other["meta"]["command"].replace("-e 4K", "-e 16K")
    Path(files[2]).write_text(json.dumps(other))
    with pytest.raises(SystemExit) as e:
        pt.main(["--runs", *files])
    assert e.value.code == 2 and "run of another command" in capsys.readouterr().err
    # Without --runs, each file is its own table (one run's ratio), whatever its command.
    assert pt.main(files) == 0
    out = capsys.readouterr().out
    assert out.count("| 1 KiB |") == 3 and "| 1 KiB | **10.0** | 20.0 | 40.0 | n/a | 0.50 |" in out


def _apart_run(path: Path, mine: float, theirs: float, **meta) -> str:
    q = lambda v: {"call": [v, 2 * v, 3 * v], "after": [v / 2, v, 1.5 * v]}  # noqa: E731
    summary = {"1024": {"ringcomm": q(mine), "deepspeed": q(theirs),
                        "ratio": {"call": [mine / theirs] * 3, "after": [mine / theirs] * 3}}}
    doc = {"world_size": 2, "load": 0, "sizes": [1024], "peers": ["ringcomm", "deepspeed"], "calls": 200,
           "warmup": 20, "omp_threads": 1, "cpus": [[0, 1], [0, 1]], "env": "", "summary": summary, **meta}
    path.write_text(json.dumps(doc))
    return str(path)


def test_apart_summary_counts_lost_runs_and_refuses_another_command(tmp_path):
    script = ROOT / "benchmarks" / "probes" / "apart_summary.py"
    files = [_apart_run(tmp_path / f"a{k}.json", mine, theirs, argv=["--calls", "200", "--json", f"a{k}.json"])
             for k, (mine, theirs) in enumerate([(10.0, 20.0), (30.0, 15.0), (20.0, 40.0)])]
    r = subprocess.run([sys.executable, str(script), *files], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # ratios 0.5, 2, 0.5: median 0.5, and ringcomm was slower in one run of three
    assert _row(r.stdout, "1024 | ringcomm")[-1] == "1 of 3", r.stdout
    assert _row(r.stdout, "1024 | ringcomm")[4] == "0.50 / 0.50 / 0.50"
    for name, meta in (("pinned", {"cpus": [[0], [1]]}), ("more_calls", {"calls": 400}),
                       ("other_args", {"argv": ["--calls", "200", "--pin", "--json", "x.json"]})):
        other = _apart_run(tmp_path / f"{name}.json", 10.0, 20.0,
                           **{"argv": ["--calls", "200", "--json", "b.json"], **meta})
        r = subprocess.run([sys.executable, str(script), files[0], other], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "run of another command" in r.stderr, (name, r.stderr)
        assert next(iter(meta)) in r.stderr.splitlines()[-1], (name, r.stderr)


def test_peers_table_near_keeps_each_librarys_near_rounds(tmp_path, capsys):
    # Three rounds: ringcomm's launches near in rounds 2 and 3, Intel MPI's only in round 1, MPICH
    # never. --near 150 takes ringcomm's median of rounds 2-3 (20, 30 -> 25), Intel MPI's round 1
    # (50), and MPICH as n/a; without it, the medians over all three (20 and 60; MPICH 5).
    pytest.importorskip("ringcomm.bench.spec")
    pt = _load("benchmarks/report/peers_table.py")

    def entry(rounds_us):
        return {"time_us": sorted(rounds_us)[1], "wrong": 0, "round_time_s": [t * 1e-6 for t in rounds_us]}

    def launch(rnd, libs, before, after):
        return {"round": rnd, "libs": libs, "ran": True, "probe_before": {"round_trip_ns": before},
                "probe_after": {"round_trip_ns": after}}
    doc = {"meta": {"command": f"{COMMAND} --rounds 3 --json x.json", "peer_settings": {},
                    "launches": [launch(1, "ringcomm+deepspeed", 400, 90), launch(1, "mpi", 90, 420),
                                 launch(1, "impi", 88, 91), launch(2, "impi", 410, 400),
                                 launch(2, "mpi", 400, 90), launch(2, "ringcomm+deepspeed", 90, 85),
                                 launch(3, "ringcomm+deepspeed", 84, 86), launch(3, "mpi", 86, 410),
                                 launch(3, "impi", 410, 88)]},
            "tables": [{"op": "all_reduce", "dtype": "float32", "rows": [{"size": 1024, "libs": {
                "ringcomm/in-place": entry([5.0, 20.0, 30.0]), "mpi": entry([5.0, 5.0, 5.0]),
                "impi": entry([50.0, 60.0, 70.0])}}]}]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    assert pt.main(["--runs", "--near", "150", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ringcomm 2 of 3" in out and "impi 1 of 3" in out and "mpi 0 of 3" in out, out
    assert _row(out, "1 KiB")[1:4] == ["**25.0**", "n/a", "50.0"], out
    assert _row(out, "1 KiB")[4:] == ["0.50", "0 of 1"], out
    assert pt.main(["--runs", str(path)]) == 0
    assert _row(capsys.readouterr().out, "1 KiB")[1:4] == ["20.0", "**5.0**", "60.0"]
    plain = tmp_path / "plain.json"
    doc["meta"].pop("launches")
    plain.write_text(json.dumps(doc))
    with pytest.raises(SystemExit):
        pt.main(["--near", "150", str(plain)])
