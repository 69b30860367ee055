"""A fixed subset of torch's own DistributedTest (torch/testing/_internal/distributed/
distributed_test.py, shipped in the wheel) on the ringcomm backend at world size 2, through the
harness tests/torch_suite/run_distributed_test.py (which admits ringcomm wherever the suite's gates
admit gloo). Every selected test passes on gloo too; here each must pass on ringcomm.

The subset covers the collectives (sync and async, coalesced, sparse), point-to-point (tags, any
source, batched), barriers with timeouts, subgroups, the object collectives, DDP (plain, static
graph, create_graph), sequence numbers under TORCH_DISTRIBUTED_DEBUG=DETAIL and the backend's
monitoredBarrier.
torch's test utilities need ``expecttest``; without it the test skips.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")

import ringcomm  # noqa: E402

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_suite",
                       "run_distributed_test.py")

SUBSET = [
    # collectives, sync and async, and the Work future
    "test_all_reduce_sum",
    "test_all_reduce_sum_async",
    "test_broadcast",
    "test_all_gather",
    "test_scatter",
    "test_sparse_all_reduce_sum",
    "test_get_future",
    # point-to-point
    "test_send_recv_with_tag",
    "test_batch_isend_irecv_gloo_tags",
    # barriers (a group timeout), subgroups, object collectives; test_all_gather_object_subgroup
    # runs under TORCH_DISTRIBUTED_DEBUG=DETAIL too (torch's wrapper reads sequence numbers)
    "test_barrier_timeout_full_group",
    "test_all_gather_object_subgroup",
    # DDP
    "test_DistributedDataParallelCPU",
    # the backend's monitoredBarrier
    "test_monitored_barrier_gloo_rank_0_timeout",
]

# Each test spawns two fresh interpreters that import torch; the limits leave room for a loaded
# machine.
PER_TEST_TIMEOUT_S = 60
WALL_LIMIT_S = 300


@pytest.mark.timeout(WALL_LIMIT_S + 20)
def test_torch_distributed_test_subset(tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("\n".join(SUBSET) + "\n")
    out = tmp_path / "results.json"
    src = os.path.dirname(os.path.dirname(os.path.abspath(ringcomm.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [src] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run(
        [sys.executable, HARNESS, "--world", "2", "--backends", "ringcomm", "--only", str(names), "--start", "fork",
         "--timeout", str(PER_TEST_TIMEOUT_S), "--total-timeout", str(WALL_LIMIT_S),
         "--json", str(out), "--log-dir", str(tmp_path / "logs")],
        env=env, capture_output=True, text=True, timeout=WALL_LIMIT_S + 15)
    assert out.exists(), f"the harness wrote no results:\n{proc.stdout}\n{proc.stderr}"
    run = json.loads(out.read_text())["runs"][0]
    results = run["results"]
    bad = {n: (results[n]["status"], results[n]["detail"][-1500:])
           for n in SUBSET if n in results and results[n]["status"] != "pass"}
    missing = [n for n in SUBSET if n not in results]
    log = ""
    if bad or missing:
        with open(run["log"]) as f:
            log = f.read()[-4000:]
    assert not bad and not missing, (
        f"not passed: {json.dumps(bad, indent=1)}\nno result (rc {run['rc']}): {missing}\n"
        f"log tail:\n{log}")
