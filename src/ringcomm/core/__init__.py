"""Layer 0, the core: the library itself (communicator front, plain API, arrays, errors, config,
tables, rendezvous, launch, work, the host back end, the CPU placement).

Its modules are modules of the package: ``ringcomm/__init__.py`` puts this folder on
``ringcomm.__path__``, so ``core/front.py`` is ``ringcomm.front``. They import only each other,
the compiled core (``ringcomm._C``) and, where choosing a back end is the core's job, that back
end (``ringcomm._layers.CORE_TO_BACK_END``). This module only names the layer: its search path is
empty, so no module is imported a second time as ``ringcomm.core.<name>``.
"""
__path__ = []
