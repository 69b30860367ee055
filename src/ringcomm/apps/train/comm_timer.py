"""Time spent waiting in collectives: ``CommTimer`` wraps the torch.distributed calls;
``_GradTail`` times torch DDP's wait after the last gradient."""
from __future__ import annotations

import functools
import time

from ...core.work import WrappedWork
from .dist_patch import ALIAS_MODULES, NAMES, DistPatch


class CommTimer:
    """Wraps the torch.distributed collectives to time the waits on them.

    Synchronous calls are timed whole; an async call's launch is timed and its ``Work`` is
    wrapped so that ``wait()`` is timed too. Only counts while ``active``.
    """

    NAMES = NAMES
    ALIAS_MODULES = ALIAS_MODULES

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0
        self.active = False
        self._patch = DistPatch(lambda _name, fn: self._wrap(fn), self.NAMES, self.ALIAS_MODULES)

    def install(self):
        self._patch.install()
        return self

    def uninstall(self):
        self._patch.uninstall()

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


class _TimedWork(WrappedWork):
    """A ``torch.distributed`` work whose every ``wait()`` is timed (and passed through, with its
    arguments and result, as often as it is called); other attributes (``get_future``, ...) are
    the wrapped work's."""

    __slots__ = ("_timer",)

    def __init__(self, work, timer):
        super().__init__(work)
        self._timer = timer

    def wait(self, *args, **kwargs):
        t0 = time.perf_counter()
        r = self._inner.wait(*args, **kwargs)
        if self._timer.active:
            self._timer.seconds += time.perf_counter() - t0
        return r

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_inner", "_timer", "_waited"):
            raise AttributeError(name)
        return getattr(self._inner, name)


class _GradTail:
    """For torch DDP: per backward, time from the last gradient ready to backward() returning."""

    def __init__(self, module):
        self.last = 0.0
        self.handles = [p.register_post_accumulate_grad_hook(self._ready)
                        for p in module.parameters() if p.requires_grad]

    def _ready(self, p):
        self.last = time.perf_counter()
