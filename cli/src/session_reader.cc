#include "session_reader.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "granary/core/log.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"

namespace granary::cli {
namespace {

using std::chrono::milliseconds;

// A pin on one sample in the arena of `session`, which it keeps mapped.
class SessionPin : public PinnedSample {
 public:
  SessionPin(std::shared_ptr<client::Session> session, client::SampleView view)
      : session_(std::move(session)), view_(view) {}
  ~SessionPin() override { session_->Release(view_); }
  SessionPin(const SessionPin&) = delete;
  SessionPin& operator=(const SessionPin&) = delete;

  std::string_view bytes() const override { return view_.bytes(); }

 private:
  std::shared_ptr<client::Session> session_;
  client::SampleView view_;
};

// The errors a broken connection gives (session.h, "Errors").
bool MayBeBroken(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

std::string Seconds(milliseconds ms) {
  return std::to_string(static_cast<double>(ms.count()) / 1000.0).substr(0, 5) + " s";
}

}  // namespace

Status SessionReaderOptions::Validate() const {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(dataset));
  if (max_sessions == 0) {
    return Status::InvalidArgument("session reader: max_sessions must be at least 1");
  }
  if (reconnect_timeout.count() < 0) {
    return Status::InvalidArgument("session reader: reconnect_timeout must not be negative");
  }
  if (hint_batch == 0 || hint_batch > client::kMaxLookahead) {
    return Status::InvalidArgument("session reader: hint_batch must be 1.." +
                                   std::to_string(client::kMaxLookahead));
  }
  if (flush_interval.count() <= 0) {
    return Status::InvalidArgument("session reader: flush_interval must be positive");
  }
  client::SessionOptions session_options = session;
  session_options.lookahead = 0;
  return session_options.Validate();
}

SessionContentReader::SessionContentReader(SessionReaderOptions options)
    : options_(std::move(options)) {}

Result<std::unique_ptr<SessionContentReader>> SessionContentReader::Open(
    SessionReaderOptions options) {
  GRANARY_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<SessionContentReader> reader(new SessionContentReader(std::move(options)));
  GRANARY_ASSIGN_OR_RETURN(std::shared_ptr<client::Session> first, reader->OpenSession());
  reader->info_ = first->info();
  reader->info_known_ = true;
  reader->idle_.push_back(std::move(first));
  reader->open_sessions_ = 1;
  reader->hint_thread_ = std::thread([r = reader.get()] { r->HintLoop(); });
  return reader;
}

SessionContentReader::~SessionContentReader() {
  {
    std::lock_guard<std::mutex> lock(hint_mu_);
    stop_ = true;
  }
  hint_cv_.notify_all();
  if (hint_thread_.joinable()) hint_thread_.join();
}

Result<std::shared_ptr<client::Session>> SessionContentReader::OpenSession() {
  client::SessionOptions o = options_.session;
  o.lookahead = 0;
  if (o.client_name.empty()) o.client_name = "posix/" + std::to_string(getpid());
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<client::Session> session,
                           client::Session::Open(options_.dataset, o));
  // A new snapshot while mounted would give the same ids other files.
  if (info_known_) {
    if (!(session->info().manifest_id == info_.manifest_id)) {
      return Status::FailedPrecondition(
          "reconnecting to the sidecar for dataset " + Quoted(options_.dataset) +
          ": the dataset has a new snapshot (manifest " + session->info().manifest_id.ToHex() +
          ", mounted " + info_.manifest_id.ToHex() + "); unmount and mount it again");
    }
  }
  return std::shared_ptr<client::Session>(std::move(session));
}

Result<std::shared_ptr<client::Session>> SessionContentReader::TakeSession(
    Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(pool_mu_);
  while (true) {
    if (!idle_.empty()) {
      std::shared_ptr<client::Session> s = std::move(idle_.back());
      idle_.pop_back();
      return s;
    }
    if (open_sessions_ < options_.max_sessions) {
      ++open_sessions_;
      lock.unlock();
      Result<std::shared_ptr<client::Session>> opened = OpenSession();
      if (!opened.ok()) {
        lock.lock();
        --open_sessions_;
        pool_cv_.notify_one();
      }
      return opened;
    }
    if (pool_cv_.wait_until(lock, deadline) == std::cv_status::timeout && idle_.empty() &&
        open_sessions_ >= options_.max_sessions) {
      return Status::DeadlineExceeded("waiting for one of the " +
                                      std::to_string(options_.max_sessions) +
                                      " sessions to the sidecar, all busy; raise max_sessions");
    }
  }
}

void SessionContentReader::ReturnSession(std::shared_ptr<client::Session> session) {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    idle_.push_back(std::move(session));
  }
  pool_cv_.notify_one();
}

void SessionContentReader::DropSession() {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    --open_sessions_;
  }
  pool_cv_.notify_one();
}

