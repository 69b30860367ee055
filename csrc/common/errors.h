// Typed errors. Every error carries an ErrorCode; RC_ERROR_KINDS below is the one table of the
// kinds: code, C++ class and the Python exception class the bindings map it to
// (bindings/errors_py.cpp; ringcomm/core/errors.py's BY_CODE mirrors it, tests/test_errors.py checks).
// InvalidArgumentError is a ValueError and UnsupportedError a TypeError on the Python side.
// The subclasses exist so that C++ code can catch one kind; code() is what crosses process and
// language boundaries (abort flags in shared memory, Work handles, the bindings).
// Messages carry the context needed to act on them: op, rank, peer, step, sequence, file:line.
#pragma once
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>

#include "common/enum_table.h"

namespace rc {

/// The error kinds: X(code name, value, C++ class, ringcomm.core.errors class). The numeric values
/// travel through shared memory and into Python: append only. rc::Error is the base class (kError);
/// RC_ERROR_SUBKINDS are its subclasses, one per other code.
#define RC_ERROR_SUBKINDS(X)                                   \
  X(InvalidArgument, 1, InvalidArgument, InvalidArgumentError) \
  X(Timeout, 2, TimeoutError, TimeoutError)                    \
  X(PeerFailure, 3, PeerFailure, PeerFailureError)             \
  X(Mismatch, 4, Mismatch, MismatchError)                      \
  X(Unsupported, 5, Unsupported, UnsupportedError)             \
  X(Closed, 6, Closed, ClosedError)
#define RC_ERROR_KINDS(X) X(Error, 0, Error, RingcommError) RC_ERROR_SUBKINDS(X)

enum class ErrorCode : int { RC_ERROR_KINDS(RC_ENUM_ENUMERATOR) };
/// The values are 0..kNumErrorCodes-1 in list order (tables indexed by the code rely on it).
constexpr int kNumErrorCodes = 0 RC_ERROR_KINDS(RC_ENUM_COUNT);
static_assert(enum_codes_dense<kNumErrorCodes>({RC_ERROR_KINDS(RC_ENUM_CODE)}),
              "RC_ERROR_KINDS: the values are 0..kNumErrorCodes-1 in list order");

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

#define RC_DEFINE_ERROR_KIND_(name, value, Kind, py_class)                   \
  class Kind : public Error {                                                 \
   public:                                                                    \
    explicit Kind(const std::string& msg) : Error(ErrorCode::k##name, msg) {} \
  };
RC_ERROR_SUBKINDS(RC_DEFINE_ERROR_KIND_)
#undef RC_DEFINE_ERROR_KIND_

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
