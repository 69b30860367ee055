"""Fault-injection cases run inside spawned ranks (module-level for spawn)."""
import os
import signal
import time

import numpy as np

from mp_cases import init_under_env


def _timed_call(fn):
    """(kind, message, seconds) of calling fn(): ("no error", "") or the exception's class name
    and text."""
    t0 = time.monotonic()
    try:
        fn()
        kind, msg = "no error", ""
    except Exception as e:  # noqa: BLE001
        kind, msg = type(e).__name__, str(e)
    return kind, msg, time.monotonic() - t0


def killed_rank(rank, world):
    """Rank 1 dies (SIGKILL) in the middle of a large all_reduce; the others must raise
    PeerFailureError within seconds."""
    import ringcomm
    comm = init_under_env(rank, world)
    x = np.ones(16 << 20, np.float32)
    comm.all_reduce(x[:10])
    if rank == 1:
        comm.all_reduce(x, async_op=True)
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(50):
            comm.all_reduce(x)
        return ("no error", 0.0, "")
    except ringcomm.PeerFailureError as e:
        return ("PeerFailureError", time.monotonic() - t0, str(e))
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, time.monotonic() - t0, str(e))
    finally:
        comm.close()


def mismatch(rank, world):
    """Different counts -> MismatchError on every rank; the communicator stays usable."""
    import ringcomm
    comm = init_under_env(rank, world)
    out = []
    try:
        comm.all_reduce(np.ones(10 + rank, np.float32))
        out.append("no error")
    except ringcomm.MismatchError as e:
        out.append(("MismatchError", str(e)))
    try:  # different collectives
        if rank == 0:
            comm.broadcast(np.ones(4, np.float32))
        else:
            comm.all_reduce(np.ones(4, np.float32))
        out.append("no error")
    except ringcomm.MismatchError as e:
        out.append(("MismatchError", str(e)))
    try:  # different dtypes
        comm.all_reduce(np.ones(4, np.float32 if rank == 0 else np.float64))
        out.append("no error")
    except ringcomm.MismatchError as e:
        out.append(("MismatchError", str(e)))
    x = np.ones(5, np.float32)
    comm.all_reduce(x)
    out.append(x.tolist())
    comm.close()
    return out


def timeout(rank, world):
    """Rank 1 is late: rank 0's all_reduce raises TimeoutError naming the op, rank, peer, seq."""
    import ringcomm
    comm = init_under_env(rank, world, timeout=1.0)
    try:
        if rank == 1:
            time.sleep(3.0)
        t0 = time.monotonic()
        comm.all_reduce(np.ones(4, np.float32))
        return ("no error", 0, "")
    except (ringcomm.TimeoutError, ringcomm.PeerFailureError) as e:
        return (type(e).__name__, time.monotonic() - t0, str(e))
    finally:
        comm.close()


def bad_inputs(rank, world):
    """Each bad argument raises a clear error on the bad rank and MismatchError on the others;
    nobody hangs, and the communicator keeps working."""
    import ringcomm
    import torch
    comm = init_under_env(rank, world)
    results = []

    def expect(name, fn, bad_rank_exc):
        try:
            fn()
            results.append((name, "no error"))
        except Exception as e:  # noqa: BLE001
            results.append((name, type(e).__name__))

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    expect("non-contiguous", lambda: comm.all_reduce(a.T if rank == 0 else np.ones((4, 3), np.float32)), None)
    ro = np.ones(4, np.float32)
    ro.flags.writeable = False
    expect("read-only", lambda: comm.all_reduce(ro if rank == 0 else np.ones(4, np.float32)), None)
    expect("wrong output size", lambda: comm.all_reduce(np.ones(4, np.float32),
                                                        output=np.ones(3 if rank == 0 else 4, np.float32)), None)
    expect("dtype mismatch", lambda: comm.all_gather(np.ones(8, np.float64 if rank == 0 else np.float32),
                                                     np.ones(4, np.float32)), None)
    expect("bad root", lambda: comm.broadcast(np.ones(4, np.float32), root=5 if rank == 0 else 0), None)
    expect("unsupported op", lambda: comm.all_reduce(np.ones(4, np.float32), op=ringcomm.ReduceOp.BAND), None)
    expect("unsupported dtype", lambda: comm.all_reduce(np.ones(4, np.complex64) if rank == 0
                                                        else np.ones(4, np.float32)), None)
    expect("non-contiguous torch", lambda: comm.all_reduce(torch.ones(4, 4).t() if rank == 0 else torch.ones(4, 4)), None)
    x = np.ones(3, np.float32)
    comm.all_reduce(x)
    results.append(("still works", x.tolist()))
    comm.close()
    try:
        comm.all_reduce(x)
        results.append(("after close", "no error"))
    except ringcomm.ClosedError:
        results.append(("after close", "ClosedError"))
    return results


