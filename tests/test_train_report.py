"""``python -m ringcomm.apps.train --report DIR --quick``: every section, figure and JSON field exists
and is consistent; plus the report's pure models against hand-computed values.

Tolerances of the end-to-end check (tiny model, Ψ = 30,080):
* model-state memory, measured / formula: parameters and gradients within 0.5% (ZeRO's padding:
  < N elements per flat group, a few dozen groups at most), optimizer states within 1% (AdamW's
  4-byte ``step`` counter per parameter tensor: ~40 tensors x 4 B against >= 6Ψ/N B);
* communication volume: ZeRO-1/2 / DDP in [1, 1.005], ZeRO-3 / DDP in [1.5, 1.51] (padding);
* timings are only checked for being positive and finite (the machine is shared);
* overlap fraction in [0, 1], and at least one bucket issued before backward ended (the first
  bucket, the head's gradients, is complete long before the embeddings').
"""
from __future__ import annotations

import json
import math

import pytest

from ringcomm.apps.train import report_model as rm
from helpers_cli import run_module
from ranks import require_backend


def test_memory_formulas_match_the_seeds():
    from ringcomm.training.memory import zero_memory_per_device
    psi, n = 1_000_000, 4
    for strategy, stage in (("ddp", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3)):
        f = rm.memory_formula(strategy, "bf16", psi, n)
        assert f["total"] == pytest.approx(zero_memory_per_device(psi, n, stage))
    z1 = rm.memory_formula("zero1", "bf16", psi, n)
    assert (z1["params"], z1["grads"], z1["optimizer_states"]) == (2 * psi, 2 * psi, 3 * psi)
    z2 = rm.memory_formula("zero2", "fp32", psi, n)
    assert (z2["params"], z2["grads"], z2["optimizer_states"]) == (4 * psi, psi, 3 * psi)
    assert rm.memory_formula("zero3", "fp32", psi, n)["total"] == 4 * psi


def test_timeline_model_by_hand():
    # latency 1 ms, 1 GB/s; buckets of 2 MB (3 ms each) ready at 0, 1 and 10 ms; backward 10 ms.
    buckets = [{"bytes": 2e6, "ready_s": 0.0}, {"bytes": 2e6, "ready_s": 0.001},
               {"bytes": 2e6, "ready_s": 0.010}]
    t = rm.timeline(buckets, 1e-3, 1e9, 0.010)
    # bucket 0: 0-3 ms, bucket 1: 3-6 ms, bucket 2: 10-13 ms -> 3 ms exposed, 9 ms busy
    assert t["comm_end_s"] == pytest.approx(0.013)
    assert t["exposed_s"] == pytest.approx(0.003)
    assert t["comm_s"] == pytest.approx(0.009)
    one = rm.timeline([{"bytes": 6e6, "ready_s": 0.010}], 1e-3, 1e9, 0.010)
    assert one["exposed_s"] == pytest.approx(0.007)   # one big bucket hides nothing


def test_scaling_efficiency_definition():
    base = [{"ranks": 1, "accumulation": 1, "samples_per_step": 4, "step_s": 0.2,
             "exposed_comm_s": 0.0}]
    rows = [{"ranks": 2, "accumulation": 1, "samples_per_step": 8, "step_s": 0.25,
             "exposed_comm_s": 0.02}]
    r = rm.scaling_efficiency(rows, base)[0]
    assert r["efficiency"] == pytest.approx(0.8)     # 32 samples/s vs 2 x 20
    assert r["exposed_fraction"] == pytest.approx(0.08)


def _run(args, timeout):
    return run_module("ringcomm.apps.train", args, timeout)


