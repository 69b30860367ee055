"""The synchronous entries (csrc/comm/sync_entry.h) and the single copy of the codes
(csrc/include/ringcomm/abi.h, copied into the package by the build).

- The plain API reaches the C++ entry with torch tensors in a fresh environment (an empty
  TORCH_EXTENSIONS_DIR, torch's backend autoload off so that nothing but ringcomm's own code
  could register a backend): it imports nothing of ringcomm.torch, registers no torch backend,
  builds nothing, and the entry's counter shows that it ran the calls.
- The codes, the op-support rule and the C ABI exist once: in the header, which ringcomm.core.tables
  parses and _C was compiled with; no other file of src/, bindings/ or csrc/ writes a table of
  them.
"""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ringcomm
from ringcomm import _C, _C_test
from ringcomm.core import tables
from sync_entry_cases import EntrySpy, issued

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "csrc" / "include" / "ringcomm" / "abi.h"
TRAMPOLINE = ROOT / "bindings" / "torch" / "trampoline.cpp"
OFFER_POINT = ROOT / "bindings" / "torch" / "offer_point.h"


def test_plain_api_reaches_the_entry_with_torch_tensors_in_a_fresh_environment(tmp_path):
    pytest.importorskip("torch")
    ext_dir = tmp_path / "torch_extensions"
    ext_dir.mkdir()
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(ext_dir), TORCH_DEVICE_BACKEND_AUTOLOAD="0",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"),
                                           os.environ.get("PYTHONPATH", "")]))
    script = textwrap.dedent("""
        import json, sys
        import ringcomm
        from ringcomm.core.launch import launch
        from sync_entry_cases import plain_api_torch
        res = launch(plain_api_torch, 2, timeout=120)
        import torch.distributed as dist
        res.append({"torch_modules": sorted(m for m in sys.modules if m.startswith("ringcomm.torch")),
                    "plugins": sorted(dist.Backend._plugins)})
        print(json.dumps(res))
    """)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=240, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-4000:]
    *ranks, parent = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    for r, res in enumerate(ranks):
        assert res["x_ok"] and res["bf16_ok"] and res["bcast_ok"], (r, res)
        assert res["entry_calls"] == 2, (r, res)               # both calls ran in the C++ entry
        assert res["torch_modules"] == [], (r, res)
        assert "RINGCOMM" not in res["plugins"] and "ringcomm" not in res["backend_list"], (r, res)
        assert res["ext_dir"] == [], (r, res)
    assert parent == {"torch_modules": [], "plugins": []}
    assert os.listdir(ext_dir) == []


def test_the_autoload_entry_point_is_what_registers_the_backend(tmp_path):
    """The fresh-environment test turns torch's backend autoload off; this shows why that is
    needed: with it on (where ringcomm's torch.backends entry point is installed) importing
    torch alone registers the backend, before ringcomm's API is used at all."""
    pytest.importorskip("torch")
    from importlib.metadata import entry_points
    if not any(ep.name == "ringcomm" for ep in entry_points(group="torch.backends")):
        pytest.skip("ringcomm's torch.backends entry point is not installed here")
    script = "import torch.distributed as d; print('RINGCOMM' in d.Backend._plugins)"
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    on = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    off = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert (on.stdout.strip(), off.stdout.strip()) == ("True", "False"), (on.stderr[-2000:], off.stderr[-2000:])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_reduce_scatter_and_all_gather_through_the_entry(world):
    pytest.importorskip("torch")
    from ringcomm.core.launch import launch
    from sync_entry_cases import scatter_gather
    for r, (wrong, taken, calls, outcome) in enumerate(launch(scatter_gather, world, timeout=280)):
        assert wrong == [], (r, wrong[:10])
        assert taken == {"reduce_scatter": calls, "all_gather": calls}, (r, taken, calls)
        assert outcome == ("own error" if r == world - 1 else "mismatch"), (r, outcome)


# ---- the single copy ---------------------------------------------------------------------------

def test_tables_are_the_headers_as_compiled_into_C():
    abi = _C_test.abi_tables()
    kinds = {"float": tables._KIND_FLOAT, "int": tables._KIND_INT, "bool": tables._KIND_BOOL}
    got = [(d.name, d.code, d.itemsize,
            kinds["float"] if d.is_float else kinds["int"] if d.is_int else kinds["bool"])
           for d in tables.DTYPES]
    assert got == [row[:4] for row in abi["dtypes"]]
    assert [(o.name, int(o)) for o in tables.ReduceOp] == [row[:2] for row in abi["ops"]]
    for name, dcode, _size, kind, _dl in abi["dtypes"]:
        for oname, ocode, okinds in abi["ops"]:
            assert tables.op_supported(ocode, dcode) == bool(okinds & kind), (name, oname)
    assert tables.COLL_CODES == dict(_C.COLL_CODES)
    assert Path(tables.ABI_HEADER).read_bytes() == HEADER.read_bytes()   # the package's copy


