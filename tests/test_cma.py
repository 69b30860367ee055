"""Single-copy reads (csrc/transport/shm_cma.h, csrc/algo/cma.cpp): results bit-equal to numpy for
every dtype on the cma path and beside it, the fallback when a rank may not read its peers, a rank
dying while its peers wait on it, and the knob's range."""
import pytest

import ringcomm
from ringcomm import _C
from ringcomm.core.launch import spawn
from cma_cases import deny_case, dies_mid_call_case, exact_cases, non_contiguous_case

CMA = {"RINGCOMM_CMA_MIN_BYTES": "64K", "RINGCOMM_CMA_BROADCAST_MIN_BYTES": "64K"}


def _cma_possible(store_env):
    """Whether this machine lets one process read a sibling's memory (the probe's question)."""
    results = spawn(deny_case, 2, args=(-1,), timeout=60, env=store_env)
    return all(paths[0] == "direct/cma" for _, paths in results)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_results_are_exact_on_and_beside_the_cma_path(world, store_env):
    results = spawn(exact_cases, world, args=(CMA,), timeout=280, env=store_env)
    fails = [f for fs, _ in results for f in fs]
    assert not fails, "\n".join(fails[:20])
    paths = results[0][1]
    if not _cma_possible(store_env):
        pytest.skip("process_vm_readv is not allowed between sibling processes here")
    # Below the threshold the slot paths, at and above it the cma protocol.
    assert "direct/cma" in paths["all_to_all"] and "direct/cma" in paths["all_gather"], paths
    assert "direct/cma" in paths["broadcast"] and "ring/header_in_slot" in paths["all_gather"], paths
    # Uneven splits are not read in place: they travel through slots, and the trace says so.
    assert paths["all_to_all_uneven"] == ["direct/simple"], paths


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_streamed_own_blocks_are_exact(world, store_env):
    """The own block copied with streaming stores (RINGCOMM_LOCAL_STREAM_MIN_BYTES below the blocks
    above the cma threshold): unaligned starts and tails, every dtype, bit-equal to numpy."""
    results = spawn(exact_cases, world, args=(dict(CMA, RINGCOMM_LOCAL_STREAM_MIN_BYTES="4097"),),
                    timeout=280, env=store_env)
    fails = [f for fs, _ in results for f in fs]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.timeout(600)
def test_results_are_exact_at_8_ranks(store_env):
    """8 ranks on these CPUs: every reader of one owner at once, blocks no world size divides."""
    results = spawn(exact_cases, 8, args=(CMA,), timeout=580, env=store_env)
    fails = [f for fs, _ in results for f in fs]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.timeout(300)
def test_results_are_exact_with_the_protocol_off(store_env):
    results = spawn(exact_cases, 2, args=({"RINGCOMM_CMA_MIN_BYTES": "0", "RINGCOMM_CMA_BROADCAST_MIN_BYTES": "64K"},),
                    timeout=280, env=store_env)
    fails = [f for fs, _ in results for f in fs]
    assert not fails, "\n".join(fails[:20])
    assert all("cma" not in p for ps in results[0][1].values() for p in ps), results[0][1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,deny", [(2, 1), (3, 0)])
def test_one_rank_that_cannot_read_turns_it_off_everywhere(world, deny, store_env):
    results = spawn(deny_case, world, args=(deny,), timeout=100, env=store_env)
    assert all(ok for ok, _ in results), results
    assert all(paths == ["direct/simple", "ring/simple", "chain/header_in_slot"] for _, paths in results), results


@pytest.mark.timeout(120)
def test_a_rank_dying_after_its_reads_is_a_peer_failure(store_env):
    if not _cma_possible(store_env):
        pytest.skip("process_vm_readv is not allowed between sibling processes here")
    results = spawn(dies_mid_call_case, 3, args=(CMA,), timeout=100, env=store_env, may_die=[2])
    assert results[2] is None
    for kind, took in results[:2]:
        assert kind == "PeerFailureError" and took < 25, results


@pytest.mark.timeout(60)
def test_strided_input_is_refused(store_env):
    results = spawn(non_contiguous_case, 2, args=(CMA,), timeout=50, env=store_env)
    assert all(kind not in ("no error",) for kind in results), results


def test_knob_range(monkeypatch):
    monkeypatch.setenv("RINGCOMM_CMA_MIN_BYTES", "-1")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_CMA_MIN_BYTES"):
        _C.Communicator(0, 1, 10.0)
    monkeypatch.setenv("RINGCOMM_CMA_MIN_BYTES", "0")
    _C.Communicator(0, 1, 10.0)
    monkeypatch.setenv("RINGCOMM_CMA_BROADCAST_MIN_BYTES", "-1")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_CMA_BROADCAST_MIN_BYTES"):
        _C.Communicator(0, 1, 10.0)
    monkeypatch.setenv("RINGCOMM_CMA_BROADCAST_MIN_BYTES", "8M")
    monkeypatch.setenv("RINGCOMM_LOCAL_STREAM_MIN_BYTES", "-1")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_LOCAL_STREAM_MIN_BYTES"):
        _C.Communicator(0, 1, 10.0)
