"""ringcomm's exception classes. Each C++ error class maps to one of these (bindings/errors_py.cpp)."""
import builtins

__all__ = [
    "RingcommError", "TimeoutError", "PeerFailureError", "MismatchError", "InvalidArgumentError",
    "UnsupportedError", "ClosedError",
]


class RingcommError(RuntimeError):
    """Base class of every ringcomm error."""


class TimeoutError(RingcommError, builtins.TimeoutError):  # noqa: A001 - deliberately ringcomm.TimeoutError
    """A wait passed its deadline (RINGCOMM_TIMEOUT / timeout=). Names op, rank, peer, step, sequence."""


class PeerFailureError(RingcommError):
    """A peer process died, closed its communicator, or failed inside the collective."""


class MismatchError(RingcommError):
    """Ranks called different collectives, or the same one with inconsistent arguments."""


class InvalidArgumentError(RingcommError, ValueError):
    """Bad input on this rank: wrong size, dtype, root, non-contiguous or read-only buffer."""


class UnsupportedError(RingcommError, TypeError):
    """A dtype, reduce op or array type that ringcomm does not support."""


class ClosedError(RingcommError):
    """The communicator was used after close()."""


# Names used by the C++ Work.error_kind() -> Python class.
_BY_KIND = {
    "TimeoutError": TimeoutError,
    "PeerFailure": PeerFailureError,
    "Mismatch": MismatchError,
    "InvalidArgument": InvalidArgumentError,
    "Unsupported": UnsupportedError,
    "Closed": ClosedError,
    "Error": RingcommError,
}


def from_kind(kind: str, message: str) -> RingcommError:
    return _BY_KIND.get(kind, RingcommError)(message)
