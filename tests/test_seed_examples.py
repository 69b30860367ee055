"""Every worked example and formula of the seed documents, reproduced exactly.

Seeds live in shared/seeds/:
  000_241e3ce5c1467db3.md   course module "Distributed Training" (distributed.py API)
  001_c37cd0e2d73a6ec7.txt  roadmap page (ring table, ZeRO 7B/8, Megatron, GPipe)
  002_d4548f13edef1d6f.txt  study notes (gradient accumulation, checkpointing)
  003_554c78c1e50dcab2.txt  assignment (recomputation at least halves saved bytes)
  004_bf28466a288be4d4.txt  lesson (ZeRO-1 4x, ZeRO-2 8x)
Numbers below are copied from the seeds as literals.
"""


import numpy as np
import pytest

from ringcomm.training.memory import (
    activation_memory_bytes,
    stage2_bytes,
    training_memory_bytes,
    zero_communication_bytes,
    zero_memory_per_device,
)
from ringcomm.apps import simulate as sim

GB = 1e9


# ---------------------------------------------------------------------------
# seed 000: the training memory budget
# ---------------------------------------------------------------------------

def test_seed000_training_memory_7_5B():
    # seed 000: "A 7.5B model therefore needs 7.5e9 x 16 = 120 GB"; printed per key in GB.
    mem = training_memory_bytes(7_500_000_000)
    assert list(mem) == ["params", "grads", "optimizer_states", "total"]
    assert mem == {
        "params": 15_000_000_000,
        "grads": 15_000_000_000,
        "optimizer_states": 90_000_000_000,
        "total": 120_000_000_000,
    }
    assert [f"{v / 1e9:6.1f}" for v in mem.values()] == ["  15.0", "  15.0", "  90.0", " 120.0"]
    # "an 80 GB A100 cannot hold it"
    assert mem["total"] > 80 * GB
    # "The parameters ... are only 1/8 of the bill; the optimizer states are 3/4 of it."
    assert mem["params"] / mem["total"] == 1 / 8
    assert mem["optimizer_states"] / mem["total"] == 3 / 4
    # "2 + 2 + 12 = 16 bytes for every parameter"
    assert training_memory_bytes(1) == {"params": 2, "grads": 2, "optimizer_states": 12, "total": 16}


def test_seed000_zero_stage_table_formulas():
    # seed 000 stage table: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N
    for psi in (1, 1_000_000, 7_500_000_000):
        for n in (1, 2, 8, 64):
            assert zero_memory_per_device(psi, n, 0) == 16 * psi
            assert zero_memory_per_device(psi, n, 1) == 4 * psi + 12 * psi / n
            assert zero_memory_per_device(psi, n, 2) == 2 * psi + 14 * psi / n
            assert zero_memory_per_device(psi, n, 3) == 16 * psi / n


def test_seed000_7_5B_on_64_gpus():
    # seed 000: psi, n = 7_500_000_000, 64; print(f"stage {stage}: {gb:7.2f} GB/device")
    psi, n = 7_500_000_000, 64
    gbs = [zero_memory_per_device(psi, n, stage) / 1e9 for stage in range(4)]
    assert gbs == [120.0, 31.40625, 16.640625, 1.875]
    assert [f"stage {s}: {gb:7.2f} GB/device" for s, gb in enumerate(gbs)] == [
        "stage 0:  120.00 GB/device",
        "stage 1:   31.41 GB/device",
        "stage 2:   16.64 GB/device",
        "stage 3:    1.88 GB/device",
    ]
    # "120 GB collapses to under 2"
    assert gbs[3] < 2


def test_seed000_4x_8x_Nx_reductions():
    # seed 000: "a 4x, 8x, and Nx reduction" (seed 004: "ZeRO-1 4x, ZeRO-2 8x"):
    # the large-N limits of 16Ψ / (4Ψ + 12Ψ/N) and 16Ψ / (2Ψ + 14Ψ/N).
    psi = 1_000_000
    big = 10**12
    assert zero_memory_per_device(psi, 1, 0) / zero_memory_per_device(psi, big, 1) == pytest.approx(4)
    assert zero_memory_per_device(psi, 1, 0) / zero_memory_per_device(psi, big, 2) == pytest.approx(8)
    for n in (2, 8, 64, 1000):
        assert zero_memory_per_device(psi, n, 0) / zero_memory_per_device(psi, n, 3) == n
        # "Stage 1 flattens out (it can never beat 4Ψ); stage 3 keeps falling as 16Ψ/N"
        assert zero_memory_per_device(psi, n, 1) > 4 * psi
        assert zero_memory_per_device(psi, n, 2) > 2 * psi


