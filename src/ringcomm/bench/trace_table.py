"""``python -m ringcomm.bench --trace``: where the microseconds of a small call go.

Spawns ``-np`` ranks with ``RINGCOMM_TRACE`` on; each runs 1 KiB and 64 KiB (or the sizes of
``-b``/``-e``/``-f`` when given) all_reduce (float32 sum, in place) and broadcast (root 0), or the
collectives of ``--ops`` (reduce: root 0, in place; all_gather, reduce_scatter, all_to_all: out of
place, the size being the input's), back
to back and apart (a gloo barrier before every call, in the same processes), timing each call from Python (``time.monotonic_ns``, the
clock of the C++ trace) and reading its C++ record (``comm.trace()``). The table shows, per
case and rank, the median µs of each segment between consecutive phases:

  py_in   Python call -> C++ entry (front checks, array adapter, binding, GIL release)
  checks  entry -> header posted (local argument checks, sequence number, Work)
  header  header posted -> every peer's header seen (waiting for the peers: arrival and hand-off)
  first   header seen -> first slot handed off (algorithm setup, a free slot, the copy in)
  slots   first slot -> last slot event (the data hand-offs); for a rank that only receives,
          header seen -> its last slot received
  finish  last slot -> exit (the last reduce/copy out, completing the Work)
  py_out  exit -> back in Python
  total   the Python call; ``call`` = median over calls of the max over ranks of it.
Every result is checked against numpy; a wrong element fails the run (exit status 1).
"""
from __future__ import annotations

import datetime
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np

from ..core.launch import LaunchError, spawn
from ..core.machine import cpu_model
from .checked import CheckedCall
from .hostload import loadavg
from .load import BusyLoad

SIZES = (1024, 65536)
OPS = ("all_reduce", "broadcast")
TRACEABLE = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all")
ARRIVALS = ("b2b", "apart")
SEGMENTS = ("py_in", "checks", "header", "first", "slots", "finish", "py_out", "total")
WARMUP = 50


def segments(rec: dict, t0: int, t1: int) -> dict:
    """Segment durations in ns of one call (see the module docstring); None where absent."""
    e, hp, hs, fs, ls, x = (rec[k] for k in ("entry", "header_posted", "header_seen",
                                             "first_slot", "last_slot", "exit"))
    seg = {"py_in": e - t0, "checks": hp - e, "header": hs - hp, "py_out": t1 - x, "total": t1 - t0}
    if fs is not None:
        seg["first"], seg["slots"] = fs - hs, ls - fs
    else:
        seg["first"], seg["slots"] = None, (ls - hs if ls is not None else None)
    seg["finish"] = x - (ls if ls is not None else hs)
    return seg


def _size_label(nbytes: int) -> str:
    if nbytes >= 1 << 20 and nbytes % (1 << 20) == 0:
        return f"{nbytes >> 20}M"
    return f"{nbytes // 1024}K" if nbytes >= 1024 and nbytes % 1024 == 0 else f"{nbytes}B"


def _rank(rank, world, init_method, store_path, calls, cases):
    import ringcomm
    separator = None
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank,
                                world_size=world)
        separator = dist.barrier
    except ImportError:
        pass
    comm = ringcomm.init(rank=rank, world_size=world, init_method=init_method)
    out, wrong = [], 0
    try:
        for op, nbytes in cases:
            case = CheckedCall(op, nbytes // 4, rank, world)
            call = case.bound(comm)
            for arrival in ARRIVALS:
                if arrival == "apart" and separator is None:
                    continue
                windows = []
                for i in range(WARMUP + calls):
                    case.fill()
                    if arrival == "apart":
                        separator()
                    t0 = time.monotonic_ns()
                    call()
                    t1 = time.monotonic_ns()
                    if i >= WARMUP:
                        windows.append((t0, t1))
                    wrong += case.wrong()
                recs = comm.trace()[-calls:]
                if len(recs) != calls:
                    raise RuntimeError(f"trace kept {len(recs)} records, expected {calls}")
                segs = [segments(r, a, b) for r, (a, b) in zip(recs, windows)]
                out.append({"op": op, "bytes": nbytes, "arrival": arrival,
                            "algorithm": f"{recs[-1]['algorithm']}/{recs[-1]['protocol']}",
                            "segments": {k: [s[k] for s in segs] for k in SEGMENTS}})
    finally:
        comm.close()
        if separator is not None:
            dist.destroy_process_group()
    return {"rank": rank, "cases": out, "wrong": wrong, "apart": separator is not None}


def _median_us(values) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.median(v)) / 1e3 if v else None


