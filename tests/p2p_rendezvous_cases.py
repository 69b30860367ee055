"""Point-to-point messages larger than RINGCOMM_P2P_EAGER_BYTES (rendezvous, from 3 ranks on:
csrc/comm/p2p_engine.h), run inside spawned ranks (module-level for spawn). Every payload is known
on every rank (``payload``), which is the reference."""
import random
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
    receive that was not posted, within the communicator's timeout (1 s here). Rank 0 waits and
    closes. Returns (error type, message, seconds) on rank 1."""
    import ringcomm
    comm = init_under_env(rank, world, "rdv-timeout", env=env, timeout=1)
    out = None
    if rank == 1:
        t0 = time.monotonic()
        try:
            comm.send(payload(1, 0, n_big), dst=0, tag=0)
            out = ("completed", "")
        except ringcomm.RingcommError as e:
            out = (type(e).__name__, str(e), time.monotonic() - t0)
    else:
        time.sleep(2)
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


def cts_behind_a_long_stream(rank, world, n_huge, n_big, env):
    """Rank 0 streams a huge message to rank 1 (whose receive is posted at once) for longer than the
    timeout; meanwhile rank 1 sends a large message to rank 0, whose receive rank 0 posts while
    its huge send still streams. Rank 0's CTS can only go once the huge message is through, so
    neither rank 1's send nor rank 0's receive may time out while the pair is busy. Returns
    (outcome, seconds the huge message took) on ranks 0 and 1."""
    import ringcomm
    huge = np.ones(n_huge, np.float32) if rank < 2 else None  # touched before the clock starts
    # Every rank past its allocation before the 1 s communicator forms: its init waits for the
    # others no longer than that.
    pre = init_under_env(rank, world, f"rdv-cts-pre-{n_huge}", env=env, timeout=60)
    pre.barrier()
    pre.close()
    comm = init_under_env(rank, world, f"rdv-cts-behind-{n_huge}", env=env, timeout=1)
    out = None
    comm.barrier()
    t0 = time.monotonic()
    try:
        if rank == 0:
            h = comm.send(huge, dst=1, tag=0, async_op=True)
            time.sleep(0.05)
            y = np.zeros(n_big, np.float32)
            r = comm.recv(y, src=1, tag=1, async_op=True)  # takes rank 1's RTS; its CTS waits behind `huge`
            h.wait(timeout=60)
            took = time.monotonic() - t0
            r.wait(timeout=60)
            out = ("ok" if np.array_equal(y, payload(1, 1, n_big)) else "wrong payload", took)
        elif rank == 1:
            r = comm.recv(huge, src=0, tag=0, async_op=True)
            h = comm.send(payload(1, 1, n_big), dst=0, tag=1, async_op=True)
            r.wait(timeout=60)
            took = time.monotonic() - t0
            h.wait(timeout=60)
            out = ("ok", took)
    except ringcomm.RingcommError as e:
        out = (f"{type(e).__name__}: {e}", time.monotonic() - t0)
    try:
        comm.close()
    except ringcomm.RingcommError:
        pass  # a failure above broke the communicator; the outcome says why
    return out


ANY_TAG = 9  # random_traffic: the tag the any-source receives take


def _traffic_plan(seed, world, rounds, sizes):
    """{(src, dst): [(tag, n), ...]}: what each rank sends each other rank, in send order; one
    message in four has ANY_TAG (and 3000 elements), the others tags 0-2 and a size from `sizes`."""
    rng = random.Random(seed)
    return {(s, d): [(ANY_TAG, 3000) if rng.random() < 0.25 else (rng.randrange(3), rng.choice(sizes))
                     for _ in range(rounds)]
            for s in range(world) for d in range(world) if s != d}


def _traffic_value(src, k, tag, n):
    """Message k of src (with its tag) as int64: its first element encodes (src, k, tag)."""
    return np.arange(n, dtype=np.int64) + np.int64(((src * 1000 + k) * 16 + tag) * 100000)


def random_traffic(rank, world, seed, rounds, sizes, name_some_sources, env):
    """Every rank sends `rounds` messages to every other (eager and rendezvous sizes, tags 0-2 and
    ANY_TAG, from _traffic_plan) and posts the receives for its own: per (source, tag) in send
    order, and ANY_TAG's from any source (with `name_some_sources`, the first few of each source's
    ANY_TAG messages by receives naming it, posted before the any-source ones), every stream
    interleaved at random. Returns the list of violations: a payload not the expected one, an
    ANY_TAG message taken twice or not at all, or one source's ANY_TAG messages taken out of send
    order."""
    comm = init_under_env(rank, world, f"rdv-random-{seed}", env=env, timeout=30)
    plan = _traffic_plan(seed, world, rounds, sizes)
    rng = random.Random(seed * 7919 + rank)
    streams = [[("send", d, k, t, n) for k, (t, n) in enumerate(plan[(rank, d)])] for d in range(world) if d != rank]
    for s in range(world):
        if s != rank:
            for tag in range(3):
                streams.append([("recv", s, k, t, n) for k, (t, n) in enumerate(plan[(s, rank)]) if t == tag])
    named, anys = [], []
    for s in range(world):
        if s != rank:
            c = sum(1 for t, _ in plan[(s, rank)] if t == ANY_TAG)
            c_named = rng.randrange(c + 1) if name_some_sources else 0
            named += [("named", s, None, ANY_TAG, 3000)] * c_named
            anys += [("any", None, None, ANY_TAG, 3000)] * (c - c_named)
    rng.shuffle(named)
    streams = [s for s in streams + [named + anys] if s]
    posted = []
    while streams:
        i = rng.randrange(len(streams))
        kind, peer, k, t, n = act = streams[i].pop(0)
        if not streams[i]:
            streams.pop(i)
        if kind == "send":
            buf = _traffic_value(rank, k, t, n)
            posted.append((act, buf, comm.send(buf, dst=peer, tag=t, async_op=True)))
        else:
            buf = np.full(n, -1, dtype=np.int64)
            posted.append((act, buf, comm.recv(buf, src=peer, tag=t, async_op=True)))
        if rng.random() < 0.05:
            time.sleep(0.01)
    errors, taken = [], []
    for (kind, peer, k, t, n), buf, h in posted:
        h.wait(timeout=30)
        if kind == "recv" and not np.array_equal(buf, _traffic_value(peer, k, t, n)):
            errors.append(("payload", peer, k, t, n))
        elif kind in ("named", "any"):
            code = int(buf[0]) // 100000
            s, kk, tt = code // 16000, code // 16 % 1000, code % 16
            if (tt != ANY_TAG or h.source() != s or (peer is not None and peer != s)
                    or not np.array_equal(buf, _traffic_value(s, kk, tt, n))):
                errors.append((kind, peer, h.source(), s, kk, tt))
            taken.append((s, kk))
    expected = sorted((s, k) for s in range(world) if s != rank
                      for k, (t, _) in enumerate(plan[(s, rank)]) if t == ANY_TAG)
    if sorted(taken) != expected:
        errors.append(("taken", sorted(taken), expected))
    for s in range(world):
        ks = [k for ss, k in taken if ss == s]  # named receives were posted first, then any-source
        if ks != sorted(ks):
            errors.append(("order", s, ks))
    comm.barrier()
    comm.close()
    return errors
