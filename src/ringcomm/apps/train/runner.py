"""Running configurations: one configuration on one rank (``run_config``), the reduction of
its figures across ranks, and the spawned ranks' entry point."""
from __future__ import annotations

import contextlib
import functools
import sys
import time

import torch

from ..tiny_lm import TinyLM, make_batch
from .comm_timer import CommTimer, _GradTail
from .memory_meters import ActivationMeter, model_state_bytes
from .strategies import _build

def _config_name(c: dict) -> str:
    return f"{c['strategy']}{'+rc' if c['recompute'] else ''}/{c['precision']}"


def run_config(c: dict, o: dict, rank: int, world_size: int, timer: CommTimer | None,
               pbar=None) -> dict:
    """Train one configuration on this rank; returns this rank's raw figures."""
    torch.manual_seed(o["seed"])
    model = TinyLM(o["vocab"], o["d_model"], o["layers"], o["heads"], o["seq_len"],
                   recompute=c["recompute"])
    psi = sum(p.numel() for p in model.parameters())
    fwd, opt, extra = _build(c["strategy"], model, o, c["precision"])
    tail = _GradTail(model) if c["strategy"] == "torch_ddp" else None
    amp = (functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
           if c["precision"] == "bf16" else contextlib.nullcontext)
    b = o["global_batch"] // world_size
    losses, mem, act_peak, act_fwd = [], None, 0, 0
    tail_seconds = 0.0
    elapsed = 0.0
    t0 = None
    step_times = []
    for step in range(o["steps"]):
        t_step = time.perf_counter()
        if step == o["warmup"]:
            if world_size > 1:
                import torch.distributed as dist
                dist.barrier()
            if timer is not None:
                timer.seconds, timer.calls, timer.active = 0.0, 0, True
            tail_seconds = 0.0
            t0 = time.perf_counter()
        x, y = make_batch(o, step)
        x, y = x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]
        measure = step == max(o["warmup"] - 1, 0)
        opt.zero_grad(set_to_none=True)
        meter = ActivationMeter(exclude=fwd) if measure else contextlib.nullcontext()
        with meter:
            with amp():
                loss = fwd(x, y)
            if measure:
                act_fwd = meter.current
            loss.backward()
        if tail is not None:
            tail_seconds += max(0.0, time.perf_counter() - tail.last)
        if measure:
            act_peak = meter.peak
            after_backward = model_state_bytes(model, opt, extra)
        opt.step()
        if measure:
            after_step = model_state_bytes(model, opt, extra)
            mem = {k: max(after_backward[k], after_step[k]) for k in after_step}
        losses.append(float(loss.detach()))
        if t0 is not None:
            step_times.append(time.perf_counter() - t_step)
        if pbar is not None:
            pbar.update(1)
    if t0 is not None:
        elapsed = time.perf_counter() - t0
    if timer is not None:
        timer.active = False
    timed = o["steps"] - o["warmup"]
    if tail is not None:
        comm = tail_seconds
    elif timer is not None:
        comm = timer.seconds
    else:
        comm = 0.0
    mem = dict(mem or {"params": 0, "grads": 0, "optimizer_states": 0})
    mem["activations"] = act_peak
    mem["activations_fwd"] = act_fwd
    return {"losses": losses, "elapsed": elapsed, "timed_steps": timed, "comm": comm,
            "mem": mem, "psi": psi, "local_batch": b, "step_times": step_times}


def _reduce_across_ranks(r: dict, rank: int, world_size: int) -> dict:
    """Mean loss curve, slowest rank's time, mean comm fraction, per-rank memory (max)."""
    import torch.distributed as dist
    losses = torch.tensor(r["losses"], dtype=torch.float64)
    dist.all_reduce(losses)
    losses /= world_size
    step_times = torch.tensor(r["step_times"], dtype=torch.float64)
    if step_times.numel():
        dist.all_reduce(step_times, op=dist.ReduceOp.MAX)   # a step ends on its slowest rank
    keys = ("params", "grads", "optimizer_states", "activations", "activations_fwd")
    row = torch.zeros(world_size, 2 + len(keys), dtype=torch.float64)
    row[rank, 0] = r["elapsed"]
    row[rank, 1] = r["comm"] / r["elapsed"] if r["elapsed"] > 0 else 0.0
    for i, k in enumerate(keys):
        row[rank, 2 + i] = r["mem"][k]
    dist.all_reduce(row)
    out = dict(r)
    out["losses"] = losses.tolist()
    out["step_times"] = step_times.tolist()
    out["elapsed"] = float(row[:, 0].max())
    out["comm_fraction"] = float(row[:, 1].mean())
    out["mem"] = {k: int(row[:, 2 + i].max()) for i, k in enumerate(keys)}
    out["mem_per_rank"] = [{k: int(row[q, 2 + i]) for i, k in enumerate(keys)}
                           for q in range(world_size)]
    return out


def _rank_main(rank: int, world_size: int, o: dict, configs: list, store_path: str) -> list:
    import torch.distributed as dist
    torch.set_num_threads(o["threads"])
    if o["backend"] == "ringcomm":
        import ringcomm.torch  # noqa: F401
    dist.init_process_group(o["backend"], init_method="file://" + store_path, rank=rank,
                            world_size=world_size)
    timer = CommTimer().install()
    pbar = _progress(o, sum(o["steps"] for _ in configs), f"{world_size} ranks",
                     enabled=rank == 0)
    results = []
    try:
        for c in configs:
            if pbar is not None:
                pbar.set_description(_config_name(c))
            r = run_config(c, o, rank, world_size, timer, pbar)
            results.append(_reduce_across_ranks(r, rank, world_size))
    finally:
        if pbar is not None:
            pbar.close()
        timer.uninstall()
        dist.destroy_process_group()
    return results if rank == 0 else []


def _progress(o, total, desc, enabled=True):
    if not enabled or o["no_progress"]:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, mininterval=0.5, leave=False, file=sys.stderr,
                dynamic_ncols=True)
