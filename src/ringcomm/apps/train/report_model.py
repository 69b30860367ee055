"""The models the report's measurements are set against: per-component memory formulas, the
DDP timeline model of a bucketed all-reduce overlapped with backward, the recomputation estimate
and weak-scaling efficiency. Pure functions of measured inputs (no torch)."""
from __future__ import annotations

from ...training import memory

# Bytes per parameter of each model-state component: (params, grads, optimizer states) as
# (replicated bytes, bytes partitioned N ways). AdamW keeps exp_avg + exp_avg_sq (8 B, fp32); a
# separate fp32 master copy (4 B) exists under ZeRO's mixed precision (bf16 parameters) and in
# ZeroOptimizer's fp32 stages 1/2 (its master shard is a copy beside the flat parameters), not in
# ZeRO-3 fp32 (the shard is the master) nor in DDP (torch.optim steps the parameters).
_COMPONENTS = {
    # (strategy, precision): {component: (replicated B/param, partitioned B/param)}
    ("ddp", "fp32"): {"params": (4, 0), "grads": (4, 0), "optimizer_states": (8, 0)},
    # bf16 under CPU autocast keeps fp32 weights and gradients: the same 4 + 4 + 8 = 16
    ("ddp", "bf16"): {"params": (4, 0), "grads": (4, 0), "optimizer_states": (8, 0)},
    ("zero1", "fp32"): {"params": (4, 0), "grads": (4, 0), "optimizer_states": (0, 12)},
    ("zero2", "fp32"): {"params": (4, 0), "grads": (0, 4), "optimizer_states": (0, 12)},
    ("zero3", "fp32"): {"params": (0, 4), "grads": (0, 4), "optimizer_states": (0, 8)},
    # the seeds' mixed-precision budget: 2 + 2 + 12 (master 4 + momentum 4 + variance 4)
    ("zero1", "bf16"): {"params": (2, 0), "grads": (2, 0), "optimizer_states": (0, 12)},
    ("zero2", "bf16"): {"params": (2, 0), "grads": (0, 2), "optimizer_states": (0, 12)},
    ("zero3", "bf16"): {"params": (0, 2), "grads": (0, 2), "optimizer_states": (0, 12)},
}

#: The formula of each row's total, as the seeds write it (fp32 rows: the same split, 4-byte
#: parameters and gradients).
FORMULA_TEXT = {
    ("ddp", "fp32"): "16Ψ (4+4+8)", ("ddp", "bf16"): "16Ψ (autocast: 4+4+8)",
    ("zero1", "fp32"): "8Ψ + 12Ψ/N", ("zero2", "fp32"): "4Ψ + 16Ψ/N",
    ("zero3", "fp32"): "16Ψ/N",
    ("zero1", "bf16"): "4Ψ + 12Ψ/N", ("zero2", "bf16"): "2Ψ + 14Ψ/N",
    ("zero3", "bf16"): "16Ψ/N",
}

_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}


def memory_formula(strategy: str, precision: str, psi: int, n: int) -> dict:
    """Bytes per rank of each model-state component and their total, by the formulas above.
    The bf16 totals are exactly ``ringcomm.training.memory.zero_memory_per_device(psi, n, stage)``.
    ``"<zero stage>+offload"``: the same, with ``offloaded`` = the optimizer states (fp32 master
    + Adam moments, 12Ψ/N in bf16) that ``offload="cpu"`` keeps in host memory."""
    if strategy.endswith("+offload"):
        out = memory_formula(strategy[:-len("+offload")], precision, psi, n)
        out["offloaded"] = out["optimizer_states"]
        out["text"] += " (optim on the host)"
        return out
    comp = _COMPONENTS[(strategy, precision)]
    out = {k: rep * psi + part * psi / n for k, (rep, part) in comp.items()}
    out["total"] = sum(out.values())
    if precision == "bf16" or strategy in ("ddp", "zero3"):
        seeds = memory.zero_memory_per_device(psi, n, _STAGE[strategy])
        if abs(out["total"] - seeds) > 1e-6 * max(seeds, 1):
            raise AssertionError(f"{strategy}/{precision}: {out['total']} != seeds' {seeds}")
    out["text"] = FORMULA_TEXT[(strategy, precision)]
    return out


def activation_formula(o: dict, precision: str, recompute: bool = False) -> int:
    """Korthikanti et al.'s activation bytes (``ringcomm.training.memory.activation_memory_bytes``) for
    the report's model and per-rank micro-batch."""
    return memory.activation_memory_bytes(
        o["seq_len"], o["batch_per_rank"], o["d_model"], o["layers"], o["heads"],
        bytes_per_element=4 if precision == "fp32" else 2,
        recompute="full" if recompute else "none")


def timeline(buckets: list, latency_s: float, bandwidth_Bps: float, backward_s: float) -> dict:
    """The DDP timeline model: bucket i becomes ready at ``ready_s`` (from the start of
    backward); all-reduces run one at a time on one channel, each taking
    ``latency + bytes / bandwidth``; a bucket starts when it is ready and the previous one is
    done. Returns the end of the last all-reduce, the time exposed after backward's compute
    (``backward_s``), and the communication time if nothing overlapped."""
    end = 0.0
    busy = 0.0
    for b in sorted(buckets, key=lambda b: b["ready_s"]):
        cost = latency_s + b["bytes"] / bandwidth_Bps
        end = max(end, b["ready_s"]) + cost
        busy += cost
    return {"comm_end_s": end, "exposed_s": max(0.0, end - backward_s), "comm_s": busy}


def bucket_predictions(sweep: dict, probe: dict) -> list:
    """Per bucket cap: predicted step = compute-only step + exposed time of the timeline model
    ("overlapped"), and compute-only step + every all-reduce in full ("serialised": what a rank
    whose one core both computes and copies would see)."""
    comp = sweep["compute_only"]
    out = []
    for row in sweep["rows"]:
        t = timeline(row["buckets"], probe["latency_s"], probe["bandwidth_Bps"],
                     comp["bwd_compute"])
        out.append({"cap_mb": row["cap_mb"], "model_comm_s": t["comm_s"],
                    "model_exposed_s": t["exposed_s"],
                    "model_step_overlapped_s": comp["step"] + t["exposed_s"],
                    "model_step_serialised_s": comp["step"] + t["comm_s"]})
    return out


def scaling_efficiency(rows: list, baseline: list) -> list:
    """efficiency = throughput(N) / (N x throughput(1)) with the same per-rank micro-batch and
    accumulation steps; throughput = samples per step / step time."""
    base = {r["accumulation"]: r for r in baseline}
    out = []
    for r in rows:
        b = base.get(r["accumulation"])
        thr = r["samples_per_step"] / r["step_s"]
        row = dict(r, throughput=thr)
        if b is not None:
            thr1 = b["samples_per_step"] / b["step_s"]
            row["efficiency"] = thr / (r["ranks"] * thr1)
            row["baseline_step_s"] = b["step_s"]
            row["exposed_fraction"] = r["exposed_comm_s"] / r["step_s"]
        out.append(row)
    return out
