"""Cases for tests/test_cuda_reliability.py that run INSIDE spawned ranks (module-level for spawn).
Each needs a GPU (the test module skips without one); every rank returns a dict of observations
that the test checks."""
import os
import threading
import time

from cuda_cases import _gpu_device
from mp_cases import init_under_env

# GPU clock cycles of torch.cuda._sleep that keep an H100/H200-class GPU busy for about 3 s.
BUSY_CYCLES = int(os.environ.get("RC_TEST_GPU_BUSY_CYCLES", str(6 * 10 ** 9)))


def _init(rank, world, dev, name, timeout=60):
    """A device communicator on its own store RC_TEST_STORE/name, prefix rel/name."""
    import ringcomm.cuda
    return init_under_env(rank, world, name, timeout=timeout, init=ringcomm.cuda.init, device=dev,
                          prefix=f"rel/{name}")


def _synchronize_within(seconds):
    """torch.cuda.synchronize() on a helper thread: True when it returned within `seconds` (a
    stream blocked forever is reported, not suffered)."""
    import torch
    done = threading.Event()

    def run():
        try:
            torch.cuda.synchronize()
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(seconds)


def dead_peer_leaves_stream_usable(rank, world):
    """Rank 1's GPU is busy (a long kernel) when it enters an all_reduce, so its slot records
    complete late; it is SIGKILLed while the others depend on them. The others must raise
    PeerFailureError naming all_reduce, themselves and rank 1, and their streams must stay
    usable: torch.cuda.synchronize() returns and new work runs."""
    import signal

    import torch

    import ringcomm
    dev = _gpu_device(rank)
    comm = _init(rank, world, dev, "dead")
    x = torch.ones(1 << 16, device=f"cuda:{dev}")
    comm.all_reduce(x)
    torch.cuda.synchronize()
    warm_ok = bool((x == world).all().item())
    comm.barrier()
    torch.cuda.synchronize()
    if rank == 1:
        torch.cuda._sleep(BUSY_CYCLES)

        def enter():
            try:
                comm.all_reduce(x)
            except BaseException:
                pass
        threading.Thread(target=enter, daemon=True).start()
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    err = ("none", "")
    try:
        comm.all_reduce(x)
    except ringcomm.RingcommError as e:
        err = (type(e).__name__, str(e))
    dt = time.monotonic() - t0
    synced = _synchronize_within(30.0)
    usable = False
    if synced:
        y = torch.full((4096,), 2.0, device=f"cuda:{dev}")
        y.mul_(3.0)
        usable = float(y.sum().item()) == 6.0 * 4096
    if synced:
        try:
            comm.close()
        except ringcomm.RingcommError:
            pass
    return {"warm_ok": warm_ok, "error": err, "seconds": dt, "synced": synced, "usable": usable}


def _overlaps(a, b):
    return a["begin"] < b["begin"] + b["bytes"] and b["begin"] < a["begin"] + a["bytes"]


