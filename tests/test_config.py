"""The knob registry (csrc/common/knobs.def via ringcomm.core.config; docs/knobs.md is generated from it,
checked by tests/test_docs.py): every RINGCOMM_* name in the sources is registered, the typed
struct (ringcomm.core.config.read(), rc::Knobs) has one field per runtime knob with the values the
by-name lookup gives, values parse with the registry's rules (checked against independent Python
parsing), config() and `python -m ringcomm.core.config` report them, nothing reads a knob at import
time, and RINGCOMM_DEBUG=INFO/TRACE log from a spawned rank's C++ core."""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ringcomm
from ringcomm.core import config

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(ringcomm.__file__).resolve().parent
TYPES = {"int", "float", "bytes", "str", "choice"}


@pytest.fixture
def clean_env(monkeypatch):
    """No RINGCOMM_* knob set (os.environ writes through to the C environment the core reads)."""
    for k in list(os.environ):
        if k.startswith("RINGCOMM_"):
            monkeypatch.delenv(k)
    return monkeypatch


def _registry():
    return {k["name"]: k for k in config.knobs()}


def test_registry_entries_are_well_formed():
    reg = config.knobs()
    names = [k["name"] for k in reg]
    assert len(names) == len(set(names)), "a knob is registered twice"
    for k in reg:
        assert re.fullmatch(r"RINGCOMM_[A-Z0-9_]+", k["name"])
        assert k["type"] in TYPES, k
        assert k["doc"].strip(), k
        assert bool(k["choices"]) == (k["type"] == "choice"), k
        if k["type"] == "choice":
            assert k["default"] in k["choices"], k


def _test_registry():
    """The test build's knobs (csrc/common/test_knobs.def, through ringcomm._C_test)."""
    from ringcomm import _C_test
    return {k["name"]: k for k in _C_test.test_knobs()}


def test_test_knobs_are_the_test_builds_alone():
    """test_knobs.def's lines are what ringcomm._C_test lists, RINGCOMM_TEST_* named, and none
    of them is a knob of the product's registry."""
    text = (ROOT / "csrc" / "common" / "test_knobs.def").read_text()
    lines = re.findall(r"^RC_KNOB\((RINGCOMM_\w+), (\w+), k(\w+),", text, re.M)
    test = _test_registry()
    assert [n for n, _, _ in lines] == list(test), (lines, list(test))
    for name, field, _ in lines:
        assert name.startswith("RINGCOMM_TEST_") and field == name[len("RINGCOMM_"):].lower(), name
        assert test[name]["doc"].strip(), name
    assert not set(test) & set(_registry())


def test_every_knob_name_in_the_sources_is_registered():
    reg = set(_registry()) | set(_test_registry())
    # CMake cache variables and compile definitions, not environment knobs:
    # RINGCOMM_CUDA_ARCHS; RINGCOMM_PACKAGE_DIR, where the build copies the package data;
    # RINGCOMM_TEST_HOOKS, which compiles the test build of the core.
    not_knobs = {"RINGCOMM_CUDA_ARCHS", "RINGCOMM_PACKAGE_DIR", "RINGCOMM_TEST_HOOKS"}
    files = [p for d in ("csrc", "bindings") for p in (ROOT / d).rglob("*")
             if p.suffix in (".h", ".cpp", ".cu", ".def")]
    files += list(SRC.rglob("*.py")) + [ROOT / "setup.py", ROOT / "CMakeLists.txt"]
    seen = set()
    for p in files:
        seen |= set(re.findall(r"RINGCOMM_[A-Z0-9_]*[A-Z0-9]", p.read_text()))
    unknown = seen - reg - not_knobs
    assert not unknown, f"names used in the sources but not in the registry: {sorted(unknown)}"
    assert reg - seen == set(), f"registered but never mentioned in the sources: {sorted(reg - seen)}"


