"""The per-call cost of the Python API, without a peer: a world of one, so every microsecond is
the front end, the binding and the core's per-call work.

    python benchmarks/per_call_overhead.py [CALLS]

Times CALLS (default 200000) synchronous calls each of: all_reduce and broadcast of a 256-element
float32 numpy array (in place; all_reduce also out of place), of a 256-element float32 and
bfloat16 torch tensor (when torch is installed), the same through the general path
(``async_op=True`` and ``wait()``), and the bare binding call ``_c.all_reduce`` on the same
memory; prints the mean µs per call of each. Run it with ``PYTHONPATH`` pointing at another
build to compare two builds.
"""
import sys
import time

import numpy as np

import ringcomm


def per_call_us(f, n):
    for _ in range(min(n // 10, 5000)):
        f()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        f()
    return (time.perf_counter_ns() - t0) / n / 1e3


def main(argv):
    n = int(argv[1]) if len(argv) > 1 else 200000
    comm = ringcomm.init(rank=0, world_size=1)
    x = np.ones(256, np.float32)
    y = np.empty_like(x)
    rows = [("numpy all_reduce in place", lambda: comm.all_reduce(x)),
            ("numpy all_reduce out of place", lambda: comm.all_reduce(x, output=y)),
            ("numpy broadcast", lambda: comm.broadcast(x, root=0)),
            ("numpy all_reduce, general path (async + wait)", lambda: comm.all_reduce(x, async_op=True).wait())]
    try:
        import torch
        t = torch.ones(256)
        b = torch.ones(256, dtype=torch.bfloat16)
        rows += [("torch float32 all_reduce in place", lambda: comm.all_reduce(t)),
                 ("torch bfloat16 all_reduce in place", lambda: comm.all_reduce(b)),
                 ("torch float32 broadcast", lambda: comm.broadcast(t, root=0))]
    except ImportError:
        pass
    addr = x.__array_interface__["data"][0]
    rows.append(("bare binding _c.all_reduce", lambda: comm._c.all_reduce(addr, addr, 256, 0, 0, False)))
    for name, f in rows:
        print(f"{name:48s} {per_call_us(f, n):7.3f} us")
    comm.close()


if __name__ == "__main__":
    main(sys.argv)
