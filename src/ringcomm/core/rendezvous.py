"""Rendezvous stores: how the ranks of a communicator find each other's shared memory.

A store needs ``set(key, value)`` and a blocking ``get(key) -> bytes``. torch's TCPStore,
FileStore and PrefixStore qualify; ``FileStore`` below needs no torch (a directory of files on a
filesystem every rank sees). A store that also has ``check(keys) -> bool`` and
``add(key, n) -> int`` (all of those named) gives more: every wait is a poll bounded by the init
timeout that names the ranks that never arrived, and ``init()`` without ``prefix=`` meets on a
*generation* kept on the store, so survivors of a failure and a replacement process meet without
agreeing on anything beforehand (see ``claim_generation``)."""
from __future__ import annotations

import fcntl
import os
import tempfile
import time
import urllib.parse
from typing import Optional

from .config import default_timeout
from .errors import InvalidArgumentError, PeerFailureError, RingcommError, TimeoutError

__all__ = ["FileStore", "store_from_init_method", "store_from_env", "exchange_segment_names",
           "forget_segment_name", "default_prefix", "generation_root", "supports_generations",
           "claim_generation", "generation_abandoned", "check_generation", "close_generation", "await_arrivals",
           "forget_arrival", "GenerationSuperseded"]


class FileStore:
    """Keys are files in a directory; ``set`` writes atomically (temp file + rename); ``get``
    polls until the key exists or ``timeout`` seconds pass (then ringcomm.TimeoutError)."""

    def __init__(self, path: str, timeout: float = 300.0):
        self.path = path
        self.timeout = timeout
        os.makedirs(path, mode=0o700, exist_ok=True)

    def _file(self, key: str) -> str:
        return os.path.join(self.path, urllib.parse.quote(key, safe=""))

    def set(self, key: str, value) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, self._file(key))

    def check(self, keys) -> bool:
        """Whether every key in ``keys`` exists now (never waits)."""
        return all(os.path.exists(self._file(k)) for k in keys)

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer under ``key`` (0 when absent) and return the sum; atomic
        across processes: the read and the write happen under an exclusive lock on the
        directory's lock file."""
        with open(os.path.join(self.path, ".lock"), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(self._file(key), "rb") as f:
                    value = int(f.read() or b"0") + int(amount)
            except FileNotFoundError:
                value = int(amount)
            self.set(key, str(value))
            return value

    def delete_key(self, key: str) -> bool:
        try:
            os.unlink(self._file(key))
            return True
        except FileNotFoundError:
            return False

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + self.timeout
        delay = 0.0005
        path = self._file(key)
        while True:
            try:
                with open(path, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"ringcomm: rendezvous timed out after {self.timeout:.0f} s waiting for "
                                   f"key {key!r} in {self.path} (did every rank start?)")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def store_from_init_method(init_method: str, rank: int, world_size: int, timeout: float):
    """``file:///path`` (no torch needed) or ``tcp://host:port`` (uses torch's TCPStore)."""
    url = urllib.parse.urlparse(init_method)
    if url.scheme == "file":
        return FileStore(url.path, timeout=timeout)
    if url.scheme == "tcp":
        return _tcp_store(url.hostname, url.port, rank, world_size, timeout, is_master=(rank == 0))
    if url.scheme == "env":
        return store_from_env(rank, world_size, timeout)
    raise InvalidArgumentError(f"ringcomm: unsupported init_method {init_method!r} (use file://, tcp:// or env://)")


def store_from_env(rank: int, world_size: int, timeout: float):
    """torchrun's environment: MASTER_ADDR / MASTER_PORT (torch's TCPStore)."""
    addr = os.environ.get("MASTER_ADDR")
    port = os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise InvalidArgumentError(
            "ringcomm.init(): MASTER_ADDR and MASTER_PORT are not set; pass store= or init_method=")
    # Under torchrun the agent already serves the store on MASTER_PORT.
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    return _tcp_store(addr, int(port), rank, world_size, timeout, is_master=(rank == 0 and not agent))


# The TCPStore servers this process runs, by (host, port). A server lives as long as its store
# object, and a replacement process joins survivors through the same store, so the rank that
# serves it keeps it for the life of the process, and a later init on the same address (the
# survivors' re-init) reuses it instead of binding the port a second time.
_SERVED: dict = {}


def _tcp_store(host, port, rank, world_size, timeout, is_master):
    try:
        from datetime import timedelta

        import torch.distributed as dist
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise InvalidArgumentError(
            "ringcomm: tcp:// and env:// rendezvous use torch's TCPStore; install torch or use "
            "init_method='file:///shared/path'") from e
    if is_master:
        store = _SERVED.get((host, port))
        if store is None:
            store = dist.TCPStore(host, port, world_size, True, timedelta(seconds=timeout),
                                  wait_for_workers=False)
            _SERVED[(host, port)] = store
        else:
            store.set_timeout(timedelta(seconds=timeout))
        return store
    try:
        return dist.TCPStore(host, port, world_size, False, timedelta(seconds=timeout),
                             wait_for_workers=False)
    except getattr(dist, "DistError", RuntimeError) as e:
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        server = ("the launcher's agent" if agent
                  else "rank 0, so the ranks that never arrived include [0]")
        raise TimeoutError(f"ringcomm: rank {rank}: the rendezvous store at {host}:{port} (served by "
                           f"{server}) could not be reached within {timeout:g} s "
                           f"({type(e).__name__}: {e})") from e


def default_prefix(counter: int, rank: Optional[int] = None, world_size: Optional[int] = None,
                   root: str = "ringcomm") -> str:
    """The store namespace of the ``counter``-th multi-rank communicator this process creates
    without a prefix. Under torchrun an elastic restart reuses the agent's store, so the attempt
    number (TORCHELASTIC_RESTART_COUNT) is part of the name: a new attempt never reads the keys of
    the one before.

    Every member of a communicator must derive the same name, and no other communicator on the
    store may: the counter gives both for the communicators of one group of processes (each member
    creates them in the same order). It cannot tell apart two groups that share a store (ranks
    {0,1} and {2,3} of one job each creating a 2-rank communicator): both would take the same keys
    and pair up across the groups. So when the launcher's environment (RANK / WORLD_SIZE, set by
    torchrun and ringcomm.core.launch) says this process belongs to a larger job than ``world_size``,
    a default prefix is refused with InvalidArgumentError saying what to pass. ``root`` names the
    kind of communicator (``ringcomm-cuda`` for ringcomm.cuda.init's own)."""
    if world_size is not None and world_size > 1:
        refuse_sub_communicator_default(rank, world_size)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    return f"{root}/a{attempt}/{counter}" if attempt else f"{root}/{counter}"


def refuse_sub_communicator_default(rank: Optional[int], world_size: int) -> None:
    job_size = os.environ.get("WORLD_SIZE", "").strip()
    try:
        job = int(job_size)
    except ValueError:
        return  # no launcher environment: nothing tells a sub-communicator apart
    if job <= world_size:
        return
    job_rank = os.environ.get("RANK", "?").strip() or "?"
    raise InvalidArgumentError(
        f"ringcomm.init(rank={rank}, world_size={world_size}): this process is rank {job_rank} of a "
        f"{job}-process job (RANK / WORLD_SIZE), so this communicator is a sub-communicator, and "
        f"sub-communicators that share a store cannot be told apart by a default key prefix (ranks "
        f"of different groups would read each other's keys). Pass prefix= with a value that every "
        f"member of this communicator passes and no other communicator on the store uses, e.g. "
        f"prefix='ringcomm/ranks-' + '-'.join(map(str, member_job_ranks)), or give each communicator "
        f"its own store (torch.distributed.PrefixStore(name, store))")


_SHM_DIR = "/dev/shm"


def _segment_exists(name: str) -> bool:
    """Whether the POSIX shared-memory object ``name`` exists now (Linux keeps them as files in
    /dev/shm; where there is no such directory the check cannot be made and says yes)."""
    if not os.path.isdir(_SHM_DIR):
        return True
    return os.path.exists(os.path.join(_SHM_DIR, name.lstrip("/")))


class GenerationSuperseded(Exception):
    """Raised inside ``init()`` while it waits in a generation that a later one passed over
    (``check_generation``); init claims the newest generation and waits there. Never reaches the
    caller."""


def generation_root() -> str:
    """The namespace of the default-prefix generations: under torchrun it names the elastic
    attempt (TORCHELASTIC_RESTART_COUNT), so a new attempt counts its generations afresh."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    return f"ringcomm/a{attempt}" if attempt else "ringcomm"


def supports_generations(store) -> bool:
    """Whether ``store`` can keep generations: ``add`` (atomic counter) and ``check`` (a
    non-blocking existence test) besides ``set`` and ``get``."""
    return callable(getattr(store, "add", None)) and callable(getattr(store, "check", None))


def _has(store, key: str) -> bool:
    return bool(store.check([key]))


def claim_generation(store, root: str, rank: int) -> int:
    """The generation this rank's communicator meets in; its key prefix is ``{root}/{g}``.

    Keys (``G`` a generation): ``{root}/G/gen-claim/{rank}`` counts the processes of that rank
    that ever joined G (``add``: the first one reads 1); ``{root}/G/gen-open`` exists once some
    rank joined G; ``{root}/G/gen-closed`` once a rank left G without completing it (timeout,
    failure); ``{root}/gen-latest`` is a hint, never above an opened generation.

    The rule: start at the newest opened generation and take the first one, upward, that is not
    closed and in which this rank's claim is the first. So the ranks of a fresh job all take 0; a
    survivor that re-inits finds its own claim in the old generation and moves one up; a
    replacement finds its dead predecessor's claim there and moves up too, whichever arrives first
    (the second one starts at the generation the first opened); a process that inits twice moves
    up once per call, like its peers. Nobody waits on a dead generation's keys: the ranks waiting
    in a generation that was passed over move to the newest one, and those waiting in a closed one
    raise its closer's error (``check_generation``)."""
    g = 0
    latest = f"{root}/gen-latest"
    if _has(store, latest):
        try:
            g = int(_text(store.get(latest)))
        except ValueError:
            g = 0
    while _has(store, f"{root}/{g + 1}/gen-open"):
        g += 1
    while True:
        if not _has(store, f"{root}/{g}/gen-closed") and \
                int(store.add(f"{root}/{g}/gen-claim/{rank}", 1)) == 1:
            store.set(f"{root}/{g}/gen-open", "1")
            store.set(latest, str(g))
            return g
        g += 1


def generation_abandoned(store, root: str, g: int) -> bool:
    """Whether generation ``g`` was passed over (``g + 1`` opened) or closed."""
    return _has(store, f"{root}/{g + 1}/gen-open") or _has(store, f"{root}/{g}/gen-closed")


def check_generation(store, root: str, g: int, rank: int) -> None:
    """Asked while a key of generation ``g`` is still missing (so no rank has completed ``g``).
    Passed over (``g + 1`` opened: a rank left ``g`` because ``g`` cannot complete for it, e.g. a
    replacement whose predecessor joined ``g``): GenerationSuperseded, and init moves to the
    newest generation. Closed (a rank's init in ``g`` failed): that rank's error, here too
    (ringcomm.TimeoutError when it timed out, else PeerFailureError), so every waiting rank
    reports the same cause at once instead of waiting alone in a later generation."""
    if _has(store, f"{root}/{g + 1}/gen-open"):
        raise GenerationSuperseded()
    closed = f"{root}/{g}/gen-closed"
    if _has(store, closed):
        kind, _, reason = _text(store.get(closed)).partition("|")
        cls = TimeoutError if kind == "TimeoutError" else PeerFailureError
        raise cls(f"ringcomm.init: rank {rank}: the communicator under {root}/{g} cannot form: "
                  f"{reason}")


def close_generation(store, root: str, g: int, error: BaseException, rank: int) -> None:
    """Mark generation ``g`` dead after this rank's init in it failed with ``error``: the ranks
    waiting in it raise the same cause (``check_generation``), in the words of the failure marker
    (host.shm_communicator), so a waiter reports it the same whichever it sees first; later
    claimants skip it. The first closer's cause stays. Best effort (the failure being raised is what matters)."""
    key = f"{root}/{g}/gen-closed"
    try:
        if not _has(store, key):
            kind = "TimeoutError" if isinstance(error, TimeoutError) else type(error).__name__
            store.set(key, f"{kind}|rank {rank} failed during init: {type(error).__name__}: {error}"[:1000])
    except Exception:  # noqa: BLE001 - the init failure is the error to report
        pass


def _text(v) -> str:
    return v.decode(errors="replace") if isinstance(v, (bytes, bytearray)) else str(v)


def _poll(store, keys: dict, timeout: float, accept, abandoned, timed_out, who: str) -> dict:
    """Wait until every ``keys[r]`` holds a value ``accept(r, value)`` takes; return
    ``{r: value}``. Where the store has ``check`` this is a poll bounded by ``timeout``
    (``timed_out(missing_ranks, last_values)`` builds the TimeoutError), ``abandoned()``, when
    given, is called while keys are missing and raises to stop the wait, and a store that fails
    (its server gone) raises PeerFailureError naming ``who`` and the ranks still awaited. A store
    without ``check`` gets blocking ``get`` calls bounded by the store's own timeout, whose errors
    pass as they are (a timeout cannot be told from a lost server there)."""
    can_check = callable(getattr(store, "check", None))
    pending = dict(keys)
    got, last = {}, {}
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while True:
        try:
            for r, key in list(pending.items()):
                if can_check and not store.check([key]):
                    continue
                v = store.get(key)
                if accept(r, v):
                    got[r] = v
                    del pending[r]
                else:
                    last[r] = _text(v)
            if pending and abandoned is not None:
                abandoned()
        except (RingcommError, GenerationSuperseded):
            raise
        except Exception as e:  # noqa: BLE001 - the store's own failure, typed here
            if not can_check:
                raise
            raise PeerFailureError(
                f"{who}: the store failed while waiting for ranks {sorted(pending)} "
                f"({type(e).__name__}: {e}); has the process serving it exited (rank 0 for "
                f"tcp:// and env://, torchrun's agent)?") from e
        if not pending:
            return got
        if time.monotonic() > deadline:
            raise timed_out(sorted(pending), last)
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def await_arrivals(store, prefix: str, rank: int, world_size: int, timeout: float,
                   abandoned=None, init_timeout: Optional[float] = None) -> None:
    """Publish ``{prefix}/arrived/{rank}`` and wait until every rank has: an absent peer raises
    ringcomm.TimeoutError naming every rank that never arrived, ``timeout`` seconds after this
    rank started waiting (where the store has ``check``); ``init_timeout`` (default
    ``timeout``) is the bound the message names."""
    store.set(f"{prefix}/arrived/{rank}", "1")
    bound = timeout if init_timeout is None else init_timeout

    def timed_out(missing, _last):
        return TimeoutError(f"ringcomm.init: rank {rank} of {world_size}: the ranks that never "
                            f"arrived within {bound:g} s: {missing} (store prefix {prefix!r}; did "
                            f"every rank start, with the same store?)")

    _poll(store, {r: f"{prefix}/arrived/{r}" for r in range(world_size) if r != rank}, timeout,
          lambda r, v: True, abandoned, timed_out, f"ringcomm.init: rank {rank} of {world_size}")


def forget_arrival(store, prefix: str, rank: int) -> None:
    """Remove this rank's arrival key once the communicator exists (every peer has passed the
    arrival wait by then), where the store can delete keys."""
    _delete(store, f"{prefix}/arrived/{rank}")


def exchange_segment_names(store, prefix: str, rank: int, world_size: int, name: str,
                           timeout: float, abandoned=None) -> list:
    """Publish this rank's segment name under ``{prefix}/shm/{rank}`` and return every rank's.

    A store can hold keys of an earlier run under the same prefix (a reused ``file://`` path, a
    crashed job): their segments are gone, because a segment is unlinked as soon as every peer
    has mapped it, and a live peer's segment exists until this rank has mapped it. So a name
    whose segment does not exist is stale, and the key is read again until the peer's own name
    replaces it (ringcomm.TimeoutError naming the ranks after ``timeout`` seconds)."""
    store.set(f"{prefix}/shm/{rank}", name)

    def timed_out(missing, last):
        stale = [r for r in missing if r in last]
        absent = [r for r in missing if r not in last]
        parts = []
        if absent:
            parts.append(f"the ranks that never arrived: {absent}")
        if stale:
            parts.append("keys naming shared memory that does not exist (a previous run's "
                         "keys?) that their ranks did not replace: " +
                         ", ".join(f"rank {r}: {last[r]!r}" for r in stale))
        return TimeoutError(f"ringcomm: rank {rank}: rendezvous under {prefix!r} timed out after "
                            f"{timeout:g} s; " + "; ".join(parts))

    got = _poll(store, {r: f"{prefix}/shm/{r}" for r in range(world_size) if r != rank}, timeout,
                lambda r, v: _segment_exists(_text(v)), abandoned, timed_out,
                f"ringcomm: rank {rank} of {world_size}: rendezvous under {prefix!r}")
    return [name if r == rank else _text(got[r]) for r in range(world_size)]


def forget_segment_name(store, prefix: str, rank: int) -> None:
    """Remove this rank's key once every peer has mapped its segment (the name is useless from
    then on), where the store can delete keys; a reused store then starts clean."""
    _delete(store, f"{prefix}/shm/{rank}")


def _delete(store, key: str) -> None:
    delete = getattr(store, "delete_key", None)
    if delete is None:
        return
    try:
        delete(key)
    except Exception:  # noqa: BLE001 - best effort: a store may refuse deletes
        pass


def init_args(who: str, rank, world_size, timeout, knobs=None):
    """``(rank, world_size, timeout_s)`` for a communicator's ``init``: the arguments given, else
    RANK / WORLD_SIZE from the environment and RINGCOMM_TIMEOUT (``knobs.timeout``, the knobs the
    caller read; read now when None; default 300 s); ``who`` names the function in the messages.
    InvalidArgumentError for anything out of range."""
    if rank is None:
        rank = int(_env(who, "RANK"))
    if world_size is None:
        world_size = int(_env(who, "WORLD_SIZE"))
    if not (isinstance(world_size, int) and world_size >= 1):
        raise InvalidArgumentError(f"{who}: world_size must be >= 1, got {world_size!r}")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise InvalidArgumentError(f"{who}: rank {rank!r} out of range for world size {world_size}")
    t = float(timeout) if timeout is not None else (default_timeout() if knobs is None else knobs.timeout)
    if t <= 0:
        raise InvalidArgumentError(f"{who}: timeout must be > 0 s, got {t}")
    return rank, world_size, t


def resolve_store(store, init_method, rank: int, world_size: int, timeout: float):
    """The store a communicator of ``world_size`` ranks meets through: ``store`` when given, else
    the one ``init_method`` names, else torchrun's environment (None for a single rank)."""
    if store is not None or world_size == 1:
        return store
    return (store_from_init_method(init_method, rank, world_size, timeout) if init_method
            else store_from_env(rank, world_size, timeout))


def _env(who: str, name: str) -> str:
    v = os.environ.get(name)
    if v is None:
        raise InvalidArgumentError(f"{who}(): {name} is not set; pass rank= and world_size= "
                                   f"(or launch with torchrun)")
    return v
