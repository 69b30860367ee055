"""RINGCOMM_STREAM=adapt: the ranks agree on every call's store (a disagreement would raise
MismatchError), results stay bit-exact whichever store runs, and the policy follows the ranks'
timings: the test build replaces a rank's timings with fixed costs per byte
(RINGCOMM_TEST_STORE_COST), which makes the switches and explorations exact."""
import pytest

from ringcomm.core.launch import spawn

from store_adapt_cases import adapt_case, cost_change_case, mismatch_then_go_on_case

pytestmark = pytest.mark.timeout(180)

CALLS = 150  # rounds; two in three are eligible (4 eligible collectives each): 400 eligible calls


def _run(world, costs, store_env, hooked=True, calls=CALLS):
    results = spawn(adapt_case, world, args=(costs, calls, hooked), timeout=150, env=store_env)
    assert all(ok for ok, _ in results), "results not exact"
    states = [s for _, s in results]
    assert all(s == states[0] for s in states), "the ranks' agreed states differ"
    return states[0]


def _explorations(eligible, first=128, cap=1024):
    """Explorations among `eligible` calls under cached stores, without a switch: calls 128, 384,
    896, 1920, ... (the interval doubling from 128 up to `cap`)."""
    n, at, step = 0, first, first
    while at <= eligible:
        n += 1
        step = min(step * 2, cap)
        at += step
    return n


@pytest.mark.parametrize("world", [2, 3])
def test_streaming_cheaper_everywhere_switches_once(world, store_env):
    states = _run(world, ["4,1"] * world, store_env)
    eligible = [s["eligible"] for s in states]
    assert eligible == [4 * (i + 1 - (i + 3) // 3) for i in range(CALLS)]   # 4 per eligible round
    first = next(i for i, s in enumerate(states) if s["explorations"])
    # the first exploration (eligible call 128) measures streaming; the next call's votes switch
    assert states[first]["eligible"] >= 128 and states[-1]["current"] == "streaming"
    assert states[-1]["switches"] == 1
    assert all(s["current"] == "cached" for s in states[:first])


@pytest.mark.parametrize("world", [2, 3])
def test_cached_cheaper_never_switches_and_explores_less_often(world, store_env):
    last = _run(world, ["1,4"] * world, store_env)[-1]
    assert last["current"] == "cached" and last["switches"] == 0
    assert last["explorations"] == _explorations(last["eligible"])


def test_votes_split_evenly_keep_the_store(store_env):
    last = _run(2, ["4,1", "1,4"], store_env)[-1]
    assert last["current"] == "cached" and last["switches"] == 0


def test_the_majority_of_votes_decides(store_env):
    last = _run(3, ["4,1", "4,1", "1,4"], store_env)[-1]
    assert last["current"] == "streaming" and last["switches"] == 1


def test_measured_timings_keep_the_ranks_agreed_and_exact(store_env):
    """The product build, real timings: whatever it decides, the ranks decide alike (a store that
    differed would raise MismatchError) and every result is exact."""
    last = _run(2, None, store_env, hooked=False, calls=150)[-1]
    assert last["eligible"] == 4 * 100 and last["explorations"] >= 2


def test_a_mismatch_changes_no_agreed_state(store_env):
    results = spawn(mismatch_then_go_on_case, 2, timeout=150, env=store_env)
    assert all(first == "MismatchError" and ok for first, ok, _ in results), results
    assert results[0][2] == results[1][2] and results[0][2]["eligible"] == 4 * 140


def test_store_stats_empty_unless_adapting(store_env):
    from ringcomm.core.launch import spawn as sp
    assert sp(_stats_default, 1, timeout=60, env=store_env) == [{}]


def _stats_default(rank, world):
    from mp_cases import init_under_env
    comm = init_under_env(rank, world, "adapt_off", {"RINGCOMM_STREAM": "adapt"})
    try:
        return comm.store_stats()       # one rank: nothing to adapt
    finally:
        comm.close()


@pytest.mark.parametrize("back,want", [
    ("1,1.5", "cached"),      # cached under 0.87x streaming: back to cached
    ("1,1.1", "streaming"),   # cached cheaper, but not by the margin: stays
])
def test_leaving_cached_takes_the_wide_margin_coming_back_the_narrow(back, want, store_env):
    # 4 eligible calls a round: 40 rounds switch to streaming (the first exploration, call 128),
    # 60 more hold explorations of cached stores every 64 calls while streaming, 100 more at least
    # one exploration of the other store whichever is in use
    phases = [("4,1", 40), (back, 60), ("1,0.6", 100)]
    results = spawn(cost_change_case, 2, args=(phases,), timeout=150, env=store_env)
    assert all(ok for ok, _ in results) and results[0][1] == results[1][1], results
    first, second, third = results[0][1]
    assert first["current"] == "streaming" and first["switches"] == 1
    assert second["current"] == want
    # streaming at 0.6x cached is not under 0.55x: a rank in cached stores does not leave them
    assert third["current"] == want


@pytest.mark.parametrize("world,small_rank", [(2, None), (2, 0), (3, 1)])
def test_all_to_all_is_decided_after_its_exchange(world, small_rank, store_env):
    # Every call is eligible (the largest input is at least 16 KiB on every rank's reading), so
    # the first exploration is call 128 and the call after it switches to streaming, which the
    # calls then run under although each header keeps the selection's (cached) store.
    from store_adapt_cases import all_to_all_case
    results = spawn(all_to_all_case, world, args=(["4,1"] * world, 140, small_rank), timeout=150, env=store_env)
    assert all(ok for ok, _, _ in results), "results not exact"
    states = [s for _, s, _ in results]
    assert all(s == states[0] for s in states), "the ranks' agreed states differ"
    assert [s["eligible"] for s in states[0]] == list(range(1, 141))
    assert states[0][126]["current"] == "cached" and states[0][127]["explorations"] == 1
    assert states[0][128]["current"] == "streaming" and states[0][-1]["switches"] == 1
    assert all(stores == ["streaming"] * 8 for _, _, stores in results), [s for _, _, s in results]


def test_small_all_to_all_is_left_out(store_env):
    from store_adapt_cases import all_to_all_case
    results = spawn(all_to_all_case, 2, args=(["4,1"] * 2, 3, None), timeout=150,
                    env={**store_env, "RINGCOMM_STREAM_ADAPT_MIN_BYTES": "1M"})
    assert all(ok for ok, _, _ in results)
    assert all(s["eligible"] == 0 and stores == ["cached"] * 3 for _, states, stores in results for s in states)