def render(results: list[dict], world: int) -> list[str]:
    lines = [f"# {'collective':<11} {'size':>6} {'arrival':>7} {'rank':>4} {'algo/proto':>21} "
             + " ".join(f"{s:>7}" for s in SEGMENTS) + f" {'call':>7}",
             "#" + " " * 57 + " ".join(f"{'(us)':>7}" for _ in SEGMENTS) + f" {'(us)':>7}"]
    by_case: dict[tuple, dict] = {}
    for res in results:
        for c in res["cases"]:
            by_case.setdefault((c["op"], c["bytes"], c["arrival"]), {})[res["rank"]] = c
    for (op, nbytes, arrival), ranks in by_case.items():
        totals = np.max(np.stack([np.asarray(ranks[r]["segments"]["total"], dtype=np.float64)
                                  for r in sorted(ranks)]), axis=0)
        call = float(np.median(totals)) / 1e3
        for r in sorted(ranks):
            c = ranks[r]
            cells = []
            for s in SEGMENTS:
                m = _median_us(c["segments"][s])
                cells.append(f"{m:7.2f}" if m is not None else f"{'-':>7}")
            size = _size_label(nbytes)
            lines.append(f"  {op:<11} {size:>6} {arrival:>7} {r:>4} {c['algorithm']:>21} "
                         + " ".join(cells) + (f" {call:7.2f}" if r == 0 else f" {'':>7}"))
    return lines


def main_trace(cfg: dict, calls: int = 100, load=None, sizes=None, ops=None) -> int:
    """The per-phase table on stdout; `load` (a BusyLoad or None) runs around the ranks; `sizes`
    (bytes, multiples of 4 x the world) replace the default 1 KiB and 64 KiB; `ops` (of
    TRACEABLE) replace all_reduce and broadcast."""
    world = cfg["world_size"]
    if world < 2:
        print("ringcomm-bench --trace: needs -np >= 2", file=sys.stderr)
        return 2
    calls = max(1, int(calls))
    ops = tuple(ops or OPS)
    bad = [o for o in ops if o not in TRACEABLE]
    if bad:
        print(f"ringcomm-bench --trace: cannot trace {', '.join(bad)} (traceable: {', '.join(TRACEABLE)})",
              file=sys.stderr)
        return 2
    cases = [(op, int(n)) for op in ops for n in (sizes or SIZES) if int(n) >= 4 * world]
    if not cases:
        print(f"ringcomm-bench --trace: no size of at least {4 * world} bytes (4 per rank)", file=sys.stderr)
        return 2
    started = datetime.datetime.now(datetime.timezone.utc)
    load0 = loadavg()
    tmp = tempfile.mkdtemp(prefix="ringcomm-trace-")
    load = load if load is not None else BusyLoad(0)
    try:
        env = {"RINGCOMM_TRACE": str(calls + WARMUP)}
        with load:
            results = spawn(_rank, world, ("file://" + os.path.join(tmp, "rc"), os.path.join(tmp, "ts"),
                                           calls, cases), timeout=cfg["timeout"], env=env)
    except LaunchError as e:
        print(f"ringcomm-bench --trace: the ranks failed: {e}", file=sys.stderr)
        return 3
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load1 = loadavg()
    cmd = "python -m ringcomm.bench " + " ".join(sys.argv[1:])
    head = [f"# ringcomm-bench --trace  {started:%Y-%m-%d %H:%M:%S} UTC  host {platform.node()}  "
            f"{cpu_model()} ({os.cpu_count()} cores)  {platform.system()} {platform.release()}",
            f"# command: {cmd}",
            f"# {world} local ranks; float32 sum {', '.join(ops)} (root 0 where rooted); "
            f"{WARMUP} warm-up + {calls} traced calls per case; medians per rank of each segment",
            "# arrival: b2b = back to back; apart = a torch.distributed gloo barrier (same "
            "processes) before every call" + ("" if all(r["apart"] for r in results) else
                                              " (skipped: torch is not installed)"),
            "# segments: py_in = Python -> C++ entry, checks = entry -> header posted, header = "
            "posted -> all peers' headers seen,",
            "#   first = seen -> first slot handed off, slots = first -> last slot event (seen -> "
            "last for a rank that only receives),",
            "#   finish = last slot -> exit (Work complete), py_out = exit -> Python, total = the "
            "Python call; call = median of the max over ranks of total",
            (f"# load average before/after {load0[0]:.2f} / {load1[0]:.2f} ({os.cpu_count()} cores)"
             if load0 and load1 else "# load average: unavailable"),
            "# load: " + load.summary]
    wrong = sum(r["wrong"] for r in results)
    lines = head + render(results, world)
    lines.append(f"# check: {'ok' if wrong == 0 else f'FAIL ({wrong} wrong elements)'}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0 if wrong == 0 else 1
