// ConnectionThreads (connection_threads.h).

#include "granary/daemon/connection_threads.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace granary {

ConnectionLimits ConnectionLimits::DefaultFor(size_t max_open) {
  ConnectionLimits limits;
  limits.max_open = max_open;
  limits.per_uid = std::max<size_t>(1, max_open / 4);
  // With one place there is nothing to reserve: a lone place goes to whoever comes.
  limits.reserved = max_open < 2 ? 0 : std::max<size_t>(1, max_open / 8);
  return limits;
}

bool ConnectionThreads::Start(ScopedFd& fd, size_t max_open, std::function<void(int fd)> serve) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fds_.size() >= max_open) return false;
  Launch(fd, Open{}, std::move(serve));
  return true;
}

Admission ConnectionThreads::Start(ScopedFd& fd, uint32_t uid, bool privileged,
                                   const ConnectionLimits& limits,
                                   std::function<void(int fd)> serve) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fds_.size() >= limits.max_open) return Admission::kFull;
  if (!privileged) {
    auto it = per_uid_.find(uid);
    if (it != per_uid_.end() && it->second >= limits.per_uid) return Admission::kUidFull;
    if (unprivileged_ + limits.reserved >= limits.max_open) return Admission::kReservedOnly;
  }
  Launch(fd, Open{-1, uid, privileged}, std::move(serve));
  return Admission::kAdmitted;
}

void ConnectionThreads::Launch(ScopedFd& fd, Open open, std::function<void(int fd)> serve) {
  const uint64_t id = next_++;
  const int raw = fd.Release();
  open.fd = raw;
  if (!open.privileged) {
    ++per_uid_[open.uid];
    ++unprivileged_;
  }
  fds_[id] = open;
  threads_[id] = std::thread([this, id, raw, serve = std::move(serve)] {
    serve(raw);
    Finished(id);
  });
}

void ConnectionThreads::Finished(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = fds_.find(id);
  if (it != fds_.end()) {
    // Closed under the lock: StopAll never shuts down a number reused since.
    ::shutdown(it->second.fd, SHUT_RDWR);
    ::close(it->second.fd);
    if (!it->second.privileged) {
      auto count = per_uid_.find(it->second.uid);
      if (count != per_uid_.end() && --count->second == 0) per_uid_.erase(count);
      --unprivileged_;
    }
    fds_.erase(it);
  }
  finished_.push_back(id);
}

void ConnectionThreads::ReapFinished() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t id : finished_) {
      auto it = threads_.find(id);
      if (it == threads_.end()) continue;
      done.push_back(std::move(it->second));
      threads_.erase(it);
    }
    finished_.clear();
  }
  for (std::thread& t : done) t.join();
}

void ConnectionThreads::ShutdownAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, open] : fds_) ::shutdown(open.fd, SHUT_RDWR);
}

void ConnectionThreads::JoinAll() {
  std::map<uint64_t, std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(threads_);
    finished_.clear();
  }
  for (auto& [id, t] : threads) t.join();
}

size_t ConnectionThreads::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fds_.size();
}

size_t ConnectionThreads::open_of(uint32_t uid) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [id, open] : fds_) n += open.uid == uid ? 1 : 0;
  return n;
}

}  // namespace granary
