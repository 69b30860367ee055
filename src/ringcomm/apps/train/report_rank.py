"""The measurements behind ``python -m ringcomm.apps.train --report``, as run by each rank (and by the
single-process baseline): memory budget, latency/bandwidth probe, bucket sweep, recomputation,
weak scaling, and one profiled BucketedDDP step.

Every timed figure is a median over timed steps (after warm-up) of the slowest rank's time for
that step (``_max_over_ranks``), so one preempted step or one slow rank does not decide a row.
The options dict ``o`` is :func:`ringcomm.apps.train.report.report_options`'s.
"""
from __future__ import annotations

import contextlib
import functools
import os
import statistics
import sys
import time

import torch

from ..tiny_lm import TinyLM, make_batch
from .comm_timer import CommTimer
from .comm_volume import CommVolume
from .memory_meters import ActivationMeter, model_state_bytes

_MB = 1024 * 1024


# ============================================================================ helpers
def pin_to_core(rank: int) -> int | None:
    """Pin the calling thread (and the threads it starts later) to core ``rank % ncores`` of the
    cores this process may use; returns the core (None where affinity is not supported)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    core = cores[rank % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


def _model(o: dict, recompute: bool = False) -> TinyLM:
    torch.manual_seed(o["seed"])
    return TinyLM(o["vocab"], o["d_model"], o["layers"], o["heads"], o["seq_len"],
                  recompute=recompute)


def _micro_batches(o: dict, step: int, rank: int, world: int, k: int) -> list:
    """This rank's ``k`` micro-batches of ``batch_per_rank`` samples for ``step``."""
    b = o["batch_per_rank"]
    g = dict(o, global_batch=b * k * world)
    x, y = make_batch(g, step)
    x, y = x[rank * b * k:(rank + 1) * b * k], y[rank * b * k:(rank + 1) * b * k]
    return list(zip(x.split(b), y.split(b)))


def _amp(precision: str):
    if precision == "bf16":
        return functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext


def _median(xs) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def _max_over_ranks(values: list, world: int) -> list:
    if world == 1 or not values:
        return list(values)
    import torch.distributed as dist
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist
        dist.barrier()


def build(strategy: str, model, o: dict, precision: str = "fp32", bucket_mb: float | None = None,
          offload: str | None = None):
    """(forward module, optimizer-like, no_sync context factory) for a strategy; ``offload``
    goes to ZeRO."""
    kw = dict(lr=o["lr"], weight_decay=o["weight_decay"])
    mp = "bf16" if precision == "bf16" else None
    cap = o["bucket_mb"] if bucket_mb is None else bucket_mb
    if strategy == "single":
        return model, torch.optim.AdamW(model.parameters(), **kw), contextlib.nullcontext
    if strategy == "ddp":
        from ...training.ddp import BucketedDDP
        ddp = BucketedDDP(model, bucket_cap_mb=cap, first_bucket_mb=cap)
        return ddp, torch.optim.AdamW(ddp.parameters(), **kw), ddp.no_sync
    from ...training import zero
    if strategy in ("zero1", "zero2"):
        opt = zero.ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=int(strategy[-1]),
                                 mixed_precision=mp, bucket_cap_mb=cap, offload=offload, **kw)
        return model, opt, opt.no_sync
    if strategy == "zero3":
        z = zero.ZeroStage3(model, torch.optim.AdamW, mixed_precision=mp, offload=offload, **kw)
        return z, z, z.no_sync
    raise ValueError(f"unknown strategy {strategy!r}")


class _ReadyTimes:
    """``perf_counter`` at which each parameter's gradient was accumulated (last one wins)."""

    def __init__(self, params):
        self.t: dict = {}
        self.handles = [p.register_post_accumulate_grad_hook(self._hook) for p in params
                        if p.requires_grad]

    def _hook(self, p):
        self.t[id(p)] = time.perf_counter()

    def remove(self):
        for h in self.handles:
            h.remove()


