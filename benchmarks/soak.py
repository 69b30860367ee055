"""Soak test: 2-4 local ranks issue random collectives for a given time; every result is checked
exactly against numpy.

    python benchmarks/soak.py --minutes M --world N [--seed S] [--json out.json]
    python benchmarks/soak.py --world N --seed S --replay EPOCH:INDEX     # rerun one call

What runs:
- Ranks are spawned processes that stay alive for the whole run; each "epoch" (30-60 s, drawn
  from the seed) they close their communicator and create a new one (`ringcomm.init(...,
  init_method="file://...")`) after setting random RINGCOMM_SLOT_BYTES / NSLOTS / ALGO / STREAM
  values in their environment. Every rank derives the epoch's knobs and every call from the seed,
  so the ranks agree on what to call without talking.
- Call `i` is a function of (seed, i, world, the epoch's size cap) only: one collective (every kind,
  sync or async, numpy arrays or torch tensors), or a batch of async ones waited in random order.
  Inputs are functions of (seed, i, position in batch, rank), so every rank computes the numpy
  reference of the whole collective locally.
- Exactness: integers use their full range (wrap-around arithmetic is order-free). Floating
  reductions use small integer values (order-free and exact); AVG is the exact sum times the
  dtype's 1/n, rounded once, at the last combination. all_reduce SUM of float16/32/64 also runs on
  values where the order shows, against the documented combination order (docs/api.md,
  "Reproducible results"; tests/order_ref.py). Copies (broadcast, gathers, all_to_all,
  send/recv) carry random bit patterns. Inputs of out-of-place calls and non-root buffers must
  stay unchanged.
- Every rank exchanges a control word (all_reduce MAX) every few calls: rank 0's clock decides when
  an epoch or the run ends, and any rank's error count stops everyone.
- Reports every minute and at the end: calls per kind, bytes (the sum of every rank's input
  buffers), errors, max RSS per rank, peak /dev/shm use; at the end, that no ringcomm segment and
  no child process is left. Exits 1 on any error, printing the first failing call with its
  seed/epoch/index and a replay command.
Tiny slots make every hand-off cost a wake-up, so an epoch caps call sizes at 2048 slots (8 MiB
once slots are 4 KiB or larger).
"""
from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import math
import multiprocessing as mp
import os
import platform
import queue as queue_mod
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests")
sys.path.insert(0, os.path.abspath(_TESTS))
from order_ref import ordered_sum  # noqa: E402  (the all_reduce order model, written from the rule)

MAX_BYTES = 8 << 20
CTL_EVERY = 8                # calls between control words
REPORT_EVERY_S = 5.0         # ranks send their counters at most this often
FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int8", "uint8", "int32", "int64")
DTYPES = FLOATS + INTS + ("bool",)
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1,
            "int32": 4, "int64": 8, "bool": 1}
# numpy storage of each dtype: bfloat16 lives as its uint16 bit pattern on the numpy side.
NP_STORE = {"bfloat16": np.uint16}
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier",
         "all_to_all", "gather", "scatter", "send_recv")
KIND_WEIGHTS = (4, 2, 2, 1, 2, 0.5, 1.5, 1, 1, 1.5)
REDUCING = ("all_reduce", "reduce_scatter", "reduce")


def ops_for(dt):
    if dt == "bool":
        return ("MIN", "MAX")
    if dt in FLOATS:
        return ("SUM", "PRODUCT", "MIN", "MAX", "AVG")
    return ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def npdt(dt):
    return np.dtype(NP_STORE.get(dt, dt))


# ---- bfloat16 bit patterns <-> float32 ------------------------------------------------------------
def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f):
    """Round float32 to bfloat16 (nearest, ties to even); the values here are finite."""
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


