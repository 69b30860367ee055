"""benchmarks/report/check_targets.py: our targets, judged on the bench's JSON (the bench prints none).
Each target takes the worst size of its range; MET / NOT MET / not measured and the exit status
follow from it. Made-up JSON documents, in process (milliseconds)."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "report" / "check_targets.py"
_spec = importlib.util.spec_from_file_location("check_targets", SCRIPT)
ct = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("check_targets", ct)        # dataclasses look their module up by name
_spec.loader.exec_module(ct)

KiB, MiB = 1 << 10, 1 << 20


def _cell(us, busbw=1.0, wrong=0):
    return {"time_us": us, "busbw": busbw, "wrong": wrong, "iters": 20}


def _doc(world, rows_by_op):
    """rows_by_op: {op: [(size, {lib/mode: cell}, {peer: speedup})]}."""
    tables = []
    for op, rows in rows_by_op.items():
        tables.append({"op": op, "dtype": "float32", "redop": "sum" if op != "all_gather" else "-",
                       "rows": [{"size": s, "libs": libs, "speedup": sp} for s, libs, sp in rows]})
    return {"meta": {"world_size": world}, "tables": tables}


def test_judge_takes_the_worst_size_in_range():
    pairs = [(KiB, 50.0), (4 * KiB, 10.0), (MiB, 2.0)]
    j = ct.judge(pairs, ct.Target("faster", None, 64 * KiB, 20.0))
    assert j["worst_size"] == 4 * KiB and j["value"] == 10.0 and j["met"] is False
    j = ct.judge(pairs, ct.Target("faster", None, 64 * KiB, 5.0))
    assert j["met"] is True
    j = ct.judge([(KiB, 0.5), (2 * KiB, 0.8)], ct.Target("latency", None, 4 * KiB, 1.5))
    assert j["worst_size"] == KiB and j["value"] == 2.0 and j["met"] is False   # 2x MPI's time
    assert ct.judge(pairs, ct.Target("busbw", 64 * MiB, None, 1.0))["met"] is None


def test_check_run_two_ranks():
    rc = lambda us, bw=1.0: {"ringcomm/out-of-place": _cell(us, bw)}  # noqa: E731
    doc = _doc(2, {
        "all_reduce": [(KiB, rc(2.0), {"gloo": 100.0, "mpi": 1.2}),
                       (MiB, rc(200.0, 10.0), {"gloo": 5.0, "mpi": 0.9}),
                       (16 * MiB, rc(3000.0, 10.0), {"gloo": 4.5, "mpi": 1.6})],
        "reduce_scatter": [(MiB, rc(150.0, 9.0), {}), (16 * MiB, rc(2000.0, 7.0), {})],
        "all_gather": [(MiB, rc(150.0, 8.5), {})]})
    res = ct.check_run(doc)
    texts = [r["text"] for r in res]
    assert [r["met"] for r in res] == [True, True, True, False, True, False, True]
    assert texts[0].startswith("all_reduce float32 sum vs gloo: 100.00x faster at <= 64 KiB")
    assert "worst at 1 MiB" in texts[3] and texts[3].endswith("NOT MET")      # mpi busbw >= 64 KiB
    assert texts[5].startswith("reduce_scatter busbw / all_reduce busbw") and "0.70x" in texts[5]
    assert ct.status(res) == 1
    assert ct.status([r for r in res if r["met"]]) == 0
    assert ct.status([{"text": "x", "met": None}]) == 2


def test_check_run_wrong_cells_do_not_count():
    doc = _doc(4, {"all_reduce": [(MiB, {"ringcomm/out-of-place": _cell(10.0, 5.0)}, {"gloo": 6.0})],
                   "reduce_scatter": [(MiB, {"ringcomm/out-of-place": _cell(10.0, 5.0, wrong=1)}, {})]})
    res = ct.check_run(doc)
    assert [r["met"] for r in res] == [True, None]      # the wrong reduce_scatter cell: unmeasured


def test_cli_on_files_and_runs(tmp_path, capsys):
    doc = _doc(4, {"all_reduce": [(MiB, {"ringcomm/out-of-place": _cell(10.0)}, {"gloo": 3.0})]})
    (tmp_path / "run.json").write_text(json.dumps(doc))
    assert ct.main([str(tmp_path / "run.json")]) == 1
    assert "3.00x busbw at >= 1 MiB (worst at 1 MiB; target >= 4x): NOT MET" in capsys.readouterr().out
    runs = tmp_path / "runs"
    runs.mkdir()
    ip = lambda us: {"time_us": us, "wrong": 0}  # noqa: E731
    for name, rc_us, gloo_us in (("np4_b2b", 10.0, 100.0), ("np4_apart", 30.0, 100.0)):
        d = {"meta": {"world_size": 4}, "tables": [{"op": "all_reduce", "dtype": "float32",
             "redop": "sum", "rows": [{"size": KiB, "speedup": {},
                                       "libs": {"ringcomm/in-place": ip(rc_us),
                                                "gloo/in-place": ip(gloo_us)}}]}]}
        (runs / f"{name}.json").write_text(json.dumps(d))
    res = ct.check_runs(str(runs))
    gloo = [r for r in res if "4x gloo" in r["text"]]
    assert [r["met"] for r in gloo] == [True, False]          # b2b 0.1x, apart 0.3x (> 1/4)
    with pytest.raises(SystemExit):
        ct.main([])


def test_tables_and_targets_read_the_same_runs(tmp_path, capsys):
    """benchmarks/report/bench_readme_tables.py prints the runs through check_targets.load_runs: every timed
    in-place all_reduce cell, a wrong one too; the targets leave the wrong one out."""
    ip = lambda us, wrong=0: {"time_us": us, "wrong": wrong}  # noqa: E731
    doc = {"meta": {"world_size": 2}, "tables": [
        {"op": "all_reduce", "dtype": "float32", "redop": "sum", "rows": [
            {"size": KiB, "speedup": {}, "libs": {"ringcomm/in-place": ip(2.5), "mpi/in-place": ip(3.0),
                                                  "ringcomm/out-of-place": ip(9.0)}},
            {"size": 4 * MiB, "speedup": {}, "libs": {"ringcomm/in-place": ip(1234.4, wrong=2),
                                                      "gloo/in-place": ip(5000.0)}}]},
        {"op": "broadcast", "dtype": "float32", "redop": "-", "rows": [
            {"size": KiB, "speedup": {}, "libs": {"ringcomm/in-place": ip(7.0)}}]}]}
    (tmp_path / "np2_b2b.json").write_text(json.dumps(doc))
    (tmp_path / "other.json").write_text(json.dumps(doc))            # not one of RUNS: ignored
    cells = ct.load_runs(str(tmp_path))
    assert {k: c["time_us"] for k, c in cells.items()} == {
        ("np2_b2b", "float32", KiB, "ringcomm"): 2.5, ("np2_b2b", "float32", KiB, "mpi"): 3.0,
        ("np2_b2b", "float32", 4 * MiB, "gloo"): 5000.0}
    assert ("np2_b2b", "float32", 4 * MiB, "ringcomm") in ct.load_runs(str(tmp_path), keep_wrong=True)

    path = SCRIPT.with_name("bench_readme_tables.py")
    spec = importlib.util.spec_from_file_location("bench_readme_tables", path)
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    capsys.readouterr()
    tables.main(str(tmp_path))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "**all_reduce float32, time in µs: ringcomm (MPICH / DeepSpeed / gloo), all in place**"
    assert "| size | np2 b2b |" in out
    assert "| 1 KiB | 2.5 (3.0 / n/a / n/a) |" in out
    assert "| 4 MiB | 1234 (n/a / n/a / 5000) |" in out
