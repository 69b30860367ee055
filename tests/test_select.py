"""The one selection (csrc/comm/selection.h): (collective, bytes, world, knobs, device) ->
(algorithm, protocol, store), checked without ranks through ringcomm._C._select against the table
of docs/algorithms.md written out independently here; and, with ranks, that a rank whose store
knob differs raises MismatchError on every rank before any result is written."""
import pytest

import ringcomm
from ringcomm import _C
from ringcomm.core.launch import spawn
from selection_cases import store_mismatch_case, threshold_mismatch_case

KiB = 1024
SELECTION_KNOBS = ("RINGCOMM_ALGO", "RINGCOMM_LL_MAX_BYTES", "RINGCOMM_DIRECT_MAX_BYTES", "RINGCOMM_TWO_SHOT_MAX_BYTES",
                   "RINGCOMM_TWO_SHOT_MIN_WORLD", "RINGCOMM_HEADER_IN_SLOT", "RINGCOMM_STREAM",
                   "RINGCOMM_STREAM_MIN_BYTES", "RINGCOMM_MODEL_MIN_WORLD", "RINGCOMM_PROFILE", "RINGCOMM_CMA_MIN_BYTES",
                   "RINGCOMM_CMA_BROADCAST_MIN_BYTES")
SIZES = [0, 1, 16, 4 * KiB, 4 * KiB + 1, 16 * KiB, 21845, 21846, 32 * KiB, 64 * KiB, 64 * KiB + 1, 128 * KiB,
         128 * KiB + 1, 1 << 20, 64 << 20]
COLLS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "gather", "scatter",
         "barrier"]


