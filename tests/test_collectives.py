"""Every collective x dtype x op x count, numpy and torch inputs, world sizes 1-4, against numpy.
One group of ranks per world size runs all cases (spawning is the expensive part)."""
import pytest

import ranks
from mp_cases import run_collective_configs

torch = pytest.importorskip("torch")


CONFIGS = ["tiny-ring", "tiny-direct", "default", "streaming"]


def _config_args(config):
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
    return slot_bytes, nslots, libs, algo, config == "tiny-direct", env


def _group(world):
    """Every config's (failures, digests) per rank, from ONE group of `world` ranks (each config on
    a communicator of its own, created under its knobs)."""
    def start():
        with ranks.temp_dir("rc-test-store-") as d:
            return ranks.run(run_collective_configs, world, ({c: _config_args(c) for c in CONFIGS},),
                             timeout=560, env={"RC_TEST_STORE": d})
    return ranks.once(("collectives", world), start, f"the world-{world} group")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("config", CONFIGS)
def test_all_collectives(world, config):
    results = [per_rank[config] for per_rank in _group(world)]
    failures = [f for fs, _ in results for f in fs]
    assert not failures, "\n".join(failures[:30])
    # Floating results bit-identical on every rank.
    base = results[0][1]
    for r, (_, d) in enumerate(results[1:], 1):
        assert d == base, f"rank {r}'s all_reduce results differ bitwise from rank 0's"
