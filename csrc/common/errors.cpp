#include "common/errors.h"

#include <cstring>

namespace rc {

namespace {

// Indexed by the ErrorCode value (dense: errors.h).
constexpr const char* kCodeNames[] = {
#define RC_ERROR_CODE_NAME_(name, value, Kind, py_class) #name,
    RC_ERROR_KINDS(RC_ERROR_CODE_NAME_)
#undef RC_ERROR_CODE_NAME_
};

}  // namespace

const char* error_code_name(ErrorCode c) {
  return valid_error_code(static_cast<int>(c)) ? kCodeNames[static_cast<int>(c)] : "Error";
}

bool valid_error_code(int v) { return v >= 0 && v < kNumErrorCodes; }

void throw_error(ErrorCode code, const std::string& msg) {
  switch (code) {
#define RC_THROW_KIND_CASE_(name, value, Kind, py_class) \
  case ErrorCode::k##name:                              \
    throw Kind(msg);
    RC_ERROR_KINDS(RC_THROW_KIND_CASE_)
#undef RC_THROW_KIND_CASE_
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
