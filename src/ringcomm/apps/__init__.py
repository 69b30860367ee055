"""Layer 2, the applications: bench (``python -m ringcomm.bench``), tune, train and its report,
simulate, the demos (demo, parallel_demo) and their model (tiny_lm).

Its modules are modules of the package: ``ringcomm/__init__.py`` puts this folder on
``ringcomm.__path__``, so ``apps/bench/`` is ``ringcomm.bench``. They may import every layer
below (the core, the back ends, the training wrappers). This module only names the layer: its
search path is empty, so no module is imported a second time as ``ringcomm.apps.<name>``.
"""
__path__ = []
