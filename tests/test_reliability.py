"""Reliability of the core: saturating deadlines, counter wrap-around, a small /dev/shm, closed
peers, close() racing a call, attach checks, fork after init. Every case is checked against a
value computed here (numpy sums) or an expected typed error."""
import shutil

import pytest

from ringcomm.launch import spawn
import fault_cases


@pytest.mark.timeout(90)
@pytest.mark.parametrize("timeout", [float("inf"), 1e10, 1e300])
def test_huge_timeout_waits_for_a_late_peer(timeout, store_env):
    res = spawn(fault_cases.huge_timeout, 2, args=(timeout, 0.5), timeout=80, env=store_env)
    for r, out in enumerate(res):
        assert out[0] == "ok", (r, out)
        assert out[1] == 3.0 and out[2] == [4.0] * 8, (r, out)
    # Rank 0 waited for the late rank 1 instead of raising at once.
    assert res[0][3] >= 0.3, res[0]



def test_nslots_must_be_a_power_of_two(monkeypatch):
    import ringcomm
    for k in [k for k in __import__("os").environ if k.startswith("RINGCOMM_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("RINGCOMM_NSLOTS", "6")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_NSLOTS must be .*a power of two.*got 6"):
        ringcomm.init(rank=0, world_size=1)
    monkeypatch.setenv("RINGCOMM_NSLOTS", "16")
    comm = ringcomm.init(rank=0, world_size=1)
    comm.close()


def test_board_word_alternates_entries_across_the_wrap():
    from ringcomm import _C
    for start in (1, 2**32 - 6, 2 * (2**32 - 2) - 3, 2**33 + 5, 2**63):
        words = [_C._board_seq_of(s) for s in range(start, start + 12)]
        for s, w in zip(range(start, start + 12), words):
            assert 1 <= w <= 2**32 - 1, (s, w)
            assert w & 1 == s & 1, (s, w)  # the entry alternates with the collective
        assert all(a != b for a, b in zip(words, words[1:])), words


@pytest.mark.timeout(90)
@pytest.mark.parametrize("last_seq", [2**32 - 2, 2 * (2**32 - 2) - 1])
def test_collectives_across_the_board_wrap(last_seq, store_env):
    res = spawn(fault_cases.board_wrap, 2, args=(last_seq,), timeout=80, env=store_env)
    want = [[3.0 + 2 * i] * (10 + i) for i in range(4)]
    for r, out in enumerate(res):
        assert out[0] == "ok", (r, out)
        assert out[1] == want, (r, out)
        assert out[2] == last_seq + 7, (r, out)


@pytest.mark.timeout(90)
def test_closed_peer_is_closed_not_dead(store_env):
    world = 3
    res = spawn(fault_cases.closed_peer, world, timeout=80, env=store_env)
    assert res[2] == ("closed", [3.0] * 4), res[2]
    for r in (0, 1):
        out = res[r]
        assert out["first"] == [3.0] * 4, (r, out)
        assert out["p2p"] == ("sent" if r == 0 else True), (r, out)
        kind, msg = out["coll"]
        assert kind == "PeerFailureError", (r, out)
        assert "rank 2" in msg and "closed" in msg and "died" not in msg, (r, msg)
        assert out["coll_s"] < 10.0, (r, out)


_SMALL_SHM_SCRIPT = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
os.environ["RC_TEST_STORE"] = sys.argv[2]
import fault_cases
print("RESULT " + json.dumps([fault_cases.small_shm(0, 1)]))
"""


@pytest.mark.timeout(120)
def test_small_dev_shm_fails_at_init_with_a_clear_error(store_env, tmp_path):
    import os
    import subprocess
    import sys
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1)")
    probe = subprocess.run([unshare, "-m", "sh", "-c", "mount -t tmpfs -o size=4M tmpfs /dev/shm"],
                           capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("private mount namespaces are not permitted here: " + probe.stderr.decode(errors="replace"))
    script = tmp_path / "small_shm.py"
    script.write_text(_SMALL_SHM_SCRIPT)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    cmd = ("mount -t tmpfs -o size=4M tmpfs /dev/shm && exec \"$0\" \"$@\"")
    r = subprocess.run([unshare, "-m", "sh", "-c", cmd, sys.executable, str(script), tests_dir,
                        store_env["RC_TEST_STORE"]], capture_output=True, text=True, timeout=100)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    import json
    res = json.loads(lines[-1][len("RESULT "):])
    assert isinstance(res, list), res  # a string: a rank died (SIGBUS) or hung
    failed_init = [out for out in res if out[0] == "init"]
    assert failed_init, res
    for out in res:
        phase, kind, typed, msg = out
        assert phase == "init" and typed, res
        if "/dev/shm" in msg and "bytes" in msg:
            assert "--shm-size" in msg and "RINGCOMM_SLOT_BYTES" in msg and "RINGCOMM_NSLOTS" in msg, msg
    # At least one rank ran out of space itself and says so; the others may report its failure.
    assert any("--shm-size" in out[3] for out in res), res