def test_seed000_70B_stage3_needs_many_devices():
    # seed 000 "Try This": at 70B even stage 3 needs many devices to fit an 80 GB GPU.
    psi = 70_000_000_000
    fits = [n for n in range(1, 100) if zero_memory_per_device(psi, n, 3) <= 80 * GB]
    assert fits[0] == 14  # 16 * 70 / 14 = 80 GB exactly
    assert zero_memory_per_device(psi, 13, 3) > 80 * GB


def test_seed000_exercise2_stage2_bytes():
    # seed 000 Exercise 2: psi, n = 1_000_000, 8; print("mine:", ...); print("ref: ", ...)
    psi, n = 1_000_000, 8
    assert stage2_bytes(psi, n) == 3750000.0
    assert zero_memory_per_device(psi, n, 2) == 3750000.0
    assert str(stage2_bytes(psi, n)) == str(zero_memory_per_device(psi, n, 2)) == "3750000.0"

    def seed_stage2_bytes(psi, n):  # the seed's own solution, verbatim
        return 2 * psi + (2 + 12) * psi / n

    for psi in (0, 1, 123_457, 7_000_000_000):
        for n in (1, 3, 8, 64):
            assert stage2_bytes(psi, n) == seed_stage2_bytes(psi, n) == zero_memory_per_device(psi, n, 2)


# ---------------------------------------------------------------------------
# seed 000: data parallelism and the ring all-reduce (torch examples)
# ---------------------------------------------------------------------------

def _seed_regression_setup(seed: int, d_out: int, d_in: int, shards: int):
    """Seed 000's setup for its linear-regression examples, verbatim and in its order of random
    draws: ``torch.manual_seed(seed)``, W (d_out x d_in), then 4 inputs per shard, then 4 targets
    per shard."""
    import torch
    torch.manual_seed(seed)
    W = torch.randn(d_out, d_in)
    xs = [torch.randn(4, d_in) for _ in range(shards)]
    ys = [torch.randn(4, d_out) for _ in range(shards)]
    return W, xs, ys


def test_seed000_data_parallel_equals_single_device():
    torch = pytest.importorskip("torch")
    # seed 000, "Code: Data Parallelism & Ring All-Reduce"
    W, x_shards, y_shards = _seed_regression_setup(seed=0, d_out=3, d_in=5, shards=4)
    g_dp = sim.data_parallel_gradients(W, x_shards, y_shards)
    g_sd = sim.single_device_gradient(W, torch.cat(x_shards), torch.cat(y_shards))
    assert isinstance(g_dp, torch.Tensor) and g_dp.shape == (3, 5)
    assert (g_dp - g_sd).abs().max().item() < 1e-6
    assert torch.allclose(g_dp, g_sd, atol=1e-5)  # "identical step: True"


def test_seed000_ring_all_reduce_four_devices():
    torch = pytest.importorskip("torch")
    # seed 000: the ring all-reduce "correctness anchor"
    tensors = [
        torch.tensor([1., 2., 3., 4.]),
        torch.tensor([10., 20., 30., 40.]),
        torch.tensor([100., 200., 300., 400.]),
        torch.tensor([1000., 2000., 3000., 4000.]),
    ]
    out = sim.ring_all_reduce(tensors)
    assert out[0].tolist() == [1111.0, 2222.0, 3333.0, 4444.0]
    assert torch.equal(out[0], torch.stack(tensors).sum(0))        # "== naive sum: True"
    assert all(torch.equal(o, out[0]) for o in out)                 # "all devices agree: True"
    assert sim.ring_all_reduce_bytes(4000, 4) == 6000.0              # "bytes/device (M=4KB, N=4)"
    # inputs untouched
    assert tensors[0].tolist() == [1., 2., 3., 4.]


