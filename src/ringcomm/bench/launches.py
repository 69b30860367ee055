"""The run's launches: every library's ranks started ``--rounds`` times, the order alternating
between rounds, each launch between two readings of the cross-CPU probe.

On a virtual machine the host places the guest's vCPUs, and may move them farther apart (another
core complex, another socket) for a spell of seconds to minutes while the guest sees the same
CPUs: then a cache line's round trip between the two CPUs takes several times longer, and so
does every hand-off between ranks, whichever library makes it. A launch that falls in such a
spell runs slow for its whole life. The probe (``ringcomm._C._cpu_pair``: two threads pinned to
the CPUs of ranks 0 and 1 bounce a cache line, then hand 256 KiB through two slots) taken before
and after each launch shows which launches ran in which state; alternating the order over rounds
and taking each figure's median over the rounds keeps one spell from deciding a library's cells.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from ..core import cpus as cpu_plan

PROBE_SECONDS = 0.2
HANDOFF_BYTES = 256 << 10
FAR = 2.0          # a round trip this many times the run's lower quartile marks its launch


@dataclass
class Launch:
    round: int                 # 0-based
    libs: str                  # "ringcomm+gloo", "mpi", ...
    before: Optional[dict]     # the probe's figures ({"round_trip_ns", "handoff_gbps"}), or None
    after: Optional[dict] = None
    ran: bool = False

    def as_dict(self) -> dict:
        return {"round": self.round + 1, "libs": self.libs, "probe_before": self.before,
                "probe_after": self.after, "ran": self.ran}


def pair_cpus(world: int, bind: str,
              topo: Optional[cpu_plan.Topology] = None) -> tuple[Optional[tuple[int, int]], str]:
    """The CPUs of ranks 0 and 1 under ``bind`` (the first CPU of each rank's share; the first
    two CPUs this process may use when the ranks are not pinned), or (None, why not)."""
    if world < 2:
        return None, "one rank: no hand-off to probe"
    topo = topo or cpu_plan.read_topology()
    if len(topo.allowed) < 2:
        return None, f"one CPU ({topo.allowed[0] if topo.allowed else '?'}) to run on"
    first = cpu_plan.plan_binding(bind, 0, world, topo)
    second = cpu_plan.plan_binding(bind, 1, world, topo)
    a = first.cpus[0] if first.applied and first.cpus else topo.allowed[0]
    pool = (second.cpus if second.applied else []) + sorted(topo.allowed)
    b = next(c for c in pool if c != a)
    return (a, b), ""


def probe(cpus: Optional[tuple[int, int]]) -> Optional[dict]:
    """The probe's figures between ``cpus``, {"error": why} when it failed, None without a pair."""
    if cpus is None:
        return None
    from .. import _C
    try:
        return dict(_C._cpu_pair(cpus[0], cpus[1], HANDOFF_BYTES, PROBE_SECONDS))
    except Exception as e:          # a probe that cannot run is reported, never fatal
        return {"error": f"{type(e).__name__}: {e}"}


def order(round_index: int, groups: list) -> list:
    """The launch order of a round: as given in even rounds (0-based), reversed in odd ones."""
    return list(groups) if round_index % 2 == 0 else list(reversed(groups))


@dataclass
class Launches:
    cpus: Optional[tuple[int, int]]
    why_not: str = ""
    done: list[Launch] = field(default_factory=list)

    def run(self, round_index: int, libs: str, start: Callable[[], Optional[list]]) -> Optional[list]:
        """Probe, start the launch, probe again; tag its ranks' results with the round."""
        launch = Launch(round_index, libs, probe(self.cpus))
        self.done.append(launch)
        results = start()
        launch.after, launch.ran = probe(self.cpus), results is not None
        for res in results or []:
            res["round"] = round_index
        return results

    def lines(self, rounds: int) -> list[str]:
        head = (f"# launches: {rounds} round(s), the order reversed every other round; each "
                "figure of a cell is the median over the rounds of that figure")
        if self.cpus is None:
            return [head, f"# cross-CPU probe: not taken ({self.why_not})"]
        out = [head, f"# cross-CPU probe between CPUs {self.cpus[0]} and {self.cpus[1]}, before / "
               f"after each launch (two threads: a cache line's round trip; "
               f"{HANDOFF_BYTES >> 10} KiB handed through two slots, GB/s):"]
        trips = sorted(p["round_trip_ns"] for ln in self.done for p in (ln.before, ln.after)
                       if p and "round_trip_ns" in p)
        # the lower quartile, not the least: a few readings on one physical core's two hardware
        # threads (several times quicker still) must not mark the usual placement
        low = trips[len(trips) // 4] if trips else None
        for ln in self.done:
            text = f"#   round {ln.round + 1}  {ln.libs:<28} "
            text += " / ".join(_fmt(p) for p in (ln.before, ln.after))
            far = low is not None and any(p and p.get("round_trip_ns", 0) > FAR * low
                                          for p in (ln.before, ln.after))
            if far:
                text += f"   FAR: round trip > {FAR:g}x the run's lower quartile ({low:.0f} ns)"
            if not ln.ran:
                text += "   (did not run)"
            out.append(text)
        return out


def _fmt(p: Optional[dict]) -> str:
    if p is None:
        return "-"
    if "error" in p:
        return f"probe failed ({p['error'][:80]})"
    return f"{p['round_trip_ns']:6.0f} ns {p['handoff_gbps']:5.1f} GB/s"
