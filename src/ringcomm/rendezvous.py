"""Rendezvous stores: how the ranks of a communicator find each other's shared memory.

A store needs ``set(key, value)`` and a blocking ``get(key) -> bytes``. torch's TCPStore,
FileStore and PrefixStore qualify; ``FileStore`` below needs no torch (a directory of files on a
filesystem every rank sees)."""
from __future__ import annotations

import os
import tempfile
import time
import urllib.parse
from typing import Optional

from .config import default_timeout
from .errors import InvalidArgumentError, TimeoutError

__all__ = ["FileStore", "store_from_init_method", "store_from_env", "exchange_segment_names",
           "forget_segment_name", "default_prefix"]


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


def _tcp_store(host, port, rank, world_size, timeout, is_master):
    try:
        from datetime import timedelta

        import torch.distributed as dist
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise InvalidArgumentError(
            "ringcomm: tcp:// and env:// rendezvous use torch's TCPStore; install torch or use "
            "init_method='file:///shared/path'") from e
    return dist.TCPStore(host, port, world_size, is_master, timedelta(seconds=timeout),
                         wait_for_workers=False)


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
    torchrun and ringcomm.launch) says this process belongs to a larger job than ``world_size``,
    a default prefix is refused with InvalidArgumentError saying what to pass. ``root`` names the
    kind of communicator (``ringcomm-cuda`` for ringcomm.cuda.init's own)."""
    if world_size is not None and world_size > 1:
        _refuse_sub_communicator_default(rank, world_size)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    return f"{root}/a{attempt}/{counter}" if attempt else f"{root}/{counter}"


def _refuse_sub_communicator_default(rank: Optional[int], world_size: int) -> None:
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


def exchange_segment_names(store, prefix: str, rank: int, world_size: int, name: str,
                           timeout: float) -> list:
    """Publish this rank's segment name under ``{prefix}/shm/{rank}`` and return every rank's.

    A store can hold keys of an earlier run under the same prefix (a reused ``file://`` path, a
    crashed job): their segments are gone, because a segment is unlinked as soon as every peer
    has mapped it, and a live peer's segment exists until this rank has mapped it. So a name
    whose segment does not exist is stale, and the key is read again until the peer's own name
    replaces it (ringcomm.TimeoutError naming the key after ``timeout`` seconds)."""
    store.set(f"{prefix}/shm/{rank}", name)
    names = []
    deadline = time.monotonic() + timeout
    for r in range(world_size):
        if r == rank:
            names.append(name)
            continue
        key = f"{prefix}/shm/{r}"
        delay = 0.0005
        while True:
            v = store.get(key)
            v = v.decode() if isinstance(v, (bytes, bytearray)) else str(v)
            if _segment_exists(v):
                names.append(v)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"ringcomm: rank {rank}: the store key {key!r} names shared memory "
                                f"{v!r} that does not exist (a previous run's key?) and rank {r} did "
                                f"not replace it within {timeout:.0f} s")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    return names


def forget_segment_name(store, prefix: str, rank: int) -> None:
    """Remove this rank's key once every peer has mapped its segment (the name is useless from
    then on), where the store can delete keys; a reused store then starts clean."""
    delete = getattr(store, "delete_key", None)
    if delete is None:
        return
    try:
        delete(f"{prefix}/shm/{rank}")
    except Exception:  # noqa: BLE001 - best effort: a store may refuse deletes
        pass


def init_args(who: str, rank, world_size, timeout):
    """``(rank, world_size, timeout_s)`` for a communicator's ``init``: the arguments given, else
    RANK / WORLD_SIZE from the environment and RINGCOMM_TIMEOUT (default 300 s); ``who`` names
    the function in the messages. InvalidArgumentError for anything out of range."""
    if rank is None:
        rank = int(_env(who, "RANK"))
    if world_size is None:
        world_size = int(_env(who, "WORLD_SIZE"))
    if not (isinstance(world_size, int) and world_size >= 1):
        raise InvalidArgumentError(f"{who}: world_size must be >= 1, got {world_size!r}")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise InvalidArgumentError(f"{who}: rank {rank!r} out of range for world size {world_size}")
    t = float(timeout) if timeout is not None else default_timeout()
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
