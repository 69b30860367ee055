"""One rank of tests/test_cuda_fake.py: the production CUDA communicator over the fake runtime.
usage: rank.py RANK WORLD DIR SCENARIO; the setup bytes travel through files in DIR; the result is
DIR/out_RANK.json."""
import ctypes
import json
import os
import random
import sys
import time
from pathlib import Path

from ringcomm import _C_cuda_fake as fake

F32, SUM = 0, 0
QUERIES = {"cudaStreamQuery", "cudaStreamSynchronize", "cudaEventQuery"}
SETUP = {"cudaMalloc", "cudaHostAlloc", "cudaHostRegister", "cudaIpcOpenMemHandle"}


def publish(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: the test and the peers poll for it and read it once it exists."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)


def write_out(d: Path, rank: int, out: dict) -> None:
    publish(d / f"out_{rank}.json", json.dumps(out).encode())


def exchange(d: Path, rank: int, world: int, name: str, data: bytes) -> list:
    publish(d / f"{name}_{rank}", data)
    out = []
    for r in range(world):
        p = d / f"{name}_{r}"
        t0 = time.monotonic()
        while not p.exists():
            assert time.monotonic() - t0 < 20, f"rank {r} never wrote {name}"
            time.sleep(0.005)
        out.append(p.read_bytes())
    return out


def barrier(d, rank, world, name):
    exchange(d, rank, world, name, b"")


def call_log(fn):
    """Run fn, returning its result and the runtime calls and launches it made."""
    fake.clear()
    r = fn()
    return r, fake.calls(), fake.launches()


class Arr:
    """A float32 CUDA array of the fake runtime, seen through the CUDA array interface."""

    def __init__(self, ptr: int, n: int):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (n,), "typestr": "<f4", "version": 3}


def kernel_calls(calls):
    """The calls that load or size a kernel: (name, kernel address)."""
    return [(c["name"], c["arg"]) for c in calls
            if c["name"] in ("cudaFuncGetAttributes", "cudaOccupancyMaxActiveBlocksPerMultiprocessor")]


def wait_errored(comm, out, t0, limit=10.0):
    while comm.errored() is None and time.monotonic() - t0 < limit:
        time.sleep(0.001)
    out["errored_after_s"] = time.monotonic() - t0
    out["errored"] = comm.errored()


def wait_error(w):
    try:
        w.wait()
        return None
    except Exception as e:  # noqa: BLE001 - the type is what the test checks
        return [type(e).__name__, str(e)]


def call_error(fn):
    try:
        fn().wait()
        return None
    except Exception as e:  # noqa: BLE001
        return [type(e).__name__, str(e)]


def f32(ptr: int, n: int):
    """n float32 elements of the fake's device memory (this process's mapping)."""
    return (ctypes.c_float * n).from_address(ptr)


FUSED = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")
HOST = ("gather", "scatter", "all_to_all", "barrier", "all_gather_unequal", "sendrecv")


def stress_plan(seed: int, calls: int, world: int) -> list:
    """The seeded call sequence every rank runs: (op, params), fused and host-ordered mixed, in
    bursts of either kind so that a fast rank runs several fused calls between two exchanges."""
    rng = random.Random(seed)
    plan = []
    while len(plan) < calls:
        kind = FUSED if rng.random() < 0.5 else HOST
        for _ in range(rng.randint(1, 6)):
            op = rng.choice(kind)
            p = {"count": rng.randint(1, 64), "root": rng.randrange(world)}
            if op == "all_to_all":
                p["counts"] = [[rng.randint(0, 16) for _ in range(world)] for _ in range(world)]  # [src][dst]
            elif op == "all_gather_unequal":
                c = [rng.randint(1, 32) for _ in range(world)]
                while any(x * world == sum(c) for x in c):  # no rank's part is the equal one (it would fuse)
                    c[-1] += 1
                p["counts"] = c
            elif op == "sendrecv":
                a, b = rng.sample(range(world), 2)
                p["pair"] = [a, b]
            plan.append((op, p))
    return plan[:calls]


