#pragma once

// Arena: the shared memory the sidecar hands sample bytes out in. One memfd of
// a fixed size, mapped read-write by the sidecar and passed to clients, who map
// it read-only; a best-fit allocator of 64-byte-aligned ranges inside it
// (free ranges indexed by length too, so an allocation costs O(log ranges):
// a full arena is fragmented into thousands of ranges, and the sample cache
// allocates once per sample it fetches).
//
// The memfd is sealed against shrinking, growing and new writable mappings or
// writes (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE) once the sidecar
// has mapped it: a client that got the descriptor can neither truncate it
// under the sidecar (SIGBUS) nor write into the bytes other clients read.
//
// Who calls it: the sidecar's per-dataset sample cache (one arena per open
// dataset); tests.
//
// Thread safety: none; the owner serialises calls (the sample cache holds its
// mutex). data() may be read by any thread while the arena lives.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "granary/core/file.h"
#include "granary/core/status.h"

namespace granary::sidecar {

inline constexpr uint64_t kArenaAlignment = 64;

class Arena {
 public:
  // `name` shows in /proc/<pid>/fd (memfd:<name>). `bytes` > 0, rounded up to
  // the page size.
  static Result<std::unique_ptr<Arena>> Create(const std::string& name, uint64_t bytes);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  int fd() const { return fd_.get(); }
  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Bytes in allocated ranges (after alignment).
  uint64_t used() const { return used_; }

  // A range of at least `bytes` (> 0); nullopt when no free range is large
  // enough. The offset is a multiple of kArenaAlignment.
  std::optional<uint64_t> Allocate(uint64_t bytes);
  // Frees a range returned by Allocate(bytes) (same size); neighbours coalesce.
  void Free(uint64_t offset, uint64_t bytes);

  static uint64_t Rounded(uint64_t bytes);

 private:
  Arena(ScopedFd fd, char* data, uint64_t size);
  void AddFree(uint64_t offset, uint64_t length);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);

  ScopedFd fd_;
  char* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_;                // offset -> length, no two adjacent
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (length, offset) of free_'s ranges
};

}  // namespace granary::sidecar
