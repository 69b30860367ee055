"""The ceiling as a pytest-benchmark suite: single-process memcpy (numpy.copyto into a
preallocated, page-aligned buffer), the roof of any shared-memory collective on this machine.
Same buffers as ``ringcomm.bench.memcpy``. ``pytest benchmarks/suites --benchmark-only``."""
import numpy as np
import pytest

from ringcomm.bench.memcpy import _aligned
from ringcomm.bench.spec import format_size

KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize("size", [4 * KiB, MiB, 16 * MiB, 64 * MiB, 256 * MiB], ids=format_size)
def test_memcpy(benchmark, size):
    src, dst = _aligned(size), _aligned(size)
    benchmark.group = f"memcpy {format_size(size)}"
    benchmark.extra_info["size"] = size
    benchmark(np.copyto, dst, src)
    assert np.array_equal(dst[:4096], src[:4096])
    stats = getattr(benchmark, "stats", None)
    if stats is not None and getattr(stats, "stats", None) is not None:
        benchmark.extra_info["gbps"] = size / stats.stats.median / 1e9
