#pragma once

// Thin, Status-returning wrappers over the POSIX file calls Granary's formats
// use. Short reads/writes and EINTR are handled here so callers never loop.
//
// Thread safety: ScopedFd is a value owned by one thread at a time; the free
// functions are safe to call concurrently on different files (pread/pwrite on
// the same fd are safe too, as in POSIX).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "granary/core/status.h"

namespace granary {

// Owns a file descriptor; closes it on destruction.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() { Reset(); }
  ScopedFd(ScopedFd&& o) noexcept : fd_(o.Release()) {}
  ScopedFd& operator=(ScopedFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = o.Release();
    }
    return *this;
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();

 private:
  int fd_ = -1;
};

// open(2) with O_CLOEXEC; `path` appears in the error message.
Result<ScopedFd> OpenFile(const std::string& path, int flags, mode_t mode = 0600);

// Reads exactly `size` bytes at `offset`. Fewer bytes available is kCorruption
// ("truncated"), since every caller knows how long its file must be.
Status PreadFull(int fd, void* buf, size_t size, uint64_t offset, std::string_view what);

// Writes all of `size` bytes at `offset`.
Status PwriteFull(int fd, const void* buf, size_t size, uint64_t offset, std::string_view what);

// fdatasync(2).
Status SyncData(int fd, std::string_view what);

// Size of an open file.
Result<uint64_t> FileSize(int fd, std::string_view what);

// Whole file into memory.
Result<std::string> ReadFileToString(const std::string& path);

// fsync(2) of the directory holding `path`, so a create, link or rename of
// `path` survives a crash.
Status SyncDirectoryOf(const std::string& path);

// Writes `contents` to `path` so that a crash leaves either the old file or the
// new one: a uniquely named temp file in the same directory (safe against
// concurrent writers of the same path), fsync, rename, fsync of the directory.
Status WriteFileAtomically(const std::string& path, std::string_view contents, mode_t mode = 0600);

// Bounds the retry loops of blocking-with-deadline I/O around EINTR and
// spurious wake-ups; the deadline bounds them in time.
inline constexpr int kMaxPollRounds = 1'000'000;

// Waits until `fd` is ready for `events` (poll(2) flags) or `deadline` passes:
// true when ready (or in error, which the next call on it reports), false on
// timeout. `what` names the descriptor in an error ("a cache node connection").
Result<bool> WaitFdReady(int fd, short events, std::chrono::steady_clock::time_point deadline,
                         std::string_view what);

}  // namespace granary
