"""The package's layers and the folders that hold them. A module imports only from its own layer
and the layers below it, and no chain of imports leads from a module back to itself;
``tests/test_layers.py`` checks both on every import of every module (at module level and inside
functions, relative and absolute), and that every module's file sits in its layer's folder.

    layer  name          folder       modules (a package stands for all its modules)
    0      core          core/        ringcomm (the package itself), errors, tables, config,
                                      arrays, rendezvous, work, front, cpus, host, api, launch,
                                      machine; _layers sits beside __init__.py
           back ends     cuda/ hier/  torch (the torch.distributed backend and the torchft process
                         torch/       groups), cuda (CUDA arrays), hier (ranks on several nodes);
                                      torchft, beside __init__.py, is the torchft groups' public
                                      import path, a module of the torch back end
    1      wrappers      wrappers/    ddp, zero, tp, pp, recompute, memory, saved_tensors
    2      applications  apps/        bench, train, parallel_demo, tiny_lm (their model),
                                      simulate, demo, tune (the machine profile of the cost model)

A layer folder (core/, wrappers/, apps/) is not a namespace of its own: ``ringcomm/__init__.py``
puts it on the package's ``__path__``, so its modules are modules of the package itself
(``ringcomm.front``, ``ringcomm.ddp``, ``ringcomm.bench``), found there by the import system.
A back end is a subpackage (``ringcomm.torch``) and holds its own modules; a back-end name in
``ALIASES`` (torchft) is a short module beside ``__init__.py``, a public path to a module of
the back end it belongs to.

Layer 0 is ordered too. A back end builds on the core and never imports another back end. The
core imports a back end only where choosing that back end is the core's job, the pairs in
``CORE_TO_BACK_END``: the plain API never imports the torch backend (importing
``ringcomm.torch`` is what registers it with torch.distributed).
"""
from __future__ import annotations

__all__ = ["PACKAGE", "CORE", "BACK_ENDS", "ALIASES", "CORE_TO_BACK_END", "LAYERS", "LAYER_NAMES",
           "LAYER_FOLDERS", "folder_of", "layer_of", "back_end_of"]

PACKAGE = "ringcomm"

CORE = ("errors", "tables", "config", "arrays", "rendezvous", "work", "front", "cpus", "host",
        "api", "launch", "machine", "_layers")
BACK_ENDS = ("torch", "cuda", "hier", "torchft")
# A back end's name that is only a public path to a module of another back end (a short module
# beside __init__.py) -> the back end it belongs to.
ALIASES = {"torchft": "torch"}

# (core module, back end) -> why that module chooses that back end.
CORE_TO_BACK_END = {
    ("api", "hier"): "init() hands ranks that span several nodes to the hierarchical communicator",
    ("host", "cuda"): "a collective on CUDA arrays runs on the CUDA communicator",
}

LAYERS = {
    0: CORE + BACK_ENDS,
    1: ("ddp", "zero", "tp", "pp", "recompute", "memory", "saved_tensors"),
    2: ("bench", "train", "parallel_demo", "tiny_lm", "simulate", "demo", "tune"),
}
LAYER_NAMES = {0: "core and back ends", 1: "training wrappers", 2: "applications"}

# The folders on the package's __path__, one per layer, in the order the import system searches
# them (after the package's own folder, which holds __init__.py, _layers.py and the back ends).
LAYER_FOLDERS = {0: "core", 1: "wrappers", 2: "apps"}


def _top(module: str) -> str | None:
    """'ringcomm.bench.cli' -> 'bench'; '' for the package itself; None outside it."""
    if module == PACKAGE:
        return ""
    if not module.startswith(PACKAGE + "."):
        return None
    return module[len(PACKAGE) + 1:].split(".", 1)[0]


def folder_of(module: str) -> str | None:
    """The folder, relative to the package's folder, that holds a module's file (or its package):
    its layer's folder for a module of a layer folder, "" for the package itself, ``_layers`` and
    the back ends (which are subpackages beside them); None for a module no layer names."""
    top = _top(module)
    if top in ("", "_layers") or top in BACK_ENDS:
        return ""
    layer = layer_of(module)
    return None if layer is None else LAYER_FOLDERS[layer]


def layer_of(module: str) -> int | None:
    """The layer of a module of the package (a dotted name), or None if no layer names it."""
    top = _top(module)
    if top == "":
        return 0
    in_layer = next((n for n, names in LAYERS.items() if top in names), None)
    if in_layer is not None:
        return in_layer
    return next((n for n, folder in LAYER_FOLDERS.items() if top == folder), None)


def back_end_of(module: str) -> str | None:
    """The back end a module belongs to ('torch', 'cuda', 'hier'; ``ringcomm.torchft`` belongs to
    'torch'), or None."""
    top = _top(module)
    return ALIASES.get(top, top) if top in BACK_ENDS else None
