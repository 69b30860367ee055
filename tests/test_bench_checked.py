"""ringcomm.bench.checked: the expected outputs of the one-call-at-a-time probes' cases are those of
the collectives (computed here from every rank's input by numpy), and a call that did nothing is
caught."""
import numpy as np
import pytest

from ringcomm.bench.checked import OPS, CheckedCall

WORLD, COUNT = 3, 12


class _Simulated:
    """A communicator of WORLD ranks in one process: a call records its buffers; ``settle`` runs the
    collective over every rank's recorded buffers at once."""

    def __init__(self):
        self.calls = {}

    def bind(self, rank):
        sim = self

        class _Rank:
            def __getattr__(self, op):
                def call(*bufs, root=None):
                    sim.calls[rank] = (op, bufs)
                return call
        return _Rank()

    def settle(self):
        op = self.calls[0][0]
        ins = {r: b[-1].copy() for r, (_, b) in self.calls.items()}
        total = sum(ins.values())
        blk = COUNT // WORLD
        for r, (_, bufs) in self.calls.items():
            if op == "all_reduce" or (op == "reduce" and r == 0):
                bufs[0][:] = total
            elif op == "broadcast":
                bufs[0][:] = ins[0]
            elif op == "all_gather":
                bufs[0][:] = np.concatenate([ins[p] for p in range(WORLD)])
            elif op == "reduce_scatter":
                bufs[0][:] = total[r * blk:(r + 1) * blk]
            elif op == "all_to_all":
                bufs[0][:] = np.concatenate([ins[q][r * blk:(r + 1) * blk] for q in range(WORLD)])


@pytest.mark.parametrize("op", OPS)
def test_expected_outputs_are_the_collectives(op):
    sim = _Simulated()
    cases = [CheckedCall(op, COUNT, r, WORLD) for r in range(WORLD)]
    for r, c in enumerate(cases):
        c.fill()
        c.bound(sim.bind(r))()
    sim.settle()
    assert [c.wrong() for c in cases] == [0] * WORLD
    # A call that wrote nothing: every rank that must find a result is told it is wrong.
    for c in cases:
        c.fill()
        if c.y is not None:
            c.y[:] = -1
    must = [r for r in range(WORLD) if not (op == "reduce" and r != 0) and not (op == "broadcast" and r == 0)]
    assert [r for r, c in enumerate(cases) if c.wrong() > 0] == must


def test_unknown_collective_is_refused():
    with pytest.raises(ValueError, match="no checked case"):
        CheckedCall("gather", COUNT, 0, WORLD)
