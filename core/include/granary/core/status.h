#pragma once

// Status and Result<T>: how every fallible call in Granary reports failure.
//
// The data path never throws. A function that can fail returns Status (no value)
// or Result<T> (a value or a Status). Messages say what was being done, on what,
// and what to do about it, e.g.
//   "open manifest /data/m.grm: file is truncated (120 of 4096 bytes); rebuild it
//    with 'granary dataset snapshot'".
//
// Thread safety: values; copy freely, no shared state.

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace granary {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // the caller's input is wrong; retrying will not help
  kNotFound,            // a named thing does not exist
  kAlreadyExists,       // create of something that exists
  kFailedPrecondition,  // state does not allow this now (e.g. revision conflict)
  kOutOfRange,          // an id or offset past the end
  kCorruption,          // stored bytes fail a check (magic, checksum, truncation)
  kVersionMismatch,     // a format or protocol version this build does not read
  kIoError,             // the OS refused (errno in the message)
  kPermissionDenied,    // not allowed to read/write something
  kResourceExhausted,   // disk full, capacity reached, queue full
  kUnavailable,         // a server or lock is not reachable now; retry may help
  kDeadlineExceeded,    // ran out of time
  kInternal,            // a bug
};

std::string_view StatusCodeName(StatusCode code);

// strerror(err), but safe to call from any thread.
std::string ErrnoText(int err);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status VersionMismatch(std::string m) {
    return {StatusCode::kVersionMismatch, std::move(m)};
  }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  // An IoError whose message ends with strerror(err).
  static Status FromErrno(int err, std::string_view what);
  static Status PermissionDenied(std::string m) {
    return {StatusCode::kPermissionDenied, std::move(m)};
  }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status DeadlineExceeded(std::string m) {
    return {StatusCode::kDeadlineExceeded, std::move(m)};
  }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "NotFound: dataset 'imagenet' does not exist ..." or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>".
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

namespace internal {
// Print what was misused to stderr and abort(); out of line to keep Result small.
[[noreturn]] void DieOnErrorValue(const Status& error);
[[noreturn]] void DieOnOkStatusResult();
}  // namespace internal

// A value of type T, or the Status saying why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  // An OK Status has no value to go with it: building a Result from one is a
  // bug in the caller and aborts (in every build type), naming the misuse.
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get_if<Status>(&v_)->ok()) internal::DieOnOkStatusResult();
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }

  // value() of an error is a bug in the caller: it aborts with the status's
  // text (no exception to catch far from the cause).
  T& value() & {
    CheckHasValue();
    return *std::get_if<T>(&v_);
  }
  const T& value() const& {
    CheckHasValue();
    return *std::get_if<T>(&v_);
  }
  T&& value() && {
    CheckHasValue();
    return std::move(*std::get_if<T>(&v_));
  }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void CheckHasValue() const {
    if (const Status* error = std::get_if<Status>(&v_)) internal::DieOnErrorValue(*error);
  }

  std::variant<T, Status> v_;
};

}  // namespace granary

#define GRANARY_CONCAT_INNER_(a, b) a##b
#define GRANARY_CONCAT_(a, b) GRANARY_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define GRANARY_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::granary::Status granary_status_ = (expr);        \
    if (!granary_status_.ok()) return granary_status_; \
  } while (0)

// `lhs = value of expr`, or returns its Status from the enclosing function.
#define GRANARY_ASSIGN_OR_RETURN(lhs, expr) \
  GRANARY_ASSIGN_OR_RETURN_IMPL_(GRANARY_CONCAT_(granary_result_, __LINE__), lhs, expr)
#define GRANARY_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()
