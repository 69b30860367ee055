"""Point-to-point messages larger than RINGCOMM_P2P_EAGER_BYTES (rendezvous, from 3 ranks on:
csrc/comm/p2p_engine.h), run inside spawned ranks (module-level for spawn). Every payload is known
on every rank (``payload``), which is the reference."""
import resource
import time

import numpy as np

from mp_cases import init_under_env


def payload(src, tag, n, salt=0):
    return np.arange(n, dtype=np.float32) + np.float32(src * 1000 + tag * 10 + salt)


def _rss_peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def large_sends_wait_for_their_receives(rank, world, n_big, n_small, count, env):
    """Rank 1 sends `count` large messages and one small one to rank 0, then waits. Rank 0 posts
    no receive for a while: the small send completes at once, the large ones stay pending and rank
    0's memory does not grow by their size; once rank 0 receives (in reverse tag order), every
    send completes and every receive holds its payload. Returns (small done early, large pending
    early, rss growth MiB while pending, all payloads right) on rank 0 and 1."""
    comm = init_under_env(rank, world, "rdv-wait", env=env, timeout=60)
    out = None
    if rank == 1:
        hs = [comm.send(payload(1, t, n_big), dst=0, tag=t, async_op=True) for t in range(count)]
        small = comm.send(payload(1, 99, n_small), dst=0, tag=99, async_op=True)
        time.sleep(1.0)
        early = (small.is_completed(), not any(h.is_completed() for h in hs))
        comm.barrier()  # rank 0 receives after this
        for h in hs + [small]:
            h.wait(timeout=60)
        out = early
    elif rank == 0:
        rss0 = _rss_peak_mib()
        time.sleep(1.0)  # rank 1's messages arrive, unexpected
        grown = _rss_peak_mib() - rss0
        comm.barrier()
        ok = True
        for t in reversed(range(count)):
            y = np.zeros(n_big, np.float32)
            comm.recv(y, src=1, tag=t)
            ok &= bool(np.array_equal(y, payload(1, t, n_big)))
        y = np.zeros(n_small, np.float32)
        comm.recv(y, src=1, tag=99)
        ok &= bool(np.array_equal(y, payload(1, 99, n_small)))
        out = (grown, ok)
    else:
        comm.barrier()
    comm.barrier()
    comm.close()
    return out


def order_per_tag_across_protocols(rank, world, n_big, n_small, env):
    """Rank 1 sends, all with tag 5 but the last: big A, small B, big C, small D (tag 7), then
    big E (tag 8) and small F (tag 9). Rank 0 receives tag 9 and tag 7 first (the small messages
    behind the pending large ones arrive), then tag 5 three times (in send order: A, B, C, though
    B's data came before A's), then tag 8. Returns the list of checks."""
    comm = init_under_env(rank, world, "rdv-order", env=env, timeout=60)
    out = None
    msgs = [(5, n_big, 1), (5, n_small, 2), (5, n_big, 3), (7, n_small, 4), (8, n_big, 5), (9, n_small, 6)]
    if rank == 1:
        hs = [comm.send(payload(1, t, n, s), dst=0, tag=t, async_op=True) for t, n, s in msgs]
        for h in hs:
            h.wait(timeout=60)
    elif rank == 0:
        out = []
        for i in (5, 3, 0, 1, 2, 4):
            t, n, s = msgs[i]
            y = np.zeros(n, np.float32)
            comm.recv(y, src=1, tag=t)
            out.append(bool(np.array_equal(y, payload(1, t, n, s))))
    comm.barrier()
    comm.close()
    return out


def crossing_large_exchange(rank, world, n_big, env):
    """Every rank sends a large message to every other with async sends, receives them with
    blocking receives in rank order, then waits for its sends (the sends do not complete until
    their receives are posted). Returns whether every payload is right."""
    comm = init_under_env(rank, world, "rdv-cross", env=env, timeout=60)
    hs = [comm.send(payload(rank, d, n_big), dst=d, tag=d, async_op=True) for d in range(world) if d != rank]
    ok = True
    for s in range(world):
        if s != rank:
            y = np.zeros(n_big, np.float32)
            comm.recv(y, src=s, tag=rank)
            ok &= bool(np.array_equal(y, payload(s, rank, n_big)))
    for h in hs:
        h.wait(timeout=60)
    comm.barrier()
    comm.close()
    return ok


def any_source_takes_an_announced_message(rank, world, n_big, env):
    """Ranks 1.. send a large message with tag 3 to rank 0, which has posted nothing yet; rank 0
    then receives them from any source: each from a distinct sender with that sender's payload."""
    comm = init_under_env(rank, world, "rdv-any", env=env, timeout=60)
    out = None
    if rank == 0:
        time.sleep(0.5)  # the RTSs arrive before any receive
        got = []
        for _ in range(world - 1):
            y = np.zeros(n_big, np.float32)
            src = comm.recv(y, src=None, tag=3)
            got.append((src, bool(np.array_equal(y, payload(src, 3, n_big)))))
        out = sorted(got)
    else:
        comm.send(payload(rank, 3, n_big), dst=0, tag=3)
    comm.barrier()
    comm.close()
    return out


def unreceived_large_send_times_out(rank, world, n_big, env):
    """Rank 1's large send to rank 0 is never received: it fails with TimeoutError naming the
    receive that was not posted, within the communicator's timeout (2 s here). Rank 0 waits and
    closes. Returns (error type, message) on rank 1."""
    import ringcomm
    comm = init_under_env(rank, world, "rdv-timeout", env=env, timeout=2)
    out = None
    if rank == 1:
        t0 = time.monotonic()
        try:
            comm.send(payload(1, 0, n_big), dst=0, tag=0)
            out = ("completed", "")
        except ringcomm.RingcommError as e:
            out = (type(e).__name__, str(e), time.monotonic() - t0)
    else:
        time.sleep(4)
    comm.close()
    return out


def size_mismatch_raises_on_the_receiver(rank, world, n_big, env):
    """Rank 0 receives rank 1's large message into a smaller buffer: MismatchError on rank 0 (at
    the announcement, before any data moves); rank 1's send then fails with the error rank 0 reported."""
    import ringcomm
    comm = init_under_env(rank, world, "rdv-mismatch", env=env, timeout=20)
    out = None
    try:
        if rank == 0:
            comm.recv(np.zeros(n_big - 1, np.float32), src=1, tag=0)
        elif rank == 1:
            comm.send(payload(1, 0, n_big), dst=0, tag=0)
        out = "completed"
    except ringcomm.RingcommError as e:
        out = type(e).__name__
    comm.close()
    return out
