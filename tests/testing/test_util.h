#pragma once

// Helpers every test may use: scratch directories, free ports, waiting on a
// condition with a deadline (never a bare sleep), and GoogleTest matchers for
// Status/Result.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "granary/core/file.h"
#include "granary/core/status.h"

namespace granary::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on
// destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Join(const std::string& rel) const { return path_ + "/" + rel; }
  // Creates parent directories as needed.
  void WriteFile(const std::string& rel, const std::string& contents) const;

 private:
  std::string path_;
};

// A whole file's bytes; an empty string (and a test failure) if it cannot be read.
std::string ReadAll(const std::string& path);

// Replaces a file's bytes without fsync: tests write many damaged variants of
// files, and durability is not what they check. Fails the test on error.
void WriteAll(const std::string& path, const std::string& data);

// `size` deterministic pseudo-random bytes, different for every `name`.
std::string Bytes(const std::string& name, size_t size);

// A manifest written by the version 1 format (before modes), made by Granary
// at 648c622 from {"cls/a.jpg", 3, 100}, {"cls/b.jpg", 2000, 200}, {"top", 0,
// 300} with chunk size 1024 and source file:///data/v1: its encoded bytes.
std::string Version1ManifestBytes();

// A manifest written by the version 2 format (modes, no ctime or inode), made
// by Granary at f747c30 from {"cls/a.jpg", 3, 100, 0640}, {"cls/b.jpg", 2000,
// 200, 0444}, {"top", 0, 300, 0600} and directories {"", 0755}, {"cls", 0750},
// {"empty", 0700}, chunk size 1024, source file:///data/v2: its encoded bytes.
std::string Version2ManifestBytes();

// Source files changed the ways a snapshot's size and mtime cannot see. Both
// first wait until the file system's clock has moved past the file's ctime, so
// the change shows in the ctime even where timestamps are as coarse as a jiffy.
// Fail the test on error.
//   RewriteKeepingMtime: `bytes` written over the file in place (same inode),
//     then its old mtime set again, as `touch -r` or `cp -p` do; the kernel
//     sets the ctime to now, and nothing in user space can set it back.
//   ReplaceKeepingMtime: `bytes` written to a new file that gets the old one's
//     mtime, then renamed over it: another inode (and ctime) under the name.
void RewriteKeepingMtime(const std::string& path, const std::string& bytes);
void ReplaceKeepingMtime(const std::string& path, const std::string& bytes);

// A TCP port on 127.0.0.1 that was free when asked (bind to port 0, read, close).
uint16_t FreeTcpPort();

// Whether this is an AddressSanitizer build: its Python module cannot be
// loaded by /usr/bin/python3 (tests that run Python skip), and freed memory
// sits in ASan's quarantine (RSS bounds are wider).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAsanBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAsanBuild = true;
#else
inline constexpr bool kAsanBuild = false;
#endif
#else
inline constexpr bool kAsanBuild = false;
#endif

// Where python3 finds the built granary package: $GRANARY_PYTHONPATH when
// set, else `built` (the build's python directory, GRANARY_PYTHONPATH as
// CMake defines it for the test).
std::string PythonPath(const std::string& built);

// A blocking TCP connection to 127.0.0.1 at the port of `address`
// ("host:port"), with 5 s send and receive timeouts; `receive_buffer` > 0
// sets SO_RCVBUF first (a client that never reads then holds little). An
// empty ScopedFd when the address is bad or nobody accepts.
ScopedFd ConnectLoopback(const std::string& address, int receive_buffer = 0);

// The resident set of process `pid` in bytes (VmRSS of /proc/<pid>/status);
// 0 when it cannot be read.
uint64_t RssBytes(int pid);

// Sends all of `bytes` (MSG_NOSIGNAL); false when the peer closed or a send
// failed or timed out first.
bool SendAll(int fd, std::string_view bytes);

// Polls `condition` every `interval` until it holds or `timeout` passes.
// Returns whether it held.
bool WaitFor(const std::function<bool()>& condition,
             std::chrono::milliseconds timeout = std::chrono::seconds(10),
             std::chrono::milliseconds interval = std::chrono::milliseconds(10));

}  // namespace granary::testing

namespace granary::testing {
// The Status of a Status or of a Result<T>, for the macros below.
inline const Status& StatusOf(const Status& s) { return s; }
template <typename T>
const Status& StatusOf(const Result<T>& r) {
  return r.status();
}
}  // namespace granary::testing

// Assert/expect that a Status or Result<T> is OK, printing the error if not.
#define ASSERT_OK(expr)                                         \
  do {                                                          \
    const auto& granary_s_ = (expr);                            \
    ASSERT_TRUE(::granary::testing::StatusOf(granary_s_).ok())  \
        << ::granary::testing::StatusOf(granary_s_).ToString(); \
  } while (0)
#define EXPECT_OK(expr)                                         \
  do {                                                          \
    const auto& granary_s_ = (expr);                            \
    EXPECT_TRUE(::granary::testing::StatusOf(granary_s_).ok())  \
        << ::granary::testing::StatusOf(granary_s_).ToString(); \
  } while (0)
