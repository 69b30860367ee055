"""Soak test: 2-4 local ranks issue random collectives for a given time; every result is checked
exactly against numpy.

    python tests/soak.py --minutes M --world N [--seed S] [--json out.json]
    python tests/soak.py --world N --seed S --replay EPOCH:INDEX     # rerun one call

What runs:
- Ranks are spawned processes that stay alive for the whole run; each "epoch" (30-60 s, drawn
  from the seed) they close their communicator and create a new one (`ringcomm.init(...,
  init_method="file://...")`) after setting random RINGCOMM_SLOT_BYTES / NSLOTS / ALGO / STREAM
  values in their environment. Every rank derives the epoch's knobs and every call from the seed,
  so the ranks agree on what to call without talking.
- Call `i` is a function of (seed, i, world, the epoch's size cap) only: one collective (every kind,
  sync or async, numpy arrays or torch tensors), or a batch of async ones waited in random order.
  Inputs are functions of (seed, i, position in batch, rank), so every rank computes the numpy
  reference of the whole collective locally.
- Exactness: integers use their full range (wrap-around arithmetic is order-free). Floating
  reductions use small integer values (order-free and exact); AVG is the exact sum times the
  dtype's 1/n, rounded once, at the last combination. all_reduce SUM of float16/32/64 also runs on
  values where the order shows, against the documented combination order (docs/api.md,
  "Reproducible results"; tests/order_ref.py). Copies (broadcast, gathers, all_to_all,
  send/recv) carry random bit patterns. Inputs of out-of-place calls and non-root buffers must
  stay unchanged.
- Every rank exchanges a control word (all_reduce MAX) every few calls: rank 0's clock decides when
  an epoch or the run ends, and any rank's error count stops everyone.
- Reports every minute and at the end: calls per kind, bytes (the sum of every rank's input
  buffers), errors, max RSS per rank, peak /dev/shm use; at the end, that no ringcomm segment and
  no child process is left. Exits 1 on any error, printing the first failing call with its
  seed/epoch/index and a replay command.
Tiny slots make every hand-off cost a wake-up, so an epoch caps call sizes at 2048 slots (8 MiB
once slots are 4 KiB or larger).
"""
from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import multiprocessing as mp
import os
import platform
import queue as queue_mod
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

# Run as a script: its folder, tests/, is on sys.path.
import ranks
from soak_calls import KINDS, describe, draw_call, epoch_knobs, epoch_seconds, make_lib_of, run_call, size_cap

CTL_EVERY = 8                # calls between control words
REPORT_EVERY_S = 5.0         # ranks send their counters at most this often


