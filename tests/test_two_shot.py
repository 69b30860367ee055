"""The two-shot all_reduce (csrc/algo/direct.cpp: a direct reduce-scatter over the all-reduce
chunks, then a direct all-gather): results against numpy and bit for bit against the ring and
the one-shot at worlds 2-4, every dtype x op, in place and out of place, counts 0, 1, 2, 3, 5,
below and not divisible by the world size, and with tiny slots (many pieces per chunk, two slots
per channel); auto's choice seen in the trace; ranks that force different algorithms raise
MismatchError on every rank, write nothing, and the communicator stays usable. One group of
ranks per world size runs all cases of a test (tests/two_shot_cases.py)."""
import pytest

import ringcomm
import ringcomm.core.config
from ringcomm import _C
import ranks
from two_shot_cases import correctness_cases, mismatch_cases

torch = pytest.importorskip("torch")   # the bfloat16 cases


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_two_shot_matches_numpy_the_ring_and_the_one_shot(world, store_env):
    results = ranks.run(correctness_cases, world, timeout=140, env=store_env)
    ranks.assert_no_failures(results)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_differently_forced_algorithms_raise_everywhere(world, store_env):
    results = ranks.run(mismatch_cases, world, timeout=80, env=store_env)
    names = [row[0] for row in results[0]]
    assert len(names) == 9, names
    for i, name in enumerate(names):
        for _, rank, kind, msg, untouched, usable in (res[i] for res in results):
            assert kind == "MismatchError", (name, rank, kind, msg)
            assert "algo=two_shot" in msg, (name, rank, msg)
            assert untouched, f"{name}: rank {rank} wrote a result before the mismatch was raised"
            assert usable, f"{name}: rank {rank}'s communicator gave wrong results afterwards"


def test_algo_knob_accepts_two_shot(monkeypatch):
    monkeypatch.setenv("RINGCOMM_ALGO", "Two_Shot")
    assert ringcomm.core.config.knob("RINGCOMM_ALGO") == "two_shot"
    _C.Communicator(0, 1, 10.0)
    monkeypatch.setenv("RINGCOMM_ALGO", "three_shot")
    with pytest.raises(ringcomm.InvalidArgumentError, match="two_shot"):
        _C.Communicator(0, 1, 10.0)
    monkeypatch.delenv("RINGCOMM_ALGO")
    assert ringcomm.core.config.knob("RINGCOMM_TWO_SHOT_MAX_BYTES") > 0