def huge_timeout(rank, world, timeout, late_s):
    """A collective under an infinite or huge timeout: it completes, and a peer arriving late_s
    seconds after the other is waited for (no immediate TimeoutError)."""
    import ringcomm
    comm = init_under_env(rank, world, timeout=timeout)
    try:
        x = np.full(1000, rank + 1.0, np.float32)
        comm.all_reduce(x)
        first = float(x[0])
        if rank == 1:
            time.sleep(late_s)
        t0 = time.monotonic()
        y = np.ones(8, np.float32)
        comm.all_reduce(y)
        dt = time.monotonic() - t0
        comm.all_reduce(y, async_op=True).wait(timeout)  # Work.wait under the same timeout
        return ("ok", first, y.tolist(), dt)
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e))
    finally:
        comm.close()



def board_wrap(rank, world, last_seq):
    """Collectives numbered across the 2^32 wrap of the header board's word. Rank 1 is late for
    the first barrier, so it leaves it at once and posts the next header while rank 0 may still
    be reading the previous one (a board entry reused too early loses it)."""
    import ringcomm
    from ringcomm import _C_test
    comm = init_under_env(rank, world, timeout=5)
    _C_test.set_last_seq(comm._c, last_seq)
    try:
        if rank == 1:
            # Late, then two headers back to back from the progress thread: the second is
            # posted microseconds after the first, while rank 0 is still waking up to read it.
            time.sleep(0.5)
            works = [comm.barrier(async_op=True) for _ in range(2)]
            for w in works:
                w.wait()
        else:
            comm.barrier()
            comm.barrier()
        out = []
        for i in range(4):
            x = np.full(10 + i, rank + 1.0 + i, np.float32)
            comm.all_reduce(x)
            out.append(x.tolist())
        return ("ok", out, comm._c.next_seq())
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e), 0)
    finally:
        comm.close()


def _wait_gone(pid_file, limit_s=30.0):
    """Wait until the process whose pid is in pid_file has exited (gone or a zombie)."""
    t_end = time.monotonic() + limit_s
    while not os.path.exists(pid_file):
        assert time.monotonic() < t_end, "peer never wrote its pid"
        time.sleep(0.01)
    with open(pid_file) as f:
        pid = int(f.read())
    while time.monotonic() < t_end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"peer pid {pid} still running")


def closed_peer(rank, world):
    """Rank world-1 closes cleanly and exits; the others then use p2p (must work) and a
    collective (must raise a clear 'closed' error on every survivor, not 'died', not hang)."""
    import ringcomm
    comm = init_under_env(rank, world, timeout=20)
    x = np.ones(4, np.float32)
    comm.all_reduce(x)
    pid_file = os.path.join(os.environ["RC_TEST_STORE"], "closed-peer.pid")
    if rank == world - 1:
        comm.close()
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)
        return ("closed", x.tolist())
    _wait_gone(pid_file)
    time.sleep(0.3)  # several liveness slices (RINGCOMM_LIVENESS_MS=100) after the peer exited
    out = {"first": x.tolist()}
    try:
        n = 300000  # many slots: the p2p engine waits and probes peers in between
        if rank == 0:
            comm.send(np.arange(n, dtype=np.float32), dst=1)
            out["p2p"] = "sent"
        elif rank == 1:
            y = np.zeros(n, np.float32)
            comm.recv(y, src=0)
            out["p2p"] = bool((y == np.arange(n, dtype=np.float32)).all())
        else:
            out["p2p"] = "idle"
        time.sleep(0.3)
    except Exception as e:  # noqa: BLE001
        out["p2p"] = (type(e).__name__, str(e))
    kind, msg, out["coll_s"] = _timed_call(lambda: comm.all_reduce(np.ones(4, np.float32)))
    out["coll"] = (kind, msg)
    comm.close()
    return out


