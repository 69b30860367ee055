"""Two fake nodes in separate network namespaces, joined by a veth pair: the inter-node traffic of
the hierarchical communicator really crosses a link, and the link's byte counters show that only
the shards cross it.

Needs root and ``ip netns`` (iproute2); skipped cleanly where either is missing or not permitted.
Each namespace runs a launcher (``ip netns exec NS python ...``) that spawns its node's two ranks;
the ranks rendezvous through a FileStore directory (the filesystem is shared), gloo connects over
the veth addresses (GLOO_SOCKET_IFNAME), and each node's ranks share memory as usual.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import ringcomm

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(os.path.abspath(ringcomm.__file__)))
NBYTES = 16 << 20          # the measured all_reduce: 16 MiB of float32

LAUNCHER = r"""
import json, sys
sys.path.insert(0, {tests!r})
from ringcomm.core.launch import spawn
from hier_cases import netns_rank
if __name__ == "__main__":
    res = spawn(netns_rank, 2, ({node}, 4, {store!r}, {ifname!r}, {nbytes}), timeout=150)
    print("RESULT " + json.dumps(res))
"""


def _ip(*args, ns=None, check=True):
    cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=20)


@pytest.fixture
def two_namespaces():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("iproute2 ('ip') is not installed")
    tag = f"{os.getpid() % 100000}"
    ns = [f"rcA{tag}", f"rcB{tag}"]
    veth = [f"rcva{tag}", f"rcvb{tag}"]
    try:
        _ip("netns", "add", ns[0])
    except (subprocess.CalledProcessError, OSError) as e:
        msg = getattr(e, "stderr", "") or str(e)
        pytest.skip(f"'ip netns add' is not permitted here: {msg.strip()}")
    try:
        _ip("netns", "add", ns[1])
        _ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for i in range(2):
            _ip("link", "set", veth[i], "netns", ns[i])
            _ip("addr", "add", f"10.231.77.{i + 1}/24", "dev", veth[i], ns=ns[i])
            _ip("link", "set", veth[i], "up", ns=ns[i])
            _ip("link", "set", "lo", "up", ns=ns[i])
    except (subprocess.CalledProcessError, OSError) as e:
        for n in ns:
            _ip("netns", "del", n, check=False)
        pytest.skip(f"could not set up the veth pair: {getattr(e, 'stderr', '') or e}")
    try:
        yield ns, veth
    finally:
        for n in ns:
            _ip("netns", "del", n, check=False)


@pytest.mark.timeout(240)
def test_two_nodes_over_a_veth_link(two_namespaces):
    ns, veth = two_namespaces
    store = tempfile.mkdtemp(prefix="rc-netns-")
    procs = []
    try:
        for node in range(2):
            env = dict(os.environ)
            env.update({"PYTHONPATH": os.pathsep.join([SRC, HERE, env.get("PYTHONPATH", "")]),
                        "RINGCOMM_NODE_ID": f"netns-node{node}",
                        "GLOO_SOCKET_IFNAME": veth[node]})
            code = LAUNCHER.format(tests=HERE, node=node, store=store, ifname=veth[node],
                                   nbytes=NBYTES)
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns[node], sys.executable, "-c", code],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        outs = []
        deadline = time.monotonic() + 200
        for p in procs:
            try:
                o, e = p.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
            assert p.returncode == 0, f"node launcher failed:\n{e[-4000:]}"
            outs.append(json.loads(o.split("RESULT ", 1)[1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(store, ignore_errors=True)

    ranks = [r for node in outs for r in node]
    assert [r["type"] for r in ranks] == ["HierarchicalCommunicator"] * 4, ranks
    assert all(r["small_ok"] and r["hier"]["ok"] and r["flat"]["ok"] for r in ranks), ranks
    # Software count: each rank handed the engine its shard, NBYTES / 2.
    for r in ranks:
        assert r["stats"]["all_reduce"]["bytes"] == NBYTES // 2 + 4000 // 2, r["stats"]
    # Wire: N = 2 nodes, local size L = 2, W = 4 ranks. Each rank's ring among the N nodes sends
    # 2 (N-1)/N x NBYTES/L across the link; all W ranks together 2 x NBYTES, NBYTES each way.
    # (The flat gloo ring over the same 4 ranks: 2 (W-1)/W x NBYTES on each of the 2 crossing
    # edges = 3 x NBYTES; printed for comparison, not asserted: it depends on gloo's schedule.)
    a = ranks[0]        # node 0's view of its veth: tx = node 0 -> node 1, rx = the other way
    hier_total = a["hier"]["tx"] + a["hier"]["rx"]
    flat_total = a["flat"]["tx"] + a["flat"]["rx"]
    expected = 2 * NBYTES
    print(f"\nveth bytes for one {NBYTES >> 20} MiB all_reduce: hierarchical {hier_total} "
          f"({hier_total / NBYTES:.3f} x M; expected {expected / NBYTES:.1f} x M + headers), "
          f"flat gloo {flat_total} ({flat_total / NBYTES:.3f} x M); times "
          f"{a['hier']['seconds'] * 1e3:.1f} ms vs {a['flat']['seconds'] * 1e3:.1f} ms")
    assert expected <= hier_total <= expected * 1.08 + (256 << 10), (hier_total, expected, a)
    for d in ("tx", "rx"):
        assert a["hier"][d] >= NBYTES, a
