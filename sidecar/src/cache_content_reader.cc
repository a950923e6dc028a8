// CacheContentReader (cache_content_reader.h).

#include "cache_content_reader.h"

#include <utility>
#include <vector>

#include "granary/core/thread_name.h"

namespace granary::sidecar {
namespace {

class CachePin : public posix::PinnedSample {
 public:
  CachePin(std::shared_ptr<SampleCache> cache, uint64_t client, uint64_t token,
           std::string_view bytes)
      : cache_(std::move(cache)), client_(client), token_(token), bytes_(bytes) {}
  ~CachePin() override {
    const uint64_t tokens[1] = {token_};
    cache_->Release(client_, tokens);
  }
  std::string_view bytes() const override { return bytes_; }

 private:
  const std::shared_ptr<SampleCache> cache_;
  const uint64_t client_;
  const uint64_t token_;
  const std::string_view bytes_;
};

}  // namespace

CacheContentReader::CacheContentReader(std::shared_ptr<SampleCache> cache, FetchFn fetch,
                                       std::chrono::milliseconds wait_timeout)
    : cache_(std::move(cache)),
      fetch_(std::move(fetch)),
      wait_timeout_(wait_timeout),
      reads_client_(cache_->AddClient()),
      hints_client_(cache_->AddClient()) {
  hint_thread_ = std::thread([this] {
    NameThisThread("view-hints");
    HintLoop();
  });
}

CacheContentReader::~CacheContentReader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  hint_thread_.join();
  cache_->DropClient(hints_client_);
  cache_->DropClient(reads_client_);
}

Result<std::unique_ptr<posix::PinnedSample>> CacheContentReader::Acquire(SampleId id) {
  const SampleId ids[1] = {id};
  std::vector<AcquiredSample> got = cache_->Acquire(
      reads_client_, ids, 0, fetch_, std::chrono::steady_clock::now() + wait_timeout_);
  if (got.size() != 1) return Status::Internal("the sample cache answered no sample");
  if (!got[0].status.ok()) return got[0].status;
  const char* base = cache_->arena_data();
  return std::unique_ptr<posix::PinnedSample>(
      new CachePin(cache_, reads_client_, got[0].token,
                   std::string_view(base + got[0].offset, static_cast<size_t>(got[0].length))));
}

void CacheContentReader::Hint(std::span<const SampleId> ids) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (SampleId id : ids) {
      if (hints_.size() >= kMaxPendingHints) break;
      hints_.push_back(id);
    }
  }
  cv_.notify_one();
}

void CacheContentReader::HintLoop() {
  std::vector<SampleId> batch;
  std::vector<uint64_t> tokens;
  for (;;) {
    batch.clear();
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !hints_.empty(); });
      if (stopping_) return;
      while (!hints_.empty() && batch.size() < kHintBatch) {
        if (hints_.front() < cache_->manifest().sample_count()) batch.push_back(hints_.front());
        hints_.pop_front();
      }
    }
    if (batch.empty()) continue;
    // Fetched into the arena and released at once: the reads that follow find
    // them there (until evicted).
    std::vector<AcquiredSample> got = cache_->Acquire(
        hints_client_, batch, 0, fetch_, std::chrono::steady_clock::now() + wait_timeout_);
    tokens.clear();
    for (const AcquiredSample& a : got) {
      if (a.status.ok()) tokens.push_back(a.token);
    }
    cache_->Release(hints_client_, tokens);
  }
}

}  // namespace granary::sidecar