def _sources():
    for top in ("src", "bindings", "csrc"):
        for p in sorted((ROOT / top).rglob("*")):
            if p.suffix in (".py", ".h", ".cpp", ".cu", ".cuh") and p != HEADER and "_data" not in p.parts:
                yield p, p.read_text(encoding="utf-8", errors="replace")


# A hand-written table of the codes looks like one of these (each matched the copies that
# existed before the header: tables.py's rows and enum, trampoline.cpp's switch, its op rule,
# the restated C ABI struct, dtype.h's and coll.h's X-macro lists).
_DTYPE_NAMES = "|".join(d.name for d in tables.DTYPES)
_COPIES = {
    "a dtype name beside its code": re.compile(rf"[\"']({_DTYPE_NAMES})[\"']\s*[,:]\s*\d+\s*[,)}}]"),
    "an op enumerator with its code": re.compile(rf"\b({'|'.join(tables.OP_NAMES)})\s*=\s*\d"),
    "a collective name with its code": re.compile(
        rf"[\"']({'|'.join(tables.COLL_CODES)})[\"']\s*:\s*\d+\s*[,}}]"),
    "a torch ScalarType mapped to a number": re.compile(r"ScalarType::\w+\s*:\s*return\s+-?\d"),
    "an op-support rule by number": re.compile(r"\bop\s*[<>]=?\s*[1-9]|\bop\s*==\s*\d\s*&&"),
    "the C ABI struct": re.compile(r"struct\s+RcFastApi\s*\{"),
    "a code list": re.compile(r"#define\s+RC_(DTYPES|REDUCE_OPS|COLLECTIVES)\s*\("),
}


def test_no_second_copy_of_the_codes_the_rule_or_the_abi():
    found = []
    for path, text in _sources():
        for what, pat in _COPIES.items():
            for m in pat.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: {what}: {m.group(0)!r}")
    assert found == []
    header = HEADER.read_text()
    for what in ("the C ABI struct", "a code list"):
        assert _COPIES[what].search(header), what        # the patterns do match the one copy


def test_the_trampoline_takes_codes_and_abi_from_the_header(tmp_path, monkeypatch):
    """trampoline.cpp includes the header (no table of its own: see the test above), the JIT
    build puts the packaged header on the include path, and the header's bytes are part of the
    extension's name, so an edited header never loads a stale build."""
    pytest.importorskip("torch")
    src = TRAMPOLINE.read_text() + OFFER_POINT.read_text()
    assert '#include "ringcomm/abi.h"' in src and "RC_DTYPES(" in src
    from ringcomm.torch import extension
    assert Path(extension.INCLUDE, "ringcomm", "abi.h").read_bytes() == HEADER.read_bytes()
    assert Path(extension.SOURCE).read_bytes() == TRAMPOLINE.read_bytes()
    assert Path(extension.OFFER_POINT).read_bytes() == OFFER_POINT.read_bytes()
    assert Path(extension.HEADER) == Path(extension.INCLUDE, "ringcomm", "abi.h")
    name = extension.extension_name()
    edited = tmp_path / "abi.h"
    edited.write_bytes(HEADER.read_bytes() + b"\n")
    monkeypatch.setattr(extension, "HEADER", str(edited))
    assert extension.extension_name() != name


# ---- the entry's rule, as the bindings apply it ---------------------------------------------------

