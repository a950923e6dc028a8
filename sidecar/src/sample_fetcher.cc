// SampleFetcher (sample_fetcher.h): placement over the live cache nodes,
// READs batched per node and sent to different nodes at once, fallback to
// other nodes and then the source. docs/sidecar.md, "Where samples come from".
//
// One Fetch:
//  1. plan: each valid target becomes one or more pieces (one per chunk its
//     bytes lie in, each cut to max_bytes_per_read), each with the ranking of
//     its chunk (owners first, the local node first among them);
//  2. rounds: every pending piece goes to its next candidate node that is not
//     marked down; the nodes of a round are read concurrently (one thread
//     per node beyond the first, which runs on the caller's thread), each in
//     as few READs as the limits allow; a piece a node could not deliver is
//     pending again for the next round, until it has no candidate left;
//  3. source: what no node delivered is read from the dataset's PosixSource
//     (opened once per dataset and manifest), up to source_concurrency reads
//     at once;
//  4. outcomes: a target is OK when each of its pieces is; its checksum is the
//     node's (verified by the PeerClient) for a sample read whole from a node,
//     else computed here.

#include "granary/sidecar/sample_fetcher.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

#include "granary/core/hash.h"
#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/core/placement.h"
#include "granary/core/posix_source.h"
#include "granary/core/protocol_format.h"
#include "granary/core/source.h"
#include "granary/daemon/config_keys.h"
#include "local_chunks.h"

namespace granary::sidecar {

namespace pf = protocol_format;

std::string_view SampleSourceName(SampleSource source) {
  switch (source) {
    case SampleSource::kLocalNode:
      return "local_node";
    case SampleSource::kPeer:
      return "peer";
    case SampleSource::kSource:
      return "source";
  }
  return "unknown";
}

Status SampleFetcherOptions::Validate() const {
  const std::string what = "sample fetcher options: ";
  PeerClientOptions named = peer;
  named.client_name = client_name;
  if (Status s = named.Validate(); !s.ok()) return s.WithContext("sample fetcher options");
  if (!peer.verify_checksums) {
    return Status::InvalidArgument(
        what +
        "peer.verify_checksums is off; the fetcher never hands out bytes it did not "
        "check, so leave it on");
  }
  if (!local_node_id.empty()) {
    if (Status s = ValidateNodeId(local_node_id); !s.ok()) {
      return s.WithContext(what + "local_node_id " + Quoted(local_node_id));
    }
  }
  if (max_items_per_read == 0 || max_items_per_read > pf::kMaxItemsCap) {
    return Status::InvalidArgument(what + "max_items_per_read " +
                                   std::to_string(max_items_per_read) + " must be 1 to " +
                                   std::to_string(pf::kMaxItemsCap));
  }
  if (max_bytes_per_read < kMinChunkSize || max_bytes_per_read > pf::kMaxReadBytesCap) {
    return Status::InvalidArgument(
        what + "max_bytes_per_read " + std::to_string(max_bytes_per_read) + " must be " +
        std::to_string(kMinChunkSize) + " to " + std::to_string(pf::kMaxReadBytesCap) + " bytes");
  }
  if (node_down_for.count() <= 0 || node_down_for > std::chrono::hours(1)) {
    return Status::InvalidArgument(what + "node_down_for " + std::to_string(node_down_for.count()) +
                                   " ms must be positive and at most one hour");
  }
  if (!local_node_socket.empty()) {
    if (local_node_id.empty()) {
      return Status::InvalidArgument(what + "local_node_socket " + Quoted(local_node_socket) +
                                     " is set but local_node_id is not; name the local node");
    }
    GRANARY_RETURN_IF_ERROR(CheckSocketPath(what + "local_node_socket", local_node_socket,
                                            "/run/granary/cachenode.sock"));
  }
  if (local_open_chunks == 0 || local_open_chunks > 65536) {
    return Status::InvalidArgument(what + "local_open_chunks " + std::to_string(local_open_chunks) +
                                   " must be 1 to 65536");
  }
  if (source_concurrency == 0 || source_concurrency > 1024) {
    return Status::InvalidArgument(what + "source_concurrency " +
                                   std::to_string(source_concurrency) + " must be 1 to 1024");
  }
  return Status::Ok();
}

namespace {

using Clock = std::chrono::steady_clock;

// Idle connections kept per node: enough for the sidecar's fetch threads.
constexpr size_t kMaxIdleClientsPerNode = 32;
constexpr uint32_t kNone = Placement::kNoOwner;
// Node lists whose views ViewFor keeps (then it starts over).
constexpr size_t kMaxFilteredViews = 64;

// Per-item codes that every node, and the source, would answer the same way.
bool IsFinal(StatusCode code) {
  return code == StatusCode::kFailedPrecondition || code == StatusCode::kPermissionDenied;
}

// The live nodes as placement sees them.
struct NodeView {
  Placement placement;
  std::vector<NodeRecord> nodes;  // parallel to placement.nodes()
  uint32_t local = kNone;         // index of options.local_node_id when live
};

// A node that failed at the connection level, skipped until `until`.
struct DownMark {
  Clock::time_point until;
  std::string address;  // of the incarnation that failed
  int64_t started_ms = 0;
  Status why;
};

// One dataset's source, opened on first need (SourceFor).
struct SourceSlot {
  ContentId manifest_id;
  std::string uri;
  DatasetOwner owner;
  std::mutex mu;
  std::unique_ptr<PosixSource> source;  // set once under mu, then never changed
  Status error;                         // guarded by mu: the last failed open
  Clock::time_point retry_after;        // guarded by mu
};

// A node asked (or skipped, being marked down) for a piece, and why it did not deliver.
struct Attempt {
  uint32_t node = 0;  // index into the view
  bool skipped = false;
  Status status;
};

// A contiguous range of one target's sample that one chunk holds.
struct Piece {
  enum class State : uint8_t { kPending, kDone, kFailed };

