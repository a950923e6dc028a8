// SampleFetcher (sample_fetcher_impl.h): the datasets' sources, opened with
// OpenSource as each dataset's owner on first need, and reading a Fetch's
// pieces from them (step 3 of a Fetch).

#include <algorithm>

#include "granary/core/names.h"
#include "sample_fetcher_impl.h"

namespace granary::sidecar {

using fetch_internal::RunConcurrently;

// ---- source ---------------------------------------------------------------------

Result<IdentityExecutor*> SampleFetcher::Impl::Executor() {
  if (executor_ != nullptr) return executor_;
  std::lock_guard<std::mutex> lock(own_executor_mu_);
  if (own_executor_ == nullptr) {
    IdentityExecutorOptions o;
    o.threads = options_.source_concurrency;
    Result<std::unique_ptr<IdentityExecutor>> started = IdentityExecutor::Start(o);
    if (!started.ok()) {
      return started.status().WithContext("starting the sidecar's source reader threads");
    }
    own_executor_ = std::move(*started);
  }
  return own_executor_.get();
}

Result<std::shared_ptr<SourceSlot>> SampleFetcher::Impl::SourceFor(const FetchDataset& ds) {
  std::shared_ptr<SourceSlot> slot;
  {
    std::lock_guard<std::mutex> lock(sources_mu_);
    std::shared_ptr<SourceSlot>& entry = sources_[ds.name];
    if (entry == nullptr || !(entry->manifest_id == ds.manifest->id()) ||
        entry->uri != ds.source_uri || !(entry->owner == ds.owner)) {
      // A new snapshot (or owner) replaces the old one; reads in flight keep
      // the old slot alive through their shared_ptr.
      entry = std::make_shared<SourceSlot>();
      entry->manifest_id = ds.manifest->id();
      entry->uri = ds.source_uri;
      entry->owner = ds.owner;
    }
    slot = entry;
  }
  std::lock_guard<std::mutex> lock(slot->mu);
  if (slot->source != nullptr) return slot;
  const SteadyClock::time_point now = SteadyClock::now();
  if (!slot->error.ok() && now < slot->retry_after) return slot->error;

  auto open = [&]() -> Status {
    const std::string doing = "opening the source " + Quoted(ds.source_uri) + " of dataset " +
                              Quoted(ds.name) + " for reads the cache nodes could not serve";
    Result<Identity> owner = ResolveOwnerIdentity(ds.owner.uid, ds.owner.gid);
    if (!owner.ok()) return owner.status().WithContext(doing);
    Result<IdentityExecutor*> ex = Executor();
    if (!ex.ok()) return ex.status().WithContext(doing);
    SourceOptions o;
    o.dataset = ds.name;
    o.owner = *owner;
    o.executor = *ex;
    o.max_in_flight = options_.source_concurrency;
    Result<std::unique_ptr<Source>> source = OpenSource(ds.source_uri, std::move(o));
    if (!source.ok()) return source.status().WithContext(doing + " as " + owner->ToString());
    slot->source = std::move(*source);
    return Status::Ok();
  };
  if (Status s = open(); !s.ok()) {
    // Not retried for a while: a dataset whose source is unreachable must not
    // cost an open attempt per Fetch.
    slot->error = s;
    slot->retry_after = now + options_.node_down_for;
    log_->warn("{}", s.ToString());
    return s;
  }
  slot->error = Status::Ok();
  return slot;
}

void SampleFetcher::Impl::ReadFromSource(FetchState& st, const std::vector<uint32_t>& list) {
  const FetchDataset& ds = *st.dataset;
  Result<std::shared_ptr<SourceSlot>> slot = SourceFor(ds);
  if (!slot.ok()) {
    for (uint32_t p : list) {
      st.pieces[p].state = Piece::State::kFailed;
      // Why it came to the source at all belongs in the message too.
      st.pieces[p].status =
          Status(slot.status().code(), slot.status().message() + " (after the cache nodes: " +
                                           AttemptsText(st, st.pieces[p]) + ")");
    }
    return;
  }
  Source& source = *(*slot)->source;
  std::atomic<size_t> next{0};
  auto worker = [&](size_t) {
    for (size_t i = next.fetch_add(1); i < list.size(); i = next.fetch_add(1)) {
      Piece& piece = st.pieces[list[i]];
      const FetchTarget& target = st.targets[piece.target];
      Result<SourceFile> file = SourceFileOf(*ds.manifest, target.id);
      Status s = file.status();
      if (s.ok())
        s = source.Read(*file, piece.offset, target.out.subspan(piece.offset, piece.length));
      if (s.ok()) {
        piece.state = Piece::State::kDone;
        piece.from = SampleSource::kSource;
        piece.checksum.reset();
      } else {
        piece.state = Piece::State::kFailed;
        const Status read = s.WithContext("sample " + std::to_string(target.id) + " of dataset " +
                                          Quoted(ds.name) + " from its source");
        piece.status =
            Status(read.code(),
                   read.message() + " (after the cache nodes: " + AttemptsText(st, piece) + ")");
      }
    }
  };
  RunConcurrently(std::min<size_t>(options_.source_concurrency, list.size()), worker);
}

}  // namespace granary::sidecar
