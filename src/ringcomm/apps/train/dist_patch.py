"""Wrapping the ``torch.distributed`` collectives for measurement (``CommTimer``, ``CommVolume``).

``DistPatch(wrap).install()`` replaces every collective function of ``torch.distributed`` (and of
``distributed_c10d``, which holds the same objects) by ``wrap(name, fn)``, together with the
module-level aliases that modules bound at import (``ringcomm.training.zero.collectives`` keeps
``_reduce_scatter_fn = dist.reduce_scatter_single``). ``uninstall()`` puts every original back.
Patches nest: install B over A, then uninstall B before A.
"""
from __future__ import annotations

import sys
from typing import Callable

#: The collective functions that are wrapped (those absent from this torch are skipped).
NAMES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "reduce_scatter",
         "reduce_scatter_single", "all_gather_single", "all_gather", "broadcast", "reduce",
         "all_to_all_single", "all_to_all", "scatter", "gather", "_reduce_scatter_base",
         "_all_gather_base", "barrier")
#: Modules whose module-level aliases of these functions (bound at import) are wrapped too.
ALIAS_MODULES = ("ringcomm.training.zero.collectives",)


class DistPatch:
    """``wrap(name, fn) -> wrapper`` applied to every collective; the wrapper is marked with this
    patch so that installing the same patch twice does not wrap twice."""

    def __init__(self, wrap: Callable[[str, Callable], Callable],
                 names=NAMES, alias_modules=ALIAS_MODULES):
        self._wrap = wrap
        self.names = tuple(names)
        self.alias_modules = tuple(alias_modules)
        self._saved: list = []

    def install(self) -> "DistPatch":
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        wrapped = {}
        for name in self.names:
            for mod in (dist, c10d):
                fn = getattr(mod, name, None)
                if fn is None or getattr(fn, "_ringcomm_patch", None) is self:
                    continue
                if id(fn) not in wrapped:
                    w = self._wrap(name, fn)
                    w._ringcomm_patch = self
                    wrapped[id(fn)] = (fn, w)
                self._saved.append((mod, name, fn))
                setattr(mod, name, wrapped[id(fn)][1])
        for modname in self.alias_modules:
            mod = sys.modules.get(modname)
            for name, val in list(vars(mod).items()) if mod is not None else ():
                if callable(val) and id(val) in wrapped and wrapped[id(val)][0] is val:
                    self._saved.append((mod, name, val))
                    setattr(mod, name, wrapped[id(val)][1])
        return self

    def uninstall(self) -> None:
        for mod, name, fn in reversed(self._saved):
            setattr(mod, name, fn)
        self._saved.clear()
