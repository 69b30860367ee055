"""A numpy model of the order in which ringcomm's all_reduce adds (csrc/algo/ring_schedule.h,
ar_chunk_*), written from the rule, not from the code: the buffer is cut into segments of at most
1 MiB, their number a multiple of n and at least 2n, each rounded up to whole elements; chunk k is
the k-th run of (segments / n) segments; an element of chunk k is summed as x[k+1], then
x[k+2] + that, ..., then x[k] + that, rounding to the dtype after every addition."""
import numpy as np


def ar_chunk_elems(count, n, esize):
    if count <= 0:
        return 1
    nbytes = count * esize
    max_seg = esize * max(1, (1 << 20) // esize)
    nseg = max(-(-nbytes // max_seg), 2 * n)
    nseg = -(-nseg // n) * n
    seg_bytes = -(-(-(-nbytes // nseg)) // esize) * esize
    return (nseg // n) * (seg_bytes // esize)


def ordered_sum(xs):
    """SUM all-reduce of the per-rank arrays xs, in ringcomm's (and gloo's ring) order."""
    n, count = len(xs), len(xs[0])
    dt = xs[0].dtype
    if n == 1:
        return xs[0].copy()
    ce = ar_chunk_elems(count, n, dt.itemsize)
    out = np.empty_like(xs[0])
    for k in range(n):
        sl = slice(min(k * ce, count), min((k + 1) * ce, count))
        acc = xs[(k + 1) % n][sl]
        for t in range(2, n):
            acc = (xs[(k + t) % n][sl] + acc).astype(dt)
        out[sl] = (xs[k][sl] + acc).astype(dt)
    return out


def order_sensitive(count, rank, dtype):
    """Values of wide-ranging magnitude: sums and products of three or more depend on their order."""
    rng = np.random.default_rng(31 * count + rank)
    return (rng.standard_normal(count) * 10.0 ** rng.uniform(-3, 3, count)).astype(dtype)
