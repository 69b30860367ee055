#include "common/errors.h"

#include <cstring>

namespace rc {

const char* error_code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::kError: return "Error";
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kTimeout: return "Timeout";
    case ErrorCode::kPeerFailure: return "PeerFailure";
    case ErrorCode::kMismatch: return "Mismatch";
    case ErrorCode::kUnsupported: return "Unsupported";
    case ErrorCode::kClosed: return "Closed";
  }
  return "Error";
}

bool valid_error_code(int v) { return v >= 0 && v < kNumErrorCodes; }

void throw_error(ErrorCode code, const std::string& msg) {
  switch (code) {
    case ErrorCode::kInvalidArgument: throw InvalidArgument(msg);
    case ErrorCode::kTimeout: throw TimeoutError(msg);
    case ErrorCode::kPeerFailure: throw PeerFailure(msg);
    case ErrorCode::kMismatch: throw Mismatch(msg);
    case ErrorCode::kUnsupported: throw Unsupported(msg);
    case ErrorCode::kClosed: throw Closed(msg);
    case ErrorCode::kError: break;
  }
  throw Error(msg);
}

ErrorCode error_code_of(std::exception_ptr e, std::string* message) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    if (message) *message = x.what();
    return x.code();
  } catch (const std::exception& x) {
    if (message) *message = x.what();
    return ErrorCode::kError;
  } catch (...) {
    if (message) *message = "unknown error";
    return ErrorCode::kError;
  }
}

std::string where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

}  // namespace rc