def rss_now_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def rank_main(rank, world, cfg, q):
    """One soak rank (spawned). Sends ('stats', rank, dict), ('fail', rank, dict) and
    ('exc', rank, dict) messages to the parent."""
    faulthandler.register(signal.SIGUSR1, file=open(os.path.join(cfg["tmp"], f"rank{rank}.stack"), "w"),
                          all_threads=True)
    epoch, idx = 0, 0
    try:
        import ringcomm
        lib_of = make_lib_of(cfg["torch"])
        seed = cfg["seed"]
        stats = {"calls": {}, "bytes": 0, "errors": 0, "epochs": 0, "first_rss_kib": None, "ordered": 0,
                 "corrupted": False}
        inject = cfg["inject"]
        last_report = 0.0
        replay = cfg["replay"]
        epoch = replay[0] if replay else 0
        idx = replay[1] if replay else 0
        stop = False
        failure = None
        while not stop:
            knobs = epoch_knobs(seed, epoch)
            os.environ.update(knobs)
            cap = size_cap(knobs)
            length = epoch_seconds(seed, epoch, *cfg["epoch_s"])
            comm = ringcomm.init(rank=rank, world_size=world, init_method=f"file://{cfg['tmp']}/store{epoch}",
                                 timeout=cfg["timeout"], prefix=f"soak/{epoch}")
            stats["epochs"] += 1
            t_epoch = time.time()
            try:
                while True:
                    call = draw_call(seed, idx, world, cap, cfg["torch"])
                    corrupt = inject is not None and idx >= inject and rank == world - 1
                    bad = run_call(comm, seed, idx, call, rank, world, lib_of, stats,
                                   corrupt=corrupt and not stats["corrupted"])
                    if bad is not None:
                        stats["errors"] += 1
                        if failure is None:
                            failure = {"seed": seed, "epoch": epoch, "index": idx, "knobs": knobs,
                                       "what": bad, "call": describe(call)}
                            q.put(("fail", rank, failure))
                    idx += 1
                    if replay:
                        stop = True
                        break
                    if idx % CTL_EVERY:
                        continue
                    now = time.time()
                    flag = 0
                    if rank == 0:
                        flag = 2 if now >= cfg["end"] else (1 if now >= t_epoch + length else 0)
                    ctl = np.array([flag, stats["errors"]], np.int64)
                    comm.all_reduce(ctl, op=ringcomm.ReduceOp.MAX)
                    if now - last_report >= REPORT_EVERY_S or ctl[0] or ctl[1]:
                        last_report = now
                        if stats["first_rss_kib"] is None:
                            stats["first_rss_kib"] = rss_now_kib()
                        stats.update(maxrss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                     rss_kib=rss_now_kib(), epoch=epoch, index=idx, knobs=knobs)
                        q.put(("stats", rank, dict(stats)))
                    if ctl[1] or ctl[0] == 2:
                        stop = True
                    if ctl[0] or ctl[1]:
                        break
            finally:
                comm.close()
            epoch += 1
        stats.update(maxrss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rss_kib=rss_now_kib(),
                     epoch=epoch - 1, index=idx, done=True)
        if stats["first_rss_kib"] is None:
            stats["first_rss_kib"] = stats["rss_kib"]
        q.put(("stats", rank, dict(stats)))
    except BaseException:  # noqa: BLE001 - every failure goes to the parent
        q.put(("exc", rank, {"seed": cfg["seed"], "epoch": epoch, "index": idx,
                             "knobs": epoch_knobs(cfg["seed"], epoch), "traceback": traceback.format_exc()}))
        sys.exit(1)


# ---- the parent -----------------------------------------------------------------------------------
def ringcomm_segments():
    out = {}
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return out
    for n in names:
        if n.startswith("ringcomm-"):
            try:
                out[n] = os.stat(os.path.join("/dev/shm", n)).st_size
            except OSError:
                pass
    return out


class ShmSampler(threading.Thread):
    """Peak of /dev/shm's used bytes and of the ringcomm segments' total size, sampled."""

    def __init__(self, period=0.1):
        super().__init__(daemon=True)
        self.period = period
        self.base_used = shutil.disk_usage("/dev/shm").used
        self.peak_used = self.base_used
        self.peak_segments = 0
        self.peak_segment_count = 0
        self._halt = threading.Event()

    def run(self):
        while not self._halt.wait(self.period):
            self.sample()

    def sample(self):
        self.peak_used = max(self.peak_used, shutil.disk_usage("/dev/shm").used)
        segs = ringcomm_segments()
        self.peak_segments = max(self.peak_segments, sum(segs.values()))
        self.peak_segment_count = max(self.peak_segment_count, len(segs))

    def stop(self):
        self._halt.set()
        self.join()