def stress_diverge(plan: list, at: int, world: int) -> tuple:
    """The call the diverging rank makes at `at` instead of plan[at]: one of the other kind (a
    fused call for a host-ordered one and the reverse), so that the host path sees it."""
    op, p = plan[at]
    if op in FUSED:
        return ("gather", {"count": p["count"], "root": p["root"]})
    return ("all_reduce", {"count": p.get("count", 8), "root": 0})


def stress_value(i: int, r: int, j: int) -> float:
    """Element j of rank r's input at call i: exact in float32, distinct per (i mod 50, r, j)."""
    return float((i % 50) * 100000 + r * 1000 + j)


def stress_call(comm, rank, world, s, buf, i, op, p):
    """Run call i on this rank; returns the mismatches found in its output (host-ordered calls)."""
    bad = []
    cnt, root = p.get("count", 0), p.get("root", 0)
    if op in FUSED:
        if op == "all_reduce":
            w = comm.all_reduce(buf["in"], buf["out"], cnt, F32, SUM, s)
        elif op == "reduce_scatter":
            w = comm.reduce_scatter(buf["in"], buf["out"], cnt * world, F32, SUM, s)
        elif op == "all_gather":
            w = comm.all_gather(buf["in"], buf["out"], cnt, cnt * world, F32, s)
        elif op == "broadcast":
            w = comm.broadcast(buf["out"], cnt, F32, root, s)
        else:
            w = comm.reduce(buf["in"], buf["out"], cnt, F32, SUM, root, s)
        w.wait()
        return bad
    src, dst = f32(buf["in"], 1000 * world), f32(buf["out"], 1000 * world)
    if op == "barrier":
        comm.barrier(s).wait()
    elif op == "gather":
        for j in range(cnt):
            src[j] = stress_value(i, rank, j)
        dst[:cnt * world] = [-1.0] * (cnt * world)
        comm.gather(buf["in"], buf["out"], cnt, F32, root, s).wait()
        if rank == root:
            bad += [(r, j) for r in range(world) for j in range(cnt) if dst[r * cnt + j] != stress_value(i, r, j)]
    elif op == "scatter":
        if rank == root:
            for r in range(world):
                for j in range(cnt):
                    src[r * cnt + j] = stress_value(i, r, j)
        dst[:cnt] = [-1.0] * cnt
        comm.scatter(buf["in"], buf["out"], cnt, F32, root, s).wait()
        bad += [j for j in range(cnt) if dst[j] != stress_value(i, rank, j)]
    elif op == "all_to_all":
        c = p["counts"]
        send, recv = c[rank], [c[q][rank] for q in range(world)]
        k = 0
        for d in range(world):
            for j in range(send[d]):
                src[k] = stress_value(i, rank, d * 100 + j)
                k += 1
        dst[:sum(recv)] = [-1.0] * sum(recv)
        comm.all_to_all(buf["in"], buf["out"], send, recv, F32, s).wait()
        k = 0
        for q in range(world):
            for j in range(recv[q]):
                if dst[k] != stress_value(i, q, rank * 100 + j):
                    bad.append((q, j))
                k += 1
    elif op == "all_gather_unequal":
        c = p["counts"]
        for j in range(c[rank]):
            src[j] = stress_value(i, rank, j)
        dst[:sum(c)] = [-1.0] * sum(c)
        comm.all_gather(buf["in"], buf["out"], c[rank], sum(c), F32, s).wait()
        k = 0
        for q in range(world):
            for j in range(c[q]):
                if dst[k] != stress_value(i, q, j):
                    bad.append((q, j))
                k += 1
    elif op == "sendrecv":
        a, b = p["pair"]
        if rank in (a, b):
            peer = b if rank == a else a
            for j in range(cnt):
                src[j] = stress_value(i, rank, j)
            dst[:cnt] = [-1.0] * cnt
            ws = [comm.send(buf["in"], cnt * 4, peer, i, s), comm.recv(buf["out"], cnt * 4, peer, i, s)]
            for w in ws:
                w.wait()
            bad += [j for j in range(cnt) if dst[j] != stress_value(i, peer, j)]
    return bad


