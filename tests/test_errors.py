"""Error codes: the C++ ErrorCode table, the bindings' code -> class table and ringcomm.core.errors'
BY_CODE agree; every C++ kind thrown through the bindings arrives as its Python class; the
value-capturing checks RC_CHECK_EQ/NE/LT/LE/GT/GE decide like Python's operators and print both
values; Work.exception() maps a failed collective's code to the same class the synchronous call
raises."""
import operator
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ringcomm
from ringcomm import _C, _C_test
from ringcomm.core import errors

# The kinds as documented in csrc/common/errors.h and the README, independently of both tables.
EXPECTED = {
    "Error": (0, "RingcommError"),
    "InvalidArgument": (1, "InvalidArgumentError"),
    "Timeout": (2, "TimeoutError"),
    "PeerFailure": (3, "PeerFailureError"),
    "Mismatch": (4, "MismatchError"),
    "Unsupported": (5, "UnsupportedError"),
    "Closed": (6, "ClosedError"),
}


def test_cxx_codes_are_the_documented_ones():
    assert _C_test.error_codes() == {name: code for name, (code, _) in EXPECTED.items()}


def test_bindings_table_and_python_table_agree():
    cxx = _C.error_class_names()
    assert set(cxx) == set(errors.BY_CODE) == set(_C_test.error_codes().values())
    for code, cls in errors.BY_CODE.items():
        assert cxx[code] == cls.__name__
        assert getattr(ringcomm, cls.__name__) is cls
        assert errors.CODE_OF[cls] == code
    assert len(set(errors.BY_CODE.values())) == len(errors.BY_CODE)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_kind_arrives_as_its_class(name):
    code, cls_name = EXPECTED[name]
    with pytest.raises(ringcomm.RingcommError) as ei:
        _C_test.raise_error(code, f"boom {name}")
    assert type(ei.value) is getattr(ringcomm, cls_name)
    assert str(ei.value) == f"boom {name}"
    assert errors.code_of(ei.value) == code
    made = errors.from_code(code, "m")
    assert type(made) is type(ei.value) and str(made) == "m"


def test_python_base_classes():
    assert issubclass(ringcomm.InvalidArgumentError, ValueError)
    assert issubclass(ringcomm.UnsupportedError, TypeError)
    assert issubclass(ringcomm.TimeoutError, TimeoutError)
    assert all(issubclass(c, ringcomm.RingcommError) for c in errors.BY_CODE.values())
    assert type(errors.from_code(99, "x")) is ringcomm.RingcommError
    assert errors.code_of(KeyError()) == 0


def test_unknown_code_is_rejected():
    with pytest.raises(ringcomm.InvalidArgumentError, match="no error code 7"):
        _C_test.raise_error(7)


OPS = {"EQ": ("==", operator.eq), "NE": ("!=", operator.ne), "LT": ("<", operator.lt),
       "LE": ("<=", operator.le), "GT": (">", operator.gt), "GE": (">=", operator.ge)}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("a,b", [(1, 2), (2, 2), (3, 2), (-(1 << 40), 1 << 40)])
def test_value_capturing_checks(op, a, b):
    sym, ref = OPS[op]
    if ref(a, b):
        _C_test.check_op(op, a, b)  # passes: no exception
        return
    with pytest.raises(ringcomm.InvalidArgumentError) as ei:
        _C_test.check_op(op, a, b)
    msg = str(ei.value)
    assert f"check failed: a {sym} b, with a = {a}, b = {b}" in msg
    assert "errors_py.cpp:" in msg  # file:line


_MISMATCH_RANKS = textwrap.dedent("""
    import numpy as np, ringcomm

    def body(comm):
        x = np.ones(4 + comm.rank, dtype=np.float32)   # counts differ: a Mismatch on both ranks
        h = comm.all_reduce(x, async_op=True)
        try:
            h.wait()
            raised = None
        except ringcomm.RingcommError as e:
            raised = e
        got = h.exception()
        y = np.full(3, comm.rank + 1.0)
        comm.all_reduce(y)                                # still usable after a Mismatch
        return (type(raised).__name__, type(got).__name__, str(got) == str(raised), y.tolist())

    if __name__ == "__main__":
        print(ringcomm.launch(body, 2, timeout=120))
""")


def test_failed_work_exception_uses_the_code(tmp_path):
    """A collective that fails inside the core on two ranks: the async handle's exception() (its
    error code) and wait() (the translated C++ exception) give the same class and message."""
    script = tmp_path / "ranks.py"
    script.write_text(_MISMATCH_RANKS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_")}
    env["PYTHONPATH"] = str(Path(ringcomm.__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    row = ("MismatchError", "MismatchError", True, [3.0, 3.0, 3.0])
    assert r.stdout.strip() == str([row, row])


def test_work_exception_none_on_success():

    with ringcomm.init(rank=0, world_size=1) as comm:
        x = np.ones(4, dtype=np.float32)
        h = comm.all_reduce(x, async_op=True)
        h.wait()
        assert h.exception() is None
        np.testing.assert_array_equal(x, np.ones(4, dtype=np.float32))
    with pytest.raises(ringcomm.ClosedError):
        comm.all_reduce(x)
