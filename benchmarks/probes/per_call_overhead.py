"""The per-call cost of a small synchronous collective through the plain API, back to back, by
array type and path: 1 KiB in place (256 float32 or 512 bfloat16 elements) of

  numpy all_reduce (in place, out of place, and the general path: ``async_op=True`` then
  ``wait()``), numpy broadcast, torch float32 and bfloat16 all_reduce and torch float32 broadcast
  (when torch is installed), and the bare binding call ``_c.all_reduce`` on the numpy array's memory.

    python benchmarks/probes/per_call_overhead.py [--world 1] [--calls 20000] [--repeats 5] [--pin]

Each rank times ``--calls`` calls of every case after a warm-up and a barrier, ``--repeats``
times; prints per case the median, min and max of rank 0's per-repeat means, in µs per call.
``--world 1`` (the default) leaves out the peer: what remains is the front's cost (Python, the
binding, the description, the rule) and the core's entry; ``--world 2`` adds the hand-off with a
peer. Run it with ``PYTHONPATH`` pointing at another build to compare two builds, or in a fresh
``TORCH_EXTENSIONS_DIR`` to see what a user without the torch backend's trampoline gets:

    TORCH_EXTENSIONS_DIR=$(mktemp -d) python benchmarks/probes/per_call_overhead.py --world 2
"""
import argparse
import statistics
import sys
import time

import numpy as np


def _cases(comm):
    """(name, call) pairs, the same on every rank: the ranks make the same collectives in turn."""
    from ringcomm.core.tables import DTYPE_CODES, op_code
    x = np.ones(256, np.float32)
    y = np.empty_like(x)
    cases = [("numpy float32 all_reduce in place", lambda: comm.all_reduce(x)),
             ("numpy float32 all_reduce out of place", lambda: comm.all_reduce(x, output=y)),
             ("numpy float32 all_reduce, general path (async + wait)",
              lambda: comm.all_reduce(x, async_op=True).wait()),
             ("numpy float32 broadcast", lambda: comm.broadcast(x, root=0))]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        t = torch.ones(256)
        b = torch.ones(512, dtype=torch.bfloat16)
        cases += [("torch float32 all_reduce in place", lambda: comm.all_reduce(t)),
                  ("torch bfloat16 all_reduce in place", lambda: comm.all_reduce(b)),
                  ("torch float32 broadcast", lambda: comm.broadcast(t, root=0))]
    addr, f32, sum_ = x.__array_interface__["data"][0], DTYPE_CODES["float32"], op_code("sum")
    cases.append(("bare binding _c.all_reduce (numpy memory)",
                  lambda: comm._c.all_reduce(addr, addr, x.size, f32, sum_, False)))
    return cases


def _rank(comm, calls, repeats, pin):
    import os
    if pin:  # rank r on the r-th allowed CPU (mod their count)
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[comm.rank % len(cpus)]})
    warm = max(200, min(calls // 10, 5000))
    out = {}
    for name, call in _cases(comm):
        means = []
        for _ in range(repeats):
            for _ in range(warm):
                call()
            comm.barrier()
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                call()
            means.append((time.perf_counter_ns() - t0) / calls / 1e3)
        out[name] = means
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=1, help="ranks (1: no peer, the front's cost alone)")
    ap.add_argument("--calls", type=int, default=20000, help="timed calls per case and repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pin", action="store_true", help="pin rank r to the r-th allowed CPU")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    from ringcomm.core.launch import launch
    res = launch(_rank, a.world, args=(a.calls, a.repeats, a.pin), timeout=1800)
    print(f"# {a.world} rank(s), rank 0's mean us per call: median / min / max over {a.repeats} "
          f"repeats of {a.calls} calls")
    for name, means in res[0].items():
        print(f"{name:54s} {statistics.median(means):7.3f} us  min {min(means):7.3f}  max {max(means):7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
