"""CUDA graphs, a late rank and a killed rank on the device ring (device_check.sh's graph stage).

Three scenarios, each in fresh processes (``ringcomm.init``; torch CUDA tensors take the CUDA path,
the device ring under RINGCOMM_CUDA_P2P=device):

  graph  2 ranks: an eager all_reduce, then one all_reduce captured in a torch.cuda.CUDAGraph and
         replayed --replays times, each replay with new inputs (rank + 1 + i, so every replay's sum
         is known: n(n+1)/2 + n i); every result is checked on the device (a mismatch counter, read
         once at the end), then eager calls after the replays agree with them.
  late   2 ranks: rank 1 calls all_reduce --late-ms (200) after rank 0; the call completes on both
         with the right sum.
  kill   2 ranks: rank 0 starts an all_reduce that waits on rank 1, which is then killed (SIGKILL)
         mid-wait; rank 0's error (a ringcomm error: PeerFailureError or TimeoutError) must arrive
         within the communicator's timeout (--timeout), after which its stream synchronizes
         (checked with a bound) and a new allocation and a kernel on it work.

--device cpu runs the same scenarios on CPU tensors (the host ring; a "replay" is an eager call):
the program's own check where there is no GPU.

    python benchmarks/device/graph_check.py [--scenario graph|late|kill|all] [--replays 1000]
        [--timeout 5] [--json out.json] [--device cuda|cpu]

One line per scenario (``graph: ok ...`` or ``graph: FAILED ...``); exit status 1 when one failed.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_common import rank_device, sync  # noqa: E402

SCENARIOS = ("graph", "late", "kill")


def _init(a: dict, rank: int, world: int, name: str):
    import ringcomm
    return ringcomm.init(rank=rank, world_size=world, init_method=f"file://{a['dir']}/{name}",
                         timeout=a["timeout"])


def graph_rank(rank: int, world: int, a: dict) -> dict:
    import torch
    dev = rank_device(torch, a["device"], rank)
    comm = _init(a, rank, world, "graph")
    n = a["count"]
    try:
        x = torch.full((n,), float(rank + 1), device=dev)
        comm.all_reduce(x)
        sync(torch, dev)
        eager_ok = bool((x == world * (world + 1) / 2).all())
        bad = torch.zeros((), dtype=torch.int64, device=dev)
        if dev.type == "cuda":
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):   # a warm-up on the capture stream, as torch recommends
                x.fill_(1.0)
                comm.all_reduce(x)
            torch.cuda.current_stream(dev).wait_stream(side)
            sync(torch, dev)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                comm.all_reduce(x)

            def step():
                g.replay()
        else:
            def step():
                comm.all_reduce(x)
        t0 = time.perf_counter()
        for i in range(a["replays"]):
            x.fill_(float(rank + 1 + i))     # new inputs into the captured buffer
            step()
            bad += (x != world * (world + 1) / 2 + world * i).sum()
        sync(torch, dev)
        replay_s = time.perf_counter() - t0
        mismatches = int(bad.item())
        x.fill_(float(rank + 1))
        comm.all_reduce(x)                   # eager again, after the replays
        sync(torch, dev)
        after_ok = bool((x == world * (world + 1) / 2).all())
    finally:
        comm.close()
    return dict(eager_ok=eager_ok, mismatches=mismatches, after_ok=after_ok, replays=a["replays"],
                replay_us=replay_s / max(1, a["replays"]) * 1e6, captured=dev.type == "cuda")


def late_rank(rank: int, world: int, a: dict) -> dict:
    import torch
    dev = rank_device(torch, a["device"], rank)
    comm = _init(a, rank, world, "late")
    try:
        x = torch.full((a["count"],), float(rank + 1), device=dev)
        comm.barrier()
        if rank == 1:
            time.sleep(a["late_ms"] / 1e3)
        t0 = time.perf_counter()
        comm.all_reduce(x)
        sync(torch, dev)
        took = time.perf_counter() - t0
        ok = bool((x == world * (world + 1) / 2).all())
    finally:
        comm.close()
    return dict(ok=ok, call_s=took)


def _bounded(fn, limit: float):
    """(finished within limit, fn's exception or None); fn runs on a daemon thread."""
    box: dict = {}

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported, not hidden
            box["exc"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    return not t.is_alive(), box.get("exc")


def kill_rank(rank: int, world: int, a: dict):
    import torch

    import ringcomm
    dev = rank_device(torch, a["device"], rank)
    comm = _init(a, rank, world, "kill")
    waiting = os.path.join(a["dir"], "rank0_waiting")
    x = torch.full((a["count"],), float(rank + 1), device=dev)
    comm.all_reduce(x)                       # both ranks are up and connected
    sync(torch, dev)
    if rank == 1:
        deadline = time.monotonic() + 30
        while not os.path.exists(waiting) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(a["kill_after_ms"] / 1e3)  # rank 0 is now inside its wait
        os.kill(os.getpid(), signal.SIGKILL)
    err = None
    # Rank 1 dies --kill-after-ms after this file appears: by then rank 0 is inside the call (the
    # device ring's kernel spinning on rank 1's flags; a host-ordered call, in its host wait).
    with open(waiting, "w"):
        pass
    t0 = time.perf_counter()
    try:
        w = comm.all_reduce(x, async_op=True)
        w.wait()
    except ringcomm.RingcommError as e:
        err = e
    took = time.perf_counter() - t0
    synced, sync_exc = _bounded(lambda: sync(torch, dev), a["timeout"])
    alloc_ok = False
    if synced:
        def alloc():
            y = torch.ones(1 << 20, device=dev)
            assert int(y.sum().item()) == 1 << 20
        alloc_ok, alloc_exc = _bounded(alloc, a["timeout"])
        alloc_ok = alloc_ok and alloc_exc is None
    try:
        comm.close()
    except ringcomm.RingcommError:
        pass
    return dict(error=type(err).__name__ if err else None, message=str(err)[:300] if err else "",
                error_s=took, within_deadline=err is not None and took <= a["timeout"],
                stream_synced=synced and sync_exc is None, alloc_ok=alloc_ok)


def run_scenario(name: str, a: dict) -> dict:
    from ringcomm.core.launch import spawn
    env = {"RINGCOMM_TIMEOUT": str(a["timeout"])}
    with tempfile.TemporaryDirectory(prefix=f"rc-graph-check-{name}-") as d:
        a = dict(a, dir=d)
        t0 = time.perf_counter()
        if name == "graph":
            res = spawn(graph_rank, 2, (a,), timeout=a["launch_timeout"], env=env)
            ok = all(r["eager_ok"] and r["after_ok"] and r["mismatches"] == 0 for r in res)
            line = (f"{res[0]['replays']} {'replays of a captured call' if res[0]['captured'] else 'eager calls'} "
                    f"with new inputs, {sum(r['mismatches'] for r in res)} wrong elements, "
                    f"{res[0]['replay_us']:.1f} us each; eager before and after: "
                    f"{'right' if all(r['eager_ok'] and r['after_ok'] for r in res) else 'WRONG'}")
        elif name == "late":
            res = spawn(late_rank, 2, (a,), timeout=a["launch_timeout"], env=env)
            ok = all(r["ok"] for r in res)
            line = (f"rank 1 {a['late_ms']} ms late: sums {'right' if ok else 'WRONG'}, rank 0's call "
                    f"{res[0]['call_s'] * 1e3:.0f} ms")
        else:
            res = spawn(kill_rank, 2, (a,), timeout=a["launch_timeout"], env=env, may_die=(1,))
            r0 = res[0]
            ok = res[1] is None and r0["within_deadline"] and r0["stream_synced"] and r0["alloc_ok"]
            line = (f"rank 1 killed mid-wait: rank 0 raised {r0['error']} after {r0['error_s']:.2f} s "
                    f"(deadline {a['timeout']} s), stream {'synchronized' if r0['stream_synced'] else 'DID NOT sync'}, "
                    f"new allocation {'works' if r0['alloc_ok'] else 'FAILED'}"
                    + ("" if res[1] is None else "; rank 1 was not killed"))
    return dict(scenario=name, ok=ok, line=line, seconds=time.perf_counter() - t0, ranks=res)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=SCENARIOS + ("all",), default="all")
    p.add_argument("--replays", type=int, default=1000, help="graph replays (default 1000)")
    p.add_argument("--count", type=int, default=1 << 16, help="float32 elements per call (default 65536)")
    p.add_argument("--late-ms", type=float, default=200, help="how late rank 1 calls (default 200 ms)")
    p.add_argument("--kill-after-ms", type=float, default=100,
                   help="how long rank 1 waits after rank 0 entered its wait before it is killed (default 100)")
    p.add_argument("--timeout", type=float, default=5, help="the communicator's timeout: the kill deadline (s)")
    p.add_argument("--launch-timeout", type=float, default=120, help="one scenario's limit (s, default 120)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--json", default="", help="write the results here")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("graph_check: torch has no CUDA device (--device cpu runs the scenarios on CPU tensors)")
            return 2
    a = dict(device=args.device, replays=args.replays, count=args.count, late_ms=args.late_ms,
             kill_after_ms=args.kill_after_ms, timeout=args.timeout, launch_timeout=args.launch_timeout)
    names = SCENARIOS if args.scenario == "all" else (args.scenario,)
    out, status = [], 0
    print(f"# {args.device}, RINGCOMM_CUDA_P2P={os.environ.get('RINGCOMM_CUDA_P2P', '(default)')}", flush=True)
    for name in names:
        try:
            r = run_scenario(name, a)
        except Exception as e:  # noqa: BLE001 - a scenario that raised is a failed scenario, the next still runs
            r = dict(scenario=name, ok=False, line=f"raised {type(e).__name__}: {str(e)[:500]}", seconds=0.0)
        out.append(r)
        print(f"{name}: {'ok' if r['ok'] else 'FAILED'} ({r['seconds']:.1f} s): {r['line']}", flush=True)
        status |= 0 if r["ok"] else 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return status


if __name__ == "__main__":
    sys.exit(main())
