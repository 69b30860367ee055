"""Train the training demo's transformer (:mod:`ringcomm.apps.tiny_lm`) with tensor, pipeline and data x tensor parallelism.

    python -m ringcomm.apps.train --parallel tp=2                  # 2 ranks, heads and MLP split
    python -m ringcomm.apps.train --parallel pp=2 --microbatches 4 # 2 stages, 1F1B
    python -m ringcomm.apps.train --parallel dp=2,tp=2             # 4 ranks
    python -m ringcomm.apps.parallel_demo --parallel tp=2 --parallel pp=2 --quick

Every configuration trains :class:`ringcomm.apps.tiny_lm.TinyLM` from the same initial weights on the same
batches (``ringcomm.apps.tiny_lm.make_batch``) with AdamW, in fp32, and is compared step by step with one
process training the unsplit model: the run exits with status 1 if a loss curve deviates by more
than ``TOLERANCE`` (relative; the splits change only the order of floating-point sums).

* ``tp=n``: every block's attention is split by heads (:class:`ringcomm.training.tp.ParallelSelfAttention`)
  and its MLP by columns then rows (:class:`ringcomm.training.tp.ParallelMLP`); embeddings, LayerNorms and
  the output head are replicated (their gradients are identical on every rank of the group).
* ``pp=p``: stage ``s`` holds blocks ``[s L/p, (s+1) L/p)``; the first also the embeddings, the last
  the final LayerNorm, the head and the loss (:class:`ringcomm.training.pp.Pipeline`, ``--schedule``,
  ``--microbatches``).
* ``dp=d``: the batch is split over ``d`` replicas whose gradients are averaged by one all-reduce
  of a flat buffer per step over the data-parallel group (combined with ``tp``:
  :func:`ringcomm.training.tp.make_groups`).

Reported: loss deviation from the single process, steps/s (1 / median step time of the slowest
rank, after ``--warmup`` steps), tokens/s, and per rank the bytes of parameters, gradients, AdamW
states and the peak of activations saved for backward (measured on tensors at the last warm-up
step; for a pipeline, the stage's peak over its micro-batches), plus the pipeline's measured idle
fraction beside ``(p - 1) / (m + p - 1)``.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from .tiny_lm import TinyLM, add_model_arguments, make_batch

__all__ = ["main", "parse_layout", "TOLERANCE"]

TOLERANCE = 1e-4
AXES = ("dp", "tp", "pp")


# ============================================================================ layout
def parse_layout(spec: str) -> dict:
    """``"dp=2,tp=2"`` -> ``{"dp": 2, "tp": 2, "pp": 1}`` (supported: dp x tp, or pp alone)."""
    out = {a: 1 for a in AXES}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, val = item.partition("=")
        if not sep or name not in AXES or not val.isdigit() or int(val) < 1:
            raise ValueError(f"bad --parallel item {item!r} (expected dp=N, tp=N or pp=N)")
        out[name] = int(val)
    if out["pp"] > 1 and (out["tp"] > 1 or out["dp"] > 1):
        raise ValueError(f"{spec!r}: pipeline parallelism runs alone here (pp=N)")
    return out


def _world(layout: dict) -> int:
    return layout["dp"] * layout["tp"] * layout["pp"]


def _name(layout: dict) -> str:
    return ",".join(f"{a}={layout[a]}" for a in AXES if layout[a] > 1) or "dp=1"


# ============================================================================ models
class TPBlock(nn.Module):
    """``ringcomm.apps.tiny_lm.Block`` with its attention split by heads and its MLP column-then-row."""

    def __init__(self, block: nn.Module, group):
        super().__init__()
        from ..training import tp
        d = block.qkv.in_features
        self.ln1, self.ln2 = block.ln1, block.ln2
        self.attn = tp.ParallelSelfAttention(d, block.n_heads, group=group).load_dense(block)
        self.mlp = tp.from_dense(nn.Sequential(block.fc, nn.GELU(), block.out), group=group)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class _FirstStage(nn.Module):
    def __init__(self, lm, blocks):
        super().__init__()
        self.tok, self.pos, self.blocks = lm.tok, lm.pos, nn.ModuleList(blocks)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return x


class _MiddleStage(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class _LastStage(nn.Module):
    def __init__(self, lm, blocks, first=None):
        super().__init__()
        self.first = first            # the embeddings too, when there is a single stage
        self.blocks, self.ln_f, self.head = nn.ModuleList(blocks), lm.ln_f, lm.head

    def forward(self, x):
        if self.first is not None:
            x = self.first(x)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def _lm_loss(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def pipeline_stages(lm: nn.Module, p: int) -> list:
    """Split a TinyLM into ``p`` stage modules (sharing its parameters)."""
    n = len(lm.blocks)
    if n % p:
        raise ValueError(f"{n} blocks do not split into {p} equal stages")
    per = n // p
    chunks = [list(lm.blocks[s * per:(s + 1) * per]) for s in range(p)]
    if p == 1:
        return [_LastStage(lm, [], first=_FirstStage(lm, chunks[0]))]
    return ([_FirstStage(lm, chunks[0])] + [_MiddleStage(c) for c in chunks[1:-1]]
            + [_LastStage(lm, chunks[-1])])


# ============================================================================ measurement
def _nbytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        if s._cdata not in seen:
            seen.add(s._cdata)
            total += s.nbytes()
    return total


def _state_bytes(params, opt) -> dict:
    return {"params": _nbytes(params), "grads": _nbytes(p.grad for p in params),
            "optim": _nbytes(t for st in opt.state.values() for t in st.values()
                             if isinstance(t, torch.Tensor))}


def _meter(module, *batch):
    """Saved-for-backward bytes, excluding the parameters and the batch (as the pipeline's)."""
    from ..training.pp import SavedTensorMeter
    meter = SavedTensorMeter(exclude=module)
    for t in batch:
        meter.exclude.add(t.untyped_storage()._cdata)
    return meter


def _median(xs):
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2 if s else float("nan")


# ============================================================================ one rank
def _model(o: dict):
    torch.manual_seed(o["seed"])
    return TinyLM(o["vocab"], o["d_model"], o["layers"], o["heads"], o["seq_len"])


def _batch(o: dict, step: int):
    return make_batch(o, step)


def train_single(o: dict) -> dict:
    """The reference: one process, the unsplit model, the whole batch."""
    lm = _model(o)
    opt = torch.optim.AdamW(lm.parameters(), lr=o["lr"], weight_decay=o["weight_decay"])
    losses, times, mem = [], [], {}
    for step in range(o["steps"]):
        x, y = _batch(o, step)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with _meter(lm, x, y) as meter:
            loss = lm(x, y)
            loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if step == max(o["warmup"] - 1, 0):
            mem = dict(_state_bytes(list(lm.parameters()), opt), act=meter.peak)
        if step >= o["warmup"]:
            times.append(dt)
        losses.append(float(loss.detach()))
    return {"losses": losses, "step_times": times, "mem": [mem], "bubble": None}


def _rank_main(rank: int, world_size: int, layout: dict, o: dict, store_path: str) -> dict:
    import torch.distributed as dist
    torch.set_num_threads(o["threads"])
    if o["backend"] == "ringcomm":
        import ringcomm.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(o["backend"], init_method="file://" + store_path, rank=rank,
                            world_size=world_size)
    try:
        return (_run_pipeline if layout["pp"] > 1 else _run_dp_tp)(rank, layout, o)
    finally:
        dist.destroy_process_group()


def _gather_results(losses, times, mem, bubble=None) -> dict:
    """Rank 0 gets: mean loss per step as computed by the loss-holding ranks (passed in; None
    elsewhere), slowest rank per step, each rank's memory."""
    import torch.distributed as dist
    ws = dist.get_world_size()
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    keys = ("params", "grads", "optim", "act")
    m = torch.zeros(ws, len(keys) + 1, dtype=torch.float64)
    for i, k in enumerate(keys):
        m[dist.get_rank(), i] = mem[k]
    m[dist.get_rank(), -1] = -1.0 if bubble is None else bubble
    dist.all_reduce(m)
    return {"losses": losses, "step_times": t.tolist(),
            "mem": [{k: int(m[r, i]) for i, k in enumerate(keys)} for r in range(ws)],
            "bubble": [float(v) for v in m[:, -1]] if bubble is not None else None}


def _run_dp_tp(rank: int, layout: dict, o: dict) -> dict:
    import torch.distributed as dist

    from ..training import tp
    groups = tp.make_groups(layout["tp"])
    lm = _model(o)
    if layout["tp"] > 1:
        for i, blk in enumerate(lm.blocks):
            lm.blocks[i] = TPBlock(blk, groups.tp)
    params = list(lm.parameters())
    opt = torch.optim.AdamW(params, lr=o["lr"], weight_decay=o["weight_decay"])
    dp = layout["dp"]
    b = o["global_batch"] // dp
    lo = groups.dp_rank * b
    losses, times, mem = [], [], {}
    for step in range(o["steps"]):
        x, y = _batch(o, step)
        x, y = x[lo:lo + b], y[lo:lo + b]
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with _meter(lm, x, y) as meter:
            loss = lm(x, y)
            loss.backward()
        if dp > 1:
            # One flat all-reduce of every gradient over the replicas of this shard.
            grads = [p.grad for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=groups.dp)
            flat /= dp
            off = 0
            for g in grads:
                g.copy_(flat[off:off + g.numel()].view_as(g))
                off += g.numel()
        opt.step()
        dt = time.perf_counter() - t0
        if step == max(o["warmup"] - 1, 0):
            mem = dict(_state_bytes(params, opt), act=meter.peak)
        if step >= o["warmup"]:
            times.append(dt)
        lt = loss.detach().double().reshape(1)
        if dp > 1:
            dist.all_reduce(lt, group=groups.dp)
            lt /= dp
        losses.append(float(lt))
    return _gather_results(losses, times, mem)


def _run_pipeline(rank: int, layout: dict, o: dict) -> dict:
    import torch.distributed as dist

    from ..training.pp import Pipeline
    p = layout["pp"]
    lm = _model(o)
    pipe = Pipeline(pipeline_stages(lm, p), schedule=o["schedule"],
                    microbatches=o["microbatches"], loss_fn=_lm_loss)
    params = list(pipe.module.parameters())
    opt = torch.optim.AdamW(params, lr=o["lr"], weight_decay=o["weight_decay"])
    losses, times, mem, bubbles = [], [], {}, []
    for step in range(o["steps"]):
        x, y = _batch(o, step)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = pipe.step(x if pipe.is_first else None, y if pipe.is_last else None)
        opt.step()
        dt = time.perf_counter() - t0
        if step == max(o["warmup"] - 1, 0):
            mem = dict(_state_bytes(params, opt), act=pipe.stats["peak_saved_bytes"])
        if step >= o["warmup"]:
            times.append(dt)
            bubbles.append(pipe.stats["bubble"])
        # The loss lives on the last stage; every rank learns it (for rank 0's report).
        lt = torch.zeros(1, dtype=torch.float64)
        if loss is not None:
            lt += float(loss)
        dist.all_reduce(lt)
        losses.append(float(lt))
    bubble = sum(bubbles) / len(bubbles) if bubbles else float("nan")
    return _gather_results(losses, times, mem, bubble)


# ============================================================================ driver
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ringcomm.apps.train --parallel",
        description="Tensor / pipeline / data x tensor parallel training of ringcomm.apps.train's "
                    "transformer, checked against one process.")
    p.add_argument("--parallel", action="append", required=True, metavar="LAYOUT",
                   help="dp=N,tp=N | pp=N (repeat for several configurations)")
    p.add_argument("--backend", default="ringcomm", help="torch.distributed backend")
    p.add_argument("--quick", action="store_true", help="a smaller model, fewer steps")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b"))
    p.add_argument("--microbatches", type=int, default=4)
    add_model_arguments(p)
    p.add_argument("--batch", type=int, default=None, help="global batch (sequences)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--timeout", type=float, default=900, help="seconds for the ranks")
    return p


