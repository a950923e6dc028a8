#include "granary/core/file.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

namespace granary {

void ScopedFd::Reset() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

Result<ScopedFd> OpenFile(const std::string& path, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  return ScopedFd(fd);
}

Status PreadFull(int fd, void* buf, size_t size, uint64_t offset, std::string_view what) {
  auto* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, std::string("read ") + std::string(what));
    }
    if (n == 0) {
      return Status::Corruption(std::string(what) + ": file is truncated (wanted " +
                                std::to_string(size) + " bytes at offset " +
                                std::to_string(offset) + ", found " + std::to_string(done) + ")");
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status PwriteFull(int fd, const void* buf, size_t size, uint64_t offset, std::string_view what) {
  const auto* p = static_cast<const char*>(buf);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pwrite(fd, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, std::string("write ") + std::string(what));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status SyncData(int fd, std::string_view what) {
  int rc;
  do {
    rc = ::fdatasync(fd);
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) return Status::FromErrno(errno, std::string("sync ") + std::string(what));
  return Status::Ok();
}

Result<uint64_t> FileSize(int fd, std::string_view what) {
  struct stat st;
  if (::fstat(fd, &st) < 0)
    return Status::FromErrno(errno, std::string("stat ") + std::string(what));
  return static_cast<uint64_t>(st.st_size);
}

Result<std::string> ReadFileToString(const std::string& path) {
  GRANARY_ASSIGN_OR_RETURN(ScopedFd fd, OpenFile(path, O_RDONLY));
  GRANARY_ASSIGN_OR_RETURN(uint64_t size, FileSize(fd.get(), path));
  std::string data(size, '\0');
  GRANARY_RETURN_IF_ERROR(PreadFull(fd.get(), data.data(), size, 0, path));
  return data;
}

Status SyncDirectoryOf(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::string dir = parent.empty() ? std::string(".") : parent.string();
  GRANARY_ASSIGN_OR_RETURN(ScopedFd dfd, OpenFile(dir, O_RDONLY | O_DIRECTORY));
  int rc;
  do {
    rc = ::fsync(dfd.get());
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) return Status::FromErrno(errno, "sync directory " + dir);
  return Status::Ok();
}

Status WriteFileAtomically(const std::string& path, std::string_view contents, mode_t mode) {
  std::string tmp = path + ".tmp.XXXXXX";
  int raw = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (raw < 0) return Status::FromErrno(errno, "create a temporary file next to " + path);
  ScopedFd fd(raw);
  Status s;
  if (::fchmod(fd.get(), mode) < 0) s = Status::FromErrno(errno, "chmod " + tmp);
  if (s.ok()) s = PwriteFull(fd.get(), contents.data(), contents.size(), 0, tmp);
  if (s.ok()) s = SyncData(fd.get(), tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) < 0) {
    s = Status::FromErrno(errno, "rename " + tmp + " to " + path);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return SyncDirectoryOf(path);
}

Result<bool> WaitFdReady(int fd, short events, std::chrono::steady_clock::time_point deadline,
                         std::string_view what) {
  using Clock = std::chrono::steady_clock;
  for (int round = 0; round < kMaxPollRounds; ++round) {
    // Milliseconds left, rounded up so that a wait never ends before the deadline.
    const auto left = deadline - Clock::now();
    int timeout = 0;
    if (left > Clock::duration::zero()) {
      timeout = static_cast<int>(
          std::min<int64_t>(std::chrono::ceil<std::chrono::milliseconds>(left).count(), 1'000'000));
    }
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, timeout);
    if (n > 0) return true;
    if (n == 0) {
      if (Clock::now() >= deadline) return false;
      continue;
    }
    if (errno == EINTR) continue;
    return Status::FromErrno(errno, "poll on " + std::string(what));
  }
  return false;
}

}  // namespace granary
