"""Train a small transformer language model with every data-parallel strategy and compare them.

    python -m ringcomm.train --quick                  # < 2 minutes on 2 cores
    python -m ringcomm.train --world-size 2 --backend ringcomm --plot out.png --json out.json

Configurations: ``single`` (one process, the reference), ``torch_ddp`` (torch's
DistributedDataParallel), ``bucketed_ddp`` (:class:`ringcomm.ddp.BucketedDDP`), ``zero1``,
``zero2``, ``zero3`` (from ``ringcomm.zero``; skipped with a notice if it is missing), each with and
without activation recomputation (:func:`ringcomm.recompute.checkpoint` around every transformer
block) and in fp32 or bf16 (CPU autocast; parameters, gradients and optimizer states stay fp32).

Every configuration trains from the same initial weights on the same synthetic token stream with
the same global batch (each of the ``--world-size`` ranks takes its slice), so each loss curve must
match the single-process curve of the same precision to a tolerance; the run exits with status 1
if one does not.

Reported per configuration:

* **steps/s** = 1 / the median time of the timed steps (after ``--warmup``), each step timed on
  its slowest rank (the median resists the preemption spikes of a busy machine; the mean-based
  figure is in the JSON as ``steps_per_s_mean``);
* **scaling efficiency** = steps/s / (world size x steps/s of the single process with the same
  precision and recomputation), i.e. throughput per rank relative to one process (strong scaling
  at a fixed global batch; each process uses ``--threads`` threads);
* **comm %** = time spent waiting in collectives / wall time, mean over ranks. It is measured by
  wrapping the ``torch.distributed`` collectives (synchronous calls are timed whole, async calls'
  ``Work.wait()`` is timed). torch DDP issues its collectives from its C++ reducer, out of reach
  of the wrapper; for it the figure is the time from the last gradient becoming ready to
  ``backward()`` returning (the reducer's wait for the outstanding buckets);
* **memory per rank**, measured on tensors at one step (the last warm-up step): parameters (unique
  storages of the module's parameters), gradients (of ``.grad`` / gradient buckets / gradient
  shards), optimizer states (tensors in the optimizer state, plus master copies), and activations
  (peak bytes alive among the tensors saved for backward, counted with
  ``torch.autograd.graph.saved_tensors_hooks``; with recomputation this includes the recomputed
  block's transient tensors) - beside the formulas of :mod:`ringcomm.memory`
  (``zero_memory_per_device`` for the model states, i.e. the 16 bytes/parameter mixed-precision
  Adam budget split by ZeRO stage, and ``activation_memory_bytes`` of Korthikanti et al.). Note
  that fp32 AdamW also costs 16 bytes/parameter but split 4 + 4 + 8 (no master copy) instead of the
  formula's 2 + 2 + 12.

The figures go to a table on stdout, a PNG (``--plot``: loss curves and memory bars) and
optionally a JSON file (``--json``).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["main", "TinyLM", "STRATEGIES", "ActivationMeter", "CommTimer", "model_state_bytes"]

STRATEGIES = ("single", "torch_ddp", "bucketed_ddp", "zero1", "zero2", "zero3")
PRECISIONS = ("fp32", "bf16")
# Loss curves vs the single process: max |loss - loss_single| / loss_single over all steps.
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}


# ============================================================================ model and data
class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention + 4x GELU MLP."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    """A GPT-style language model; ``forward(idx, targets)`` returns the mean cross-entropy."""

    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int, seq_len: int,
                 recompute: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.recompute = recompute

    def forward(self, idx, targets):
        from .recompute import checkpoint
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = checkpoint(blk, x) if self.recompute else blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_batch(o: dict, step: int):
    """The global batch of ``step``: a noisy Markov chain over the vocabulary (learnable)."""
    g = torch.Generator().manual_seed(o["seed"] * 1_000_003 + 17)
    table = torch.randperm(o["vocab"], generator=g)          # the "grammar": next = table[prev]
    g.manual_seed(o["seed"] * 1_000_003 + 1000 + step)
    n, t = o["global_batch"], o["seq_len"] + 1
    seq = torch.empty(n, t, dtype=torch.long)
    seq[:, 0] = torch.randint(o["vocab"], (n,), generator=g)
    noise = torch.rand(n, t, generator=g) < 0.1
    rand = torch.randint(o["vocab"], (n, t), generator=g)
    for i in range(1, t):
        seq[:, i] = torch.where(noise[:, i], rand[:, i], table[seq[:, i - 1]])
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


# ============================================================================ measurement
def _storage(t: torch.Tensor):
    # Keyed by the StorageImpl (stable across resize_, unlike data_ptr, so that ZeRO-3's
    # resized-to-0 parameter storages are recognised), counted at its current size.
    s = t.untyped_storage()
    return s._cdata, s.nbytes()


class _Saved:
    __slots__ = ("t", "key", "meter", "__weakref__")

    def __init__(self, t, key, meter):
        self.t, self.key, self.meter = t, key, meter

    def __del__(self):
        self.meter._release(self.key)


class ActivationMeter:
    """Peak bytes alive among tensors saved for backward (unique storages, parameters excluded).

    ``with meter: loss = model(...); loss.backward()`` -- autograd frees a saved tensor when its
    node is released, which drops our holder and decrements the live count.
    """

    def __init__(self, exclude: nn.Module | None = None):
        self.exclude = set()
        if exclude is not None:
            self.exclude = {_storage(p)[0] for p in exclude.parameters()}
        self.live: dict = {}
        self.current = 0
        self.peak = 0

    def _pack(self, t):
        key, nbytes = _storage(t)
        if key in self.exclude or nbytes == 0:
            return t
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = [1, nbytes]
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        else:
            entry[0] += 1
        return _Saved(t, key, self)

    def _release(self, key):
        entry = self.live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            del self.live[key]
            self.current -= entry[1]

    @staticmethod
    def _unpack(h):
        return h.t if isinstance(h, _Saved) else h

    def __enter__(self):
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


_OPT_ATTRS = ("optimizer", "optim", "inner", "_optimizer", "base_optimizer", "inner_optimizer")


def _optimizers(opt):
    seen, stack = [], [opt]
    while stack:
        o = stack.pop()
        if o is None or any(o is s for s in seen):
            continue
        seen.append(o)
        for a in _OPT_ATTRS:
            sub = getattr(o, a, None)
            if isinstance(sub, torch.optim.Optimizer):
                stack.append(sub)
    return seen


def _tensors(obj, depth=0):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 4 and isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, depth + 1)
    elif depth < 4 and isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, depth + 1)


def model_state_bytes(module: nn.Module, optimizer=None, extra: dict | None = None) -> dict:
    """Bytes of parameters, gradients and optimizer states, counting each storage once.

    ``extra`` maps a category to more tensors to count (e.g. gradient buckets). An optimizer (or
    wrapper) with ``memory_breakdown()`` (``ringcomm.zero``) reports its own sharded tensors; its
    fp32 ``master_weights`` count as optimizer states, as in the 2 + 2 + 12 budget.
    """
    for obj in (optimizer, module):
        if hasattr(obj, "memory_breakdown"):
            mb = obj.memory_breakdown()
            return {"params": int(mb.get("params", 0)), "grads": int(mb.get("grads", 0)),
                    "optimizer_states": int(mb.get("optimizer_states", 0))
                    + int(mb.get("master_weights", 0))}
    out = {"params": 0, "grads": 0, "optimizer_states": 0}
    seen: set = set()

    def add(cat, t):
        if not isinstance(t, torch.Tensor):
            return
        key, nbytes = _storage(t)
        if key in seen:
            return
        seen.add(key)
        out[cat] += nbytes

    for p in module.parameters():
        add("params", p)
    for p in module.parameters():
        add("grads", p.grad)
    for cat, ts in (extra or {}).items():
        for t in _tensors(ts):
            add(cat, t)
    for opt in _optimizers(optimizer):
        for group in getattr(opt, "param_groups", []):
            for p in group["params"]:
                add("grads", p.grad)
        for group in getattr(opt, "param_groups", []):
            for p in group["params"]:
                add("optimizer_states", p)   # a master copy, if not the module's own storage
        for state in getattr(opt, "state", {}).values():
            for t in _tensors(state):
                add("optimizer_states", t)
    return out


class CommTimer:
    """Wraps the torch.distributed collectives to time the waits on them.

    Synchronous calls are timed whole; an async call's launch is timed and its ``Work`` is
    wrapped so that ``wait()`` is timed too. Only counts while ``active``.
    """

    NAMES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "reduce_scatter",
             "reduce_scatter_single", "all_gather_single", "all_gather", "broadcast", "reduce",
             "all_to_all_single", "all_to_all", "scatter", "gather", "_reduce_scatter_base",
             "_all_gather_base", "barrier")
    #: Modules whose module-level aliases of these functions (``_fn = dist.all_gather_...``,
    #: bound at import) are wrapped too.
    ALIAS_MODULES = ("ringcomm.zero",)

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0
        self.active = False
        self._saved: list = []

    def install(self):
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        wrapped = {}
        for name in self.NAMES:
            for mod in (dist, c10d):
                fn = getattr(mod, name, None)
                if fn is None or getattr(fn, "_ringcomm_timed", False):
                    continue
                if id(fn) not in wrapped:
                    wrapped[id(fn)] = (fn, self._wrap(fn))
                self._saved.append((mod, name, fn))
                setattr(mod, name, wrapped[id(fn)][1])
        for modname in self.ALIAS_MODULES:
            mod = sys.modules.get(modname)
            for name, val in list(vars(mod).items()) if mod is not None else ():
                if callable(val) and id(val) in wrapped and wrapped[id(val)][0] is val:
                    self._saved.append((mod, name, val))
                    setattr(mod, name, wrapped[id(val)][1])
        return self

    def uninstall(self):
        for mod, name, fn in reversed(self._saved):
            setattr(mod, name, fn)
        self._saved.clear()

    def _wrap(self, fn):
        timer = self

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            work = fn(*args, **kwargs)
            if timer.active:
                timer.seconds += time.perf_counter() - t0
                timer.calls += 1
            if work is not None and hasattr(work, "wait"):
                return _TimedWork(work, timer)
            return work
        timed._ringcomm_timed = True
        return timed


class _TimedWork:
    def __init__(self, work, timer):
        self._work, self._timer = work, timer

    def wait(self, *args, **kwargs):
        t0 = time.perf_counter()
        r = self._work.wait(*args, **kwargs)
        if self._timer.active:
            self._timer.seconds += time.perf_counter() - t0
        return r

    def __getattr__(self, name):
        return getattr(self._work, name)


class _GradTail:
    """For torch DDP: per backward, time from the last gradient ready to backward() returning."""

    def __init__(self, module):
        self.last = 0.0
        self.handles = [p.register_post_accumulate_grad_hook(self._ready)
                        for p in module.parameters() if p.requires_grad]

    def _ready(self, p):
        self.last = time.perf_counter()


# ============================================================================ strategies
class _Notices(list):
    def add(self, msg):
        if msg not in self:
            self.append(msg)


def _zero_module():
    try:
        from . import zero
        return zero, ""
    except Exception as e:  # noqa: BLE001 - a missing or half-written module: skip with notice
        return None, f"{type(e).__name__}: {e}"


def _zero3_factory(zero):
    obj = getattr(zero, "ZeroStage3", None)
    return ("ZeroStage3", obj) if obj is not None else (None, None)


def _build(strategy: str, model: nn.Module, o: dict, precision: str = "fp32"):
    """Returns (forward module, optimizer, extra tensors for the memory count or None).

    The ZeRO configurations in bf16 use ZeRO's own mixed precision (bf16 parameters and
    gradients, fp32 master shards and Adam states: the 2 + 2 + 12 budget) under the same CPU
    autocast as the others; the other strategies keep fp32 parameters under autocast."""
    kw = dict(lr=o["lr"], weight_decay=o["weight_decay"])
    if strategy == "single":
        return model, torch.optim.AdamW(model.parameters(), **kw), None
    if strategy == "torch_ddp":
        from torch.nn.parallel import DistributedDataParallel
        ddp = DistributedDataParallel(model, bucket_cap_mb=o["bucket_cap_mb"],
                                      gradient_as_bucket_view=True)
        return ddp, torch.optim.AdamW(ddp.parameters(), **kw), None
    if strategy == "bucketed_ddp":
        from .ddp import BucketedDDP
        ddp = BucketedDDP(model, bucket_cap_mb=o["bucket_cap_mb"],
                          first_bucket_mb=o["first_bucket_mb"])
        return ddp, torch.optim.AdamW(ddp.parameters(), **kw), {
            "grads": [b.buffer for b in ddp.buckets]}
    zero, err = _zero_module()
    if zero is None:
        raise RuntimeError(f"ringcomm.zero unavailable: {err}")
    mp = "bf16" if precision == "bf16" else None
    if strategy in ("zero1", "zero2"):
        zkw = dict(kw)
        if "bucket_cap_mb" in inspect.signature(zero.ZeroOptimizer).parameters:
            zkw["bucket_cap_mb"] = o["bucket_cap_mb"]   # the same buckets as the DDP variants
        opt = zero.ZeroOptimizer(model.parameters(), torch.optim.AdamW,
                                 stage=int(strategy[-1]), mixed_precision=mp, **zkw)
        return model, opt, None
    if strategy == "zero3":
        name, factory = _zero3_factory(zero)
        if factory is None:
            raise RuntimeError("ringcomm.zero has no stage-3 wrapper")
        wrapped = factory(model, torch.optim.AdamW, mixed_precision=mp, **kw)
        # ZeroStage3 is both the module and the optimizer (step(), zero_grad()).
        return wrapped, wrapped, None
    raise ValueError(f"unknown strategy {strategy!r}")


# ============================================================================ one configuration
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


# ============================================================================ report
def _formulas(row: dict, o: dict, world_size: int) -> dict:
    try:
        from . import memory
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


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


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
            _fmt_bytes(m["params"]), _fmt_bytes(m["grads"]), _fmt_bytes(m["optimizer_states"]),
            _fmt_bytes(m["activations_fwd"]), _fmt_bytes(m["activations"]), _fmt_bytes(total),
            _fmt_bytes(f.get("model_states")), _fmt_bytes(f.get("activations")),
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
    ax2.set_title("measured memory per rank vs ringcomm.memory formulas")
    ax2.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ============================================================================ main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ringcomm.train",
        description="Train a small transformer LM on synthetic data with single-process, torch "
                    "DDP, BucketedDDP and ZeRO-1/2/3, +- recomputation, fp32/bf16; compare loss "
                    "curves, throughput, communication time and memory.")
    p.add_argument("--world-size", type=int, default=2, help="local processes (default 2)")
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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--d-model", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--batch-per-rank", type=int, default=None,
                   help="samples per rank; the global batch is world-size times this")
    p.add_argument("--bucket-cap-mb", type=float, default=None)
    p.add_argument("--first-bucket-mb", type=float, default=None)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--timeout", type=float, default=900, help="seconds for the ranks")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
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


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--parallel" or a.startswith("--parallel=") for a in argv):
        from .parallel_demo import main as parallel_main   # tensor / pipeline parallel demo
        return parallel_main(argv)
    args = build_parser().parse_args(argv)
    if args.world_size < 1:
        raise SystemExit("--world-size must be >= 1")
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
        notices.add(f"notice: ringcomm.zero is not available ({err}); skipping "
                    f"{', '.join(wanted_zero)}")
        strategies = [s for s in strategies if not s.startswith("zero")]
    elif "zero3" in strategies and _zero3_factory(zero)[1] is None:
        notices.add("notice: ringcomm.zero has no stage-3 wrapper; skipping zero3")
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

    print(f"ringcomm.train: {len(singles)} single-process + {len(dists)} distributed "
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
        from .launch import LaunchError, spawn
        import ringcomm.train as this   # so the ranks import this module by name, not __main__
        tmp = tempfile.mkdtemp(prefix="ringcomm-train-")
        try:
            results = spawn(this._rank_main, args.world_size,
                            (o, dists, os.path.join(tmp, "store")), timeout=args.timeout)[0]
        except LaunchError as e:
            print(f"ringcomm.train: the distributed run failed: {e}", file=sys.stderr)
            return 2
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
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
          "'formula states' = ringcomm.memory.zero_memory_per_device (16 B/param "
          "mixed-precision Adam), 'formula act' = activation_memory_bytes (Korthikanti et al.). "
          "loss dev = max relative "
          f"deviation from the single-process curve (tolerance fp32 {TOLERANCE['fp32']:g}, "
          f"bf16 {TOLERANCE['bf16']:g}).")
    bad = [r["name"] for r in rows if not r["loss_ok"]]
    print("loss curves: all match the single-process run" if not bad else
          f"loss curves: MISMATCH for {', '.join(bad)}")

    title = (f"ringcomm.train: {args.world_size} ranks on {o['backend']}, psi={rows[0]['psi']:,}, "
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


if __name__ == "__main__":
    sys.exit(main())