def _options(args) -> dict:
    dflt = (dict(vocab=64, d_model=32, layers=2, heads=4, seq_len=32, batch=8, steps=8, warmup=2)
            if args.quick else
            dict(vocab=128, d_model=64, layers=4, heads=4, seq_len=64, batch=16, steps=20,
                 warmup=3))
    o = {k: (getattr(args, k) if getattr(args, k, None) is not None else v)
         for k, v in dflt.items()}
    o["warmup"] = min(o["warmup"], max(o["steps"] - 1, 0))
    o.update(seed=args.seed, lr=args.lr, weight_decay=args.weight_decay, threads=args.threads,
             backend=args.backend, schedule=args.schedule, microbatches=args.microbatches,
             global_batch=o.pop("batch"))
    return o


def _kib(n: int) -> str:
    return f"{n / 1024:.1f}"


def _report(rows: list, o: dict) -> str:
    lines = []
    hdr = (f"{'config':<12} {'ranks':>5} {'loss dev':>9} {'ok':>3} {'steps/s':>8} "
           f"{'tokens/s':>9} {'bubble':>7} {'formula':>7}")
    lines += [hdr, "-" * len(hdr)]
    for r in rows:
        bub = (f"{sum(r['bubble']) / len(r['bubble']):7.3f}" if r.get("bubble") else
               f"{'-':>7}")
        form = f"{r['formula']:7.3f}" if r.get("formula") is not None else f"{'-':>7}"
        lines.append(f"{r['name']:<12} {r['ranks']:>5} {r['loss_dev']:9.1e} "
                     f"{'yes' if r['ok'] else 'NO':>3} {r['steps_per_s']:8.2f} "
                     f"{r['tokens_per_s']:9.0f} {bub} {form}")
    lines.append("")
    hdr = (f"{'config':<12} {'rank':>4} {'params KiB':>10} {'grads KiB':>9} {'optim KiB':>9} "
           f"{'act peak KiB':>12} {'total KiB':>9}")
    lines += [hdr, "-" * len(hdr)]
    for r in rows:
        for q, m in enumerate(r["mem"]):
            tot = m["params"] + m["grads"] + m["optim"] + m["act"]
            lines.append(f"{r['name']:<12} {q:>4} {_kib(m['params']):>10} {_kib(m['grads']):>9} "
                         f"{_kib(m['optim']):>9} {_kib(m['act']):>12} {_kib(tot):>9}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        layouts = [parse_layout(s) for s in args.parallel]
    except ValueError as e:
        raise SystemExit(str(e))
    o = _options(args)
    for lay in layouts:
        if o["global_batch"] % lay["dp"]:
            raise SystemExit(f"--batch {o['global_batch']} is not divisible by dp={lay['dp']}")
        if o["heads"] % lay["tp"] or (4 * o["d_model"]) % lay["tp"]:
            raise SystemExit(f"heads {o['heads']} / MLP width {4 * o['d_model']} are not "
                             f"divisible by tp={lay['tp']}")
        if o["layers"] % lay["pp"]:
            raise SystemExit(f"--layers {o['layers']} is not divisible by pp={lay['pp']}")
        if lay["pp"] > 1 and o["global_batch"] < o["microbatches"]:
            raise SystemExit(f"--batch {o['global_batch']} < --microbatches {o['microbatches']}")
    if o["backend"] == "ringcomm":
        try:
            import ringcomm.torch  # noqa: F401
        except Exception as e:  # noqa: BLE001 - the documented fallback
            print(f"notice: the ringcomm backend is not importable ({type(e).__name__}: {e}); "
                  f"using gloo", flush=True)
            o["backend"] = "gloo"
    torch.set_num_threads(o["threads"])
    print(f"ringcomm parallel demo: {', '.join(_name(lay) for lay in layouts)} on backend "
          f"'{o['backend']}', {o['steps']} steps ({o['warmup']} warm-up), model d={o['d_model']} "
          f"L={o['layers']} heads={o['heads']} seq={o['seq_len']} vocab={o['vocab']}, global batch "
          f"{o['global_batch']}, fp32 AdamW", flush=True)
    t_start = time.perf_counter()
    ref = train_single(o)
    ref.update(name="single", ranks=1, formula=None)
    rows = [ref]
    from ..core.launch import LaunchError, spawn_with_store
    import ringcomm.apps.parallel_demo as this   # the ranks import this module by name
    for lay in layouts:
        try:
            res = spawn_with_store(this._rank_main, _world(lay), lambda store: (lay, o, store),
                                   timeout=args.timeout, prefix="ringcomm-parallel-")[0]
        except LaunchError as e:
            print(f"{_name(lay)}: the distributed run failed: {e}", file=sys.stderr)
            return 2
        res.update(name=_name(lay), ranks=_world(lay),
                   formula=((lay["pp"] - 1) / (o["microbatches"] + lay["pp"] - 1)
                            if lay["pp"] > 1 else None))
        rows.append(res)
    ok_all = True
    tokens = o["global_batch"] * o["seq_len"]
    for r in rows:
        r["loss_dev"] = max(abs(a - b) / max(abs(b), 1e-12)
                            for a, b in zip(r["losses"], ref["losses"]))
        r["ok"] = r["loss_dev"] <= TOLERANCE and all(map(math.isfinite, r["losses"]))
        ok_all &= r["ok"]
        med = _median(r["step_times"])
        r["steps_per_s"] = 1.0 / med if med > 0 else float("nan")
        r["tokens_per_s"] = tokens * r["steps_per_s"]
    wall = time.perf_counter() - t_start
    print()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  host {platform.node()}  "
          f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)  "
          f"torch {torch.__version__}  backend {o['backend']}")
    print(f"# command: python -m ringcomm.apps.train {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(_report(rows, o))
    print()
    print(f"loss dev = max over steps of |loss - single| / single (tolerance {TOLERANCE:g}); "
          f"steps/s = 1 / median step time of the slowest rank (after {o['warmup']} warm-up "
          f"steps); bubble = measured idle fraction of the pipeline step (mean over stages and "
          f"timed steps), formula = (p - 1) / (m + p - 1) with m = {o['microbatches']} "
          f"({o['schedule']}); memory measured on tensors at step {max(o['warmup'] - 1, 0)}: "
          f"act peak = peak bytes saved for backward. total {wall:.1f} s")
    print("loss curves: all match the single-process run" if ok_all else
          "loss curves: MISMATCH for " + ", ".join(r["name"] for r in rows if not r["ok"]))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
