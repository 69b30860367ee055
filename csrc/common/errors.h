// Typed errors. Every error carries an ErrorCode; the code maps through ONE table to a Python
// exception class (bindings/errors_py.cpp, mirrored by ringcomm/errors.py's BY_CODE):
//   kError            Error            -> ringcomm.RingcommError
//   kInvalidArgument  InvalidArgument  -> ringcomm.InvalidArgumentError (a ValueError)
//   kTimeout          TimeoutError     -> ringcomm.TimeoutError
//   kPeerFailure      PeerFailure      -> ringcomm.PeerFailureError
//   kMismatch         Mismatch         -> ringcomm.MismatchError
//   kUnsupported      Unsupported      -> ringcomm.UnsupportedError (a TypeError)
//   kClosed           Closed           -> ringcomm.ClosedError
// The subclasses exist so that C++ code can catch one kind; code() is what crosses process and
// language boundaries (abort flags in shared memory, Work handles, the bindings).
// Messages carry the context needed to act on them: op, rank, peer, step, sequence, file:line.
#pragma once
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>

namespace rc {

/// Error kinds. The numeric values travel through shared memory and into Python: append only.
enum class ErrorCode : int {
  kError = 0,
  kInvalidArgument = 1,
  kTimeout = 2,
  kPeerFailure = 3,
  kMismatch = 4,
  kUnsupported = 5,
  kClosed = 6,
};
constexpr int kNumErrorCodes = 7;

/// "Error", "InvalidArgument", "Timeout", ... (the enumerator without its k).
const char* error_code_name(ErrorCode c);
/// True when v is one of ErrorCode's values.
bool valid_error_code(int v);

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : Error(ErrorCode::kError, msg) {}
  ErrorCode code() const { return code_; }

 protected:
  Error(ErrorCode c, const std::string& msg) : std::runtime_error(msg), code_(c) {}

 private:
  ErrorCode code_;
};

#define RC_DEFINE_ERROR_KIND(Kind, Code)                                      \
  class Kind : public Error {                                                 \
   public:                                                                    \
    explicit Kind(const std::string& msg) : Error(ErrorCode::Code, msg) {}    \
  };
RC_DEFINE_ERROR_KIND(InvalidArgument, kInvalidArgument)
RC_DEFINE_ERROR_KIND(TimeoutError, kTimeout)
RC_DEFINE_ERROR_KIND(PeerFailure, kPeerFailure)
RC_DEFINE_ERROR_KIND(Mismatch, kMismatch)
RC_DEFINE_ERROR_KIND(Unsupported, kUnsupported)
RC_DEFINE_ERROR_KIND(Closed, kClosed)
#undef RC_DEFINE_ERROR_KIND

/// Throw the rc:: class of `code` with `msg` (an out-of-range code throws rc::Error). The one
/// place where a stored kind becomes an exception again.
[[noreturn]] void throw_error(ErrorCode code, const std::string& msg);

/// The code and message of the exception held by e: an rc::Error's own code, kError for any
/// other exception.
ErrorCode error_code_of(std::exception_ptr e, std::string* message);

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

// RC_CHECK_EQ(a, b, Kind, msg) and NE/LT/LE/GT/GE: like RC_CHECK(a OP b, ...), and the message
// also prints both values. a and b are evaluated once each.
#define RC_CHECK_OP_(op, a, b, kind, msg_expr)                                           \
  do {                                                                                   \
    const auto& rc_a_ = (a);                                                             \
    const auto& rc_b_ = (b);                                                             \
    if (!(rc_a_ op rc_b_))                                                               \
      RC_THROW(kind, msg_expr << " (check failed: " #a " " #op " " #b ", with " #a " = " \
                              << rc_a_ << ", " #b " = " << rc_b_ << ")");                \
  } while (0)
#define RC_CHECK_EQ(a, b, kind, msg_expr) RC_CHECK_OP_(==, a, b, kind, msg_expr)
#define RC_CHECK_NE(a, b, kind, msg_expr) RC_CHECK_OP_(!=, a, b, kind, msg_expr)
#define RC_CHECK_LT(a, b, kind, msg_expr) RC_CHECK_OP_(<, a, b, kind, msg_expr)
#define RC_CHECK_LE(a, b, kind, msg_expr) RC_CHECK_OP_(<=, a, b, kind, msg_expr)
#define RC_CHECK_GT(a, b, kind, msg_expr) RC_CHECK_OP_(>, a, b, kind, msg_expr)
#define RC_CHECK_GE(a, b, kind, msg_expr) RC_CHECK_OP_(>=, a, b, kind, msg_expr)
