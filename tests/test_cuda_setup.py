"""The device ring's setup (RINGCOMM_CUDA_P2P=device, device-flags, device-spin), decided at init
from every rank's device info by transport/cuda_ipc.h's plan_device_ring, through the wire format
(no GPU needed): which setup each topology is, the signalling and slot geometry it takes, the SM
budget that caps every rank's grid so that all grids on a GPU are resident at once, and the
refusal of grids that could not all be."""
import pytest

import ringcomm

try:
    from ringcomm import _C_cuda_test
except ImportError:
    _C_cuda_test = None

pytestmark = pytest.mark.skipif(_C_cuda_test is None, reason="ringcomm._C_cuda_test was not built (no CUDA toolkit)")

DEVICE, FLAGS, SPIN = 4, 5, 6       # RINGCOMM_CUDA_P2P's mode numbers
U = [bytes([i]) * 16 for i in range(4)]
SET_LANES, SET_NSLOTS, SET_SLOT_BYTES = 1, 2, 4


def plan(infos, mode=DEVICE):
    return _C_cuda_test.plan_device_ring(infos, mode)


def gpu(i, **kw):
    """A rank on GPU i; defaults: 132 SMs, 2 resident ring blocks each, 4 lanes asked, no MPS."""
    return dict(uuid=U[i], visible=U[:2], can_access=[1, 1], **kw)


def brief(p):
    return p["setup"], p["signalling"], p["blocks"], p["budget"]


def test_separate_gpus():
    p = plan([gpu(0), gpu(1)])
    assert brief(p) == ("separate GPUs", "flags", 4, 264)
    assert (p["nslots"], p["slot_bytes"]) == (4, 2 << 20)
    assert "separate GPUs" in p["why"] and "in-kernel flags" in p["why"]


def test_one_gpu_under_mps_shares_the_budget():
    p = plan([gpu(0, mps=True)] * 2)
    assert brief(p) == ("one GPU shared under MPS", "flags", 4, 132)
    # Many ranks: each one's share caps the grid, so that every grid stays resident.
    p = plan([gpu(0, mps=True, sms=8)] * 6)
    assert brief(p) == ("one GPU shared under MPS", "flags", 2, 2)
    assert "6 grid(s) at once" in p["why"], p["why"]


def test_one_gpu_without_mps_spins_with_few_large_slots():
    p = plan([gpu(0)] * 3)
    assert brief(p) == ("one GPU shared without MPS", "spin", 1, 264)
    assert (p["nslots"], p["slot_bytes"]) == (2, 8 << 20)
    assert "no MPS" in p["why"] and "spins with few, large slots" in p["why"], p["why"]
    # Knobs the user set win over the setup's defaults.
    p = plan([gpu(0, ring_lanes=3, nslots=4, slot_bytes=1 << 20, knobs_set=SET_LANES | SET_NSLOTS | SET_SLOT_BYTES)] * 2)
    assert (p["blocks"], p["nslots"], p["slot_bytes"]) == (3, 4, 1 << 20)


def test_mixed_topologies():
    # Two GPUs, two MPS ranks each: grids run at once, each GPU's budget halved.
    p = plan([gpu(0, mps=True), gpu(0, mps=True), gpu(1, mps=True), gpu(1, mps=True)])
    assert brief(p) == ("one GPU shared under MPS", "flags", 4, 132)
    # One GPU shared without MPS anywhere: time-sliced, whatever the others do.
    p = plan([gpu(0, mps=True), gpu(0, mps=True), gpu(1), gpu(1)])
    assert brief(p)[:2] == ("one GPU shared without MPS", "spin")
    # A rank on its own GPU beside two sharing one under MPS: the smallest budget decides.
    p = plan([gpu(0, mps=True, sms=3), gpu(0, mps=True, sms=3), gpu(1, sms=3)])
    assert brief(p) == ("one GPU shared under MPS", "flags", 3, 3)


def test_forced_signalling():
    assert brief(plan([gpu(0)] * 2, FLAGS))[:3] == ("one GPU shared without MPS", "flags", 4)
    p = plan([gpu(0, mps=True)] * 2, SPIN)
    assert brief(p) == ("one GPU shared under MPS", "spin", 1, 132)
    assert "forced by RINGCOMM_CUDA_P2P" in p["why"]


def test_max_blocks_caps_the_grid():
    # RINGCOMM_CUDA_MAX_BLOCKS of any rank caps every rank's grid (they must agree on the lanes).
    p = plan([gpu(0, mps=True), gpu(0, mps=True, max_blocks=2)])
    assert brief(p) == ("one GPU shared under MPS", "flags", 2, 2)
    assert "RINGCOMM_CUDA_MAX_BLOCKS" in p["why"]


