"""The comparison's output: formulas beside each row, the stdout table and the PNG."""
from __future__ import annotations

from .strategies import TOLERANCE
from .units import format_bytes

def _formulas(row: dict, o: dict, world_size: int) -> dict:
    try:
        from ...training import memory
    except Exception:  # noqa: BLE001
        return {}
    n = 1 if row["strategy"] == "single" else world_size
    stage = {"zero1": 1, "zero2": 2, "zero3": 3}.get(row["strategy"], 0)
    out = {}
    try:
        out["model_states"] = memory.zero_memory_per_device(row["psi"], n, stage)
        out["split_stage0"] = memory.training_memory_bytes(row["psi"])
        out["activations"] = memory.activation_memory_bytes(
            o["seq_len"], row["local_batch"], o["d_model"], o["layers"], o["heads"],
            bytes_per_element=4 if row["precision"] == "fp32" else 2,
            recompute="full" if row["recompute"] else "none")
    except Exception as e:  # noqa: BLE001 - report, do not fail the run
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def _table(rows: list, world_size: int) -> str:
    head = ["config", "ranks", "steps/s", "eff", "comm%", "params", "grads", "optim",
            "act fwd", "act peak", "total", "formula states", "formula act", "loss dev", "ok"]
    lines = []
    for r in rows:
        f = r.get("formula", {})
        m = r["mem"]
        total = m["params"] + m["grads"] + m["optimizer_states"] + m["activations"]
        comm = r.get("comm_fraction")
        lines.append([
            r["name"], str(r["ranks"]), f"{r['steps_per_s']:.2f}",
            "-" if r.get("efficiency") is None else f"{100 * r['efficiency']:.0f}%",
            "-" if comm is None or r["strategy"] == "single" else
            f"{100 * comm:.0f}%{'*' if r['strategy'] == 'torch_ddp' else ''}",
            format_bytes(m["params"]), format_bytes(m["grads"]), format_bytes(m["optimizer_states"]),
            format_bytes(m["activations_fwd"]), format_bytes(m["activations"]), format_bytes(total),
            format_bytes(f.get("model_states")), format_bytes(f.get("activations")),
            f"{r['loss_dev']:.1e}", "yes" if r["loss_ok"] else "NO"])
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w)   # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    out = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(l) for l in lines]
    return "\n".join(out)


def _plot(rows: list, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(20, 5.8),
                                        gridspec_kw={"width_ratios": [1, 1, 1.4]})
    base = {r["precision"]: r for r in rows if r["strategy"] == "single" and not r["recompute"]}
    for r in rows:
        style = "-" if r["precision"] == "fp32" else "--"
        lw = 2.5 if r["strategy"] == "single" else 1.0
        steps = range(1, len(r["losses"]) + 1)
        ax1.plot(steps, r["losses"], style, lw=lw, label=r["name"], alpha=0.85)
        ref = base.get(r["precision"])
        if ref is not None and r is not ref:
            dev = [max(abs(a - b) / max(abs(b), 1e-12), 1e-12)
                   for a, b in zip(r["losses"], ref["losses"])]
            ax3.semilogy(steps, dev, style, lw=1.0, label=r["name"], alpha=0.85)
    ax1.set_xlabel("step")
    ax1.set_ylabel("training loss (global batch)")
    ax1.set_title("loss curves")
    ax1.legend(fontsize=6, ncol=2)
    for prec, tol in TOLERANCE.items():
        ax3.axhline(tol, color="k", lw=0.8, ls="-" if prec == "fp32" else "--")
    ax3.set_xlabel("step")
    ax3.set_ylabel("|loss - single| / single  (floor 1e-12)")
    ax3.set_title("deviation from the single process (lines: tolerances)")
    names = [r["name"] for r in rows]
    cats = [("params", "parameters"), ("grads", "gradients"),
            ("optimizer_states", "optimizer states"), ("activations", "activations (peak)")]
    bottom = [0.0] * len(rows)
    for key, label in cats:
        vals = [r["mem"][key] / 1024 for r in rows]
        ax2.bar(range(len(rows)), vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    fx, fy = [], []
    for i, r in enumerate(rows):
        f = r.get("formula", {})
        if "model_states" in f and "activations" in f:
            fx.append(i)
            fy.append((f["model_states"] + f["activations"]) / 1024)
    if fx:
        ax2.scatter(fx, fy, marker="_", s=400, color="k", zorder=3,
                    label="formula: zero_memory_per_device + activation_memory_bytes")
    ax2.set_xticks(range(len(rows)))
    ax2.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax2.set_ylabel("KiB per rank")
    ax2.set_title("measured memory per rank vs ringcomm.training.memory formulas")
    ax2.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
