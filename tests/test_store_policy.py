"""Stores into peers' slots: the streaming copy (bit-exact, every alignment) and the policy that
measures cached against streaming stores per size class (comm/store_policy.h)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from ringcomm import _C

MiB = 1 << 20


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("n", [0, 1, 15, 4095, 4096, 4097, 65536 + 37])
def test_copy_to_peer_is_memcpy(n, stream):
    rng = np.random.default_rng(n)
    for dshift in (0, 1, 7, 16):
        for sshift in (0, 3):
            src_base = rng.integers(0, 256, n + 64, dtype=np.uint8)
            dst_base = np.zeros(n + 64, dtype=np.uint8)
            src = src_base[sshift:sshift + n]
            dst = dst_base[dshift:dshift + n]
            _C._copy_to_peer(dst, src, stream)
            assert np.array_equal(dst, src), (n, dshift, sshift)
            assert not dst_base[:dshift].any() and not dst_base[dshift + n:].any(), "wrote outside dst"


def trace(policy, bytes_, cost):
    """Run 40 collectives of `bytes_` where cost(stream, i) is the time taken; return the choices."""
    out = []
    for i in range(40):
        stream, cls = policy.choose(bytes_)
        out.append(stream)
        if cls >= 0:
            policy.record(stream, cls, bytes_, cost(stream, i))
    return out


def test_policy_measures_both_then_runs_the_faster_and_probes():
    p = _C._StorePolicy()
    # streaming twice as fast: call 0 (warm-up) and 1 cached, 2 streaming, then streaming except
    # every 16th call (a probe of cached stores).
    got = trace(p, 4 * MiB, lambda s, i: 1000 if s else 2000)
    assert got[:3] == [False, False, True]
    assert all(got[i] == (i % 16 != 0) for i in range(3, 40)), got
    # cached twice as fast (another size class, its own measurements): cached, probing streaming.
    got = trace(p, 64 * MiB, lambda s, i: 2000 if s else 1000)
    assert got[:3] == [False, False, True]
    assert all(got[i] == (i % 16 == 0) for i in range(3, 40)), got


def test_policy_follows_a_change_of_state():
    p = _C._StorePolicy()
    # Cached is faster until call 20, then three times slower: once its measured cost passes
    # streaming's (remembered from the probes), the policy switches, and probes cached stores.
    got = trace(p, 8 * MiB, lambda s, i: (2000 if s else 1000) if i < 20 else (1000 if s else 3000))
    assert got[3:16] == [False] * 13 and got[16] is True and got[17:20] == [False] * 3
    first = got.index(True, 20)
    assert first <= 23, got
    assert all(got[i] == (i % 16 != 0) for i in range(first, 40)), got
    # and back: streaming becomes slow, cached fast again; the next cached probe switches back.
    got = trace(p, 8 * MiB, lambda s, i: 5000 if s else 1000)
    assert got[-1] is False and got.count(True) <= 3, got


def test_policy_leaves_small_collectives_cached():
    p = _C._StorePolicy()
    assert all(p.choose(100 * 1024) == (False, -1) for _ in range(20))
    assert p.choose(0) == (False, -1)


def _policy_in_subprocess(env, code):
    full = dict(os.environ, **env)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=60)
    return r


@pytest.mark.parametrize("mode,expect", [("on", True), ("off", False)])
def test_policy_knob_forces_a_way(mode, expect):
    code = ("from ringcomm import _C; p = _C._StorePolicy(); "
            "print(all(p.choose(b)[0] == %s for b in [8 << 20] * 40 + [1024, 0]))" % expect)
    r = _policy_in_subprocess({"RINGCOMM_STREAM": mode}, code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True"]


def test_policy_keeps_kinds_of_collective_apart():
    p = _C._StorePolicy()
    # kind 1 finds streaming faster, kind 4 (same size) cached: each keeps its own choice.
    for i in range(20):
        for kind, fast_stream in ((1, True), (4, False)):
            stream, cls = p.choose(4 * MiB, kind)
            if cls >= 0:
                p.record(stream, cls, 4 * MiB, 1000 if stream == fast_stream else 3000)
    assert p.choose(4 * MiB, 1)[0] is True and p.choose(4 * MiB, 4)[0] is False


def test_policy_bad_knob_raises():
    r = _policy_in_subprocess({"RINGCOMM_STREAM": "sometimes"},
                              "from ringcomm import _C\ntry:\n  _C._StorePolicy()\nexcept Exception as e:\n"
                              "  print(type(e).__name__, e)")
    assert "InvalidArgumentError" in r.stdout and "RINGCOMM_STREAM" in r.stdout, r.stdout + r.stderr
