"""The report's outputs: ``report.md`` (the one page, its sentences computed from the figures),
its PNGs, and the communication intervals added to the profiler's Chrome trace."""
from __future__ import annotations

import json
import os

from .units import format_bytes


def _load(la) -> str:
    return "-" if not la else " ".join(f"{x:.1f}" for x in la)


def _ms(s) -> str:
    return "-" if s is None else f"{1e3 * s:.1f}"


def _x(r) -> str:
    return "-" if r is None else f"{r:.3f}"


def _cap(mb: float) -> str:
    b = mb * 1024 * 1024
    return f"{b / 1024 / 1024:.0f} MiB" if b >= 1024 * 1024 else f"{b / 1024:.0f} KiB"


def _table(head: list, rows: list) -> list:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if i else ":---"
                                                        for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


# ============================================================================ figures
def _plots(out_dir: str, doc: dict) -> list:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        files.append(name)

    # memory: measured stacked bars, formula totals as ticks
    mem = doc["memory"]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    labels = [f"{r['strategy']}\n{r['precision']}" for r in mem]
    bottom = [0.0] * len(mem)
    for key, label in (("params", "parameters"), ("grads", "gradients"),
                       ("optimizer_states", "optimizer states")):
        vals = [r[key] / 1024 / 1024 for r in mem]
        ax.bar(range(len(mem)), vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.scatter(range(len(mem)), [r["formula"]["total"] / 1024 / 1024 for r in mem], marker="_",
               s=500, color="k", zorder=3, label="formula (model states)")
    ax.set_xticks(range(len(mem)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("MiB per rank")
    ax.set_title(f"model-state memory per rank, N={doc['np']}, Ψ={doc['psi']:,}")
    ax.legend(fontsize=8)
    save(fig, "memory.png")

    # bucket sweep
    rows = doc["buckets"]["rows"]
    caps = [r["cap_bytes"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.6))
    ax.plot(caps, [1e3 * r["step_s"] for r in rows], "o-", lw=2, label="step time (measured)")
    ax.plot(caps, [1e3 * r["model_step_overlapped_s"] for r in rows], "s--",
            label="timeline model, comm overlapped with backward")
    ax.plot(caps, [1e3 * r["model_step_serialised_s"] for r in rows], "^:",
            label="model, comm not overlapped")
    ax.plot(caps, [1e3 * r["comm_standalone_s"] for r in rows], "d-",
            label="communication (all buckets, no compute)")
    ax.plot(caps, [1e3 * (r["tail_s"] or 0) for r in rows], "x-",
            label="exposed after backward's last gradient")
    ax.axhline(1e3 * doc["buckets"]["compute_only"]["step"], color="gray", lw=0.8,
               label="compute only (no_sync)")
    ax.set_xscale("log")
    ax.set_xticks(caps)
    ax.set_xticklabels([_cap(r["cap_mb"]) for r in rows])
    ax.set_xlabel("bucket cap")
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    ax.set_title(f"BucketedDDP bucket sweep, {doc['np']} ranks on {doc['backend']}")
    ax.legend(fontsize=7)
    save(fig, "buckets.png")

    # scaling
    sc = [r for r in doc["scaling"] if r.get("efficiency") is not None]
    fig, ax = plt.subplots(figsize=(8, 4))
    names = [f"{r['ranks']}x {r['strategy']}\nk={r['accumulation']}" for r in sc]
    ax.bar(range(len(sc)), [100 * r["efficiency"] for r in sc], color="tab:blue")
    ax.bar(range(len(sc)), [100 * r.get("exposed_fraction", 0) for r in sc], color="tab:red",
           alpha=0.7, label="exposed communication, % of step")
    ax.axhline(85, color="k", ls="--", lw=0.8, label="85% target")
    ax.set_xticks(range(len(sc)))
    ax.set_xticklabels(names, fontsize=7)
    ax.set_ylabel("weak-scaling efficiency, %")
    ax.set_title("throughput(N) / (N x throughput(1)), fixed per-rank micro-batch")
    ax.legend(fontsize=7)
    save(fig, "scaling.png")

    # the profiled step's timeline
    p = doc["profile"]
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.broken_barh([(0, 1e3 * p["forward_s"])], (2, 0.8), color="tab:green")
    ax.broken_barh([(1e3 * p["backward_start_s"],
                     1e3 * (p["backward_end_s"] - p["backward_start_s"]))], (1, 0.8),
                   color="tab:orange")
    ax.broken_barh([(1e3 * e["issue_s"], 1e3 * (e["done_s"] - e["issue_s"]))
                    for e in p["events"] if e["done_s"] == e["done_s"]], (0, 0.8),
                   color="tab:blue", edgecolor="k", lw=0.3)
    ax.axvline(1e3 * p["backward_end_s"], color="k", ls="--", lw=0.8)
    ax.set_yticks([0.4, 1.4, 2.4])
    ax.set_yticklabels(["all-reduces\n(issue→done)", "backward\ncompute", "forward"], fontsize=8)
    ax.set_xlabel("ms since the step started (rank 0)")
    ax.set_title(f"one BucketedDDP step: {100 * p['overlap_fraction']:.0f}% of the all-reduce "
                 f"time overlaps backward")
    save(fig, "overlap.png")
    return files


def annotate_trace(path: str, profile: dict) -> None:
    """Add one event per bucket (issue -> completion of its all-reduce) and a marker at the end
    of backward's compute to the Chrome trace, on their own track. The profiler's clock is tied
    to ours by the ``all_reduce issue bucket i`` annotations, whose start is the issue time."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    issues = {}
    pid = None
    for e in events:
        name = e.get("name", "")
        if name.startswith("all_reduce issue bucket ") and "ts" in e:
            issues[int(name.split()[3])] = float(e["ts"])
            pid = e.get("pid", pid)
    if not issues:
        return
    i0 = min(issues)
    offset_us = issues[i0] - 1e6 * profile["events"][i0]["issue_s"]
    tid = "ringcomm all-reduce (issue -> completion)"
    for i, ev in enumerate(profile["events"]):
        if ev["done_s"] != ev["done_s"]:
            continue
        events.append({"name": f"all_reduce bucket {i} ({ev['bytes']} B)", "ph": "X",
                       "cat": "communication", "pid": pid, "tid": tid,
                       "ts": offset_us + 1e6 * ev["issue_s"],
                       "dur": 1e6 * (ev["done_s"] - ev["issue_s"])})
    events.append({"name": "backward compute ends (last gradient accumulated)", "ph": "i",
                   "s": "g", "pid": pid, "tid": tid,
                   "ts": offset_us + 1e6 * profile["backward_end_s"]})
    with open(path, "w") as f:
        json.dump(trace, f)


# ============================================================================ the page
def _memory_part(doc: dict) -> list:
    n = doc["np"]
    rows = []
    for r in doc["memory"]:
        f, q = r["formula"], r["ratio"]
        rows.append([r["precision"], r["strategy"], format_bytes(r["params"]), format_bytes(r["grads"]),
                     format_bytes(r["optimizer_states"]), format_bytes(r["total"]), f["text"],
                     format_bytes(f["total"]), _x(q["params"]), _x(q["grads"]),
                     _x(q["optimizer_states"]), _x(q["total"]), format_bytes(r["activations"]),
                     format_bytes(r["formula_activations"]), _x(q["activations"])])
    worst = max(abs(r["ratio"]["total"] - 1) for r in doc["memory"])
    acts = [r["ratio"]["activations"] for r in doc["memory"]]
    lines = [f"## 1. Memory budget per rank (N = {n}, Ψ = {doc['psi']:,} parameters)", ""]
    lines += _table(["prec", "strategy", "params", "grads", "optim", "total", "formula",
                     "formula total", "params m/f", "grads m/f", "optim m/f", "total m/f",
                     "activations", "Korthikanti", "act m/f"], rows)
    lines += ["", f"Measured on the tensors each rank holds after the first `step()` (before "
              f"`zero_grad`; activations on a micro-batch of {doc['options']['memory_batch']} "
              f"sequences): "
              "parameters, gradients (`.grad`, DDP buckets, ZeRO gradient shards), optimizer "
              "states (AdamW's `exp_avg`/`exp_avg_sq`/`step` plus ZeRO's fp32 master shards), "
              "counted once per storage, max over ranks; activations = bytes saved for backward "
              "at the end of forward (`saved_tensors_hooks`, unique storages, parameters "
              "excluded). bf16 ZeRO rows are the seeds' 2+2+12 budget (16Ψ, 4Ψ + 12Ψ/N, "
              "2Ψ + 14Ψ/N, 16Ψ/N = `ringcomm.training.memory.zero_memory_per_device`); DDP under CPU "
              "autocast keeps fp32 weights and gradients (4+4+8 = 16Ψ); the fp32 ZeRO-1/2 rows "
              "count ZeroOptimizer's fp32 master shard beside the flat parameters (12Ψ/N of "
              "optimizer state), ZeRO-3 fp32 none (its shard is the master).",
              "", f"Model states: every measured/formula ratio is within {100 * worst:.2f}% of "
              f"1 (the excess is ZeRO's padding to a multiple of N per flat group and AdamW's "
              f"4-byte `step` counters). Activations: measured / Korthikanti et al. is "
              f"{min(acts):.2f}-{max(acts):.2f}: the formula counts dropout masks (this model "
              f"has none) and the a·s² attention scores that the fused CPU attention kernel does "
              f"not keep, and it ignores the embedding, final LayerNorm and logits (here the "
              f"fp32 log-softmax of {doc['options']['vocab']} classes per token). DDP in bf16 "
              f"also saves autocast's bf16 copies of its fp32 weights for backward (about 2Ψ "
              f"bytes, counted here because they are not parameters); ZeRO's bf16 parameters "
              f"need no copy.", ""]
    off = next((r for r in doc["memory"] if r["strategy"].endswith("+offload")), None)
    if off is not None:
        dev = off["total"] - off["offloaded"]
        lines += [f"`{off['strategy']}` ({off['precision']}, `offload=\"cpu\"`, DeepSpeed's "
                  f"`offload_optimizer: cpu`): {format_bytes(off['offloaded'])} of the "
                  f"{format_bytes(off['total'])} a rank holds are the fp32 master shard and AdamW "
                  f"moments, kept in host memory (formula 12Ψ/N = "
                  f"{format_bytes(off['formula']['offloaded'])}, ratio {_x(off['ratio']['offloaded'])}); "
                  f"with CUDA parameters the device would keep {format_bytes(dev)} (2Ψ + 2Ψ/N = "
                  f"{format_bytes(off['formula']['params'] + off['formula']['grads'])}). Here "
                  f"the parameters are on the CPU too, so this row shows the split, not a saving.",
                  ""]
    return lines


def _bucket_part(doc: dict) -> list:
    b = doc["buckets"]
    comp = b["compute_only"]
    rows = []
    for r in b["rows"]:
        rows.append([_cap(r["cap_mb"]), r["nbuckets"], _ms(r["step_s"]),
                     _ms(r["comm_standalone_s"]), _ms(r["comm_wait_s"]), _ms(r["tail_s"]),
                     _ms(r["model_comm_s"]), _ms(r["model_step_overlapped_s"]),
                     _ms(r["model_step_serialised_s"])])
    first, last = b["rows"][0], b["rows"][-1]
    best = next(r for r in b["rows"] if r["cap_mb"] == b["best_cap_mb"])
    lines = ["## 2. Bucket size: time per step, 16 KiB to 16 MiB (BucketedDDP, fp32)", ""]
    lines += _table(["cap", "buckets", "step ms", "comm ms (alone)", "waits ms", "exposed ms",
                     "model comm ms", "model step ms (overlap)", "model step ms (serial)"], rows)
    lines += ["", f"![bucket sweep](buckets.png)", "",
              f"Compute only (every backward under `no_sync()`): {_ms(comp['step'])} ms per "
              f"step, of which backward {_ms(comp['backward'])} ms. Timeline model: bucket i is "
              f"ready when its last gradient is (measured in the compute-only run); all-reduces "
              f"run one after another, each costing latency + bytes / bandwidth with this run's "
              f"measured all-reduce latency {1e6 * b['latency_s']:.0f} µs and bandwidth "
              f"{b['bandwidth_Bps'] / 1e9:.2f} GB/s (bench method: median of timed calls, "
              f"slowest rank); predicted step = compute-only step + the part of the last "
              f"all-reduce that ends after backward's compute (\"overlap\"), or + all of them "
              f"(\"serial\"). \"exposed\" = time from the last gradient to `backward()` "
              f"returning; \"waits\" = time blocked in collective calls.", "",
              f"**Winner: {_cap(b['best_cap_mb'])}** ({_ms(best['step_s'])} ms/step; the "
              f"overlap model picks {_cap(b['best_model_cap_mb'])}). At {_cap(first['cap_mb'])} "
              f"the {first['nbuckets']} buckets pay the per-call latency {first['nbuckets']} "
              f"times ({_ms(first['nbuckets'] * b['latency_s'])} ms of latency alone, "
              f"{_ms(first['comm_standalone_s'])} ms measured for the all-reduces without "
              f"compute); at {_cap(last['cap_mb'])} the {last['nbuckets']} bucket(s) become "
              f"ready only near the end of backward, so their transfer cannot hide behind it "
              f"(exposed {_ms(last['tail_s'])} ms). " + _why_best(b, first, last, best),
              "", _model_fit(b), ""]
    same = [r for r in b["rows"] if r["nbuckets"] == first["nbuckets"]]
    if len(same) > 1:
        lines += [f"BucketedDDP never splits a parameter (one larger than the cap gets a "
                        f"bucket of its own; the largest here is "
                        f"{format_bytes(max(first['bucket_bytes']))}), so the caps up to "
                        f"{_cap(same[-1]['cap_mb'])} all give {first['nbuckets']} buckets, about "
                        f"one per parameter: their differences are noise.", ""]
    return lines


def _why_best(b: dict, first: dict, last: dict, best: dict) -> str:
    if best is first:
        return ("The smallest buckets win: on this model the per-call latency they add is "
                "smaller than the overlap they gain (the first all-reduce starts after the "
                "first few layers' gradients instead of at the end).")
    if best is last:
        return ("The largest buckets win: the per-call cost of many small all-reduces "
                "outweighs what overlapping them with backward saves.")
    return (f"{_cap(best['cap_mb'])} sits between the two: few enough calls "
            f"({best['nbuckets']}) to amortise the per-call latency, small enough that the "
            f"first buckets are ready early and their all-reduce overlaps the backward of the "
            f"remaining layers.")


def _model_fit(b: dict) -> str:
    between = sum(r["model_step_overlapped_s"] * 0.95 <= r["step_s"]
                  <= r["model_step_serialised_s"] * 1.05 for r in b["rows"])
    below = sum(r["step_s"] < r["model_step_overlapped_s"] * 0.95 for r in b["rows"])
    above = len(b["rows"]) - between - below
    return (f"Model vs measurement: {between} of {len(b['rows'])} caps lie between the overlap "
            f"and the serial model (within 5%), {above} above the serial model, {below} below "
            f"the overlap model. Each rank has one core here: an all-reduce's shared-memory "
            f"copies run on the core whose backward they are meant to overlap, so perfect "
            f"overlap is out of reach; time above the serial line is per-call overhead "
            f"(Python hooks, issuing, waking the progress thread) the model does not count.")


def _recompute_part(doc: dict) -> list:
    r = doc["recompute"]
    rows = [["off", _ms(r["off"]["step_s"]), _ms(r["off"]["forward_s"]),
             _ms(r["off"]["backward_s"]), format_bytes(r["off"]["activations"]),
             format_bytes(r["off"]["activations_peak"])],
            ["on", _ms(r["on"]["step_s"]), _ms(r["on"]["forward_s"]),
             _ms(r["on"]["backward_s"]), format_bytes(r["on"]["activations"]),
             format_bytes(r["on"]["activations_peak"])]]
    lines = ["## 3. Recomputation (every transformer block, BucketedDDP, fp32)", ""]
    lines += _table(["recompute", "step ms", "forward ms", "backward ms",
                     "activations (end of fwd)", "activations (peak)"], rows)
    lines += [""]
    lines += _table(["", "measured", "estimate", "measured / estimate"],
                    [["extra time per step", f"{_ms(r['extra_s'])} ms",
                      f"{_ms(r['estimate_s'])} ms (one forward)",
                      _x(r["ratio_extra_to_forward"])],
                     ["activation bytes saved", format_bytes(r["saved_bytes"]),
                      f"{format_bytes(r['formula_saved_bytes'])} (Korthikanti: none - full)",
                      _x(r["ratio_saved_to_formula"])]])
    q = r["ratio_extra_to_forward"]
    if q is None:
        why = ""
    elif q < 0.8:
        why = (f" Measured {q:.2f}: less than the blocks' forward can cost, so at this size the "
               f"difference of two step times is within the timing noise.")
    elif q <= 1.2:
        why = f" Measured {q:.2f}: as expected."
    else:
        why = (f" Measured {q:.2f}: the recomputed forward also pays its autograd bookkeeping "
               f"and runs with colder caches (and timing noise adds to the difference).")
    lines += ["", "The estimate of the extra time is one more forward pass (the measured "
              "forward time without recomputation); the recomputation reruns the blocks' "
              "forward only (not the embeddings, final LayerNorm and head), which alone would "
              "put the ratio a little under 1." + why + " Bytes saved = activations at the end "
              "of forward without minus with recomputation (with it, each block keeps only its "
              "input); the formula's difference is Korthikanti's none minus full.", ""]
    return lines


def _volume_part(doc: dict) -> list:
    rows = []
    for name, v in doc["volume"].items():
        rows.append([name, format_bytes(v["all_reduce"]["wire"]), format_bytes(v["reduce_scatter"]["wire"]),
                     format_bytes(v["all_gather"]["wire"]), format_bytes(v["wire_total"]),
                     _x(v["ratio_to_ddp"]), format_bytes(v["formula_wire"]), _x(v["ratio_to_formula"]),
                     v["source"]])
    lines = ["## 4. Communication volume per rank per step (fp32)", ""]
    lines += _table(["strategy", "all-reduce", "reduce-scatter", "all-gather", "total",
                     "/ DDP", "formula", "/ formula", "counted by"], rows)
    lines += ["", "Ring bytes each rank sends: 2(N-1)/N of the buffer per all-reduce, (N-1)/N "
              "of the full tensor per reduce-scatter or all-gather; formula = "
              "`ringcomm.training.memory.zero_communication_bytes(4Ψ, N, stage)`. \"issue_hook\": every "
              "byte was booked by the ringcomm backend's issue hook (`ringcomm.torch."
              "add_issue_hook`) inside the `torch.distributed` call that carried it; \"dist\": "
              "counted at the `torch.distributed` call (gloo has no issue hook). ZeRO-2's "
              "reduce-scatter + all-gather equal DDP's all-reduce and ZeRO-3 (two all-gathers "
              "+ one reduce-scatter) is 1.5x, up to ZeRO's padding.", ""]
    return lines


def _scaling_part(doc: dict) -> list:
    rows = []
    for r in doc["scaling"]:
        rows.append([r["ranks"], r["strategy"], r["accumulation"], _ms(r["step_s"]),
                     f"{r['throughput']:.1f}",
                     "-" if r.get("efficiency") is None else f"{100 * r['efficiency']:.1f}%",
                     _ms(r["exposed_comm_s"]),
                     "-" if r.get("exposed_fraction") is None
                     else f"{100 * r['exposed_fraction']:.1f}%"])
    cores = doc["host"]["usable_cores"]
    two = next((r for r in doc["scaling"] if r["ranks"] == 2 and r["strategy"] == "ddp"
                and r["accumulation"] == 1), None)
    lines = ["## 5. Weak scaling", ""]
    lines += _table(["ranks", "strategy", "accumulation", "step ms", "samples/s", "efficiency",
                     "exposed comm ms", "exposed / step"], rows)
    lines += ["", "![scaling](scaling.png)", "",
              f"Fixed per-rank micro-batch of {doc['options']['batch_per_rank']} sequences x "
              f"{doc['options']['seq_len']} tokens, `accumulation` micro-batches per step (the "
              f"first k-1 under `no_sync()`); each rank pinned to core rank % {cores}, the "
              f"single-process baseline pinned to one core, all with "
              f"{doc['options']['threads']} thread(s). efficiency = throughput(N) / (N x "
              f"throughput(1)) at the same accumulation; exposed comm = time blocked in "
              f"collectives per step (slowest rank, median step)."]
    if two is not None:
        eff = two["efficiency"]
        verdict = ("**meets the > 85% target**" if eff > 0.85 else
                   "**misses the 85% target**")
        exposed = two["exposed_comm_s"] / two["baseline_step_s"]
        text = (f"2 ranks, BucketedDDP, no accumulation: {100 * eff:.1f}% {verdict}. Relative "
                f"to the one-core step ({_ms(two['baseline_step_s'])} ms), the 2-rank step "
                f"({_ms(two['step_s'])} ms) is {100 * (1 / eff - 1):.1f}% longer: the exposed "
                f"communication accounts for {100 * exposed:.1f} points of that")
        comp = doc["buckets"]["compute_only"]["step"] if doc["np"] == 2 else None
        if comp is not None:
            text += (f", and the compute itself, measured without any communication (every "
                     f"backward under `no_sync()`, section 2: {_ms(comp)} ms per step on 2 "
                     f"ranks), runs {100 * (comp / two['baseline_step_s'] - 1):.1f}% slower on "
                     f"2 busy cores than on 1 (shared memory bandwidth and caches, and whatever "
                     f"else runs on the machine)")
        lines += ["", text + "."]
    four = [r for r in doc["scaling"] if r["ranks"] > cores]
    if four:
        f0 = four[0]
        lines += ["", f"{f0['ranks']} ranks on {cores} cores: two ranks share each core, so a "
                  f"step cannot be faster than {f0['ranks'] // cores}x the one-core step: "
                  f"efficiency {100 * f0['efficiency']:.0f}% (ideal on this machine: "
                  f"{100 * cores / f0['ranks']:.0f}%). This row measures oversubscription, not "
                  f"the communication library."]
    lines += [""]
    return lines


def _profile_part(doc: dict) -> list:
    p = doc["profile"]
    return ["## 6. Profiler evidence of overlap", "",
            "![overlap](overlap.png)", "",
            f"One BucketedDDP step ({_cap(p['bucket_cap_mb'])} buckets) under `torch.profiler`: "
            f"{p['issued_before_backward_end']} of {p['buckets']} bucket all-reduces were "
            f"issued before backward's last gradient; **{100 * p['overlap_fraction']:.0f}% of "
            f"the all-reduce time (issue to completion, summed over buckets) lies before the "
            f"end of backward's compute**. The Chrome trace `{p.get('trace', '-')}` (open in "
            f"chrome://tracing or ui.perfetto.dev) shows each `all_reduce issue bucket i` "
            f"inside the autograd backward ops, and a track `ringcomm all-reduce (issue -> "
            f"completion)` with each bucket's interval and the end of backward's compute.", ""]


def write_page(out_dir: str, doc: dict) -> list:
    """Write report.md and its figures into ``out_dir``; returns the figure names."""
    files = _plots(out_dir, doc)
    o = doc["options"]
    host = doc["host"]
    lines = ["# ringcomm training report", "",
             f"`{doc['command']}` — {doc['date']}, {host['cpu']} ({host['usable_cores']} usable "
             f"cores), backend **{doc['backend']}**, {doc['np']} ranks; model: TinyLM "
             f"d={o['d_model']} L={o['layers']} heads={o['heads']} seq={o['seq_len']} "
             f"vocab={o['vocab']}, Ψ = {doc['psi']:,}; {o['steps']} timed steps "
             f"(+{o['warmup']} warm-up) per row; load average before / after: "
             f"{_load(doc['host']['load_before'])} / {_load(doc['load_after'])}; "
             f"{doc['wall_seconds']:.0f} s in all.", ""]
    for n in doc.get("notices", []):
        lines += [f"> {n}", ""]
    busy = [la[0] for la in (doc["host"]["load_before"], doc["load_after"]) if la]
    if busy and max(busy) > host["usable_cores"]:
        lines += [f"> **The machine was busy**: load average {max(busy):.1f} on "
                  f"{host['usable_cores']} cores around this run, so other processes shared the "
                  f"cores the ranks were pinned to. Every timing below is inflated and noisy "
                  f"(the byte counts are not); rerun on a quiet machine for the timings.", ""]
    lines += _memory_part(doc) + ["![memory](memory.png)", ""]
    lines += _bucket_part(doc) + _recompute_part(doc) + _volume_part(doc) + _scaling_part(doc)
    lines += _profile_part(doc)
    lines += ["Every figure is in `report.json`."]
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return files
