"""The model and data the training demos train (``ringcomm.apps.train``'s strategies and
``ringcomm.apps.parallel_demo``'s tensor / pipeline layouts): a GPT-style ``TinyLM``, a learnable
synthetic token stream (``make_batch``) and the command-line options that shape them
(``add_model_arguments``). Both demos build on this module; neither imports the other's package
for it."""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from ..training.recompute import checkpoint


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention + 4x GELU MLP."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    """A GPT-style language model; ``forward(idx, targets)`` returns the mean cross-entropy."""

    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int, seq_len: int,
                 recompute: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.recompute = recompute

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = checkpoint(blk, x) if self.recompute else blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_batch(o: dict, step: int):
    """The global batch of ``step``: a noisy Markov chain over the vocabulary (learnable)."""
    g = torch.Generator().manual_seed(o["seed"] * 1_000_003 + 17)
    table = torch.randperm(o["vocab"], generator=g)          # the "grammar": next = table[prev]
    g.manual_seed(o["seed"] * 1_000_003 + 1000 + step)
    n, t = o["global_batch"], o["seq_len"] + 1
    seq = torch.empty(n, t, dtype=torch.long)
    seq[:, 0] = torch.randint(o["vocab"], (n,), generator=g)
    noise = torch.rand(n, t, generator=g) < 0.1
    rand = torch.randint(o["vocab"], (n, t), generator=g)
    for i in range(1, t):
        seq[:, i] = torch.where(noise[:, i], rand[:, i], table[seq[:, i - 1]])
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The TinyLM's shape (None: the --quick or full default) and its AdamW settings, shared by
    ``ringcomm.apps.train`` and ``ringcomm.apps.parallel_demo``."""
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--d-model", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
