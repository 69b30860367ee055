"""``python -m ringcomm.bench --load N``: N busy processes beside the ranks.

Each is a separate Python interpreter spinning on pure-Python arithmetic (no I/O, no sleeps, no
CPU pinning), started before the timed phases and reaped after them. They run under the normal
time-sharing policy (SCHED_OTHER, nice 0 relative to their parent) even when the bench itself was
started under a real-time policy (``chrt -f``): a SCHED_FIFO spinner would never give its core to
the ranks, which is not the "other work on the machine" this option stands for.

No busy process outlives the bench: ``BusyLoad`` is a context manager that SIGKILLs and reaps them
on exit (normal, exception, Ctrl-C, and SIGTERM/SIGHUP, which it turns into an exception while it
is active); a busy process also exits by itself within ~50 ms once its parent is gone (``kill -9``
of the bench). Reaping uses ``wait4``, so each process's CPU time is known: the report says how
much work the load really did.

Signals follow the launcher's dispositions. A signal the bench was started with ignored
(``nohup`` ignores SIGHUP; a shell without job control starts ``cmd &`` with SIGINT ignored)
stays ignored: the bench runs on and reaps its load at its normal end. Only a signal whose action
is the default one, which would end the process without unwinding, is turned into an exception
(Python's own SIGINT handler already raises KeyboardInterrupt). SIGINT, SIGTERM and SIGHUP are
blocked while a busy process is being started and while the load is being reaped, so an
interruption is taken only where every started process is in ``pids`` and will be reaped; a busy
process unblocks them before anything else.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

# The busy loop: clear the signal mask (the bench starts it with SIGINT/SIGTERM/SIGHUP blocked),
# leave a real-time policy, say "ready", then spin until the parent changes (the bench died: we
# were re-parented) or we are killed.
_SPIN = r"""
import os, signal, sys
signal.pthread_sigmask(signal.SIG_SETMASK, ())
try:
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
except (AttributeError, OSError):
    pass
parent = int(sys.argv[1])
sys.stdout.write("ready\n"); sys.stdout.flush(); sys.stdout.close()
x = 0
while os.getppid() == parent:
    for i in range(20000):
        x = (x * 1103515245 + i) & 0xFFFFFFFF
"""


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Interrupted(BaseException):
    """SIGTERM/SIGHUP while the load runs: unwinds like KeyboardInterrupt (reaps the load)."""


@contextlib.contextmanager
def _signals_deferred():
    """``_SIGNALS`` blocked in this thread for the block, the previous mask restored after it: one
    that arrives meanwhile stays pending and is taken (its handler runs) at the restore."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class BusyLoad:
    """``with BusyLoad(n) as load:`` runs n busy processes; ``load.summary`` after exit."""

    def __init__(self, n: int):
        if n < 0:
            raise ValueError(f"--load must be >= 0, got {n}")
        self.n = int(n)
        self.pids: list[int] = []
        self.cpu_s: list[float] = []     # user + system CPU seconds per process, after exit
        self.wall_s = 0.0
        self._procs: list[subprocess.Popen] = []
        self._t0 = 0.0
        self._old_handlers: dict[int, object] = {}

    def _raise(self, signum, _frame):
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise _Interrupted(f"signal {signum}")

    def __enter__(self) -> "BusyLoad":
        if self.n == 0:
            return self
        for s in _SIGNALS:
            try:
                if signal.getsignal(s) == signal.SIG_DFL:
                    self._old_handlers[s] = signal.signal(s, self._raise)
            except ValueError:            # not the main thread: rely on the finally below
                pass
        try:
            for _ in range(self.n):
                # Blocked from fork to the append: a signal in between would leave a started
                # process out of _procs (unreaped until the bench exits).
                with _signals_deferred():
                    p = subprocess.Popen([sys.executable, "-c", _SPIN, str(os.getpid())],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, close_fds=True)
                    self._procs.append(p)
                    self.pids.append(p.pid)
            for p in self._procs:         # every process is spinning before the timed runs start
                line = p.stdout.readline()
                p.stdout.close()
                if line.strip() != b"ready":
                    raise RuntimeError(f"busy process {p.pid} did not start")
        except BaseException:
            self._stop()
            raise
        self._t0 = time.monotonic()
        return self

    def _stop(self) -> None:
        # Blocked throughout: a second Ctrl-C cannot cut the kill/reap loop short; a pending
        # signal is taken when it is done (every process reaped, the old handlers back).
        with _signals_deferred():
            self._kill_and_reap()

    def _kill_and_reap(self) -> None:
        if self._t0:
            self.wall_s = time.monotonic() - self._t0
        for p in self._procs:
            try:
                p.kill()
            except OSError:
                pass
        for p in self._procs:
            while True:
                try:
                    _, status, ru = os.wait4(p.pid, 0)
                    break
                except InterruptedError:
                    continue
                except ChildProcessError:  # already reaped
                    ru, status = None, 0
                    break
            p.returncode = -signal.SIGKILL if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            self.cpu_s.append(ru.ru_utime + ru.ru_stime if ru is not None else 0.0)
        self._procs = []
        for s, h in self._old_handlers.items():
            signal.signal(s, h)
        self._old_handlers = {}

    def __exit__(self, *exc) -> bool:
        self._stop()
        return False

    @property
    def summary(self) -> str:
        """One line for the report header."""
        if self.n == 0:
            return "none (no busy processes started by the bench)"
        cpu = sum(self.cpu_s)
        return (f"{self.n} busy process{'es' if self.n != 1 else ''} (pure-Python spin, "
                f"SCHED_OTHER, not pinned) beside the ranks for {self.wall_s:.1f} s; they used "
                f"{cpu:.1f} CPU-s ({cpu / max(self.wall_s, 1e-9):.2f} cores on average)")

    def as_dict(self) -> dict:
        return {"n": self.n, "pids": self.pids, "cpu_s": self.cpu_s, "wall_s": self.wall_s}