def _train_step(fwd, opt, nosync, mbs, amp, timer: CommTimer | None = None,
                ready: _ReadyTimes | None = None) -> dict:
    """One optimizer step over micro-batches ``mbs`` (the first k-1 under ``nosync()``);
    returns its phases' seconds."""
    k = len(mbs)
    t0 = time.perf_counter()
    if timer is not None:
        timer.seconds = 0.0
    fwd_s = bwd_s = 0.0
    t_last = t_bwd_end = t0
    for i, (x, y) in enumerate(mbs):
        with nosync() if i < k - 1 else contextlib.nullcontext():
            ta = time.perf_counter()
            with amp():
                loss = fwd(x, y)
            tb = time.perf_counter()
            (loss / k).backward()
            tc = time.perf_counter()
        fwd_s += tb - ta
        bwd_s += tc - tb
        t_bwd_start, t_bwd_end = tb, tc
    if ready is not None and ready.t:
        t_last = max(ready.t.values())
    td = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    te = time.perf_counter()
    out = {"step": te - t0, "forward": fwd_s, "backward": bwd_s, "optimizer": te - td,
           "comm_wait": timer.seconds if timer is not None else 0.0,
           "loss": float(loss.detach())}
    if ready is not None:
        out["tail"] = max(0.0, t_bwd_end - t_last)            # backward() after the last grad
        out["ready"] = {pid: t - t_bwd_start for pid, t in ready.t.items()}
        out["bwd_last"] = t_bwd_end - t_bwd_start
        ready.t.clear()
    return out


def timed_steps(fwd, opt, nosync, o, rank, world, k=1, precision="fp32", steps=None,
                warmup=None, timer=None, ready=None) -> dict:
    """Warm-up + timed steps; medians over steps of the slowest rank's seconds per phase."""
    steps = o["steps"] if steps is None else steps
    warmup = o["warmup"] if warmup is None else warmup
    amp = _amp(precision)
    rows = []
    for s in range(warmup + steps):
        if s == warmup:
            _barrier(world)   # the timed steps start together
        r = _train_step(fwd, opt, nosync, _micro_batches(o, s, rank, world, k), amp, timer, ready)
        if s >= warmup:
            rows.append(r)
    keys = ("step", "forward", "backward", "optimizer", "comm_wait", "tail")
    out = {}
    for key in keys:
        if all(key in r for r in rows):
            out[key] = _median(_max_over_ranks([r[key] for r in rows], world))
    out["steps"] = steps
    out["loss_last"] = rows[-1]["loss"] if rows else float("nan")
    if ready is not None and rows:
        pids = rows[0]["ready"].keys()
        out["ready"] = {pid: _median([r["ready"][pid] for r in rows if pid in r["ready"]])
                        for pid in pids}
        out["bwd_last"] = _median([r["bwd_last"] for r in rows])
    return out


# ============================================================================ sections
def memory_budget(o: dict, rank: int, world: int) -> list:
    """Per (precision, strategy): bytes held after the first step() (the optimizer states exist
    from then on; before zero_grad) and activations saved for backward in that step, on a
    micro-batch of ``o["memory_batch"]`` sequences (the model states do not depend on it)."""
    rows = []
    om = dict(o, batch_per_rank=o["memory_batch"])
    configs = [(p, s, None) for p in ("fp32", "bf16") for s in ("ddp", "zero1", "zero2", "zero3")]
    configs.append(("bf16", "zero2", "cpu"))   # DeepSpeed's offload_optimizer: cpu
    for precision, strategy, offload in configs:
        model = _model(o)
        psi = sum(p.numel() for p in model.parameters())
        fwd, opt, _ = build(strategy, model, o, precision, offload=offload)
        amp = _amp(precision)
        x, y = _micro_batches(om, 0, rank, world, 1)[0]
        meter = ActivationMeter(exclude=fwd)
        with meter:
            with amp():
                loss = fwd(x, y)
            act_fwd = meter.current
            loss.backward()
        opt.step()
        mem = model_state_bytes(model, opt, {"grads": [b.buffer for b in fwd.buckets]}
                                if strategy == "ddp" else None)
        host = opt.memory_breakdown()["offloaded"] if offload else 0
        opt.zero_grad(set_to_none=True)
        per = torch.tensor([mem["params"], mem["grads"], mem["optimizer_states"], act_fwd,
                            meter.peak, host], dtype=torch.float64)
        if world > 1:
            import torch.distributed as dist
            dist.all_reduce(per, op=dist.ReduceOp.MAX)
        padded = opt.padded_numel if hasattr(opt, "padded_numel") else psi
        rows.append({"precision": precision,
                     "strategy": strategy + ("+offload" if offload else ""), "psi": psi,
                     "padded": padded, "params": int(per[0]), "grads": int(per[1]),
                     "optimizer_states": int(per[2]), "activations": int(per[3]),
                     "activations_peak": int(per[4]), "offloaded": int(per[5])})
        del fwd, opt, model
    return rows