def small_shm(rank, world):
    """Init and a 16 MiB all_reduce with default slots in a /dev/shm too small for the
    segments: init must raise a RingcommError naming the sizes and the fixes (never SIGBUS)."""
    import ringcomm
    try:
        comm = init_under_env(rank, world, timeout=20)
    except Exception as e:  # noqa: BLE001
        return ("init", type(e).__name__, isinstance(e, ringcomm.RingcommError), str(e))
    try:
        x = np.ones(4 << 20, np.float32)
        comm.all_reduce(x)
        return ("ok", "", True, str(x[0]))
    except Exception as e:  # noqa: BLE001
        return ("data", type(e).__name__, isinstance(e, ringcomm.RingcommError), str(e))
    finally:
        comm.close()


def _mark(name):
    path = os.path.join(os.environ["RC_TEST_STORE"], name)
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)


def _wait_mark(name, limit_s=60.0):
    path = os.path.join(os.environ["RC_TEST_STORE"], name)
    t_end = time.monotonic() + limit_s
    while not os.path.exists(path):
        assert time.monotonic() < t_end, f"mark {name} never appeared"
        time.sleep(0.005)


def close_during_call(rank, world, modes):
    """For each mode, rank 0 runs a call on a second thread that its peer never joins while the
    main thread closes the communicator: the call raises ClosedError promptly (nothing crashes,
    nothing hangs). Modes: barrier, all_reduce (sync, running inline), async (all_reduce with
    async_op, wait() on the thread), recv (sync p2p), race (async barriers submitted in a loop
    while close() runs: each is refused or fails, none hangs)."""
    import threading
    import ringcomm
    results = {}
    for mode in modes:
        comm = init_under_env(rank, world, "close-" + mode, timeout=60)
        comm.all_reduce(np.ones(4, np.float32))  # connected and in step
        if rank != 0:
            _wait_mark("closed-" + mode)
            comm.close()
            continue
        seq0 = comm._c.next_seq()
        out = {}
        works = []

        def call():
            try:
                if mode == "barrier":
                    comm.barrier()
                elif mode == "all_reduce":
                    comm.all_reduce(np.ones(1 << 16, np.float32))
                elif mode == "async":
                    comm.all_reduce(np.ones(1 << 16, np.float32), async_op=True).wait()
                elif mode == "recv":
                    comm.recv(np.zeros(16, np.float32), src=1)
                elif mode == "race":
                    while True:
                        works.append(comm.barrier(async_op=True))
                out["call"] = ("no error", "")
            except Exception as e:  # noqa: BLE001
                out["call"] = (type(e).__name__, str(e))
            out["t_end"] = time.monotonic()

        th = threading.Thread(target=call, daemon=True)
        th.start()
        # The call has been issued (collectives take a sequence number; p2p has none).
        t_end = time.monotonic() + 30
        while mode != "recv" and comm._c.next_seq() == seq0 and time.monotonic() < t_end:
            time.sleep(0.001)
        time.sleep(0.2)  # let it reach its wait (close() before the wait must work as well)
        t0 = time.monotonic()
        comm.close()
        out["close_s"] = time.monotonic() - t0
        th.join(30)
        out["joined"] = not th.is_alive()
        out["call_s"] = out.get("t_end", float("inf")) - t0
        waits = []
        for w in works:
            try:
                w.wait(10)
                waits.append("no error")
            except Exception as e:  # noqa: BLE001
                waits.append(type(e).__name__)
        out["waits"] = sorted(set(waits))
        try:
            comm.barrier()
            out["after"] = "no error"
        except Exception as e:  # noqa: BLE001
            out["after"] = type(e).__name__
        _mark("closed-" + mode)
        results[mode] = out
    return results


def calls_from_threads(rank, world, nthreads, ncalls):
    """Several threads issue identical all_reduces on one communicator at once: the calls are
    serialized in issue order (each rank numbers them 1..N in the order they were issued), so
    every result is the sum over ranks, whatever the interleaving."""
    import threading
    comm = init_under_env(rank, world, "threads", timeout=60)
    bad = []
    seqs = []
    lock = threading.Lock()

    def worker(t):
        for i in range(ncalls):
            x = np.full(257, rank + 1.0, np.float32)
            w = comm.all_reduce(x, async_op=(i % 2 == 1))
            if w is not None:
                w.wait()
            if not (x == world * (world + 1) / 2).all():
                with lock:
                    bad.append((t, i, float(x[0])))
            with lock:
                seqs.append(t)

    ths = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60)
    alive = sum(th.is_alive() for th in ths)
    n = comm._c.next_seq()
    comm.close()
    return bad, alive, len(seqs), n


