// Typed errors. Every C++ error class maps to one Python exception class (bindings/errors_py.cpp):
//   Error            -> ringcomm.RingcommError
//   InvalidArgument  -> ringcomm.InvalidArgumentError (a ValueError)
//   TimeoutError     -> ringcomm.TimeoutError
//   PeerFailure      -> ringcomm.PeerFailureError
//   Mismatch         -> ringcomm.MismatchError
//   Unsupported      -> ringcomm.UnsupportedError (a TypeError)
//   Closed           -> ringcomm.ClosedError
// Messages carry the context needed to act on them: op, rank, peer, step, sequence, file:line.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace rc {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};
class InvalidArgument : public Error { using Error::Error; };
class TimeoutError : public Error { using Error::Error; };
class PeerFailure : public Error { using Error::Error; };
class Mismatch : public Error { using Error::Error; };
class Unsupported : public Error { using Error::Error; };
class Closed : public Error { using Error::Error; };

// Short "file:line" for messages.
std::string where(const char* file, int line);

}  // namespace rc

// RC_THROW(Kind, stream-expression): throw rc::Kind with the message and the source location.
#define RC_THROW(kind, msg_expr)                                              \
  do {                                                                        \
    std::ostringstream rc_oss_;                                               \
    rc_oss_ << msg_expr << " [" << ::rc::where(__FILE__, __LINE__) << "]";    \
    throw ::rc::kind(rc_oss_.str());                                          \
  } while (0)

// RC_CHECK(cond, Kind, msg): throw rc::Kind naming the failed condition when cond is false.
#define RC_CHECK(cond, kind, msg_expr)                                        \
  do {                                                                        \
    if (!(cond)) RC_THROW(kind, msg_expr << " (check failed: " #cond ")");   \
  } while (0)
