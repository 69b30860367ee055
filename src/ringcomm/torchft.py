"""ringcomm's torchft process groups, by their public import path (``pip install 'ringcomm[ft]'``)::

    from ringcomm.torchft import ProcessGroupRingcomm, ProcessGroupRingcommC10d

They are written in the torch back end, ``ringcomm.torch.torchft`` (which see); this module only
names them here. Importing it imports torch (and registers the "ringcomm" torch.distributed
backend, as ``import ringcomm.torch`` does), not torchft: constructing a group without torchft
raises ImportError saying what to install.
"""
from .torch.torchft import ProcessGroupRingcomm, ProcessGroupRingcommC10d, parse_store_addr

__all__ = ["ProcessGroupRingcomm", "ProcessGroupRingcommC10d", "parse_store_addr"]
