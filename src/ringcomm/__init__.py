"""ringcomm: ring collectives over host shared memory, with a torch.distributed backend.

    import ringcomm
    comm = ringcomm.init()                 # torchrun's env, or rank=/world_size=/store=/init_method=
    comm.all_reduce(x)                     # numpy arrays and torch CPU tensors, in place
    ringcomm.launch(fn, 4)                 # fn(comm) on 4 local processes

Importing ringcomm creates nothing and changes no environment; ``import ringcomm.torch``
registers the "ringcomm" torch.distributed backend.

The folders are the layers (``ringcomm._layers``; docs/architecture.md): core/ holds the library
itself, cuda/, hier/ and torch/ the back ends, wrappers/ the training wrappers, apps/ the
applications. The three layer folders are on this package's ``__path__``, so the modules in them
are modules of the package itself: ``ringcomm.front``, ``ringcomm.ddp``, ``ringcomm.bench``.
"""
import os as _os

from . import _layers

__path__ = [*__path__, *(_os.path.join(_os.path.dirname(__file__), folder)
                         for folder in _layers.LAYER_FOLDERS.values())]

from .errors import (ClosedError, InvalidArgumentError, MismatchError, PeerFailureError,
                     RingcommError, TimeoutError, UnsupportedError)
from .launch import LaunchError, launch
from .tables import ReduceOp
from .work import Work

# The C extension loads on first use of the API (so that, e.g., torch's backend autoload can
# import ringcomm.torch cheaply and never fails because of the extension).
_API_NAMES = ("Communicator", "CommunicatorBase", "get_default", "init", "set_default")


def __getattr__(name):
    if name in _API_NAMES:
        from . import api
        return getattr(api, name)
    if name == "config":  # the knob registry module; ringcomm.config() returns config.config()
        import importlib
        return importlib.import_module(".config", __name__)
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
        from .api import get_default
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
