"""Small all_reduces that arrive apart, as torch users make them: the ringcomm backend as a group
beside a gloo default group, every call after a barrier on another gloo group, with DeepSpeed's
shared-memory op (``torch.ops.deepspeed.inference_all_reduce_``) as a peer in the same processes
where DeepSpeed is installed. Peers: ``ringcomm`` (``dist.all_reduce`` on the ringcomm group),
``ringcomm_fn`` (``ringcomm.torch.all_reduce_`` on the same group: its direct call to the
synchronous entry), ``ringcomm_op`` (``torch.ops.ringcomm.all_reduce_``: the same call as one
dispatcher op), ``deepspeed`` and, asked for by ``--peers``, ``torch_noop``
(``torch.ops.aten.alias``: a dispatcher op that does nothing, what any op costs to reach after the
barrier) and ``null`` (``dist.all_reduce`` on a group of the do-nothing c10d backend
"ringcomm_null", ``ringcomm.torch.null_backend``: the floor of torch's collective front that every
backend pays; registered only for this peer). Prints a markdown table.

    python benchmarks/probes/torch_apart.py                          # 2 ranks, 1 KiB / 64 KiB / 1 MiB, 200 calls
    python benchmarks/probes/torch_apart.py --omp1 --pin             # OMP_NUM_THREADS=1, one CPU per rank
    python benchmarks/probes/torch_apart.py --sizes 1K --calls 20 --peers ringcomm --json out.json
    python benchmarks/probes/torch_apart.py --omp1 --pin --load 1    # beside one busy process
    python benchmarks/probes/torch_apart.py --dtype bfloat16         # every peer on bfloat16
    python benchmarks/probes/torch_apart.py --sizes 1K --peers ringcomm,null,ringcomm_fn --trace  # the front's floor

Ranks start as fresh processes (``ringcomm.core.launch.spawn``, the environment torchrun gives:
RANK, WORLD_SIZE, LOCAL_RANK). The default process group is gloo; ``dist.new_group(backend=
"ringcomm")`` is the group under test and a second gloo group is the separator. For every size and
peer, after ``--warmup`` untimed calls made the same way, each of ``--calls`` calls is: every rank
fills the buffer with rank + 1, passes the separator's barrier, records its arrival on
``time.perf_counter`` (CLOCK_MONOTONIC on Linux: one clock for every process of the machine),
calls the all_reduce (SUM, in place, of ``--dtype``: float32 or bfloat16, the same for every
peer, DeepSpeed's op included) and records its end. Every result is checked
outside the timed span. The peers of one size take turns call by call, in the same processes, so a
slow spell of the machine falls on all of them alike; each round runs them in a new order
(``--order shuffle``, the default: a permutation drawn from ``--seed``, the same on every rank),
because a call's time depends on the call before it (what that left in the caches: a peer that
always follows another ``dist.all_reduce`` finds torch's front warm, one that always follows
DeepSpeed's op finds it cold). ``--order rotate`` starts each round one peer further, keeping
the cyclic order, so every peer always follows the same one.
``--trace`` also splits the ringcomm peers' calls (RINGCOMM_TRACE on; the C++ record of each call is read
after it, outside the timed span) into ``torch_in`` (Python call -> ringcomm's C++ entry: torch's
``dist.all_reduce``, its ProcessGroup and dispatcher, the c10d trampoline), ``core`` (entry ->
exit: ringcomm's collective, waits included) and ``torch_out`` (exit -> back in Python: the Work
and ``wait()``), medians over the calls of the last rank to arrive; and, from the ringcomm and
null backends' own stamps around their ``allreduce()`` (FrontStamps, bindings/torch/offer_point.h),
``dist.all_reduce`` into torch's way in, ours in (-> the core's entry), core, ours out (the core's
exit -> the work returned) and torch's way out, against null's way in, ``allreduce()`` and way out.
``--load N`` runs N busy processes (``ringcomm.bench --load``'s: pure compute, not pinned) beside
the ranks for the whole run, the other work of a shared machine. The header records the load
average before the run, and each row the CPU time a call took on its rank's calling thread
(``time.thread_time`` around the call: spins count, sleeps do not), the mean over calls and
ranks.

Per call:

  call   the max over ranks of end - arrival (the first rank's time includes waiting for the last)
  after  the last end - the last arrival: the collective once every rank has arrived

and per size and peer the p50 / p90 / p99 of each over the calls, with ringcomm's over
DeepSpeed's beside them. DeepSpeed's op is built (or found in torch's extension cache) by
DeepSpeed's own ``ShareMemCommBuilder`` and initialised as ``deepspeed.comm`` does it: LOCAL_SIZE,
MASTER_ADDR and MASTER_PORT in the environment (they name its shared-memory segments), then
``initialize(world_size, rank)``. Those segments are removed when the run ends.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence

import numpy as np

PEERS = ("ringcomm", "ringcomm_fn", "ringcomm_op", "deepspeed", "torch_noop", "null")
UNCHECKED = ("torch_noop", "null")   # the peers that compute nothing
TRACED = ("ringcomm", "ringcomm_fn", "ringcomm_op")   # the peers --trace splits (both run on the group's communicator)
QUANTILES = (50, 90, 99)
DTYPES = {"float32": 4, "bfloat16": 2}   # --dtype's choices and their element sizes
DS_SHM_PREFIX = "deepspeed_allreduce_buffer"   # DeepSpeed's SHM_BUFFER_NAME (csrc/cpu/comm/shm.cpp)
DS_ADDR = "127.0.0.1"


def parse_size(s: str) -> int:
    from ringcomm.bench.spec import parse_size as parse
    return parse(s)


def fmt_size(n: int) -> str:
    for unit, v in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v and n % v == 0:
            return f"{n // v} {unit}"
    return f"{n} B"


def deepspeed_installed() -> bool:
    import importlib.util
    return importlib.util.find_spec("deepspeed") is not None


def _ds_shm_names(port: str, world: int) -> list[str]:
    """The /dev/shm files DeepSpeed's op creates, one per rank (shm_initialize's naming)."""
    return [f"/dev/shm/{DS_SHM_PREFIX}_{os.getuid()}_{DS_ADDR}_{port}_{r}" for r in range(world)]


def _ds_module():
    """DeepSpeed's shared-memory comm extension, loaded (and built once) by its own builder."""
    from deepspeed.accelerator import get_accelerator
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None:
        raise RuntimeError("DeepSpeed has no ShareMemCommBuilder for this accelerator")
    return builder.load(verbose=False)


