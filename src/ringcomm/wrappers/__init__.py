"""Layer 1, the training wrappers: ddp, zero, tp, pp, recompute, saved_tensors and the memory
models, built on torch.distributed calls or the plain API.

Its modules are modules of the package: ``ringcomm/__init__.py`` puts this folder on
``ringcomm.__path__``, so ``wrappers/ddp.py`` is ``ringcomm.ddp``. They import the core and the
back ends (layer 0) and each other, never an application. This module only names the layer: its
search path is empty, so no module is imported a second time as ``ringcomm.wrappers.<name>``.
"""
__path__ = []
