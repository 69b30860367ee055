"""``python -m ringcomm.bench`` / ``ringcomm-bench``: nccl-tests-style sweeps of ringcomm's
collectives beside torch.distributed gloo, MPI (mpi4py) and NCCL in one run.

Phases, one after the other so none disturbs another's timing:
  1. memcpy ceiling, in this process (``memcpy.py``);
  2. N spawned ranks (``ringcomm.core.launch.spawn``), each running ringcomm and the torch peers
     (gloo, NCCL) side by side, size by size (``harness.rank_sweep``);
  3. the peers that run in processes of their own, one phase each (``phases.py``): MPI
     (``mpiexec -n N`` ranks running the same sweep with mpi4py, ``_mpi_worker``), Intel MPI and
     oneCCL (compiled drivers, ``drivers/``); with ``--tune``, first a probe phase per waiting
     setting of each.
Phases 2 and 3 (after the tuning) are launched ``--rounds`` times, the order reversed every other
round, each launch between two readings of the cross-CPU probe (``launches.py``).
The ranks return their per-call times; this process takes the max over ranks per call, prints
one table per collective (each library's count of timed calls, min / median / p90 / p99 µs,
algbw, busbw, a peer's speedup) and the summary, and writes the JSON and the plot.
Exit status: 0, or 1 if any correctness check failed, 3 if the ranks could not run.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import itertools
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from ..core.launch import LaunchError, spawn
from ..core.machine import cpu_model
from . import report
from .harness import merge_ranks, parse_arrival, rank_sweep
from .hostload import cpu_busy, loadavg
from .load import BusyLoad
from .memcpy import measure_memcpy
from .peers import find_mpiexec, probe
from .launches import Launches, order, pair_cpus
from .phases import NATIVE, PHASE_PEERS, PhaseRunner, choose_waiting, prepare
from .spec import OPS, REDOP_ALIASES, REDOPS, parse_dtype, parse_size, size_sweep
from .trace_table import main_trace

# Every cell times at least MIN_CALLS calls and at least `budget` seconds of calls, whichever is
# more, so that one descheduled stretch moves a cell's p90 or p99, not its median.
MIN_CALLS = 20
MAX_CALLS = 200_000
QUICK = {"minbytes": "1K", "maxbytes": "64M", "warmup_iters": 2, "iters": MAX_CALLS,
         "budget": 0.05, "min_iters": MIN_CALLS}
FULL = {"minbytes": "8", "maxbytes": "256M", "warmup_iters": 5, "iters": MAX_CALLS,
        "budget": 0.25, "min_iters": MIN_CALLS}
DEFAULT_PEERS = "gloo,mpi,nccl"
# --nodes K: each rank gets RINGCOMM_NODE_ID = its fake node (ringcomm.hier.fake_nodes_env)
# before any library is created, so ringcomm goes hierarchical while gloo/MPI stay flat over the
# same processes.
NODES_SUPPORTED = True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ringcomm.bench",
        description="nccl-tests-style benchmark of ringcomm's collectives beside gloo, MPI and "
                    "NCCL, in one run on local processes.",
        epilog="Example: python -m ringcomm.bench --quick --json bench.json --plot bench.png")
    p.add_argument("-np", "--world-size", type=int, default=2, metavar="N",
                   help="local processes (default 2)")
    p.add_argument("--ops", default=",".join(OPS),
                   help=f"collectives, comma-separated, or 'all' (default: all = {','.join(OPS)})")
    p.add_argument("-d", "--dtype", default="float32",
                   help="dtypes, comma-separated, or 'all' (float32, float64, float16, bfloat16, "
                        "int8, uint8, int32, int64; default float32)")
    p.add_argument("-o", "--op", default="sum",
                   help="reduce ops for the reducing collectives, comma-separated, or 'all' "
                        "(sum, prod, min, max, avg; default sum)")
    p.add_argument("-b", "--minbytes", default=None, help="smallest size (default 8, --quick 1K)")
    p.add_argument("-e", "--maxbytes", default=None,
                   help="largest size (default 256M, --quick 64M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size factor (default 4)")
    p.add_argument("-w", "--warmup_iters", type=int, default=None,
                   help="at most this many warm-up calls per measurement (default 5, --quick 2)")
    p.add_argument("-n", "--iters", type=int, default=None,
                   help=f"at most this many timed calls per measurement (default {MAX_CALLS}; "
                        f"below --min-iters it lowers that too)")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="at least this many seconds of timed calls per measurement (default "
                        "0.25, --quick 0.05)")
    p.add_argument("--min-iters", type=int, default=None, metavar="N",
                   help=f"at least this many timed calls per measurement, whatever the time "
                        f"budget (default {MIN_CALLS}; capped by -n)")
    p.add_argument("--quick", action="store_true",
                   help="1 KiB to 64 MiB, 0.05 s of timed calls per measurement: the whole run "
                        "in about a minute on 2 ranks")
    p.add_argument("--peers", default=DEFAULT_PEERS,
                   help="peers to measure beside ringcomm where available: any of "
                        "gloo,mpi,nccl,deepspeed (DeepSpeed's shm all_reduce),oneccl,impi "
                        "(oneCCL, Intel MPI: pip install 'ringcomm[peers]'), or 'none' "
                        f"(default {DEFAULT_PEERS})")
    p.add_argument("--tune", action="store_true",
                   help="tune the waiting of the peers that run in processes of their own (mpi, "
                        "impi, oneccl): probe each setting of their grid, run each with its best; "
                        "every setting tried is kept in the JSON (default: the libraries' "
                        "default waiting)")
    p.add_argument("--arrival", default="b2b", metavar="b2b|apart[:US]|skew:US",
                   help="how calls arrive: b2b (back to back, default); apart[:US]: a gloo barrier "
                        "(same processes) and US us of compute before every call, only the call "
                        "timed; skew:US: likewise, rank r computing r*US us (arrives r*US us late)")
    p.add_argument("--trace", action="store_true",
                   help="instead of the sweep: the per-phase table (RINGCOMM_TRACE) of 1 KiB and "
                        "64 KiB (or, with -b/-e, those sizes) all_reduce and broadcast, back to "
                        "back and apart (-np ranks)")
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="run N busy processes (pure compute, not pinned, normal priority) beside "
                        "the ranks during the timed phases; reaped afterwards (default 0)")
    p.add_argument("--bind", default=None, choices=("core", "numa", "none"),
                   help="pin each rank at ringcomm's init (RINGCOMM_BIND; default: as the "
                        "environment says, none when unset): core (a contiguous share of the CPUs), "
                        "numa (a NUMA node's CPUs) or none; the peers run in the same, pinned, "
                        "processes (MPI's, Intel MPI's and oneCCL's ranks run in processes of their own "
                        "and stay unpinned)")
    p.add_argument("--rounds", type=int, default=1, metavar="R",
                   help="start every library's ranks R times, the order reversed every other "
                        "round; each figure of a cell is the median over the rounds of that "
                        "figure. Every launch is listed with a cross-CPU probe taken before and "
                        "after it, which shows launches that ran while the CPUs' hand-offs were "
                        "slow (default 1)")
    p.add_argument("--no-inplace", dest="inplace", action="store_false",
                   help="skip ringcomm's in-place variants (broadcast keeps its only, in-place, form)")
    p.add_argument("--json", metavar="PATH", help="write every figure to PATH")
    p.add_argument("--plot", metavar="PATH.png", help="draw busbw vs size (log-log) to PATH.png")
    p.add_argument("--nodes", type=int, default=1, metavar="K",
                   help="fake K nodes on this machine (RINGCOMM_NODE_ID per rank; ringcomm "
                        "hierarchical, peers flat). Default 1")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds for each phase before its ranks are killed (default 1800)")
    p.add_argument("--op-timeout", type=float, default=120.0,
                   help="ringcomm/gloo per-operation timeout in seconds (default 120)")
    # Test hook: corrupt one checked element of LIB's results, so tests can show the check fails.
    p.add_argument("--inject-wrong", default="", help=argparse.SUPPRESS)
    return p


def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def resolve(args) -> dict:
    """Validated run configuration (JSON-serialisable: it travels to every rank)."""
    if args.world_size < 1:
        raise ValueError(f"-np must be >= 1, got {args.world_size}")
    if args.load < 0:
        raise ValueError(f"--load must be >= 0, got {args.load}")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    if args.nodes < 1 or args.nodes > args.world_size:
        raise ValueError(f"--nodes must be in 1..{args.world_size}, got {args.nodes}")
    if args.nodes > 1 and not NODES_SUPPORTED:
        raise ValueError("--nodes K > 1 needs ringcomm's hierarchical collectives, which "
                         "this build does not have yet")
    base = QUICK if args.quick else FULL
    ops = list(OPS) if args.ops == "all" else _split(args.ops)
    for op in ops:
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}; choose from {', '.join(OPS)}")
    dtypes = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"] \
        if args.dtype == "all" else [parse_dtype(d).name for d in _split(args.dtype)]
    redops = list(REDOPS) if args.op == "all" else \
        [REDOP_ALIASES.get(o.lower(), o.lower()) for o in _split(args.op)]
    for o in redops:
        if o not in REDOPS:
            raise ValueError(f"unknown reduce op {o!r}; choose from {', '.join(REDOPS)}")
    peers = [] if args.peers.strip().lower() == "none" else _split(args.peers.lower())
    for peer in peers:
        if peer not in ("gloo", "mpi", "nccl", "deepspeed", "oneccl", "impi"):
            raise ValueError(f"unknown peer {peer!r}; choose from gloo, mpi, nccl, deepspeed, "
                             f"oneccl, impi, none")
    arrival, arrival_us = parse_arrival(args.arrival)
    sizes = size_sweep(parse_size(args.minbytes or base["minbytes"]),
                       parse_size(args.maxbytes or base["maxbytes"]), args.stepfactor)
    policy = {"warmup": base["warmup_iters"] if args.warmup_iters is None else args.warmup_iters,
              "iters": base["iters"] if args.iters is None else args.iters,
              "budget": base["budget"] if args.time_budget is None else args.time_budget,
              "min_iters": base["min_iters"] if args.min_iters is None else args.min_iters,
              "inject_wrong": args.inject_wrong,
              "arrival": arrival, "arrival_us": arrival_us}
    if policy["iters"] < 1 or policy["warmup"] < 0 or policy["min_iters"] < 1:
        raise ValueError("-n and --min-iters must be >= 1 and -w >= 0")
    return {"world_size": args.world_size, "ops": ops, "dtypes": dtypes, "redops": redops,
            "sizes": sizes, "policy": policy, "peers": peers, "inplace": args.inplace,
            "nodes": args.nodes, "load": args.load, "op_timeout": args.op_timeout, "bind": args.bind,
            "timeout": args.timeout, "tune": args.tune, "rounds": args.rounds}


def pol_arrival(cfg: dict) -> str:
    return cfg["policy"].get("arrival", "b2b")


def arrival_text(pol: dict) -> str:
    kind, us = pol.get("arrival", "b2b"), pol.get("arrival_us", 0.0)
    if kind == "b2b":
        return "b2b (timed calls back to back)"
    what = (f"then {us:g} us of compute" if kind == "apart" else
            f"then rank r computes r x {us:g} us (arrives that late)")
    return (f"{kind} (before every call: a torch.distributed gloo barrier in the same processes "
            f"(under mpiexec too), {what}; only the call is timed; after p50 / p90 = the last "
            f"rank's end - the last rank's start, per call: what the library adds once every rank "
            f"has arrived)")


def _bind_knob() -> str:
    from ..core.config import read
    return read().bind


def _rank_entry(rank: int, world: int, cfg: dict, libs: list[str]) -> dict:
    return rank_sweep(rank, world, cfg, libs, desc="+".join(libs))


def _package_root() -> str:
    import ringcomm
    return os.path.dirname(os.path.dirname(os.path.abspath(ringcomm.__file__)))


def _pass_on(err: bytes | None) -> str:
    """Write a child's captured stderr to ours; return its last line with a letter or digit in it
    (MPI implementations end their error banners with a rule of dashes or '='), at most 200
    characters, for a notice."""
    if not err:
        return ""
    text = err.decode(errors="replace")
    sys.stderr.write(text)
    sys.stderr.flush()
    lines = [ln.strip() for ln in text.splitlines() if any(ch.isalnum() for ch in ln)]
    return lines[-1][:200] if lines else ""


def run_mpi_phase(cfg: dict, tmp: str, notices: list[str],
                  settings: dict | None = None) -> list[dict] | None:
    from .drivers.locate import mpich
    inst = mpich()       # the mpich wheel's launcher and library, by path; None: not a wheel's
    mpiexec = inst.launcher[0] if inst else find_mpiexec()
    cfg_path, out_path = os.path.join(tmp, "mpi_cfg.json"), os.path.join(tmp, "mpi_out.pickle")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    if os.path.exists(out_path):
        os.unlink(out_path)
    env = dict(os.environ, **(inst.env if inst else {}), **(settings or {}))
    env["PYTHONPATH"] = os.pathsep.join([_package_root()] + [p for p in env.get(
        "PYTHONPATH", "").split(os.pathsep) if p])
    if os.geteuid() == 0:
        # Open MPI's mpiexec refuses to start as root (containers often run as root) unless both
        # are set; MPICH ignores them.
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    cmd = [mpiexec, "-n", str(cfg["world_size"]), sys.executable, "-m",
           "ringcomm.bench._mpi_worker", cfg_path, out_path]
    try:
        # The workers' stdout goes to our stderr: stdout carries only the report. Their stderr
        # is kept to name the cause of a failure, then passed on.
        proc = subprocess.run(cmd, env=env, stdout=sys.stderr, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, timeout=cfg["timeout"])
    except subprocess.TimeoutExpired as e:
        _pass_on(e.stderr)
        notices.append(f"mpi: skipped (mpiexec did not finish within {cfg['timeout']:.0f} s)")
        return None
    except OSError as e:
        notices.append(f"mpi: skipped (cannot run {mpiexec}: {e})")
        return None
    last = _pass_on(proc.stderr)
    if proc.returncode != 0 or not os.path.exists(out_path):
        notices.append(f"mpi: skipped (`{' '.join(shlex.quote(c) for c in cmd[:3])} ...` "
                       f"exited with {proc.returncode}{': ' + last if last else ''})")
        return None
    import pickle
    with open(out_path, "rb") as f:
        return pickle.load(f)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = resolve(args)
    except ValueError as e:
        parser.error(str(e))
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib (pip install matplotlib, or 'ringcomm[bench]')")
    if args.trace:
        sizes = cfg["sizes"] if (args.minbytes or args.maxbytes) else None
        ops = cfg["ops"] if args.ops != parser.get_default("ops") else None
        return main_trace(cfg, args.iters or 100, BusyLoad(cfg["load"]), sizes, ops)

    started = datetime.datetime.now(datetime.timezone.utc)
    load_start, busy_start = loadavg(), cpu_busy()
    t_start = time.monotonic()
    notices: list[str] = []
    torch_libs = []
    rc_reason = probe("ringcomm")
    if rc_reason:
        notices.append(f"ringcomm: skipped ({rc_reason})")
    else:
        torch_libs.append("ringcomm")
    phased: dict[str, dict | None] = {}
    if pol_arrival(cfg) != "b2b" and probe("gloo"):
        parser.error(f"--arrival {args.arrival} separates calls with a gloo barrier: {probe('gloo')}")
    for peer in cfg["peers"]:
        reason = probe(peer)
        if reason:
            notices.append(f"{peer}: skipped ({reason})")
        elif peer in PHASE_PEERS:
            phased[peer] = None
        else:
            torch_libs.append(peer)

    mem_sizes = sorted({s for s in cfg["sizes"]})
    print(f"# ringcomm-bench: memcpy ceiling over {len(mem_sizes)} sizes ...", file=sys.stderr)
    memcpy = measure_memcpy(mem_sizes, budget=0.1)

    results: list[dict] = []
    launches = Launches(*pair_cpus(cfg["world_size"], cfg["bind"] or _bind_knob()))
    described: dict[str, str] = {}
    tmp = tempfile.mkdtemp(prefix="ringcomm-bench-")
    load = BusyLoad(cfg["load"])
    if load.n:
        print(f"# ringcomm-bench: starting {load.n} busy processes ...", file=sys.stderr)
    try:
        load.__enter__()
        phase = PhaseRunner(tmp, notices, run_mpi_phase)
        groups = []      # (libraries, how to start their ranks): one launch each per round
        if torch_libs:
            torch_launches = itertools.count(1)

            def start_torch(libs=torch_libs):
                print(f"# ringcomm-bench: {cfg['world_size']} ranks: {', '.join(libs)} ...",
                      file=sys.stderr)
                n = next(torch_launches)      # every launch meets on stores of its own
                lcfg = dict(cfg, rc_init="file://" + os.path.join(tmp, f"rc_rdzv{n}"),
                            torch_store=os.path.join(tmp, f"torch_store{n}"))
                return spawn(_rank_entry, cfg["world_size"], (lcfg, libs), timeout=cfg["timeout"],
                             env=None if cfg["bind"] is None else {"RINGCOMM_BIND": cfg["bind"]})
            groups.append(("+".join(torch_libs), start_torch))
        for peer in [p for p in PHASE_PEERS if p in phased]:
            spec = None
            if peer in NATIVE:
                print(f"# ringcomm-bench: {peer}: finding it, building its driver ...",
                      file=sys.stderr)
                spec, reason = prepare(peer)
                if reason:
                    notices.append(f"{peer}: skipped ({reason})")
                    continue
            rec = phased[peer] = choose_waiting(peer, cfg, spec, cfg["tune"], phase,
                                                lambda m: print(m, file=sys.stderr))

            def start_peer(peer=peer, spec=spec, used=rec["used"]):
                print(f"# ringcomm-bench: {cfg['world_size']} {peer} ranks ...", file=sys.stderr)
                return phase(peer, cfg, spec, used)
            groups.append((peer, start_peer))
        for k in range(cfg["rounds"]):
            for libs, start in order(k, groups):
                try:
                    res = launches.run(k, libs, start)
                except LaunchError as e:
                    print(f"ringcomm-bench: the ranks failed: {e}", file=sys.stderr)
                    return 3
                results.extend(res or [])
    finally:
        load.__exit__(None, None, None)
        shutil.rmtree(tmp, ignore_errors=True)

    for res in results:
        for lib, text in res.get("libs", {}).items():
            described.setdefault(lib, text)
        for n in res.get("notices", []):
            if n not in notices:
                notices.append(n)
    records = merge_ranks(results)
    report.enrich(records, cfg["world_size"])
    elapsed = time.monotonic() - t_start

    import numpy
    pol = cfg["policy"]
    cmdline = "python -m ringcomm.bench" + "".join(" " + shlex.quote(a) for a in
                                                  (sys.argv[1:] if argv is None else argv))
    meta_lines = [
        f"# ringcomm-bench  {started:%Y-%m-%d %H:%M:%S} UTC  host {platform.node()}  "
        f"{cpu_model()} ({os.cpu_count()} cores)  {platform.system()} {platform.release()}",
        f"# command: {cmdline}",
        f"# python {platform.python_version()}, numpy {numpy.__version__}; libraries: " +
        ("; ".join(f"{k}: {v}" for k, v in described.items()) or "none ran"),
        f"# {cfg['world_size']} local ranks"
        + (f" faked as {cfg['nodes']} nodes (RINGCOMM_NODE_ID; ringcomm hierarchical, peers flat)"
           if cfg["nodes"] > 1 else "")
        + f"; sizes {cfg['sizes'][0]}..{cfg['sizes'][-1]} B x{args.stepfactor}; "
        f"per measurement: 1 checked call, warm-up calls, then at least "
        f"{min(pol['min_iters'], pol['iters'])} timed calls and at least {pol['budget']:g} s of "
        f"them (at most {pol['iters']} calls)",
        "# a call's time = the max over ranks; per cell: calls = timed calls, min / median / p90 "
        "(/ p99 with >= 100 calls) of their times; algbw = size / median, busbw = algbw x "
        "factor; GB/s = 1e9 B/s",
        "# arrival: " + arrival_text(pol),
        "# binding: RINGCOMM_BIND=" + (cfg["bind"] or _bind_knob())
        + " (the ranks' placement: the ringcomm library line)",
        "# load: " + load.summary,
    ]
    for peer, rec in phased.items():
        if rec is not None:
            used = " ".join(f"{k}={v}" for k, v in {**rec["fixed"], **rec["used"]}.items())
            meta_lines.append(f"# {peer} settings: {used or 'none set'} (waiting: "
                              f"{rec['chosen_by']})")
    load_end = loadavg()
    if load_start is not None:
        busy = busy_start is not None and busy_start > 0.15
        meta_lines.append(
            "# machine before the run: " + (f"{100 * busy_start:.0f}% CPU busy with other "
                                             "processes; " if busy_start is not None else "") +
            f"load average before/after {load_start[0]:.2f} / {load_end[0]:.2f} "
            f"({os.cpu_count()} cores)" + ("  WARNING: other processes were competing for the "
                                          "cores; figures are not representative" if busy else ""))
    meta_lines += launches.lines(cfg["rounds"])
    meta_lines += [f"# notice: {n}" for n in notices]
    text, summary_data = report.render(meta_lines, records, memcpy, cfg["world_size"])
    text += f"# run took {elapsed:.1f} s\n"
    sys.stdout.write(text)
    sys.stdout.flush()

    meta = {"date_utc": started.isoformat(), "host": platform.node(), "cpu": cpu_model(),
            "cores": os.cpu_count(), "python": platform.python_version(),
            "numpy": numpy.__version__, "libraries": described, "command": cmdline,
            "notices": notices, "world_size": cfg["world_size"], "elapsed_s": elapsed,
            "loadavg_start": load_start, "loadavg_end": load_end, "cpu_busy_start": busy_start,
            "load": load.as_dict(),
            "peer_settings": {p: r for p, r in phased.items() if r is not None},
            "launches": [ln.as_dict() for ln in launches.done],
            "probe_cpus": launches.cpus,
            "config": cfg}
    if args.json:
        report.write_json(args.json, meta, records, memcpy, summary_data)
        print(f"# wrote {args.json}", file=sys.stderr)
    if args.plot:
        report.plot(args.plot, summary_data["tables"], memcpy, cfg["world_size"],
                    f"ringcomm-bench {started:%Y-%m-%d} - {cpu_model()}, "
                    f"{cfg['world_size']} ranks")
        print(f"# wrote {args.plot}", file=sys.stderr)
    return 1 if summary_data["wrong"] else 0