def test_seed000_step_through_the_ring():
    # seed 000 "Step through the ring": four devices; at the end of reduce-scatter
    # (step 3) exactly one cell per device holds its finished column sum; after the
    # all-gather every row equals the column sums.
    rows = sim.ring_trace([[1, 2, 3, 4], [10, 20, 30, 40], [100, 200, 300, 400],
                           [1000, 2000, 3000, 4000]])
    col_sums = [1111, 2222, 3333, 4444]
    assert len(rows) == 1 + 2 * 3
    label, states = rows[3]
    assert label == "reduce-scatter, step 3"
    for r, state in enumerate(states):
        finished = [c for c in range(4) if state[c] == col_sums[c]]
        assert finished == [(r + 1) % 4]
    assert rows[-1] == ("all-gather, step 3", [col_sums] * 4)


def test_seed000_exercise1_all_reduce_mean():
    torch = pytest.importorskip("torch")
    # seed 000 Exercise 1
    xs = [torch.randn(6) for _ in range(4)]
    got = sim.all_reduce_mean(xs)[0]
    assert torch.allclose(got, torch.stack(xs).mean(0), atol=1e-6)  # "matches mean: True"

    def seed_all_reduce_mean(tensors):  # the seed's solution, verbatim
        summed = sim.ring_all_reduce(tensors)
        n = len(tensors)
        return [s / n for s in summed]

    for a, b in zip(sim.all_reduce_mean(xs), seed_all_reduce_mean(xs)):
        assert torch.equal(a, b)


def test_seed000_exercise3_gradient_accumulation():
    torch = pytest.importorskip("torch")
    # seed 000 Exercise 3
    W, shards_x, shards_y = _seed_regression_setup(seed=1, d_out=2, d_in=3, shards=3)

    def seed_accumulate(W, xs, ys):  # the seed's solution, verbatim
        grads = []
        for x, y in zip(xs, ys):
            w = W.detach().clone().requires_grad_(True)
            loss = ((x @ w.T - y) ** 2).mean()
            grads.append(torch.autograd.grad(loss, w)[0])
        return sum(grads) / len(grads)

    acc = sim.accumulate(W, shards_x, shards_y)
    dp = sim.data_parallel_gradients(W, shards_x, shards_y)
    assert torch.allclose(acc, dp, atol=1e-6)  # "accumulation == data parallel: True"
    assert torch.allclose(acc, seed_accumulate(W, shards_x, shards_y), atol=1e-7)
    assert torch.allclose(
        acc, sim.single_device_gradient(W, torch.cat(shards_x), torch.cat(shards_y)), atol=1e-6)


def test_seed000_uneven_shards_rejected():
    # seed 000 pitfall: "data_parallel_gradients rejects uneven shards rather than
    # silently bias the step."
    rng = np.random.default_rng(0)
    W = rng.standard_normal((2, 3))
    xs = [rng.standard_normal((4, 3)), rng.standard_normal((2, 3))]
    ys = [rng.standard_normal((4, 2)), rng.standard_normal((2, 2))]
    with pytest.raises(ValueError, match="mean of means"):
        sim.data_parallel_gradients(W, xs, ys)
    with pytest.raises(ValueError, match="mean of means"):
        sim.accumulate(W, xs, ys)


def test_seed000_ring_cost_approaches_2M():
    # seed 000: "moves only 2(N-1)/N * M bytes per device ... approaches 2M"
    M = 4000
    costs = [sim.ring_all_reduce_bytes(M, n) for n in range(1, 200)]
    assert costs[0] == 0.0
    assert all(a < b for a, b in zip(costs, costs[1:]))
    assert all(c < 2 * M for c in costs)
    assert sim.ring_all_reduce_bytes(M, 10**9) == pytest.approx(2 * M)


# ---------------------------------------------------------------------------
# seed 001: collectives and the ring table
# ---------------------------------------------------------------------------

SEED001_WORKERS = [[1, 2, 3], [10, 20, 30], [100, 200, 300]]

# seed 001, "The ring algorithm", the table row by row
SEED001_RING_TABLE = [
    ("start", [[1, 2, 3], [10, 20, 30], [100, 200, 300]]),
    ("reduce-scatter, step 1", [[1, 2, 303], [11, 20, 30], [100, 220, 300]]),
    ("reduce-scatter, step 2", [[1, 222, 303], [11, 20, 333], [111, 220, 300]]),
    ("all-gather, step 1", [[111, 222, 303], [11, 222, 333], [111, 220, 333]]),
    ("all-gather, step 2", [[111, 222, 333], [111, 222, 333], [111, 222, 333]]),
]