def child_pids(pid):
    """Live child processes of pid, except multiprocessing's resource tracker (it serves the
    whole interpreter, exits with it, and is no rank)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) != pid or fields[0] == "Z":
                    continue
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmdline = f.read()
                if b"resource_tracker" not in cmdline:
                    out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def mib(b):
    return b / (1 << 20)


def summary_lines(per_rank, world, elapsed, sampler):
    s0 = per_rank.get(0, {})
    calls = s0.get("calls", {})
    total = sum(calls.values())
    lines = [f"[{elapsed / 60:6.2f} min] collectives {total} ({', '.join(f'{k} {calls[k]}' for k in KINDS if k in calls)}); "
             f"bytes {s0.get('bytes', 0) / 1e9:.3f} GB; errors {sum(s.get('errors', 0) for s in per_rank.values())}; "
             f"epoch {s0.get('epoch', 0)} call {s0.get('index', 0)}; order-checked float sums {s0.get('ordered', 0)}"]
    rss = ", ".join(f"r{r} {per_rank[r].get('maxrss_kib', 0) / 1024:.0f} MiB (now {per_rank[r].get('rss_kib', 0) / 1024:.0f})"
                    for r in sorted(per_rank))
    lines.append(f"             max RSS per rank: {rss}; /dev/shm peak used {mib(sampler.peak_used):.1f} MiB "
                 f"(before {mib(sampler.base_used):.1f}), ringcomm segments peak {mib(sampler.peak_segments):.1f} MiB "
                 f"in {sampler.peak_segment_count}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--epoch-seconds", default="30,60", help="lo,hi: epoch length range (s)")
    ap.add_argument("--timeout", type=float, default=120.0, help="communicator timeout (s)")
    ap.add_argument("--hang-seconds", type=float, default=600.0,
                    help="no report from a rank for this long: dump stacks and fail")
    ap.add_argument("--no-torch", action="store_true", help="numpy arrays only (no bfloat16)")
    ap.add_argument("--replay", default=None, help="EPOCH:INDEX: run that one call under that epoch's knobs")
    ap.add_argument("--report-every", type=float, default=60.0)
    ap.add_argument("--inject-error", type=int, default=None, metavar="INDEX",
                    help="test of the checker: corrupt the last rank's first non-empty result from call INDEX on")
    return ap


def main(argv=None):
    ap = build_parser()
    a = ap.parse_args(argv)
    if not 2 <= a.world <= 4:
        ap.error("--world must be 2..4")
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    use_torch = False
    if not a.no_torch:
        try:
            import torch  # noqa: F401
            use_torch = True
        except ImportError:
            pass
    replay = tuple(int(v) for v in a.replay.split(":")) if a.replay else None
    lo, hi = (float(v) for v in a.epoch_seconds.split(","))
    tmp = tempfile.mkdtemp(prefix="ringcomm-soak-")
    start_wall = time.time()
    cfg = {"seed": seed, "torch": use_torch, "end": start_wall + a.minutes * 60, "epoch_s": (lo, hi),
           "timeout": a.timeout, "tmp": tmp, "replay": replay, "inject": a.inject_error}
    cmd = "python " + " ".join([os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:]))
    print(f"# ringcomm soak  {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC  "
          f"{platform.node()}  {os.cpu_count()} cores  load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"# command: {cmd}\n# seed {seed}, world {a.world}, torch tensors/bfloat16: {use_torch}", flush=True)
    segs_before = set(ringcomm_segments())
    sampler = ShmSampler()
    sampler.start()
    load_before = os.getloadavg()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, a.world, cfg, q), daemon=True) for r in range(a.world)]
    for p in procs:
        p.start()
    per_rank, failures, excs = {}, [], []
    done = set()
    last_msg = time.monotonic()
    last_print = time.monotonic()
    hang = None
    t0 = time.monotonic()
    try:
        while len(done) < a.world:
            try:
                kind, r, payload = q.get(timeout=0.5)
                last_msg = time.monotonic()
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in done]
                if dead and not excs:
                    time.sleep(1.0)
                    if q.empty():
                        excs.append((dead[0], {"traceback": f"rank {dead[0]} exited with code "
                                               f"{procs[dead[0]].exitcode} without a report"}))
                if excs and all(p.exitcode is not None for p in procs) and q.empty():
                    break
                if time.monotonic() - last_msg > a.hang_seconds:
                    for p in procs:
                        if p.is_alive():
                            os.kill(p.pid, signal.SIGUSR1)
                    time.sleep(1.0)
                    hang = "\n".join(open(os.path.join(tmp, f"rank{r}.stack")).read() for r in range(a.world))
                    break
                continue
            if kind == "stats":
                per_rank[r] = payload
                if payload.get("done"):
                    done.add(r)
            elif kind == "fail":
                failures.append((r, payload))
            elif kind == "exc":
                excs.append((r, payload))
                done.add(r)
            if time.monotonic() - last_print >= a.report_every and per_rank:
                last_print = time.monotonic()
                sampler.sample()
                print("\n".join(summary_lines(per_rank, a.world, time.monotonic() - t0, sampler)), flush=True)
    finally:
        from ringcomm.core.launch import reap
        reap(procs, grace=30.0 if not (excs or hang) else 5.0)
        q.close()
        sampler.sample()
        sampler.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - t0
    leaked = ranks.lasting(set(ringcomm_segments()) - segs_before)
    children = sorted(set(child_pids(os.getpid())) | {p.pid for p in mp.active_children()})
    errors = sum(s.get("errors", 0) for s in per_rank.values())
    print("# final", flush=True)
    print("\n".join(summary_lines(per_rank, a.world, elapsed, sampler)))
    print(f"# load average before/after {load_before[0]:.2f} / {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores); "
          f"segments left {sorted(leaked) or 'none'}; child processes left {children or 'none'}")
    n_epochs = per_rank.get(0, {}).get("epochs", 0)
    first_epoch = replay[0] if replay else 0
    knob_sets = [epoch_knobs(seed, e) for e in range(first_epoch, first_epoch + n_epochs)]
    print("# epochs (RINGCOMM_SLOT_BYTES x NSLOTS, ALGO, STREAM): " + "; ".join(
        f"{k['RINGCOMM_SLOT_BYTES']} x {k['RINGCOMM_NSLOTS']} {k['RINGCOMM_ALGO']} {k['RINGCOMM_STREAM']}"
        for k in knob_sets))
    ok = not (errors or failures or excs or hang or leaked or children) and len(per_rank) == a.world
    replay_cmd = None
    if failures:
        r, f = failures[0]
        replay_cmd = f"python {os.path.relpath(__file__)} --world {a.world} --seed {f['seed']} --replay {f['epoch']}:{f['index']}" \
                     + (" --no-torch" if not use_torch else "")
        print(f"# FIRST FAILURE (rank {r}): seed {f['seed']} epoch {f['epoch']} call {f['index']} knobs {f['knobs']}\n"
              f"#   {f['what']}\n#   {f['call']}\n#   replay: {replay_cmd}")
    if excs:
        r, e = excs[0]
        if "index" in e:
            replay_cmd = replay_cmd or (f"python {os.path.relpath(__file__)} --world {a.world} --seed {e['seed']} "
                                        f"--replay {e['epoch']}:{e['index']}" + (" --no-torch" if not use_torch else ""))
            print(f"# EXCEPTION (rank {r}) at seed {e['seed']} epoch {e['epoch']} call {e['index']} knobs {e['knobs']}; "
                  f"replay: {replay_cmd}")
        print(e["traceback"])
        for r2, e2 in excs[1:]:
            print(f"# rank {r2} also failed:\n{e2['traceback']}")
    if hang:
        print(f"# HANG: no report for {a.hang_seconds:.0f} s; stacks:\n{hang}")
    print(f"# result: {'PASS' if ok else 'FAIL'}", flush=True)
    if a.json:
        s0 = per_rank.get(0, {})
        out = {"date_utc": datetime.datetime.fromtimestamp(start_wall, datetime.timezone.utc).isoformat(),
               "command": cmd, "host": platform.node(), "cores": os.cpu_count(), "seed": seed, "world": a.world,
               "torch": use_torch, "minutes": elapsed / 60, "load_before": load_before[0],
               "load_after": os.getloadavg()[0], "epochs": s0.get("epochs", 0), "epoch_knobs": knob_sets,
               "calls": s0.get("calls", {}),
               "collectives": sum(s0.get("calls", {}).values()), "ordered_sums": s0.get("ordered", 0), "bytes": s0.get("bytes", 0), "errors": errors,
               "maxrss_mib": {str(r): per_rank[r].get("maxrss_kib", 0) / 1024 for r in sorted(per_rank)},
               "rss_first_mib": {str(r): (per_rank[r].get("first_rss_kib") or 0) / 1024 for r in sorted(per_rank)},
               "rss_last_mib": {str(r): per_rank[r].get("rss_kib", 0) / 1024 for r in sorted(per_rank)},
               "shm_used_before_mib": mib(sampler.base_used), "shm_used_peak_mib": mib(sampler.peak_used),
               "shm_segments_peak_mib": mib(sampler.peak_segments), "segments_left": sorted(leaked),
               "children_left": children, "failures": [f for _, f in failures],
               "exceptions": [e for _, e in excs], "hang": hang is not None, "replay": replay_cmd, "ok": ok}
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
