"""Back-to-back all_reduce beside busy processes: the wait policy's tail, per call.

    python benchmarks/probes/wait_under_load.py BYTES [CALLS] [LOAD] [WORLD]

Starts LOAD busy processes (pure-Python arithmetic, normal priority, not pinned: other work on
the machine) and WORLD ranks, each timing CALLS back-to-back in-place float32 SUM all_reduces
of BYTES bytes after 20 warm-up calls; prints, over calls, the percentiles of the max over ranks
of each call's time, how many calls took over 2 ms (a scheduler slice lost), and the ranks'
``comm.wait_stats()`` summed. Run it with ``PYTHONPATH`` pointing at another build, or with a
wait knob changed, to A/B the two in alternation (docs/latency.md, "The wait policy", describes
the back-off this measures).
"""
import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

_BUSY = "import os,sys\nparent=int(sys.argv[1])\nx=0\nwhile os.getppid()==parent:\n" \
        "    for i in range(20000): x=(x*1103515245+i)&0xFFFFFFFF\n"


def _rank(rank, world, path, nbytes, calls, q):
    import ringcomm

    comm = ringcomm.init(rank=rank, world_size=world, init_method="file://" + path)
    x = np.ones(max(nbytes // 4, 1), np.float32)
    for _ in range(20):
        comm.all_reduce(x)
    comm.barrier()
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        comm.all_reduce(x)
        ts.append(time.perf_counter_ns() - t0)
    stats = comm.wait_stats() if hasattr(comm, "wait_stats") else {}
    comm.close()
    q.put((rank, ts, stats))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("nbytes", type=int, metavar="BYTES")
    p.add_argument("calls", type=int, nargs="?", default=200, metavar="CALLS")
    p.add_argument("load", type=int, nargs="?", default=2, metavar="LOAD", help="busy processes")
    p.add_argument("world", type=int, nargs="?", default=2, metavar="WORLD")
    a = p.parse_args(argv)
    nbytes, calls, load, world = a.nbytes, a.calls, a.load, a.world
    busy = [subprocess.Popen([sys.executable, "-c", _BUSY, str(os.getpid())]) for _ in range(load)]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    try:
        with tempfile.TemporaryDirectory() as d:
            procs = [ctx.Process(target=_rank, args=(r, world, os.path.join(d, "store"), nbytes, calls, q))
                     for r in range(world)]
            for p in procs:
                p.start()
            try:
                res = sorted((q.get(timeout=300) for _ in procs), key=lambda t: t[0])
            finally:
                for p in procs:
                    p.join(timeout=30)
                    if p.is_alive():
                        p.kill()
                        p.join()
    finally:
        for b in busy:
            b.kill()
            b.wait()
    t = np.max(np.array([r[1] for r in res]), axis=0) / 1e3
    stats = {}
    for _, _, st in res:
        for k, v in st.items():
            stats[k] = stats.get(k, 0) + v
    print(f"{nbytes} B, {world} ranks, load {load}: p10 {np.percentile(t, 10):.1f} median {np.median(t):.1f} "
          f"p90 {np.percentile(t, 90):.1f} max {t.max():.1f} us; calls over 2 ms {int((t > 2000).sum())}/{len(t)}; "
          f"wait_stats {stats}")


if __name__ == "__main__":
    main()
