"""Shared-memory footprint: from 3 ranks on every rank's segment holds one full push channel (from
its ring predecessor, collectives) and two outboxes of fixed size (collectives, point-to-point)
that its peers read in place, so it is the same at every world size; nothing is mapped after init
(measured after every collective and all-pairs point-to-point at 16 and 32 ranks)."""
import os
import re

import pytest

import ranks
from ringcomm import _C_test
from ringcomm.core.launch import spawn
from footprint_cases import eight_rank_cases, footprint_after_everything, info_rank, many_ranks_tiny_slots
from mp_cases import run_collective_cases
from ranks import run_with_dev_shm

PAGE = 4096
MIB = 2**20
KNOBS = ("RINGCOMM_SLOT_BYTES", "RINGCOMM_NSLOTS", "RINGCOMM_FAR_SLOT_BYTES", "RINGCOMM_OUTBOX_SLOTS",
         "RINGCOMM_LL_MAX_BYTES")


@pytest.fixture
def default_knobs(monkeypatch):
    for k in KNOBS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def reference_bytes(world, slot, nslots, far_slot, outbox_slots=16, ll_bytes=4096):
    """The segment layout computed independently: a header page, the two LL outboxes (the 40-byte
    header and ll_bytes of data in 56-byte payloads of 64-byte lines, page-rounded), control words,
    then the slots (each with a page of slack). From 3 ranks: the one push channel's control (two
    cache lines plus one meta line per slot) and the two outboxes' (three lines plus three per slot),
    then nslots full slots and 2 x outbox_slots far ones: no term depends on the world size. Up to
    two ranks (uniform): control and nslots full slots for every lane and source index."""
    far_slot = min(far_slot, slot)
    ll = -(-(2 * 64 * -(-(40 + ll_bytes) // 56)) // PAGE) * PAGE
    if world <= 2:
        ctl = (128 + 64 * nslots) * 2 * world
        return -(-(PAGE + ll + ctl) // PAGE) * PAGE + 2 * world * nslots * (slot + PAGE)
    ctl = 128 + 64 * nslots + 2 * (192 + 192 * outbox_slots)
    return -(-(PAGE + ll + ctl) // PAGE) * PAGE + nslots * (slot + PAGE) + 2 * outbox_slots * (far_slot + PAGE)


def test_footprint_is_the_same_at_every_world_size(default_knobs):
    got = {w: _C_test.shm_segment_bytes(w) for w in list(range(1, 17)) + [24, 32, 48, 64, 96, 128]}
    for w, b in got.items():
        assert b == reference_bytes(w, 256 * 1024, 8, 32 * 1024), (w, b)
    # From 3 ranks on: one value, at most 4 MiB, with the default (unshrunk) slots; 16 ranks fit
    # Docker's default 64 MiB /dev/shm.
    assert len({b for w, b in got.items() if w >= 3}) == 1, got
    assert got[8] <= 4 * MIB and got[128] == got[8], got
    assert got[16] * 16 <= 56 * MIB < 64 * MIB, got[16] * 16
    # Up to two ranks the layout is the uniform one: every lane and source index, full slots.
    assert got[2] == reference_bytes(2, 256 * 1024, 8, 256 * 1024) > got[3], got


def test_footprint_follows_the_knobs(default_knobs):
    default_knobs.setenv("RINGCOMM_FAR_SLOT_BYTES", "64K")
    default_knobs.setenv("RINGCOMM_NSLOTS", "2")
    for w in (2, 3, 5, 8, 64):
        assert _C_test.shm_segment_bytes(w) == reference_bytes(w, 256 * 1024, 2, 64 * 1024), w
    default_knobs.setenv("RINGCOMM_OUTBOX_SLOTS", "4")
    for w in (3, 40):
        assert _C_test.shm_segment_bytes(w) == reference_bytes(w, 256 * 1024, 2, 64 * 1024, outbox_slots=4), w
    for bad in ("3", "1", "2048"):
        default_knobs.setenv("RINGCOMM_OUTBOX_SLOTS", bad)
        with pytest.raises(ValueError, match="RINGCOMM_OUTBOX_SLOTS"):
            _C_test.shm_segment_bytes(4)
    default_knobs.delenv("RINGCOMM_OUTBOX_SLOTS")
    default_knobs.setenv("RINGCOMM_FAR_SLOT_BYTES", "1M")  # clamped to the full slot
    assert _C_test.shm_segment_bytes(4) == reference_bytes(4, 256 * 1024, 2, 256 * 1024)
    default_knobs.setenv("RINGCOMM_FAR_SLOT_BYTES", "16")
    with pytest.raises(ValueError, match="RINGCOMM_FAR_SLOT_BYTES"):
        _C_test.shm_segment_bytes(4)
    default_knobs.delenv("RINGCOMM_FAR_SLOT_BYTES")
    for ll in (0, 1000, 64 * 1024):
        default_knobs.setenv("RINGCOMM_LL_MAX_BYTES", str(ll))
        for w in (2, 3):
            assert _C_test.shm_segment_bytes(w) == reference_bytes(w, 256 * 1024, 2, 32 * 1024, ll_bytes=ll), (w, ll)


def check_measured(world, results):
    """Every rank maps exactly `world` ringcomm segments (its own and its peers': nothing made after
    init), each of the formula's size and allocated in full; per rank that is at most 4 MiB."""
    failures = [f for fs, _ in results for f in fs]
    assert not failures, "\n".join(failures[:30])
    want = _C_test.shm_segment_bytes(world)
    names = set()
    for r, (_, maps) in enumerate(results):
        assert len(maps) == world, (r, maps)
        for name, (size, allocated) in maps.items():
            assert size == want, (r, name, size, want)
            assert allocated is None or allocated >= want, (r, name, allocated, want)
        names |= set(maps)
    assert len(names) == world, names
    per_rank = sum(size for size, _ in results[0][1].values()) / world
    assert per_rank == want <= 4 * MIB, per_rank
    return per_rank


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [8, 16])
def test_many_ranks_tiny_slots_and_measured_footprint(world, store_env, default_knobs):
    # One group of ranks per world size: every collective under every forced algorithm and all-
    # pairs point-to-point, with tiny slots (outboxes of 2 slots shared by every reader); then, at
    # 16 ranks, the default geometry's mappings after every collective and all-pairs p2p.
    res = ranks.run(many_ranks_tiny_slots, world, (["ring", "direct", "two_shot", "auto"],), timeout=850,
                    env=store_env)
    failures = [f for fs in res for f in fs]
    assert not failures, "\n".join(failures[:30])
    if world == 16:
        check_measured(world, ranks.run(footprint_after_everything, world, timeout=600, env=store_env))


@pytest.mark.timeout(600)
def test_measured_footprint_at_32_ranks(store_env, default_knobs):
    check_measured(32, spawn(footprint_after_everything, 32, timeout=560, env=store_env))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [3, 4])
@pytest.mark.parametrize("algo", ["ring", "direct"])
def test_collectives_with_small_far_channels(world, algo, store_env):
    # 1 KiB slots to the ring neighbour, outboxes of 4 slots of 256 bytes: ring and chain pieces
    # are 4x the direct exchanges' and point-to-point's, every case spans many of both.
    env = {"RINGCOMM_FAR_SLOT_BYTES": "256", "RINGCOMM_OUTBOX_SLOTS": "4"}
    results = spawn(run_collective_cases, world, (1024, 8, ["numpy"], algo, False, env), timeout=280, env=store_env)
    failures = [f for fs, _ in results for f in fs]
    assert not failures, "\n".join(failures[:30])
    base = results[0][1]
    for r, (_, d) in enumerate(results[1:], 1):
        assert d == base, f"rank {r}'s all_reduce results differ bitwise from rank 0's"


@pytest.mark.timeout(300)
def test_eight_ranks_default_geometry(store_env, default_knobs):
    # Spawned ranks inherit this environment: the default slot geometry (the fixture unsets the
    # slot knobs).
    results = spawn(eight_rank_cases, 8, timeout=280, env=store_env)
    failures = [f for fs in results for f in fs]
    assert not failures, "\n".join(failures[:30])


@pytest.mark.timeout(120)
def test_debug_info_states_footprint_once(store_env, capfd, default_knobs):
    default_knobs.setenv("RINGCOMM_DEBUG", "INFO")
    # Spawned: a rank writes to this process's (captured) stderr, where a fork of the session's
    # fork server would write to the server's.
    default_knobs.setenv("RINGCOMM_START_METHOD", "spawn")
    assert all(spawn(info_rank, 3, timeout=100, env=store_env))
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if "shared memory" in ln and ln.startswith("ringcomm[rank")]
    assert len(lines) == 3, err[-3000:]
    want = _C_test.shm_segment_bytes(3)
    for r in range(3):
        mine = [ln for ln in lines if ln.startswith(f"ringcomm[rank {r}/3]")]
        assert len(mine) == 1, lines
        m = re.search(r"shared memory (\d+) B per rank, (\d+) B for 3 ranks", mine[0])
        assert m and int(m.group(1)) == want and int(m.group(2)) == 3 * want, mine[0]
        # The formula, term by term: it sums to the footprint.
        f = re.search(r"at any world size: (\d+) B of header, LL outboxes and control \+ (\d+) x \((\d+) \+ 4096\)"
                      r" \+ 2 x (\d+) x \((\d+) \+ 4096\)", mine[0])
        assert f, mine[0]
        head, ns, sb, ko, fb = (int(g) for g in f.groups())
        assert head + ns * (sb + 4096) + 2 * ko * (fb + 4096) == want, mine[0]
        # Peers checked alike are listed once, as ranges: the line does not grow with the world.
        others = {0: "ranks 1-2", 1: "ranks 0,2", 2: "ranks 0-1"}[r]
        assert f"liveness: {others} pid probe (same PID namespace);" in mine[0], mine[0]


@pytest.mark.timeout(480)
def test_sixteen_ranks_fit_dockers_default_dev_shm(store_env, tmp_path, default_knobs):
    world = 16
    got = run_with_dev_shm("64M", "footprint_cases", "in_docker_default_shm", world, store_env["RC_TEST_STORE"],
                           tmp_path, deadline_s=400, timeout_s=460)
    assert got["status"] == ["exit 0"] * world, (got["status"], got["stderr"])
    failures = [f for fs in got["results"] for f in fs]
    assert not failures, "\n".join(failures[:30])
