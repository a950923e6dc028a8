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
//  3. source: what no node delivered is read from the dataset's source
//     (OpenSource, once per dataset and manifest), up to source_concurrency reads
//     at once;
//  4. outcomes: a target is OK when each of its pieces is; its checksum is the
//     node's (verified by the PeerClient) for a sample read whole from a node,
//     else computed here.
//
// This file: the options, steps 1, 2 and 4. The nodes and reading from them
// are in sample_fetcher_nodes.cc, the source in sample_fetcher_source.cc
// (sample_fetcher_impl.h says who does what).

#include "granary/fetcher/sample_fetcher.h"

#include <algorithm>

#include "granary/config/config_keys.h"
#include "granary/core/hash.h"
#include "granary/core/names.h"
#include "granary/protocol/protocol_format.h"
#include "sample_fetcher_impl.h"

namespace granary::sidecar {

namespace pf = protocol_format;
using fetch_internal::RunConcurrently;
using fetch_internal::Tried;

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
  c.fabric_connects = fabric_connects_.load(std::memory_order_relaxed);
  c.fabric_fallbacks = fabric_fallbacks_.load(std::memory_order_relaxed);
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

Result<LocalChunkFile> SampleFetcher::ShareLocalChunk(const FetchDataset& dataset, ChunkId chunk) {
  if (impl_->local_chunks_ == nullptr) {
    return Status::NotFound(
        "this sidecar reads no chunk files of a local cache node (local_node_socket is not set)");
  }
  if (dataset.manifest == nullptr || chunk >= dataset.manifest->chunk_count()) {
    return Status::NotFound("chunk " + std::to_string(chunk) + " is not a chunk of dataset " +
                            Quoted(dataset.name));
  }
  return impl_->local_chunks_->Share(dataset, chunk);
}

bool SampleFetcher::SharesLocalChunks() const { return impl_->local_chunks_ != nullptr; }

SampleFetcherCounters SampleFetcher::counters() const { return impl_->Counters(); }

}  // namespace granary::sidecar
