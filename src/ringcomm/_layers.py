"""The package's layers. A module imports only from its own layer and the layers below it, and
no chain of imports leads from a module back to itself; ``tests/test_layers.py`` checks both on
every import of every module (at module level and inside functions, relative and absolute).

    layer  name          modules (a package stands for all its modules)
    0      core          ringcomm (the package itself), errors, tables, config, arrays,
                         rendezvous, work, front, cpus, host, api, launch, machine, _layers
           back ends     torch (the torch.distributed backend), cuda (CUDA arrays),
                         hier (ranks on several nodes), torchft (a torchft ProcessGroup)
    1      wrappers      ddp, zero, tp, pp, recompute, memory, saved_tensors
    2      applications  bench, train, parallel_demo, tiny_lm (their model), simulate, demo,
                         tune (the machine profile of the cost model)

Layer 0 is ordered too. A back end builds on the core and never imports another back end. The
core imports a back end only where choosing that back end is the core's job, the pairs in
``CORE_TO_BACK_END``: the plain API never imports the torch backend (importing
``ringcomm.torch`` is what registers it with torch.distributed).
"""
from __future__ import annotations

__all__ = ["PACKAGE", "CORE", "BACK_ENDS", "CORE_TO_BACK_END", "LAYERS", "LAYER_NAMES",
           "layer_of", "back_end_of"]

PACKAGE = "ringcomm"

CORE = ("errors", "tables", "config", "arrays", "rendezvous", "work", "front", "cpus", "host",
        "api", "launch", "machine", "_layers")
BACK_ENDS = ("torch", "cuda", "hier", "torchft")

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


def _top(module: str) -> str | None:
    """'ringcomm.bench.cli' -> 'bench'; '' for the package itself; None outside it."""
    if module == PACKAGE:
        return ""
    if not module.startswith(PACKAGE + "."):
        return None
    return module[len(PACKAGE) + 1:].split(".", 1)[0]


def layer_of(module: str) -> int | None:
    """The layer of a module of the package (a dotted name), or None if no layer names it."""
    top = _top(module)
    if top == "":
        return 0
    return next((n for n, names in LAYERS.items() if top in names), None)


def back_end_of(module: str) -> str | None:
    """The back end a module belongs to ('torch', 'cuda', 'hier', 'torchft'), or None."""
    top = _top(module)
    return top if top in BACK_ENDS else None