def test_seed001_ring_table_exact():
    rows = sim.ring_trace(SEED001_WORKERS)
    assert rows == SEED001_RING_TABLE
    # numpy and torch inputs give the same table
    assert sim.ring_trace([np.array(w) for w in SEED001_WORKERS]) == SEED001_RING_TABLE
    torch = pytest.importorskip("torch")
    assert sim.ring_trace([torch.tensor(w) for w in SEED001_WORKERS]) == SEED001_RING_TABLE


def test_seed001_ring_table_narrative():
    rows = sim.ring_trace(SEED001_WORKERS)
    # "In step 1, worker 0 sends its first chunk (1) to worker 1, which adds it: 10+1=11."
    assert rows[1][1][1][0] == 10 + 1 == 11
    # "After two steps ... worker 0 has 222, worker 1 has 333, worker 2 has 111"
    after_rs = rows[2][1]
    assert (after_rs[0][1], after_rs[1][2], after_rs[2][0]) == (222, 333, 111)


def test_seed001_format_ring_trace():
    text = sim.format_ring_trace(sim.ring_trace(SEED001_WORKERS))
    lines = text.splitlines()
    assert len(lines) == 6
    assert lines[0].split() == ["after", "worker", "0", "worker", "1", "worker", "2"]
    expected_cells = [
        ["start", "[1, 2, 3]", "[10, 20, 30]", "[100, 200, 300]"],
        ["reduce-scatter, step 1", "[1, 2, 303]", "[11, 20, 30]", "[100, 220, 300]"],
        ["reduce-scatter, step 2", "[1, 222, 303]", "[11, 20, 333]", "[111, 220, 300]"],
        ["all-gather, step 1", "[111, 222, 303]", "[11, 222, 333]", "[111, 220, 333]"],
        ["all-gather, step 2", "[111, 222, 333]", "[111, 222, 333]", "[111, 222, 333]"],
    ]
    for line, cells in zip(lines[1:], expected_cells):
        assert [c.strip() for c in line.split("  ") if c.strip()] == cells


def test_seed001_collectives_example():
    # seed 001 "Collective communication": all-reduce gives [111, 222, 333] everywhere;
    # a reduce-scatter leaves one slice of the sum on each worker (111, 222, 333), and
    # an all-gather of those slices gives everyone [111, 222, 333].
    out = sim.ring_all_reduce(SEED001_WORKERS)
    assert out == [[111, 222, 333]] * 3
    after_reduce_scatter = sim.ring_trace(SEED001_WORKERS)[2][1]
    owned = sorted(after_reduce_scatter[r][(r + 1) % 3] for r in range(3))
    assert owned == [111, 222, 333]


def test_seed001_ring_cost_ratios():
    # seed 001: "with 4 workers it is 1.5 times the array, with 64 workers 1.97 times,
    # and it never reaches 2."
    assert sim.ring_all_reduce_bytes(1, 4) == 1.5
    assert sim.ring_all_reduce_bytes(1, 64) == 1.96875
    assert round(sim.ring_all_reduce_bytes(1, 64), 2) == 1.97
    assert all(sim.ring_all_reduce_bytes(1, n) < 2 for n in (1, 2, 3, 64, 1000, 10**6))


def test_seed001_data_parallel_mean_example():
    # seed 001: "GPU 0 computes the gradient 0.2 and GPU 1 computes 0.4. The all-reduce
    # (here a mean) gives both GPUs 0.3"
    out = sim.all_reduce_mean([0.2, 0.4])
    assert out[0] == out[1] == pytest.approx(0.3)
    out = sim.all_reduce_mean([np.array([0.2]), np.array([0.4])])
    assert np.allclose(out, 0.3)
    # and that is the gradient of the full batch of 8 (two GPUs, 4 texts each)
    rng = np.random.default_rng(8)
    W = rng.standard_normal((1, 2))
    x = rng.standard_normal((8, 2))
    y = rng.standard_normal((8, 1))
    assert np.allclose(sim.data_parallel_gradients(W, [x[:4], x[4:]], [y[:4], y[4:]]),
                       sim.single_device_gradient(W, x, y))


