"""ringcomm's torch.distributed backend as a torchft process group, built the way torchft 0.2.0
builds its gloo group (``pip install 'ringcomm[ft]'``)::

    from ringcomm.torch.torchft_pg import ProcessGroupRingcommC10d
    pg = ProcessGroupRingcommC10d(timeout=timedelta(seconds=10))
    manager = torchft.Manager(pg=pg, ...)        # in place of torchft.ProcessGroupGloo()

torchft's ``ProcessGroupWrapper`` does the reconfiguring: each ``configure()`` aborts the group of
the previous quorum and calls ``_create_pg`` with a store client under the quorum's unique path;
here ``_create_pg`` makes a torch ``ProcessGroup`` whose CPU (and CUDA) backend is the "ringcomm"
backend's creator output, as ``torch.distributed.new_group(backend="ringcomm")`` would register
it. Every collective then goes through torch's dispatcher to that backend; its Works keep torch's
contract (``work.py``). On top of torchft's wrapper: ``errored()`` returns the error that made the
current group's communicator unusable (a dead or aborting peer), and ``shutdown()`` shuts the
group down (closes its communicator, joins its threads) instead of only dropping it.

``ringcomm.torchft.ProcessGroupRingcomm`` is the other route: a torchft process group on
ringcomm's plain API, without torch.distributed's dispatcher.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _DistributedBackendOptions

try:
    from torchft.process_group import ProcessGroupWrapper
except ImportError as e:
    raise ImportError("ringcomm.torch.torchft_pg needs torchft 0.2.0: pip install 'ringcomm[ft]' "
                      f"(import failed: {e})") from e

from .backend import create_backend

__all__ = ["ProcessGroupRingcommC10d"]


class ProcessGroupRingcommC10d(ProcessGroupWrapper):
    """A reconfigurable torch ``ProcessGroup`` on the "ringcomm" backend (torchft's
    ``ProcessGroupGloo`` with ringcomm in place of gloo). The replicas of a quorum must share a
    host. ``timeout`` bounds the store client, init and every wait of the communicator."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)

    def _create_pg(self, store, rank: int, world_size: int) -> dist.ProcessGroup:
        opts = _DistributedBackendOptions()
        opts.store = store          # torchft's PrefixStore under the quorum's path
        opts.group_rank = rank
        opts.group_size = world_size
        opts.timeout = self._timeout
        # the same on every rank of the quorum's group; the store prefix already keeps two
        # quorums' keys apart
        opts.group_id = f"torchft_quorum_{self._quorum_id}"
        opts.global_ranks_in_group = list(self._global_ranks or range(world_size))
        backend = create_backend(opts)
        if isinstance(backend, dist.ProcessGroup):
            # RINGCOMM_TORCH_BACKEND=group: the backend is the whole group, every device included
            return backend
        pg = dist.ProcessGroup(store, rank, world_size)
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, backend)
        if torch.cuda.is_available():
            pg._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.CUSTOM,
                                 backend)
        return pg

    def _backend(self):
        """The current group's ringcomm backend (per-device or whole-group), or None."""
        pg = self._pg
        if pg is None:
            return None
        if hasattr(pg, "communicator"):
            return pg
        try:
            return pg._get_backend(torch.device("cpu"))
        except RuntimeError:
            return None

    def errored(self) -> Optional[Exception]:
        """The error that made the current group's communicator unusable, or None. torchft's
        Manager reads it before committing a step."""
        backend = self._backend()
        comm = getattr(backend, "communicator", None)
        return None if comm is None else comm.errored()

    def shutdown(self) -> None:
        """Shut the current group down: its communicator closes (after its queued work) and its
        threads are joined."""
        pg, self._pg = self._pg, None
        if pg is not None:
            pg.shutdown()

    def getBackendName(self) -> str:
        return "torchft-ringcomm-c10d"
