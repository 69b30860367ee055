"""RINGCOMM_TRACE: per-phase timestamps of the last N collectives (comm.trace()).

With the knob set, every call made leaves one record (seq, collective, algorithm, bytes), whose
phases are monotonic and lie inside the Python call's own window (time.monotonic_ns() is the
same CLOCK_MONOTONIC); slot phases exist exactly for the calls that move data. With the knob
unset trace() is empty. Results are checked against numpy so the traced calls are real ones.
"""
import time

import numpy as np
import pytest

import ringcomm

PHASES = ("entry", "header_posted", "header_seen", "first_slot", "last_slot", "exit")


def _traced_calls(comm):
    r, n = comm.rank, comm.world_size
    windows, names, wrong = [], [], 0

    def timed(name, f):
        t0 = time.monotonic_ns()
        f()
        windows.append((t0, time.monotonic_ns()))
        names.append(name)

    for count in (256, 1 << 16):              # 1 KiB (direct) and 256 KiB (ring) of float32
        x = np.arange(count, dtype=np.float32) + r
        timed("all_reduce", lambda: comm.all_reduce(x))
        want = sum(np.arange(count, dtype=np.float32) + p for p in range(n))
        wrong += int(np.count_nonzero(x != want))
    b = np.full(300, r, dtype=np.int32)
    timed("broadcast", lambda: comm.broadcast(b, root=1))
    wrong += int(np.count_nonzero(b != 1))
    timed("barrier", comm.barrier)
    inp = np.arange(8 * n, dtype=np.float64) * (r + 1)
    out = np.empty(8, dtype=np.float64)
    timed("reduce_scatter", lambda: comm.reduce_scatter(out, inp))
    ref = sum(np.arange(8 * n, dtype=np.float64) * (p + 1) for p in range(n))[8 * r:8 * (r + 1)]
    wrong += int(np.count_nonzero(out != ref))
    h = comm.all_reduce(np.ones(64, dtype=np.float32), async_op=True)
    h.wait()
    names.append("all_reduce")
    windows.append(None)
    return {"trace": comm.trace(), "windows": windows, "names": names, "wrong": wrong}


def _capacity(comm):
    x = np.ones(16, dtype=np.float32)
    for _ in range(5):
        comm.all_reduce(x)
    return comm.trace()


def _untraced(comm):
    x = np.ones(16, dtype=np.float32)
    for _ in range(3):
        comm.all_reduce(x)
    comm.barrier()
    return comm.trace()


def test_trace_records_every_call_with_monotonic_phases():
    res = ringcomm.launch(_traced_calls, 2, env={"RINGCOMM_TRACE": "64"}, timeout=120)
    for rank, out in enumerate(res):
        assert out["wrong"] == 0
        recs = out["trace"]
        assert len(recs) == len(out["names"]), (rank, recs)
        seqs = [rec["seq"] for rec in recs]
        assert seqs == list(range(seqs[0], seqs[0] + len(recs)))
        assert [rec["collective"] for rec in recs] == out["names"]
        assert [rec["algorithm"] for rec in recs] == ["direct", "ring", "direct", "none", "direct", "direct"]
        assert [rec["protocol"] for rec in recs] == ["ll", "header_in_slot", "ll", "none", "ll", "ll"]
        assert {rec["store"] for rec in recs} == {"cached"}
        assert [rec["bytes"] for rec in recs] == [1024, 1 << 18, 1200, 0, 8 * 2 * 8, 256]
        for rec, window in zip(recs, out["windows"]):
            assert rec["ok"] is True
            present = [p for p in PHASES if rec[p] is not None]
            want = list(PHASES)
            if rec["collective"] == "barrier":             # no slot moves
                want = ["entry", "header_posted", "header_seen", "exit"]
            elif rec["collective"] == "broadcast" and rank != 1 and rec["protocol"] != "ll":
                # a non-root of the chain or the in-slot broadcast only receives (an LL one gets
                # the data with the root's header: its first slot is the header's)
                want = ["entry", "header_posted", "header_seen", "last_slot", "exit"]
            assert present == want, rec
            stamps = [rec[p] for p in present]
            assert stamps == sorted(stamps), rec
            if window is not None:                 # the C++ call lies inside the Python call
                assert window[0] <= rec["entry"] and rec["exit"] <= window[1], (rec, window)
        # no rank sees its peer's header before the peer stamped it posted: the other rank's
        # header_posted precedes this rank's header_seen (one clock on one machine), the LL
        # calls included, whose header travels in the outbox's first line
    for a, b in ((res[0]["trace"], res[1]["trace"]), (res[1]["trace"], res[0]["trace"])):
        for ra, rb in zip(a, b):
            assert rb["header_posted"] <= ra["header_seen"], (ra, rb)


def test_trace_keeps_the_last_n_calls():
    res = ringcomm.launch(_capacity, 2, env={"RINGCOMM_TRACE": "3"}, timeout=120)
    for recs in res:
        assert [rec["seq"] for rec in recs] == [3, 4, 5]


def test_trace_off_by_default():
    res = ringcomm.launch(_untraced, 2, env={"RINGCOMM_TRACE": ""}, timeout=120)
    assert res == [[], []]


def test_trace_knob_rejects_negative():
    with pytest.raises(ringcomm.LaunchError, match="RINGCOMM_TRACE"):
        ringcomm.launch(_untraced, 2, env={"RINGCOMM_TRACE": "-1"}, timeout=60)
