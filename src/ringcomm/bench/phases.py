"""The peers that run in processes of their own, one phase after another, and their waiting.

``mpi`` (MPICH through mpi4py) and ``impi`` (Intel MPI) run under an MPI launcher, ``oneccl`` in
ranks started by ``ringcomm.core.launch.spawn``; a library's waiting settings are environment
variables read when it starts, so every setting tried is a phase of fresh processes.

Each peer has fixed settings (how it is placed and connected: one node, shared memory, loopback
for oneCCL's store) and a grid of waiting settings, the ones a user tuning it on this machine
would try (``GRIDS``). Without ``--tune`` a peer runs with its library's default waiting; with
it, every setting of the grid runs a short probe (``PROBE``: all_reduce float32 at 1 KiB, 64 KiB
and 1 MiB, in the run's arrival mode and on the same harness), and the sweep runs with the
setting of the lowest geometric mean of the probe's medians. Every setting tried, with its
probe figures, is kept in the run's JSON (``meta.peer_settings``).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import pickle
import shlex
import subprocess
import sys
from typing import Any

from ..core.launch import LaunchError, spawn
from .harness import merge_ranks, rank_sweep

PHASE_PEERS = ("mpi", "impi", "oneccl")
NATIVE = ("impi", "oneccl")


def _product(**axes) -> list[dict]:
    keys = list(axes)
    return [dict(zip(keys, map(str, vals))) for vals in itertools.product(*axes.values())]


# Waiting: oneCCL's worker threads and their spin-then-yield; Intel MPI's polling vs. wait
# mode and its spins before yielding; MPICH's progress polls before it yields the CPU.
GRIDS = {
    "oneccl": _product(CCL_WORKER_COUNT=(1, 2), CCL_YIELD=("pause", "sleep", "sched_yield"),
                       CCL_SPIN_COUNT=(10, 100, 1000)),
    "impi": _product(I_MPI_WAIT_MODE=(0, 1), I_MPI_SPIN_COUNT=(1, 100, 1000)),
    "mpi": _product(MPIR_CVAR_POLLS_BEFORE_YIELD=(0, 100, 1000, 10000)),
}
# Placement and connection, the same in every setting: one node over shared memory; ranks not
# pinned (as the bench's other MPI ranks; Intel MPI pins by default).
FIXED = {
    "oneccl": {"CCL_ATL_TRANSPORT": "ofi", "CCL_ATL_SHM": "1", "FI_PROVIDER": "shm",
               "CCL_KVS_IFACE": "lo"},
    "impi": {"I_MPI_FABRICS": "shm", "I_MPI_PIN": "0"},
    "mpi": {},
}
PROBE: dict[str, Any] = {"ops": ["all_reduce"], "dtypes": ["float32"], "redops": ["sum"],
                         "sizes": [1 << 10, 1 << 16, 1 << 20], "budget": 0.05}


def prepare(peer: str) -> tuple[dict | None, str | None]:
    """(spec, None) for a native peer whose files are found and whose driver builds, else
    (None, reason). The spec travels in the configuration to the ranks (``runner.load``)."""
    from .drivers.build import BuildError, driver
    from .drivers.locate import LOCATE, Missing
    try:
        inst = LOCATE[peer]()
        path = driver(peer, inst)
    except (Missing, BuildError, OSError) as e:
        return None, str(e)
    spec = dataclasses.asdict(inst)
    spec.update(driver=path, note=inst.launcher_note or "ranks started by ringcomm.core.launch",
                settings={})
    return spec, None


def probe_cfg(cfg: dict) -> dict:
    pol = dict(cfg["policy"], budget=PROBE["budget"], iters=max(cfg["policy"]["iters"], 20),
               inject_wrong="")
    return dict(cfg, ops=PROBE["ops"], dtypes=PROBE["dtypes"], redops=PROBE["redops"],
                sizes=PROBE["sizes"], policy=pol)


def score(results: list[dict] | None, peer: str) -> tuple[float | None, dict, str | None]:
    """(geometric mean of the medians in µs, {size: median µs}, None) or (None, .., reason)."""
    if not results:
        return None, {}, "the phase did not run"
    cells = [r for r in merge_ranks(results) if r["lib"] == peer]
    med = {r["size"]: r["time_s"] * 1e6 for r in cells if "time_s" in r}
    bad = [r.get("error") or r.get("na") or f"{r['wrong']} wrong" for r in cells
           if "time_s" not in r or r.get("wrong")]
    if bad or len(med) != len(PROBE["sizes"]):
        return None, med, bad[0] if bad else "missing sizes"
    return math.exp(sum(math.log(v) for v in med.values()) / len(med)), med, None


class PhaseRunner:
    """Runs one phase of a peer with one waiting setting; returns the ranks' results or None
    (with a notice saying why)."""

    def __init__(self, tmp: str, notices: list[str], run_mpi):
        self.tmp, self.notices, self.run_mpi, self.count = tmp, notices, run_mpi, 0

    def __call__(self, peer: str, cfg: dict, spec: dict | None, settings: dict) -> list | None:
        self.count += 1
        tag = os.path.join(self.tmp, f"{peer}{self.count}")
        env = {**FIXED[peer], **settings}
        cfg = dict(cfg, torch_store=tag + ".store")
        if peer == "mpi":
            return self.run_mpi(cfg, self.tmp, self.notices, env)
        assert spec is not None, f"{peer}: prepare() gives the spec of a native peer"
        full = dict(spec, env={**spec["env"], **env}, settings=env, rendezvous=tag + ".kvs")
        cfg["native"] = {peer: full}
        if peer == "oneccl":
            try:
                return spawn(_native_rank, cfg["world_size"], (cfg, peer), timeout=cfg["timeout"],
                             env=full["env"])
            except LaunchError as e:
                self.notices.append(f"{peer}: skipped ({str(e).strip().splitlines()[0][:200]})")
                return None
        return self._launch(peer, cfg, full, tag)

    def _launch(self, peer, cfg, spec, tag):
        from .cli import _package_root, _pass_on
        cfg_path, out = tag + ".json", tag + ".out"
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        env = dict(os.environ, **spec["env"])
        env["PYTHONPATH"] = os.pathsep.join(
            [_package_root()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        cmd = spec["launcher"] + ["-n", str(cfg["world_size"]), sys.executable, "-m",
                                  "ringcomm.bench.drivers.worker", cfg_path, out, peer]
        try:
            proc = subprocess.run(cmd, env=env, stdout=sys.stderr, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL, timeout=cfg["timeout"])
        except subprocess.TimeoutExpired as e:
            _pass_on(e.stderr)
            self.notices.append(f"{peer}: skipped (the launcher did not finish within "
                                f"{cfg['timeout']:.0f} s)")
            return None
        last = _pass_on(proc.stderr)
        paths = [f"{out}.{r}" for r in range(cfg["world_size"])]
        if proc.returncode != 0 or not all(os.path.exists(p) for p in paths):
            self.notices.append(f"{peer}: skipped (`{' '.join(shlex.quote(c) for c in cmd[:2])} "
                                f"...` exited with {proc.returncode}{': ' + last if last else ''})")
            return None
        results = []
        for p in paths:
            with open(p, "rb") as f:
                results.append(pickle.load(f))
        return results


def _native_rank(rank: int, world: int, cfg: dict, peer: str) -> dict:
    # The library's own messages (oneCCL prints its warnings to stdout) go to stderr: the bench's
    # stdout carries only the report, as in the MPI phases.
    sys.stdout.flush()
    os.dup2(2, 1)
    return rank_sweep(rank, world, cfg, [peer], desc=peer)


def choose_waiting(peer: str, cfg: dict, spec: dict | None, tune: bool, phase: PhaseRunner,
                   log) -> dict:
    """The record of the peer's waiting setting, the one its sweep runs with (``used``):
    {"fixed": .., "used": .., "chosen_by": .., "tried": [{"settings", "score_us",
    "medians_us", "error"}]}."""
    tried: list[dict[str, Any]] = []
    record: dict[str, Any] = {"fixed": FIXED[peer], "used": {},
                              "chosen_by": "the library's defaults", "tried": tried}
    if tune:
        pcfg = probe_cfg(cfg)
        for i, settings in enumerate(GRIDS[peer]):
            log(f"# ringcomm-bench: tuning {peer} {i + 1}/{len(GRIDS[peer])}: "
                f"{' '.join(f'{k}={v}' for k, v in settings.items())}")
            s, med, err = score(phase(peer, pcfg, spec, settings), peer)
            tried.append({"settings": settings, "score_us": s,
                          "medians_us": {str(k): v for k, v in med.items()}, "error": err})
        ok = [t for t in tried if t["score_us"] is not None]
        if ok:
            best = min(ok, key=lambda t: t["score_us"])
            record["used"] = best["settings"]
            record["chosen_by"] = (f"--tune: lowest geometric mean of all_reduce float32 medians "
                                   f"at 1 KiB, 64 KiB, 1 MiB of {len(tried)} settings")
        else:
            record["chosen_by"] = "the library's defaults (no tuned setting ran)"
    return record