# ---- the epoch's knobs and the call sequence (functions of the seed only) -------------------------
def epoch_knobs(seed, epoch):
    rng = np.random.default_rng([seed, 1, epoch])
    slot = int(round(math.exp(rng.uniform(math.log(64), math.log(2 << 20)))))
    if rng.random() < 0.3:
        slot = int(rng.choice([64, 256, 4096, 65536, 256 << 10, 1 << 20]))
    max_nslots = max(2, min(1024, (8 << 20) // slot))        # at most 8 MiB of slots per channel
    nslots = int(round(math.exp(rng.uniform(math.log(2), math.log(min(64, max_nslots) + 0.49)))))
    if rng.random() < 0.1:
        nslots = int(rng.integers(2, max_nslots + 1))
    nslots = max(2, min(nslots, max_nslots))
    nslots = 1 << (nslots.bit_length() - 1)                   # RINGCOMM_NSLOTS must be a power of two
    return {
        "RINGCOMM_SLOT_BYTES": str(slot),
        "RINGCOMM_NSLOTS": str(nslots),
        "RINGCOMM_ALGO": str(rng.choice(["auto", "ring", "direct"])),
        "RINGCOMM_STREAM": str(rng.choice(["auto", "on", "off"])),
    }


def epoch_seconds(seed, epoch, lo, hi):
    return float(np.random.default_rng([seed, 2, epoch]).uniform(lo, hi))


def size_cap(knobs):
    return min(MAX_BYTES, 2048 * int(knobs["RINGCOMM_SLOT_BYTES"]))


def draw_count(rng, itemsize, max_bytes, world):
    """Element count: 0, 1, small, or log-uniform bytes up to max_bytes, often not divisible by
    the world size."""
    r = rng.random()
    if r < 0.04:
        return 0
    if r < 0.08:
        return 1
    if r < 0.14:
        return int(rng.integers(2, 4 * world + 2))
    nbytes = math.exp(rng.uniform(0.0, math.log(max_bytes)))
    count = max(1, int(nbytes) // itemsize)
    if rng.random() < 0.5:
        count += int(rng.integers(1, world))
    return max(0, min(count, max_bytes // itemsize))


def split_count(rng, total, world):
    """`world` non-negative sizes summing to total."""
    if total == 0:
        return [0] * world
    cuts = np.sort(rng.integers(0, total + 1, world - 1))
    return [int(v) for v in np.diff(np.concatenate([[0], cuts, [total]]))]


def draw_op(rng, world, max_bytes, use_torch, kind=None):
    if kind is None:
        p = np.array(KIND_WEIGHTS) / sum(KIND_WEIGHTS)
        kind = str(rng.choice(KINDS, p=p))
    dts = DTYPES if use_torch else tuple(d for d in DTYPES if d != "bfloat16")
    dt = str(rng.choice(dts))
    s = {"kind": kind, "dtype": dt,
         "lib": "torch" if use_torch and (dt == "bfloat16" or rng.random() < 0.1) else "numpy"}
    if kind == "barrier":
        s.update(dtype=None, lib=None)
        return s
    isz = ITEMSIZE[dt]
    if kind in REDUCING:
        s["op"] = str(rng.choice(ops_for(dt)))
        # SUM of floats (not bfloat16: numpy has no such type) also on order-revealing values.
        s["ordered"] = bool(kind == "all_reduce" and s["op"] == "SUM" and dt in ("float16", "float32", "float64")
                            and rng.random() < 0.5)
    if kind == "all_reduce":
        s["count"] = draw_count(rng, isz, max_bytes, world)
        s["out_of_place"] = bool(rng.random() < 0.3)
    elif kind == "reduce_scatter":
        s["count"] = draw_count(rng, isz, max_bytes, world)
    elif kind == "all_gather":
        total = draw_count(rng, isz, max_bytes, world)
        s["counts"] = ([total // world] * world if rng.random() < 0.5
                       else [int(rng.integers(0, total // world + 2)) for _ in range(world)])
    elif kind in ("broadcast", "reduce"):
        s["count"] = draw_count(rng, isz, max_bytes, world)
        s["root"] = int(rng.integers(0, world))
        if kind == "reduce":
            s["out_of_place"] = bool(rng.random() < 0.3)
    elif kind == "all_to_all":
        total = draw_count(rng, isz, max_bytes, world)
        if rng.random() < 0.3:
            b = total // world // world
            s["splits"] = None
            s["send"] = [[b] * world for _ in range(world)]
        else:
            s["splits"] = True
            s["send"] = [split_count(rng, int(rng.integers(0, total // world + 2)), world) for _ in range(world)]
    elif kind in ("gather", "scatter"):
        s["block"] = draw_count(rng, isz, max_bytes, world) // world
        s["root"] = int(rng.integers(0, world))
    elif kind == "send_recv":
        s["count"] = draw_count(rng, isz, max_bytes, world)
        s["pattern"] = "ring" if rng.random() < 0.5 else "pair"
        src = int(rng.integers(0, world))
        s["src"], s["dst"] = src, int((src + rng.integers(1, world)) % world)
        s["shift"] = int(rng.integers(1, world))
    return s


def draw_call(seed, idx, world, max_bytes, use_torch):
    """Call `idx`: one collective (sync or async) or a batch of async ones waited in random order."""
    rng = np.random.default_rng([seed, 3, idx])
    r = rng.random()
    if r < 0.25:
        n = int(rng.integers(2, 5))
        ops = [draw_op(rng, world, max_bytes // n, use_torch) for _ in range(n)]
        return {"mode": "batch", "ops": ops, "wait_order": [int(v) for v in rng.permutation(n)]}
    op = draw_op(rng, world, max_bytes, use_torch)
    mode = "async" if r < 0.45 or (op["kind"] == "send_recv" and op["pattern"] == "ring") else "sync"
    return {"mode": mode, "ops": [op], "wait_order": [0]}


# ---- inputs (functions of seed, call, position, rank) ---------------------------------------------
def data(seed, idx, j, rank, dt, count, purpose):
    """purpose: 'bits' (random bit patterns), 'exact' (values whose reduction is exact in any
    order for the op), 'ordered' (floats whose sums show the order), 'product', 'minmax'."""
    rng = np.random.default_rng([seed, 4, idx, j, rank])
    st = npdt(dt)
    if count == 0:
        return np.empty(0, st)
    if dt == "bool":
        return rng.integers(0, 2, count).astype(bool)
    if dt in INTS or purpose == "bits":
        return np.frombuffer(rng.bytes(count * st.itemsize), dtype=st).copy()
    if purpose == "ordered":
        v = rng.standard_normal(count) * 10.0 ** rng.uniform(-3, 3, count)
    elif purpose == "minmax":
        v = rng.standard_normal(count) * 10.0 ** rng.uniform(-3, 3, count)
        if dt == "float16":
            v = np.clip(v, -6e4, 6e4)
    elif purpose == "product":
        v = rng.choice(np.array([-2.0, -1.0, 1.0, 2.0]), count)
    else:
        v = rng.integers(-20, 21, count).astype(np.float64)
    if dt == "bfloat16":
        return f32_to_bf16(v.astype(np.float32))
    return v.astype(dt)


def purpose_of(op):
    if op["kind"] not in REDUCING:
        return "bits"
    if op.get("ordered"):
        return "ordered"
    return {"PRODUCT": "product", "MIN": "minmax", "MAX": "minmax"}.get(op["op"], "exact")


def reference(xs, dt, op, world):
    """Reduction of the per-rank arrays xs (numpy storage of dt) with op."""
    a = np.stack(xs) if xs[0].size else np.empty((world, 0), xs[0].dtype)
    if dt == "bool":
        return a.all(0) if op == "MIN" else a.any(0)
    if dt in INTS:
        t = a.dtype
        f = {"SUM": lambda: a.sum(0, dtype=t), "PRODUCT": lambda: a.prod(0, dtype=t),
             "MIN": lambda: a.min(0), "MAX": lambda: a.max(0),
             "BAND": lambda: np.bitwise_and.reduce(a, 0), "BOR": lambda: np.bitwise_or.reduce(a, 0),
             "BXOR": lambda: np.bitwise_xor.reduce(a, 0)}[op]
        return f().astype(t)
    v = bf16_to_f32(a) if dt == "bfloat16" else a
    if op in ("MIN", "MAX"):
        r = v.min(0) if op == "MIN" else v.max(0)
        return f32_to_bf16(r) if dt == "bfloat16" else r
    w = v.astype(np.float64)
    r = w.sum(0) if op in ("SUM", "AVG") else w.prod(0)      # exact: small integers
    if op == "AVG":
        # The last combination computes (a + b) * (1/n) in the kernel's type: float64 for float64,
        # float32 otherwise (half types are widened), rounded once to the dtype.
        r = r * (1.0 / world) if dt == "float64" else np.float32(1.0 / world) * r.astype(np.float32)
    if dt == "bfloat16":
        return f32_to_bf16(np.asarray(r, np.float32))
    return np.asarray(r).astype(dt)


def chunk_bounds(count, world, r):
    base, extra = divmod(count, world)
    lo = r * base + min(r, extra)
    return lo, lo + base + (1 if r < extra else 0)


# ---- one rank -------------------------------------------------------------------------------------
class Prepared:
    """One collective of a call on this rank: launch(async_op) issues it (returns its Work, a
    list of them, or None); once it completed, every (name, array, expected) in bufs must match
    byte for byte."""

    def __init__(self):
        self.bufs = []          # (name, numpy array, expected numpy array)
        self.launch = None
        self.nbytes = 0         # sum over ranks of the input bytes


def first_diff(got, want):
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype} != {want.shape} {want.dtype}"
    if got.size == 0:
        return None
    g = got.view(np.uint8).reshape(got.size, -1)
    w = want.view(np.uint8).reshape(want.size, -1)
    if np.array_equal(g, w):
        return None
    bad = int(np.flatnonzero((g != w).any(1))[0])
    return f"element {bad} of {got.size}: got {got[bad]!r}, want {want[bad]!r}"


def prepare(comm, seed, idx, j, op, rank, world, lib_of):
    import ringcomm
    p = Prepared()
    kind, dt = op["kind"], op["dtype"]
    if kind == "barrier":
        p.launch = lambda a: comm.barrier(async_op=a)
        return p
    st = npdt(dt)
    isz = st.itemsize
    wrap = lib_of(dt, op["lib"])
    purpose = purpose_of(op)

    def x_of(r, count, salt=0):
        return data(seed, idx, j * 16 + salt, r, dt, count, purpose)

    def expect(name, arr, want):
        p.bufs.append((name, arr, want))

    if kind in ("all_reduce", "reduce_scatter", "reduce"):
        count = op["count"]
        xs = [x_of(r, count) for r in range(world)]
        p.nbytes = world * count * isz
        if op.get("ordered"):
            want = ordered_sum(xs) if count else xs[0].copy()
        else:
            want = reference(xs, dt, op["op"], world)
        x = xs[rank].copy()
        rop = getattr(ringcomm.ReduceOp, op["op"])
        if kind == "all_reduce":
            if op["out_of_place"]:
                out = np.zeros(count, st)
                p.launch = lambda a: comm.all_reduce(wrap(x), op=rop, async_op=a, output=wrap(out))
                expect("output", out, want)
                expect("input (unchanged)", x, xs[rank])
            else:
                p.launch = lambda a: comm.all_reduce(wrap(x), op=rop, async_op=a)
                expect("buffer", x, want)
        elif kind == "reduce_scatter":
            lo, hi = chunk_bounds(count, world, rank)
            out = np.zeros(hi - lo, st)
            p.launch = lambda a: comm.reduce_scatter(wrap(out), wrap(x), op=rop, async_op=a)
            expect("output", out, want[lo:hi])
            expect("input (unchanged)", x, xs[rank])
        else:
            root = op["root"]
            if op["out_of_place"] and rank == root:
                out = np.zeros(count, st)
                p.launch = lambda a: comm.reduce(wrap(x), root=root, op=rop, async_op=a, output=wrap(out))
                expect("output", out, want)
                expect("input (unchanged)", x, xs[rank])
            else:
                p.launch = lambda a: comm.reduce(wrap(x), root=root, op=rop, async_op=a)
                expect("buffer" if rank == root else "non-root input (unchanged)", x,
                       want if rank == root else xs[rank])
    elif kind == "all_gather":
        counts = op["counts"]
        xs = [x_of(r, counts[r]) for r in range(world)]
        p.nbytes = sum(counts) * isz
        x = xs[rank].copy()
        out = np.zeros(sum(counts), st)
        p.launch = lambda a: comm.all_gather(wrap(out), wrap(x), async_op=a)
        expect("output", out, np.concatenate(xs))
        expect("input (unchanged)", x, xs[rank])
    elif kind == "broadcast":
        count, root = op["count"], op["root"]
        want = x_of(root, count)
        p.nbytes = count * isz
        x = want.copy() if rank == root else x_of(rank, count, salt=1)
        p.launch = lambda a: comm.broadcast(wrap(x), root=root, async_op=a)
        expect("buffer", x, want)
    elif kind == "all_to_all":
        send = op["send"]                           # send[i][k]: elements rank i sends to rank k
        xs = [x_of(r, sum(send[r])) for r in range(world)]
        p.nbytes = sum(map(sum, send)) * isz
        pieces = []
        for i in range(world):
            lo = sum(send[i][:rank])
            pieces.append(xs[i][lo:lo + send[i][rank]])
        want = np.concatenate(pieces)
        x = xs[rank].copy()
        out = np.zeros(want.size, st)
        if op["splits"]:
            osp, isp = [send[i][rank] for i in range(world)], list(send[rank])
            p.launch = lambda a: comm.all_to_all(wrap(out), wrap(x), output_splits=osp, input_splits=isp,
                                                 async_op=a)
        else:
            p.launch = lambda a: comm.all_to_all(wrap(out), wrap(x), async_op=a)
        expect("output", out, want)
        expect("input (unchanged)", x, xs[rank])
    elif kind == "gather":
        b, root = op["block"], op["root"]
        xs = [x_of(r, b) for r in range(world)]
        p.nbytes = world * b * isz
        x = xs[rank].copy()
        if rank == root:
            out = np.zeros(world * b, st)
            p.launch = lambda a: comm.gather(wrap(out), wrap(x), root=root, async_op=a)
            expect("output", out, np.concatenate(xs))
        else:
            p.launch = lambda a: comm.gather(None, wrap(x), root=root, async_op=a)
        expect("input (unchanged)", x, xs[rank])
    elif kind == "scatter":
        b, root = op["block"], op["root"]
        full = x_of(root, world * b)
        p.nbytes = world * b * isz
        out = np.zeros(b, st)
        if rank == root:
            x = full.copy()
            p.launch = lambda a: comm.scatter(wrap(out), wrap(x), root=root, async_op=a)
            expect("input (unchanged)", x, full)
        else:
            p.launch = lambda a: comm.scatter(wrap(out), None, root=root, async_op=a)
        expect("output", out, full[rank * b:(rank + 1) * b])
    elif kind == "send_recv":
        count = op["count"]
        if op["pattern"] == "ring":
            k = op["shift"]
            dst, src = (rank + k) % world, (rank - k) % world
            p.nbytes = world * count * isz
            x = x_of(rank, count)
            want_in = x_of(src, count)
            got = np.zeros(count, st)

            # Always posted async (a ring of blocking sends could wait on each other); run_call
            # waits for both handles.
            p.launch = lambda a: [comm.send(wrap(x), dst, async_op=True), comm.recv(wrap(got), src, async_op=True)]
            expect("received", got, want_in)
            expect("sent (unchanged)", x, x_of(rank, count))
        else:
            src, dst = op["src"], op["dst"]
            p.nbytes = count * isz
            if rank == src:
                x = x_of(src, count)
                p.launch = lambda a: comm.send(wrap(x), dst, async_op=a)
                expect("sent (unchanged)", x, x_of(src, count))
            elif rank == dst:
                got = np.zeros(count, st)
                p.launch = lambda a: comm.recv(wrap(got), src, async_op=a)
                expect("received", got, x_of(src, count))
            else:
                p.launch = lambda a: None
    return p


def describe(call):
    parts = []
    for op in call["ops"]:
        d = {k: v for k, v in op.items() if k not in ("send",)}
        if "send" in op:
            d["send_totals"] = [sum(s) for s in op["send"]]
        parts.append(d)
    return f"mode={call['mode']} ops={parts}"


def run_call(comm, seed, idx, call, rank, world, lib_of, stats, corrupt=False):
    """Issue call `idx`, wait, check. Returns the first mismatch (a string) or None. `corrupt`
    (the checker's own test) flips one bit of the first non-empty result before checking; whether
    one was flipped is stats["corrupted"]."""
    preps = [prepare(comm, seed, idx, j, op, rank, world, lib_of) for j, op in enumerate(call["ops"])]
    if call["mode"] == "sync":
        preps[0].launch(False)
    else:
        works = [p.launch(True) for p in preps]
        for j in call["wait_order"]:
            w = works[j]
            for h in (w if isinstance(w, list) else [w] if w is not None else []):
                h.wait()
    if corrupt:
        for p in preps:
            for _, got, _ in p.bufs:
                if got.size and not stats["corrupted"]:
                    got.view(np.uint8)[0] ^= 1
                    stats["corrupted"] = True
    first = None
    for op, p in zip(call["ops"], preps):
        stats["calls"][op["kind"]] = stats["calls"].get(op["kind"], 0) + 1
        stats["bytes"] += p.nbytes
        stats["ordered"] += bool(op.get("ordered"))
        for name, got, want in p.bufs:
            d = first_diff(got, want) if first is None else None
            if d is not None:
                first = f"{op['kind']} {name}: {d}"
    return first


def make_lib_of(use_torch):
    if not use_torch:
        return lambda dt, lib: (lambda a: a)
    import torch

    def lib_of(dt, lib):
        if dt == "bfloat16":
            return lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        if lib == "torch":
            return torch.from_numpy
        return lambda a: a
    return lib_of


def rss_now_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def rank_main(rank, world, cfg, q):
    """One soak rank (spawned). Sends ('stats', rank, dict), ('fail', rank, dict) and
    ('exc', rank, dict) messages to the parent."""
    faulthandler.register(signal.SIGUSR1, file=open(os.path.join(cfg["tmp"], f"rank{rank}.stack"), "w"),
                          all_threads=True)
    epoch, idx = 0, 0
    try:
        import ringcomm
        lib_of = make_lib_of(cfg["torch"])
        seed = cfg["seed"]
        stats = {"calls": {}, "bytes": 0, "errors": 0, "epochs": 0, "first_rss_kib": None, "ordered": 0,
                 "corrupted": False}
        inject = cfg["inject"]
        last_report = 0.0
        replay = cfg["replay"]
        epoch = replay[0] if replay else 0
        idx = replay[1] if replay else 0
        stop = False
        failure = None
        while not stop:
            knobs = epoch_knobs(seed, epoch)
            os.environ.update(knobs)
            cap = size_cap(knobs)
            length = epoch_seconds(seed, epoch, *cfg["epoch_s"])
            comm = ringcomm.init(rank=rank, world_size=world, init_method=f"file://{cfg['tmp']}/store{epoch}",
                                 timeout=cfg["timeout"], prefix=f"soak/{epoch}")
            stats["epochs"] += 1
            t_epoch = time.time()
            try:
                while True:
                    call = draw_call(seed, idx, world, cap, cfg["torch"])
                    corrupt = inject is not None and idx >= inject and rank == world - 1
                    bad = run_call(comm, seed, idx, call, rank, world, lib_of, stats,
                                   corrupt=corrupt and not stats["corrupted"])
                    if bad is not None:
                        stats["errors"] += 1
                        if failure is None:
                            failure = {"seed": seed, "epoch": epoch, "index": idx, "knobs": knobs,
                                       "what": bad, "call": describe(call)}
                            q.put(("fail", rank, failure))
                    idx += 1
                    if replay:
                        stop = True
                        break
                    if idx % CTL_EVERY:
                        continue
                    now = time.time()
                    flag = 0
                    if rank == 0:
                        flag = 2 if now >= cfg["end"] else (1 if now >= t_epoch + length else 0)
                    ctl = np.array([flag, stats["errors"]], np.int64)
                    comm.all_reduce(ctl, op=ringcomm.ReduceOp.MAX)
                    if now - last_report >= REPORT_EVERY_S or ctl[0] or ctl[1]:
                        last_report = now
                        if stats["first_rss_kib"] is None:
                            stats["first_rss_kib"] = rss_now_kib()
                        stats.update(maxrss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                     rss_kib=rss_now_kib(), epoch=epoch, index=idx, knobs=knobs)
                        q.put(("stats", rank, dict(stats)))
                    if ctl[1] or ctl[0] == 2:
                        stop = True
                    if ctl[0] or ctl[1]:
                        break
            finally:
                comm.close()
            epoch += 1
        stats.update(maxrss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rss_kib=rss_now_kib(),
                     epoch=epoch - 1, index=idx, done=True)
        if stats["first_rss_kib"] is None:
            stats["first_rss_kib"] = stats["rss_kib"]
        q.put(("stats", rank, dict(stats)))
    except BaseException:  # noqa: BLE001 - every failure goes to the parent
        q.put(("exc", rank, {"seed": cfg["seed"], "epoch": epoch, "index": idx,
                             "knobs": epoch_knobs(cfg["seed"], epoch), "traceback": traceback.format_exc()}))
        sys.exit(1)


# ---- the parent -----------------------------------------------------------------------------------
def ringcomm_segments():
    out = {}
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return out
    for n in names:
        if n.startswith("ringcomm-"):
            try:
                out[n] = os.stat(os.path.join("/dev/shm", n)).st_size
            except OSError:
                pass
    return out


class ShmSampler(threading.Thread):
    """Peak of /dev/shm's used bytes and of the ringcomm segments' total size, sampled."""

    def __init__(self, period=0.1):
        super().__init__(daemon=True)
        self.period = period
        self.base_used = shutil.disk_usage("/dev/shm").used
        self.peak_used = self.base_used
        self.peak_segments = 0
        self.peak_segment_count = 0
        self._halt = threading.Event()

    def run(self):
        while not self._halt.wait(self.period):
            self.sample()

    def sample(self):
        self.peak_used = max(self.peak_used, shutil.disk_usage("/dev/shm").used)
        segs = ringcomm_segments()
        self.peak_segments = max(self.peak_segments, sum(segs.values()))
        self.peak_segment_count = max(self.peak_segment_count, len(segs))

    def stop(self):
        self._halt.set()
        self.join()


def child_pids(pid):
    """Live child processes of pid, except multiprocessing's resource tracker (it serves the
    whole interpreter, exits with it, and is no rank)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) != pid or fields[0] == "Z":
                    continue
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmdline = f.read()
                if b"resource_tracker" not in cmdline:
                    out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def mib(b):
    return b / (1 << 20)


def summary_lines(per_rank, world, elapsed, sampler):
    s0 = per_rank.get(0, {})
    calls = s0.get("calls", {})
    total = sum(calls.values())
    lines = [f"[{elapsed / 60:6.2f} min] collectives {total} ({', '.join(f'{k} {calls[k]}' for k in KINDS if k in calls)}); "
             f"bytes {s0.get('bytes', 0) / 1e9:.3f} GB; errors {sum(s.get('errors', 0) for s in per_rank.values())}; "
             f"epoch {s0.get('epoch', 0)} call {s0.get('index', 0)}; order-checked float sums {s0.get('ordered', 0)}"]
    rss = ", ".join(f"r{r} {per_rank[r].get('maxrss_kib', 0) / 1024:.0f} MiB (now {per_rank[r].get('rss_kib', 0) / 1024:.0f})"
                    for r in sorted(per_rank))
    lines.append(f"             max RSS per rank: {rss}; /dev/shm peak used {mib(sampler.peak_used):.1f} MiB "
                 f"(before {mib(sampler.base_used):.1f}), ringcomm segments peak {mib(sampler.peak_segments):.1f} MiB "
                 f"in {sampler.peak_segment_count}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--epoch-seconds", default="30,60", help="lo,hi: epoch length range (s)")
    ap.add_argument("--timeout", type=float, default=120.0, help="communicator timeout (s)")
    ap.add_argument("--hang-seconds", type=float, default=600.0,
                    help="no report from a rank for this long: dump stacks and fail")
    ap.add_argument("--no-torch", action="store_true", help="numpy arrays only (no bfloat16)")
    ap.add_argument("--replay", default=None, help="EPOCH:INDEX: run that one call under that epoch's knobs")
    ap.add_argument("--report-every", type=float, default=60.0)
    ap.add_argument("--inject-error", type=int, default=None, metavar="INDEX",
                    help="test of the checker: corrupt the last rank's first non-empty result from call INDEX on")
    a = ap.parse_args(argv)
    if not 2 <= a.world <= 4:
        ap.error("--world must be 2..4")
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    use_torch = False
    if not a.no_torch:
        try:
            import torch  # noqa: F401
            use_torch = True
        except ImportError:
            pass
    replay = tuple(int(v) for v in a.replay.split(":")) if a.replay else None
    lo, hi = (float(v) for v in a.epoch_seconds.split(","))
    tmp = tempfile.mkdtemp(prefix="ringcomm-soak-")
    start_wall = time.time()
    cfg = {"seed": seed, "torch": use_torch, "end": start_wall + a.minutes * 60, "epoch_s": (lo, hi),
           "timeout": a.timeout, "tmp": tmp, "replay": replay, "inject": a.inject_error}
    cmd = "python " + " ".join([os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:]))
    print(f"# ringcomm soak  {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC  "
          f"{platform.node()}  {os.cpu_count()} cores  load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"# command: {cmd}\n# seed {seed}, world {a.world}, torch tensors/bfloat16: {use_torch}", flush=True)
    segs_before = set(ringcomm_segments())
    sampler = ShmSampler()
    sampler.start()
    load_before = os.getloadavg()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, a.world, cfg, q), daemon=True) for r in range(a.world)]
    for p in procs:
        p.start()
    per_rank, failures, excs = {}, [], []
    done = set()
    last_msg = time.monotonic()
    last_print = time.monotonic()
    hang = None
    t0 = time.monotonic()
    try:
        while len(done) < a.world:
            try:
                kind, r, payload = q.get(timeout=0.5)
                last_msg = time.monotonic()
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in done]
                if dead and not excs:
                    time.sleep(1.0)
                    if q.empty():
                        excs.append((dead[0], {"traceback": f"rank {dead[0]} exited with code "
                                               f"{procs[dead[0]].exitcode} without a report"}))
                if excs and all(p.exitcode is not None for p in procs) and q.empty():
                    break
                if time.monotonic() - last_msg > a.hang_seconds:
                    for p in procs:
                        if p.is_alive():
                            os.kill(p.pid, signal.SIGUSR1)
                    time.sleep(1.0)
                    hang = "\n".join(open(os.path.join(tmp, f"rank{r}.stack")).read() for r in range(a.world))
                    break
                continue
            if kind == "stats":
                per_rank[r] = payload
                if payload.get("done"):
                    done.add(r)
            elif kind == "fail":
                failures.append((r, payload))
            elif kind == "exc":
                excs.append((r, payload))
                done.add(r)
            if time.monotonic() - last_print >= a.report_every and per_rank:
                last_print = time.monotonic()
                sampler.sample()
                print("\n".join(summary_lines(per_rank, a.world, time.monotonic() - t0, sampler)), flush=True)
    finally:
        from ringcomm.launch import reap
        reap(procs, grace=30.0 if not (excs or hang) else 5.0)
        q.close()
        sampler.sample()
        sampler.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - t0
    # Leaks: segments unlink within milliseconds of creation; only one that stays is a leak.
    leak_deadline = time.monotonic() + 3.0
    leaked = set(ringcomm_segments()) - segs_before
    while leaked and time.monotonic() < leak_deadline:
        time.sleep(0.05)
        leaked &= set(ringcomm_segments())
    children = sorted(set(child_pids(os.getpid())) | {p.pid for p in mp.active_children()})
    errors = sum(s.get("errors", 0) for s in per_rank.values())
    print("# final", flush=True)
    print("\n".join(summary_lines(per_rank, a.world, elapsed, sampler)))
    print(f"# load average before/after {load_before[0]:.2f} / {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores); "
          f"segments left {sorted(leaked) or 'none'}; child processes left {children or 'none'}")
    n_epochs = per_rank.get(0, {}).get("epochs", 0)
    first_epoch = replay[0] if replay else 0
    knob_sets = [epoch_knobs(seed, e) for e in range(first_epoch, first_epoch + n_epochs)]
    print("# epochs (RINGCOMM_SLOT_BYTES x NSLOTS, ALGO, STREAM): " + "; ".join(
        f"{k['RINGCOMM_SLOT_BYTES']} x {k['RINGCOMM_NSLOTS']} {k['RINGCOMM_ALGO']} {k['RINGCOMM_STREAM']}"
        for k in knob_sets))
    ok = not (errors or failures or excs or hang or leaked or children) and len(per_rank) == a.world
    replay_cmd = None
    if failures:
        r, f = failures[0]
        replay_cmd = f"python {os.path.relpath(__file__)} --world {a.world} --seed {f['seed']} --replay {f['epoch']}:{f['index']}" \
                     + (" --no-torch" if not use_torch else "")
        print(f"# FIRST FAILURE (rank {r}): seed {f['seed']} epoch {f['epoch']} call {f['index']} knobs {f['knobs']}\n"
              f"#   {f['what']}\n#   {f['call']}\n#   replay: {replay_cmd}")
    if excs:
        r, e = excs[0]
        if "index" in e:
            replay_cmd = replay_cmd or (f"python {os.path.relpath(__file__)} --world {a.world} --seed {e['seed']} "
                                        f"--replay {e['epoch']}:{e['index']}" + (" --no-torch" if not use_torch else ""))
            print(f"# EXCEPTION (rank {r}) at seed {e['seed']} epoch {e['epoch']} call {e['index']} knobs {e['knobs']}; "
                  f"replay: {replay_cmd}")
        print(e["traceback"])
        for r2, e2 in excs[1:]:
            print(f"# rank {r2} also failed:\n{e2['traceback']}")
    if hang:
        print(f"# HANG: no report for {a.hang_seconds:.0f} s; stacks:\n{hang}")
    print(f"# result: {'PASS' if ok else 'FAIL'}", flush=True)
    if a.json:
        s0 = per_rank.get(0, {})
        out = {"date_utc": datetime.datetime.fromtimestamp(start_wall, datetime.timezone.utc).isoformat(),
               "command": cmd, "host": platform.node(), "cores": os.cpu_count(), "seed": seed, "world": a.world,
               "torch": use_torch, "minutes": elapsed / 60, "load_before": load_before[0],
               "load_after": os.getloadavg()[0], "epochs": s0.get("epochs", 0), "epoch_knobs": knob_sets,
               "calls": s0.get("calls", {}),
               "collectives": sum(s0.get("calls", {}).values()), "ordered_sums": s0.get("ordered", 0), "bytes": s0.get("bytes", 0), "errors": errors,
               "maxrss_mib": {str(r): per_rank[r].get("maxrss_kib", 0) / 1024 for r in sorted(per_rank)},
               "rss_first_mib": {str(r): (per_rank[r].get("first_rss_kib") or 0) / 1024 for r in sorted(per_rank)},
               "rss_last_mib": {str(r): per_rank[r].get("rss_kib", 0) / 1024 for r in sorted(per_rank)},
               "shm_used_before_mib": mib(sampler.base_used), "shm_used_peak_mib": mib(sampler.peak_used),
               "shm_segments_peak_mib": mib(sampler.peak_segments), "segments_left": sorted(leaked),
               "children_left": children, "failures": [f for _, f in failures],
               "exceptions": [e for _, e in excs], "hang": hang is not None, "replay": replay_cmd, "ok": ok}
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
