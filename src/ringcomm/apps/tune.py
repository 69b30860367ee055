"""Measure this machine's cost-model profile once: ``python -m ringcomm.apps.tune [-o FILE]``.

The all-reduce cost model (csrc/comm/cost_model.h, docs/algorithms.md) needs, per machine:

* ``alpha_s``: one hand-off between two ranks that each have a CPU (2 spawned ranks, median
  times of back-to-back 64-byte all_reduces: the ring's three hand-offs, header, reduce-scatter
  and all-gather, less LL's one, halved; what a call costs whatever its algorithm is the same for
  every candidate and so is left out);
* ``alpha_shared_s``: the same with both ranks pinned to one CPU (every hand-off waits for the
  peer to be scheduled: what ranks that outnumber the CPUs pay), taken as a whole 4-byte LL call:
  the switches between the two ranks outweigh what the call itself costs;
* ``slot_s``: one slot handed over, beyond the hand-off: the 2-rank ring all_reduce of 64 KiB cut
  into 256-byte slots against the same in one slot per chunk, per extra slot, less ``alpha_s``.
  ``alpha_s``'s ring hands over a slot with each hand-off, so the two figures overlap and
  ``slot_s`` often lands on its floor (a twentieth of the extra time per slot);
* ``copy_Bps`` / ``reduce_Bps``: one process's copy into a slot and float32 SUM kernel over 4 MiB
  buffers (bytes of one input per second);
* ``ll_Bps``: the LL lines' bandwidth, from the 2-rank LL all_reduce at 64 KiB against 4 KiB (LL
  raised to 64 KiB for the run: between 4 bytes and 4 KiB the lines cost a fraction of a
  microsecond, less than the run-to-run noise);
* ``cpus``: the CPUs this process may run on.

The run takes a few seconds; run it on a quiet machine (beside other work it measures that work:
with a busy process on the pinned CPU, ``alpha_shared_s`` becomes a scheduler slice). The profile is
JSON with a format version and the hash of its params (computed by the C++ core, which refuses a
file whose hash disagrees). Keep the file and point ``RINGCOMM_PROFILE`` at it on every rank: the
ranks of a communicator must load the same profile (init raises MismatchError otherwise). The choice
of algorithm is a function of the profile, never of timings taken while a communicator runs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

from ..core.machine import cpu_model

__all__ = ["measure", "write_profile", "main"]

DEFAULT_OUTPUT = "ringcomm-profile.json"
LL_SMALL, LL_LARGE = 4 << 10, 64 << 10   # the LL all_reduces ll_Bps is measured between


def _bandwidths(nbytes: int = 4 << 20, budget_s: float = 1.0) -> tuple:
    """(copy_Bps, reduce_Bps): the best of repeated runs over page-aligned, pre-touched buffers."""
    from .. import _C
    from ..core.tables import DTYPE_CODES, op_code
    n = nbytes // 4
    a, b, dst = (np.full(n, 1.0, np.float32) for _ in range(3))
    raw_a, raw_d = a.view(np.uint8), dst.view(np.uint8)
    f32, sum_ = DTYPE_CODES["float32"], op_code("sum")

    def best(fn):
        fn()
        t_best, end = float("inf"), time.perf_counter() + budget_s / 2
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            fn()
            t_best = min(t_best, time.perf_counter() - t0)
        return t_best

    copy_s = best(lambda: _C._copy_to_peer(raw_d, raw_a, False))
    reduce_s = best(lambda: _C._reduce(dst, a, b, f32, sum_))
    return nbytes / copy_s, nbytes / reduce_s


def _per_call(comm, nbytes: int, iters: int) -> float:
    """Median seconds per back-to-back all_reduce of `nbytes` (batches of 10 calls)."""
    x = np.ones(nbytes // 4, np.float32)
    for _ in range(max(20, iters // 10)):
        comm.all_reduce(x)
    batch = 10
    per_call = []
    for _ in range(max(1, iters // batch)):
        t0 = time.perf_counter()
        for _ in range(batch):
            comm.all_reduce(x)
        per_call.append((time.perf_counter() - t0) / batch)
    return statistics.median(per_call)


def _comm_under(env: dict, rank: int, world: int, store: str):
    """A communicator created under `env` (knobs are read at creation; restored after)."""
    import ringcomm
    from ..core.config import environment
    with environment(env):
        return ringcomm.init(rank=rank, world_size=world, init_method="file://" + store, timeout=60)


def _handoff_rank(rank: int, world: int, store: str, pin_cpu, iters: int) -> dict:
    """Per-call median seconds of back-to-back all_reduces: 4 B and 4 KiB by LL; not pinned, also:
    64 B by LL and by the ring, LL at 4 and 64 KiB, and 64 KiB by the ring in one slot per chunk and
    in 256-byte slots."""
    if pin_cpu is not None:
        os.sched_setaffinity(0, {pin_cpu})
    out = {}
    # LL, whatever the caller's environment says: the size rule (the model never decides at 2
    # ranks here), LL up to 4 KiB.
    ll = {"RINGCOMM_ALGO": "auto", "RINGCOMM_MODEL_MIN_WORLD": str(1 << 30), "RINGCOMM_LL_MAX_BYTES": "4K"}
    comm = _comm_under(ll, rank, world, store)
    try:
        for nbytes in (4, 4096) if pin_cpu is not None else (4, 64, 4096):
            out[str(nbytes)] = _per_call(comm, nbytes, iters)
        comm.barrier()
    finally:
        comm.close()
    if pin_cpu is None:
        comm = _comm_under(dict(ll, RINGCOMM_LL_MAX_BYTES=str(LL_LARGE)), rank, world, store + "ll")
        try:
            for nbytes in (LL_SMALL, LL_LARGE):
                out[f"ll_{nbytes}"] = _per_call(comm, nbytes, max(500, iters // 4))
            comm.barrier()
        finally:
            comm.close()
        big = max(50, iters // 40)
        for slot, runs in (("256K", (("ring_64", 64, iters), ("ring_64K", 64 << 10, big))),
                           ("256", (("ring_64K_256B_slots", 64 << 10, big),))):
            comm = _comm_under({"RINGCOMM_ALGO": "ring", "RINGCOMM_SLOT_BYTES": slot}, rank, world, store + "ring" + slot)
            try:
                for key, nbytes, n in runs:
                    out[key] = _per_call(comm, nbytes, n)
                comm.barrier()
            finally:
                comm.close()
    return out


def _handoffs(pin_cpu, iters: int) -> dict:
    from ..core.launch import spawn
    d = tempfile.mkdtemp(prefix="ringcomm-tune-")
    try:
        res = spawn(_handoff_rank, 2, (os.path.join(d, "store"), pin_cpu, iters), timeout=120)
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)
    return {k: max(r[k] for r in res) for k in res[0]}


def measure(quick: bool = False) -> dict:
    """The profile's params measured on this machine, and what they came from."""
    from .. import _C
    t0 = time.time()
    cpus = sorted(os.sched_getaffinity(0))
    copy_Bps, reduce_Bps = _bandwidths(budget_s=0.4 if quick else 1.0)
    free = _handoffs(None, 2000 if quick else 20000)
    shared = _handoffs(cpus[0], 300 if quick else 3000)
    # At 2 ranks the ring's 64-byte all_reduce takes three hand-offs (each rank's 32-byte chunk a
    # message of its own), LL's one.
    alpha = max((free["ring_64"] - free["64"]) / 2, free["64"] / 20)
    # LL at 2 ranks: 2 M bytes through lines (own written, the peer's read) and M reduced. The
    # lines are credited with at least a tenth of the difference, so a reduce kernel measured
    # faster than it runs inside LL cannot make them look free.
    m = LL_LARGE - LL_SMALL
    diff = free[f"ll_{LL_LARGE}"] - free[f"ll_{LL_SMALL}"]
    line_s = max(diff - m / reduce_Bps, diff / 10)
    ll_Bps = 2 * m / line_s if line_s > 0 else copy_Bps / 2
    # The ring at 2 ranks sends 2 slots per chunk piece: 2 x 128 slots of 256 B against 2; each
    # waits for the peer's, a hand-off the model counts apart (alpha): slot_s is the rest.
    per_slot = (free["ring_64K_256B_slots"] - free["ring_64K"]) / (2 * 128 - 2)
    slot_s = max(per_slot - alpha, per_slot / 20, 1e-8)
    params = {"alpha_s": alpha, "alpha_shared_s": shared["4"], "slot_s": slot_s, "copy_Bps": copy_Bps,
              "reduce_Bps": reduce_Bps, "ll_Bps": ll_Bps, "cpus": float(len(cpus))}
    assert tuple(params) == tuple(_C.PROFILE_PARAMS)
    return {"params": params,
            "measured": {"allreduce_2ranks_s": free, "allreduce_2ranks_one_cpu_s": shared,
                         "buffer_bytes": 4 << 20, "seconds": round(time.time() - t0, 1)}}