def _worker(rank: int, world: int, store_path: str, sizes: list[int], calls: int, warmup: int,
            peers: list[str], pin: list[int] | None, omp_threads: int | None, trace: bool,
            dtype: str, order: str, seed: int) -> dict:
    if pin is not None:
        os.sched_setaffinity(0, {pin[rank % len(pin)]})
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import ringcomm.torch  # noqa: F401  (registers the "ringcomm" backend)

    if omp_threads is not None:
        torch.set_num_threads(omp_threads)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    rc = dist.new_group(backend="ringcomm")
    sep = dist.new_group(backend="gloo")
    ops = {}
    if "ringcomm" in peers:
        ops["ringcomm"] = lambda x: dist.all_reduce(x, group=rc)
    if "ringcomm_fn" in peers:
        import ringcomm.torch
        ops["ringcomm_fn"] = lambda x: ringcomm.torch.all_reduce_(x, rc)
    if "ringcomm_op" in peers:
        group_name = rc.group_name
        ops["ringcomm_op"] = lambda x: torch.ops.ringcomm.all_reduce_(x, group_name, "sum")
    if "torch_noop" in peers:
        ops["torch_noop"] = torch.ops.aten.alias   # a dispatcher op that does nothing: the floor
    if "null" in peers:
        from ringcomm.torch import null_backend
        null_backend.register()
        nullg = dist.new_group(backend=null_backend.NULL_BACKEND_NAME)
        ops["null"] = lambda x: dist.all_reduce(x, group=nullg)
    if "deepspeed" in peers:
        ds = _ds_module()
        ds.initialize(world, rank)
        ops["deepspeed"] = torch.ops.deepspeed.inference_all_reduce_
    want = float(world * (world + 1) // 2)
    clock = time.perf_counter
    # --trace: the C++ records are on CLOCK_MONOTONIC, which is perf_counter's clock on Linux.
    comm = rc._get_backend(torch.device("cpu")).communicator if trace and set(TRACED) & set(peers) else None
    # --trace: the backends' own stamps around their allreduce() (FrontStamps in
    # bindings/torch/offer_point.h), for dist.all_reduce on the ringcomm group and on the null one
    front = {}
    if trace:
        for name, g in (("ringcomm", rc), ("null", nullg if "null" in peers else None)):
            b = g._get_backend(torch.device("cpu")) if name in peers and g is not None else None
            if b is not None and hasattr(b, "_front_trace"):
                b._front_trace(True)
                front[name] = b
    out = {"cpus": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(), "cells": {}}
    try:
        for nbytes in sizes:
            x = torch.empty(nbytes // DTYPES[dtype], dtype=getattr(torch, dtype))
            out["dtype"] = str(x.dtype).removeprefix("torch.")   # what every peer's calls ran on
            arrive = {name: np.empty(calls, np.float64) for name in peers}
            end = {name: np.empty(calls, np.float64) for name in peers}
            cpu = {name: np.empty(calls, np.float64) for name in peers}
            phases = {name: np.full((calls, 2), np.nan) for name in peers
                      if comm is not None and name in TRACED}
            stamps = {name: np.full((calls, 2), np.nan) for name in front}
            rng = np.random.default_rng([seed, nbytes])   # every rank draws the same orders
            for i in range(-warmup, calls):
                k = i % len(peers)   # rotate: the peers take turns, starting one further each round
                turn = ([peers[j] for j in rng.permutation(len(peers))] if order == "shuffle"
                        else peers[k:] + peers[:k])
                for name in turn:
                    op = ops[name]
                    x.fill_(float(rank + 1))
                    dist.barrier(group=sep)
                    c0 = time.thread_time()
                    t0 = clock()
                    op(x)
                    t1 = clock()
                    c1 = time.thread_time()
                    if i >= 0:
                        arrive[name][i], end[name][i], cpu[name][i] = t0, t1, c1 - c0
                        if name in phases:
                            rec = comm.trace()[-1]
                            phases[name][i] = (rec["entry"] * 1e-9, rec["exit"] * 1e-9)
                        if name in stamps:
                            t_in, t_out = front[name]._front_stamps()
                            stamps[name][i] = (t_in * 1e-9, t_out * 1e-9)
                    if name not in UNCHECKED and not bool(torch.all(x == want)):
                        raise RuntimeError(f"rank {rank}: {name} all_reduce of {nbytes} B gave "
                                           f"{x[:4].tolist()}, want {want}")
            for name in peers:
                cell = out["cells"][f"{nbytes}/{name}"] = {"arrive": arrive[name].tolist(),
                                                          "end": end[name].tolist(),
                                                          "cpu": cpu[name].tolist()}
                if name in phases:
                    cell["phases"] = phases[name].tolist()
                if name in stamps:
                    cell["front"] = stamps[name].tolist()
        dist.barrier(group=sep)
        stats = getattr(rc._get_backend(torch.device("cpu")), "communicator", None)
        out["wait_stats"] = stats.wait_stats() if stats is not None else {}
    finally:
        dist.destroy_process_group()
    return out


TRACE_SEGMENTS = ("torch_in", "core", "torch_out")


def split(ranks: list[dict]) -> dict:
    """Per-call figures (µs) of one cell from every rank's arrivals and ends; with phases, the
    last arriver's torch_in / core / torch_out."""
    arrive = np.array([r["arrive"] for r in ranks])
    end = np.array([r["end"] for r in ranks])
    out = {"call": ((end - arrive).max(axis=0) * 1e6).tolist(),
           "after": ((end.max(axis=0) - arrive.max(axis=0)) * 1e6).tolist()}
    last = arrive.argmax(axis=0)
    calls = np.arange(arrive.shape[1])
    out["own_last"] = ((end[last, calls] - arrive[last, calls]) * 1e6).tolist()
    if all("cpu" in r for r in ranks):
        out["cpu_mean"] = float(np.mean([r["cpu"] for r in ranks]) * 1e6)
    if all("phases" in r for r in ranks):
        ph = np.array([r["phases"] for r in ranks])            # rank, call, (entry, exit)
        a, e = arrive[last, calls], end[last, calls]
        entry, leave = ph[last, calls, 0], ph[last, calls, 1]
        for seg, v in zip(TRACE_SEGMENTS, (entry - a, leave - entry, e - leave)):
            out[seg] = (v * 1e6).tolist()
    if all("front" in r for r in ranks):
        fr = np.array([r["front"] for r in ranks])             # rank, call, (backend in, backend out)
        b_in, b_out = fr[last, calls, 0], fr[last, calls, 1]
        a, e = arrive[last, calls], end[last, calls]
        out["torch_way_in"] = ((b_in - a) * 1e6).tolist()       # Python -> the backend's allreduce()
        out["torch_way_out"] = ((e - b_out) * 1e6).tolist()     # its work returned -> back in Python
        if "core" in out:
            out["ours_in"] = ((entry - b_in) * 1e6).tolist()    # allreduce() -> the core's entry
            out["ours_out"] = ((b_out - leave) * 1e6).tolist()  # the core's exit -> its work returned
        else:
            out["backend"] = ((b_out - b_in) * 1e6).tolist()    # the whole allreduce()
    return out


def front_columns(name: str) -> list[tuple[str | None, str]]:
    """--trace's split of dist.all_reduce at the backend's allreduce(): the figures of peer ``name``
    (ringcomm, or null: no core, its whole allreduce() under "ours in") and their formats."""
    keys = (("torch_way_in", "ours_in", "core", "ours_out", "torch_way_out") if name == "ringcomm"
            else ("torch_way_in", "backend", None, None, "torch_way_out"))
    return [(k, ",.2f") for k in keys] + [("own_last", ",.1f")]


def print_medians(head: Sequence[str], sizes: list[int], names: Sequence[str], cells: dict, summary: dict,
                  field: str, columns) -> None:
    """A markdown table of per-call medians (µs): columns size, peer and ``head``; a row per size
    and peer of the medians of the figures ``columns(peer)`` names, each (key, format), None for
    one the peer lacks ("-"). Each row's medians go to ``summary[size][peer][field]``."""
    print("| size | peer | " + " | ".join(head) + " |")
    print("|" + "---|" * (len(head) + 2))
    for s in sizes:
        for name in names:
            c = cells[f"{s}/{name}"]
            cols = columns(name)
            med = {k: float(np.median(c[k])) for k, _ in cols if k is not None}
            summary[str(s)][name][field] = med
            print(f"| {fmt_size(s)} | {name} | "
                  + " | ".join("-" if k is None else format(med[k], f) for k, f in cols) + " |")


def quantiles(v: list[float]) -> list[float]:
    return [float(q) for q in np.percentile(np.asarray(v), QUANTILES)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1K,64K,1M", help="comma-separated byte sizes (K/M)")
    p.add_argument("--calls", type=int, default=200, help="timed calls per size and peer")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls before them")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--order", choices=("shuffle", "rotate"), default="shuffle",
                   help="the peers' order in each round: a new permutation (default) or the last one rotated")
    p.add_argument("--seed", type=int, default=0, help="--order shuffle's seed (default 0)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                   help="the buffer's dtype, for every peer (default float32)")
    p.add_argument("--peers", default=None,
                   help="comma-separated, of ringcomm, ringcomm_fn, ringcomm_op, deepspeed, torch_noop, null (default: the first four, deepspeed where installed)")
    p.add_argument("--omp1", action="store_true", help="OMP_NUM_THREADS=1 in every rank (as torchrun sets it)")
    p.add_argument("--pin", action="store_true",
                   help="bind rank r to the r-th CPU this process may run on (one CPU per rank)")
    p.add_argument("--trace", action="store_true",
                   help="split ringcomm's calls into torch_in / core / torch_out (RINGCOMM_TRACE)")
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="N busy processes (not pinned) beside the ranks for the whole run (default 0)")
    p.add_argument("--json", help="write the per-call figures and the summary here")
    p.add_argument("--timeout", type=float, default=600)
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    for s in sizes:
        if s <= 0 or s % DTYPES[a.dtype]:
            p.error(f"size {s} is not a positive whole number of {a.dtype} elements")
    if a.calls < 1 or a.warmup < 0 or a.load < 0:
        p.error("--calls must be >= 1, --warmup and --load >= 0")
    if a.peers is None:
        peers = ["ringcomm", "ringcomm_fn", "ringcomm_op"] + (["deepspeed"] if deepspeed_installed() else [])
    else:
        peers = [x for x in a.peers.split(",") if x]
        if not peers or not set(peers) <= set(PEERS) or len(set(peers)) != len(peers):
            p.error(f"--peers {a.peers!r}: distinct names from {', '.join(PEERS)}")
        if "deepspeed" in peers and not deepspeed_installed():
            p.error("--peers deepspeed: DeepSpeed is not installed")
    pin = None
    if a.pin:
        pin = sorted(os.sched_getaffinity(0))
        if len(pin) < a.world_size:
            p.error(f"--pin: {a.world_size} ranks, one CPU each, but only CPUs {pin} are allowed")
    omp = 1 if a.omp1 else None
    port = str(os.getpid())     # names DeepSpeed's segments apart from any other run's
    env = {"LOCAL_SIZE": a.world_size, "MASTER_ADDR": DS_ADDR, "MASTER_PORT": port}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    if a.trace:
        env["RINGCOMM_TRACE"] = 4
    if "deepspeed" in peers:
        _ds_module()   # build it here once, not in every rank at the same time

    from ringcomm.bench.load import BusyLoad
    from ringcomm.core.launch import spawn
    loadavg = os.getloadavg()
    try:
        with tempfile.TemporaryDirectory(prefix="ringcomm-torch-apart-") as d, BusyLoad(a.load):
            res = spawn(_worker, a.world_size,
                        (os.path.join(d, "store"), sizes, a.calls, a.warmup, peers, pin, omp, a.trace,
                         a.dtype, a.order, a.seed),
                        timeout=a.timeout, env=env)
    finally:
        for path in _ds_shm_names(port, a.world_size):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    cells, summary = {}, {}
    for s in sizes:
        for name in peers:
            key = f"{s}/{name}"
            cells[key] = split([r["cells"][key] for r in res])
            summary.setdefault(str(s), {})[name] = {k: quantiles(cells[key][k]) for k in ("call", "after")}
            summary[str(s)][name]["cpu_mean"] = cells[key]["cpu_mean"]

    env_line = " ".join(f"{k}={os.environ[k]}" for k in sorted(os.environ) if k.startswith("RINGCOMM_"))
    if any(r["dtype"] != a.dtype for r in res):
        raise RuntimeError(f"--dtype {a.dtype}: the ranks ran {[r['dtype'] for r in res]}")
    print(f"all_reduce {a.dtype} SUM in place, {a.world_size} ranks (torch; default group gloo, "
          f"each call after a barrier on another gloo group), {a.calls} calls per size after "
          f"{a.warmup}, peers' order {a.order}{f' (seed {a.seed})' if a.order == 'shuffle' else ''}; "
          f"OMP threads {res[0]['threads']}, CPUs per rank "
          f"{[r['cpus'] for r in res]}; {a.load} busy processes beside them; load average before "
          f"{' '.join(f'{v:.2f}' for v in loadavg)}; {env_line or 'no RINGCOMM_ settings'}")
    print("ringcomm group's wait counters per rank (wait_stats()): "
          + "; ".join(", ".join(f"{k} {v}" for k, v in r.get("wait_stats", {}).items()) or "-" for r in res))
    print("call = max over ranks of end - arrival; after = last end - last arrival; "
          "p50 / p90 / p99, µs\n")
    head = "| size | peer | call p50 | p90 | p99 | after p50 | p90 | p99 | CPU µs/call |"
    versus = "deepspeed" if "deepspeed" in peers and len(peers) >= 2 else None
    if versus:
        head += " call ratio p50 / p90 / p99 | after ratio p50 / p90 / p99 |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for s in sizes:
        row = summary[str(s)]
        for name in peers:
            q = row[name]
            line = (f"| {fmt_size(s)} | {name} | " + " | ".join(f"{v:,.1f}" for v in q["call"]) + " | "
                    + " | ".join(f"{v:,.1f}" for v in q["after"]) + f" | {q['cpu_mean']:,.1f} |")
            if versus:
                if name != versus:
                    other = row[versus]
                    ratios = {k: [mine / theirs for mine, theirs in zip(q[k], other[k])] for k in ("call", "after")}
                    row["ratio" if name == "ringcomm" else f"ratio_{name}"] = ratios
                    line += (" " + " / ".join(f"{v:.2f}x" for v in ratios["call"]) + " | "
                             + " / ".join(f"{v:.2f}x" for v in ratios["after"]) + " |")
                else:
                    line += " | |"
            print(line)
    if versus:
        print(f"\nratio = peer / {versus}; ringcomm = dist.all_reduce on the ringcomm group, "
              "ringcomm_fn = ringcomm.torch.all_reduce_ on it, ringcomm_op = torch.ops.ringcomm.all_reduce_ on it")
    traced = [n for n in TRACED if n in peers]
    if a.trace and traced:
        print("\nringcomm's calls, the last rank to arrive, median µs: torch_in = Python call -> C++ "
              "entry, core = entry -> exit, torch_out = exit -> back in Python\n")
        print_medians(list(TRACE_SEGMENTS) + ["after"], sizes, traced, cells, summary, "trace_p50",
                      lambda name: [(k, ",.1f") for k in TRACE_SEGMENTS + ("after",)])
        if "null" in peers and "ringcomm" in traced:
            print("\nthe front above its floor, the last rank to arrive, median µs: ringcomm's torch_in + "
                  "torch_out (the front's part of dist.all_reduce on the ringcomm group) against null's whole "
                  "call (dist.all_reduce on the do-nothing backend)\n")
            print("| size | ringcomm torch_in + torch_out | null call | above the floor |")
            print("|---|---|---|---|")
            for s in sizes:
                c = cells[f"{s}/ringcomm"]
                front = float(np.median(np.asarray(c["torch_in"]) + np.asarray(c["torch_out"])))
                floor = float(np.median(cells[f"{s}/null"]["own_last"]))
                summary[str(s)]["front_above_floor"] = {"front": front, "floor": floor, "above": front - floor}
                print(f"| {fmt_size(s)} | {front:,.1f} | {floor:,.1f} | {front - floor:,.1f} |")
    fronted = [n for n in ("ringcomm", "null") if n in peers and "torch_way_in" in cells[f"{sizes[0]}/{n}"]]
    if a.trace and fronted:
        print("\ndist.all_reduce split at the backend's own allreduce() (its stamps), the last rank to arrive, "
              "median µs: torch's way in = Python call -> the backend's allreduce(); ours in = -> the core's "
              "entry; core; ours out = the core's exit -> the work returned; torch's way out = -> back in Python "
              "(null: its whole allreduce() under 'ours in')\n")
        print_medians(["torch's way in", "ours in", "core", "ours out", "torch's way out", "call (own)"],
                      sizes, fronted, cells, summary, "front_p50", front_columns)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"world_size": a.world_size, "dtype": a.dtype, "order": a.order, "seed": a.seed, "load": a.load, "loadavg": loadavg, "sizes": sizes, "peers": peers, "calls": a.calls,
                       "warmup": a.warmup, "omp_threads": res[0]["threads"],
                       "cpus": [r["cpus"] for r in res], "env": env_line, "summary": summary,
                       "wait_stats": [r.get("wait_stats", {}) for r in res],
                       "cells": cells}, f)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
