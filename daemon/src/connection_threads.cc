// ConnectionThreads (connection_threads.h).

#include "granary/daemon/connection_threads.h"

#include <sys/socket.h>
#include <unistd.h>

#include <utility>

namespace granary {

bool ConnectionThreads::Start(ScopedFd& fd, size_t max_open, std::function<void(int fd)> serve) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fds_.size() >= max_open) return false;
  const uint64_t id = next_++;
  const int raw = fd.Release();
  fds_[id] = raw;
  threads_[id] = std::thread([this, id, raw, serve = std::move(serve)] {
    serve(raw);
    Finished(id);
  });
  return true;
}

void ConnectionThreads::Finished(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = fds_.find(id);
  if (it != fds_.end()) {
    // Closed under the lock: StopAll never shuts down a number reused since.
    ::shutdown(it->second, SHUT_RDWR);
    ::close(it->second);
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
  for (const auto& [id, fd] : fds_) ::shutdown(fd, SHUT_RDWR);
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

}  // namespace granary
