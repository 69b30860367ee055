"""Reliability of the core: saturating deadlines, counter wrap-around, a small /dev/shm, closed
peers, close() racing a call, attach checks, fork after init. Every case is checked against a
value computed here (numpy sums) or an expected typed error."""
import shutil
import tempfile

import pytest

from ringcomm.launch import spawn
import fault_cases


@pytest.fixture
def env():
    d = tempfile.mkdtemp(prefix="rc-test-store-")
    yield {"RC_TEST_STORE": d}
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("timeout", [float("inf"), 1e10, 1e300])
def test_huge_timeout_waits_for_a_late_peer(timeout, env):
    res = spawn(fault_cases.huge_timeout, 2, args=(timeout, 0.5), timeout=80, env=env)
    for r, out in enumerate(res):
        assert out[0] == "ok", (r, out)
        assert out[1] == 3.0 and out[2] == [4.0] * 8, (r, out)
    # Rank 0 waited for the late rank 1 instead of raising at once.
    assert res[0][3] >= 0.3, res[0]

