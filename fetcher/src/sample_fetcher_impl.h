#pragma once

// The insides of SampleFetcher (sample_fetcher.h), shared by the files that
// implement it, each one job of a Fetch:
//  - sample_fetcher.cc: the options, planning a Fetch into pieces and their
//    candidate nodes, the rounds over the nodes, the outcomes;
//  - sample_fetcher_nodes.cc: the live nodes (placement view, down marks,
//    pooled connections) and reading pieces from one node (its chunk files
//    through the handoff when it is the local node, else READs);
//  - sample_fetcher_source.cc: the datasets' sources (OpenSource) and
//    reading pieces from them.
//
// Thread safety: as SampleFetcher. A FetchState belongs to one Fetch call
// (the threads RunConcurrently starts for it touch disjoint pieces); the
// Impl's shared state is guarded by the mutexes its declaration names.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "granary/core/log.h"
#include "granary/core/placement.h"
#include "granary/core/thread_name.h"
#include "granary/fetcher/sample_fetcher.h"
#include "granary/source/source.h"
#include "local_chunks.h"

namespace granary::sidecar {
namespace fetch_internal {

using SteadyClock = std::chrono::steady_clock;

// Idle connections kept per node: enough for the sidecar's fetch threads.
inline constexpr size_t kMaxIdleClientsPerNode = 32;
inline constexpr uint32_t kNone = Placement::kNoOwner;
// Node lists whose views ViewFor keeps (then it starts over).
inline constexpr size_t kMaxFilteredViews = 64;

// Per-item codes that every node, and the source, would answer the same way.
inline bool IsFinal(StatusCode code) {
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
  SteadyClock::time_point until;
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
  std::unique_ptr<Source> source;       // set once under mu, then never changed
  Status error;                         // guarded by mu: the last failed open
  SteadyClock::time_point retry_after;  // guarded by mu
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

inline bool Tried(const Piece& p, uint32_t node) {
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
      threads.emplace_back([&fn, i] {
        NameThisThread("fetch-batch");
        fn(i);
      });
    } catch (const std::system_error&) {
      fn(i);
    }
  }
  if (n > 0) fn(0);
  for (std::thread& t : threads) t.join();
}

}  // namespace fetch_internal

using fetch_internal::Attempt;
using fetch_internal::ChunkCandidates;
using fetch_internal::DownMark;
using fetch_internal::FetchState;
using fetch_internal::kNone;
using fetch_internal::NodeView;
using fetch_internal::Piece;
using fetch_internal::SourceSlot;
using fetch_internal::SteadyClock;

struct SampleFetcher::Impl {
  Impl(SampleFetcherOptions o, IdentityExecutor* e)
      : options_(std::move(o)),
        transport_(options_.transport != nullptr ? options_.transport : TcpPeerTransport()),
        executor_(e) {
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
  Result<std::unique_ptr<PeerConnection>> TakeClient(const NodeRecord& node);
  void PutClient(const std::string& address, std::unique_ptr<PeerConnection> client);
  Result<std::shared_ptr<SourceSlot>> SourceFor(const FetchDataset& dataset);
  Result<IdentityExecutor*> Executor();

  const SampleFetcherOptions options_;
  PeerClientOptions peer_options_;  // options_.peer named options_.client_name, plain TCP
  PeerClientOptions tls_options_;   // the same over TLS (options_.peer.tls)
  const std::shared_ptr<PeerTransport> transport_;  // options_.transport, or TCP
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
  // Idle connections, guarded by pool_mu_; by address.
  std::map<std::string, std::vector<std::unique_ptr<PeerConnection>>> pool_;

  std::mutex sources_mu_;
  std::map<std::string, std::shared_ptr<SourceSlot>> sources_;  // guarded by sources_mu_; by name

  std::atomic<uint64_t> samples_[kSampleSources] = {};
  std::atomic<uint64_t> bytes_[kSampleSources] = {};
  std::atomic<uint64_t> reads_sent_{0};
  std::atomic<uint64_t> node_failures_{0};
  std::atomic<uint64_t> fabric_connects_{0};
  std::atomic<uint64_t> fabric_fallbacks_{0};
  std::mutex fallback_warned_mu_;
  std::set<std::string> fallback_warned_;  // node ids warned about (once each)
  std::atomic<uint64_t> item_retries_{0};
  std::atomic<uint64_t> failed_samples_{0};
};

}  // namespace granary::sidecar