  uint32_t target = 0;
  uint32_t chunk_slot = 0;  // index into FetchState::chunks
  uint64_t offset = 0;      // within the sample
  uint32_t length = 0;
  State state = State::kPending;
  SampleSource from = SampleSource::kPeer;
  std::optional<uint64_t> checksum;  // the node's, when the piece is the whole sample
  Status status;                     // kFailed: why
  std::vector<Attempt> attempts;
};

// Whom to ask for one chunk.
struct ChunkCandidates {
  ChunkId chunk = 0;
  std::vector<uint32_t> owners;   // the replication owners, local first, then by rank
  std::vector<uint32_t> ranking;  // every node, best first; filled when the owners are exhausted
};

struct FetchState {
  const FetchDataset* dataset = nullptr;
  std::span<const FetchTarget> targets;
  std::shared_ptr<const NodeView> view;
  uint32_t replication = 1;
  std::vector<Piece> pieces;
  std::vector<uint32_t> first_piece;  // per target, and one past the end: its pieces
  std::vector<ChunkCandidates> chunks;
  std::unordered_map<ChunkId, uint32_t> chunk_slots;
};

bool Tried(const Piece& p, uint32_t node) {
  return std::any_of(p.attempts.begin(), p.attempts.end(),
                     [&](const Attempt& a) { return a.node == node; });
}

// Runs fn(i) for i in [0, n): the first on this thread, the others on threads
// of their own (or here, if the system has no thread to give).
template <typename Fn>
void RunConcurrently(size_t n, const Fn& fn) {
  std::vector<std::thread> threads;
  threads.reserve(n > 0 ? n - 1 : 0);
  for (size_t i = 1; i < n; ++i) {
    try {
      threads.emplace_back([&fn, i] { fn(i); });
    } catch (const std::system_error&) {
      fn(i);
    }
  }
  if (n > 0) fn(0);
  for (std::thread& t : threads) t.join();
}

}  // namespace

struct SampleFetcher::Impl {
  Impl(SampleFetcherOptions o, IdentityExecutor* e) : options_(std::move(o)), executor_(e) {
    peer_options_ = options_.peer;
    peer_options_.client_name = options_.client_name;
    peer_options_.tls = nullptr;
    // Nodes that serve TLS say so in their record (kNodeLabelTls).
    tls_options_ = peer_options_;
    tls_options_.tls = options_.peer.tls;
    if (!options_.local_node_socket.empty()) {
      local_chunks_ =
          std::make_unique<LocalChunks>(options_.local_node_socket, options_.peer.call_timeout,
                                        options_.node_down_for, options_.local_open_chunks);
    }
  }

  void SetNodes(std::vector<NodeRecord> nodes);
  void Fetch(const FetchDataset& dataset, std::span<const FetchTarget> targets,
             std::span<FetchOutcome> outcomes);
  SampleFetcherCounters Counters() const;

  // Fetch's steps.
  void Plan(FetchState& st, std::span<FetchOutcome> outcomes, std::vector<char>* settled);
  uint32_t CandidatesFor(FetchState& st, ChunkId chunk);
  uint32_t NextCandidate(FetchState& st, Piece& piece, const std::vector<char>& down_now);
  void ReadFromNode(FetchState& st, uint32_t node, const std::vector<uint32_t>& list);
  // The local node's share of ReadFromNode through its chunk files; returns
  // the pieces left for the network.
  std::vector<uint32_t> ReadLocalFiles(FetchState& st, const std::vector<uint32_t>& list);
  void ReadOverNetwork(FetchState& st, uint32_t node, const std::vector<uint32_t>& list);
  void ReadFromSource(FetchState& st, const std::vector<uint32_t>& list);
  std::string NoNodeMessage(const FetchState& st, const Piece& piece);
  // What the cache nodes said of `piece` ("tried 'n1' at addr: <status>; ..."
  // or that none was listed), for messages.
  std::string AttemptsText(const FetchState& st, const Piece& piece);