def test_refuses_grids_that_cannot_all_be_resident():
    # Asked above what the GPU holds for the ranks running at once.
    with pytest.raises(ringcomm.InvalidArgumentError, match=r"3 ring grid\(s\) of 4 blocks cannot all be resident"):
        plan([gpu(0, mps=True, sms=5, blocks_per_sm=2, max_blocks=4)] * 3)
    # More ranks at once than resident blocks.
    with pytest.raises(ringcomm.InvalidArgumentError, match="no ring block fits the SM budget"):
        plan([gpu(0, mps=True, sms=1, blocks_per_sm=1)] * 2)
    # A kernel that cannot be resident at all.
    with pytest.raises(ringcomm.InvalidArgumentError, match="cannot be resident"):
        plan([gpu(0, blocks_per_sm=0), gpu(1)])
    # Time-sliced: one grid at a time, so the sum does not count, but each grid must fit.
    assert plan([gpu(0, sms=1, blocks_per_sm=2, ring_lanes=2, knobs_set=SET_LANES)] * 4)["blocks"] == 2
    with pytest.raises(ringcomm.InvalidArgumentError, match="cannot all be resident"):
        plan([gpu(0, sms=1, blocks_per_sm=2, ring_lanes=3, knobs_set=SET_LANES, max_blocks=3)] * 2)


def test_the_gpu_ledger_caps_the_grid():
    """What the GPU's ledger leaves (other communicators' grids there) is shared by the ranks
    running there at once, and caps the grid like the SM budget; none left is refused naming the
    holders."""
    held = "pid 7 (rank 0 of 2): 4 blocks; pid 8 (rank 1 of 2): 4 blocks"
    p = plan([gpu(0, mps=True, sms=6, ledger_free=4, ledger_holders=held)] * 2)
    assert brief(p) == ("one GPU shared under MPS", "flags", 2, 2)
    assert "ledger" in p["why"] and "12 resident blocks" in p["why"] and "leaves 4 of them" in p["why"] and held in p["why"], p["why"]
    # Left room for more than the grid asks: the lanes asked decide, not the ledger.
    p = plan([gpu(0, mps=True, ledger_free=200)] * 2)
    assert brief(p) == ("one GPU shared under MPS", "flags", 4, 100)
    # One rank's ledger decides for every rank (a GPU of its own, with another communicator there).
    p = plan([gpu(0, ledger_free=3, ledger_holders="pid 9 (rank 0 of 1): 261 blocks"), gpu(1)])
    assert brief(p) == ("separate GPUs", "flags", 3, 3)
    # Nothing left: refused, naming the holders.
    with pytest.raises(ringcomm.InvalidArgumentError, match="no ring block fits") as e:
        plan([gpu(0, mps=True, sms=6, ledger_free=1, ledger_holders=held)] * 2)
    assert held in str(e.value) and "close one of those communicators" in str(e.value)
    # RINGCOMM_CUDA_MAX_BLOCKS set: the knob is the budget, and grids beyond what is left are refused.
    with pytest.raises(ringcomm.InvalidArgumentError, match="cannot all be resident") as e:
        plan([gpu(0, mps=True, sms=6, max_blocks=4, ledger_free=4, ledger_holders=held)] * 2)
    assert held in str(e.value) and "close one of those communicators" in str(e.value)
    # No ledger (-1: not read): the budget alone.
    assert brief(plan([gpu(0, mps=True, ledger_free=-1)] * 2)) == ("one GPU shared under MPS", "flags", 4, 132)


def test_ranks_must_agree_on_the_ring_knobs():
    with pytest.raises(ringcomm.MismatchError, match="RINGCOMM_CUDA_RING_LANES"):
        plan([gpu(0, ring_lanes=2, knobs_set=SET_LANES), gpu(0)])
    with pytest.raises(ringcomm.MismatchError, match="RINGCOMM_CUDA_NSLOTS"):
        plan([gpu(0, knobs_set=SET_NSLOTS), gpu(0)])


def test_the_load_table_holds_every_ring_kernel():
    """What init loads (csrc/device/ring_kernel.cu's ring_kernels(), made by the dispatch the launches
    go through): one kernel per (dtype, op) pair the GPU supports, all_gather's included."""
    pairs = sum(_C_cuda_test.reduce_supported(d, o) for d in range(9) for o in range(8))
    assert _C_cuda_test.ring_kernel_count() == pairs == 50