def test_seed001_zero_7B_on_8_gpus():
    # seed 001 "Example. A 7-billion-parameter model on N = 8 GPUs"
    psi, n = 7_000_000_000, 8
    assert training_memory_bytes(psi)["total"] == 112 * 10**9        # "112 GB"
    assert zero_memory_per_device(psi, n, 0) == 112_000_000_000      # 16·7 = 112 GB
    assert zero_memory_per_device(psi, n, 1) == 38_500_000_000       # 28 + 10.5 = 38.5 GB
    assert zero_memory_per_device(psi, n, 2) == 26_250_000_000       # 14 + 12.25 = 26.25 GB
    assert zero_memory_per_device(psi, n, 3) == 14_000_000_000       # 16·7/8 = 14 GB
    assert [zero_memory_per_device(7e9, 8, s) / 1e9 for s in range(4)] == [112.0, 38.5, 26.25, 14.0]
    # the parts: 4·7 = 28 and 12·7/8 = 10.5; 2·7 = 14 and 14·7/8 = 12.25
    assert (4 * psi, 12 * psi / n) == (28e9, 10.5e9)
    assert (2 * psi, 14 * psi / n) == (14e9, 12.25e9)
    # "Without ZeRO the model does not fit on an 80 GB GPU; from stage 1 on, it does."
    fits = [zero_memory_per_device(psi, n, s) <= 80 * GB for s in range(4)]
    assert fits == [False, True, True, True]


def test_seed001_zero_communication_volume():
    # seed 001: "stages 1 and 2 cost no more communication than plain data parallelism";
    # stage 3: "The communication volume grows to 1.5 times that of plain data parallelism"
    for M, n in ((4000, 4), (2 * 7_000_000_000, 8), (1, 64)):
        dp = sim.ring_all_reduce_bytes(M, n)
        assert zero_communication_bytes(M, n, 0) == dp
        assert zero_communication_bytes(M, n, 1) == dp
        assert zero_communication_bytes(M, n, 2) == dp
        assert zero_communication_bytes(M, n, 3) == pytest.approx(1.5 * dp, rel=1e-15)
    assert zero_communication_bytes(4000, 4, 3) == 9000.0 == 1.5 * 6000.0


# ---------------------------------------------------------------------------
# seed 001: Megatron tensor-parallel MLP
# ---------------------------------------------------------------------------

# The seed gives X = (1, 2), XA = (1, 2, 1, 0), A of shape (2, 4), B of shape (4, 2),
# GPU 1's partial (0.841, 1.955) from rows 0-1 of B and GPU 2's (0.841, 0.841) from
# rows 2-3, but not A and B themselves: these are the simplest matrices consistent
# with all of its numbers.
SEED_X = [1.0, 2.0]
SEED_A = [[1, 0, 1, 0],
          [0, 1, 0, 0]]
SEED_B = [[1, 0],
          [0, 1],
          [1, 1],
          [0, 0]]


def r3(v):
    return [round(float(e), 3) for e in np.asarray(v).reshape(-1)]


def test_seed001_megatron_unsplit():
    XA = np.asarray(SEED_X) @ np.asarray(SEED_A)
    assert XA.tolist() == [1, 2, 1, 0]                              # "XA = (1, 2, 1, 0)"
    assert r3(sim.gelu(XA)) == [0.841, 1.955, 0.841, 0.0]            # "≈ (0.841, 1.955, 0.841, 0)"
    assert r3(sim.mlp(SEED_X, SEED_A, SEED_B)) == [1.682, 2.796]     # "(1.682, 2.796)"


def test_seed001_megatron_two_gpus():
    Y, partials = sim.tensor_parallel_mlp(SEED_X, SEED_A, SEED_B, 2, return_partials=True)
    assert r3(partials[0]) == [0.841, 1.955]     # GPU 1: columns 0-1 of A, rows 0-1 of B
    assert r3(partials[1]) == [0.841, 0.841]     # GPU 2: columns 2-3, rows 2-3
    assert r3(Y) == [1.682, 2.796]               # "The all-reduce adds them: (1.682, 2.796)"
    assert np.allclose(Y, sim.mlp(SEED_X, SEED_A, SEED_B), rtol=0, atol=1e-15)


