"""The session's groups of ranks (tests/ranks.py): results in rank order, every job in the
caller's environment with nothing kept from the job before, a failure raised with the rank's
traceback and a fresh group after it."""
import os

import pytest

pytest.importorskip("torch")   # the jobs register an issue hook on ringcomm.torch
import ranks  # noqa: E402
from ringcomm.core.launch import LaunchError  # noqa: E402


def _report(rank, world, name):
    """What this rank sees, then a setting and a hook a careless job would leave behind."""
    seen = (rank, world, os.environ.get("RANK"), os.environ.get(name),
            os.environ.get("RC_POOL_LEFT_BEHIND"), os.getpid())
    os.environ["RC_POOL_LEFT_BEHIND"] = "yes"
    import ringcomm.torch as rct
    from ringcomm.torch.hooks import issue_hooks
    hooks = len(issue_hooks)
    rct.add_issue_hook(lambda *a: None)
    return seen + (hooks,)


def _fail_on_rank_1(rank, world):
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    return rank


def test_jobs_see_the_callers_environment_and_nothing_a_previous_job_left(monkeypatch):
    monkeypatch.setenv("RC_POOL_PARENT", "first")
    first = ranks.run(_report, 2, ("RC_POOL_PARENT",), timeout=120)
    monkeypatch.setenv("RC_POOL_PARENT", "second")
    second = ranks.run(_report, 2, ("RC_POOL_PARENT",), timeout=120, env={"RC_POOL_EXTRA": "1"})
    for r, (a, b) in enumerate(zip(first, second)):
        assert a[:3] == (r, 2, str(r)) and b[:3] == (r, 2, str(r))
        assert (a[3], b[3]) == ("first", "second")       # the caller's value at each call
        assert a[4] is None and b[4] is None             # not the previous job's setting
        assert b[6] == a[6]                               # nor its issue hook
        assert a[5] == b[5]                               # the same process ran both jobs


def test_a_failure_raises_with_the_rank_and_the_next_job_gets_a_fresh_pool():
    before = ranks.run(_report, 2, ("RC_POOL_PARENT",), timeout=120)
    with pytest.raises(LaunchError, match="rank 1 fails on purpose") as e:
        ranks.run(_fail_on_rank_1, 2, timeout=120)
    assert e.value.rank == 1
    after = ranks.run(_report, 2, ("RC_POOL_PARENT",), timeout=120)
    assert {p for *_, p, _ in before}.isdisjoint(p for *_, p, _ in after)
