"""Cases of tests/test_select.py that run inside spawned ranks (module-level so that spawn can
pickle them)."""
import numpy as np
from mp_cases import init_under_env

SENTINEL = -7.0


def _outcome(comm, x, y):
    """(error type name or "no error", message) of comm.all_reduce(x, output=y)."""
    try:
        comm.all_reduce(x, output=y)
        return ("no error", "")
    except Exception as e:  # noqa: BLE001 - the test compares the type every rank saw
        return (type(e).__name__, str(e))


def store_mismatch_case(rank, world):
    """Rank 0 streams its stores from 1 KiB up, the others never: every all_reduce of at least
    1 KiB (whatever its algorithm) raises MismatchError on every rank before a result is
    written; smaller ones agree and run. Returns [(count, outcome, message, untouched)] and
    whether a small all_reduce afterwards was right."""
    env = {"RINGCOMM_STREAM": "auto", "RINGCOMM_STREAM_MIN_BYTES": "1K" if rank == 0 else "1G"}
    comm = init_under_env(rank, world, "store-mix", env)
    out = []
    try:
        for count in (300, 3000, 100000):   # 1200 B (LL), 12 KB (direct, header in slot), 400 KB (ring)
            x = np.full(count, rank + 1.0, np.float32)
            y = np.full(count, SENTINEL, np.float32)
            res = _outcome(comm, x, y)
            out.append((count, res[0], res[1], bool((y == SENTINEL).all() and (x == rank + 1.0).all())))
        x = np.full(100, rank + 1.0, np.float32)    # 400 B: cached on every rank
        comm.all_reduce(x)
        ok = bool((x == world * (world + 1) / 2).all())
    finally:
        comm.close()
    return out, ok


def threshold_mismatch_case(rank, world):
    """Rank 0's direct range ends at 8 KiB (RINGCOMM_DIRECT_MAX_BYTES), the others' at 64 KiB: an
    all_reduce of bytes x (world-1) = 16 KiB is the ring on rank 0 (fewer than 4 ranks: no
    two-shot) and direct elsewhere, both with the header in slot (the ring's first piece to rank 1,
    the direct one's to every peer), so every rank raises MismatchError naming both selections,
    before a result is written (every first piece is drained by its reader); an all_reduce both
    rules put in the same place then runs."""
    env = {"RINGCOMM_DIRECT_MAX_BYTES": "8K" if rank == 0 else "64K", "RINGCOMM_LL_MAX_BYTES": "0"}
    comm = init_under_env(rank, world, "threshold-mix", env)
    try:
        count = 4096 // (world - 1)   # float32: bytes x (world-1) = 16 KiB
        x = np.full(count, rank + 1.0, np.float32)
        y = np.full(count, SENTINEL, np.float32)
        res = _outcome(comm, x, y)
        untouched = bool((y == SENTINEL).all() and (x == rank + 1.0).all())
        x = np.full(100, rank + 1.0, np.float32)   # 400 B x (world-1): direct on every rank
        comm.all_reduce(x)
        ok = bool((x == world * (world + 1) / 2).all())
    finally:
        comm.close()
    return res, untouched, ok
