"""The pure ring schedule (csrc/algo/ring_schedule.h), checked on its own and replayed against
seed 001's three-worker table, plus the seed's all-reduce example through the real ring."""
import numpy as np
import pytest

import ringcomm
from ringcomm import _C, _C_test


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("shift", [0, 1])
def test_schedule_invariants(n, shift):
    s = [_C_test.ring_schedule(n, r, shift) for r in range(n)]
    for r in range(n):
        left = (r - 1) % n
        assert s[r]["right"] == (r + 1) % n and s[r]["left"] == left
        for k in range(n - 1):
            # what I receive is what my left neighbour sends
            assert s[r]["rs_recv"][k] == s[left]["rs_send"][k]
            assert s[r]["ag_recv"][k] == s[left]["ag_send"][k]
            if k:
                # I forward what I combined / received one step earlier
                assert s[r]["rs_send"][k] == s[r]["rs_recv"][k - 1]
                assert s[r]["ag_send"][k] == s[r]["ag_recv"][k - 1]
        if n > 1:
            assert s[r]["rs_recv"][-1] == s[r]["owner"] == (r + shift) % n
            assert s[r]["ag_send"][0] == s[r]["owner"]
            # all-gather delivers every chunk but the owned one exactly once
            assert sorted(s[r]["ag_recv"]) == sorted(set(range(n)) - {s[r]["owner"]})


def test_schedule_reproduces_seed_001_table():
    # Seed 001: three workers [1,2,3], [10,20,30], [100,200,300]; worker i sends to i+1.
    expected = [
        [[1, 2, 303], [11, 20, 30], [100, 220, 300]],      # reduce-scatter, step 1
        [[1, 222, 303], [11, 20, 333], [111, 220, 300]],   # reduce-scatter, step 2
        [[111, 222, 303], [11, 222, 333], [111, 220, 333]],  # all-gather, step 1
        [[111, 222, 333], [111, 222, 333], [111, 222, 333]],  # all-gather, step 2
    ]
    n = 3
    w = [[1, 2, 3], [10, 20, 30], [100, 200, 300]]
    sched = [_C_test.ring_schedule(n, r, 1) for r in range(n)]  # shift 1 = the seed's numbering
    rows = []
    for step in range(n - 1):
        sent = [(r, sched[r]["rs_send"][step], w[r][sched[r]["rs_send"][step]]) for r in range(n)]
        for r, k, v in sent:
            w[(r + 1) % n][k] += v
        rows.append([list(x) for x in w])
    for step in range(n - 1):
        sent = [(r, sched[r]["ag_send"][step], w[r][sched[r]["ag_send"][step]]) for r in range(n)]
        for r, k, v in sent:
            w[(r + 1) % n][k] = v
        rows.append([list(x) for x in w])
    assert rows == expected


@pytest.mark.parametrize("count,n", [(0, 3), (1, 3), (7, 3), (10, 4), (3, 5)])
def test_chunk_bounds(count, n):
    b = _C.chunk_bounds(count, n)
    assert sum(c for _, c in b) == count
    assert [o for o, _ in b] == list(np.cumsum([0] + [c for _, c in b])[:-1])
    assert max(c for _, c in b) - min(c for _, c in b) <= 1


def _seed_example(comm):
    x = np.array([[1, 2, 3], [10, 20, 30], [100, 200, 300]][comm.rank], dtype=np.int64)
    comm.all_reduce(x)
    rs = np.zeros(1, np.int64)
    comm.reduce_scatter(rs, np.array([[1, 2, 3], [10, 20, 30], [100, 200, 300]][comm.rank], dtype=np.int64))
    ag = np.zeros(3, np.int64)
    comm.all_gather(ag, rs)
    return x.tolist(), rs.tolist(), ag.tolist()


@pytest.mark.timeout(60)
def test_seed_example_through_the_real_ring():
    res = ringcomm.launch(_seed_example, 3, timeout=50)
    for r, (ar, rs, ag) in enumerate(res):
        assert ar == [111, 222, 333]
        assert rs == [[111], [222], [333]][r]   # reduce-scatter: each holds one slice of the sum
        assert ag == [111, 222, 333]            # all-gather of the slices = the all-reduce
