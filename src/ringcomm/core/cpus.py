"""Which CPUs a local rank runs on (``RINGCOMM_BIND``) and how many threads its large copies and
reductions use (``RINGCOMM_THREADS``).

The arithmetic is pure (functions of CPU lists; tested on faked topologies); the OS is read and
written only by :func:`read_topology`, :func:`apply_affinity` and the registry.

Binding, decided once per process when its first communicator is created (before its shared
memory is allocated, so the segment's pages are first touched on the rank's own CPUs, hence its
NUMA node):
  - ``core``: local rank r of W gets a contiguous share of the CPUs the process may use (its
    affinity mask); with fewer CPUs than ranks nothing is pinned (ranks pinned onto shared CPUs
    can move neither away from each other nor away from other load: docs/binding.md).
  - ``numa``: local rank r gets the allowed CPUs of NUMA node r mod K (K nodes with allowed CPUs).
  - ``none`` (default): nothing changes.
It is never applied when the user already placed the process: an affinity mask narrower than the
machine's online CPUs, a container cpuset narrower than the machine, a process an earlier
communicator already bound, or another ringcomm job binding on this node (the registry below).
Then the mask is left as it is and the INFO line says why. Where it is applied and torch is
imported, torch's intra-op pool is capped at the rank's share of its CPUs (:func:`cap_torch_threads`).

The node registry: a directory (``RINGCOMM_BIND_REGISTRY``, default /tmp/.ringcomm-bind) holding
one file per process that asked for binding, named by its pid, holding its job key (the parent
pid: the ranks of one job are children of one launcher process: torchrun's agent, mpirun's proxy,
ringcomm.core.launch), its start time (a pid reused by another process reads as dead) and a
registration number. Registration and the decision happen under an flock of the directory's lock
file, so the first job to register on a node binds, and every later job seen alive while it runs
is left unbound (also when the two start together: the earlier first entry wins). Entries of dead
processes are removed by whoever registers next; a process removes its own at exit. Jobs that do
not ask for binding do not register and are not seen.
"""
from __future__ import annotations

import atexit
import glob
import os
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

__all__ = ["parse_cpulist", "format_cpulist", "core_share", "numa_share", "pinned_reason",
           "Topology", "BindPlan", "plan_binding", "auto_threads", "read_topology",
           "apply_affinity", "bind_process", "place_rank", "node_ranks", "REGISTRY_DEFAULT"]

REGISTRY_DEFAULT = "/tmp/.ringcomm-bind"
MODES = ("none", "core", "numa")


# ---- CPU lists -------------------------------------------------------------------------------
def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' (the kernel's cpulist format) -> [0, 1, 2, 3, 8, 10, 11]; '' -> []."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if sep:
            if int(hi) < int(lo):
                raise ValueError(f"bad cpulist range {part!r}")
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(lo))
    return sorted(cpus)


