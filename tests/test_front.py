"""The communicator front (ringcomm.core.front.CommunicatorBase) validates once for every back end:
the same bad call raises the same error class with the same message on the host shared-memory
communicator, the hierarchical one (2 ranks faked as 2 nodes) and the CUDA one (GPU only), and
the expected class (checked against a table written here, independently of the code)."""
import shutil
import tempfile

import pytest

import ringcomm
import ranks

from front_cases import cases, host_only_cases, run

torch = pytest.importorskip("torch")

EXPECTED = {
    "unsupported op for dtype": "UnsupportedError", "unknown op": "InvalidArgumentError",
    "all_reduce count": "InvalidArgumentError", "all_reduce dtype": "InvalidArgumentError",
    "unsupported dtype": "UnsupportedError", "non-contiguous": "InvalidArgumentError",
    "broadcast root": "InvalidArgumentError", "reduce root": "InvalidArgumentError",
    "reduce_scatter count": "InvalidArgumentError", "reduce_scatter dtype": "InvalidArgumentError",
    "all_gather output": "InvalidArgumentError", "all_to_all uneven": "InvalidArgumentError",
    "all_to_all splits": "InvalidArgumentError", "gather size": "InvalidArgumentError",
    "scatter without input": "InvalidArgumentError", "send to self": "InvalidArgumentError",
    "recv from outside": "InvalidArgumentError", "read-only in place": "InvalidArgumentError",
    "read-only recv": "InvalidArgumentError", "stream on host arrays": "InvalidArgumentError",
}


def _outcomes(kind, lib):
    d = tempfile.mkdtemp(prefix=f"rc-front-{kind}-")
    try:
        return ranks.run(run, 2, (d, kind, lib), timeout=240)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_case_table_is_complete():
    names = [n for n, _ in cases(None) + host_only_cases()]
    assert sorted(names) == sorted(EXPECTED)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_host_and_hierarchical_raise_alike(lib):
    host, hier = _outcomes("host", lib), _outcomes("hier", lib)
    for rank in range(2):
        assert "_kind" not in host[rank] and "_kind" not in hier[rank], (host[rank], hier[rank])
        assert set(host[rank]) == set(hier[rank])
        for name, (cls, msg) in host[rank].items():
            assert cls == EXPECTED[name], (name, cls, msg)
            assert msg.startswith("ringcomm: "), (name, msg)
            assert hier[rank][name] == (cls, msg), (name, host[rank][name], hier[rank][name])


@pytest.mark.timeout(600)
def test_cuda_raises_like_host():
    import ringcomm.cuda
    if not ringcomm.cuda.is_available():
        pytest.skip(f"CUDA unavailable: {ringcomm.cuda.unavailable_reason()}")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    host, cuda = _outcomes("host", "torch"), _outcomes("cuda", "torch")
    for rank in range(2):
        assert "_kind" not in cuda[rank], cuda[rank]
        for name, outcome in host[rank].items():
            assert outcome[0] == EXPECTED[name], (name, outcome)
            assert cuda[rank][name] == outcome, (name, outcome, cuda[rank][name])
