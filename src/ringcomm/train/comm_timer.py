"""Time spent waiting in collectives: ``CommTimer`` wraps the torch.distributed calls;
``_GradTail`` times torch DDP's wait after the last gradient."""
from __future__ import annotations

import functools
import sys
import time

class CommTimer:
    """Wraps the torch.distributed collectives to time the waits on them.

    Synchronous calls are timed whole; an async call's launch is timed and its ``Work`` is
    wrapped so that ``wait()`` is timed too. Only counts while ``active``.
    """

    NAMES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "reduce_scatter",
             "reduce_scatter_single", "all_gather_single", "all_gather", "broadcast", "reduce",
             "all_to_all_single", "all_to_all", "scatter", "gather", "_reduce_scatter_base",
             "_all_gather_base", "barrier")
    #: Modules whose module-level aliases of these functions (``_fn = dist.all_gather_...``,
    #: bound at import) are wrapped too.
    ALIAS_MODULES = ("ringcomm.zero.collectives",)

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0
        self.active = False
        self._saved: list = []

    def install(self):
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        wrapped = {}
        for name in self.NAMES:
            for mod in (dist, c10d):
                fn = getattr(mod, name, None)
                if fn is None or getattr(fn, "_ringcomm_timed", False):
                    continue
                if id(fn) not in wrapped:
                    wrapped[id(fn)] = (fn, self._wrap(fn))
                self._saved.append((mod, name, fn))
                setattr(mod, name, wrapped[id(fn)][1])
        for modname in self.ALIAS_MODULES:
            mod = sys.modules.get(modname)
            for name, val in list(vars(mod).items()) if mod is not None else ():
                if callable(val) and id(val) in wrapped and wrapped[id(val)][0] is val:
                    self._saved.append((mod, name, val))
                    setattr(mod, name, wrapped[id(val)][1])
        return self

    def uninstall(self):
        for mod, name, fn in reversed(self._saved):
            setattr(mod, name, fn)
        self._saved.clear()

    def _wrap(self, fn):
        timer = self

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            work = fn(*args, **kwargs)
            if timer.active:
                timer.seconds += time.perf_counter() - t0
                timer.calls += 1
            if work is not None and hasattr(work, "wait"):
                return _TimedWork(work, timer)
            return work
        timed._ringcomm_timed = True
        return timed


class _TimedWork:
    def __init__(self, work, timer):
        self._work, self._timer = work, timer

    def wait(self, *args, **kwargs):
        t0 = time.perf_counter()
        r = self._work.wait(*args, **kwargs)
        if self._timer.active:
            self._timer.seconds += time.perf_counter() - t0
        return r

    def __getattr__(self, name):
        return getattr(self._work, name)


class _GradTail:
    """For torch DDP: per backward, time from the last gradient ready to backward() returning."""

    def __init__(self, module):
        self.last = 0.0
        self.handles = [p.register_post_accumulate_grad_hook(self._ready)
                        for p in module.parameters() if p.requires_grad]

    def _ready(self, p):
        self.last = time.perf_counter()
