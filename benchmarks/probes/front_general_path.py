"""What a synchronous call costs on a world of one, in the layers of the Python front: every
collective of the plain API through its public method (each offered to its C++ synchronous entry,
csrc/comm/sync_entry.cpp, where the build has one), 1 KiB float32, and the parts of the general
path (the front's checks and adapters, then the binding) that a call the entry declines pays.
Each figure is the least of --repeats means over --calls calls.

    taskset -c 0 python benchmarks/probes/front_general_path.py --calls 20000
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import timeit

import numpy as np


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    return ap


def main() -> int:
    a = build_parser().parse_args()
    import ringcomm
    from ringcomm.core.front import _overlaps
    store = tempfile.mkdtemp(prefix="front-path-")
    comm = ringcomm.init(rank=0, world_size=1, init_method=f"file://{store}/rc")
    x = np.ones(256, np.float32)
    y = np.empty(256, np.float32)

    def us(f):
        return min(timeit.repeat(f, number=a.calls, repeat=a.repeats)) / a.calls * 1e6

    bi, bo = comm._buf("probe", x, "input"), comm._buf("probe", y, "output", True)
    sc = comm._splits("all_to_all", None, 256, "input")
    rows = [
        ("all_to_all", lambda: comm.all_to_all(y, x)),
        ("all_to_all, split sizes given", lambda: comm.all_to_all(y, x, output_splits=[256], input_splits=[256])),
        ("reduce", lambda: comm.reduce(x, root=0)),
        ("all_reduce", lambda: comm.all_reduce(x)),
        ("all_gather", lambda: comm.all_gather(y, x)),
        ("reduce_scatter", lambda: comm.reduce_scatter(y, x)),
        ("broadcast", lambda: comm.broadcast(x, root=0)),
        ("gather", lambda: comm.gather(y, x, root=0)),
        ("scatter", lambda: comm.scatter(y, x, root=0)),
        ("barrier", lambda: comm.barrier()),
        ("all_to_all: _in_out (route, two adapters, dtype check)", lambda: comm._in_out("all_to_all", y, x, None)),
        ("all_to_all: _splits x 2", lambda: (comm._splits("all_to_all", None, 256, "input"),
                                             comm._splits("all_to_all", None, 256, "output"))),
        ("all_to_all: _overlaps", lambda: _overlaps(bi, bo)),
        ("all_to_all: the binding and the core", lambda: comm._c.all_to_all(bi.addr, bo.addr, sc, sc, bi.code, False)),
        ("reduce: _rooted and _buf", lambda: (comm._rooted("reduce", x, None, 0, None),
                                              comm._buf("reduce", x, "input", True))),
    ]
    print("# command: python benchmarks/probes/front_general_path.py " + " ".join(sys.argv[1:]))
    print("| call or part, 1 KiB float32, world of one | us |")
    print("|---|---:|")
    for name, f in rows:
        print(f"| {name} | {us(f):.2f} |")
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
