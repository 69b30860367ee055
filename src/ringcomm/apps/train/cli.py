"""``python -m ringcomm.apps.train`` / ``ringcomm-train``: arguments, the single-process and spawned
runs, the comparison against the single process, and the table / plot / JSON output."""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from ..parallel_demo import build_parser as parallel_parser
from ..parallel_demo import main as parallel_main
from ..tiny_lm import add_model_arguments
from .runner import _config_name, _progress, run_config
from .strategies import (PRECISIONS, STRATEGIES, TOLERANCE, _Notices, _zero3_factory,
                         _zero_module)
from .summary import _formulas, _plot, _table


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ringcomm.apps.train",
        description="Train a small transformer LM on synthetic data with single-process, torch "
                    "DDP, BucketedDDP and ZeRO-1/2/3, +- recomputation, fp32/bf16; compare loss "
                    "curves, throughput, communication time and memory.")
    p.add_argument("--world-size", "-np", type=int, default=2,
                   help="local processes (default 2)")
    p.add_argument("--backend", default="ringcomm",
                   help="torch.distributed backend (default ringcomm; falls back to gloo with a "
                        "notice only if ringcomm.torch is not importable)")
    p.add_argument("--quick", action="store_true",
                   help="tiny model and few steps: the whole matrix in well under 2 minutes")
    p.add_argument("--steps", type=int, default=None, help="steps per configuration")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per configuration")
    p.add_argument("--configs", default=",".join(STRATEGIES),
                   help=f"comma list of strategies (default all: {','.join(STRATEGIES)})")
    p.add_argument("--precisions", default="fp32,bf16", help="comma list of fp32,bf16")
    p.add_argument("--recompute", default="off,on", help="comma list of off,on")
    p.add_argument("--plot", default="ringcomm_train.png", help="PNG path ('' for none)")
    p.add_argument("--json", default=None, help="write the figures to this JSON file")
    add_model_arguments(p)
    p.add_argument("--batch-per-rank", type=int, default=None,
                   help="samples per rank; the global batch is world-size times this")
    p.add_argument("--bucket-cap-mb", type=float, default=None)
    p.add_argument("--first-bucket-mb", type=float, default=None)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--timeout", type=float, default=900, help="seconds for the ranks")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--report", metavar="DIR", default=None,
                   help="write the one-page training report (memory budget, bucket sweep, "
                        "recomputation, communication volume, weak scaling, profiler overlap) "
                        "to DIR/report.md + DIR/report.json + figures, instead of the "
                        "strategy comparison; -np ranks (2..4, default 2); with --quick: tiny")
    p.add_argument("--scaling-ranks", default=None,
                   help="--report: comma list of world sizes for the scaling section "
                        "(default 1,2,4 and -np)")
    return p


def _options(args) -> dict:
    quick = args.quick
    dflt = (dict(vocab=64, d_model=32, layers=2, heads=2, seq_len=32, batch_per_rank=4, steps=12,
                 warmup=2, bucket_cap_mb=0.02, first_bucket_mb=0.005) if quick else
            dict(vocab=128, d_model=64, layers=4, heads=4, seq_len=64, batch_per_rank=8,
                 steps=30, warmup=3, bucket_cap_mb=0.25, first_bucket_mb=0.05))
    o = {k: (getattr(args, k) if getattr(args, k, None) is not None else v)
         for k, v in dflt.items()}
    if o["steps"] <= o["warmup"]:
        o["warmup"] = max(0, o["steps"] - 1)
    o.update(seed=args.seed, lr=args.lr, weight_decay=args.weight_decay, threads=args.threads,
             no_progress=args.no_progress, backend=args.backend)
    o["global_batch"] = o["batch_per_rank"] * args.world_size
    if o["d_model"] % o["heads"]:
        raise SystemExit(f"--d-model {o['d_model']} is not divisible by --heads {o['heads']}")
    return o


def _parse_list(s: str, allowed, what) -> list:
    items = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad:
        raise SystemExit(f"unknown {what}: {', '.join(bad)} (choose from {', '.join(allowed)})")
    return items


