"""Train a small transformer language model with every data-parallel strategy and compare them.

    python -m ringcomm.apps.train --quick                  # tiny model: under 2 minutes (a test holds it)
    python -m ringcomm.apps.train --world-size 2 --backend ringcomm --plot out.png --json out.json

Configurations: ``single`` (one process, the reference), ``torch_ddp`` (torch's
DistributedDataParallel), ``bucketed_ddp`` (:class:`ringcomm.training.ddp.BucketedDDP`), ``zero1``,
``zero2``, ``zero3`` (from ``ringcomm.training.zero``; skipped with a notice if it is missing), each with and
without activation recomputation (:func:`ringcomm.training.recompute.checkpoint` around every transformer
block) and in fp32 or bf16 (CPU autocast; parameters, gradients and optimizer states stay fp32).

Every configuration trains from the same initial weights on the same synthetic token stream with
the same global batch (each of the ``--world-size`` ranks takes its slice), so each loss curve must
match the single-process curve of the same precision to a tolerance; the run exits with status 1
if one does not.

Reported per configuration:

* **steps/s** = 1 / the median time of the timed steps (after ``--warmup``), each step timed on
  its slowest rank (the median resists the preemption spikes of a busy machine; the mean-based
  figure is in the JSON as ``steps_per_s_mean``);
* **scaling efficiency** = steps/s / (world size x steps/s of the single process with the same
  precision and recomputation), i.e. throughput per rank relative to one process (strong scaling
  at a fixed global batch; each process uses ``--threads`` threads);
* **comm %** = time spent waiting in collectives / wall time, mean over ranks. It is measured by
  wrapping the ``torch.distributed`` collectives (synchronous calls are timed whole, async calls'
  ``Work.wait()`` is timed). torch DDP issues its collectives from its C++ reducer, out of reach
  of the wrapper; for it the figure is the time from the last gradient becoming ready to
  ``backward()`` returning (the reducer's wait for the outstanding buckets);
* **memory per rank**, measured on tensors at one step (the last warm-up step): parameters (unique
  storages of the module's parameters), gradients (of ``.grad`` / gradient buckets / gradient
  shards), optimizer states (tensors in the optimizer state, plus master copies), and activations
  (peak bytes alive among the tensors saved for backward, counted with
  ``torch.autograd.graph.saved_tensors_hooks``; with recomputation this includes the recomputed
  block's transient tensors) - beside the formulas of :mod:`ringcomm.training.memory`
  (``zero_memory_per_device`` for the model states, i.e. the 16 bytes/parameter mixed-precision
  Adam budget split by ZeRO stage, and ``activation_memory_bytes`` of Korthikanti et al.). Note
  that fp32 AdamW also costs 16 bytes/parameter but split 4 + 4 + 8 (no master copy) instead of the
  formula's 2 + 2 + 12.

The figures go to a table on stdout, a PNG (``--plot``: loss curves and memory bars) and
optionally a JSON file (``--json``).
"""
from __future__ import annotations

from ..tiny_lm import Block, TinyLM, make_batch
from .cli import build_parser, main, parser_for
from .comm_timer import CommTimer
from .memory_meters import ActivationMeter, model_state_bytes
from .runner import run_config
from .strategies import PRECISIONS, STRATEGIES, TOLERANCE

__all__ = ["main", "TinyLM", "STRATEGIES", "ActivationMeter", "CommTimer", "model_state_bytes"]
