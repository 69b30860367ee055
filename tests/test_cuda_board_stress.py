"""The header board under a fused/host-ordered call mix (transport/shm_board.h, comm/core.cpp): the
production CUDA host code over the fake runtime (tests/test_cuda_fake.py), RINGCOMM_CUDA_P2P=device.

Every rank runs the same seeded plan (tests/fake_cuda/rank.py, stress_plan) of fused collectives
(all_reduce, reduce_scatter, equal all_gather, broadcast, reduce: no header, no data moved under the
fake) and host-ordered ones (gather, scatter, all_to_all, barrier, unequal all_gather, send/recv
pairs), in bursts, each rank sleeping its own random 0-2 ms before every call, so that a fast rank
runs fused calls and its next exchange while a slow one is still before its previous exchange:
- no error, every host-ordered call's output right, one header posted per host-ordered collective
  and none per fused call;
- one rank calling, at one random point, a call of the other kind (fused for host-ordered or the
  reverse) and then the plan again: every rank raises MismatchError (or, having learnt it from a
  peer before its own call, RingcommError "unusable after an earlier failure" with errored() the
  MismatchError: docs/cuda.md), well within the timeout; no rank's own exchange finds a mismatch
  before the diverging call (a slow rank may learn a peer's before it gets there); so is a diverging
  rank that makes no call after its fused one (its fused word alone tells the peers);
- the same numbered across the wrap of the headers' 32-bit sequence and of the board's word;
- a rank closing midway: PeerFailureError on the others at once, never MismatchError.
The soak (more seeds, longer plans) is marked slow."""
import random
import re

import pytest
from test_cuda_fake import ERR, pytestmark, run  # noqa: F401 - pytestmark: skipped where the fake is not built

HOST_COLLECTIVES = {"gather", "scatter", "all_to_all", "barrier", "all_gather_unequal"}
TIMEOUT_S = 5.0  # the rank script's communicator timeout
# A mismatch this rank's header exchange found itself (comm/header_exchange.cpp), not a peer's.
OWN_FINDING = re.compile(r"^ringcomm: \w+ \(seq \d+\) on rank \d+: rank \d+ (ran this call|posted its header)")


# The waits as configured, and waits that sleep at once (a futex wake-up between a rank's post and
# its reads of the peers' headers: a peer meanwhile runs further).
WAITS = {"default": {}, "sleep": {"RINGCOMM_WAIT": "spin", "RINGCOMM_SPIN_US": "0"}}


def stress(tmp_path, world, seed, calls, diverge=None, waits="default", last_seq=0, close_after=None):
    env = dict(WAITS[waits], STRESS_SEED=str(seed), STRESS_CALLS=str(calls), STRESS_LAST_SEQ=str(last_seq))
    if close_after is not None:
        env["STRESS_CLOSE"] = ",".join(map(str, close_after))
    if diverge is not None:
        env["STRESS_DIVERGE"] = ",".join(map(str, diverge))
    return run(tmp_path, "stress", world=world, env_extra=env)


def check_clean(outs, calls):
    for r, o in enumerate(outs):
        assert o["error"] is None, (r, o["error"])
        assert o["errored"] is None, (r, o["errored"])
        assert o["done"] == calls
        assert o["bad"] == [], (r, o["bad"][:3])
        assert o["posted"] == sum(k in HOST_COLLECTIVES for k in o["kinds"]), r


def check_diverged(outs, stalled=None):
    """stalled: the rank that made no call after its diverging one."""
    at = outs[0]["diverge_at"]
    assert 0 <= at < len(outs[0]["kinds"])
    t_div = [o["t_diverged"] for o in outs if "t_diverged" in o]
    assert len(t_div) == 1, "exactly one rank diverged"
    for r, o in enumerate(outs):
        assert o["bad"] == [], (r, o["bad"][:3])
        assert o["errored"] is not None, (r, o["error"], f"rank {r}: no error")
        assert ERR[o["errored"][0]] == "Mismatch", (r, o["errored"])
        # Found by the board, never by a timeout: every rank knows well within the timeout of
        # the diverging call.
        assert o["t_errored"] - t_div[0] < TIMEOUT_S * 0.6, (r, o["t_errored"] - t_div[0])
        if r == stalled:
            # Its fused call raises only when a peer's finding reached its watchdog before the
            # call's wait.
            assert o["done"] == at + 1 or (o["done"] == at and o["error"][:2] == [at, "MismatchError"]), \
                (r, o["error"], o["done"])
            continue
        assert o["error"] is not None, f"rank {r} finished the plan"
        i, kind, msg = o["error"]
        # A rank may learn a peer's failure before it reaches the diverging call (a slow rank's
        # earlier call then raises the peer's error), but its own board never finds a mismatch
        # there: that would be a false alarm.
        assert i >= at or not OWN_FINDING.match(msg), (r, at, o["error"])
        assert kind == "MismatchError" or (kind == "RingcommError" and "unusable after an earlier failure" in msg), \
            (r, o["error"])
    assert any(o["error"] and o["error"][1] == "MismatchError" for o in outs)


