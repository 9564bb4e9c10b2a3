// Status helpers.
#include "core/status.h"

namespace kiln {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kInvalidModel:
      return "INVALID_MODEL";
    case StatusCode::kUnsupported:
      return "UNSUPPORTED";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kOutOfMemory:
      return "OUT_OF_MEMORY";
    case StatusCode::kDeviceError:
      return "DEVICE_ERROR";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

Status& Status::with_context(const std::string& context) {
  if (!ok()) message_ = context + ": " + message_;
  return *this;
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status invalid_argument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
Status invalid_model(std::string m) { return Status(StatusCode::kInvalidModel, std::move(m)); }
Status unsupported(std::string m) { return Status(StatusCode::kUnsupported, std::move(m)); }
Status not_found(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
Status out_of_memory(std::string m) { return Status(StatusCode::kOutOfMemory, std::move(m)); }
Status device_error(std::string m) { return Status(StatusCode::kDeviceError, std::move(m)); }
Status internal_error(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
Status cancelled(std::string m) { return Status(StatusCode::kCancelled, std::move(m)); }

void check_failed(const char* file, int line, const char* expr) {
  std::fprintf(stderr, "kiln internal invariant failed at %s:%d: %s\n", file, line, expr);
  std::abort();
}

}  // namespace kiln