def test_seed001_megatron_torch():
    torch = pytest.importorskip("torch")
    X = torch.tensor(SEED_X, dtype=torch.float64)
    Y, partials = sim.tensor_parallel_mlp(X, SEED_A, SEED_B, 2, return_partials=True)
    assert isinstance(Y, torch.Tensor)
    assert r3(Y.numpy()) == [1.682, 2.796]
    assert [r3(p.numpy()) for p in partials] == [[0.841, 1.955], [0.841, 0.841]]


def test_seed001_gelu_of_sum_is_not_sum_of_gelus():
    # seed 001: "GeLU(1 + 1) ≈ 1.955, while GeLU(1) + GeLU(1) ≈ 1.682"
    assert round(float(sim.gelu(1.0 + 1.0)), 3) == 1.955
    assert round(float(sim.gelu(1.0) + sim.gelu(1.0)), 3) == 1.682
    # The seed's numbers pin down the tanh approximation: the exact erf GeLU would
    # round to 1.954 and 1.683.
    assert round(float(sim.gelu(2.0, approximate="none")), 3) == 1.954
    assert round(float(2 * sim.gelu(1.0, approximate="none")), 3) == 1.683


# ---------------------------------------------------------------------------
# seed 001: GPipe pipeline
# ---------------------------------------------------------------------------

def test_seed001_gpipe_table():
    # seed 001: p = 2 stages, m = 3 micro-batches, forward pass; "·" means idle
    rows = sim.gpipe_schedule(2, 3)
    assert rows == [[0, 1, 2, None],
                    [None, 0, 1, 2]]
    assert sim.format_gpipe_schedule(rows).splitlines() == [
        "stage    slot 0  slot 1  slot 2  slot 3",
        "stage 0  0       1       2       ·",
        "stage 1  ·       0       1       2",
    ]
    # "2 of the 8 cells are idle"
    cells = [c for row in rows for c in row]
    assert (len(cells), cells.count(None)) == (8, 2)
    # "(2 - 1) / (3 + 2 - 1) = 1/4: the 2 idle cells out of 8"
    assert sim.pipeline_bubble_fraction(2, 3) == 1 / 4 == cells.count(None) / len(cells)


def test_seed001_bubble_examples():
    # "With p = 4 stages and m = 8 micro-batches the bubble is 3/11 ≈ 27% of the time;
    # with m = 32 it drops to 3/35 ≈ 8.6%."
    assert sim.pipeline_bubble_fraction(4, 8) == 3 / 11
    assert round(100 * sim.pipeline_bubble_fraction(4, 8)) == 27
    assert sim.pipeline_bubble_fraction(4, 32) == 3 / 35
    assert round(100 * sim.pipeline_bubble_fraction(4, 32), 1) == 8.6
    # "each stage is idle for p - 1 of the m + p - 1 time slots"
    for p, m in ((4, 8), (4, 32), (3, 1), (1, 5)):
        rows = sim.gpipe_schedule(p, m)
        assert all(len(row) == m + p - 1 for row in rows)
        assert all(row.count(None) == p - 1 for row in rows)


# ---------------------------------------------------------------------------
# seeds 002 / 003: gradient accumulation and activation recomputation
# ---------------------------------------------------------------------------

def test_seed002_accumulation_keeps_one_micro_batch_of_activations():
    # seed 002: gradient accumulation "allows you to store activations for one micro
    # batch at a time": 4 micro-batches of 2 need 1/4 of a batch of 8.
    full = activation_memory_bytes(1024, 8, 1024, 12, 16)
    micro = activation_memory_bytes(1024, 2, 1024, 12, 16)
    assert full == 4 * micro


def test_seed003_recompute_at_least_halves_saved_bytes():
    # seed 003: with recomputation "the bytes saved for the backward pass are at least
    # halved"; seed 001/000: checkpointing stores only some activations.
    for cfg in ((128, 4, 64, 2, 4), (2048, 1, 12288, 96, 96), (1, 1, 1, 1, 1)):
        none = activation_memory_bytes(*cfg)
        full = activation_memory_bytes(*cfg, recompute="full")
        assert 2 * full <= none
