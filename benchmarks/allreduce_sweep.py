"""All-reduce sweep for tuning the core: `python benchmarks/allreduce_sweep.py NPROCS [KNOB=VALUE ...]`
(e.g. `... 4 RINGCOMM_YIELD_US=0`). Prints the median time per call (max over ranks) and busbw
for 1 KiB .. 64 MiB float32 SUM, numpy arrays, in place."""
import sys, time, statistics, os, tempfile
import numpy as np
from ringcomm.launch import spawn
def rank_fn(rank, world, sizes, store, env):
    os.environ.update(env)
    import ringcomm
    comm = ringcomm.init(rank=rank, world_size=world, init_method="file://"+store)
    out=[]
    for nb in sizes:
        x = np.ones(nb//4, np.float32)
        it = max(5, min(3000, int(2e8/ max(nb,1)/8)))
        for _ in range(3): comm.all_reduce(x)
        comm.barrier()
        ts=[]
        for _ in range(it):
            t=time.perf_counter(); comm.all_reduce(x); ts.append(time.perf_counter()-t)
        out.append(statistics.median(ts))
    comm.close()
    return out
if __name__=="__main__":
    world=int(sys.argv[1]); env=dict(a.split("=") for a in sys.argv[2:])
    sizes=[1<<10, 4<<10, 64<<10, 1<<20, 16<<20, 64<<20]
    res=spawn(rank_fn, world, (sizes, tempfile.mkdtemp()+"/s", env), timeout=300)
    for i,nb in enumerate(sizes):
        t=max(r[i] for r in res)
        print(f"{nb:>10} {t*1e6:10.1f}us busbw {nb*2*(world-1)/world/t/1e9:6.2f} GB/s")
