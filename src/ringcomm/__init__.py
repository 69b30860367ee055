"""ringcomm: ring collectives over host shared memory, with a torch.distributed backend.

    import ringcomm
    comm = ringcomm.init()                 # torchrun's env, or rank=/world_size=/store=/init_method=
    comm.all_reduce(x)                     # numpy arrays and torch CPU tensors, in place
    ringcomm.launch(fn, 4)                 # fn(comm) on 4 local processes

Importing ringcomm creates nothing and changes no environment; ``import ringcomm.torch``
registers the "ringcomm" torch.distributed backend.

The subpackages are the layers (docs/architecture.md; the import-linter contracts in
pyproject.toml): ``ringcomm.core`` is the library itself; ``ringcomm.cuda``, ``ringcomm.hier``
and ``ringcomm.torch`` are the back ends; ``ringcomm.training`` holds the training wrappers;
``ringcomm.bench`` and ``ringcomm.apps`` are the applications. Every module's import path is its
file's path. This module re-exports the public API.
"""
from typing import TYPE_CHECKING

from .core.errors import (ClosedError, InvalidArgumentError, MismatchError, PeerFailureError,
                          RingcommError, TimeoutError, UnsupportedError)
from .core.launch import LaunchError, launch
from .core.tables import ReduceOp
from .core.work import Work

if TYPE_CHECKING:
    from .core.api import Communicator, CommunicatorBase, get_default, init, set_default

# ringcomm.core.api loads the C extension, so its names load on first use (torch's backend
# autoload imports ringcomm.torch cheaply and never fails because of the extension).
_API_NAMES = ("Communicator", "CommunicatorBase", "get_default", "init", "set_default")


def __getattr__(name):
    if name in _API_NAMES:
        from .core import api
        return getattr(api, name)
    raise AttributeError(f"module 'ringcomm' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "init", "launch", "Communicator", "CommunicatorBase", "Work", "ReduceOp", "get_default", "set_default",
    "RingcommError", "TimeoutError", "PeerFailureError", "MismatchError", "InvalidArgumentError",
    "UnsupportedError", "ClosedError", "LaunchError",
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier", "all_to_all",
    "gather", "scatter", "send", "recv",
]


def _delegate(name):
    def f(*args, **kwargs):
        from .core.api import get_default
        return getattr(get_default(), name)(*args, **kwargs)
    f.__name__ = name
    f.__qualname__ = name
    f.__doc__ = f"{name}(...) on the default communicator (see Communicator.{name})."
    return f


all_reduce = _delegate("all_reduce")
reduce_scatter = _delegate("reduce_scatter")
all_gather = _delegate("all_gather")
broadcast = _delegate("broadcast")
reduce = _delegate("reduce")
barrier = _delegate("barrier")
all_to_all = _delegate("all_to_all")
gather = _delegate("gather")
scatter = _delegate("scatter")
send = _delegate("send")
recv = _delegate("recv")