def fork_after_init(rank, world):
    """Rank 0 forks twice after init. Each child's call raises ClosedError naming the fork; the
    first child closes, the second only drops its reference (the destructor runs); both exit 0
    without touching the parent's shared memory, so the parents' next collectives still work."""
    import gc
    import json
    import ringcomm
    comm = init_under_env(rank, world, "fork", timeout=10)
    x = np.full(64, rank + 1.0, np.float32)
    comm.all_reduce(x)
    out = {"before": float(x[0]), "children": []}
    if rank == 0:
        for how in ("close", "destructor"):
            res_path = os.path.join(os.environ["RC_TEST_STORE"], f"fork-child-{how}.json")
            pid = os.fork()
            if pid == 0:  # the child: report through a file, never return into the harness
                code = 1
                try:
                    res = {"closed": comm.closed}
                    t0 = time.monotonic()
                    try:
                        comm.all_reduce(np.ones(64, np.float32))
                        res["call"] = ("no error", "")
                    except Exception as e:  # noqa: BLE001
                        res["call"] = (type(e).__name__, str(e))
                    res["call_s"] = time.monotonic() - t0
                    try:
                        comm._c.barrier(False)  # straight into the core, past the Python checks
                        res["core"] = "no error"
                    except Exception as e:  # noqa: BLE001
                        res["core"] = type(e).__name__
                    if how == "close":
                        comm.close()
                        comm.close()
                        res["closed_after"] = comm.closed
                    with open(res_path + ".tmp", "w") as f:
                        json.dump(res, f)
                    os.rename(res_path + ".tmp", res_path)
                    if how == "destructor":
                        del comm  # the last reference: the core's destructor runs here
                        gc.collect()
                    code = 0
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            with open(res_path) as f:
                child = json.load(f)
            out["children"].append((how, os.waitstatus_to_exitcode(status), child))
    y = np.full(1000, rank + 1.0, np.float32)
    comm.all_reduce(y)
    comm.barrier()
    out["after"] = float(y[0]), float(y[-1])
    comm.close()
    return out



def forged_counts(rank, world):
    """Headers whose per-rank counts are out of range but pass the totals check (a negative
    count balanced by a larger one): every rank raises MismatchError before any data moves, no
    buffer is written out of bounds, and the communicator stays usable. A fresh process: the
    forged header is a hook of the test build's core (tests/hooked_build.py)."""
    import hooked_build
    _C_test = hooked_build.use()
    import ringcomm
    comm = init_under_env(rank, world, "forged", timeout=20)
    out = []
    guard = 4096

    def attempt(name, fn):
        try:
            fn()
            out.append((name, "no error", ""))
        except ringcomm.MismatchError as e:
            out.append((name, "MismatchError", str(e)))
        except Exception as e:  # noqa: BLE001
            out.append((name, type(e).__name__, str(e)))

    # all_gather: 2 elements each into 2*world; rank 0 claims -2, rank 1 claims 2 + 2 + 2.
    buf = np.full(guard + 2 * world + guard, -7.0, np.float32)
    dst = buf[guard:guard + 2 * world]
    if rank < 2:
        _C_test.forge_next_header(comm._c, 2 * world, -2 if rank == 0 else 6)
    attempt("all_gather", lambda: comm.all_gather(dst, np.full(2, rank + 1.0, np.float32)))
    intact = bool((buf == -7.0).all())
    # all_to_all: inputs total 2*world^2 across ranks and so do the claimed outputs, but rank 0
    # claims -1 output elements (and rank 1 the difference).
    if rank < 2:
        _C_test.forge_next_header(comm._c, 2 * world, -1 if rank == 0 else 4 * world + 1)
    attempt("all_to_all", lambda: comm.all_to_all(np.zeros(2 * world, np.float32), np.ones(2 * world, np.float32)))
    # gather: every rank claims -3 elements (equal, so the equality check alone passes).
    _C_test.forge_next_header(comm._c, -3, 0)
    gout = np.full(4 * world, -7.0, np.float32) if rank == 0 else None
    attempt("gather", lambda: comm.gather(gout, np.ones(4, np.float32), root=0))
    x = np.full(5, rank + 1.0, np.float32)
    comm.all_reduce(x)
    comm.close()
    return out, intact, x.tolist(), (gout == -7.0).all().item() if gout is not None else True


