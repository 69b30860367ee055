"""The fault matrix: one peer killed (SIGKILL) in each phase of every collective, stopped
(SIGSTOP), exiting cleanly, arriving late under an infinite timeout, and a stale file store.

``run_matrix`` runs in one spawned driver process and runs every case in it, two at a time: for
each case it fork()s the case's ranks (a fresh communicator on a fresh file store each time, so
one spawn covers the whole matrix), collects each rank's outcome from a file, reaps every child
(a killed rank is reaped at once, so that its peers' liveness probe finds it gone) and kills
whatever is left when the case's deadline passes. The phases are ordered by events, not by sleeps:

* ``rendezvous``: the victim's store kills it at its first read of a peer's segment name (it has
  created and published its own); the survivors are in ``init`` with it.
* ``header``: the victim kills itself once every survivor has marked that it is calling the
  collective: the survivors wait for its header.
* ``data``: the victim issues the collective asynchronously on a buffer of many slots and kills
  itself as soon as its own output shows the first data of a peer (reduce: the root marks when it
  sees the victim's first data).
* ``p2p``: every survivor receives a first message from the victim, marks it, and waits in a recv
  of a second; the victim kills itself once every survivor has its first.
"""
import json
import os
import signal
import threading
import time

import numpy as np

from mp_cases import init_under_env

COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier",
               "all_to_all", "gather", "scatter", "send_recv"]

# Elements per block (4 MiB of float32): a thousand slots at the 4 KiB slots the data cases use,
# so that the victim sees a peer's first slot long before the collective could finish.
BLOCK = 1 << 20