Result<std::unique_ptr<PinnedSample>> SessionContentReader::Acquire(SampleId id) {
  const std::string what = "reading sample " + std::to_string(id) + " of dataset " +
                           Quoted(options_.dataset) + " through the sidecar at " +
                           client::ResolveSocketPath(options_.session.socket_path);
  Clock::time_point give_up = Clock::time_point::max();
  milliseconds backoff{20};
  Status last;
  bool reconnecting = false;
  // Bounded in time by reconnect_timeout, in count by the backoff's floor.
  for (int attempt = 0; attempt < 100'000; ++attempt) {
    const Clock::time_point now = Clock::now();
    Result<std::shared_ptr<client::Session>> session = TakeSession(
        give_up == Clock::time_point::max() ? now + options_.reconnect_timeout : give_up);
    if (!session.ok()) {
      last = session.status();
      if (!MayBeBroken(last)) break;  // e.g. the dataset is gone or has a new snapshot
    } else {
      Result<client::SampleView> view = (*session)->Get(id);
      if (view.ok()) {
        auto pin = std::make_unique<SessionPin>(*session, *view);
        ReturnSession(std::move(*session));
        acquired_.fetch_add(1, std::memory_order_relaxed);
        return std::unique_ptr<PinnedSample>(std::move(pin));
      }
      last = view.status();
      // A sample's own error: the sidecar tried every node and the source.
      if (!MayBeBroken(last) || (*session)->Ping().ok()) {
        ReturnSession(std::move(*session));
        acquire_errors_.fetch_add(1, std::memory_order_relaxed);
        return last;
      }
      // The connection broke: this session stays broken (session.h).
      broken_sessions_.fetch_add(1, std::memory_order_relaxed);
      session->reset();
      DropSession();
      if (!reconnecting) {
        GetLogger("posix")->warn("{}: {}; reconnecting for up to {}", what, last.message(),
                                 Seconds(options_.reconnect_timeout));
      }
      reconnecting = true;
    }
    if (give_up == Clock::time_point::max()) give_up = now + options_.reconnect_timeout;
    const Clock::time_point after = Clock::now();
    if (after >= give_up) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, give_up - after));
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
  acquire_errors_.fetch_add(1, std::memory_order_relaxed);
  return Status(last.code(),
                what + ": " + last.message() +
                    (MayBeBroken(last) ? "; gave up after reconnecting for " +
                                             Seconds(options_.reconnect_timeout) +
                                             " (is granary-sidecar running? `granary doctor`)"
                                       : ""));
}

void SessionContentReader::Hint(std::span<const SampleId> ids) {
  if (ids.empty()) return;
  size_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(hint_mu_);
    for (SampleId id : ids) {
      if (id >= info_.sample_count) continue;
      pending_hints_.push_back(id);
    }
    while (pending_hints_.size() > options_.max_pending_hints) {
      pending_hints_.pop_front();
      ++dropped;
    }
  }
  if (dropped != 0) hints_dropped_.fetch_add(dropped, std::memory_order_relaxed);
  hint_cv_.notify_one();
}

void SessionContentReader::FlushIdleSessions() {
  std::vector<std::shared_ptr<client::Session>> sessions;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    sessions.swap(idle_);
  }
  std::vector<std::shared_ptr<client::Session>> healthy;
  size_t broken = 0;
  for (auto& s : sessions) {
    if (s->Flush().ok()) {
      healthy.push_back(std::move(s));
    } else {
      ++broken;  // dropped; the next Acquire opens a new one
    }
  }
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    for (auto& s : healthy) idle_.push_back(std::move(s));
    open_sessions_ -= broken;
  }
  broken_sessions_.fetch_add(broken, std::memory_order_relaxed);
  pool_cv_.notify_all();
}

void SessionContentReader::HintLoop() {
  std::shared_ptr<client::Session> session;
  Clock::time_point last_flush = Clock::now();
  while (true) {
    std::vector<SampleId> batch;
    {
      std::unique_lock<std::mutex> lock(hint_mu_);
      hint_cv_.wait_for(lock, options_.flush_interval,
                        [this] { return stop_ || !pending_hints_.empty(); });
      if (stop_) break;
      while (!pending_hints_.empty() && batch.size() < options_.hint_batch) {
        batch.push_back(pending_hints_.front());
        pending_hints_.pop_front();
      }
    }
    if (Clock::now() - last_flush >= options_.flush_interval) {
      FlushIdleSessions();
      last_flush = Clock::now();
    }
    if (batch.empty()) continue;
    if (session == nullptr) {
      Result<std::shared_ptr<client::Session>> opened = OpenSession();
      if (!opened.ok()) {
        // Hints are worth nothing late: drop what is queued and let reads
        // (which retry) find the sidecar again.
        size_t dropped = batch.size();
        {
          std::lock_guard<std::mutex> lock(hint_mu_);
          dropped += pending_hints_.size();
          pending_hints_.clear();
        }
        hints_dropped_.fetch_add(dropped, std::memory_order_relaxed);
        GetLogger("posix")->debug("readahead for dataset {}: {}", Quoted(options_.dataset),
                                  opened.status().message());
        continue;
      }
      session = std::move(*opened);
    }
    std::vector<Result<client::SampleView>> got = session->GetMany(batch);
    bool maybe_broken = false;
    for (Result<client::SampleView>& v : got) {
      if (v.ok()) {
        session->Release(*v);
      } else if (MayBeBroken(v.status())) {
        maybe_broken = true;
      }
    }
    hinted_.fetch_add(batch.size(), std::memory_order_relaxed);
    hint_batches_.fetch_add(1, std::memory_order_relaxed);
    if (!session->Flush().ok() || (maybe_broken && !session->Ping().ok())) {
      broken_sessions_.fetch_add(1, std::memory_order_relaxed);
      session.reset();
    }
  }
}

SessionContentReader::Counters SessionContentReader::counters() const {
  Counters c;
  c.acquired = acquired_.load(std::memory_order_relaxed);
  c.acquire_errors = acquire_errors_.load(std::memory_order_relaxed);
  c.broken_sessions = broken_sessions_.load(std::memory_order_relaxed);
  c.hinted = hinted_.load(std::memory_order_relaxed);
  c.hint_batches = hint_batches_.load(std::memory_order_relaxed);
  c.hints_dropped = hints_dropped_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace granary::cli