def self_split_mismatch(rank, world):
    """Rank 0's all_to_all sends 2 elements to itself but expects 3 (totals still agree):
    MismatchError on every rank before any data moves; the communicator stays usable."""
    import ringcomm
    comm = init_under_env(rank, world, "selfsplit", timeout=20)
    n = 2 * world
    out_splits = [3, 1] + [2] * (world - 2) if rank == 0 else None
    try:
        comm.all_to_all(np.zeros(n, np.float32), np.ones(n, np.float32), output_splits=out_splits)
        res = ("no error", "")
    except Exception as e:  # noqa: BLE001
        res = (type(e).__name__, str(e))
    x = np.arange(n, dtype=np.float32) + 100 * rank
    y = np.zeros(n, np.float32)
    comm.all_to_all(y, x)
    comm.close()
    return res, y.tolist()


def abort_and_recover(rank, world):
    """torchft-style recovery. Communicator A: ranks 1.. wait in an all_reduce that rank 0 never
    joins; rank 0 has a recv pending on a thread and calls abort() from 4 threads at once. Every
    pending and later call raises promptly on every rank, each abort reason arrives whole, and
    errored() reports the first error. Then a new communicator B on the same store works, and
    set_timeout() bounds its next wait."""
    import threading
    import ringcomm
    out = {}
    a = init_under_env(rank, world, "recover", timeout=60)
    x = np.full(8, rank + 1.0, np.float32)
    a.all_reduce(x)
    out["a_sum"] = float(x[0])
    out["errored_before"] = a.errored()
    t0 = time.monotonic()
    if rank == 0:
        pending = {}

        def recv():
            try:
                a.recv(np.zeros(4, np.float32), src=1)
                pending["recv"] = ("no error", "")
            except Exception as e:  # noqa: BLE001
                pending["recv"] = (type(e).__name__, str(e))
            pending["recv_s"] = time.monotonic() - t0

        rt = threading.Thread(target=recv)
        rt.start()
        _wait_mark("recover-waiting-%d" % (world - 1))
        time.sleep(0.2)  # the peers are inside their all_reduce, the recv inside the engine
        go = threading.Barrier(4)

        def abort(letter):
            go.wait()
            a.abort(letter * 600)

        ths = [threading.Thread(target=abort, args=(c,)) for c in "WXYZ"]
        t0 = time.monotonic()
        for th in ths:
            th.start()
        for th in ths:
            th.join(10)
        rt.join(10)
        out["recv"] = pending.get("recv", ("hung", ""))
        out["recv_s"] = pending.get("recv_s", float("inf"))
    else:
        if rank == world - 1:
            _mark("recover-waiting-%d" % rank)
        try:
            a.all_reduce(np.ones(1 << 10, np.float32))
            out["pending"] = ("no error", "")
        except Exception as e:  # noqa: BLE001
            out["pending"] = (type(e).__name__, str(e))
        out["pending_s"] = time.monotonic() - t0
    kind, msg, out["later_s"] = _timed_call(a.barrier)
    out["later"] = (kind, msg)
    err = a.errored()
    out["errored"] = (type(err).__name__, str(err)) if err is not None else None
    a.close()
    # A new attempt on the same store.
    b = init_under_env(rank, world, "recover", timeout=60)
    y = np.full(1000, rank + 1.0, np.float32)
    b.all_reduce(y)
    out["b_sum"] = float(y[0]), float(y[-1])
    out["b_errored"] = b.errored()
    if rank == 0:
        b.set_timeout(0.5)
        out["b_timeout"] = b.timeout
    else:
        time.sleep(2.0)  # late: rank 0's barrier times out under its new timeout
    kind, msg, out["late_s"] = _timed_call(b.barrier)
    out["late"] = (kind, msg)
    b.close()
    return out


def init_failure(rank, world):
    """The last rank fails during init (an invalid slot count): the others raise PeerFailureError
    naming it within seconds, not after their whole timeout."""
    if rank == world - 1:
        os.environ["RINGCOMM_NSLOTS"] = "3"
    t0 = time.monotonic()
    try:
        comm = init_under_env(rank, world, "initfail", timeout=60)
        comm.close()
        return ("no error", "", time.monotonic() - t0)
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e), time.monotonic() - t0)