def stress(comm, rank, world, s, buf, n):
    """Scenario "stress": the seeded plan (STRESS_SEED, STRESS_CALLS) with a random sleep of 0-2 ms
    before half the calls, chosen per rank; STRESS_DIVERGE=R,K: rank R calls stress_diverge()'s call
    at K (the first call from K on that is not a send/recv) instead, then follows the plan again.
    STRESS_DIVERGE=R,K,stall: the first host-ordered collective from K on, which rank R runs fused,
    then makes no call and waits for errored() (as a rank whose kernel waits for pieces no peer
    sends: the peers' header waits can only see its fused word). STRESS_LAST_SEQ: the number the
    first call follows (set_last_seq; 0: none). STRESS_CLOSE=R,K: rank R closes its communicator
    after call K, while the others go on (without the send/recv pairs with R). Stops at the first error."""
    seed, calls = int(os.environ["STRESS_SEED"]), int(os.environ["STRESS_CALLS"])
    last_seq = int(os.environ.get("STRESS_LAST_SEQ", "0"))
    close_after = [int(x) for x in os.environ.get("STRESS_CLOSE", "-1,-1").split(",")]
    if last_seq:
        comm.set_last_seq(last_seq)
    plan = stress_plan(seed, calls, world)
    spec = os.environ.get("STRESS_DIVERGE", "-1,-1").split(",")
    div, stall = [int(spec[0]), int(spec[1])], spec[2:] == ["stall"]
    skip = ("sendrecv",) + (FUSED if stall else ())
    while 0 <= div[1] < calls and plan[div[1]][0] in skip:
        div[1] += 1  # the board never sees point-to-point calls: a missing send is a timeout
    delay = random.Random(seed * 7919 + rank + 1)
    res = {"done": 0, "bad": [], "error": None, "kinds": [op for op, _ in plan], "diverge_at": div[1]}
    t0 = time.monotonic()
    for i, (op, p) in enumerate(plan):
        if op == "sendrecv" and close_after[0] in p["pair"] and i > close_after[1]:
            continue  # what checks the closed rank is the board: a pending recv from it waits out the timeout
        diverge = div[0] == rank and div[1] == i
        if diverge:
            op, p = stress_diverge(plan, i, world)
            res["t_diverged"] = time.monotonic()  # CLOCK_MONOTONIC: comparable between the ranks
        if delay.random() < 0.5:  # else none: a run of calls back to back on a fast rank
            time.sleep(delay.uniform(0.0, 0.002))
        if i % 32 == 0:
            fake.clear()  # the fake's call log grows with every call
        try:
            bad = stress_call(comm, rank, world, s, buf, i, op, p)
        except Exception as e:  # noqa: BLE001 - the type is what the test checks
            res["error"] = [i, type(e).__name__, str(e)]
            break
        if bad:
            res["bad"].append([i, op, bad[:4]])
        res["done"] = i + 1
        if diverge and stall:
            break
        if close_after == [rank, i]:
            res["t_closed"] = time.monotonic()
            comm.close()
            res["close_s"] = time.monotonic() - res["t_closed"]
            return res
    res["elapsed_s"] = time.monotonic() - t0
    res["posted"] = comm.headers_posted()
    res["next_seq"] = comm.next_seq()
    if res["error"] is not None or res["done"] < calls:
        wait_errored(comm, res, t0 + res["elapsed_s"])
    else:
        res["errored"] = comm.errored()
    res["t_errored"] = time.monotonic()
    return res