def _def_lines():
    """(macro, name, field, type) of every line of csrc/common/knobs.def, in its order."""
    text = (ROOT / "csrc" / "common" / "knobs.def").read_text()
    return re.findall(r"^(RC_KNOB|RC_BUILD_KNOB)\((RINGCOMM_\w+), (\w+), k(\w+),", text, re.M)


def test_registry_is_the_def_file():
    """knobs() (through _C) lists knobs.def's lines, in order, each field named by its knob."""
    lines = _def_lines()
    assert [(k["name"], k["field"], k["type"], k["build"]) for k in config.knobs()] == [
        (name, field, typ.lower(), macro == "RC_BUILD_KNOB") for macro, name, field, typ in lines]
    for _, name, field, _ in lines:
        assert field == name[len("RINGCOMM_"):].lower(), name


def test_read_is_typed_and_agrees_with_the_lookup(clean_env):
    """read(): one read-only attribute per runtime knob (none for build knobs), equal to
    knob(name), typed by the knob's type, documented by its doc; is_set() follows the environment."""
    clean_env.setenv("RINGCOMM_SLOT_BYTES", "64K")
    clean_env.setenv("RINGCOMM_ALGO", "RING")
    clean_env.setenv("RINGCOMM_TIMEOUT", "12.5")
    cfg = config.read()
    types = {"int": int, "bytes": int, "float": float, "str": str, "choice": str}
    for k in config.knobs():
        if k["build"]:
            assert not hasattr(cfg, k["field"]), k["name"]
            continue
        value = getattr(cfg, k["field"])
        assert type(value) is types[k["type"]] and value == config.knob(k["name"]), k["name"]
        assert cfg.is_set(k["field"]) == config.knob_is_set(k["name"]), k["name"]
        assert k["doc"] in getattr(type(cfg), k["field"]).__doc__, k["name"]
    assert (cfg.slot_bytes, cfg.algo, cfg.timeout) == (64 * 1024, "ring", 12.5)
    assert cfg.is_set("slot_bytes") and not cfg.is_set("nslots")
    with pytest.raises(AttributeError):
        cfg.slot_bytes = 1
    clean_env.setenv("RINGCOMM_SLOT_BYTES", "1M")
    assert cfg.slot_bytes == 64 * 1024 and config.read().slot_bytes == 1 << 20   # read once, kept
    with pytest.raises(ringcomm.RingcommError, match="not a runtime knob"):
        cfg.is_set("cuda")   # a build knob has no field


def test_read_raises_for_a_malformed_value(clean_env):
    clean_env.setenv("RINGCOMM_ZERO_MAX_INFLIGHT", "two")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_ZERO_MAX_INFLIGHT='two'"):
        config.read()


def test_no_direct_environment_reads_of_knobs():
    """Knobs are read only through the registry (setup.py / CMake read the build knobs), and the
    library's code reads them as typed fields, never by name (the by-name lookup is for users)."""
    bad = []
    for p in SRC.rglob("*.py"):
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if re.search(r"environ(\.get\(|\[)\s*[\"']RINGCOMM_|getenv\(\s*[\"']RINGCOMM_", line):
                bad.append(f"{p.name}:{i}: {line.strip()}")
            if p.name != "config.py" and re.search(r"\bknob(_is_set)?\(\s*[\"']?RINGCOMM_|\bknob\(\s*[A-Z_]+\)", line):
                bad.append(f"{p.name}:{i}: {line.strip()}")
    for d in ("csrc", "bindings"):
        for p in (ROOT / d).rglob("*"):
            if p.suffix in (".h", ".cpp", ".cu") and re.search(r"knob_info\(\s*\"|parse_knob\(knob_info\(\s*\"", p.read_text()):
                bad.append(str(p.relative_to(ROOT)))
    for d in ("csrc", "bindings"):
        for p in (ROOT / d).rglob("*"):
            if p.suffix in (".h", ".cpp", ".cu") and p.name != "knobs.cpp" and "getenv" in p.read_text():
                bad.append(str(p.relative_to(ROOT)))
    assert not bad, bad