def write_profile(path: str, params: dict, measured: dict | None = None) -> dict:
    """Write the profile JSON (format, version, params, hash) to `path`; returns the document."""
    from .. import _C
    prof = _C._profile(params)
    doc = {"format": "ringcomm-profile", "version": int(_C.PROFILE_VERSION), "params": prof["params"],
           "hash": prof["hash"],
           "machine": {"node": platform.node(), "processor": cpu_model(), "python": platform.python_version()},
           "written": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "measured": measured or {}}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    _C._load_profile(path)  # the core reads it back (format, version, hash)
    return doc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ringcomm.apps.tune", description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", default=DEFAULT_OUTPUT, help=f"profile file to write (default {DEFAULT_OUTPUT})")
    p.add_argument("--quick", action="store_true", help="fewer iterations (a few seconds; noisier)")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    got = measure(quick=a.quick)
    doc = write_profile(a.output, got["params"], got["measured"])
    pr = doc["params"]
    print(f"alpha {pr['alpha_s'] * 1e6:.2f} us, alpha on a shared CPU {pr['alpha_shared_s'] * 1e6:.2f} us, "
          f"slot {pr['slot_s'] * 1e6:.3f} us, "
          f"copy {pr['copy_Bps'] / 1e9:.2f} GB/s, reduce {pr['reduce_Bps'] / 1e9:.2f} GB/s, "
          f"LL {pr['ll_Bps'] / 1e9:.2f} GB/s, cpus {pr['cpus']:g} ({got['measured']['seconds']} s)")
    print(f"wrote {a.output} (hash {doc['hash']}); use it on every rank: "
          f"export RINGCOMM_PROFILE={os.path.abspath(a.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