def _mark(d, name):
    with open(os.path.join(d, name + ".tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))


def _wait_marks(d, names, limit_s=30.0):
    t_end = time.monotonic() + limit_s
    while not all(os.path.exists(os.path.join(d, n)) for n in names):
        if time.monotonic() > t_end:
            raise RuntimeError(f"marks {names} never all appeared in {d}")
        time.sleep(0.002)


def _outcome(fn):
    """(exception class name or "no error", message, seconds) of fn()."""
    t0 = time.monotonic()
    try:
        fn()
        return ["no error", "", time.monotonic() - t0]
    except Exception as e:  # noqa: BLE001
        return [type(e).__name__, str(e), time.monotonic() - t0]


def _init(d, rank, world, timeout, store=None):
    """The matrix's communicator: on the file store in `d`, or on `store`."""
    where = {"store": store} if store is not None else {"init_method": "file://" + d}
    return init_under_env(rank, world, timeout=timeout, prefix="fm", **where)


class _KillAtFirstPeerKey:
    """A file store that kills this process at its first read of another rank's segment name:
    by then this rank has created its segment and published the name (mid-rendezvous)."""

    def __init__(self, inner, d, rank):
        self._inner, self._d, self._rank = inner, d, rank

    def get(self, key):
        if "/shm/" in key and not key.endswith(f"/shm/{self._rank}"):
            _mark(self._d, "victim-dying")
            os.kill(os.getpid(), signal.SIGKILL)
        return self._inner.get(key)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _peer_blocks_touched(out, rank, n):
    """Whether any block of ``out`` other than this rank's own (which a local copy fills) holds
    data yet (they start zeroed)."""
    return bool(out[:rank * n:4096].any() or out[(rank + 1) * n::4096].any())


def _buffers(coll, rank, world, victim, d):
    """(issue(comm, async_op), watch) for collective ``coll`` on this rank: ``watch()`` is true
    once data from a peer has landed in the victim's output."""
    # A collective with a single sender (broadcast, scatter, gather at world 2) has the least
    # work per slot: 8 blocks keep its data phase as long as the others'.
    n = BLOCK * (8 if coll in ("broadcast", "scatter", "gather") else 1)
    f32 = np.float32
    if coll == "all_reduce":
        x = np.full(n, rank + 1, f32)
        return (lambda c, a: c.all_reduce(x, async_op=a)), (lambda: bool((x[::4096] != rank + 1).any()))
    if coll == "reduce_scatter":
        inp, out = np.full(world * n, rank + 1, f32), np.zeros(n, f32)
        return (lambda c, a: c.reduce_scatter(out, inp, async_op=a)), (lambda: bool(out[::4096].any()))
    if coll == "all_gather":
        inp, out = np.full(n, rank + 1, f32), np.zeros(world * n, f32)
        return (lambda c, a: c.all_gather(out, inp, async_op=a)), (lambda: _peer_blocks_touched(out, rank, n))
    if coll == "broadcast":
        x = np.full(n, 0 if rank else 7, f32)
        return (lambda c, a: c.broadcast(x, root=0, async_op=a)), (lambda: bool(x[::4096].any()))
    if coll == "reduce":
        # Root 0, the victim only sends: the root watches its own buffer (a thread of the
        # survivor, see _survivor_kill) and marks "data-seen" at the victim's first data. The
        # mark takes a file and two threads to reach the victim: 16x the block keeps the data
        # phase far longer than that.
        x = np.full(16 * n, rank + 1, f32)
        if rank == victim:
            return ((lambda c, a: c.reduce(x, root=0, async_op=a)),
                    (lambda: os.path.exists(os.path.join(d, "data-seen"))))
        return ((lambda c, a: c.reduce(x, root=0, async_op=a)),
                (lambda: bool((x[::4096] != rank + 1).any())) if rank == 0 else None)
    if coll == "barrier":
        return (lambda c, a: c.barrier(async_op=a)), None
    if coll == "all_to_all":
        inp, out = np.full(world * n, rank + 1, f32), np.zeros(world * n, f32)
        return (lambda c, a: c.all_to_all(out, inp, async_op=a)), (lambda: _peer_blocks_touched(out, rank, n))
    if coll == "gather":
        inp = np.full(n, rank + 1, f32)
        out = np.zeros(world * n, f32) if rank == victim else None
        return ((lambda c, a: c.gather(out, inp, root=victim, async_op=a)),
                (lambda: _peer_blocks_touched(out, rank, n)) if rank == victim else None)
    if coll == "scatter":
        out = np.zeros(n, f32)
        inp = np.full(world * n, 5, f32) if rank == 0 else None
        return (lambda c, a: c.scatter(out, inp, root=0, async_op=a)), (lambda: bool(out[::4096].any()))
    if coll == "send_recv":
        # Every survivor sends to the victim, which receives from rank 0 first.
        if rank == victim:
            bufs = [np.zeros(n, f32) for _ in range(world - 1)]

            def issue(c, a):
                hs = [c.recv(b, src=r, async_op=True) for r, b in enumerate(bufs)]
                if not a:
                    for h in hs:
                        h.wait()
                return hs[0]
            return issue, (lambda: bool(bufs[0][::4096].any()))
        x = np.full(n, rank + 1, f32)
        answer = np.zeros(16, f32)

        # Then a receive from the victim, which never sends: where point-to-point is eager (the
        # outboxes from 3 ranks on: the victim's engine buffers an unexpected message at once) the
        # send may complete before the death, and the survivor waits on the dead peer there.
        def send_then_recv(c, a):
            h = c.send(x, dst=victim, async_op=a)
            if not a:
                c.recv(answer, src=victim)
            return h
        return send_then_recv, None
    raise ValueError(coll)


def _survivor_kill(d, rank, world, case):
    phase, coll = case["phase"], case["coll"]
    victim = world - 1
    if phase == "rendezvous":
        return {"init": _outcome(lambda: _init(d, rank, world, case["timeout"]).close())}
    comm = _init(d, rank, world, case["timeout"])
    try:
        if phase == "p2p":
            # A first message from the victim arrives; the survivor then waits in a recv for the
            # second, which never comes.
            first, second = np.zeros(16, np.float32), np.zeros(BLOCK, np.float32)
            comm.recv(first, src=victim)
            _mark(d, f"got-first-{rank}")
            out = _outcome(lambda: comm.recv(second, src=victim))
            return {"first": first.tolist()[:2], "call": out}
        issue, watch = _buffers(coll, rank, world, victim, d)
        if phase == "data" and coll == "reduce" and watch is not None:
            def mark_data():
                t_end = time.monotonic() + 30
                while not watch() and time.monotonic() < t_end:
                    pass
                _mark(d, "data-seen")
            threading.Thread(target=mark_data, daemon=True).start()
        _mark(d, f"calling-{rank}")
        return {"call": _outcome(lambda: issue(comm, False))}
    finally:
        comm.close()


def _victim_kill(d, rank, world, case):
    phase, coll = case["phase"], case["coll"]
    if phase == "rendezvous":
        from ringcomm.core.rendezvous import FileStore
        _init(d, rank, world, case["timeout"], _KillAtFirstPeerKey(FileStore(d, timeout=30), d, rank))
        return {"missed": "init returned"}
    comm = _init(d, rank, world, case["timeout"])
    if phase == "p2p":
        for r in range(world - 1):
            comm.send(np.full(16, 9, np.float32), dst=r)
        _wait_marks(d, [f"got-first-{r}" for r in range(world - 1)])
        os.kill(os.getpid(), signal.SIGKILL)
    issue, watch = _buffers(coll, rank, world, rank, d)
    if phase == "header":
        _wait_marks(d, [f"calling-{r}" for r in range(world) if r != rank])
        os.kill(os.getpid(), signal.SIGKILL)
    h = issue(comm, True)
    t_end = time.monotonic() + 30
    while not watch():
        if h.is_completed() or time.monotonic() > t_end:
            return {"missed": "the collective finished before any data was seen"}
    # A poller descheduled for the rest of the data phase sees the first data only once the
    # collective is done: killing now would inject nothing.
    if h.is_completed():
        return {"missed": "the collective finished while its first data was being watched for"}
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def _sigstop(d, rank, world, case):
    victim = world - 1
    comm = _init(d, rank, world, case["timeout"])
    if rank == victim:
        _wait_marks(d, [f"calling-{r}" for r in range(world) if r != rank])
        os.kill(os.getpid(), signal.SIGSTOP)
        return {"missed": "continued"}
    try:
        x = np.ones(8, np.float32)
        _mark(d, f"calling-{rank}")
        return {"call": _outcome(lambda: comm.all_reduce(x))}
    finally:
        comm.close()


def _clean_exit(d, rank, world, case):
    victim = world - 1
    comm = _init(d, rank, world, case["timeout"])
    x = np.ones(8, np.float32)
    comm.all_reduce(x)
    if rank == victim:
        comm.close()
        return {"first": x.tolist()}
    try:
        _wait_marks(d, ["reaped"])
        return {"first": x.tolist(), "call": _outcome(lambda: comm.all_reduce(x))}
    finally:
        comm.close()


def _late_peer(d, rank, world, case):
    comm = _init(d, rank, world, float("inf"))
    try:
        x = np.full(8, rank + 1, np.float32)
        if rank != 0:
            _wait_marks(d, ["calling-0"])
            time.sleep(case["late_s"])  # the lateness under test
        else:
            _mark(d, "calling-0")
        out = _outcome(lambda: comm.all_reduce(x))
        return {"call": out, "value": x.tolist()}
    finally:
        comm.close()


def _stale_store(d, rank, world, case):
    from ringcomm.core.rendezvous import FileStore
    if rank == 0:
        st = FileStore(d)
        for r in range(world):  # what a crashed run with the same prefix leaves behind
            st.set(f"fm/shm/{r}", f"/rc-stale-run-{os.getpid()}-{r}")
        _mark(d, "stale-written")
    else:
        _wait_marks(d, ["stale-written"])
        if case["missing"]:
            return {"skipped": True}
    res = {}

    def run():
        comm = _init(d, rank, world, case["timeout"])
        try:
            x = np.full(8, rank + 1, np.float32)
            comm.all_reduce(x)
            res["value"] = x.tolist()
        finally:
            comm.close()
    res["call"] = _outcome(run)
    return res


_ROLES = {"kill": (_survivor_kill, _victim_kill), "sigstop": (_sigstop, _sigstop),
          "exit": (_clean_exit, _clean_exit), "late": (_late_peer, _late_peer),
          "stale": (_stale_store, _stale_store)}


def _child(d, rank, world, case):
    code = 1
    try:
        os.environ.update(case.get("env", {}))
        survivor, victim = _ROLES[case["kind"]]
        fn = victim if rank == world - 1 else survivor
        try:
            res = fn(d, rank, world, case)
        except Exception as e:  # noqa: BLE001
            res = {"error": [type(e).__name__, str(e)]}
        with open(os.path.join(d, f"result-{rank}.json"), "w") as f:
            json.dump(res, f)
        code = 0
    finally:
        os._exit(code)


class _CaseRun:
    """One attempt at a case: its ranks fork()ed at construction; ``poll()`` reaps what has exited
    (without blocking, and only this case's children) and says whether the case is over; a case
    past its deadline has its ranks killed and reported as "hung"."""

    def __init__(self, root, idx, case, limit_s):
        self.d = os.path.join(root, f"case{idx}")
        os.makedirs(self.d, mode=0o700)
        self.case = case
        self.world = world = case["world"]
        self.pids = {}
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                _child(self.d, rank, world, case)
            self.pids[pid] = rank
        self.status = {}
        self.t_end = time.monotonic() + limit_s

    def poll(self) -> bool:
        victim = self.world - 1
        for pid, rank in list(self.pids.items()):
            got, st = os.waitpid(pid, os.WNOHANG)
            if got == 0:
                continue
            del self.pids[pid]
            self.status[rank] = f"signal {os.WTERMSIG(st)}" if os.WIFSIGNALED(st) else f"exit {os.WEXITSTATUS(st)}"
            if rank == victim:
                _mark(self.d, "reaped")
        if self.case["kind"] == "sigstop" and set(self.pids.values()) == {victim}:
            # Every survivor is done: the stopped peer has served its purpose.
            os.kill(next(iter(self.pids)), signal.SIGKILL)
        if self.pids and time.monotonic() >= self.t_end:
            for pid, rank in self.pids.items():
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                self.status[rank] = "hung"
            self.pids = {}
        return not self.pids

    def record(self) -> dict:
        results = []
        for rank in range(self.world):
            p = os.path.join(self.d, f"result-{rank}.json")
            results.append(json.load(open(p)) if os.path.exists(p) else None)
        return {"case": self.case, "status": [self.status[r] for r in range(self.world)],
                "results": results}


# Cases run this many at a time (each has its own store, segments and ranks; most of a case is
# waiting for a death to be detected or a timeout to pass).
PARALLEL = 2


def run_matrix(rank, world, cases, limit_s):
    """Run every case of ``cases`` (dicts: kind, world, phase, coll, timeout, ...), PARALLEL at a
    time; return one record per case, in order: the case, each rank's exit status, each rank's
    outcome. A case is run again (up to 3 attempts) while the victim reports that its fault
    missed the window it aims at (say, the collective completed between two polls of a
    descheduled poller): such an attempt injected nothing, so it says nothing about the library.
    The record says how many attempts it took."""
    import ringcomm  # noqa: F401 - imported once here, before the forks
    root = os.environ["RC_TEST_STORE"]
    records = [None] * len(cases)
    todo = list(range(len(cases)))
    attempts = [0] * len(cases)
    running = {}
    while todo or running:
        while todo and len(running) < PARALLEL:
            i = todo.pop(0)
            running[i] = _CaseRun(root, f"{i}-{attempts[i]}", cases[i], limit_s)
            attempts[i] += 1
        for i, run in list(running.items()):
            if not run.poll():
                continue
            del running[i]
            rec = run.record()
            victim_out = rec["results"][cases[i]["world"] - 1]
            if isinstance(victim_out, dict) and "missed" in victim_out and attempts[i] < 3:
                todo.insert(0, i)
                continue
            rec["attempts"] = attempts[i]
            records[i] = rec
        time.sleep(0.002)
    return records
