"""The order in which all_reduce combines contributions (ring_schedule.h, ar_chunk_*): the ring,
the direct (one-shot) and the two-shot algorithms give bit-identical results, and at world sizes 2
and 3 they equal gloo's bit for bit, on data where the order of floating-point additions shows."""
import os
import shutil
import tempfile
import traceback

import numpy as np
import pytest

from ringcomm.core.launch import spawn
from order_ref import ar_chunk_elems, order_sensitive, ordered_sum
from ringcomm import _C_test

torch = pytest.importorskip("torch")


@pytest.fixture
def store_dir():
    d = tempfile.mkdtemp(prefix="rc-test-order-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


COUNTS = [1, 7, 13, 1000, 3001, 40000, 300001]
DTYPES = [np.float16, np.float32, np.float64]


def order_cases(rank, world, store, with_gloo):
    import torch.distributed as dist

    import ringcomm
    os.environ["RINGCOMM_SLOT_BYTES"] = "4096"   # many pieces; pieces straddle chunk bounds
    os.environ["RINGCOMM_DIRECT_MAX_BYTES"] = str(1 << 40)
    comms = {}
    for algo in ("ring", "direct", "two_shot"):
        os.environ["RINGCOMM_ALGO"] = algo
        comms[algo] = ringcomm.init(rank=rank, world_size=world, init_method=f"file://{store}/rc",
                                    prefix=f"order-{algo}", timeout=60)
    if with_gloo:
        dist.init_process_group("gloo", init_method=f"file://{store}/gloo", rank=rank, world_size=world)
    fails = []
    try:
        for dt in DTYPES:
            for count in COUNTS:
                for op in ("SUM", "AVG", "MAX", "PRODUCT"):
                    if op == "PRODUCT" and count > 3001:
                        continue
                    x = order_sensitive(count, rank, dt)
                    if op == "PRODUCT":
                        x = (1 + x / 1e4).astype(dt)
                    got = {}
                    for algo, comm in comms.items():
                        y = x.copy()
                        comm.all_reduce(y, op=op)
                        got[algo] = y
                    tag = f"{np.dtype(dt).name} n={count} {op}"
                    if op == "SUM":
                        want = ordered_sum([order_sensitive(count, p, dt) for p in range(world)])
                        if got["ring"].tobytes() != want.tobytes():
                            bad = int(np.flatnonzero(got["ring"] != want)[0])
                            fails.append(f"rank {rank}: ring differs from the order model, {tag}, first at {bad}")
                    for algo in ("direct", "two_shot"):
                        if got["ring"].tobytes() != got[algo].tobytes():
                            bad = int(np.flatnonzero(got["ring"] != got[algo])[0])
                            fails.append(f"rank {rank}: ring and {algo} differ, {tag}, first at {bad}")
                    if with_gloo and op in ("SUM", "MAX", "PRODUCT"):
                        t = torch.from_numpy(x.copy())
                        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
                        if t.numpy().tobytes() != got["ring"].tobytes():
                            bad = int(np.flatnonzero(t.numpy() != got["ring"])[0])
                            fails.append(f"rank {rank}: ringcomm and gloo differ, {tag}, first at {bad}")
    except Exception:  # noqa: BLE001
        fails.append(f"rank {rank}: exception\n{traceback.format_exc()}")
    finally:
        for comm in comms.values():
            comm.close()
        if with_gloo:
            dist.destroy_process_group()
    return fails


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_direct_and_gloo_agree_bitwise(world, store_dir):
    with_gloo = world <= 3 and torch.distributed.is_gloo_available()
    res = spawn(order_cases, world, (store_dir, with_gloo), timeout=280)
    fails = [f for r in res for f in r]
    assert not fails, "\n".join(fails[:20])


def test_order_sensitive_data_is_order_sensitive():
    # The test above could not fail if these sums did not depend on the order.
    xs = [order_sensitive(3001, r, np.float16).astype(np.float16) for r in range(3)]
    a = ((xs[0] + xs[1]).astype(np.float16) + xs[2]).astype(np.float16)
    b = ((xs[1] + xs[2]).astype(np.float16) + xs[0]).astype(np.float16)
    assert (a != b).sum() > 100


@pytest.mark.parametrize("esize", [1, 2, 4, 8])
def test_all_reduce_chunks_follow_the_rule(esize):
    """The C++ chunking (ring::ar_chunk_*) against the rule written out in order_ref.py, including
    sizes where segments are capped at 1 MiB and the segment count grows past 2n."""
    for n in (1, 2, 3, 4, 5, 8):
        for count in (0, 1, 2, 5, 7, 13, 1000, 1001, 65537, (1 << 20) // esize + 3, (8 << 20) // esize + 1,
                      (33 << 20) // esize - 7):
            got = _C_test.ar_chunk_bounds(count, n, esize)
            ce = ar_chunk_elems(count, n, esize)
            want = [(min(count, k * ce), min(count, (k + 1) * ce) - min(count, k * ce)) for k in range(n)]
            assert got == want, (count, n, esize)
            assert sum(c for _, c in got) == count


def test_chunk_rule_reproduces_boundaries_observed_in_gloo():
    # Where torch 2.13's gloo switches from adding rank 0 last to rank 1 last, seen with
    # order-sensitive float16 data at 3 ranks (too large to run here every time): chunk 1 starts
    # at 1398105 of 4194307 elements and at 5592411 of 16777217 (segments capped at 1 MiB).
    assert ar_chunk_elems(4194307, 3, 2) == 1398105
    assert ar_chunk_elems(16777217, 3, 2) == 5592411
    assert _C_test.ar_chunk_bounds(16777217, 3, 2)[1][0] == 5592411
