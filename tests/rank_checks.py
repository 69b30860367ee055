"""What a spawned rank's cases record instead of raising (module-level so that spawned ranks
import it): ``RankChecks``, the failures of ``check(what, cond)`` and of an exception in a
``with`` block, closing the block's communicators; ``AllReduceChecks``, the same over one
communicator per configuration, with all_reduce runs checked to leave their input untouched."""
import traceback

from mp_cases import all_reduce_checked, init_under_env


class RankChecks:
    """One rank's failures, as "rank R: ..." strings in ``failures``: check(what, cond) records
    `what` when cond is false. As a context manager, an Exception its block raises is recorded
    (with its traceback) instead of propagating, and the communicators in `closing` are closed
    however the block ends."""

    def __init__(self, rank, closing=()):
        self.rank = rank
        self.closing = closing
        self.failures = []

    def check(self, what, cond):
        if not cond:
            self.failures.append(f"rank {self.rank}: {what}")

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        caught = kind is not None and issubclass(kind, Exception)
        try:
            if caught:
                self.failures.append(f"rank {self.rank}: exception\n"
                                     + "".join(traceback.format_exception(kind, exc, tb)))
        finally:
            for c in self.closing:
                c.close()
        return caught


class AllReduceChecks(RankChecks):
    """RankChecks over one communicator per entry of `configs` ({name: env}; each created under
    its env on its own store, RC_TEST_STORE/name): ``comms`` by name, and ``run``,
    mp_cases.all_reduce_checked reporting to this ``check``."""

    def __init__(self, rank, world, configs):
        self.comms = {name: init_under_env(rank, world, name, env) for name, env in configs.items()}
        super().__init__(rank, list(self.comms.values()))

    def run(self, comm, x_src, op, in_place, dt, lib):
        """all_reduce_checked of x_src on `comm`: (the result's bytes, the result)."""
        return all_reduce_checked(comm, x_src, op, in_place, dt, lib, self.check)
