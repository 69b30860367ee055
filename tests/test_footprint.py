"""Shared-memory footprint: one full channel per rank (from its ring predecessor, collectives) and
small ones for every other peer and lane, so a rank's segment grows linearly with the world size
and 8 ranks with the default knobs fit Docker's default 64 MiB /dev/shm."""
import os
import re

import pytest

from ringcomm import _C
from ringcomm.launch import spawn
from footprint_cases import eight_rank_cases, info_rank
from mp_cases import run_collective_cases

PAGE = 4096
KNOBS = ("RINGCOMM_SLOT_BYTES", "RINGCOMM_NSLOTS", "RINGCOMM_FAR_SLOT_BYTES", "RINGCOMM_LL_MAX_BYTES")


@pytest.fixture
def default_knobs(monkeypatch):
    for k in KNOBS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def reference_bytes(world, slot, nslots, far_slot, far_nslots_max=4, ll_bytes=4096):
    """The segment layout computed independently: a header page, the two LL outboxes (the 40-byte
    header and ll_bytes of data in 56-byte payloads of 64-byte lines, page-rounded), control words
    (two cache lines plus one meta line per slot) for every lane and source, then the slots (each
    with a page of slack): with two geometries, none for the rank itself."""
    far_slot, far_nslots = min(far_slot, slot), min(far_nslots_max, nslots)
    ctl = (128 + 64 * nslots) * 2 * world
    ll = -(-(2 * 64 * -(-(40 + ll_bytes) // 56)) // PAGE) * PAGE
    data = -(-(PAGE + ll + ctl) // PAGE) * PAGE
    if world <= 2 or (far_slot, far_nslots) == (slot, nslots):  # uniform: every source index, own too
        return data + 2 * world * nslots * (slot + PAGE)
    return data + nslots * (slot + PAGE) + (2 * world - 3) * far_nslots * (far_slot + PAGE)


def test_footprint_is_linear_and_fits_64mib(default_knobs):
    got = {w: _C._shm_segment_bytes(w) for w in range(1, 9)}
    for w, b in got.items():
        assert b == reference_bytes(w, 256 * 1024, 8, 32 * 1024), (w, b)
    # Linear in the world size: constant increments from 3 ranks on (control words grow by whole
    # pages only where the rounding crosses one: allow that page).
    steps = [got[w + 1] - got[w] for w in range(3, 8)]
    assert max(steps) - min(steps) <= PAGE, steps
    assert max(steps) <= 2 * 4 * (32 * 1024 + PAGE) + PAGE, steps
    # Up to two ranks the layout is the uniform one: every lane and source index, full slots.
    assert got[2] == reference_bytes(2, 256 * 1024, 8, 256 * 1024) > got[3], got
    assert got[8] * 8 <= 48 * 2**20 < 64 * 2**20, got[8] * 8


def test_footprint_follows_the_knobs(default_knobs):
    default_knobs.setenv("RINGCOMM_FAR_SLOT_BYTES", "64K")
    default_knobs.setenv("RINGCOMM_NSLOTS", "2")
    for w in (2, 3, 5, 8):
        assert _C._shm_segment_bytes(w) == reference_bytes(w, 256 * 1024, 2, 64 * 1024), w
    default_knobs.setenv("RINGCOMM_FAR_SLOT_BYTES", "1M")  # clamped to the full slot
    assert _C._shm_segment_bytes(4) == reference_bytes(4, 256 * 1024, 2, 256 * 1024)
    default_knobs.setenv("RINGCOMM_FAR_SLOT_BYTES", "16")
    with pytest.raises(ValueError, match="RINGCOMM_FAR_SLOT_BYTES"):
        _C._shm_segment_bytes(4)
    default_knobs.delenv("RINGCOMM_FAR_SLOT_BYTES")
    for ll in (0, 1000, 64 * 1024):
        default_knobs.setenv("RINGCOMM_LL_MAX_BYTES", str(ll))
        for w in (2, 3):
            assert _C._shm_segment_bytes(w) == reference_bytes(w, 256 * 1024, 2, 32 * 1024, ll_bytes=ll), (w, ll)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [3, 4])
@pytest.mark.parametrize("algo", ["ring", "direct"])
def test_collectives_with_small_far_channels(world, algo, store_env):
    # 1 KiB slots to the ring neighbour, 256-byte slots (4 of them) everywhere else: ring and chain
    # pieces are 4x the direct exchanges' and point-to-point's, every case spans many of both.
    env = {"RINGCOMM_FAR_SLOT_BYTES": "256"}
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
    assert all(spawn(info_rank, 3, timeout=100, env=store_env))
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if "shared memory" in ln and ln.startswith("ringcomm[rank")]
    assert len(lines) == 3, err[-3000:]
    want = _C._shm_segment_bytes(3)
    for r in range(3):
        mine = [ln for ln in lines if ln.startswith(f"ringcomm[rank {r}/3]")]
        assert len(mine) == 1, lines
        m = re.search(r"shared memory (\d+) B per rank, (\d+) B for 3 ranks", mine[0])
        assert m and int(m.group(1)) == want and int(m.group(2)) == 3 * want, mine[0]