def _mapped(begin, nbytes):
    """Whether [begin, begin + nbytes) lies inside one mapping of this process (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
            if lo <= begin and begin + nbytes <= hi:
                return True
    return False


def retired_pins_are_never_reused(rank, world):
    """Host-staged channels (RINGCOMM_CUDA_P2P=host) pin slots with cudaHostRegister. A close
    that cannot drain (a long kernel ahead of the last fence, RINGCOMM_CUDA_CLOSE_WAIT small)
    must retire them: still registered and mapped, recorded as retired; a later communicator's
    pinned ranges never overlap them and its results are right."""
    import torch

    from ringcomm import _C_cuda
    dev = _gpu_device(rank)
    n = 1 << 20
    comm = _init(rank, world, dev, "pins-a")
    owner = comm._c.pin_owner
    x = torch.full((n,), float(rank + 1), device=f"cuda:{dev}")
    comm.all_reduce(x)
    torch.cuda.synchronize()
    want = float(world * (world + 1) // 2)
    first_ok = bool((x == want).all().item())
    before = [r for r in _C_cuda._pinned_ranges() if r["owner"] == owner]
    torch.cuda._sleep(BUSY_CYCLES)
    comm.barrier()                      # its fence sits behind the long kernel
    t0 = time.monotonic()
    comm.close()                        # cannot drain within RINGCOMM_CUDA_CLOSE_WAIT
    close_s = time.monotonic() - t0
    after = [r for r in _C_cuda._pinned_ranges() if r["owner"] == owner]
    still_mapped = all(_mapped(r["begin"], r["bytes"]) for r in after if r["kind"] == "host")
    torch.cuda.synchronize()
    comm2 = _init(rank, world, dev, "pins-b")
    owner2 = comm2._c.pin_owner
    y = torch.full((n,), float(rank + 1), device=f"cuda:{dev}")
    comm2.all_reduce(y)
    torch.cuda.synchronize()
    second_ok = bool((y == want).all().item())
    live2 = [r for r in _C_cuda._pinned_ranges() if r["owner"] == owner2]
    overlap = any(_overlaps(a, b) for a in live2 for b in after)
    comm2.close()
    left2 = [r for r in _C_cuda._pinned_ranges() if r["owner"] == owner2]
    return {"first_ok": first_ok, "second_ok": second_ok,
            "before": [(r["kind"], r["state"]) for r in before],
            "after": [(r["kind"], r["state"]) for r in after], "still_mapped": still_mapped,
            "live2": len(live2), "overlap": overlap, "left2": len(left2), "close_s": close_s}


def p2p_memory_not_reused_early(rank, world):
    """send/recv run on ringcomm's internal stream. The caller drops the tensor and the Work at
    once and allocates same-sized tensors on its stream: torch's allocator must not hand the
    dropped tensor's block out while the transfer uses it, and the transfer's bytes must be the
    original ones (send) and land nowhere else (recv)."""
    import torch
    dev = _gpu_device(rank)
    comm = _init(rank, world, dev, "p2p")
    n = 4 << 20                          # 16 MiB: more than the slots hold, several hand-offs
    out = {}
    torch.cuda.synchronize()
    # Phase A: rank 0 sends and drops; rank 1 receives late.
    comm.barrier()
    if rank == 0:
        t = torch.full((n,), 7.0, device=f"cuda:{dev}")
        ptr = t.data_ptr()
        comm.send(t, 1, async_op=True)
        del t
        junk = [torch.full((n,), -1.0, device=f"cuda:{dev}") for _ in range(4)]
        out["send_reused"] = any(u.data_ptr() == ptr for u in junk)
    else:
        time.sleep(0.5)
        r = torch.zeros(n, device=f"cuda:{dev}")
        comm.recv(r, 0)
        torch.cuda.synchronize()
        out["send_bytes_ok"] = bool((r == 7.0).all().item())
    comm.barrier()
    # Phase B: rank 1 receives and drops; rank 0 sends late.
    if rank == 1:
        r2 = torch.zeros(n, device=f"cuda:{dev}")
        ptr = r2.data_ptr()
        comm.recv(r2, 0, async_op=True)
        del r2
        junk = [torch.full((n,), -1.0, device=f"cuda:{dev}") for _ in range(4)]
        out["recv_reused"] = any(u.data_ptr() == ptr for u in junk)
        t0 = time.monotonic()
        while comm._guard.refs.prune() and time.monotonic() - t0 < 30:
            time.sleep(0.01)
        out["recv_released"] = comm._guard.refs.prune() == 0
        torch.cuda.synchronize()
        out["recv_no_stray_write"] = all(bool((u == -1.0).all().item()) for u in junk)
    else:
        time.sleep(0.5)
        t2 = torch.full((n,), 5.0, device=f"cuda:{dev}")
        comm.send(t2, 1)
    comm.barrier()
    torch.cuda.synchronize()
    comm.close()
    return out


def info_line_names_liveness_and_wait(rank, world):
    """The INFO line a CUDA communicator logs when it connects (captured from fd 2)."""
    from fd2_capture import capture_fd2
    comm, text = capture_fd2(lambda: _init(rank, world, _gpu_device(rank), "info"))
    comm.close()
    return text