@pytest.mark.parametrize("waits", sorted(WAITS))
@pytest.mark.parametrize("world", [2, 3])
def test_fused_and_host_calls_interleave(tmp_path, world, waits):
    check_clean(stress(tmp_path, world, seed=world, calls=300, waits=waits), 300)


@pytest.mark.parametrize("world", [2, 3])
def test_sequences_wrap(tmp_path, world):
    """Numbered from 2^32 - 60: the headers' 32-bit collective sequence wraps after 60 calls, the
    board's word (board_seq_of: the exchanges, fewer than the calls) some 90 calls later; then a
    diverging rank is still found by its header's sequence or its fused word."""
    last = 2**32 - 60
    (tmp_path / "clean").mkdir()
    outs = stress(tmp_path / "clean", world, seed=30 + world, calls=300, last_seq=last)
    check_clean(outs, 300)
    calls = [k for k in outs[0]["kinds"] if k != "sendrecv"]
    assert all(o["next_seq"] == last + len(calls) + 1 for o in outs)
    assert last + outs[0]["posted"] > 2**32 - 1  # the board's word wrapped too (board_seq_of)
    (tmp_path / "diverged").mkdir()
    check_diverged(stress(tmp_path / "diverged", world, seed=40 + world, calls=300, last_seq=last,
                          diverge=(world - 1, 150)))


@pytest.mark.parametrize("world", [2, 3])
def test_diverging_rank_is_mismatch_on_every_rank(tmp_path, world):
    rng = random.Random(100 + world)
    for k in range(3):
        d = tmp_path / str(k)
        d.mkdir()
        check_diverged(stress(d, world, seed=world * 10 + k, calls=200,
                              diverge=(rng.randrange(world), rng.randrange(10, 190))))


@pytest.mark.parametrize("world", [2, 3])
def test_stalled_fused_rank_is_seen_by_its_fused_word(tmp_path, world):
    """The diverging rank runs a host-ordered call fused and then makes no call, posting nothing
    more: only its fused word (ShmBoard::mark_fused) tells the peers' header waits."""
    rng = random.Random(200 + world)
    for k in range(2):
        d = tmp_path / str(k)
        d.mkdir()
        r = rng.randrange(world)
        outs = stress(d, world, seed=world * 20 + k, calls=200, diverge=(r, rng.randrange(10, 150), "stall"))
        check_diverged(outs, stalled=r)
        assert all("without a header exchange" in o["errored"][1] for o in outs), [o["errored"] for o in outs]


@pytest.mark.parametrize("world", [2, 3])
def test_rank_closing_mid_plan_is_peer_failure_at_once(tmp_path, world):
    """One rank closes its communicator after a random call while the others go on: their next
    exchange with it (a host-ordered collective, or a send/recv pair with it) raises
    PeerFailureError "closed" at once, never MismatchError (its fused word is below their call's
    sequence) and without waiting for the closing rank's close() (RINGCOMM_CUDA_CLOSE_WAIT: 2 s in
    these runs), whose own close() returns as soon as they have closed too."""
    rng = random.Random(300 + world)
    for k in range(2):
        d = tmp_path / str(k)
        d.mkdir()
        r, after = rng.randrange(world), rng.randrange(10, 150)
        outs = stress(d, world, seed=world * 30 + k, calls=200, close_after=(r, after))
        t_closed = outs[r]["t_closed"]
        assert outs[r]["error"] is None and outs[r]["done"] == after + 1
        assert outs[r]["close_s"] < 1.0, outs[r]["close_s"]
        for q, o in enumerate(outs):
            if q == r:
                continue
            assert o["bad"] == [], (q, o["bad"][:3])
            assert o["error"] is not None, (q, "finished the plan")
            i, kind, msg = o["error"]
            assert i > after, (q, after, o["error"])
            assert kind == "PeerFailureError" or (kind == "RingcommError" and "unusable after an earlier failure" in msg), \
                (q, o["error"])
            assert ERR[o["errored"][0]] == "PeerFailure", (q, o["errored"])
            assert o["t_errored"] - t_closed < 1.0, (q, o["t_errored"] - t_closed)
        assert any(o["error"] and "closed its communicator" in o["error"][2] for o in outs), [o["error"] for o in outs]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_soak(tmp_path, world):
    rng = random.Random(world)
    for k in range(24):
        d = tmp_path / str(k)
        d.mkdir()
        seed, r, at = 1000 + k, rng.randrange(world), rng.randrange(10, 900)
        if k % 3 == 0:
            check_clean(stress(d, world, seed, calls=1000, waits=sorted(WAITS)[k % 2]), 1000)
        elif k % 3 == 1:
            check_diverged(stress(d, world, seed, calls=1000, diverge=(r, at)))
        else:
            check_diverged(stress(d, world, seed, calls=1000, diverge=(r, at, "stall")), stalled=r)
