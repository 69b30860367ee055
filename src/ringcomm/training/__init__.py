"""The training wrappers: ddp, zero, tp, pp, recompute, saved_tensors and the memory models, built
on torch.distributed calls or the plain API. They import the core and the back ends, never an
application.
"""
