#include "granary/core/status.h"

#include <string.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace granary {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kAlreadyExists:
      return "AlreadyExists";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
    case StatusCode::kOutOfRange:
      return "OutOfRange";
    case StatusCode::kCorruption:
      return "Corruption";
    case StatusCode::kVersionMismatch:
      return "VersionMismatch";
    case StatusCode::kIoError:
      return "IoError";
    case StatusCode::kPermissionDenied:
      return "PermissionDenied";
    case StatusCode::kResourceExhausted:
      return "ResourceExhausted";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kDeadlineExceeded:
      return "DeadlineExceeded";
    case StatusCode::kInternal:
      return "Internal";
  }
  return "Unknown";
}

std::string ErrnoText(int err) {
  char buf[256];
  // GNU strerror_r: returns a pointer to the message, in buf or static.
  return std::string(::strerror_r(err, buf, sizeof(buf)));
}

Status Status::FromErrno(int err, std::string_view what) {
  std::string message(what);
  message += ": ";
  message += ErrnoText(err);
  switch (err) {
    case EACCES:
    case EPERM:
      return PermissionDenied(std::move(message));
    case ENOENT:
      return NotFound(std::move(message));
    case ENOSPC:
    case EDQUOT:
      return ResourceExhausted(std::move(message));
    default:
      return IoError(std::move(message));
  }
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

namespace internal {

void DieOnErrorValue(const Status& error) {
  std::fprintf(stderr, "granary: Result::value() called on an error: %s\n",
               error.ToString().c_str());
  std::abort();
}

void DieOnOkStatusResult() {
  std::fputs("granary: a Result was built from an OK Status, which has no value\n", stderr);
  std::abort();
}

}  // namespace internal

}  // namespace granary