def _finite_pos(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.train
@pytest.mark.timeout(150)
def test_report_quick_end_to_end(tmp_path):
    require_backend("ringcomm")
    out_dir = tmp_path / "rep"
    rc, out = _run(["--report", str(out_dir), "--quick", "--scaling-ranks", "1,2",
                    "--no-progress"], timeout=120)
    assert rc == 0, out
    assert f"wrote {out_dir / 'report.md'}" in out, out
    doc = json.loads((out_dir / "report.json").read_text())
    page = (out_dir / "report.md").read_text()
    assert doc["backend"] == "ringcomm" and doc["np"] == 2
    n, psi = 2, doc["psi"]

    # every section of the page, and every figure it cites exists and is a PNG
    for title in ("## 1. Memory budget", "## 2. Bucket size", "## 3. Recomputation",
                  "## 4. Communication volume", "## 5. Weak scaling",
                  "## 6. Profiler evidence of overlap"):
        assert title in page
    for png in ("memory.png", "buckets.png", "scaling.png", "overlap.png"):
        assert f"({png})" in page
        assert (out_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # 1. memory: 2 precisions x 4 strategies, measured / formula per component
    mem = doc["memory"]
    assert {(r["precision"], r["strategy"]) for r in mem} == {
        (p, s) for p in ("fp32", "bf16") for s in ("ddp", "zero1", "zero2", "zero3")} | {
        ("bf16", "zero2+offload")}
    for r in mem:
        assert r["psi"] == psi
        f = rm.memory_formula(r["strategy"], r["precision"], psi, n)
        assert r["formula"]["total"] == pytest.approx(f["total"])
        for k, tol in (("params", 0.005), ("grads", 0.005), ("optimizer_states", 0.01)):
            assert r["ratio"][k] == pytest.approx(r[k] / f[k])
            assert 1.0 <= r["ratio"][k] <= 1.0 + tol, (r["strategy"], r["precision"], k, r)
        assert r["total"] == r["params"] + r["grads"] + r["optimizer_states"]
        assert r["activations"] > 0 and r["formula_activations"] > 0
        assert r["activations_peak"] >= r["activations"]
    by = {(r["precision"], r["strategy"]): r for r in mem}
    off, plain = by[("bf16", "zero2+offload")], by[("bf16", "zero2")]
    assert off["offloaded"] == off["optimizer_states"] > 0 and plain["offloaded"] == 0
    assert 1.0 <= off["ratio"]["offloaded"] <= 1.01
    assert off["total"] == plain["total"]         # offload moves bytes, it does not add any
    # ZeRO-3 saves the same activations as DDP (its gathered weights are not activations)
    assert by[("fp32", "zero3")]["activations"] == by[("fp32", "ddp")]["activations"]

    # 2. bucket sweep: six caps, the measured figures and the model's prediction per cap
    b = doc["buckets"]
    rows = b["rows"]
    assert [r["cap_bytes"] for r in rows] == [16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20,
                                              16 << 20]
    assert _finite_pos(b["latency_s"]) and _finite_pos(b["bandwidth_Bps"])
    for r in rows:
        for k in ("step_s", "comm_standalone_s", "model_step_overlapped_s",
                  "model_step_serialised_s", "model_comm_s"):
            assert _finite_pos(r[k]), (k, r)
        # equal when every all-reduce ends after backward: allow the last bit of rounding
        assert r["model_step_serialised_s"] >= r["model_step_overlapped_s"] * (1 - 1e-12)
        assert r["nbuckets"] == len(r["bucket_bytes"]) and sum(r["bucket_bytes"]) == 4 * psi
        assert r["model_comm_s"] == pytest.approx(
            r["nbuckets"] * b["latency_s"] + 4 * psi / b["bandwidth_Bps"])
    assert [r["nbuckets"] for r in rows] == sorted([r["nbuckets"] for r in rows], reverse=True)
    assert b["best_cap_mb"] in [r["cap_mb"] for r in rows]
    assert "**Winner:" in page

    # 3. recomputation
    rc_ = doc["recompute"]
    assert rc_["saved_bytes"] > 0 and rc_["formula_saved_bytes"] > 0
    assert rc_["on"]["activations"] < rc_["off"]["activations"]
    assert rc_["ratio_extra_to_forward"] == pytest.approx(rc_["extra_s"] / rc_["estimate_s"])
    assert rc_["ratio_saved_to_formula"] == pytest.approx(
        rc_["saved_bytes"] / rc_["formula_saved_bytes"])

    # 4. communication volume (the ringcomm backend's issue hook counted it)
    v = doc["volume"]
    for name in ("ddp", "zero1", "zero2", "zero3"):
        assert v[name]["source"] == "issue_hook" and v[name]["hook_equals_dist"], v[name]
    assert v["ddp"]["wire_total"] == pytest.approx(2 * (n - 1) / n * 4 * psi)
    for name in ("zero1", "zero2"):
        assert 1.0 <= v[name]["ratio_to_ddp"] <= 1.005
    assert 1.5 <= v["zero3"]["ratio_to_ddp"] <= 1.51

    # 5. scaling: baseline rows + 2-rank rows, accumulation as a column, efficiency defined
    sc = doc["scaling"]
    assert {(r["ranks"], r["strategy"], r["accumulation"]) for r in sc} == {
        (1, "single", 1), (1, "single", 2), (2, "ddp", 1), (2, "ddp", 2), (2, "zero2", 1),
        (2, "zero2", 2)}
    base = {r["accumulation"]: r for r in sc if r["ranks"] == 1}
    for r in sc:
        thr1 = base[r["accumulation"]]["samples_per_step"] / base[r["accumulation"]]["step_s"]
        assert r["efficiency"] == pytest.approx(r["samples_per_step"] / r["step_s"]
                                                / (r["ranks"] * thr1))
        assert r["samples_per_step"] == r["ranks"] * r["accumulation"] * 2
        if r["ranks"] > 1:
            assert r["exposed_comm_s"] > 0
    # each rank pinned to its own core (while there are enough)
    assert len(set(doc["cores_per_rank"]["2"])) == min(2, doc["host"]["usable_cores"])

    # 6. profiler: a Chrome trace with the issue annotations and the added intervals
    p = doc["profile"]
    assert 0.0 <= p["overlap_fraction"] <= 1.0
    assert p["buckets"] >= 2 and 1 <= p["issued_before_backward_end"] <= p["buckets"]
    trace = json.loads((out_dir / p["trace"]).read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = [e.get("name", "") for e in events]
    assert sum(nm.startswith("all_reduce issue bucket ") for nm in names) == p["buckets"]
    assert sum(nm.startswith("all_reduce bucket ") for nm in names) == p["buckets"]
    assert "backward compute ends (last gradient accumulated)" in names
    assert f"{100 * p['overlap_fraction']:.0f}% of the all-reduce time" in page