def probe_latency_bandwidth(o: dict, world: int) -> dict:
    """All-reduce of a small and a large float32 tensor through torch.distributed (the path
    BucketedDDP takes), timed like the bench: warm-up, then the median of timed calls of the
    slowest rank. latency = t(small); bandwidth = (large - small) bytes / (t(large) - t(small))."""
    import torch.distributed as dist
    out = {}
    for name, nbytes, reps in (("small", o["probe_small"], 20), ("large", o["probe_large"], 5)):
        t = torch.ones(nbytes // 4)
        for _ in range(3):
            dist.all_reduce(t)
        times = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        out[name] = _median(_max_over_ranks(times, world))
        out[name + "_bytes"] = nbytes
    dt = max(out["large"] - out["small"], 1e-9)
    out["latency_s"] = out["small"]
    out["bandwidth_Bps"] = (out["large_bytes"] - out["small_bytes"]) / dt
    return out


def _standalone_comm(ddp, world: int, reps: int = 3) -> float:
    """Seconds to all-reduce every bucket of ``ddp`` (copies of the buffers), issued back to back
    asynchronously and then waited on, with no compute: the communication a step needs."""
    import torch.distributed as dist
    bufs = [b.buffer.clone() for b in ddp.buckets]
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.all_reduce(b, async_op=True) for b in bufs]
        for w in works:
            w.wait()
        times.append(time.perf_counter() - t0)
    return _median(_max_over_ranks(times, world))


def bucket_sweep(o: dict, rank: int, world: int) -> dict:
    """BucketedDDP at each bucket cap: step time, exposed tail, waits, standalone communication;
    plus one compute-only measurement (every backward under ``no_sync()``: no all-reduce at all)
    whose per-parameter gradient-ready times feed the timeline model."""
    model = _model(o)
    ddp, opt, _ = build("ddp", model, o, bucket_mb=o["bucket_caps_mb"][0])
    names = {id(p): n for n, p in model.named_parameters()}
    ready = _ReadyTimes(model.parameters())
    rows_c = []
    for s in range(o["warmup"] + o["steps"]):
        if s == o["warmup"]:
            _barrier(world)
        x, y = _micro_batches(o, s, rank, world, 1)[0]
        t0 = time.perf_counter()
        with ddp.no_sync():
            loss = ddp(x, y)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
        rel = {names[pid]: t - t1 for pid, t in ready.t.items()}
        ready.t.clear()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if s >= o["warmup"]:
            rows_c.append({"step": t3 - t0, "forward": t1 - t0, "backward": t2 - t1,
                           "bwd_compute": max(rel.values()), "ready": rel})
    ready.remove()
    comp = {k: _median(_max_over_ranks([r[k] for r in rows_c], world))
            for k in ("step", "forward", "backward", "bwd_compute")}
    # median over steps of each parameter's ready time, slowest rank
    pnames = sorted(rows_c[0]["ready"])
    med = _max_over_ranks([_median([r["ready"][n] for r in rows_c]) for n in pnames], world)
    ready_by_name = dict(zip(pnames, med))
    del ddp, opt, model
    rows = []
    for cap in o["bucket_caps_mb"]:
        model = _model(o)
        ddp, opt, nosync = build("ddp", model, o, bucket_mb=cap)
        timer = CommTimer().install()
        rd = _ReadyTimes(model.parameters())
        timer.active = True
        try:
            r = timed_steps(ddp, opt, nosync, o, rank, world, timer=timer, ready=rd)
        finally:
            timer.active = False
            timer.uninstall()
            rd.remove()
        comm = _standalone_comm(ddp, world)
        buckets = [{"bytes": b.nbytes, "ready_s": max(ready_by_name[n] for n in b.names)}
                   for b in ddp.buckets]
        rows.append({"cap_mb": cap, "cap_bytes": int(round(cap * _MB)),
                     "nbuckets": len(ddp.buckets), "step_s": r["step"],
                     "backward_s": r["backward"], "tail_s": r.get("tail"),
                     "comm_wait_s": r["comm_wait"], "comm_standalone_s": comm,
                     "buckets": buckets})
        del ddp, opt, model
    return {"compute_only": comp, "rows": rows}