  Result<std::shared_ptr<NodeView>> MakeView(std::vector<NodeRecord> nodes) const;
  std::shared_ptr<const NodeView> View() const;
  // The view of a dataset placed on some nodes only (FetchDataset::nodes):
  // View() without the others, made once per node list and membership.
  std::shared_ptr<const NodeView> ViewFor(const FetchDataset& dataset);
  std::vector<char> DownSnapshot(const NodeView& view);
  void NodeFailed(const NodeRecord& node, const Status& why);
  Result<PeerClient> TakeClient(const NodeRecord& node);
  void PutClient(const std::string& address, PeerClient client);
  Result<std::shared_ptr<SourceSlot>> SourceFor(const FetchDataset& dataset);
  Result<IdentityExecutor*> Executor();

  const SampleFetcherOptions options_;
  PeerClientOptions peer_options_;  // options_.peer named options_.client_name, plain TCP
  PeerClientOptions tls_options_;   // the same over TLS (options_.peer.tls)
  IdentityExecutor* const executor_;
  std::shared_ptr<spdlog::logger> log_ = GetLogger("sidecar");
  std::unique_ptr<LocalChunks> local_chunks_;  // local_node_socket set

  // Started on the first source open when `executor_` is null. Declared before
  // `sources_` so that it outlives them.
  std::mutex own_executor_mu_;
  std::unique_ptr<IdentityExecutor> own_executor_;  // guarded by own_executor_mu_

  mutable std::mutex view_mu_;
  std::shared_ptr<const NodeView> view_ = std::make_shared<NodeView>();  // guarded by view_mu_

  // ViewFor's views: node list -> (the View() it was made from, the view).
  std::mutex filtered_mu_;
  std::map<std::string, std::pair<std::shared_ptr<const NodeView>, std::shared_ptr<const NodeView>>>
      filtered_;  // guarded by filtered_mu_

  std::mutex down_mu_;
  std::map<std::string, DownMark> down_;  // guarded by down_mu_; by node id

  std::mutex pool_mu_;
  std::map<std::string, std::vector<PeerClient>> pool_;  // guarded by pool_mu_; by address

  std::mutex sources_mu_;
  std::map<std::string, std::shared_ptr<SourceSlot>> sources_;  // guarded by sources_mu_; by name

  std::atomic<uint64_t> samples_[kSampleSources] = {};
  std::atomic<uint64_t> bytes_[kSampleSources] = {};
  std::atomic<uint64_t> reads_sent_{0};
  std::atomic<uint64_t> node_failures_{0};
  std::atomic<uint64_t> item_retries_{0};
  std::atomic<uint64_t> failed_samples_{0};
};

// ---- nodes ----------------------------------------------------------------------

Result<std::shared_ptr<NodeView>> SampleFetcher::Impl::MakeView(
    std::vector<NodeRecord> nodes) const {
  // Exactly the cache nodes' computation (PlacementOverNodes, placement.h).
  GRANARY_ASSIGN_OR_RETURN(Placement placement, PlacementOverNodes(nodes));
  auto next = std::make_shared<NodeView>();
  next->placement = std::move(placement);
  next->nodes.resize(nodes.size());
  for (NodeRecord& n : nodes) {
    Result<uint32_t> index = next->placement.IndexOf(n.id);
    if (index.ok()) next->nodes[*index] = std::move(n);
  }
  if (!options_.local_node_id.empty()) {
    if (Result<uint32_t> local = next->placement.IndexOf(options_.local_node_id); local.ok()) {
      next->local = *local;
    }
  }
  return next;
}

void SampleFetcher::Impl::SetNodes(std::vector<NodeRecord> nodes) {
  const size_t count = nodes.size();
  Result<std::shared_ptr<NodeView>> made = MakeView(std::move(nodes));
  if (!made.ok()) {
    log_->error("computing placement over {} cache nodes: {}; keeping the previous node list",
                count, made.status().ToString());
    return;
  }
  std::shared_ptr<NodeView> next = std::move(*made);

  // A node that came back as another incarnation (new address or start time)
  // is not the one that failed: forget its mark. Expired marks go too, so the
  // map holds no more than the nodes that failed within node_down_for.
  {
    std::lock_guard<std::mutex> lock(down_mu_);
    const Clock::time_point now = Clock::now();
    std::erase_if(down_, [&](const auto& entry) { return entry.second.until <= now; });
    for (const NodeRecord& n : next->nodes) {
      auto it = down_.find(n.id);
      if (it != down_.end() &&
          (it->second.address != n.address || it->second.started_ms != n.started_ms)) {
        down_.erase(it);
      }
    }
  }
  // Idle connections to addresses no live node has any more.
  std::vector<PeerClient> stale;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    for (auto it = pool_.begin(); it != pool_.end();) {
      const bool live = std::any_of(next->nodes.begin(), next->nodes.end(),
                                    [&](const NodeRecord& n) { return n.address == it->first; });
      if (live) {
        ++it;
        continue;
      }
      for (PeerClient& c : it->second) stale.push_back(std::move(c));
      it = pool_.erase(it);
    }
  }
  std::lock_guard<std::mutex> lock(view_mu_);
  view_ = std::move(next);
}