def test_entry_runs_what_it_takes_and_nothing_else(comm1):
    x, y = np.ones(6, np.float32), np.zeros(6, np.float32)
    assert issued(comm1, lambda: comm1._c.sync_all_reduce(x, None, 0)) == (True, 1)
    assert issued(comm1, lambda: comm1._c.sync_broadcast(x, 0)) == (True, 1)
    assert issued(comm1, lambda: comm1._c.sync_reduce_scatter(y, x, 0)) == (True, 1)
    assert issued(comm1, lambda: comm1._c.sync_all_gather(y, x)) == (True, 1)
    ro = np.zeros(6, np.float32)
    ro.flags.writeable = False
    declined = [
        lambda: comm1._c.sync_all_reduce(x[::2], None, 0),
        lambda: comm1._c.sync_all_reduce(x, None, int(tables.ReduceOp.BAND)),
        lambda: comm1._c.sync_broadcast(x, 1),
        lambda: comm1._c.sync_reduce_scatter(np.zeros(5, np.float32), x, 0),     # not its chunk
        lambda: comm1._c.sync_reduce_scatter(np.zeros(6, np.float64), x, 0),     # another dtype
        lambda: comm1._c.sync_reduce_scatter(y, x, int(tables.ReduceOp.BXOR)),
        lambda: comm1._c.sync_reduce_scatter(ro, x, 0),                          # read-only output
        lambda: comm1._c.sync_all_gather(np.zeros(5, np.float32), x),            # output too small
        lambda: comm1._c.sync_all_gather(ro, x),
        lambda: comm1._c.sync_all_gather(y[::1].reshape(2, 3).T, x),             # not compact
    ]
    for i, f in enumerate(declined):
        assert issued(comm1, f) == (False, 0), i                                # nothing done


def test_general_path_never_offers_the_entry(comm1):
    """Communicator.general(): the same collectives, validated and issued, the entry left out
    (for a caller whose call the entry declined already: the torch trampoline's)."""
    x, y = np.ones(6, np.float32), np.zeros(6, np.float32)
    g = comm1.general()
    with EntrySpy(comm1) as spy:
        before = comm1._c.next_seq()
        g.all_reduce(x)
        g.broadcast(x, root=0)
        g.reduce_scatter(y, x)
        g.all_gather(y, x)
        assert spy.offers == [] and comm1._c.next_seq() - before == 4
        assert (x == 1).all() and (y == 1).all()
        assert g.rank == comm1.rank and g.general() is g
        comm1.all_reduce(x)                                  # the public one offers, and it is taken
        assert spy.offers == [("all_reduce", True)]


def test_entry_rule_on_shapes_and_strides(comm1):
    """Compact row-major in the entry's sense: extents of 1 carry any stride, empty arrays are
    compact whatever their strides, anything else must step by the element size."""
    base = np.zeros((4, 6), np.float32)
    takes = [base, base[1:2], base[:, :6], base[:0, ::2], base.reshape(4, 1, 6)[:, :, :],
             np.zeros((3, 0, 5), np.int64)[:, :, ::2], np.zeros(()), np.zeros((1, 1))]
    declines = [base[:, :3], base[:, ::2], base.T, base[::2], np.zeros((2, 2, 2))[:, 0]]
    for a in takes:
        assert comm1._c.sync_all_reduce(a, None, 0) is True, (a.shape, a.strides)
    for a in declines:
        assert comm1._c.sync_all_reduce(a, None, 0) is False, (a.shape, a.strides)


def test_entry_rule_on_torch_tensors(comm1):
    torch = pytest.importorskip("torch")
    for name, code, *_ in _C_test.abi_tables()["dtypes"]:
        t = torch.ones(5, dtype=getattr(torch, name))
        for op in tables.ReduceOp:
            assert comm1._c.sync_all_reduce(t, None, int(op)) is tables.op_supported(int(op), code), (name, op)
        assert comm1._c.sync_broadcast(t, 0) is True
    declined = [torch.ones(10)[::2], torch.ones(4, 4).t(), torch.ones(3).to_sparse(),
                torch.ones(3, dtype=torch.int16), torch.ones(2, dtype=torch.complex64),
                torch.empty(3, device="meta"), torch.nn.Parameter(torch.ones(3)), [1.0], None, 3]
    for x in declined:
        assert comm1._c.sync_all_reduce(x, None, 0) is False, x
        assert comm1._c.sync_broadcast(x, 0) is False, x
    f = torch.ones(4)
    for out in (torch.ones(5), torch.ones(4, dtype=torch.float64), torch.ones(8)[::2], np.ones(4, np.float64)):
        assert comm1._c.sync_all_reduce(f, out, 0) is False
    o = np.zeros(4, np.float32)                      # a numpy output of a tensor's all_reduce
    assert comm1._c.sync_all_reduce(f, o, 0) is True and (o == 1).all()
    ro = np.ones(4, np.float32)
    ro.flags.writeable = False
    assert comm1._c.sync_all_reduce(ro, None, 0) is False          # in place into read-only memory
    assert comm1._c.sync_all_reduce(ro, np.zeros(4, np.float32), 0) is True   # read-only input
    buf = torch.zeros(16)
    with pytest.raises(ringcomm.InvalidArgumentError, match="overlap partially"):
        comm1._c.sync_all_reduce(buf[0:8], buf[4:12], 0)           # taken; the core refuses