def _expected_default(k):
    """The default parsed independently of the C++ rules."""
    d = k["default"]
    if d == "":
        return "" if k["type"] == "str" else None
    if k["type"] == "int":
        return int(d, 0)
    if k["type"] == "bytes":
        m = re.fullmatch(r"(\d+)([KMG]?)", d)
        return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]
    if k["type"] == "float":
        return float(d)
    return d


def test_unset_knobs_take_their_defaults(clean_env):
    cfg = config.config()
    assert list(cfg) == [k["name"] for k in config.knobs()]
    for k in config.knobs():
        e = cfg[k["name"]]
        assert e["value"] == _expected_default(k), k["name"]
        assert e["default"] == k["default"] and e["doc"] == k["doc"] and e["set"] is False
    assert cfg["RINGCOMM_SLOT_BYTES"]["value"] == 256 * 1024
    assert cfg["RINGCOMM_TIMEOUT"]["value"] == 300.0
    assert config.default_timeout() == 300.0


@pytest.mark.parametrize("text,want", [("4096", 4096), ("4K", 4096), ("4k", 4096), ("4KiB", 4096),
                                       ("3M", 3 << 20), ("2MB", 2 << 20), ("1G", 1 << 30),
                                       ("0x100", 256)])
def test_bytes_knobs_parse_suffixes(clean_env, text, want):
    clean_env.setenv("RINGCOMM_SLOT_BYTES", text)
    assert config.knob("RINGCOMM_SLOT_BYTES") == want
    assert config.config()["RINGCOMM_SLOT_BYTES"]["set"] is True


def test_int_float_choice_values(clean_env):
    clean_env.setenv("RINGCOMM_NSLOTS", "3")
    clean_env.setenv("RINGCOMM_TIMEOUT", "2.5")
    clean_env.setenv("RINGCOMM_ALGO", "DIRECT")
    clean_env.setenv("RINGCOMM_DEBUG", "trace")
    clean_env.setenv("RINGCOMM_NODE_ID", "box-7")
    assert config.knob("RINGCOMM_NSLOTS") == 3
    assert config.knob("RINGCOMM_TIMEOUT") == 2.5 and config.default_timeout() == 2.5
    assert config.knob("RINGCOMM_ALGO") == "direct"    # choices come back as registered
    assert config.knob("RINGCOMM_DEBUG") == "TRACE"
    assert config.knob("RINGCOMM_NODE_ID") == "box-7"
    clean_env.setenv("RINGCOMM_ALGO", "")              # empty = unset
    assert config.knob("RINGCOMM_ALGO") == "auto"


@pytest.mark.parametrize("name,text,accepted", [
    ("RINGCOMM_NSLOTS", "eight", "an integer"),
    ("RINGCOMM_NSLOTS", "8K", "an integer"),          # suffixes are for byte knobs only
    ("RINGCOMM_SLOT_BYTES", "12Q", "K/M/G suffix"),
    ("RINGCOMM_TIMEOUT", "5s", "a number"),
    ("RINGCOMM_ALGO", "tree", "one of auto, ring, direct"),
    ("RINGCOMM_STREAM", "maybe", "one of auto, adapt, on, off"),
    ("RINGCOMM_DEBUG", "LOUD", "one of WARN, INFO, TRACE"),
])
def test_bad_values_raise_naming_the_knob(clean_env, name, text, accepted):
    clean_env.setenv(name, text)
    with pytest.raises(ringcomm.InvalidArgumentError) as ei:
        config.knob(name)
    msg = str(ei.value)
    assert name in msg and repr(text).strip("'") in msg and accepted in msg
    with pytest.raises(ValueError):  # config() reports the same error
        config.config()


def test_unregistered_name_is_a_programming_error():
    with pytest.raises(ringcomm.RingcommError) as ei:
        config.knob("RINGCOMM_NO_SUCH_KNOB")
    assert not isinstance(ei.value, ringcomm.InvalidArgumentError)
    assert "RINGCOMM_NO_SUCH_KNOB" in str(ei.value) and "not a registered knob" in str(ei.value)


