"""Bytes of the tensors autograd saves for backward, counted while they are alive.

``with SavedTensorMeter(exclude=model): ...`` installs ``saved_tensors_hooks``: each saved
tensor is replaced by a holder whose release (autograd dropping its node) decrements the count.
Storages are counted once, keyed by the StorageImpl (stable across ``resize_``, unlike
``data_ptr``, so resized-to-0 parameter storages are recognised), at their current size.
"""
from __future__ import annotations

import torch
from torch import nn


def _storage(t: torch.Tensor):
    s = t.untyped_storage()
    return s._cdata, s.nbytes()


class _Held:
    """What autograd keeps in place of a saved tensor; its release decrements the meter."""

    __slots__ = ("t", "key", "meter")

    def __init__(self, t, key, meter):
        self.t, self.key, self.meter = t, key, meter

    def __del__(self):
        self.meter._release(self.key)


class SavedTensorMeter:
    """Bytes alive among tensors saved for backward while active (``with meter: ...``).

    Counts each storage once, at its size, from the first save until autograd frees the last
    saved reference to it; parameters of ``exclude`` are not counted. ``peak`` is the maximum.
    """

    def __init__(self, exclude: nn.Module | None = None):
        self.exclude = {_storage(p)[0] for p in exclude.parameters()} if exclude else set()
        self.live: dict = {}
        self.current = 0
        self.peak = 0

    def _pack(self, t):
        key, nbytes = _storage(t)
        if key in self.exclude or nbytes == 0:
            return t
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = [1, nbytes]
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        else:
            entry[0] += 1
        return _Held(t, key, self)

    def _release(self, key):
        entry = self.live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            del self.live[key]
            self.current -= entry[1]

    @staticmethod
    def _unpack(h):
        return h.t if isinstance(h, _Held) else h

    def __enter__(self):
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
