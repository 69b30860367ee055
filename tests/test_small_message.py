"""The small-message all_reduce and broadcast paths (csrc/comm/header_exchange.h, "header in the first data
slot"; csrc/algo/direct.cpp): results against numpy and against the ring, bit for bit, at worlds
1-4, every dtype x op, counts 0, 1, odd, and at and around the direct threshold and the piece
size; mismatches detected through the in-slot path raise MismatchError on every rank before any
result is written, and the communicator stays usable. One group of ranks per world size runs all
cases of a test (tests/small_message_cases.py)."""
import pytest

import ringcomm
import ringcomm.core.config
from ringcomm import _C
import ranks
from small_message_cases import correctness_cases, mismatch_cases

torch = pytest.importorskip("torch")   # the bfloat16 cases


@pytest.mark.timeout(400)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_small_all_reduce_matches_numpy_and_the_ring(world, store_env):
    results = ranks.run(correctness_cases, world, timeout=380, env=store_env)
    fails = [f for fs, _ in results for f in fs]
    assert not fails, "\n".join(fails[:30])
    for r, (_, d) in enumerate(results[1:], 1):
        assert d == results[0][1], f"rank {r}'s results differ bitwise from rank 0's"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_mismatch_through_the_in_slot_path_raises_everywhere(world, store_env):
    results = ranks.run(mismatch_cases, world, timeout=280, env=store_env)
    assert all(ok for _, ok in results), "a communicator was unusable after the scenarios"
    names = [row[0] for row in results[0][0]]
    for i, name in enumerate(names):
        rows = [res[0][i] for res in results]
        for _, rank, kind, msg, untouched, after in rows:
            own_error = name.startswith("in-slot vs rejected arguments") and rank == world - 1
            if own_error:
                assert kind == "InvalidArgumentError", (name, rank, kind, msg)
            else:
                assert kind == "MismatchError", (name, rank, kind, msg)
            assert untouched, f"{name}: rank {rank} wrote a result before the mismatch was raised"
            assert after, f"{name}: rank {rank}'s next all_reduce was wrong"
        if name in ("counts differ", "counts differ, many pieces", "broadcast counts differ",
                    "broadcast counts differ, many pieces", "reduce_scatter counts differ",
                    "reduce_scatter counts differ, many pieces", "broadcast chain counts differ",
                    "reduce counts differ", "reduce counts differ, many pieces", "ring counts differ, many pieces",
                    "reduce_scatter ring counts differ, many pieces"):
            # the headers named the path they took
            assert all("proto=header_in_slot" in row[3] for row in rows), rows
        if name.startswith("all_gather blocks differ"):
            # the totals disagree (every header names its own block)
            assert all("inputs total" in row[3] for row in rows), rows
        if name in ("counts differ (ll)", "broadcast counts differ (ll)", "reduce_scatter counts differ (ll)"):
            assert all("algo=direct, proto=ll" in row[3] for row in rows), rows
        if name == "ll vs in-slot (knob differs)":
            assert all("proto=header_in_slot" in row[3] and "proto=ll" in row[3] for row in rows), rows
        if name == "in-slot vs header exchange first (knob differs)":
            assert all("proto=header_in_slot" in row[3] and "algo=direct, proto=simple" in row[3] for row in rows), rows


def test_knob_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv("RINGCOMM_HEADER_IN_SLOT", "sometimes")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_HEADER_IN_SLOT"):
        _C.Communicator(0, 1, 10.0)
    monkeypatch.setenv("RINGCOMM_HEADER_IN_SLOT", "OFF")
    assert ringcomm.core.config.knob("RINGCOMM_HEADER_IN_SLOT") == "off"
