"""ringcomm.core.tables (dtype, reduce-op and collective codes, parsed from ringcomm/abi.h) against
what the C extension does with those codes: its collective table, its reduce kernels' (dtype, op)
switch (which must implement exactly the header's op-support rule), the element size the kernels
demand for each dtype code, and the results they compute (checked against numpy)."""
import numpy as np
import pytest

import ringcomm
from ringcomm import _C, _C_test
from ringcomm.core import tables
from ringcomm.core.arrays import as_buf


def test_collective_codes_are_the_cores():
    assert tables.COLL_CODES == dict(_C.COLL_CODES)


def test_dtype_codes_are_dense_and_named_once():
    assert [d.code for d in tables.DTYPES] == list(range(len(tables.DTYPES)))
    assert len(set(tables.DTYPE_NAMES)) == len(tables.DTYPES)
    assert tables.DTYPE_CODES == {d.name: d.code for d in tables.DTYPES}


def test_op_support_is_the_cores():
    for d in tables.DTYPES:
        for op in tables.ReduceOp:
            assert tables.op_supported(int(op), d.code) == _C_test.reduce_supported(d.code, int(op)), (d.name, op.name)


def test_codes_past_the_tables_are_unknown_to_the_core():
    a = np.zeros(4, np.float32)
    with pytest.raises(ringcomm.InvalidArgumentError, match="unknown dtype code"):
        _C._reduce(a, a.copy(), a.copy(), len(tables.DTYPES), 0)
    with pytest.raises(ringcomm.InvalidArgumentError, match="unknown reduce op code"):
        _C._reduce(a, a.copy(), a.copy(), 0, len(tables.ReduceOp))


def _host_array(d, values):
    """values (small non-negative integers) as the host representation of dtype d."""
    if d.name == "bfloat16":       # bf16 bits: the upper half of the float32 (exact for these)
        return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.asarray(values).astype(d.np_name)


def _from_host(d, arr):
    if d.name == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return arr.astype(np.float64)


@pytest.mark.parametrize("d", tables.DTYPES, ids=lambda d: d.name)
def test_itemsize_and_numpy_type_are_the_cores(d):
    a_vals, b_vals = [1, 0, 3, 1], [2, 1, 1, 0]
    a, b = _host_array(d, a_vals), _host_array(d, b_vals)
    assert a.itemsize == d.itemsize
    # The kernels accept exactly the table's element size for this code ...
    wrong = np.zeros(4, np.uint16 if d.itemsize != 2 else np.uint32)
    with pytest.raises(ringcomm.InvalidArgumentError, match=f"dtype needs {d.itemsize}"):
        _C._reduce(wrong, wrong.copy(), wrong.copy(), d.code, int(tables.ReduceOp.MAX))
    # ... and interpret the memory as the table's type (numpy is the reference).
    dst = np.empty_like(a)
    _C._reduce(dst, a, b, d.code, int(tables.ReduceOp.MAX))
    fa, fb = _from_host(d, a), _from_host(d, b)
    assert _from_host(d, dst).tolist() == np.maximum(fa, fb).tolist()
    if d.name != "bool":
        _C._reduce(dst, a, b, d.code, int(tables.ReduceOp.SUM))
        assert _from_host(d, dst).tolist() == (fa + fb).tolist()


def test_array_adapters_use_the_table():
    for d in tables.DTYPES:
        if d.np_name is None:
            continue
        b = as_buf(np.zeros(3, d.np_name))
        assert (b.code, b.dtype, b.nbytes) == (d.code, d.name, 3 * d.itemsize)
    torch = pytest.importorskip("torch")
    for tdt, code in tables.torch_dtype_codes().items():
        d = tables.DTYPES[code]
        assert str(tdt) == f"torch.{d.name}" and torch.empty(0, dtype=tdt).element_size() == d.itemsize
        assert as_buf(torch.zeros(3, dtype=tdt)).code == code


def test_reduce_op_names_and_codes():
    assert ringcomm.ReduceOp is tables.ReduceOp
    assert tables.OP_NAMES == ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR")
    for op in tables.ReduceOp:
        assert tables.op_code(op) == tables.op_code(int(op)) == tables.op_code(op.name.lower()) == int(op)
    for bad in ("median", 99, -1, None, 1.5j):
        with pytest.raises(ringcomm.InvalidArgumentError):
            tables.op_code(bad)


def test_torch_backend_maps_every_torch_op_onto_the_table():
    pytest.importorskip("torch")
    import torch.distributed as dist

    from ringcomm.torch import staging
    for name in tables.OP_NAMES:
        rop, factor = staging.reduce_op(getattr(dist.ReduceOp, name))
        assert (rop, factor) == (tables.ReduceOp[name], None)
    assert staging.SUPPORTED_DTYPES == frozenset(tables.torch_dtype_codes())


def test_cuda_kernels_support_the_tables_pairs():
    try:
        from ringcomm import _C_cuda_test
    except ImportError:
        pytest.skip("ringcomm was built without CUDA")
    for d in tables.DTYPES:
        for op in tables.ReduceOp:
            assert _C_cuda_test.reduce_supported(d.code, int(op)) == tables.op_supported(int(op), d.code), (d.name, op)
