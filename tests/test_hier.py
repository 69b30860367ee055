"""Hierarchical collectives on one machine: ranks faked as several nodes through
RINGCOMM_NODE_ID. One group of ranks per fake topology (the session's, tests/ranks.py) runs
every section (tests/hier_cases.py); the tests below only look the results up.

    2 nodes x 2 ranks (uniform: reduce-scatter -> inter-node all-reduce of the shard -> all-gather)
    3 nodes, 2 + 1 + 2 ranks (uneven: the leader paths)
"""
import pytest

from ringcomm.core.launch import spawn

torch = pytest.importorskip("torch")
import ringcomm.hier as hier  # noqa: E402

import ranks  # noqa: E402
from hier_cases import run_topology, single_node  # noqa: E402

TOPOLOGIES = {
    "2x2": ["nodeA", "nodeA", "nodeB", "nodeB"],
    "2+1+2": ["nodeA", "nodeA", "nodeB", "nodeC", "nodeC"],
}
# The flat suite's runs per topology: (array library, all-reduce only). numpy inputs take the same
# path as torch ones after a zero-copy view: its all-reduces on one topology (and the numpy
# all_gather of hier_cases' extra section) check that view.
LIBS = {"2x2": [("torch", False), ("numpy", True)], "2+1+2": [("torch", False)]}


def _ddp_available():
    try:
        import ringcomm.torch  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure: the backend has not landed
        return False, f"ringcomm.torch is not importable: {type(e).__name__}: {e}"
    return True, ""


def results_for(name):
    def start():
        ids = TOPOLOGIES[name]
        with ranks.temp_dir("rc-hier-") as d:
            ddp = name == "2x2" and _ddp_available()[0]
            return ranks.run(run_topology, len(ids), (ids, d, ddp, LIBS[name]), timeout=240)
    return ranks.once(("hier", name), start, f"the {name} topology's group")


def _failures(results, section):
    out = []
    for res in results:
        v = res.get(section)
        if v is None:
            out.append(f"section {section} did not run")
        elif isinstance(v, dict) and "failures" in v:
            out += v["failures"]
        elif isinstance(v, list):
            out += v
    return out


# ---- pure topology ----------------------------------------------------------------------------------
def test_topology_grouping_from_members():
    # Nodes ordered by their lowest rank; local ranks by global rank; ranks need not be contiguous.
    t = hier.Topology(3, ("b", "a", "b", "c", "a", "c"))
    assert t.nodes == ((0, 2), (1, 4), (3, 5))
    assert (t.node, t.local_rank, t.local_size, t.num_nodes) == (2, 0, 2, 3)
    assert t.uniform and t.column(1) == (2, 4, 5)
    assert t.permutation() == [0, 1, 3, 2, 4, 5]
    u = hier.Topology(2, ("x", "x", "y", "z", "z"))
    assert u.local_sizes == (2, 1, 2) and not u.uniform
    assert u.column(0) == (0, 2, 3) and u.column(1) == (1, 4)
    assert hier.Topology(0, ("h",) * 4).num_nodes == 1


def test_fake_nodes_env_and_node_id(monkeypatch):
    assert [hier.fake_node_of(r, 4, 2) for r in range(4)] == [0, 0, 1, 1]
    assert [hier.fake_node_of(r, 5, 3) for r in range(5)] == [0, 0, 1, 1, 2]
    assert hier.fake_nodes_env(3, 4, 2) == {"RINGCOMM_NODE_ID": "fake-node1"}
    with pytest.raises(ValueError):
        hier.fake_node_of(0, 4, 5)
    monkeypatch.setenv("RINGCOMM_NODE_ID", "rack7-host3")
    assert hier.node_id() == "rack7-host3"
    monkeypatch.delenv("RINGCOMM_NODE_ID")
    import socket
    assert hier.node_id().startswith(socket.gethostname())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("node_id", [None, "same-node"])
def test_single_node_stays_flat(node_id, monkeypatch):
    """One node: the plain shared-memory Communicator, torch never imported (no engine)."""
    monkeypatch.setenv("RINGCOMM_START_METHOD", "spawn")   # fresh interpreters: nothing preloaded
    with ranks.temp_dir("rc-hier1-") as d:
        res = spawn(single_node, 3, (d, node_id), timeout=50)
    for r in res:
        assert r == {"type": "Communicator", "torch_imported": False, "ok": True, "node_key": True}, res


# ---- spawned topologies ---------------------------------------------------------------------------
@pytest.mark.timeout(300)
@pytest.mark.parametrize("topo", list(TOPOLOGIES))
def test_every_collective_matches_reference(topo):
    res = results_for(topo)
    f = _failures(res, "suite") + _failures(res, "topology") + _failures(res, "extra")
    assert not f, "\n".join(f[:30])
    base = res[0]["suite"]["digests"]
    for r, x in enumerate(res[1:], 1):
        assert x["suite"]["digests"] == base, f"rank {r}'s all_reduce results differ bitwise from rank 0's"


@pytest.mark.timeout(300)
def test_only_shards_cross_nodes():
    """2 nodes x 2: each rank hands the inter-node engine its shard, M / local_size bytes, for an
    M-byte all_reduce (a flat engine would take M), in one call. The engine's ring among N nodes
    then sends 2 (N-1)/N of it per rank: (N-1)/N x M/local_size in each of its two phases."""
    for r in results_for("2x2"):
        b = r["bytes"]
        assert isinstance(b, dict), b
        assert b["results_ok"]
        M, L, N = b["M"], b["local_size"], b["num_nodes"]
        shard = M // L
        assert b["stats"]["all_reduce"] == {"all_reduce": {"calls": 1, "bytes": shard}}, b
        assert b["stats"]["reduce_scatter"] == {"reduce_scatter": {"calls": 1, "bytes": shard}}, b
        # all_gather: the rank's own contribution (M / world) once, plus the 8-byte size exchange.
        ag = b["stats"]["all_gather"]
        assert ag["all_gather"] == {"calls": 1, "bytes": M // (N * L)}, b
        assert ag["all_gather_sizes"] == {"calls": 1, "bytes": 8}, b
        wire_per_phase = (N - 1) / N * shard
        assert wire_per_phase == M / 4        # 2 x 2: a quarter of the message per rank per phase


@pytest.mark.timeout(300)
def test_uneven_nodes_leaders_carry_the_message():
    """2 + 1 + 2: the fallback path reduces to each node's leader; only leaders use the engine."""
    for r in results_for("2+1+2"):
        b = r["bytes"]
        assert isinstance(b, dict), b
        assert b["results_ok"]
        got = b["stats"]["all_reduce"]
        if b["local_rank"] == 0:
            assert got == {"all_reduce": {"calls": 1, "bytes": b["M"]}}, b
        else:
            assert got == {}, b


@pytest.mark.timeout(300)
@pytest.mark.parametrize("topo", list(TOPOLOGIES))
def test_bad_arguments_fail_every_rank_promptly(topo):
    res = [r["fail_fast"] for r in results_for(topo)]
    W = len(res)
    for r in res:
        assert isinstance(r, dict), r
        assert r["error"] is not None, res
        assert r["seconds"] < 20, res          # the timeout is 60 s
        assert r["after"] == "PeerFailureError", res
    assert res[W - 1]["error"] == "UnsupportedError", res


@pytest.mark.timeout(300)
def test_ddp_matches_gloo():
    ok, why = _ddp_available()
    if not ok:
        pytest.skip(why)
    f = _failures(results_for("2x2"), "ddp")
    assert not f, "\n".join(f[:30])


