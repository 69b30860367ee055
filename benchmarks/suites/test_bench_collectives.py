"""pytest-benchmark suites over the bench harness: ringcomm beside gloo, 2 local ranks, float32,
at representative sizes. Not part of the default test command; run with

    pytest benchmarks/suites --benchmark-only                # add --benchmark-json out.json to keep figures

Rank 0 is this process (pytest-benchmark times its calls); rank 1 is a spawned follower making
the same calls (``ringcomm.bench.group.LocalGroup``). Every case first runs the same correctness
check as ``python -m ringcomm.bench``. Each benchmark's extra_info carries size, algbw and busbw
(from the median). Compare within a group: ``--benchmark-group-by=group``. MPI rows need
mpiexec and are measured by ``python -m ringcomm.bench`` only.
"""
import importlib.util

import pytest

from ringcomm.bench.peers import probe
from ringcomm.bench.spec import bus_factor, format_size

WORLD = 2
KiB, MiB = 1 << 10, 1 << 20
LIBS = [lib for lib in ("ringcomm", "gloo") if probe(lib) is None]

pytestmark = pytest.mark.skipif(
    "ringcomm" not in LIBS or importlib.util.find_spec("pytest_benchmark") is None,
    reason="needs the ringcomm API and pytest-benchmark")


@pytest.fixture(scope="module")
def group():
    from ringcomm.bench.group import LocalGroup
    g = LocalGroup(WORLD, LIBS)
    yield g
    g.close()


def _bench(benchmark, group, lib, op, mode, size, redop="sum"):
    if lib not in LIBS:
        pytest.skip(f"{lib} unavailable: {probe(lib)}")
    m = group.start(lib, op, mode, "float32", redop, size, budget=0.5 if size < 16 * MiB else 1.0,
                    min_calls=20)
    made = 0

    def call():
        nonlocal made
        made += 1
        m.fn()

    warm = min(3, m.calls // 3)
    benchmark.group = f"{op} float32 {format_size(m.size)}"
    benchmark.extra_info.update(lib=lib, op=op, mode=mode, size=m.size, count=m.count,
                                world_size=WORLD)
    try:
        benchmark.pedantic(call, rounds=m.calls - warm, warmup_rounds=warm, iterations=1)
    finally:
        wrong = group.finish(m, calls_made=made)
    assert wrong == 0, f"{lib} {op} {size}: {wrong} wrong elements"
    stats = getattr(benchmark, "stats", None)
    if stats is not None and getattr(stats, "stats", None) is not None:
        median = stats.stats.median
        algbw = m.size / median / 1e9
        benchmark.extra_info.update(time_us=median * 1e6, algbw_gbps=algbw,
                                    busbw_gbps=algbw * bus_factor(op, WORLD))


# The peers' (torch.distributed's) forms: all_reduce in place, the chunked ones out of place.
@pytest.mark.parametrize("size", [4 * KiB, 64 * KiB, MiB, 16 * MiB, 64 * MiB], ids=format_size)
@pytest.mark.parametrize("lib", ["ringcomm", "gloo"])
def test_all_reduce(benchmark, group, lib, size):
    _bench(benchmark, group, lib, "all_reduce", "ip", size)


@pytest.mark.parametrize("size", [4 * KiB, MiB, 64 * MiB], ids=format_size)
@pytest.mark.parametrize("lib", ["ringcomm", "gloo"])
def test_reduce_scatter(benchmark, group, lib, size):
    _bench(benchmark, group, lib, "reduce_scatter", "oop", size)


@pytest.mark.parametrize("size", [4 * KiB, MiB, 64 * MiB], ids=format_size)
@pytest.mark.parametrize("lib", ["ringcomm", "gloo"])
def test_all_gather(benchmark, group, lib, size):
    _bench(benchmark, group, lib, "all_gather", "oop", size)


@pytest.mark.parametrize("size", [4 * KiB, MiB], ids=format_size)
@pytest.mark.parametrize("lib", ["ringcomm", "gloo"])
def test_broadcast(benchmark, group, lib, size):
    _bench(benchmark, group, lib, "broadcast", "ip", size)


@pytest.mark.parametrize("size", [MiB, 64 * MiB], ids=format_size)
def test_all_reduce_out_of_place(benchmark, group, size):
    _bench(benchmark, group, "ringcomm", "all_reduce", "oop", size)
