"""``python -m ringcomm.apps.train --report DIR``: the one-page training report.

One run measures, on ``-np`` ranks (default 2) of the chosen backend (default ringcomm), each rank
pinned to its own core (rank i on core i % ncores):

1. the memory budget (DDP / ZeRO-1 / ZeRO-2 / ZeRO-3, fp32 and bf16) against the formulas;
2. a bucket-size sweep of BucketedDDP (16 KiB .. 16 MiB) against the DDP timeline model fed with
   this run's all-reduce latency and bandwidth;
3. the cost of recomputation against one extra forward pass;
4. the communication volume of DDP vs ZeRO-1/2/3;
5. weak scaling (fixed per-rank micro-batch, accumulation steps as a column) on 1 (this process,
   pinned to one core), 2 and 4 ranks (``--scaling-ranks``), with the exposed communication;
6. one profiled BucketedDDP step (a Chrome trace) and the fraction of its all-reduce time that
   overlaps backward.

It writes ``DIR/report.md`` (the page), ``DIR/report.json`` (every figure), the PNGs the page
cites and ``DIR/trace_ddp_step.json``. ``--quick`` shrinks the model and the steps (tests).
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time

from ...core.machine import cpu_model
from . import report_model as rm
from .report_rank import baseline, report_rank_main

#: Bucket caps of the sweep, MiB: 16 KiB, 64 KiB, 256 KiB, 1 MiB, 4 MiB, 16 MiB.
BUCKET_CAPS_MB = (1 / 64, 1 / 16, 1 / 4, 1.0, 4.0, 16.0)
MAIN_SECTIONS = ("memory", "probe", "buckets", "recompute", "volume", "scaling", "profile")


def report_options(args) -> dict:
    """Model, steps and section settings of a report run (``--quick``: tiny, for tests)."""
    if args.quick:
        o = dict(vocab=64, d_model=32, layers=2, heads=2, seq_len=16, batch_per_rank=2,
                 memory_batch=2, steps=2, warmup=1, bucket_mb=0.02, profile_bucket_mb=0.005,
                 probe_small=4096, probe_large=1 << 20)
    else:
        # ~7.9M parameters (31.6 MB of fp32 gradients) and 8 x 64 tokens per rank: a step's
        # compute on one core outweighs its gradient all-reduce, and the gradients fill more than
        # one of the sweep's largest (16 MiB) buckets.
        o = dict(vocab=1024, d_model=384, layers=4, heads=6, seq_len=64, batch_per_rank=8,
                 memory_batch=2, steps=4, warmup=1, bucket_mb=4.0, profile_bucket_mb=1.0,
                 probe_small=4096, probe_large=16 << 20)
    for k in ("vocab", "d_model", "layers", "heads", "seq_len", "batch_per_rank", "steps",
              "warmup"):
        v = getattr(args, k, None)
        if v is not None:
            o[k] = v
    if o["d_model"] % o["heads"]:
        raise SystemExit(f"--d-model {o['d_model']} is not divisible by --heads {o['heads']}")
    o.update(seed=args.seed, lr=args.lr, weight_decay=args.weight_decay, threads=args.threads,
             bucket_caps_mb=list(BUCKET_CAPS_MB), baseline_accumulation=[1, 2],
             scaling_configs=[("ddp", 1), ("ddp", 2), ("zero2", 1), ("zero2", 2)],
             scaling_configs_other=[("ddp", 1)])
    if args.bucket_cap_mb is not None:
        o["bucket_mb"] = args.bucket_cap_mb
    return o


def _scaling_worlds(args, np_: int) -> list:
    if args.scaling_ranks:
        worlds = sorted({int(x) for x in args.scaling_ranks.split(",") if x.strip()})
    else:
        worlds = sorted({1, 2, 4, np_})
    if any(w < 1 or w > 8 for w in worlds):
        raise SystemExit("--scaling-ranks: each world size must be in 1..8")
    return worlds


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"ringcomm.apps.train --report: {msg}", file=sys.stderr, flush=True)


def run_report(args, backend: str, notices: list) -> int:
    """Measure, write DIR/report.{md,json} and the figures; returns the exit status."""
    from ...core.launch import LaunchError, spawn_with_store
    from .report_page import annotate_trace, write_page

    out_dir = os.path.abspath(args.report)
    os.makedirs(out_dir, exist_ok=True)
    np_ = args.world_size
    if not 2 <= np_ <= 4:
        raise SystemExit("--report: -np must be 2, 3 or 4")
    o = report_options(args)
    o["backend"] = backend
    o["quiet"] = args.no_progress
    worlds = _scaling_worlds(args, np_)
    quiet = args.no_progress
    t_start = time.perf_counter()
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    doc = {"command": "python -m ringcomm.apps.train " + " ".join(sys.argv[1:]) if args.argv is None
           else "python -m ringcomm.apps.train " + " ".join(args.argv),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "host": {"cpu": cpu_model(), "cores": os.cpu_count(),
                    "usable_cores": len(os.sched_getaffinity(0))
                    if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                    "load_before": load_before},
           "backend": backend, "np": np_, "scaling_worlds": worlds, "options": o,
           "notices": list(notices)}

    _log(f"single-process baseline (pinned to one core, {o['threads']} thread(s)) ...", quiet)
    doc["baseline"] = baseline(o)

    trace = os.path.join(out_dir, "trace_ddp_step.json")
    runs = {}
    for world in [np_] + [w for w in worlds if w >= 2 and w != np_]:
        sections = list(MAIN_SECTIONS) if world == np_ else ["scaling"]
        ow = dict(o) if world == np_ else dict(o, scaling_configs=o["scaling_configs_other"])
        _log(f"{world} ranks on {backend}: {', '.join(sections)} ...", quiet)
        ranks_trace = trace if world == np_ else None
        try:
            runs[world] = spawn_with_store(report_rank_main, world,
                                           lambda store: (ow, store, sections, ranks_trace),
                                           timeout=args.timeout, prefix="ringcomm-report-")[0]
        except LaunchError as e:
            print(f"ringcomm.apps.train --report: the {world}-rank run failed: {e}", file=sys.stderr)
            return 2

    main = runs[np_]
    doc["cores_per_rank"] = {w: r["cores_per_rank"] for w, r in runs.items()}
    doc["section_seconds"] = {w: r.get("seconds", {}) for w, r in runs.items()}
    doc["psi"] = main["memory"][0]["psi"]
    doc["memory"] = _memory_rows(main["memory"], o, np_)
    doc["probe"] = main["probe"]
    doc["buckets"] = _bucket_section(main["buckets"], main["probe"])
    doc["recompute"] = _recompute_section(main["recompute"], o)
    doc["volume"] = _volume_section(main["volume"], doc["psi"], np_)
    scaling = []
    for w in sorted(runs):
        scaling += runs[w].get("scaling", [])
    doc["scaling"] = rm.scaling_efficiency(doc["baseline"] + scaling, doc["baseline"])
    doc["profile"] = main["profile"]
    if os.path.exists(trace):
        doc["profile"]["trace"] = os.path.basename(trace)
        annotate_trace(trace, main["profile"])
    doc["load_after"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    doc["wall_seconds"] = time.perf_counter() - t_start
    files = write_page(out_dir, doc)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"ringcomm.apps.train --report: wrote {os.path.join(out_dir, 'report.md')}, "
          f"{os.path.join(out_dir, 'report.json')}, "
          + ", ".join(os.path.join(out_dir, p) for p in files)
          + f" in {doc['wall_seconds']:.0f} s", flush=True)
    return 0


# ============================================================================ derived figures
def _ratio(a, b):
    return a / b if b else None


def _memory_rows(rows: list, o: dict, n: int) -> list:
    out = []
    for r in rows:
        f = rm.memory_formula(r["strategy"], r["precision"], r["psi"], n)
        act_f = rm.activation_formula(dict(o, batch_per_rank=o["memory_batch"]), r["precision"])
        total = r["params"] + r["grads"] + r["optimizer_states"]
        row = dict(r, total=total, formula=f, formula_activations=act_f,
                   ratio={k: _ratio(r[k], f[k]) for k in ("params", "grads",
                                                          "optimizer_states")})
        row["ratio"]["total"] = _ratio(total, f["total"])
        if "offloaded" in f:
            row["ratio"]["offloaded"] = _ratio(r["offloaded"], f["offloaded"])
        row["ratio"]["activations"] = _ratio(r["activations"], act_f)
        out.append(row)
    return out


def _bucket_section(sweep: dict, probe: dict) -> dict:
    preds = {p["cap_mb"]: p for p in rm.bucket_predictions(sweep, probe)}
    rows = []
    for r in sweep["rows"]:
        row = {k: v for k, v in r.items() if k != "buckets"}
        row.update(preds[r["cap_mb"]])
        row["bucket_bytes"] = [b["bytes"] for b in r["buckets"]]
        rows.append(row)
    best = min(rows, key=lambda r: r["step_s"])
    best_model = min(rows, key=lambda r: r["model_step_overlapped_s"])
    return {"compute_only": sweep["compute_only"], "rows": rows, "best_cap_mb": best["cap_mb"],
            "best_model_cap_mb": best_model["cap_mb"],
            "latency_s": probe["latency_s"], "bandwidth_Bps": probe["bandwidth_Bps"]}


def _recompute_section(rc: dict, o: dict) -> dict:
    off, on = rc["off"], rc["on"]
    extra = on["step_s"] - off["step_s"]
    saved = off["activations"] - on["activations"]
    formula_saved = (rm.activation_formula(o, "fp32") -
                     rm.activation_formula(o, "fp32", recompute=True))
    return {"off": off, "on": on, "extra_s": extra, "estimate_s": off["forward_s"],
            "ratio_extra_to_forward": _ratio(extra, off["forward_s"]),
            "saved_bytes": saved, "saved_peak_bytes": off["activations_peak"]
            - on["activations_peak"], "formula_saved_bytes": formula_saved,
            "ratio_saved_to_formula": _ratio(saved, formula_saved)}


def _volume_section(vol: dict, psi: int, n: int) -> dict:
    from ...training import memory
    out = {}
    ddp = vol["ddp"]["all_reduce"]["wire"]
    for name, v in vol.items():
        wire = sum(v[k]["wire"] for k in ("all_reduce", "reduce_scatter", "all_gather"))
        stage = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}[name]
        formula = memory.zero_communication_bytes(4 * psi, n, stage)
        out[name] = dict(v, wire_total=wire, ratio_to_ddp=_ratio(wire, ddp),
                         formula_wire=formula, ratio_to_formula=_ratio(wire, formula))
    return out