def _resolve_backend(requested: str, notices: _Notices) -> str:
    if requested != "ringcomm":
        return requested
    try:
        import ringcomm.torch  # noqa: F401
    except Exception as e:  # noqa: BLE001 - the documented fallback
        notices.add(f"notice: the ringcomm torch.distributed backend is not importable "
                    f"({type(e).__name__}: {e}); falling back to gloo")
        return "gloo"
    return "ringcomm"


def _parallel(argv) -> bool:
    """Whether the command line runs the tensor / pipeline parallel demo."""
    return any(a == "--parallel" or a.startswith("--parallel=") for a in argv)


def parser_for(argv) -> argparse.ArgumentParser:
    """The parser of this command line: the parallel demo's with ``--parallel``, else the
    wrappers' comparison's."""
    return parallel_parser() if _parallel(argv) else build_parser()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if _parallel(argv):
        return parallel_main(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    if args.world_size < 1:
        raise SystemExit("--world-size must be >= 1")
    if args.report is not None:
        from .report import run_report
        notices = _Notices()
        backend = _resolve_backend(args.backend, notices)
        for n in notices:
            print(n, flush=True)
        return run_report(args, backend, list(notices))
    strategies = _parse_list(args.configs, STRATEGIES, "configuration")
    precisions = _parse_list(args.precisions, PRECISIONS, "precision")
    recomputes = [x == "on" for x in _parse_list(args.recompute, ("off", "on"), "recompute")]
    notices = _Notices()
    o = _options(args)
    o["backend"] = _resolve_backend(args.backend, notices)
    torch.set_num_threads(o["threads"])

    zero, err = _zero_module()
    wanted_zero = [s for s in strategies if s.startswith("zero")]
    if wanted_zero and zero is None:
        notices.add(f"notice: ringcomm.training.zero is not available ({err}); skipping "
                    f"{', '.join(wanted_zero)}")
        strategies = [s for s in strategies if not s.startswith("zero")]
    elif "zero3" in strategies and _zero3_factory(zero)[1] is None:
        notices.add("notice: ringcomm.training.zero has no stage-3 wrapper; skipping zero3")
        strategies.remove("zero3")
    if args.world_size == 1 and any(s != "single" for s in strategies):
        notices.add("notice: --world-size 1 runs the single-process configurations only")
        strategies = [s for s in strategies if s == "single"]
    for n in notices:
        print(n, flush=True)

    # The single-process reference always runs (every curve is checked against it).
    singles = [dict(strategy="single", precision=p, recompute=rc)
               for p in precisions for rc in sorted({False} | set(recomputes))]
    dists = [dict(strategy=s, precision=p, recompute=rc)
             for s in strategies if s != "single" for p in precisions for rc in recomputes]

    print(f"ringcomm.apps.train: {len(singles)} single-process + {len(dists)} distributed "
          f"configurations, {args.world_size} ranks on backend '{o['backend']}', "
          f"{o['steps']} steps each (model d={o['d_model']} L={o['layers']} heads={o['heads']} "
          f"seq={o['seq_len']} vocab={o['vocab']}, global batch {o['global_batch']})", flush=True)
    t_start = time.perf_counter()
    rows = []
    pbar = _progress(o, len(singles) * o["steps"], "single process")
    try:
        for c in singles:
            if pbar is not None:
                pbar.set_description(_config_name(c))
            r = run_config(c, o, 0, 1, None, pbar)
            r["comm_fraction"] = None
            rows.append(dict(c, ranks=1, **r))
    finally:
        if pbar is not None:
            pbar.close()
    if dists:
        from ...core.launch import LaunchError, spawn_with_store
        from .runner import _rank_main
        try:
            results = spawn_with_store(_rank_main, args.world_size,
                                       lambda store: (o, dists, store), timeout=args.timeout,
                                       prefix="ringcomm-train-")[0]
        except LaunchError as e:
            print(f"ringcomm.apps.train: the distributed run failed: {e}", file=sys.stderr)
            return 2
        for c, r in zip(dists, results):
            rows.append(dict(c, ranks=args.world_size, **r))

    # Compare, derive, report.
    base = {(r["precision"], r["recompute"]): r for r in rows if r["strategy"] == "single"}
    ok_all = True
    for r in rows:
        r["name"] = _config_name(r)
        # Median step time (robust to a busy machine's preemption spikes); the mean is kept too.
        st = sorted(r["step_times"])
        med = (st[(len(st) - 1) // 2] + st[len(st) // 2]) / 2 if st else 0.0
        r["steps_per_s"] = 1.0 / med if med > 0 else float("nan")
        r["steps_per_s_mean"] = (r["timed_steps"] / r["elapsed"] if r["elapsed"] > 0
                                 else float("nan"))
        ref = base.get((r["precision"], False)) or base.get((r["precision"], r["recompute"]))
        dev = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(r["losses"], ref["losses"]))
        r["loss_dev"] = dev
        r["loss_ok"] = dev <= TOLERANCE[r["precision"]]
        ok_all &= r["loss_ok"]
        sref = base.get((r["precision"], r["recompute"]))
        r["efficiency"] = (r["steps_per_s"] / (r["ranks"] * sref["steps_per_s"])
                           if sref and sref["steps_per_s"] > 0 else None)
        r["formula"] = _formulas(r, o, args.world_size)
    wall = time.perf_counter() - t_start

    print()
    print(_table(rows, args.world_size))
    print()
    print(f"backend: {o['backend']}; {args.world_size} ranks x {o['threads']} thread(s); "
          f"psi = {rows[0]['psi']:,} parameters; {o['steps']} steps/config "
          f"({o['warmup']} warm-up); total {wall:.1f} s")
    print("steps/s = 1 / median step time (slowest rank per step). "
          "eff = steps/s / (ranks x single-process steps/s), same precision and recompute. "
          "comm% = waits on collectives / wall time (* torch DDP: last gradient ready -> "
          "backward() returned).")
    print("memory per rank (max over ranks) measured on tensors; act fwd = saved for backward "
          "at the end of forward, act peak = peak alive during forward + backward (with "
          "recomputation: + one recomputed block); total = params + grads + optim + act peak; "
          "'formula states' = ringcomm.training.memory.zero_memory_per_device (16 B/param "
          "mixed-precision Adam), 'formula act' = activation_memory_bytes (Korthikanti et al.). "
          "loss dev = max relative "
          f"deviation from the single-process curve (tolerance fp32 {TOLERANCE['fp32']:g}, "
          f"bf16 {TOLERANCE['bf16']:g}).")
    bad = [r["name"] for r in rows if not r["loss_ok"]]
    print("loss curves: all match the single-process run" if not bad else
          f"loss curves: MISMATCH for {', '.join(bad)}")

    title = (f"ringcomm.apps.train: {args.world_size} ranks on {o['backend']}, psi={rows[0]['psi']:,}, "
             f"global batch {o['global_batch']}")
    if args.plot:
        try:
            _plot(rows, args.plot, title)
            print(f"plot: {args.plot}")
        except Exception as e:  # noqa: BLE001 - the numbers are already printed
            print(f"notice: could not write the plot ({type(e).__name__}: {e})")
    if args.json:
        keep = ("name", "strategy", "precision", "recompute", "ranks", "steps_per_s", "efficiency",
                "comm_fraction", "mem", "mem_per_rank", "formula", "losses", "loss_dev",
                "loss_ok", "psi", "local_batch", "elapsed", "timed_steps", "steps_per_s_mean",
                "step_times")
        doc = {"backend": o["backend"], "world_size": args.world_size, "options": o,
               "notices": list(notices), "wall_seconds": wall, "all_losses_match": ok_all,
               "tolerance": TOLERANCE,
               "rows": [{k: r.get(k) for k in keep} for r in rows]}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        print(f"json: {args.json}")
    return 0 if ok_all else 1