def recompute_cost(o: dict, rank: int, world: int) -> dict:
    """BucketedDDP with and without recomputation of every block: step time, forward time, and
    activations saved for backward (at the end of forward, and the peak during backward)."""
    out = {}
    for rc in (False, True):
        model = _model(o, recompute=rc)
        ddp, opt, nosync = build("ddp", model, o)
        r = timed_steps(ddp, opt, nosync, o, rank, world)
        x, y = _micro_batches(o, 0, rank, world, 1)[0]
        meter = ActivationMeter(exclude=ddp)
        with meter:
            loss = ddp(x, y)
            act = meter.current
            loss.backward()
        opt.zero_grad(set_to_none=True)
        acts = _max_over_ranks([float(act), float(meter.peak)], world)
        out["on" if rc else "off"] = {"step_s": r["step"], "forward_s": r["forward"],
                                      "backward_s": r["backward"], "activations": int(acts[0]),
                                      "activations_peak": int(acts[1])}
        del ddp, opt, model
    return out


def scaling_rows(o: dict, rank: int, world: int) -> list:
    """Weak scaling: fixed per-rank micro-batch, ``k`` micro-batches per step."""
    rows = []
    for strategy, k in o["scaling_configs"]:
        model = _model(o)
        fwd, opt, nosync = build(strategy, model, o)
        timer = CommTimer().install() if world > 1 else None
        if timer is not None:
            timer.active = True
        try:
            r = timed_steps(fwd, opt, nosync, o, rank, world, k=k, timer=timer)
        finally:
            if timer is not None:
                timer.active = False
                timer.uninstall()
        rows.append({"ranks": world, "strategy": strategy, "accumulation": k,
                     "step_s": r["step"], "exposed_comm_s": r["comm_wait"] if timer else 0.0,
                     "samples_per_step": world * k * o["batch_per_rank"],
                     "loss_last": r["loss_last"]})
        del fwd, opt, model
    return rows


def comm_volume(o: dict, rank: int, world: int) -> dict:
    """Bytes per rank per step through each collective (fp32), BucketedDDP vs ZeRO-1/2/3."""
    out = {}
    for strategy in ("ddp", "zero1", "zero2", "zero3"):
        model = _model(o)
        fwd, opt, nosync = build(strategy, model, o)
        amp = _amp("fp32")
        _train_step(fwd, opt, nosync, _micro_batches(o, 0, rank, world, 1), amp)  # warm-up
        vol = CommVolume().install()
        vol.active = True
        try:
            _train_step(fwd, opt, nosync, _micro_batches(o, 1, rank, world, 1), amp)
        finally:
            vol.active = False
            vol.uninstall()
        c = vol.counts()
        out[strategy] = {"source": c["source"],
                         **{k: c[k] for k in ("all_reduce", "reduce_scatter", "all_gather")},
                         "hook_equals_dist": all(c["hook"][k] == c["dist"][k]
                                                 for k in ("all_reduce", "reduce_scatter",
                                                           "all_gather"))
                         if c["source"] == "issue_hook" else None}
        del fwd, opt, model
    return out


