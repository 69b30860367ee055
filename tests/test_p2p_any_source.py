"""recv(src=None): a receive from any source returns the sender and takes its message (order rule
in csrc/comm/p2p_engine.h); checked against the payloads every rank knows."""
import pytest

import ranks
import p2p_any_source_cases as cases

BIG = 1 << 18  # float32 elements: 1 MiB, several shared-memory slots


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_any_source_receives_every_sender_once(world, store_env):
    res = ranks.run(cases.any_source_gathers, world, args=(BIG,), timeout=80, env=store_env)
    assert res[0] == [(r, True) for r in range(1, world)], res[0]


@pytest.mark.timeout(90)
def test_any_source_matches_tags_in_send_order(store_env):
    res = ranks.run(cases.any_source_tags_and_order, 2, args=(BIG,), timeout=80, env=store_env)
    assert res[0] == [1, True, 1, True, 1, True], res[0]


@pytest.mark.timeout(90)
def test_specific_receive_takes_precedence_over_any_source(store_env):
    res = ranks.run(cases.any_source_beside_specific, 3, args=(BIG,), timeout=80, env=store_env)
    assert res[0] == [2, True, 1, True], res[0]


@pytest.mark.timeout(90)
def test_send_needs_a_destination(store_env):
    res = ranks.run(cases.any_source_rejected_args, 2, timeout=80, env=store_env)
    assert res == [["InvalidArgumentError"] * 2] * 2, res
