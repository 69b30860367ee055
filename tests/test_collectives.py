"""Every collective x dtype x op x count, numpy and torch inputs, world sizes 1-4, against numpy.
One group of ranks per world size runs all cases (spawning is the expensive part)."""
import os

import pytest

from ringcomm.launch import spawn
from mp_cases import run_collective_cases

torch = pytest.importorskip("torch")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("config", ["tiny-ring", "tiny-direct", "default", "streaming"])
def test_all_collectives(world, config, store_env):
    # tiny: 256-byte slots, 2 per channel - every case of 3001 elements streams through many slots
    # and the ring runs at the minimum slot count its deadlock argument needs. The all-reduce runs
    # once per algorithm (ring / direct); "default" is what users get (auto choice, 256 KiB slots).
    # streaming: every slot write of 4 KiB or more with streaming stores (kernels/copy_cpu.h),
    # 8 KiB slots so that pieces of 3001 elements have full and partial, aligned and unaligned parts.
    slot_bytes, nslots = {"streaming": (8192, 2)}.get(config, (256, 2) if config.startswith("tiny")
                                                      else (256 * 1024, 8))
    libs = ["numpy", "torch"] if config.startswith("tiny") else ["torch"]
    algo = {"tiny-ring": "ring", "tiny-direct": "direct", "default": "auto", "streaming": "ring"}[config]
    env = {"RINGCOMM_STREAM": "on", "RINGCOMM_STREAM_MIN_BYTES": "0"} if config == "streaming" else {}
    results = spawn(run_collective_cases, world, (slot_bytes, nslots, libs, algo, config == "tiny-direct", env),
                    timeout=280, env=store_env)
    failures = [f for fs, _ in results for f in fs]
    assert not failures, "\n".join(failures[:30])
    # Floating results bit-identical on every rank.
    base = results[0][1]
    for r, (_, d) in enumerate(results[1:], 1):
        assert d == base, f"rank {r}'s all_reduce results differ bitwise from rank 0's"
