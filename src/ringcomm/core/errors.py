"""ringcomm's exception classes. Each C++ ErrorCode maps to one of these (BY_CODE here, the same
table in bindings/errors_py.cpp)."""
import builtins

__all__ = [
    "RingcommError", "TimeoutError", "PeerFailureError", "MismatchError", "InvalidArgumentError",
    "UnsupportedError", "ClosedError", "BY_CODE", "from_code", "code_of",
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


# ErrorCode value (csrc/common/errors.h) -> class. The bindings hold the same table
# (ringcomm._C.error_class_names()); tests/test_errors.py checks that the two agree.
BY_CODE = {
    0: RingcommError,
    1: InvalidArgumentError,
    2: TimeoutError,
    3: PeerFailureError,
    4: MismatchError,
    5: UnsupportedError,
    6: ClosedError,
}
#: class -> ErrorCode value.
CODE_OF = {cls: code for code, cls in BY_CODE.items()}


def from_code(code: int, message: str) -> RingcommError:
    """The exception of C++ ErrorCode ``code`` carrying ``message`` (RingcommError for an unknown code)."""
    return BY_CODE.get(int(code), RingcommError)(message)


def code_of(exc: BaseException) -> int:
    """The ErrorCode value of a ringcomm exception (its most derived ringcomm class); 0 for others."""
    for cls in type(exc).__mro__:
        if cls in CODE_OF:
            return CODE_OF[cls]
    return 0
