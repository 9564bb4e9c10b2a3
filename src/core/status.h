// Status and StatusOr: kiln's error values. The library never throws and never aborts on user
// input; every failure is a Status with a code, a message and a context chain added as it
// propagates.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kInvalidModel,
  kUnsupported,
  kNotFound,
  kOutOfMemory,
  kDeviceError,
  kInternal,
  kCancelled,  // ExecutionContext::cancel() stopped the run
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // Adds an outer context ("node 'conv_3' (Conv)", "pass fold_constants") in front of the message.
  Status& with_context(const std::string& context);
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
Status invalid_argument(std::string message);
Status invalid_model(std::string message);
Status unsupported(std::string message);
Status not_found(std::string message);
Status out_of_memory(std::string message);
Status device_error(std::string message);
Status internal_error(std::string message);
Status cancelled(std::string message);

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) {
      status_ = Status(StatusCode::kInternal, "StatusOr constructed from an ok Status");
    }
  }
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

[[noreturn]] void check_failed(const char* file, int line, const char* expr);

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

#define KILN_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::kiln::Status kiln_status_ = (expr);        \
    if (!kiln_status_.ok()) return kiln_status_; \
  } while (0)

#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(kiln_statusor_, __LINE__), lhs, expr)

// For internal invariants only; user input must never reach a KILN_CHECK.
#define KILN_CHECK(cond)                                          \
  do {                                                            \
    if (!(cond)) ::kiln::check_failed(__FILE__, __LINE__, #cond); \
  } while (0)
