"""Arrays that GPU work of ringcomm may still use after the caller dropped them.

torch's caching allocator (and CuPy's memory pool) hand a freed block out again in the order of
the stream it was allocated on. Work ringcomm runs on another stream — send/recv on the CUDA
communicator's internal stream, a collective on a ``stream=`` the caller passed — may still read
or write the block after the caller's last reference is gone. Two guards, both applied to every
such operation (``StreamGuard.guard``):

- torch tensors: ``tensor.record_stream(s)`` with that stream ``s``: when the tensor is freed,
  the allocator reuses its block only after the work queued on ``s`` up to the free is done;
- every array (torch's too): a reference held here until the operation is over on the GPU.
  record_stream alone is not enough for send/recv: their copies are enqueued by the
  point-to-point thread, possibly after the caller freed the tensor, and the allocator's
  marker covers only work queued before the free.

"Over on the GPU": the operation's Work completed without error (its fence is an event recorded
after the GPU work), or, for one that failed (no fence), its stream has drained (``idle()``:
every copy enqueued on it so far has finished). Entries are let go by ``prune()``, which the
communicator calls on every new operation and at close; after a close whose drain failed, what
is still in flight stays referenced for the life of the communicator object.
"""
from __future__ import annotations

import threading
from typing import Callable, List, Optional, Sequence, Tuple

__all__ = ["InflightRefs", "StreamGuard", "torch_stream", "is_torch_tensor"]


def is_torch_tensor(o) -> bool:
    mod = type(o).__module__
    return mod.startswith("torch") and hasattr(o, "record_stream")


def torch_stream(handle: int, device: int):
    """A torch stream object for a raw CUDA stream handle (what record_stream needs)."""
    import torch
    return torch.cuda.ExternalStream(handle, device=torch.device("cuda", device))


class InflightRefs:
    """(work, arrays, idle) entries, let go once the work is over on the GPU (see the module)."""

    def __init__(self):
        self._lock = threading.Lock()          # issue from several threads; prune from any
        self._entries: List[Tuple[object, tuple, Callable[[], bool]]] = []

    def hold(self, work, objs: Sequence, idle: Callable[[], bool]) -> None:
        objs = tuple(o for o in objs if o is not None)
        if work is None or not objs:
            return
        with self._lock:
            self._entries.append((work, objs, idle))

    @staticmethod
    def _over(work, idle) -> bool:
        if not work.is_completed():
            return False
        if work.error_code() < 0:
            return True                        # its fence (an event after the GPU work) is done
        return bool(idle())                    # failed: no fence; over once its stream drained

    def prune(self) -> int:
        """Let go of every entry whose work is over; returns how many are still held."""
        with self._lock:
            entries = list(self._entries)
        done = [e for e in entries if self._over(e[0], e[2])]
        with self._lock:
            if done:
                ids = {id(e) for e in done}
                self._entries = [e for e in self._entries if id(e) not in ids]
            return len(self._entries)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class StreamGuard:
    """Applies both guards for one communicator: record_stream on torch tensors with the stream's
    torch object (one per handle, made by ``make_stream``), a reference in ``refs``."""

    def __init__(self, device: int, make_stream: Optional[Callable[[int, int], object]] = None):
        self.device = device
        self.refs = InflightRefs()
        self._make_stream = make_stream or torch_stream
        self._streams: dict = {}

    def _stream_obj(self, handle: int, given=None):
        if given is not None and type(given).__module__.startswith("torch"):
            return given                        # the caller's own torch stream object
        s = self._streams.get(handle)
        if s is None:
            s = self._streams[handle] = self._make_stream(handle, self.device)
        return s

    def guard(self, work, objs: Sequence, handle: int, idle: Callable[[], bool], given=None,
              capturing: bool = False) -> None:
        """``objs`` are used by ``work``, which runs on stream ``handle`` (``given``: the caller's
        stream object, when it passed one). ``capturing``: ``handle`` is being captured into a
        CUDA graph: no Work is queried and no stream polled (either would end the capture), and
        nothing is held (the work runs at each replay; the graph's owner keeps its arrays)."""
        seen = set()
        objs = [o for o in objs if o is not None and not (id(o) in seen or seen.add(id(o)))]
        torch_objs = [o for o in objs if is_torch_tensor(o)]
        if torch_objs:
            s = self._stream_obj(handle, given)
            for o in torch_objs:
                o.record_stream(s)
        if capturing:
            return
        self.refs.prune()
        self.refs.hold(work, objs, idle)
