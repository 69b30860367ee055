"""Shared test fixtures: every test must leave no ringcomm segment in /dev/shm and no child
process behind (but the session's groups of ranks, ``ranks``, which end with the session)."""
import importlib.util
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

import ranks

# Ranks of ringcomm.core.launch in this session start as forks of one server that imported numpy and
# torch once (ranks.start_forkserver), as the groups' ranks do: a spawned rank would import
# torch itself, seconds on a 2-core machine. Subprocesses the tests start inherit the setting.
os.environ["RINGCOMM_START_METHOD"] = "forkserver"
ranks.start_forkserver()


@pytest.fixture
def store_env():
    """``{"RC_TEST_STORE": dir}`` for ``spawn(..., env=)``: a fresh directory the spawned ranks
    rendezvous in (``file://`` + it), removed after the test."""
    d = tempfile.mkdtemp(prefix="rc-test-store-")
    yield {"RC_TEST_STORE": d}
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def comm1():
    """A communicator of one rank (no store, no peers), closed after the test."""
    import ringcomm
    c = ringcomm.init(rank=0, world_size=1)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def no_leaks():
    before = ranks.shm_segments()
    yield
    leaked = ranks.lasting(ranks.shm_segments() - before)
    assert not leaked, f"shared-memory segments left in /dev/shm: {sorted(leaked)}"
    alive = [p for p in multiprocessing.active_children() if not ranks.owns(p)]
    assert not alive, f"child processes left running: {alive}"


def pytest_configure(config):
    # Under pytest-xdist pytest-benchmark switches itself off and says so, once per process. No
    # test here takes its fixture (benchmarks/suites/ does, run on its own), so it is switched off
    # quietly instead, unless the command line asks for benchmarks.
    opt = config.option
    xdist = config.getoption("dist", "no") != "no" or "PYTEST_XDIST_WORKER" in os.environ
    asked = getattr(opt, "benchmark_enable", False) or getattr(opt, "benchmark_only", False)
    if xdist and hasattr(opt, "benchmark_disable") and not asked:
        opt.benchmark_disable = True


def pytest_sessionfinish(session, exitstatus):
    ranks.close_all()


def pytest_sessionstart(session):
    """Build the torch backend's c10d trampoline (or find it cached) once, before any test with a
    per-test timeout, so no test pays for the build. A failed build is reported here; the tests
    then see what ``RINGCOMM_TORCH_BACKEND`` makes of it (auto: the fallback, with a warning)."""
    if os.environ.get("RINGCOMM_TORCH_BACKEND", "auto").strip().lower() == "group":
        return
    if importlib.util.find_spec("torch") is None:
        return
    try:
        r = subprocess.run([sys.executable, "-m", "ringcomm.torch", "--build"],
                           capture_output=True, text=True, timeout=900)
        line = (r.stdout.strip().splitlines() or [""])[-1] if r.returncode == 0 else (
            f"ringcomm c10d trampoline: build failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    except subprocess.TimeoutExpired:
        line = "ringcomm c10d trampoline: build timed out after 900 s"
    print(f"\n{line}")
