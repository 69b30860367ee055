"""The c10d trampoline's own fast path (bindings/torch/trampoline.cpp, through ringcomm._C's
C ABI, RcFastApi in ringcomm/abi.h, into the synchronous entries of csrc/comm/sync_entry.h): a
synchronous SUM ``dist.all_reduce`` or a synchronous ``dist.broadcast`` of one dense contiguous
CPU tensor runs without Python. Checked in real ranks through ``torch.distributed``: results
against the exact sum for every dtype it takes and for what it leaves to Python (other ops, async,
bool SUM, non-contiguous), which the entry never sees again; that the C++ path really ran (the Python half's call counter does not
move, the core's sequence number does) and is off while coalescing or issue hooks need Python, and after
shutdown; a mismatch raised through it is ringcomm's MismatchError on every rank, the group usable
after; and a table of another version leaves it off."""
from __future__ import annotations

import ctypes
import re
import struct

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from ranks import require_backend, run_ranks  # noqa: E402

FAST = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
        torch.int32, torch.int64]


def _seq_next(be) -> int:
    return int(re.search(r"\d+", repr(be._seq)).group())


def _cases(rank, world):
    import ringcomm
    from ringcomm.torch import add_issue_hook, remove_issue_hook
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    out = {"wrong": [], "native_on": be._fast_native}
    # every dtype the C++ path takes, counts 0, 1, odd, many slots
    core = be._comm._c            # its next_seq() steps once per collective, whoever issued it
    core_before = core.next_seq()
    before = _seq_next(be)
    for dt in FAST:
        for n in (0, 1, 7 * world + 3, 300_000):
            x = ((torch.arange(n) % 5) + rank + 1).to(dt)
            dist.all_reduce(x)
            want = sum(((torch.arange(n) % 5) + p + 1).to(torch.float64) for p in range(world)).to(dt) \
                if n else x
            if not torch.equal(x, want):
                out["wrong"].append(("fast", str(dt), n))
    # broadcast: every dtype it takes, every root, the same counts
    for dt in FAST:
        for n in (0, 1, 7 * world + 3, 300_000):
            for root in range(world):
                x = (((torch.arange(n) % 7) + root) if rank == root else torch.zeros(n)).to(dt)
                dist.broadcast(x, src=root)
                if not torch.equal(x, ((torch.arange(n) % 7) + root).to(dt)):
                    out["wrong"].append(("fast broadcast", str(dt), n, root))
    out["python_calls_on_fast_path"] = _seq_next(be) - before
    out["core_calls"] = core.next_seq() - core_before
    # what it leaves to Python: still right, counted by the Python half, and never offered to
    # the entry again (the calls the entry takes here, in C++: the two MAX all_reduces, every
    # op of the entry's being offered, and the bool broadcast)
    before = _seq_next(be)
    core_before = core.next_seq()
    x = torch.full((10,), float(rank + 1))
    dist.all_reduce(x, op=dist.ReduceOp.MAX)         # an op of the entry's: C++
    if not torch.equal(x, torch.full((10,), float(world))):
        out["wrong"].append(("max",))
    x = torch.full((10,), float(rank + 1))
    dist.all_reduce(x, async_op=True).wait()
    if not torch.equal(x, torch.full((10,), world * (world + 1) / 2)):
        out["wrong"].append(("async",))
    b = torch.tensor([rank == 0, False, True])
    dist.all_reduce(b, op=dist.ReduceOp.MAX)
    if not torch.equal(b, torch.tensor([True, False, True])):
        out["wrong"].append(("bool",))
    big = torch.full((4, 6), float(rank + 1))
    col = big[:, 1]                                   # not contiguous
    dist.all_reduce(col)
    if not torch.equal(col, torch.full((4,), world * (world + 1) / 2)):
        out["wrong"].append(("strided",))
    x = torch.full((5,), float(rank))
    dist.broadcast(x, src=world - 1, async_op=True).wait()      # async: Python
    if not torch.equal(x, torch.full((5,), float(world - 1))):
        out["wrong"].append(("async broadcast",))
    big = torch.full((4, 6), float(rank))
    col = big[:, 2]                                   # not contiguous: Python
    dist.broadcast(col, src=0)
    if not torch.equal(col, torch.zeros(4)):
        out["wrong"].append(("strided broadcast",))
    b = torch.tensor([rank == 0, rank == 1])
    dist.broadcast(b, src=0)                          # bool: a dtype the entry takes (C++)
    if not torch.equal(b, torch.tensor([True, False])):
        out["wrong"].append(("bool broadcast",))
    out["python_calls_off_path"] = _seq_next(be) - before
    out["core_calls_off_path"] = core.next_seq() - core_before
    # issue hooks need Python: the fast path is off while one is installed
    seen = []
    hook = lambda op, group, seq, t: seen.append(op)   # noqa: E731
    add_issue_hook(hook)
    out["native_with_hook"] = be._fast_native
    dist.all_reduce(torch.ones(4))
    remove_issue_hook(hook)
    out["hook_saw"] = seen
    out["native_after_hook"] = be._fast_native
    # coalescing needs Python too
    with dist._coalescing_manager(device=torch.device("cpu")):
        out["native_coalescing"] = be._fast_native
        c = torch.ones(3) * (rank + 1)
        dist.all_reduce(c)
    if not torch.equal(c, torch.full((3,), world * (world + 1) / 2)):
        out["wrong"].append(("coalesced",))
    out["native_after_coalescing"] = be._fast_native
    # a mismatch raised by the core through the C++ path: ringcomm's MismatchError everywhere
    try:
        dist.all_reduce(torch.ones(5 if rank == 0 else 6))
        out["mismatch"] = "no error"
    except ringcomm.MismatchError as e:
        out["mismatch"] = "MismatchError" if getattr(e, "_ringcomm_issued", False) else "unmarked"
    except Exception as e:  # noqa: BLE001
        out["mismatch"] = type(e).__name__
    y = torch.ones(8) * (rank + 1)
    dist.all_reduce(y)
    out["after_mismatch"] = bool(torch.equal(y, torch.full((8,), world * (world + 1) / 2)))
    # a broadcast mismatch (sizes differ) through the C++ path: the same on every rank
    try:
        dist.broadcast(torch.ones(5 if rank == 0 else 6), src=0)
        out["bcast_mismatch"] = "no error"
    except ringcomm.MismatchError as e:
        out["bcast_mismatch"] = "MismatchError" if getattr(e, "_ringcomm_issued", False) else "unmarked"
    except Exception as e:  # noqa: BLE001
        out["bcast_mismatch"] = type(e).__name__
    z = torch.full((3,), float(rank))
    dist.broadcast(z, src=world - 1)
    out["after_bcast_mismatch"] = bool(torch.equal(z, torch.full((3,), float(world - 1))))
    # a table of another version: refused, the fast path stays off
    fake = ctypes.create_string_buffer(struct.pack("II", 99, 64) + bytes(56))
    out["fake_table"] = be._set_fast_path(ctypes.addressof(fake), 0)
    be._fast_native = False
    be._refresh_fast()   # back on
    out["native_restored"] = be._fast_native
    be.shutdown()
    out["native_after_shutdown"] = be._fast_native
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_native_allreduce_and_broadcast_fast_path(world):
    require_backend("ringcomm")
    res = run_ranks(_cases, world, backend="ringcomm")
    for r, out in enumerate(res):
        assert out["wrong"] == [], (r, out["wrong"])
        assert out["native_on"] is True, out
        # The core issued every call once, and Python none: the C++ path (the trampoline through
        # RcFastApi into the synchronous entries) ran every one.
        assert out["python_calls_on_fast_path"] == 0, out
        assert out["core_calls"] == 4 * len(FAST) + 4 * len(FAST) * world, out
        # Python issued 4 calls, the core 4 + 3: the C++ path ran the two MAX all_reduces and the
        # bool broadcast, each call issued once.
        assert out["python_calls_off_path"] == 4, out
        assert out["core_calls_off_path"] == 7, out
        assert out["native_with_hook"] is False and out["hook_saw"] == ["allreduce"], out
        assert out["native_after_hook"] is True, out
        assert out["native_coalescing"] is False and out["native_after_coalescing"] is True, out
        assert out["mismatch"] == "MismatchError", out
        assert out["after_mismatch"] is True, out
        assert out["bcast_mismatch"] == "MismatchError" and out["after_bcast_mismatch"] is True, out
        assert out["fake_table"] is False and out["native_restored"] is True, out
        assert out["native_after_shutdown"] is False, out
