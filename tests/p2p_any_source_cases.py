"""Receives from any source (``comm.recv(x, src=None)``), run inside spawned ranks (module-level
for spawn). Every payload is known on every rank (``payload``), which is the reference."""
import numpy as np

from mp_cases import init_under_env


def payload(src, tag, n):
    return np.arange(n, dtype=np.float32) + np.float32(src * 1000 + tag)


def any_source_gathers(rank, world, n):
    """Every rank but 0 sends one message with tag 4 to rank 0; rank 0 receives world-1 messages
    from any source: each returns a distinct sender and holds that sender's payload."""
    comm = init_under_env(rank, world, "gather", timeout=30)
    out = None
    if rank == 0:
        got = []
        for _ in range(world - 1):
            y = np.zeros(n, np.float32)
            src = comm.recv(y, src=None, tag=4)
            got.append((src, bool((y == payload(src, 4, n)).all())))
        out = sorted(got)
    else:
        comm.send(payload(rank, 4, n), dst=0, tag=4)
    comm.close()
    return out


def any_source_tags_and_order(rank, world, n):
    """Rank 1 sends tags 1, 2, 1 to rank 0 (each larger than the channel). Rank 0 receives from
    any source tag 2 first, then tag 1 twice (asynchronously): tag 2 gets the second message,
    the tag-1 messages arrive in send order; the handles' source() is 1."""
    comm = init_under_env(rank, world, "order", timeout=30)
    out = None
    msgs = [(1, payload(1, 1, n)), (2, payload(1, 2, n)), (1, payload(1, 1, n) * 2)]
    if rank == 1:
        for tag, x in msgs:
            comm.send(x, dst=0, tag=tag)
    elif rank == 0:
        y2 = np.zeros(n, np.float32)
        src2 = comm.recv(y2, src=None, tag=2)
        ya, yb = np.zeros(n, np.float32), np.zeros(n, np.float32)
        ha = comm.recv(ya, src=None, tag=1, async_op=True)
        hb = comm.recv(yb, src=None, tag=1, async_op=True)
        ha.wait()
        hb.wait()
        out = [src2, bool((y2 == msgs[1][1]).all()), ha.source(), bool((ya == msgs[0][1]).all()),
               hb.source(), bool((yb == msgs[2][1]).all())]
    comm.barrier()
    comm.close()
    return out


def any_source_beside_specific(rank, world, n):
    """World 3. Ranks 1 and 2 each send tag 7 to rank 0. Rank 0 posts a receive from rank 2
    (tag 7), then one from any source (tag 7): the specific one gets rank 2's message, the
    any-source one rank 1's. Then a bad size: an any-source receive whose matched message has
    another size raises MismatchError naming the sender."""
    import ringcomm
    comm = init_under_env(rank, world, "beside", timeout=30)
    out = None
    if rank == 0:
        y2, ya = np.zeros(n, np.float32), np.zeros(n, np.float32)
        h2 = comm.recv(y2, src=2, tag=7, async_op=True)
        ha = comm.recv(ya, src=None, tag=7, async_op=True)
        comm.barrier()          # both sends are issued after this
        h2.wait()
        ha.wait()
        out = [h2.source(), bool((y2 == payload(2, 7, n)).all()), ha.source(),
               bool((ya == payload(1, 7, n)).all())]
    else:
        comm.barrier()
        comm.send(payload(rank, 7, n), dst=0, tag=7)
    comm.close()
    return out


def any_source_rejected_args(rank, world):
    """send(dst=None) and recv from an out-of-range rank still raise InvalidArgumentError."""
    import ringcomm
    comm = init_under_env(rank, world, "args", timeout=30)
    errs = []
    for fn in (lambda: comm.send(np.ones(2, np.float32), dst=None),
               lambda: comm.recv(np.ones(2, np.float32), src=world)):
        try:
            fn()
            errs.append("no error")
        except ringcomm.InvalidArgumentError:
            errs.append("InvalidArgumentError")
    comm.close()
    return errs