def p2p_deadline_from_progress(rank, world):
    """Timeout 2 s. Rank 1 posts two receives at once; rank 0 sends the first after 1.4 s and the
    second after 2.8 s. Counted from submission the second would expire at 2 s; counted from
    the last progress (the first message, at 1.4 s) it expires at 3.4 s and completes."""
    comm = init_under_env(rank, world, "p2pdeadline", timeout=2.0)
    comm.barrier()
    t0 = time.monotonic()
    try:
        if rank == 1:
            a, b = np.zeros(16, np.float32), np.zeros(16, np.float32)
            wa = comm.recv(a, src=0, async_op=True)
            wb = comm.recv(b, src=0, async_op=True)
            wa.wait()
            ta = time.monotonic() - t0
            wb.wait()
            res = ("ok", ta, time.monotonic() - t0, a.tolist() == [1.0] * 16 and b.tolist() == [2.0] * 16)
        else:
            time.sleep(1.4)
            comm.send(np.ones(16, np.float32), dst=1)
            time.sleep(1.4)
            comm.send(np.full(16, 2.0, np.float32), dst=1)
            res = ("ok", 0.0, time.monotonic() - t0, True)
    except Exception as e:  # noqa: BLE001
        res = (type(e).__name__, str(e), time.monotonic() - t0, False)
    comm.close()
    return res


def tagged_p2p(rank, world, n):
    """Tag matching: rank 0 sends (asynchronously: each is larger than the channel and the eager
    size, so it completes only once its receive takes it) messages with tags 1, 2, 1, 0; rank 1
    receives tag 2 first, then tag 1 twice, then tag 0. Each receive gets the message of its tag,
    in send order per tag."""
    comm = init_under_env(rank, world, "tags", timeout=30)
    msgs = [(1, np.arange(n, dtype=np.float32)), (2, np.arange(n, dtype=np.float32) + 1e6),
            (1, np.arange(n, dtype=np.float32) * 2), (0, np.full(n, 7.0, np.float32))]
    if rank == 0:
        for h in [comm.send(x, dst=1, tag=tag, async_op=True) for tag, x in msgs]:
            h.wait()
        res = "sent"
    else:
        got = []
        for tag, want in [(2, msgs[1][1]), (1, msgs[0][1]), (1, msgs[2][1]), (0, msgs[3][1])]:
            y = np.zeros(n, np.float32)
            comm.recv(y, src=0, tag=tag)
            got.append(bool((y == want).all()))
        # Async receives posted in the opposite order of the sends still match by tag.
        ys = {t: np.zeros(n, np.float32) for t in (5, 6)}
        ws = [comm.recv(ys[6], src=0, tag=6, async_op=True), comm.recv(ys[5], src=0, tag=5, async_op=True)]
        comm.barrier()
        for w in ws:
            w.wait()
        got.append(bool((ys[5] == 5.0).all() and (ys[6] == 6.0).all()))
        res = got
    if rank == 0:
        comm.barrier()
        comm.send(np.full(n, 5.0, np.float32), dst=1, tag=5)
        comm.send(np.full(n, 6.0, np.float32), dst=1, tag=6)
    x = np.ones(4, np.float32)
    comm.all_reduce(x)
    comm.close()
    return res, x.tolist()


def torch_work_group_timeout(rank, world, group_timeout_s, set_after):
    """torch backend, group timeout ``group_timeout_s`` (given to ``init_process_group``, or when
    ``set_after`` set on the group's backend after a 120 s init, as a watchdog does): rank 0 issues an async all_reduce and
    calls ``work.wait()`` with no timeout; rank 1 joined the group but never issues the collective
    (it waits for rank 0's outcome on a file). Rank 0's wait must raise within about the group
    timeout. Returns rank 0: (exception class, its text, seconds); rank 1: "idle"."""
    import datetime
    import torch
    import torch.distributed as dist
    import ringcomm.torch  # noqa: F401 - registers the backend
    store = os.environ["RC_TEST_STORE"]
    dist.init_process_group("ringcomm", init_method="file://" + os.path.join(store, "pg"),
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120 if set_after else group_timeout_s))
    if set_after:
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        backend.set_timeout(datetime.timedelta(seconds=group_timeout_s))
    done_path = os.path.join(store, "rank0.done")
    try:
        if rank == 0:
            work = dist.all_reduce(torch.ones(8), async_op=True)
            out = _timed_call(work.wait)
            with open(done_path, "w") as f:
                f.write("done")
            return out
        limit = time.monotonic() + 10 * group_timeout_s + 30
        while not os.path.exists(done_path) and time.monotonic() < limit:
            time.sleep(0.05)
        return "idle"
    finally:
        dist.destroy_process_group()