def test_bad_knob_fails_communicator_creation(clean_env):
    clean_env.setenv("RINGCOMM_NSLOTS", "lots")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_NSLOTS='lots'"):
        ringcomm.init(rank=0, world_size=1)
    clean_env.setenv("RINGCOMM_NSLOTS", "1")     # parses, but the transport's range check refuses it
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_NSLOTS must be in"):
        ringcomm.init(rank=0, world_size=1)


def _env(**kv):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_")}
    env["PYTHONPATH"] = str(SRC.parent) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(kv)
    return env


def test_cli_prints_values_and_sources():
    r = subprocess.run([sys.executable, "-m", "ringcomm.core.config"], env=_env(RINGCOMM_NSLOTS="5"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = {ln.split()[0]: ln.split() for ln in r.stdout.splitlines()[1:]}
    assert set(lines) == set(_registry())
    assert lines["RINGCOMM_NSLOTS"][1:3] == ["5", "set"]
    assert lines["RINGCOMM_SLOT_BYTES"][1:3] == ["262144", "default"]
    assert lines["RINGCOMM_BUILD_TYPE"][1:4] == ["Release", "default", "(build)"]
    assert lines["RINGCOMM_NODE_ID"][1] == "unset"
    j = subprocess.run([sys.executable, "-m", "ringcomm.core.config", "--json"], env=_env(RINGCOMM_ALGO="ring"),
                       capture_output=True, text=True, timeout=60)
    import json
    cfg = json.loads(j.stdout)
    assert cfg["RINGCOMM_ALGO"] == {**cfg["RINGCOMM_ALGO"], "value": "ring", "default": "auto", "set": True}


def test_cli_reports_a_bad_value():
    r = subprocess.run([sys.executable, "-m", "ringcomm.core.config"], env=_env(RINGCOMM_TIMEOUT="soon"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "RINGCOMM_TIMEOUT='soon'" in r.stderr and "Traceback" not in r.stderr


def test_no_knob_is_read_at_import():
    """Malformed values everywhere: importing every module still works; using a knob raises."""
    bad = {k["name"]: "not-a-valid-value!" for k in config.knobs() if k["type"] != "str"}
    code = ("import ringcomm, ringcomm.core.api, ringcomm.core.config, ringcomm.hier, ringcomm.cuda, ringcomm.training.zero\n"
            "try:\n    ringcomm.core.config.knob('RINGCOMM_HIER_SCRATCH_CACHE')\n"
            "except ringcomm.InvalidArgumentError as e:\n    print('raised', e)\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(**bad), capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    assert "raised" in r.stdout and "RINGCOMM_HIER_SCRATCH_CACHE" in r.stdout


# ---- logging -------------------------------------------------------------------------------------
_RANKS = textwrap.dedent("""
    import numpy as np, ringcomm

    def body(comm):
        x = np.arange(10, dtype=np.float32) + comm.rank
        comm.all_reduce(x)
        y = np.ones(3, dtype=np.int64)
        comm.broadcast(y, root=1)
        return x.tolist()

    if __name__ == "__main__":
        print(ringcomm.launch(body, 2, timeout=120))
""")


def _run_ranks(tmp_path, level):
    script = tmp_path / "ranks.py"
    script.write_text(_RANKS)
    env = _env() if level is None else _env(RINGCOMM_DEBUG=level)
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    want = (np.arange(10, dtype=np.float32) * 2 + 1).tolist()   # rank 0's + rank 1's input
    assert r.stdout.strip() == str([want, want])
    return [ln for ln in r.stderr.splitlines() if ln.startswith("ringcomm[")]


def test_log_info_one_line_per_communicator(tmp_path):
    lines = _run_ranks(tmp_path, "INFO")
    assert sorted(ln.split("]")[0] for ln in lines) == ["ringcomm[rank 0/2", "ringcomm[rank 1/2"], lines
    for ln in lines:
        assert "transport shm" in ln
        assert f"slots {256 * 1024} B x 8 x 2 lanes" in ln
        assert "shared memory" in ln and "B per rank" in ln
        assert ("all_reduce auto (direct/ll up to 4096 B, direct/header_in_slot up to 65536 B, then no two_shot "
                "below 4 ranks, ring/header_in_slot above)") in ln
        assert "broadcast direct/ll up to 4096 B, direct/header_in_slot in all_reduce's direct range" in ln
        assert "store adapt (cached or streaming from 16384 B, by the ranks' timings)" in ln and "reduce ISA" in ln and "timeout 300 s" in ln


def test_log_trace_one_line_per_collective(tmp_path):
    lines = _run_ranks(tmp_path, "TRACE")
    for r in (0, 1):
        mine = [ln for ln in lines if ln.startswith(f"ringcomm[rank {r}/2]")]
        assert len(mine) == 3, mine            # the INFO line + one per collective
        ar = [ln for ln in mine if " all_reduce(" in ln]
        bc = [ln for ln in mine if " broadcast(" in ln]
        assert len(ar) == 1 and len(bc) == 1, mine
        assert "count=10" in ar[0] and "dtype=float32" in ar[0] and "seq 1" in ar[0]
        assert "algo=direct, proto=ll, store=cached" in ar[0]     # the selection taken, per call
        assert "algo=direct, proto=ll, store=cached" in bc[0]
        assert "count=3" in bc[0] and "dtype=int64" in bc[0] and "root=1" in bc[0] and "seq 2" in bc[0]
        assert re.search(r" [0-9.e+-]+ us$", ar[0]) and re.search(r" [0-9.e+-]+ us$", bc[0])


def test_log_off_by_default(tmp_path):
    assert _run_ranks(tmp_path, None) == []
    assert _run_ranks(tmp_path, "WARN") == []


@pytest.mark.parametrize("level,shown", [(None, ["w"]), ("WARN", ["w"]), ("INFO", ["w", "i"]),
                                         ("TRACE", ["w", "i", "t"])])
def test_python_logger_follows_ringcomm_debug(level, shown):
    code = ("from ringcomm.core import config\nlog = config.logger(1, 3)\n"
            "log.warning('w')\nlog.info('i')\nlog.debug('t')\n")
    env = _env() if level is None else _env(RINGCOMM_DEBUG=level)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [f"ringcomm[rank 1/3] {m}" for m in shown]


def test_environment_sets_knobs_for_a_block_and_restores_them(monkeypatch):
    from ringcomm.core.config import environment, knob
    monkeypatch.setenv("RINGCOMM_TIMEOUT", "7")
    monkeypatch.delenv("RINGCOMM_P2P_EAGER_BYTES", raising=False)
    with environment({"RINGCOMM_TIMEOUT": "9", "RINGCOMM_P2P_EAGER_BYTES": "4K"}):
        assert knob("RINGCOMM_TIMEOUT") == 9.0 and knob("RINGCOMM_P2P_EAGER_BYTES") == 4096
    assert knob("RINGCOMM_TIMEOUT") == 7.0 and "RINGCOMM_P2P_EAGER_BYTES" not in os.environ
    with pytest.raises(RuntimeError):
        with environment({"RINGCOMM_TIMEOUT": "11"}):
            raise RuntimeError("the block failed")
    assert knob("RINGCOMM_TIMEOUT") == 7.0


def test_inter_accepts_only_engines_that_exist(monkeypatch):
    """RINGCOMM_INTER names the inter-node engines there are; any other value (nccl: this
    communicator moves host memory) is the registry's error naming the accepted ones."""
    assert [k["choices"] for k in config.knobs() if k["name"] == "RINGCOMM_INTER"] == [["auto", "gloo", "mpi"]]
    monkeypatch.setenv("RINGCOMM_INTER", "nccl")
    with pytest.raises(ringcomm.InvalidArgumentError,
                       match=r"RINGCOMM_INTER='nccl' is not valid: expected one of auto, gloo, mpi$"):
        config.read()
