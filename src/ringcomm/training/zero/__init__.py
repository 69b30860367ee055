"""ZeRO (Zero Redundancy Optimizer) stages 1, 2 and 3, written against ``torch.distributed`` calls.

The memory model is the seeds' (ZeRO paper, seed 000 / seed 001): mixed-precision Adam holds
2 bytes of 16-bit parameters + 2 bytes of 16-bit gradients + 12 bytes of fp32 optimizer state
(master weights 4, momentum 4, variance 4) per parameter, and ZeRO partitions them N ways:

=====  ===========================  ==================  ====================================
stage  partitioned                  bytes per device    class
=====  ===========================  ==================  ====================================
1      optimizer states             4Ψ + 12Ψ/N          ``ZeroOptimizer(..., stage=1)``
2      + gradients                  2Ψ + 14Ψ/N          ``ZeroOptimizer(..., stage=2)``
3      + parameters (= FSDP)        16Ψ/N               ``ZeroStage3(module, ...)``
=====  ===========================  ==================  ====================================

``memory_breakdown()`` on either class reports what this rank actually holds, to print beside
:func:`ringcomm.training.memory.zero_memory_per_device`.

Only ``dist.reduce_scatter_single`` / ``reduce_scatter_tensor``, ``dist.all_gather_single`` /
``all_gather_into_tensor``, ``dist.all_reduce`` and ``dist.broadcast`` are used (SUM only, never
AVG), so any backend works, ``"gloo"`` and ``"ringcomm"`` included. If a backend raises for a
reduce-scatter or all-gather (an unsupported dtype, say), the call is replaced, for the rest of
the run, by an exact ``all_reduce``-based fallback (``_Collectives``); the environment variable
``RINGCOMM_ZERO_COLLECTIVES`` = ``auto`` (default) | ``native`` (never fall back) | ``fallback``
(always) selects the policy, and so does the ``collectives=`` argument.

Flat-buffer layout (every stage)
--------------------------------
Parameters are grouped into *flat groups*: a stage-1/2 *bucket* (parameters of one param group,
one dtype and device, at most ``bucket_cap_mb``; with the default cap a small model is ONE flat
buffer per param group) or a stage-3 *unit* (the direct parameters of one leaf module). A group's
parameters are laid end to end in registration order (``offsets[i]``), then padded with zeros to
``padded = ceil(numel / N) * N`` elements, so that it splits into N equal shards of
``S = padded / N`` elements; rank r owns ``[r*S, (r+1)*S)``. The padding (at most N-1 elements
per group) is always zero: its gradient is zero, so Adam keeps it at zero, and it is dropped when
a checkpoint is written. Rank r keeps, per group:

* ``master``: the fp32 master copy of its shard (an ``nn.Parameter`` of S elements): this is
  what ``optimizer_class`` steps, so its Adam states are S elements too (1/N of the model);
* ``grad_shard``: the SUM over ranks of the gradient of its shard, in the compute dtype (2 bytes
  per element under mixed precision, as in the 2+2+12 budget), still multiplied by the loss
  scale; ``step()`` divides by N and by the loss scale in fp32 just before the update.

Stage 1 keeps full parameters (the model's parameters become views into one compute-dtype flat
buffer per bucket) and full local gradients (ordinary ``.grad``); ``step()`` reduce-scatters each
bucket's gradients into the shard, steps the master shard and all-gathers the updated shards
straight into the flat parameter buffer. Stage 2 reduce-scatters during backward: a
``register_post_accumulate_grad_hook`` per parameter marks it ready; when a bucket is complete
(and all the buckets before it have been issued: buckets are issued in a fixed order so that all
ranks issue the same collectives in the same order) its gradients are copied into a temporary
flat buffer, their ``.grad`` set to ``None`` at once, and an asynchronous reduce-scatter is issued
(at most ``RINGCOMM_ZERO_MAX_INFLIGHT`` in flight). Each rank therefore holds ~1/N of the
gradients once backward is over. Buckets left incomplete by backward (some parameter without a
gradient) are reduced at ``step()`` with zeros for the missing gradients (treated as zero, as
DeepSpeed does; Adam still decays them); a bucket in which no parameter got a gradient is not
reduced and its master shard is skipped by the optimizer. Every rank must produce gradients for
the same parameters in the same order, as with DDP.

Stage 3 (``ZeroStage3``): hooks and their order invariants
---------------------------------------------------------
Each unit's parameters are removed from their module; the unit keeps its shard (``S`` elements in
the compute dtype; in fp32 it *is* the master) and a ``flat_full`` ``nn.Parameter`` of ``padded``
elements whose storage is resized to 0 bytes whenever the full weights are not needed.

1. *Forward pre-hook* (module): all-gather the shards into ``flat_full``'s storage (resized back
   to ``padded`` elements), then set the module's attributes (``weight``, ``bias``, ...) to views
   of ``flat_full`` made with ``torch.split`` (so autograd routes every view's gradient to
   ``flat_full`` through one ``SplitBackward``, i.e. one concatenation).
2. *Forward post-hook* (module): the attributes are set back to ``None`` and the storage is
   resized to 0 (unless a backward of this unit is in progress: recomputation), so between layers
   a rank holds only shards. The views that autograd saved for backward keep referencing the
   storage object, not its bytes. A multi-grad hook (``register_multi_grad_hook(mode="any")``)
   is put on the outputs that require grad.
3. *Pre-backward* (that hook): it fires when the gradient of the module's output has been
   computed, i.e. before any backward op of the module runs: the storage is re-gathered (no-op if
   still full), which restores the saved views' bytes. The collective writes through
   ``flat_full.data`` (a separate version counter), so autograd's saved-tensor version checks are
   not tripped.
4. *Post-backward* (``register_post_accumulate_grad_hook`` on ``flat_full``): it fires after all
   contributions to the unit's gradient have been summed, i.e. after the last backward op that
   needs the full weights; the storage is freed, ``flat_full.grad`` is reduce-scattered
   (asynchronously) into the grad shard and set to ``None``.

Collectives are issued in autograd's execution order, which is the same on every rank when every
rank runs the same graph (same modules, same order, no data-dependent control flow). A reentrant
recomputation (:func:`ringcomm.training.recompute.checkpoint`) fits: its no-grad forward gathers and frees;
its recomputation in backward gathers again (step 1), frees (2), and its nested backward runs 3
and 4. A parameter may belong to one module only (no tied weights), every parameter must require
grad, and a module's parameters must only be used inside that module's forward.

Mixed precision and loss scaling
--------------------------------
``mixed_precision="bf16"`` or ``"fp16"``: parameters and gradients are bf16/fp16 (compute and
communication), master weights and optimizer states fp32. ``ZeroOptimizer`` changes the model's
parameters' dtype in place (feed it inputs of ``compute_dtype``); ``ZeroStage3`` casts floating
inputs for you. With fp16 a :class:`DynamicLossScaler` is used by default: ``opt.scale_loss(loss)``
(or ``loss * opt.loss_scale``) before ``backward()``; ``step()`` checks every rank's gradient shard
for inf/NaN (one all-reduce of a flag), skips the update and multiplies the scale by
``backoff_factor`` (0.5) on overflow, and multiplies it by ``growth_factor`` (2) after
``growth_interval`` consecutive good steps.

Gradient accumulation and CPU offload
-------------------------------------
``with opt.no_sync():`` (both classes): backward passes inside the context issue no gradient
collective; stage 1 sums into ``.grad`` as always, stage 2 leaves the gradients in ``.grad``
(its post-accumulate hooks return at once, so no bucket is marked ready), stage 3 adds each unit's
full gradient into ``acc_grad`` in its post-backward hook. The first backward outside the context
reduces the accumulated sum with its own gradients (stage 2: the bucket's flat copy of ``.grad``
contains both; stage 3: ``acc_grad`` is added before the reduce-scatter), and ``step()`` reduces
whatever is still local, so k micro-batches of loss / k with the first k-1 under ``no_sync()`` give
the update of one batch. Stage 3 still all-gathers parameters during those micro-batches.

``offload="cpu"``: the master shard is created in host memory (pinned for CUDA parameters), so
``torch.optim`` keeps its states there too and steps there; ``step()`` copies the reduced gradient
shard device -> host (in ``_prepare_grads``) and the updated master host -> device before the
all-gather (stages 1/2) or into the compute shard (stage 3, whose fp32 shard is then a separate
device copy instead of the master itself). The arithmetic is unchanged: same values as without
offload.

Checkpoints
-----------
``state_dict()`` is collective: every rank must call it; rank 0 receives the full checkpoint (and
the other ranks ``None``): fp32 master parameters and unsharded optimizer states per parameter
(``ZeroOptimizer``: keyed by parameter index as in ``torch.optim``; ``ZeroStage3``: by qualified
parameter name), the param groups' hyper-parameters and the loss scaler. ``load_state_dict(sd)``
is given the full checkpoint on every rank (e.g. ``torch.load`` on each), on ANY world size: each
rank slices its own shards out of it, without communication.
"""
from __future__ import annotations

from .core import CHECKPOINT_FORMAT
from .flat import _FlatLayout  # noqa: F401 - the layout's unit test
from .precision import DynamicLossScaler
from .stage1_2 import ZeroOptimizer
from .stage3 import FullyShardedModule, ZeroStage3

__all__ = ["ZeroOptimizer", "ZeroStage3", "FullyShardedModule", "DynamicLossScaler",
           "CHECKPOINT_FORMAT"]