def main():
    rank, world, d, scenario = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    if os.environ.get("FAKE_CUDA_ONE_CPU"):  # every rank on one CPU: a waiter runs only when the others wait
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    comm = fake.Communicator(rank, world, int(os.environ.get("FAKE_CUDA_DEVICE", "0")), 5.0)
    infos = exchange(d, rank, world, "info", comm.local_info())
    if os.environ.get("PAUSE_BEFORE_CREATE"):  # until DIR/go: the test changes the GPU ledger meanwhile
        while not (d / "go").exists():
            time.sleep(0.005)
    try:
        blob = comm.create(infos)
    except Exception as e:  # noqa: BLE001 - a refused setup is what scenarios "refused" and "ledger" check
        if scenario not in ("refused", "ledger"):
            raise
        write_out(d, rank, {"create_error": [type(e).__name__, str(e)]})
        comm.close()
        return
    blobs = exchange(d, rank, world, "blob", blob)
    try:
        comm.connect(blobs)
    except Exception as e:  # noqa: BLE001 - a reservation lost to a concurrent init ("ledger")
        if scenario != "ledger":
            raise
        write_out(d, rank, {"connect_error": [type(e).__name__, str(e)]})
        comm.close()
        return
    setup_log = fake.calls()
    setup_calls = kernel_calls(setup_log)
    s = fake.new_stream()
    n = 1000
    buf = {k: fake.device_alloc(n * 4 * world) for k in ("in", "out", "in2", "out2")}
    out = {"caller": fake.stream_id(s), "registered": comm.ring_registered(), "buffers": buf}

    if scenario == "device":
        calls = {}
        for name, fn in [("all_reduce", lambda: comm.all_reduce(buf["in"], buf["out"], n, F32, SUM, s)),
                         ("reduce_scatter", lambda: comm.reduce_scatter(buf["in"], buf["out"], n * world, F32, SUM, s)),
                         ("all_gather", lambda: comm.all_gather(buf["in"], buf["out"], n, n * world, F32, s))]:
            posted = comm.headers_posted()
            w, c, ls = call_log(fn)
            calls[name] = {"calls": c, "launches": ls, "posted": comm.headers_posted() - posted}
            w.wait()
        out["eager"] = calls
        # A host-ordered call after the fused ones: one header, paired with the peers' (the board
        # counts exchanges, not calls).
        posted = comm.headers_posted()
        comm.barrier(s).wait()
        out["barrier_posted"] = comm.headers_posted() - posted
        out["barrier_errored"] = comm.errored()
        # Capture: the caller's stream captures one all_reduce; the graph is replayed three times.
        fake.clear()
        fake.begin_capture(s)
        w = comm.all_reduce(buf["in2"], buf["out2"], n, F32, SUM, s)
        g = fake.end_capture(s)
        out["captured_work_done"] = w.is_completed()
        out["captured"] = {"calls": fake.calls(), "launches": fake.launches(), "graph": g}
        fake.clear()
        out["replays"] = [fake.replay(g) for _ in range(3)]
        out["replayed"] = fake.launches()
        # A host-ordered collective under capture raises, on this rank only, and leaves the
        # communicator usable.
        fake.begin_capture(s)
        try:
            comm.gather(buf["in"], buf["out"], n, F32, 0, s)
            out["host_capture_error"] = None
        except Exception as e:  # noqa: BLE001 - the type is what the test checks
            out["host_capture_error"] = [type(e).__name__, str(e)]
        fake.end_capture(s)
        w = comm.all_reduce(buf["in"], buf["out"], n, F32, SUM, s)
        w.wait()
        out["after_capture_ok"] = comm.errored() is None
        # A status record (what a kernel's failing lane writes) becomes a typed error without a wait.
        last = fake.launches()[-1]
        out["status_addr"], out["abort_addr"] = last["status"], last["abort"]
        barrier(d, rank, world, "before_status")
        t0 = time.monotonic()
        if rank == 0:
            fake.write_status(last["status"], 3, 0, 1, 2, 1, 7, 11, 13, 4)  # field 4: dtype
        while comm.errored() is None and time.monotonic() - t0 < 10:
            time.sleep(0.001)
        out["errored_after_s"] = time.monotonic() - t0
        out["errored"] = comm.errored()
        out["abort_word"] = fake.read_u32(last["abort"])
        out["work_done"] = w.is_completed()
        try:
            w.wait()
            out["wait_error"] = None
        except Exception as e:  # noqa: BLE001
            out["wait_error"] = [type(e).__name__, str(e)]
    elif scenario == "status_mismatch":
        # One rank's kernel finds a mismatched slot header; every rank must raise MismatchError.
        w = comm.all_reduce(buf["in"], buf["out"], n, F32, SUM, s)
        w.wait()
        last = fake.launches()[-1]
        w = comm.all_reduce(buf["in"], buf["out"], n, F32, SUM, s)
        barrier(d, rank, world, "before_status")
        t0 = time.monotonic()
        if rank == 0:
            fake.write_status(last["status"], 3, 0, world - 1, 1, 0, 2, 40, 48, 8)  # field 8: bytes
        wait_errored(comm, out, t0)
        out["abort_word"] = fake.read_u32(last["abort"])
        out["wait_error"] = wait_error(w)
        out["after"] = call_error(lambda: comm.all_reduce(buf["in"], buf["out"], n, F32, SUM, s))
    elif scenario == "mixed":
        # The same call routed differently: world 2, an all_reduce (fused) beside a gather (host
        # path); world 3, an all_gather of 2, 3 and 4 elements: rank 1's is the output's equal part
        # (fused), ranks 0 and 2 take the host path. No rank may hang; each raises MismatchError.
        comm.all_reduce(buf["in"], buf["out"], n, F32, SUM, s).wait()  # a matched fused call first
        barrier(d, rank, world, "before_mixed")
        t0 = time.monotonic()
        if world == 2 and os.environ.get("MIXED") != "rejected":
            fn = (lambda: comm.all_reduce(buf["in"], buf["out"], n, F32, SUM, s)) if rank == 0 else \
                (lambda: comm.gather(buf["in"], buf["out"], n, F32, 0, s))
        elif os.environ.get("MIXED") == "rejected":  # rank 1's arguments fail its own checks
            fn = lambda: comm.all_reduce(buf["in"], buf["out"], n if rank == 0 else -1, F32, SUM, s)  # noqa: E731
        else:
            fn = lambda: comm.all_gather(buf["in"], buf["out"], rank + 2, 9, F32, s)  # noqa: E731
        fake.clear()
        try:
            w = fn()
            out["call_error"] = None
        except Exception as e:  # noqa: BLE001
            w = None
            out["call_error"] = [type(e).__name__, str(e)]
        out["launched"] = [lch["kernel"] for lch in fake.launches()]
        wait_errored(comm, out, t0)
        out["wait_error"] = wait_error(w) if w is not None else None
        out["after"] = call_error(lambda: comm.all_reduce(buf["in"], buf["out"], n, F32, SUM, s))
    elif scenario == "dead":
        w = comm.all_reduce(buf["in"], buf["out"], n, F32, SUM, s)
        w.wait()
        last = fake.launches()[-1]
        barrier(d, rank, world, "before_exit")
        if rank == 1:
            os._exit(0)  # no close: the peer sees a dead process
        t0 = time.monotonic()
        while comm.errored() is None and time.monotonic() - t0 < 10:
            time.sleep(0.001)
        out["errored_after_s"] = time.monotonic() - t0
        out["errored"] = comm.errored()
        out["abort_word"] = fake.read_u32(last["abort"])
    elif scenario == "setup":
        # The setup chosen at init, the kernels loaded there, and what a call loads (nothing).
        out["setup"] = comm.device_setup()
        out["setup_kernel_calls"] = setup_calls
        out["setup_legacy_stream"] = [c["name"] for c in setup_log if c["stream"] == 0]
        out["ring_kernels"] = fake.ring_kernels()
        out["calls"] = {}
        for name, fn in [("all_reduce", lambda: comm.all_reduce(buf["in"], buf["out"], n, F32, SUM, s)),
                         ("all_gather", lambda: comm.all_gather(buf["in"], buf["out"], n, n * world, F32, s)),
                         ("broadcast", lambda: comm.broadcast(buf["in"], n, F32, 0, s))]:
            w, c, ls = call_log(fn)
            w.wait()
            out["calls"][name] = {"names": [x["name"] for x in c], "kernel_calls": kernel_calls(c),
                                  "grids": [[x["kernel"], x.get("nlanes"), x.get("nslots"), x.get("slot_stride")]
                                            for x in ls]}
    elif scenario == "pyguard":
        # ringcomm.cuda's in-flight guard over this core: held Works are not queried, nor the
        # stream polled, while the caller's stream is capturing.
        from ringcomm.cuda.communicator import CudaCommunicator
        pc = CudaCommunicator(comm, "fake")
        x, y = Arr(buf["in"], n), Arr(buf["out"], n)
        pc.all_reduce(x, output=y, stream=s, async_op=True)
        out["held_before"] = len(pc._guard.refs)
        fake.clear()
        fake.begin_capture(s)
        pc.all_reduce(Arr(buf["in2"], n), output=Arr(buf["out2"], n), stream=s)
        out["held_captured"] = len(pc._guard.refs)
        try:
            pc.gather(Arr(buf["out"], n * world), x, 0, stream=s)
            out["host_capture_error"] = None
        except Exception as e:  # noqa: BLE001
            out["host_capture_error"] = [type(e).__name__, str(e)]
        fake.end_capture(s)
        out["capture_calls"] = fake.calls()
        out["capture_launches"] = [x["kernel"] for x in fake.launches()]
        pc.all_reduce(x, output=y, stream=s)
        out["held_after"] = len(pc._guard.refs)
        out["after_calls"] = [c["name"] for c in fake.calls()]
        out["errored"] = comm.errored()
    elif scenario == "rooted":
        # broadcast and reduce, every root: each call is one launch of the ring kernel.
        calls = {}
        for root in range(world):
            for name, fn in [("broadcast", lambda: comm.broadcast(buf["out"], n, F32, root, s)),
                             ("reduce", lambda: comm.reduce(buf["in"], buf["out"], n, F32, SUM, root, s))]:
                posted = comm.headers_posted()
                w, c, ls = call_log(fn)
                calls[f"{name}/{root}"] = {"calls": c, "launches": ls, "posted": comm.headers_posted() - posted}
                w.wait()
        out["eager"] = calls
    elif scenario == "ledger":
        # Hold the ring's blocks (one call runs) until DIR/end says "close" or "die" (exit without
        # closing: the GPU ledger's entry outlives the process).
        comm.all_reduce(buf["in"], buf["out"], n, F32, SUM, s).wait()
        out["setup"] = comm.device_setup()
        out["pid"] = os.getpid()
        write_out(d, rank, out)
        end = d / "end"
        t0 = time.monotonic()
        while not end.exists() and time.monotonic() - t0 < 50:
            time.sleep(0.005)
        if end.exists() and end.read_text() == "die":
            os._exit(0)
        comm.close()
        return
    elif scenario == "stress":
        out.update(stress(comm, rank, world, s, buf, n))
    elif scenario == "host":
        fake.clear()
        fake.begin_capture(s)
        try:
            comm.all_reduce(buf["in"], buf["out"], n, F32, SUM, s)
            out["host_capture_error"] = None
        except Exception as e:  # noqa: BLE001
            out["host_capture_error"] = [type(e).__name__, str(e)]
        fake.end_capture(s)
        out["capture_calls"] = fake.calls()
        out["errored"] = comm.errored()
    write_out(d, rank, out)
    comm.close()


if __name__ == "__main__":
    main()