std::shared_ptr<const NodeView> SampleFetcher::Impl::View() const {
  std::lock_guard<std::mutex> lock(view_mu_);
  return view_;
}

std::shared_ptr<const NodeView> SampleFetcher::Impl::ViewFor(const FetchDataset& dataset) {
  std::shared_ptr<const NodeView> all = View();
  if (!dataset.nodes.has_value()) return all;
  std::string key;
  for (const std::string& id : *dataset.nodes) {
    key += id;
    key += '\n';
  }
  std::lock_guard<std::mutex> lock(filtered_mu_);
  if (auto it = filtered_.find(key); it != filtered_.end() && it->second.first == all) {
    return it->second.second;
  }
  Result<std::shared_ptr<NodeView>> view = MakeView(ListedNodes(dataset.nodes, all->nodes));
  if (!view.ok()) return all;  // a subset of a valid list: cannot fail
  if (filtered_.size() >= kMaxFilteredViews) filtered_.clear();
  std::shared_ptr<const NodeView> made = std::move(*view);
  filtered_[key] = {all, made};
  return made;
}

std::vector<char> SampleFetcher::Impl::DownSnapshot(const NodeView& v) {
  std::vector<char> result(v.nodes.size(), 0);
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(down_mu_);
  if (down_.empty()) return result;
  for (size_t i = 0; i < v.nodes.size(); ++i) {
    auto it = down_.find(v.nodes[i].id);
    if (it != down_.end() && now < it->second.until) result[i] = 1;
  }
  return result;
}

void SampleFetcher::Impl::NodeFailed(const NodeRecord& node, const Status& why) {
  node_failures_.fetch_add(1, std::memory_order_relaxed);
  const Clock::time_point now = Clock::now();
  bool newly = false;
  {
    std::lock_guard<std::mutex> lock(down_mu_);
    DownMark& mark = down_[node.id];
    newly = mark.until <= now;
    mark.until = now + options_.node_down_for;
    mark.address = node.address;
    mark.started_ms = node.started_ms;
    mark.why = why;
  }
  // Its other idle connections are as dead as this one.
  std::vector<PeerClient> dropped;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    auto it = pool_.find(node.address);
    if (it != pool_.end()) {
      dropped = std::move(it->second);
      pool_.erase(it);
    }
  }
  if (newly) {
    log_->warn("cache node {} at {} is skipped for {} ms: {}", Quoted(node.id),
               Quoted(node.address), options_.node_down_for.count(), why.ToString());
  }
}

Result<PeerClient> SampleFetcher::Impl::TakeClient(const NodeRecord& node) {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    auto it = pool_.find(node.address);
    if (it != pool_.end() && !it->second.empty()) {
      PeerClient client = std::move(it->second.back());
      it->second.pop_back();
      return client;
    }
  }
  auto tls = node.labels.find(std::string(kNodeLabelTls));
  if (tls != node.labels.end() && tls->second == "true") {
    if (tls_options_.tls == nullptr) {
      return Status::FailedPrecondition(
          "cache node " + Quoted(node.id) +
          " serves TLS and this reader has no TLS context; give it one (tls_ca_file)");
    }
    return PeerClient::Connect(node.address, tls_options_);
  }
  return PeerClient::Connect(node.address, peer_options_);
}

