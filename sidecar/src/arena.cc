#include "granary/sidecar/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <iterator>

#include "granary/core/names.h"

namespace granary::sidecar {

uint64_t Arena::Rounded(uint64_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

Result<std::unique_ptr<Arena>> Arena::Create(const std::string& name, uint64_t bytes) {
  if (bytes == 0) return Status::InvalidArgument("arena " + Quoted(name) + ": size 0");
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  bytes = (bytes + page - 1) / page * page;
  ScopedFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid())
    return Status::FromErrno(errno, "create the shared-memory arena " + Quoted(name));
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return Status::FromErrno(errno, "size the shared-memory arena " + Quoted(name) + " to " +
                                        std::to_string(bytes) + " bytes");
  }
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (data == MAP_FAILED) {
    return Status::FromErrno(errno, "map the shared-memory arena " + Quoted(name));
  }
  // From now on nobody may resize it, map it writable or write through a
  // descriptor: only this mapping writes.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE) != 0) {
    Status s = Status::FromErrno(errno, "seal the shared-memory arena " + Quoted(name));
    ::munmap(data, bytes);
    return s;
  }
  return std::unique_ptr<Arena>(new Arena(std::move(fd), static_cast<char*>(data), bytes));
}

Arena::Arena(ScopedFd fd, char* data, uint64_t size)
    : fd_(std::move(fd)), data_(data), size_(size) {
  AddFree(0, size);
}

Arena::~Arena() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

void Arena::AddFree(uint64_t offset, uint64_t length) {
  free_.emplace(offset, length);
  by_size_.emplace(length, offset);
}

void Arena::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_.erase(it);
}

std::optional<uint64_t> Arena::Allocate(uint64_t bytes) {
  if (bytes == 0) return std::nullopt;
  bytes = Rounded(bytes);
  // The smallest free range that fits (the lowest offset among equals).
  auto fit = by_size_.lower_bound({bytes, 0});
  if (fit == by_size_.end()) return std::nullopt;
  const auto [length, offset] = *fit;
  EraseFree(free_.find(offset));
  if (length > bytes) AddFree(offset + bytes, length - bytes);
  used_ += bytes;
  return offset;
}

void Arena::Free(uint64_t offset, uint64_t bytes) {
  bytes = Rounded(bytes);
  used_ -= bytes;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    auto after = std::next(next);
    EraseFree(next);
    next = after;
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      EraseFree(prev);
    }
  }
  AddFree(offset, bytes);
}

}  // namespace granary::sidecar
