"""ringcomm.core.launch's report collection: a failure in one rank makes its peers fail too, and the
LaunchError names the failure raised first (whatever order the reports arrive in), after the
other ranks' reports came in, listing the ranks that failed after it."""
import os
import queue
import time

import pytest

from ringcomm.core.launch import LaunchError, collect, spawn


class _Proc:
    def __init__(self, exitcode=None):
        self.exitcode = exitcode


def _queue(*reports):
    q = queue.Queue()
    for r in reports:
        q.put(r)
    return q


def test_the_failure_raised_first_is_reported_whatever_the_arrival_order():
    q = _queue((0, False, b"", "Traceback...\nPeerFailureError: cannot open rank 2's shared memory",
                "PeerFailureError", 20.0),
               (1, True, b"\x80\x04K\x01.", "", "", 0.0),
               (2, False, b"", "Traceback...\nValueError: the cause", "ValueError", 10.0))
    with pytest.raises(LaunchError) as e:
        collect(q, [_Proc(), _Proc(), _Proc()], 30.0, "test", lambda ranks: "")
    assert e.value.rank == 2 and e.value.exc_type == "ValueError"
    text = str(e.value)
    assert text.startswith("test: rank 2 failed with ValueError:") and "the cause" in text
    assert "after it, these ranks failed too: rank 0 (PeerFailureError: cannot open rank 2's" in text


def test_results_in_rank_order_and_a_rank_that_exits_silently():
    q = _queue((1, True, b"\x80\x04K\x0b.", "", "", 0.0), (0, True, b"\x80\x04K\x0a.", "", "", 0.0))
    assert collect(q, [_Proc(), _Proc()], 30.0, "test", lambda ranks: "") == [10, 11]
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match=r"test: rank 1 exited with code -9 without reporting"):
        collect(_queue((0, True, b"\x80\x04K\x0a.", "", "", 0.0)), [_Proc(), _Proc(-9)], 30.0, "test",
                lambda ranks: "")
    assert time.monotonic() - t0 < 10.0
    assert collect(_queue((0, True, b"\x80\x04K\x0a.", "", "", 0.0)), [_Proc(), _Proc(-9)], 30.0, "test",
                   lambda ranks: "", may_die=[1]) == [10, None]


def _cause_then_effect(rank, world):
    if rank == 1:
        raise ValueError("rank 1: the cause")
    if rank == 2:
        os._exit(7)
    time.sleep(0.5)
    raise RuntimeError("rank 0: an effect, raised later")


@pytest.mark.timeout(120)
def test_spawn_waits_for_the_other_reports_and_names_the_first_failure():
    with pytest.raises(LaunchError) as e:
        spawn(_cause_then_effect, 3, timeout=60)
    text = str(e.value)
    # The ranks start one after another: rank 1's failure may come before rank 2's exit or after.
    assert e.value.rank in (1, 2), text
    assert "rank 0 (RuntimeError: rank 0: an effect, raised later)" in text
    assert "rank 1: the cause" in text and "rank 2 " in text and "exited with code 7" in text


def _sleeps_past_the_timeout(rank, world):
    time.sleep(60)


@pytest.mark.timeout(60)
def test_a_run_past_its_timeout_names_where_each_rank_was():
    with pytest.raises(LaunchError) as e:
        spawn(_sleeps_past_the_timeout, 2, timeout=3)
    text = str(e.value)
    assert "timed out after 3 s; ranks still running: [0, 1]" in text, text
    for r in (0, 1):
        assert f"--- rank {r} stack ---" in text, text
    assert text.count("in _sleeps_past_the_timeout") == 2, text


def _init_mpi_alone(rank, world):
    from mpi4py import MPI  # MPI_Init without mpiexec: a singleton with a /dev/shm segment
    assert MPI.COMM_WORLD.Get_size() == 1
    return os.getpid()


@pytest.mark.timeout(120)
def test_a_rank_that_initialized_mpi_on_its_own_leaves_no_segment():
    """Lightning's MPI detection (and any library importing mpi4py.MPI) initializes MPI in a rank
    that mpiexec did not start; MPICH then holds /dev/shm/mpich_shm_<pid in hex>_0 until
    MPI_Finalize, which mpi4py registers with atexit."""
    pytest.importorskip("mpi4py")
    pids = spawn(_init_mpi_alone, 2, timeout=60)
    left = [f"mpich_shm_{p:x}_0" for p in pids if os.path.exists(f"/dev/shm/mpich_shm_{p:x}_0")]
    assert left == []
