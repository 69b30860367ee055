"""Rank bodies for tests/test_footprint.py (spawned processes import them from here)."""
import traceback

import numpy as np

from mp_cases import init_under_env
from rank_checks import RankChecks


def eight_rank_cases(rank, world):
    """all_reduce (direct and ring sizes), all_to_all, gather, scatter and point-to-point between
    non-neighbours with the default slot geometry, checked against numpy. Returns failures and
    this rank's segment bytes as the transport reports them."""
    comm = init_under_env(rank, world, "s", timeout=120)

    def data(r, n, salt):
        return ((np.arange(n, dtype=np.int64) * 7 + r * 131 + salt) % 1000).astype(np.float32)

    with RankChecks(rank, [comm]) as checks:
        check = checks.check
        # 1000 floats: bytes x (world-1) under RINGCOMM_DIRECT_MAX_BYTES (direct); 20000: the ring.
        # 20000 floats are 80 KB: several far (32 KiB) pieces and one full (256 KiB) ring piece.
        for n in (0, 1, 1000, 20000, 70001):
            x = data(rank, n, 1)
            comm.all_reduce(x)
            check(f"all_reduce {n}", np.array_equal(x, sum(data(r, n, 1) for r in range(world))))
        blk = 9000  # 36 KB per peer: two far pieces
        send = data(rank, blk * world, 2)
        out = np.zeros(blk * world, np.float32)
        comm.all_to_all(out, send)
        exp = np.concatenate([data(s, blk * world, 2)[rank * blk:(rank + 1) * blk] for s in range(world)])
        check("all_to_all", np.array_equal(out, exp))
        for root in (0, 5):
            g = np.zeros(blk * world, np.float32) if rank == root else None
            comm.gather(g, data(rank, blk, 3), root=root)
            if rank == root:
                check(f"gather root={root}", np.array_equal(g, np.concatenate([data(r, blk, 3) for r in range(world)])))
            src = data(root, blk * world, 4) if rank == root else None
            y = np.zeros(blk, np.float32)
            comm.scatter(y, src, root=root)
            check(f"scatter root={root}", np.array_equal(y, data(root, blk * world, 4)[rank * blk:(rank + 1) * blk]))
        # point-to-point across the ring (rank r to r+4): far channels on the p2p lane
        peer = (rank + world // 2) % world
        y = np.zeros(blk, np.float32)
        hs = comm.send(data(rank, blk, 5), peer, async_op=True)
        hr = comm.recv(y, peer, async_op=True)
        hs.wait(); hr.wait()
        check("send/recv across", np.array_equal(y, data(peer, blk, 5)))
        comm.barrier()
    return checks.failures


def info_rank(rank, world):
    """Create and close one communicator (its RINGCOMM_DEBUG=INFO line goes to stderr)."""
    comm = init_under_env(rank, world, "s", timeout=60)
    x = np.ones(10, np.float32)
    comm.all_reduce(x)
    comm.close()
    return bool(np.all(x == world))


def shm_mappings():
    """This process's mappings of ringcomm shared-memory segments, from /proc/self/maps:
    {segment path: (mapped bytes, allocated bytes or None)}; the allocated bytes are the file's
    st_blocks * 512 through /proc/self/map_files where that is readable."""
    import os
    out = {}
    with open("/proc/self/maps") as f:
        for ln in f:
            parts = ln.split()
            if len(parts) < 6 or "/ringcomm-" not in parts[5]:
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            try:
                blocks = os.stat(f"/proc/self/map_files/{parts[0]}").st_blocks * 512
            except OSError:
                blocks = None
            size, _ = out.get(parts[5], (0, None))
            out[parts[5]] = (size + hi - lo, blocks)
    return out


def _data(r, n, salt, dtype=np.float32, lo=0):
    """Rank ``r``'s elements ``lo .. lo + n`` (the same at any ``lo`` a slice of a longer input
    would have): a rank checking its part of a collective builds only that part of each peer's
    input, never all of it."""
    return ((np.arange(lo, lo + n, dtype=np.int64) * 7 + r * 131 + salt) % 1000).astype(dtype)


def _data_sum(world, n, salt):
    """The float32 sum over ranks 0 .. world-1 of ``_data(r, n, salt)``, from one period of the
    data (it repeats every 1000 elements)."""
    period = np.sum([_data(r, 1000, salt) for r in range(world)], axis=0)
    return np.resize(period, n)


def all_pairs_p2p(comm, rank, world, n, check, tags=(0,)):
    """Every rank sends `n` elements to every other rank with each tag (all sends posted before
    any receive, so receivers find the messages unexpected), then receives them, in reverse tag
    order; checked against the senders' data."""
    outs, hs = {}, []
    for t in tags:
        for d in range(world):
            if d != rank:
                hs.append(comm.send(_data(rank * 1000 + d, n, 11 + t), d, tag=t, async_op=True))
    for t in reversed(tags):
        for s in range(world):
            if s != rank:
                outs[(s, t)] = np.zeros(n, np.float32)
                hs.append(comm.recv(outs[(s, t)], s, tag=t, async_op=True))
    for h in hs:
        h.wait(timeout=240)
    for (s, t), y in outs.items():
        check(f"send/recv {s}->{rank} tag {t} n={n}", np.array_equal(y, _data(s * 1000 + rank, n, 11 + t)))


def every_collective(comm, rank, world, counts, check, roots):
    """Every collective on float32 (sum and max) and int32 at each count, checked against numpy."""
    import ringcomm
    for dt in (np.float32, np.int32):
        for n in counts:
            ins = [_data(r, n, 1, dt) for r in range(world)]
            for op in ("SUM", "MAX"):
                ref = np.sum(ins, axis=0).astype(dt) if op == "SUM" else np.max(ins, axis=0)
                x = ins[rank].copy()
                comm.all_reduce(x, op=getattr(ringcomm.ReduceOp, op))
                check(f"all_reduce {op} {dt.__name__} n={n}", np.array_equal(x, ref))
            ref = np.sum(ins, axis=0).astype(dt)
            lo = n // world * rank + min(rank, n % world)
            m = n // world + (1 if rank < n % world else 0)
            y = np.zeros(m, dt)
            comm.reduce_scatter(y, ins[rank].copy())
            check(f"reduce_scatter {dt.__name__} n={n}", np.array_equal(y, ref[lo:lo + m]))
            y = np.zeros(n * world, dt)
            comm.all_gather(y, ins[rank])
            check(f"all_gather {dt.__name__} n={n}", np.array_equal(y, np.concatenate(ins)))
            mine = _data(rank, n * world, 4, dt)     # this rank's all_to_all / scatter input
            y = np.zeros(n * world, dt)
            comm.all_to_all(y, mine)
            check(f"all_to_all {dt.__name__} n={n}",
                  np.array_equal(y, np.concatenate([_data(s, n, 4, dt, lo=rank * n) for s in range(world)])))
            for root in roots:
                x = ins[rank].copy()
                comm.broadcast(x, root=root)
                check(f"broadcast root={root} {dt.__name__} n={n}", np.array_equal(x, ins[root]))
                x = ins[rank].copy()
                comm.reduce(x, root=root)
                if rank == root:
                    check(f"reduce root={root} {dt.__name__} n={n}", np.array_equal(x, ref))
                g = np.zeros(n * world, dt) if rank == root else None
                comm.gather(g, ins[rank], root=root)
                if rank == root:
                    check(f"gather root={root} {dt.__name__} n={n}", np.array_equal(g, np.concatenate(ins)))
                y = np.zeros(n, dt)
                comm.scatter(y, mine if rank == root else None, root=root)
                check(f"scatter root={root} {dt.__name__} n={n}", np.array_equal(y, _data(root, n, 4, dt, lo=rank * n)))
    comm.barrier()


# Tiny slots: every case spans many pieces, and each outbox has 2 slots however many ranks read it.
TINY = {"RINGCOMM_SLOT_BYTES": "1024", "RINGCOMM_NSLOTS": "2", "RINGCOMM_FAR_SLOT_BYTES": "256",
        "RINGCOMM_OUTBOX_SLOTS": "2"}
# The algorithms forced in turn (all-reduce; the direct configuration also takes the direct
# broadcast, the ring one the chain), the LL protocol off where the slots are meant.
TINY_CONFIGS = {
    "ring": {"RINGCOMM_ALGO": "ring", "RINGCOMM_DIRECT_MAX_BYTES": "0"},
    "direct": {"RINGCOMM_ALGO": "direct", "RINGCOMM_DIRECT_MAX_BYTES": "1G", "RINGCOMM_LL_MAX_BYTES": "0"},
    "two_shot": {"RINGCOMM_ALGO": "two_shot", "RINGCOMM_DIRECT_MAX_BYTES": "0", "RINGCOMM_LL_MAX_BYTES": "0"},
    "auto": {},
}


def many_ranks_tiny_slots(rank, world, names):
    """One communicator per configuration of TINY_CONFIGS in `names`, each with TINY slots: every
    collective and all-pairs point-to-point (two tags), checked against numpy. Returns failures."""
    import os
    failures = []

    def check(name, ok):
        if not ok:
            failures.append(f"rank {rank}: {name}")

    roots = sorted({0, world // 2, world - 1})
    for name in names:
        saved = dict(os.environ)
        os.environ.update(TINY)
        os.environ.update(TINY_CONFIGS[name])
        comm = None
        try:
            comm = init_under_env(rank, world, "tiny-" + name, timeout=240)
            every_collective(comm, rank, world, (0, 1, 7, 5 * world + 1, 700), lambda n, ok: check(f"[{name}] {n}", ok), roots)
            all_pairs_p2p(comm, rank, world, 301, lambda n, ok: check(f"[{name}] {n}", ok), tags=(0, 1))
            comm.barrier()
        except Exception:
            failures.append(f"rank {rank} [{name}]: exception\n{traceback.format_exc()}")
        finally:
            if comm is not None:
                comm.close()
            os.environ.clear()
            os.environ.update(saved)
    return failures


def footprint_after_everything(rank, world):
    """With the default knobs: every collective at sizes that take each algorithm and protocol
    (LL, direct, two-shot, ring; chain and direct broadcasts), then all-pairs point-to-point
    (48 KiB messages: more than an outbox slot), then this process's ringcomm mappings
    (shm_mappings). Returns (failures, mappings); the mappings are {} when a case raised."""
    comm = init_under_env(rank, world, "fp", timeout=240)
    maps = {}
    with RankChecks(rank, [comm]) as checks:
        check = checks.check
        # floats: 100 (LL), 500 (direct at 16 ranks: 2 KB x 15), 20000 (two-shot: 80 KB), 300000 (ring)
        every_collective(comm, rank, world, (100, 500, 20000), check, (0, world - 1))
        x = _data(rank, 300000, 1)
        comm.all_reduce(x)
        check("all_reduce ring", np.array_equal(x, _data_sum(world, 300000, 1)))
        all_pairs_p2p(comm, rank, world, 12 * 1024, check)
        comm.barrier()
        maps = shm_mappings()
    return checks.failures, maps


def in_docker_default_shm(rank, world):
    """With the default knobs, inside a 64 MiB /dev/shm (Docker's default): init, every collective,
    all-pairs point-to-point. Returns failures (empty: everything fit and was correct)."""
    try:
        comm = init_under_env(rank, world, "docker", timeout=120)
    except Exception:
        return [f"rank {rank}: init\n{traceback.format_exc()}"]
    with RankChecks(rank, [comm]) as checks:
        every_collective(comm, rank, world, (100, 20000), checks.check, (0,))
        all_pairs_p2p(comm, rank, world, 12 * 1024, checks.check)
        comm.barrier()
    return checks.failures