void SampleFetcher::Impl::PutClient(const std::string& address, PeerClient client) {
  if (!client.connected()) return;
  std::lock_guard<std::mutex> lock(pool_mu_);
  std::vector<PeerClient>& idle = pool_[address];
  if (idle.size() < kMaxIdleClientsPerNode) idle.push_back(std::move(client));
}

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
  const Clock::time_point now = Clock::now();
  if (!slot->error.ok() && now < slot->retry_after) return slot->error;

  auto open = [&]() -> Status {
    const std::string doing = "opening the source " + Quoted(ds.source_uri) + " of dataset " +
                              Quoted(ds.name) + " for reads the cache nodes could not serve";
    Result<std::string> root = PosixSource::RootFromUri(ds.source_uri);
    if (!root.ok()) return root.status().WithContext(doing);
    Result<Identity> owner = ResolveOwnerIdentity(ds.owner.uid, ds.owner.gid);
    if (!owner.ok()) return owner.status().WithContext(doing);
    Result<IdentityExecutor*> ex = Executor();
    if (!ex.ok()) return ex.status().WithContext(doing);
    PosixSourceOptions o;
    o.root = *root;
    o.uri = ds.source_uri;
    o.dataset = ds.name;
    o.owner = *owner;
    o.executor = *ex;
    o.max_in_flight = options_.source_concurrency;
    Result<std::unique_ptr<PosixSource>> source = PosixSource::Open(std::move(o));
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
  PosixSource& source = *(*slot)->source;
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

// ---- planning -------------------------------------------------------------------

uint32_t SampleFetcher::Impl::CandidatesFor(FetchState& st, ChunkId chunk) {
  auto [it, inserted] = st.chunk_slots.try_emplace(chunk, static_cast<uint32_t>(st.chunks.size()));
  if (!inserted) return it->second;
  ChunkCandidates& c = st.chunks.emplace_back();
  c.chunk = chunk;
  st.view->placement.OwnersInto(st.dataset->manifest->id(), chunk, st.replication, &c.owners);
  // The local node first when it is one of the owners (all hold the chunk).
  auto local = std::find(c.owners.begin(), c.owners.end(), st.view->local);
  if (local != c.owners.end()) std::rotate(c.owners.begin(), local, local + 1);
  return it->second;
}

void SampleFetcher::Impl::Plan(FetchState& st, std::span<FetchOutcome> outcomes,
                               std::vector<char>* settled) {
  const FetchDataset& ds = *st.dataset;
  const Manifest& m = *ds.manifest;
  const uint64_t max_piece = options_.max_bytes_per_read;
  st.first_piece.assign(st.targets.size() + 1, 0);
  for (size_t t = 0; t < st.targets.size(); ++t) {
    st.first_piece[t] = static_cast<uint32_t>(st.pieces.size());
    const FetchTarget& target = st.targets[t];
    FetchOutcome& outcome = outcomes[t];
    outcome = FetchOutcome{};
    if (target.id >= m.sample_count()) {
      outcome.status = Status::OutOfRange(
          "fetching sample " + std::to_string(target.id) + " of dataset " + Quoted(ds.name) +
          ": the id is past the end of its manifest (" + std::to_string(m.sample_count()) +
          " samples); ask for ids below " + std::to_string(m.sample_count()));
      (*settled)[t] = 1;
      continue;
    }
    const uint64_t size = m.SizeOf(target.id);
    if (target.out.size() != size) {
      outcome.status = Status::InvalidArgument(
          "fetching sample " + std::to_string(target.id) + " of dataset " + Quoted(ds.name) +
          ": the destination holds " + std::to_string(target.out.size()) +
          " bytes but the sample has " + std::to_string(size) + "; pass exactly its size");
      (*settled)[t] = 1;
      continue;
    }
    const auto add = [&](ChunkId chunk, uint64_t offset, uint64_t length) {
      const uint32_t slot = CandidatesFor(st, chunk);
      for (uint64_t done = 0; done < length;) {
        Piece& p = st.pieces.emplace_back();
        p.target = static_cast<uint32_t>(t);
        p.chunk_slot = slot;
        p.offset = offset + done;
        p.length = static_cast<uint32_t>(std::min(length - done, max_piece));
        done += p.length;
      }
    };
    if (size == 0) {
      // Nothing to read: delivered at once, counted where its chunk lives.
      const ChunkCandidates& c = st.chunks[CandidatesFor(st, m.ChunkOf(target.id))];
      outcome.checksum = Checksum64(nullptr, 0);
      outcome.from = c.owners.empty()                ? SampleSource::kSource
                     : c.owners[0] == st.view->local ? SampleSource::kLocalNode
                                                     : SampleSource::kPeer;
      (*settled)[t] = 1;
      samples_[static_cast<size_t>(outcome.from)].fetch_add(1, std::memory_order_relaxed);
    } else if (size <= m.chunk_size()) {
      add(m.ChunkOf(target.id), 0, size);  // whole in one chunk
    } else {
      // Larger than a chunk: one piece in each of the chunks it fills.
      Result<SampleInfo> info = m.Sample(target.id);
      uint64_t covered = 0;
      Status bad = info.status();
      for (uint32_t k = 0; bad.ok() && k < info->chunk_count; ++k) {
        Result<std::vector<ChunkSegment>> segments = m.Segments(info->chunk + k);
        if (!segments.ok()) {
          bad = segments.status();
          break;
        }
        for (const ChunkSegment& seg : *segments) {
          if (seg.sample != target.id) continue;
          if (seg.sample_offset != covered || seg.length == 0) {
            bad = Status::Internal("segment at sample offset " + std::to_string(seg.sample_offset) +
                                   " where " + std::to_string(covered) + " was expected");
            break;
          }
          add(info->chunk + k, seg.sample_offset, seg.length);
          covered += seg.length;
        }
      }
      if (bad.ok() && covered != size) {
        bad = Status::Internal("its pieces cover " + std::to_string(covered) + " of " +
                               std::to_string(size) + " bytes");
      }
      if (!bad.ok()) {
        st.pieces.resize(st.first_piece[t]);
        outcome.status = Status(bad.code(), "fetching sample " + std::to_string(target.id) +
                                                " of dataset " + Quoted(ds.name) +
                                                ": its chunks in the manifest: " + bad.message() +
                                                "; re-snapshot the dataset");
        (*settled)[t] = 1;
      }
    }
  }
  st.first_piece[st.targets.size()] = static_cast<uint32_t>(st.pieces.size());
}

uint32_t SampleFetcher::Impl::NextCandidate(FetchState& st, Piece& piece,
                                            const std::vector<char>& down_now) {
  ChunkCandidates& c = st.chunks[piece.chunk_slot];
  for (uint32_t n : c.owners) {
    if (Tried(piece, n)) continue;
    if (down_now[n]) {
      piece.attempts.push_back(Attempt{n, true, Status()});
      continue;
    }
    return n;
  }
  // Every owner failed or is down: the nodes placement picks once the down
  // ones are excluded. Rendezvous scores do not depend on the other nodes, so
  // those are the first `replication` nodes after the owners in the full
  // ranking that are not down_.
  if (c.ranking.empty()) {
    c.ranking = st.view->placement.Owners(st.dataset->manifest->id(), c.chunk,
                                          static_cast<uint32_t>(st.view->nodes.size()));
  }
  uint32_t picked = 0;
  for (uint32_t n : c.ranking) {
    if (std::find(c.owners.begin(), c.owners.end(), n) != c.owners.end()) continue;
    if (down_now[n]) {
      if (!Tried(piece, n)) piece.attempts.push_back(Attempt{n, true, Status()});
      continue;
    }
    if (++picked > st.replication) break;
    if (!Tried(piece, n)) return n;
  }
  return kNone;
}

// ---- reading from a node ----------------------------------------------------------

std::vector<uint32_t> SampleFetcher::Impl::ReadLocalFiles(FetchState& st,
                                                          const std::vector<uint32_t>& list) {
  std::vector<uint32_t> rest;
  for (uint32_t p : list) {
    Piece& piece = st.pieces[p];
    const FetchTarget& target = st.targets[piece.target];
    Result<uint64_t> checksum =
        local_chunks_->Read(*st.dataset, st.chunks[piece.chunk_slot].chunk, target.id, piece.offset,
                            target.out.subspan(piece.offset, piece.length));
    if (!checksum.ok()) {
      rest.push_back(p);
      continue;
    }
    piece.state = Piece::State::kDone;
    piece.from = SampleSource::kLocalNode;
    if (piece.offset == 0 && piece.length == target.out.size()) {
      piece.checksum = *checksum;
    } else {
      piece.checksum.reset();
    }
  }
  return rest;
}

void SampleFetcher::Impl::ReadFromNode(FetchState& st, uint32_t node,
                                       const std::vector<uint32_t>& list) {
  if (node == st.view->local && local_chunks_ != nullptr) {
    const std::vector<uint32_t> rest = ReadLocalFiles(st, list);
    if (!rest.empty()) ReadOverNetwork(st, node, rest);
    return;
  }
  ReadOverNetwork(st, node, list);
}

void SampleFetcher::Impl::ReadOverNetwork(FetchState& st, uint32_t node,
                                          const std::vector<uint32_t>& list) {
  const NodeRecord& record = st.view->nodes[node];
  const SampleSource from = node == st.view->local ? SampleSource::kLocalNode : SampleSource::kPeer;
  // Every piece of `list` has this node as its last attempt.
  auto fail_from = [&](size_t first, const Status& why, bool retry) {
    for (size_t i = first; i < list.size(); ++i) st.pieces[list[i]].attempts.back().status = why;
    if (retry) item_retries_.fetch_add(list.size() - first, std::memory_order_relaxed);
  };

  Result<PeerClient> connected = TakeClient(record);
  if (!connected.ok()) {
    NodeFailed(record, connected.status());
    fail_from(0, connected.status(), false);
    return;
  }
  PeerClient client = std::move(*connected);
  const ProtocolLimits& limits = client.limits();
  const uint64_t max_items = std::min<uint64_t>(options_.max_items_per_read, limits.max_items);
  const uint64_t max_bytes = std::min(options_.max_bytes_per_read, limits.max_read_bytes);
  const auto fits = [&](uint64_t items, uint64_t bytes) {
    return items <= max_items && bytes <= max_bytes &&
           pf::kFrameHeaderSize + pf::MaxReadReplyBodySize(items) + bytes <=
               limits.max_message_bytes;
  };

  ReadRequest request;
  request.dataset = st.dataset->name;
  request.manifest_id = st.dataset->manifest->id();
  std::vector<uint32_t> batch;
  size_t i = 0;
  while (i < list.size()) {
    request.items.clear();
    batch.clear();
    uint64_t bytes = 0;
    const size_t batch_start = i;
    for (; i < list.size(); ++i) {
      Piece& piece = st.pieces[list[i]];
      if (!fits(1, piece.length)) {
        // Only a node advertising limits below max_bytes_per_read gets here.
        piece.attempts.back().status = Status::OutOfRange(
            "a piece of " + std::to_string(piece.length) + " bytes is more than cache node " +
            Quoted(record.id) + " accepts in one READ");
        item_retries_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (!fits(batch.size() + 1, bytes + piece.length)) break;
      request.items.push_back(
          ReadItem{ReadKind::kSample, st.targets[piece.target].id, piece.offset, piece.length});
      batch.push_back(list[i]);
      bytes += piece.length;
    }
    if (batch.empty()) continue;
    reads_sent_.fetch_add(1, std::memory_order_relaxed);
    Result<PeerReadResult> reply = client.Read(request);
    if (!reply.ok()) {
      if (!client.connected()) {
        // Connection-level: the node is down (or broken) for everyone.
        NodeFailed(record, reply.status());
        fail_from(batch_start, reply.status(), false);
        return;
      }
      // The node refused the whole request (e.g. it does not serve this
      // dataset): the rest would get the same answer.
      fail_from(batch_start, reply.status(), true);
      PutClient(record.address, std::move(client));
      return;
    }
    for (size_t k = 0; k < batch.size(); ++k) {
      Piece& piece = st.pieces[batch[k]];
      const Status& item = reply->status(k);
      if (item.ok()) {
        const FetchTarget& target = st.targets[piece.target];
        const std::string_view got = reply->bytes(k);
        std::memcpy(target.out.data() + piece.offset, got.data(), got.size());
        piece.state = Piece::State::kDone;
        piece.from = from;
        piece.checksum = reply->reply().items[k].checksum;
      } else if (IsFinal(item.code())) {
        piece.state = Piece::State::kFailed;
        piece.status = item;
      } else {
        piece.attempts.back().status = item;
        item_retries_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  PutClient(record.address, std::move(client));
}

std::string SampleFetcher::Impl::NoNodeMessage(const FetchState& st, const Piece& piece) {
  const FetchTarget& target = st.targets[piece.target];
  const FetchDataset& ds = *st.dataset;
  return "fetching sample " + std::to_string(target.id) + " (" +
         Quoted(ds.manifest->PathOf(target.id)) + ") of dataset " + Quoted(ds.name) +
         ": no cache node delivered it and source fall-through is off; " + AttemptsText(st, piece) +
         ". Check that the pool's cache nodes are running, or enable source fall-through";
}

std::string SampleFetcher::Impl::AttemptsText(const FetchState& st, const Piece& piece) {
  if (piece.attempts.empty()) return "no live cache node was listed";
  std::string m = "tried";
  std::lock_guard<std::mutex> lock(down_mu_);
  for (size_t i = 0; i < piece.attempts.size(); ++i) {
    const Attempt& a = piece.attempts[i];
    const NodeRecord& n = st.view->nodes[a.node];
    m += (i == 0 ? " " : "; ") + Quoted(n.id) + " at " + n.address + ": ";
    if (a.skipped) {
      auto it = down_.find(n.id);
      m += "skipped, marked down after " +
           (it != down_.end() ? it->second.why.ToString() : std::string("a failure"));
    } else {
      m += a.status.ToString();
    }
  }
  return m;
}

// ---- Fetch ------------------------------------------------------------------------

void SampleFetcher::Impl::Fetch(const FetchDataset& dataset, std::span<const FetchTarget> targets,
                                std::span<FetchOutcome> outcomes) {
  const auto fail_all = [&](const Status& s) {
    for (FetchOutcome& o : outcomes) o = FetchOutcome{s, SampleSource::kPeer, 0};
    failed_samples_.fetch_add(outcomes.size(), std::memory_order_relaxed);
  };
  if (outcomes.size() != targets.size()) {
    return fail_all(Status::InvalidArgument("fetching samples of dataset " + Quoted(dataset.name) +
                                            ": " + std::to_string(targets.size()) +
                                            " targets but " + std::to_string(outcomes.size()) +
                                            " outcomes; pass one outcome per target"));
  }
  if (targets.empty()) return;
  if (dataset.manifest == nullptr) {
    return fail_all(Status::InvalidArgument("fetching samples of dataset " + Quoted(dataset.name) +
                                            ": no manifest given; pass the decoded manifest"));
  }
  if (Status s = ValidateDatasetName(dataset.name); !s.ok()) {
    return fail_all(s.WithContext("fetching samples"));
  }

  FetchState st;
  st.dataset = &dataset;
  st.targets = targets;
  st.view = ViewFor(dataset);
  st.replication = std::max<uint32_t>(1, dataset.replication);
  std::vector<char> settled(targets.size(), 0);  // outcome final before any read
  Plan(st, outcomes, &settled);

  // Rounds over the nodes. Each round asks every pending piece's next
  // candidate, so there are at most 2 × replication of them.
  std::vector<uint32_t> pending(st.pieces.size());
  for (uint32_t p = 0; p < pending.size(); ++p) pending[p] = p;
  std::vector<uint32_t> to_source;
  std::vector<std::vector<uint32_t>> by_node(st.view->nodes.size());
  std::vector<uint32_t> busy;
  while (!pending.empty()) {
    const std::vector<char> down_now = DownSnapshot(*st.view);
    busy.clear();
    for (uint32_t p : pending) {
      Piece& piece = st.pieces[p];
      const uint32_t node = NextCandidate(st, piece, down_now);
      if (node == kNone) {
        to_source.push_back(p);
        continue;
      }
      piece.attempts.push_back(Attempt{node, false, Status()});
      if (by_node[node].empty()) busy.push_back(node);
      by_node[node].push_back(p);
    }
    RunConcurrently(busy.size(), [&](size_t k) { ReadFromNode(st, busy[k], by_node[busy[k]]); });
    pending.clear();
    for (uint32_t node : busy) {
      for (uint32_t p : by_node[node]) {
        if (st.pieces[p].state == Piece::State::kPending) pending.push_back(p);
      }
      by_node[node].clear();
    }
  }

  if (!to_source.empty()) {
    if (options_.source_fallthrough) {
      ReadFromSource(st, to_source);
    } else {
      for (uint32_t p : to_source) {
        st.pieces[p].state = Piece::State::kFailed;
        st.pieces[p].status = Status::Unavailable(NoNodeMessage(st, st.pieces[p]));
      }
    }
  }

  for (size_t t = 0; t < targets.size(); ++t) {
    FetchOutcome& outcome = outcomes[t];
    if (settled[t]) {
      if (!outcome.status.ok()) failed_samples_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const uint32_t first = st.first_piece[t];
    const uint32_t end = st.first_piece[t + 1];
    SampleSource from = SampleSource::kLocalNode;
    for (uint32_t p = first; p < end; ++p) {
      const Piece& piece = st.pieces[p];
      if (piece.state != Piece::State::kDone) {
        outcome.status = piece.status;
        break;
      }
      from = std::max(from, piece.from);  // a sample is as far as its farthest piece
    }
    if (!outcome.status.ok()) {
      failed_samples_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const std::span<char> out = targets[t].out;
    const bool whole = end - first == 1 && st.pieces[first].checksum.has_value();
    outcome.checksum = whole ? *st.pieces[first].checksum : Checksum64(out.data(), out.size());
    outcome.from = from;
    samples_[static_cast<size_t>(from)].fetch_add(1, std::memory_order_relaxed);
    bytes_[static_cast<size_t>(from)].fetch_add(out.size(), std::memory_order_relaxed);
  }
}

SampleFetcherCounters SampleFetcher::Impl::Counters() const {
  SampleFetcherCounters c;
  for (size_t i = 0; i < kSampleSources; ++i) {
    c.samples[i] = samples_[i].load(std::memory_order_relaxed);
    c.bytes[i] = bytes_[i].load(std::memory_order_relaxed);
  }
  c.reads_sent = reads_sent_.load(std::memory_order_relaxed);
  c.node_failures = node_failures_.load(std::memory_order_relaxed);
  c.item_retries = item_retries_.load(std::memory_order_relaxed);
  c.failed_samples = failed_samples_.load(std::memory_order_relaxed);
  if (local_chunks_ != nullptr) {
    const LocalChunksCounters local = local_chunks_->counters();
    c.local_file_pieces = local.pieces;
    c.local_file_opens = local.opens;
    c.local_file_declined = local.declined;
  }
  return c;
}

// ---- SampleFetcher ----------------------------------------------------------------

Result<std::unique_ptr<SampleFetcher>> SampleFetcher::Create(SampleFetcherOptions options,
                                                             IdentityExecutor* executor) {
  GRANARY_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<SampleFetcher>(
      new SampleFetcher(std::make_unique<Impl>(std::move(options), executor)));
}

SampleFetcher::SampleFetcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SampleFetcher::~SampleFetcher() = default;

void SampleFetcher::SetNodes(std::vector<NodeRecord> nodes) { impl_->SetNodes(std::move(nodes)); }

void SampleFetcher::Fetch(const FetchDataset& dataset, std::span<const FetchTarget> targets,
                          std::span<FetchOutcome> outcomes) {
  impl_->Fetch(dataset, targets, outcomes);
}

SampleFetcherCounters SampleFetcher::counters() const { return impl_->Counters(); }

}  // namespace granary::sidecar
