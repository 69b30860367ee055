"""Stores into peers' slots: the streaming copy (bit-exact, every alignment) and the static store
policy of the selection (csrc/comm/selection.h): RINGCOMM_STREAM=off|on|auto, auto streaming from
RINGCOMM_STREAM_MIN_BYTES up, the same rule on every rank (the choice travels in the header)."""
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


def _stores(env, calls):
    """The store names _C._select gives for `calls` [(collective, bytes, world)] under `env`."""
    code = ("import sys, json\nfrom ringcomm import _C\n"
            "print(json.dumps([_C._select(c, b, w)[2] for c, b, w in json.loads(sys.argv[1])]))")
    import json
    full = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_")}
    full.update(env)
    r = subprocess.run([sys.executable, "-c", code, json.dumps(calls)], capture_output=True, text=True,
                       env=full, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


SIZES = [0, 4096, 256 << 10, MiB, 16 * MiB, 64 * MiB, 256 * MiB]


def test_auto_never_streams_in_the_measured_range():
    # auto's default threshold lies above every size measured (256 KiB - 256 MiB, 2 ranks).
    calls = [(c, b, w) for c in ("all_reduce", "reduce_scatter", "all_gather", "broadcast") for b in SIZES
             for w in (2, 4)]
    assert set(_stores({"RINGCOMM_STREAM": "auto"}, calls)) == {"cached"}
    assert _stores({"RINGCOMM_STREAM": "auto"}, [("all_reduce", 1 << 30, 2)]) == ["streaming"]


def test_adapt_the_default_starts_cached():
    # the selection gives cached stores; the communicator's policy (comm/store_adapt.h, tested in
    # test_store_adapt.py) picks each call's store as it runs
    calls = [(c, b, 2) for c in ("all_reduce", "all_gather") for b in SIZES]
    assert set(_stores({}, calls)) == {"cached"}


def test_auto_streams_from_the_threshold_up():
    calls = [("all_reduce", b, 2) for b in (1, MiB - 1, MiB, 4 * MiB)] + [("all_to_all", 64 * MiB, 2),
                                                                           ("barrier", 0, 2)]
    got = _stores({"RINGCOMM_STREAM": "auto", "RINGCOMM_STREAM_MIN_BYTES": "1M"}, calls)
    # all_to_all's per-rank sizes differ, so its size for the rule is 0: cached under auto
    assert got == ["cached", "cached", "streaming", "streaming", "cached", "cached"]


@pytest.mark.parametrize("mode,want", [("on", "streaming"), ("off", "cached")])
def test_knob_forces_a_way(mode, want):
    calls = [("all_reduce", b, 2) for b in (1024, 8 * MiB)] + [("all_to_all", 0, 3), ("gather", 100, 3)]
    assert _stores({"RINGCOMM_STREAM": mode, "RINGCOMM_STREAM_MIN_BYTES": "0"}, calls) == [want] * 4
    # the CUDA communicator writes its slots with cached stores whatever the knob says
    assert _C._select("all_reduce", 8 * MiB, 2, "cuda")[2] == "cached"


def test_bad_knob_raises(monkeypatch):
    import ringcomm
    monkeypatch.setenv("RINGCOMM_STREAM", "sometimes")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_STREAM"):
        _C._select("all_reduce", 1024, 2)
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_STREAM"):
        _C.Communicator(0, 1, 10.0)
    monkeypatch.setenv("RINGCOMM_STREAM", "auto")
    monkeypatch.setenv("RINGCOMM_STREAM_MIN_BYTES", "-1")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_STREAM_MIN_BYTES"):
        _C._select("all_reduce", 1024, 2)