def profiled_step(o: dict, rank: int, world: int, trace_path: str | None) -> dict:
    """One BucketedDDP step under ``torch.profiler``; every bucket's all-reduce is annotated at
    issue (``record_function``) and its completion time taken from its future. Rank 0 exports
    the Chrome trace to ``trace_path`` (the communication intervals are added to it by
    :func:`ringcomm.apps.train.report_page.annotate_trace`)."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    from .dist_patch import DistPatch
    model = _model(o)
    ddp, opt, nosync = build("ddp", model, o, bucket_mb=o["profile_bucket_mb"])
    amp = _amp("fp32")
    _train_step(ddp, opt, nosync, _micro_batches(o, 0, rank, world, 1), amp)   # warm-up
    ready = _ReadyTimes(model.parameters())
    events: list = []
    recording = {"on": False}

    def wrap(name, fn):
        if name != "all_reduce":
            return fn

        @functools.wraps(fn)
        def annotated(tensor, *args, **kwargs):
            if not recording["on"] or not kwargs.get("async_op"):
                return fn(tensor, *args, **kwargs)
            ev = {"bytes": tensor.numel() * tensor.element_size(), "issue": time.perf_counter()}
            with record_function(f"all_reduce issue bucket {len(events)} ({ev['bytes']} B)"):
                work = fn(tensor, *args, **kwargs)
            events.append(ev)

            def done(fut, ev=ev):
                ev["done"] = time.perf_counter()
                return fut.value() if hasattr(fut, "value") else None
            work.get_future().then(done)
            return work
        return annotated

    patch = DistPatch(wrap).install()
    x, y = _micro_batches(o, 1, rank, world, 1)[0]
    _barrier(world)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            recording["on"] = True
            t0 = time.perf_counter()
            with record_function("forward"):
                loss = ddp(x, y)
            t1 = time.perf_counter()
            with record_function("backward (incl. the gradient synchronisation)"):
                loss.backward()
            t2 = time.perf_counter()
            with record_function("optimizer step"):
                opt.step()
            opt.zero_grad(set_to_none=True)
            recording["on"] = False
    finally:
        patch.uninstall()
        ready.remove()
    deadline = time.perf_counter() + 10.0
    while any("done" not in ev for ev in events) and time.perf_counter() < deadline:
        time.sleep(0.001)
    bwd_end = max(ready.t.values())
    total = sum(ev["done"] - ev["issue"] for ev in events if "done" in ev)
    before = sum(max(0.0, min(ev["done"], bwd_end) - ev["issue"]) for ev in events
                 if "done" in ev)
    out = {"buckets": len(events), "bucket_cap_mb": o["profile_bucket_mb"],
           "issued_before_backward_end": sum(ev["issue"] < bwd_end for ev in events),
           "overlap_fraction": before / total if total > 0 else 0.0,
           "comm_s": total, "forward_s": t1 - t0, "backward_s": t2 - t1,
           "backward_compute_s": bwd_end - t1,
           "events": [{"bytes": ev["bytes"], "issue_s": ev["issue"] - t0,
                       "done_s": ev.get("done", float("nan")) - t0} for ev in events],
           "backward_end_s": bwd_end - t0, "backward_start_s": t1 - t0}
    if rank == 0 and trace_path:
        prof.export_chrome_trace(trace_path)
        out["trace"] = trace_path
    del ddp, opt, model
    return out


# ============================================================================ rank entry points
def report_rank_main(rank: int, world: int, o: dict, store_path: str, sections: list,
                     trace_path: str | None) -> dict:
    """A spawned rank: pin, join the process group, run ``sections`` in order."""
    import torch.distributed as dist
    core = pin_to_core(rank)
    torch.set_num_threads(o["threads"])
    if o["backend"] == "ringcomm":
        import ringcomm.torch  # noqa: F401
    dist.init_process_group(o["backend"], init_method="file://" + store_path, rank=rank,
                            world_size=world)
    out = {"world": world, "cores_per_rank": _gather_cores(core, world)}
    try:
        for name in sections:
            t0 = time.perf_counter()
            if rank == 0 and not o.get("quiet"):
                print(f"ringcomm.apps.train --report:   {world} ranks: {name} ...", file=sys.stderr,
                      flush=True)
            if name == "memory":
                out[name] = memory_budget(o, rank, world)
            elif name == "probe":
                out[name] = probe_latency_bandwidth(o, world)
            elif name == "buckets":
                out[name] = bucket_sweep(o, rank, world)
            elif name == "recompute":
                out[name] = recompute_cost(o, rank, world)
            elif name == "scaling":
                out[name] = scaling_rows(o, rank, world)
            elif name == "volume":
                out[name] = comm_volume(o, rank, world)
            elif name == "profile":
                out[name] = profiled_step(o, rank, world, trace_path)
            else:
                raise ValueError(f"unknown report section {name!r}")
            out.setdefault("seconds", {})[name] = time.perf_counter() - t0
    finally:
        dist.destroy_process_group()
    return out if rank == 0 else {}


def _gather_cores(core, world: int) -> list:
    """Every rank's core (-1: not pinned), in rank order."""
    import torch.distributed as dist
    t = torch.zeros(world, dtype=torch.float64)
    t[dist.get_rank()] = float(core if core is not None else -1)
    dist.all_reduce(t)
    return [int(v) for v in t.tolist()]


def baseline(o: dict) -> list:
    """The single-process reference of the scaling section, in this process: pinned to one core
    with the ranks' thread count, each ``k`` of ``o["baseline_accumulation"]``."""
    saved = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    saved_threads = torch.get_num_threads()
    core = pin_to_core(0)
    torch.set_num_threads(o["threads"])
    rows = []
    try:
        for k in o["baseline_accumulation"]:
            model = _model(o)
            fwd, opt, nosync = build("single", model, o)
            r = timed_steps(fwd, opt, nosync, o, 0, 1, k=k)
            rows.append({"ranks": 1, "strategy": "single", "accumulation": k, "core": core,
                         "step_s": r["step"], "forward_s": r["forward"], "exposed_comm_s": 0.0,
                         "samples_per_step": k * o["batch_per_rank"],
                         "loss_last": r["loss_last"]})
    finally:
        torch.set_num_threads(saved_threads)
        if saved is not None:
            os.sched_setaffinity(0, saved)
    return rows
