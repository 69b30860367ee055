"""Failures never hang: a killed rank, mismatched calls, a late rank, bad arguments."""

import pytest

from ringcomm.core.launch import spawn
import fault_cases
import ranks


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_killed_rank_raises_peer_failure_quickly(world, store_env):
    res = spawn(fault_cases.killed_rank, world, timeout=50, env=store_env, may_die=[1])
    for r, out in enumerate(res):
        if r == 1:
            continue
        kind, dt, msg = out
        assert kind == "PeerFailureError", (r, out)
        assert dt < 10.0, f"rank {r} took {dt:.1f} s to notice the dead peer"
        assert "rank" in msg and "seq" in msg, msg


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_mismatch_raises_on_every_rank_and_recovers(world, store_env):
    res = ranks.run(fault_cases.mismatch, world, timeout=50, env=store_env)
    for r, out in enumerate(res):
        assert [o[0] for o in out[:3]] == ["MismatchError"] * 3, (r, out)
        assert "count=10" in out[0][1] and "count=11" in out[0][1], out[0][1]
        assert "broadcast" in out[1][1] and "all_reduce" in out[1][1]
        assert out[3] == [float(world)] * 5


@pytest.mark.timeout(60)
def test_timeout_names_op_rank_peer(store_env):
    res = ranks.run(fault_cases.timeout, 2, timeout=50, env=store_env)
    kind, dt, msg = res[0]
    assert kind == "TimeoutError", res[0]
    assert dt < 3.0
    assert "all_reduce" in msg and "rank 0" in msg and "rank 1" in msg and "seq" in msg, msg
    # The late rank learns of the failure instead of waiting.
    assert res[1][0] in ("PeerFailureError", "TimeoutError"), res[1]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_bad_inputs_raise_everywhere(world, store_env):
    res = ranks.run(fault_cases.bad_inputs, world, timeout=80, env=store_env)
    expected0 = {
        "non-contiguous": "InvalidArgumentError", "read-only": "InvalidArgumentError",
        "wrong output size": "InvalidArgumentError", "dtype mismatch": "InvalidArgumentError",
        "bad root": "InvalidArgumentError", "unsupported op": "UnsupportedError",
        "unsupported dtype": "UnsupportedError", "non-contiguous torch": "InvalidArgumentError",
    }
    for r, out in enumerate(res):
        got = dict(out)
        for name, exc in expected0.items():
            if r == 0 or name == "unsupported op":
                assert got[name] == exc, (r, name, got[name])
            else:
                assert got[name] == "MismatchError", (r, name, got[name])
        assert got["still works"] == [float(world)] * 3
        assert got["after close"] == "ClosedError"
