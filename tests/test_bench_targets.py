"""scripts/check_targets.py: our targets, judged on the bench's JSON (the bench prints none).
Each target takes the worst size of its range; MET / NOT MET / not measured and the exit status
follow from it. Made-up JSON documents, in process (milliseconds)."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_targets.py"
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