@pytest.fixture
def knobs(monkeypatch):
    for k in SELECTION_KNOBS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def model(coll, b, n, algo="auto", ll=4 * KiB, direct=64 * KiB, ts_max=128 * KiB, ts_world=4, inslot=True,
          model_world=5):
    """docs/algorithms.md's table for the host communicator, stores aside; all_reduce under auto
    from `model_world` ranks: the cost model's choice (its own table: tests/test_cost_model.py)."""
    def ar_algo():
        if algo != "auto":
            return algo
        if n <= 1 or b * (n - 1) <= direct:
            return "direct"
        return "two_shot" if n >= ts_world and b <= ts_max else "ring"
    fits_ll = n >= 2 and 0 < b <= ll
    slot = inslot and n > 1 and b > 0
    if coll == "all_reduce":
        if algo == "auto" and n >= model_world:
            return _C._model_choose(b, n, ll if fits_ll else 0, slot)
        if algo == "auto" and fits_ll:
            return ("direct", "ll")
        a = ar_algo()
        return (a, "header_in_slot" if a in ("direct", "ring") and slot else "simple")
    if coll == "broadcast":
        if fits_ll:
            return ("direct", "ll")
        if slot and ar_algo() == "direct":
            return ("direct", "header_in_slot")
        return ("chain", "header_in_slot" if slot else "simple")
    if coll == "reduce":
        return ("direct", "ll") if fits_ll else ("chain", "header_in_slot" if slot else "simple")
    if coll == "all_gather":
        return ("ring", "header_in_slot" if slot and b // n * (n - 1) <= direct else "simple")
    if coll == "reduce_scatter":
        if algo == "auto" and fits_ll:
            return ("direct", "ll")
        if algo == "direct" or (algo == "auto" and (n <= 1 or b // n * (n - 1) <= direct)):
            return ("direct", "header_in_slot" if slot else "simple")
        return ("ring", "header_in_slot" if slot else "simple")
    return {"all_to_all": ("direct", "simple"), "gather": ("direct", "simple"), "scatter": ("direct", "simple"),
            "barrier": ("none", "none")}[coll]


def _check_all(**kw):
    for n in (1, 2, 3, 4, 5, 8):
        for coll in COLLS:
            for b in SIZES:
                got = _C._select(coll, b, n)
                assert got[:2] == model(coll, b, n, **kw), (coll, b, n, kw, got)


def test_defaults_follow_the_documented_table(knobs):
    _check_all()
    # the documented landmarks: 2 ranks LL / direct in slot / ring; 4 ranks two-shot above 21.3 KiB
    assert _C._select("all_reduce", 4 * KiB, 2) == ("direct", "ll", "cached")
    assert _C._select("all_reduce", 64 * KiB, 2) == ("direct", "header_in_slot", "cached")
    assert _C._select("all_reduce", 64 * KiB + 4, 2) == ("ring", "header_in_slot", "cached")
    assert _C._select("all_reduce", 21848, 4) == ("two_shot", "simple", "cached")
    assert _C._select("all_reduce", 128 * KiB + 4, 4) == ("ring", "header_in_slot", "cached")
    assert _C._select("broadcast", 1 << 20, 4) == ("chain", "header_in_slot", "cached")
    assert _C._select("reduce", 16 * KiB, 2) == ("chain", "header_in_slot", "cached")
    assert _C._select("all_gather", 128 * KiB, 2) == ("ring", "header_in_slot", "cached")
    assert _C._select("all_gather", 128 * KiB + 2, 2) == ("ring", "simple", "cached")
    assert _C._select("reduce_scatter", 4 * KiB, 2) == ("direct", "ll", "cached")
    assert _C._select("reduce_scatter", 128 * KiB, 2) == ("direct", "header_in_slot", "cached")
    assert _C._select("reduce_scatter", 128 * KiB + 2, 2) == ("ring", "header_in_slot", "cached")


@pytest.mark.parametrize("algo", ["ring", "direct", "two_shot", "halving_doubling"])
def test_forced_algorithm(knobs, algo):
    knobs.setenv("RINGCOMM_ALGO", algo)
    _check_all(algo=algo)


def test_thresholds_are_the_knobs(knobs):
    knobs.setenv("RINGCOMM_LL_MAX_BYTES", "1K")
    knobs.setenv("RINGCOMM_DIRECT_MAX_BYTES", "8K")
    knobs.setenv("RINGCOMM_TWO_SHOT_MAX_BYTES", "1M")
    knobs.setenv("RINGCOMM_TWO_SHOT_MIN_WORLD", "3")
    _check_all(ll=KiB, direct=8 * KiB, ts_max=1 << 20, ts_world=3)
    knobs.setenv("RINGCOMM_LL_MAX_BYTES", "0")
    knobs.setenv("RINGCOMM_HEADER_IN_SLOT", "off")
    _check_all(ll=0, direct=8 * KiB, ts_max=1 << 20, ts_world=3, inslot=False)
    knobs.setenv("RINGCOMM_MODEL_MIN_WORLD", "3")
    _check_all(ll=0, direct=8 * KiB, ts_max=1 << 20, ts_world=3, inslot=False, model_world=3)


def test_single_copy_reads_from_their_threshold(knobs):
    """With the ranks able to read each other's memory (cma=True): all_gather takes direct/cma
    from RINGCOMM_CMA_MIN_BYTES (8 MiB by default), broadcast from RINGCOMM_CMA_BROADCAST_MIN_BYTES
    (8 MiB), all_to_all at every size (each call reads in place only when every rank's blocks
    qualify); other collectives, and every collective without the reads or with the knob at 0,
    keep the documented table."""
    for n in (2, 3, 4, 8):
        for b in SIZES:
            for coll in COLLS:
                got = _C._select(coll, b, n, "host", True)[:2]
                if coll == "all_to_all":
                    want = ("direct", "cma")
                elif coll in ("all_gather", "broadcast") and b >= (8 << 20):
                    want = ("direct", "cma")
                else:
                    want = model(coll, b, n)
                assert got == want, (coll, b, n, got)
    knobs.setenv("RINGCOMM_CMA_MIN_BYTES", "64K")
    assert _C._select("all_gather", 64 * KiB - 1, 2, "host", True)[:2] == ("ring", "header_in_slot")
    assert _C._select("all_gather", 64 * KiB, 2, "host", True)[:2] == ("direct", "cma")
    assert _C._select("broadcast", 64 * KiB, 2, "host", True)[:2] == ("direct", "header_in_slot")
    # LL first: a threshold below the outbox's size leaves the small broadcasts on it
    knobs.setenv("RINGCOMM_CMA_BROADCAST_MIN_BYTES", "1K")
    assert _C._select("broadcast", 2 * KiB, 2, "host", True)[:2] == ("direct", "ll")
    assert _C._select("broadcast", 8 * KiB, 2, "host", True)[:2] == ("direct", "cma")
    knobs.setenv("RINGCOMM_CMA_BROADCAST_MIN_BYTES", "0")
    assert _C._select("broadcast", 64 << 20, 2, "host", True)[:2] == ("chain", "header_in_slot")
    assert _C._select("all_gather", 64 << 20, 2, "host", True)[:2] == ("direct", "cma")
    knobs.setenv("RINGCOMM_CMA_BROADCAST_MIN_BYTES", "1K")
    knobs.setenv("RINGCOMM_CMA_MIN_BYTES", "0")
    _check_all()
    for coll in COLLS:
        for b in SIZES:
            assert _C._select(coll, b, 2, "host", True)[:2] == model(coll, b, 2)
            assert _C._select(coll, b, 2, "cuda", True)[:2] != ("direct", "cma")


def test_cuda_device_runs_the_ring_and_chains_over_slots(knobs):
    knobs.setenv("RINGCOMM_ALGO", "direct")
    knobs.setenv("RINGCOMM_STREAM", "on")
    for b in SIZES:
        assert _C._select("all_reduce", b, 4, "cuda") == ("ring", "simple", "cached")
        assert _C._select("broadcast", b, 4, "cuda") == ("chain", "simple", "cached")


def test_bad_arguments_and_knobs(knobs):
    with pytest.raises(ringcomm.InvalidArgumentError, match="collective"):
        _C._select("all_reduce_v", 4, 2)
    knobs.setenv("RINGCOMM_ALGO", "tree")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_ALGO"):
        _C._select("all_reduce", 4, 2)


@pytest.mark.timeout(120)
def test_ranks_with_different_store_rules_raise_everywhere(store_env):
    results = spawn(store_mismatch_case, 2, timeout=100, env=store_env)
    for rank, (rows, ok) in enumerate(results):
        assert ok, f"rank {rank}: the all_reduce after the mismatches was wrong"
        outcomes = {count: (kind, msg, untouched) for count, kind, msg, untouched in rows}
        for count, (kind, msg, untouched) in outcomes.items():
            assert kind == "MismatchError", (rank, count, kind, msg)
            assert "store=streaming" in msg and "store=cached" in msg, msg
            assert untouched, f"rank {rank} wrote a result of {count} elements before the mismatch"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_with_different_thresholds_raise_everywhere(world, store_env):
    results = spawn(threshold_mismatch_case, world, timeout=100, env=store_env)
    for rank, ((kind, msg), untouched, ok) in enumerate(results):
        assert kind == "MismatchError", (rank, kind, msg)
        assert "algo=ring, proto=header_in_slot" in msg and "algo=direct, proto=header_in_slot" in msg, msg
        assert untouched, f"rank {rank} wrote a result before the mismatch was raised"
        assert ok, f"rank {rank}: the all_reduce after the mismatch was wrong"
