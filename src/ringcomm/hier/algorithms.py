"""The two-level algorithms: shared memory inside each node, the inter-node engine between nodes.

Methods of ``HierarchicalCommunicator`` (a mixin), run on its executor one at a time, on flat
torch views; see the package docstring for the schedules.
"""
from __future__ import annotations

from ..core.errors import InvalidArgumentError
from .tensors import balanced, overlaps

__all__ = ["TwoLevelAlgorithms"]


class TwoLevelAlgorithms:
    """all_reduce (_ar), reduce_scatter (_rs), all_gather (_ag, _ag_equal), broadcast (_bcast)
    and barrier (_barrier) over ``self.intra`` (the node's Communicator) and ``self._inter``
    (the engine). Needs the communicator's topology attributes, ``_scratch_bufs`` and
    ``_scratch_cache`` (RINGCOMM_HIER_SCRATCH_CACHE, read when the communicator is built)."""

    def _scratch(self, slot: str, count: int, dtype):
        """A per-slot temporary (operations run one at a time, so one buffer per role suffices).
        Buffers up to RINGCOMM_HIER_SCRATCH_CACHE bytes are kept for the next call (no page
        faults on every call); larger ones are allocated per call and freed after it."""
        import torch
        nbytes = count * dtype.itemsize
        buf = self._scratch_bufs.get(slot)
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 64), dtype=torch.uint8)
            if nbytes <= self._scratch_cache:
                self._scratch_bufs[slot] = buf
        return buf[:nbytes].view(dtype)

    # -- algorithms (run on the executor; tensors are flat torch views) ----------------------------
    def _ar(self, src, dst, op: str):
        """all_reduce src into dst (dst may be src)."""
        topo, intra, inter = self.topology, self.intra, self._inter
        rop = "SUM" if op == "AVG" else op
        M, L = src.numel(), self.local_size
        if M == 0:
            return
        if L == 1:
            if dst is not src:
                dst.copy_(src)
            inter.all_reduce(inter.col, dst, rop)
            if op == "AVG":
                dst.div_(self.world_size)
            return
        if topo.uniform:
            off, cnt = balanced(M, L, self.local_rank)
            shard = self._scratch("ar", cnt, src.dtype) if dst is src else dst[off:off + cnt]
            intra.reduce_scatter(shard, src, op=rop)
            if cnt:
                inter.all_reduce(inter.col, shard, rop)
                if op == "AVG":
                    shard.div_(self.world_size)
            intra.all_gather(dst, shard)
            return
        # Uneven nodes: reduce to the leader, all_reduce among leaders, broadcast.
        leader = self.local_rank == 0
        intra.reduce(src, root=0, op=rop, output=dst if (leader and dst is not src) else None)
        if leader:
            inter.all_reduce(inter.lead, dst, rop)
            if op == "AVG":
                dst.div_(self.world_size)
        intra.broadcast(dst, root=0)

    def _rs(self, out, inp, op: str):
        """Flat reduce_scatter: chunk `rank` of the balanced split of inp lands in out."""
        import torch
        topo, intra, inter = self.topology, self.intra, self._inter
        W, N, L = self.world_size, self.num_nodes, self.local_size
        M = inp.numel()
        if M == 0:
            return
        rop = "SUM" if op == "AVG" else op
        off, cnt = balanced(M, W, self.rank)
        if not topo.uniform:
            full = self._scratch("rs_full", M, inp.dtype)
            self._ar(inp, full, op)
            out.copy_(full[off:off + cnt])
            return
        c = -(-M // W)
        r = M % W
        if r == 0:
            padded = inp.view(W, c)
        else:   # rows of c elements: the first r chunks have c, the rest c - 1 (+ 1 pad)
            padded = self._scratch("rs_pad", W * c, inp.dtype).view(W, c)
            padded[:r] = inp[:r * c].view(r, c)
            padded[r:, :c - 1] = inp[r * c:].view(W - r, c - 1)
            padded[r:, c - 1:].zero_()
        if self._identity_perm:
            blocks = padded
        else:   # row l*N + n <- chunk of (node n, local rank l)
            blocks = self._scratch("rs_perm", W * c, inp.dtype).view(W, c)
            torch.index_select(padded, 0, self._perm, out=blocks)
        if L > 1:
            blk = self._scratch("rs_blk", N * c, inp.dtype)
            intra.reduce_scatter(blk, blocks.view(-1), op=rop)
        else:
            blk = blocks.view(-1)
        chunk = out if cnt == c else self._scratch("rs_chunk", c, inp.dtype)
        inter.reduce_scatter(inter.col, chunk, blk, rop)
        if op == "AVG":
            chunk.div_(W)
        if chunk is not out:
            out.copy_(chunk[:cnt])

    def _ag_equal(self, out, inp, what="all_gather"):
        """All-gather, every contribution inp.numel() elements."""
        topo, intra, inter = self.topology, self.intra, self._inter
        W, N, L = self.world_size, self.num_nodes, self.local_size
        m = inp.numel()
        if m == 0:
            return
        if not topo.uniform:
            src = inp.clone() if overlaps(inp, out) else inp
            inter.all_gather(inter.world, out, src, what)
            return
        if L == 1:      # one rank per node: the column is everyone, in rank order
            inter.all_gather(inter.col, out, inp.clone() if overlaps(inp, out) else inp, what)
            return
        col = self._scratch("ag_col", N * m, inp.dtype)
        inter.all_gather(inter.col, col, inp, what)
        if self._identity_perm:
            intra.all_gather(out, col)
            return
        tmp = self._scratch("ag_all", W * m, inp.dtype)
        intra.all_gather(tmp, col)
        out.view(W, m).index_copy_(0, self._perm, tmp.view(W, m))

    def _ag(self, out, inp):
        """All-gather with possibly unequal contributions: exchange the sizes first."""
        import torch
        W = self.world_size
        mine = torch.tensor([inp.numel()], dtype=torch.int64)
        counts = torch.empty(W, dtype=torch.int64)
        self._ag_equal(counts, mine, "all_gather_sizes")
        total = int(counts.sum())
        if out.numel() != total:
            raise InvalidArgumentError(
                f"ringcomm: all_gather on rank {self.rank}: output has {out.numel()} elements, the "
                f"contributions add up to {total} ({counts.tolist()})")
        cm = int(counts.max())
        if int(counts.min()) == cm:
            self._ag_equal(out, inp)
            return
        pin = self._scratch("agv_in", cm, inp.dtype)
        pin[:inp.numel()].copy_(inp)
        pout = self._scratch("agv_out", W * cm, inp.dtype).view(W, cm)
        self._ag_equal(pout.view(-1), pin)
        mask = torch.arange(cm).unsqueeze(0) < counts.unsqueeze(1)
        out.copy_(pout[mask])

    def _bcast(self, t, root: int):
        topo, intra, inter = self.topology, self.intra, self._inter
        if t.numel() == 0:
            return
        nr, lr = topo.node_of[root], topo.local_rank_of[root]
        L = self.local_size
        if topo.uniform:
            if self.local_rank == lr:
                inter.broadcast(inter.col, t, nr)
            if L > 1:
                intra.broadcast(t, root=lr)
            return
        if self.node == nr and L > 1:
            intra.broadcast(t, root=lr)
        if self.local_rank == 0:
            inter.broadcast(inter.lead, t, nr)
        if self.node != nr and L > 1:
            intra.broadcast(t, root=0)

    def _barrier(self):
        if self.local_size > 1:
            self.intra.barrier()
        if self.local_rank == 0:
            self._inter.barrier(self._inter.lead)
        if self.local_size > 1:
            self.intra.barrier()
