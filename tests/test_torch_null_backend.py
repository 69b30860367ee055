"""The do-nothing c10d backend "ringcomm_null" (ringcomm.torch.null_backend, NullBackend in
bindings/torch/trampoline.cpp): importing ringcomm.torch does not register it; once registered, a
group of it returns a completed Work from ``dist.all_reduce`` at once and leaves the tensor as it
was, sync and async, in 2 real ranks beside a ringcomm group that still sums."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from ranks import require_backend, run_ranks  # noqa: E402


def _null(rank, world):
    import ringcomm.torch  # noqa: F401 - registers "ringcomm" only
    from ringcomm.torch import null_backend
    registered_by_import = null_backend.NULL_BACKEND_NAME.upper() in dist.Backend._plugins
    assert null_backend.register() and null_backend.register()   # idempotent
    nullg = dist.new_group(backend=null_backend.NULL_BACKEND_NAME)
    rc = dist.new_group(backend="ringcomm")
    x = torch.full((256,), float(rank + 1))
    sync = dist.all_reduce(x, group=nullg)
    work = dist.all_reduce(x, group=nullg, async_op=True)
    done = work.is_completed() and work.wait()
    untouched = bool(torch.all(x == float(rank + 1)))
    dist.all_reduce(x, group=rc)
    summed = bool(torch.all(x == float(world * (world + 1) // 2)))
    kind = type(nullg._get_backend(torch.device("cpu"))).__name__
    return {"by_import": registered_by_import, "sync": sync, "done": done, "untouched": untouched,
            "summed": summed, "kind": kind}


def test_null_backend_does_nothing_and_completes():
    require_backend("ringcomm")
    for r in run_ranks(_null, 2, backend="gloo", timeout=240):
        assert r["by_import"] is False, r
        assert r["sync"] is None and r["done"] is True, r
        assert r["untouched"] and r["summed"], r
        assert r["kind"] == "NullBackend", r
