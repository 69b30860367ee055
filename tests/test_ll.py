"""The low-latency outbox (csrc/transport/shm_board.h "LL outboxes", csrc/algo/ll.cpp): its reuse
without acknowledgements under a long random mix of collectives with uneven arrival, its knob's
validation and agreement across ranks. Results against numpy, mismatches and every dtype x op are
in tests/test_small_message.py (its "ll" configuration); the segment's size with the outboxes in
tests/test_footprint.py."""
import pytest

import ranks
import ringcomm
from ringcomm import _C
from ringcomm.core.launch import spawn
from ll_cases import knob_mismatch_case, reduce_order_case, reduce_scatter_order_case, reuse_cases


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_outbox_reuse_under_a_random_mix_of_collectives(world, store_env):
    results = spawn(reuse_cases, world, args=(1500, 7 + world), timeout=180, env=store_env)
    fails = [f for fs, _ in results for f in fs]
    assert not fails, "\n".join(fails[:20])
    for _, algos in results:
        assert "direct/ll" in algos and "chain/simple" not in algos and ("direct/header_in_slot" in algos or "ring/header_in_slot" in algos), algos


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_reduce_through_the_outbox_is_bitwise_the_chains(world, store_env):
    results = spawn(reduce_order_case, world, timeout=180, env=store_env)
    ranks.assert_no_failures(results)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_reduce_scatter_outbox_and_direct_are_bitwise_the_rings(world, store_env):
    results = spawn(reduce_scatter_order_case, world, timeout=180, env=store_env)
    ranks.assert_no_failures(results)


@pytest.mark.timeout(60)
def test_ranks_must_agree_on_the_outbox_size(store_env):
    results = spawn(knob_mismatch_case, 2, timeout=50, env=store_env)
    assert any(kind == "MismatchError" and "RINGCOMM_LL_MAX_BYTES" in msg for kind, msg in results), results
    assert all(kind != "no error" for kind, _ in results), results


def test_knob_range(monkeypatch):
    monkeypatch.setenv("RINGCOMM_LL_MAX_BYTES", "2M")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_LL_MAX_BYTES"):
        _C.Communicator(0, 1, 10.0)
    monkeypatch.setenv("RINGCOMM_LL_MAX_BYTES", "0")
    _C.Communicator(0, 1, 10.0)
