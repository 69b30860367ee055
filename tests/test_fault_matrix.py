"""The fault matrix (cases in fault_matrix_cases.py): a peer killed with SIGKILL in each phase of
every collective at world 2 and 3, a stopped peer, a peer that exits cleanly, a late peer under an
infinite timeout, a stale file store. Each case runs on freshly fork()ed ranks with a fresh
communicator; the survivors must raise the expected typed error within the bound (a few
liveness slices, or the timeout plus that), no rank may crash or hang, and no /dev/shm segment
may be left (conftest's no_leaks)."""
import re

import pytest

import ranks
from ringcomm.core.launch import spawn
from fault_matrix_cases import COLLECTIVES, run_matrix

# RINGCOMM_LIVENESS_MS is 100 by default: a dead peer is found within a slice or two; the
# bound leaves room for a loaded 2-core machine.
BOUND_S = 3.0
TIMEOUT_S = 20.0   # the communicators' timeout where a failure must not wait for it
STOP_TIMEOUT_S = 1.5


def _kill_cases():
    cases = []
    for world in (2, 3):
        cases.append(dict(kind="kill", world=world, phase="rendezvous", coll="", timeout=TIMEOUT_S))
        for coll in COLLECTIVES:
            cases.append(dict(kind="kill", world=world, phase="header", coll=coll, timeout=TIMEOUT_S))
            if coll != "barrier":
                case = dict(kind="kill", world=world, phase="p2p" if coll == "send_recv" else "data",
                            coll=coll, timeout=TIMEOUT_S)
                # Small slots: the data phase is thousands of hand-offs long, and a sender can
                # never be more than the slots (32 KiB) ahead of the victim, so no survivor can
                # finish its part in the moment between the victim's first data and its death.
                # The single-copy path (RINGCOMM_CMA_MIN_BYTES) would make the data phase one
                # copy: its death-after-reads case is in tests/test_cma.py.
                case["env"] = {"RINGCOMM_SLOT_BYTES": "4096", "RINGCOMM_CMA_MIN_BYTES": "0"}
                cases.append(case)
    return cases


def _other_cases():
    cases = []
    for world in (2, 3):
        cases.append(dict(kind="sigstop", world=world, phase="", coll="all_reduce", timeout=STOP_TIMEOUT_S))
        cases.append(dict(kind="exit", world=world, phase="", coll="all_reduce", timeout=TIMEOUT_S))
    cases.append(dict(kind="late", world=2, phase="", coll="all_reduce", timeout=float("inf"), late_s=0.5))
    cases.append(dict(kind="stale", world=2, phase="", coll="all_reduce", timeout=TIMEOUT_S, missing=False))
    cases.append(dict(kind="stale", world=2, phase="", coll="all_reduce", timeout=2.0, missing=True))
    return cases


def _name(case):
    return "-".join(str(case[k]) for k in ("kind", "world", "phase", "coll") if case[k]) + (
        "-missing" if case.get("missing") else "")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """Every case's record, from one spawned driver (it forks each case's ranks)."""
    d = tmp_path_factory.mktemp("fault-matrix")
    cases = _kill_cases() + _other_cases()
    before = ranks.shm_segments()
    records = spawn(run_matrix, 1, args=(cases, 40.0), timeout=240, env={"RC_TEST_STORE": str(d)})[0]
    # This fixture runs before any test's own leak check (conftest's no_leaks): the segments the
    # cases leave are collected here.
    leaked = ranks.lasting(ranks.shm_segments() - before)
    by_name = {_name(r["case"]): r for r in records}
    by_name["leaked"] = sorted(leaked)
    return by_name


@pytest.mark.timeout(300)
def test_no_segment_left(matrix):
    assert matrix["leaked"] == [], matrix["leaked"]


def _expect_typed(rec, rank, kinds, bound):
    out = rec["results"][rank]
    assert out is not None and "error" not in out, (rank, rec)
    key = "init" if "init" in out else "call"
    kind, msg, dt = out[key]
    assert kind in kinds, (rank, rec)
    assert dt < bound, (f"rank {rank} took {dt:.2f} s (bound {bound} s)", rec)
    return msg


def _no_crash(rec, victim_status):
    world = rec["case"]["world"]
    assert rec["status"][:world - 1] == ["exit 0"] * (world - 1), rec
    assert rec["status"][world - 1] == victim_status, rec


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", _kill_cases(), ids=_name)
def test_killed_peer(case, matrix):
    rec = matrix[_name(case)]
    world = case["world"]
    _no_crash(rec, "signal 9")
    for r in range(world - 1):
        _expect_typed(rec, r, ("PeerFailureError",), BOUND_S)
        if case["phase"] == "p2p":
            assert rec["results"][r]["first"] == [9.0, 9.0], rec  # the message before the death
    if case["phase"] == "rendezvous" or world == 2:
        # The survivor next to the victim names it.
        assert f"rank {world - 1}" in rec["results"][0][("init" if case["phase"] == "rendezvous" else "call")][1], rec


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_stopped_peer_times_out_naming_it(world, matrix):
    rec = matrix[f"sigstop-{world}-all_reduce"]
    _no_crash(rec, "signal 9")  # the driver kills the stopped peer once the survivors are done
    for r in range(world - 1):
        msg = _expect_typed(rec, r, ("TimeoutError", "PeerFailureError"), STOP_TIMEOUT_S + BOUND_S)
    msg0 = _expect_typed(rec, 0, ("TimeoutError",), STOP_TIMEOUT_S + BOUND_S)
    assert f"rank {world - 1}" in msg0, rec
    assert rec["results"][0]["call"][2] >= STOP_TIMEOUT_S * 0.8, rec  # it did wait the timeout


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_cleanly_exited_peer_is_reported_closed(world, matrix):
    rec = matrix[f"exit-{world}-all_reduce"]
    _no_crash(rec, "exit 0")
    for r in range(world):
        assert rec["results"][r]["first"] == [float(world)] * 8, rec
    for r in range(world - 1):
        msg = _expect_typed(rec, r, ("PeerFailureError",), BOUND_S)
        assert "closed" in msg and "died" not in msg, (r, rec)


@pytest.mark.timeout(300)
def test_infinite_timeout_waits_for_a_late_peer(matrix):
    rec = matrix["late-2-all_reduce"]
    _no_crash(rec, "exit 0")
    for r in range(2):
        kind, msg, dt = rec["results"][r]["call"]
        assert kind == "no error", rec
        assert rec["results"][r]["value"] == [3.0] * 8, rec
    assert rec["results"][0]["call"][2] >= 0.4, rec  # rank 0 waited for the late peer


@pytest.mark.timeout(300)
def test_stale_file_store(matrix):
    recs = [r for name, r in matrix.items() if name.startswith("stale-")]
    assert len(recs) == 2, sorted(matrix)
    ok = next(r for r in recs if not r["case"]["missing"])
    _no_crash(ok, "exit 0")
    for r in range(2):
        assert ok["results"][r]["call"][0] == "no error", ok
        assert ok["results"][r]["value"] == [3.0] * 8, ok
    missing = next(r for r in recs if r["case"]["missing"])
    _no_crash(missing, "exit 0")
    kind, msg, dt = missing["results"][0]["call"]
    assert kind == "TimeoutError", missing
    # The stale name of rank 1 was not taken for rank 1's: rank 0 waited for rank 1 itself, and
    # its TimeoutError names rank 1 as the rank that never arrived.
    assert re.search(r"never arrived within [\d.]+ s: \[1\]", msg), missing
    assert dt < missing["case"]["timeout"] + BOUND_S, missing