def format_cpulist(cpus: Sequence[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    out, cpus = [], sorted(set(cpus))
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


# ---- the shares ------------------------------------------------------------------------------
def core_share(allowed: Sequence[int], local_rank: int, local_world: int) -> list[int]:
    """Local rank r's contiguous share of the sorted allowed CPUs (at least one CPU per rank):
    shares differ in size by at most one and cover every CPU."""
    cpus = sorted(allowed)
    c, w = len(cpus), local_world
    if c < w or not 0 <= local_rank < w:
        raise ValueError(f"core_share: {c} CPUs for {w} ranks, or local rank {local_rank} not in 0..{w - 1}")
    return cpus[local_rank * c // w:(local_rank + 1) * c // w]


def numa_share(nodes: Sequence[Sequence[int]], allowed: Sequence[int], local_rank: int,
               local_world: int) -> tuple[int, list[int], int]:
    """(node index, its allowed CPUs, ranks placed on that node) for local rank r: the nodes with
    allowed CPUs in order, rank r on the (r mod K)-th of them."""
    ok = set(allowed)
    usable = [(i, sorted(ok.intersection(cpus))) for i, cpus in enumerate(nodes)]
    usable = [(i, c) for i, c in usable if c]
    if not usable:
        raise ValueError("numa_share: no NUMA node has an allowed CPU")
    k = local_rank % len(usable)
    ranks_here = len(range(k, local_world, len(usable)))
    return usable[k][0], usable[k][1], ranks_here


def pinned_reason(allowed: Sequence[int], online: Sequence[int],
                  cpuset: Optional[Sequence[int]]) -> Optional[str]:
    """Why the process counts as already placed by its user, or None: its affinity mask or its
    container's cpuset is narrower than the machine's online CPUs."""
    if set(online) - set(allowed):
        return (f"the affinity mask {format_cpulist(allowed)} is narrower than the online CPUs "
                f"{format_cpulist(online)} (pinned by the user)")
    if cpuset is not None and set(online) - set(cpuset):
        return (f"the container cpuset {format_cpulist(cpuset)} is narrower than the online "
                f"CPUs {format_cpulist(online)}")
    return None


@dataclass
class Topology:
    """What the decision reads from the OS (faked in tests)."""
    allowed: list[int]                  # sched_getaffinity(0)
    online: list[int]                   # /sys/devices/system/cpu/online
    nodes: list[list[int]]              # NUMA nodes' cpulists, node order
    cpuset: Optional[list[int]] = None  # the cgroup's effective cpuset, where one is readable


@dataclass
class BindPlan:
    mode: str                    # what was asked: none, core, numa
    applied: bool                # True: the process is to be pinned to `cpus`
    cpus: list[int]              # the CPUs the rank runs on afterwards
    ranks_sharing: int           # local ranks (this one included) running on those CPUs; 0: not known
    reason: str = ""             # why not applied (empty when applied or mode none)
    node: Optional[int] = None   # numa: the node
    extra: dict = field(default_factory=dict)
    torch_threads: Optional[tuple[int, int]] = None  # torch's intra-op threads (before, after) where capped

    def fair_threads(self, local_world: int) -> int:
        """The rank's share of its CPUs: its CPUs over the local ranks sharing them (all local
        ranks where that is not known), at least 1."""
        return max(1, len(self.cpus) // max(1, self.ranks_sharing or local_world))

    def describe(self, threads: int, min_bytes: int) -> str:
        cpus = format_cpulist(self.cpus)
        if self.applied:
            head = f"bind {self.mode}: pinned to CPUs {cpus}" + (
                f" (NUMA node {self.node})" if self.node is not None else "")
        elif self.mode == "none":
            head = f"bind none: not pinned, CPUs {cpus}"
        else:
            head = f"bind {self.mode} not applied ({self.reason}): CPUs {cpus}"
        if self.ranks_sharing == 0:
            share = "ranks share CPUs: not known (placed outside ringcomm)"
        elif self.ranks_sharing > 1:
            share = f"ranks share CPUs: yes ({self.ranks_sharing} local ranks on these CPUs)"
        else:
            share = "ranks share CPUs: no"
        par = (f"{threads} threads for copies and reductions of >= {min_bytes} B" if threads > 1
               else "1 thread for copies and reductions")
        if self.torch_threads is not None:
            par += f"; torch intra-op threads {self.torch_threads[0]} -> {self.torch_threads[1]}"
        return f"{head}; {share}; {par}"


def plan_binding(mode: str, local_rank: int, local_world: int, topo: Topology,
                 other_job: Optional[str] = None) -> BindPlan:
    """The decision for one local rank. ``other_job``: why another job on this node forbids
    binding (from the registry), or None."""
    mode = mode.lower()
    if mode not in MODES:
        raise ValueError(f"bind must be one of {', '.join(MODES)}, got {mode!r}")
    allowed = sorted(topo.allowed)
    if mode == "none":
        return BindPlan("none", False, allowed, local_world)
    why = pinned_reason(allowed, topo.online, topo.cpuset) or other_job
    if why:
        return BindPlan(mode, False, allowed, 0, why)
    if mode == "core":
        if len(allowed) < local_world:
            # Ranks pinned in pairs onto one CPU can move neither away from each other nor away
            # from other load (docs/binding.md measures it): oversubscribed ranks stay unpinned.
            return BindPlan("core", False, allowed, local_world,
                            f"fewer CPUs ({len(allowed)}) than local ranks ({local_world}): ranks "
                            f"pinned onto shared CPUs could not move away from each other or from other load")
        return BindPlan("core", True, core_share(allowed, local_rank, local_world), 1)
    node, cpus, here = numa_share(topo.nodes or [allowed], allowed, local_rank, local_world)
    return BindPlan("numa", True, cpus, here, node=node)


def auto_threads(plan: BindPlan, local_world: int, knob: str, omp: Optional[str]) -> int:
    """Threads per rank for large copies and reductions. ``knob``: RINGCOMM_THREADS ('auto' or a
    count >= 1). auto: OMP_NUM_THREADS where set (at most the rank's CPUs), else the rank's CPUs
    divided by the local ranks sharing them (all local ranks when that is not known), at least 1:
    two unbound ranks on two CPUs get one thread each."""
    if knob.strip().lower() != "auto":
        try:
            n = int(knob)
        except ValueError:
            n = 0
        if n < 1:
            from .errors import InvalidArgumentError
            raise InvalidArgumentError(f"ringcomm: environment knob RINGCOMM_THREADS={knob!r} is not "
                                       f"valid: expected auto or a count >= 1")
        return n
    ncpu = len(plan.cpus)
    if omp:
        try:
            return max(1, min(int(omp.split(",")[0]), ncpu))
        except ValueError:
            pass
    return plan.fair_threads(local_world)


def cap_torch_threads(plan: BindPlan, local_world: int) -> None:
    """After ringcomm pinned this process: torch's intra-op pool, where torch is imported and
    its pool is larger than the rank's share of its new CPUs (plan.fair_threads), shrinks to that
    share, and plan.torch_threads records it. An OpenMP pool started before the pinning keeps its
    thread count while every thread of it is moved onto the rank's few CPUs, where its threads'
    spin-waits for each other take turns on one core (docs/binding.md). A pool that starts after
    the pinning sizes itself from the new mask: nothing to do."""
    torch = sys.modules.get("torch")
    if not plan.applied or torch is None or not hasattr(torch, "get_num_threads"):
        return
    share = plan.fair_threads(local_world)
    before = torch.get_num_threads()
    if before > share:
        torch.set_num_threads(share)
        plan.torch_threads = (before, share)


# ---- the OS ----------------------------------------------------------------------------------
def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def read_topology(sys_root: str = "/sys") -> Topology:
    online_text = _read(f"{sys_root}/devices/system/cpu/online")
    online = parse_cpulist(online_text) if online_text else list(range(os.cpu_count() or 1))
    nodes = []
    for path in sorted(glob.glob(f"{sys_root}/devices/system/node/node[0-9]*/cpulist"),
                       key=lambda p: int(p.rsplit("/", 2)[-2][4:])):
        nodes.append(parse_cpulist(_read(path) or ""))
    cpuset = None
    for path in _cpuset_files(sys_root, _read("/proc/self/cgroup") or ""):
        text = _read(path)
        if text and text.strip():
            cpuset = parse_cpulist(text)
            break
    return Topology(sorted(os.sched_getaffinity(0)), online, nodes, cpuset)


def _cpuset_files(sys_root: str, proc_cgroup: str) -> list[str]:
    """Where this process's effective cpuset is, most specific first: its own cgroup's file
    (/proc/self/cgroup: ``0::/path`` for cgroup v2, ``N:cpuset:/path`` for v1), then the
    mount's root (inside a container with its own cgroup namespace, the container's)."""
    out = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            out.append(f"{sys_root}/fs/cgroup{parts[2].rstrip('/')}/cpuset.cpus.effective")
        elif "cpuset" in parts[1].split(","):
            out.append(f"{sys_root}/fs/cgroup/cpuset{parts[2].rstrip('/')}/cpuset.effective_cpus")
    return out + [f"{sys_root}/fs/cgroup/cpuset.cpus.effective",
                  f"{sys_root}/fs/cgroup/cpuset/cpuset.effective_cpus"]


def apply_affinity(cpus: Sequence[int]) -> None:
    """Pin every thread of this process (the ones running now, hence the ones they start) to cpus."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, OSError):
            pass  # a thread that ended meanwhile
    os.sched_setaffinity(0, cpus)


def _start_time(pid: int) -> Optional[str]:
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    return text.rsplit(")", 1)[1].split()[19]  # field 22, starttime


class _Registry:
    """The node registry (see the module's doc)."""

    def __init__(self, path: str):
        self.path = path
        self.mine = os.path.join(path, str(os.getpid()))

    def _entries(self) -> list[tuple[int, str, int]]:
        out = []
        for name in os.listdir(self.path):
            if not name.isdigit():
                continue
            text = _read(os.path.join(self.path, name))
            try:
                job, start, number = (text or "").split()
            except ValueError:
                continue
            if _start_time(int(name)) != start:
                try:
                    os.unlink(os.path.join(self.path, name))  # dead (or reused pid)
                except OSError:
                    pass
                continue
            out.append((int(name), job, int(number)))
        return out

    def register(self, job: str) -> tuple[Optional[str], bool]:
        """Register this process; (why another job forbids binding or None, whether this
        process was registered already)."""
        import fcntl
        import stat
        try:
            os.mkdir(self.path)
            os.chmod(self.path, 0o1777)  # every user's jobs register here (sticky: own files only)
        except FileExistsError:
            pass
        if not stat.S_ISDIR(os.lstat(self.path).st_mode):
            raise NotADirectoryError(f"{self.path} is not a directory (a link?)")
        # flock works on a read-only descriptor, so a lock file made by another user serves too.
        fd = os.open(os.path.join(self.path, "lock"), os.O_CREAT | os.O_RDONLY | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entries = self._entries()
            before = any(pid == os.getpid() for pid, _, _ in entries)
            if not before:
                number = max((n for _, _, n in entries), default=0) + 1
                tmp = self.mine + ".tmp"
                with open(tmp, "w") as f:
                    f.write(f"{job} {_start_time(os.getpid())} {number}\n")
                os.replace(tmp, self.mine)
                _at_exit(self.unregister)
                entries.append((os.getpid(), job, number))
            mine = min(n for _, j, n in entries if j == job)
            earlier = sorted({pid for pid, j, n in entries if j != job and n < mine})
            if earlier:
                return (f"another ringcomm job on this node binds its ranks (pids "
                        f"{', '.join(map(str, earlier[:4]))}{' ...' if len(earlier) > 4 else ''})"), before
            return None, before
        finally:
            os.close(fd)

    def unregister(self) -> None:
        try:
            os.unlink(self.mine)
        except OSError:
            pass


def _at_exit(fn) -> None:
    """Run ``fn`` when this process exits normally: atexit in a process Python started itself;
    multiprocessing's exit finalizers in one it forked (fork and forkserver children end with
    os._exit, which skips atexit). ``fn`` may run twice and must not mind."""
    from multiprocessing import util
    atexit.register(fn)
    util.Finalize(None, fn, exitpriority=0)


# The placement this process's first binding communicator decided: the process has one
# placement, so later communicators (sub-communicators, a re-init) keep it instead of moving it.
_placed: Optional[BindPlan] = None


def bind_process(mode: str, local_rank: int, local_world: int, registry: str,
                 topo: Optional[Topology] = None) -> BindPlan:
    """Decide (and, where it is to be, apply) this process's binding."""
    global _placed
    mode = mode.lower()
    if mode != "none" and _placed is not None:
        return BindPlan(mode, False, _placed.cpus, _placed.ranks_sharing,
                        f"decided by an earlier communicator of this process: {_placed.mode}"
                        f"{'' if _placed.applied else ' not applied'}", _placed.node)
    topo = read_topology() if topo is None else topo
    other = None
    if mode != "none":
        try:
            other, _ = _Registry(registry).register(f"ppid{os.getppid()}")
        except OSError as e:
            other = f"the node registry {registry} is not usable ({e})"
    plan = plan_binding(mode, local_rank, local_world, topo, other)
    if plan.applied:
        try:
            apply_affinity(plan.cpus)
        except OSError as e:  # e.g. CPUs outside a cpuset the kernel enforces: leave the mask
            plan = BindPlan(mode, False, sorted(os.sched_getaffinity(0)), 0,
                            f"sched_setaffinity({format_cpulist(plan.cpus)}) failed: {e}")
    if mode != "none":
        _placed = plan
    return plan


def _local(rank: int, world: int) -> tuple[int, int]:
    """(local rank, local world): LOCAL_RANK / LOCAL_WORLD_SIZE where the launcher set them
    consistently (torchrun, ringcomm.core.launch), else the communicator's own (all its ranks are on
    this node)."""
    try:
        lr, lw = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
        if 0 <= lr < lw:
            return lr, lw
    except (KeyError, ValueError):
        pass
    return rank, world


def node_ranks(rank: int, world: int) -> int:
    """The ranks on this node, of every group: LOCAL_WORLD_SIZE where the launcher set it
    consistently, else the communicator's world (all its ranks are on this node)."""
    return _local(rank, world)[1]


def place_rank(rank: int, world: int, knobs) -> tuple[BindPlan, int, int]:
    """At a host communicator's init, before its shared memory is created: (the binding plan,
    threads per rank, the split's byte threshold), from the knobs (``config.read()``) RINGCOMM_BIND,
    RINGCOMM_BIND_REGISTRY, RINGCOMM_THREADS, RINGCOMM_THREADS_MIN_BYTES and OMP_NUM_THREADS."""
    lr, lw = _local(rank, world)
    plan = bind_process(knobs.bind, lr, lw, knobs.bind_registry)
    cap_torch_threads(plan, lw)
    threads = auto_threads(plan, lw, knobs.threads, os.environ.get("OMP_NUM_THREADS"))
    return plan, threads, knobs.threads_min_bytes
