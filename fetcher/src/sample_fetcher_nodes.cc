// SampleFetcher (sample_fetcher_impl.h): the live cache nodes (placement
// view, down marks, pooled connections) and reading a Fetch's pieces from one
// of them.

#include <algorithm>
#include <cstring>

#include "granary/core/names.h"
#include "granary/protocol/protocol_format.h"
#include "sample_fetcher_impl.h"

namespace granary::sidecar {

namespace pf = protocol_format;
using fetch_internal::IsFinal;
using fetch_internal::kMaxFilteredViews;
using fetch_internal::kMaxIdleClientsPerNode;

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
    const SteadyClock::time_point now = SteadyClock::now();
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
  std::vector<std::unique_ptr<PeerConnection>> stale;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    for (auto it = pool_.begin(); it != pool_.end();) {
      const bool live = std::any_of(next->nodes.begin(), next->nodes.end(),
                                    [&](const NodeRecord& n) { return n.address == it->first; });
      if (live) {
        ++it;
        continue;
      }
      for (std::unique_ptr<PeerConnection>& c : it->second) stale.push_back(std::move(c));
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
  const SteadyClock::time_point now = SteadyClock::now();
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
  const SteadyClock::time_point now = SteadyClock::now();
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
  std::vector<std::unique_ptr<PeerConnection>> dropped;
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

Result<std::unique_ptr<PeerConnection>> SampleFetcher::Impl::TakeClient(const NodeRecord& node) {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    auto it = pool_.find(node.address);
    if (it != pool_.end() && !it->second.empty()) {
      std::unique_ptr<PeerConnection> client = std::move(it->second.back());
      it->second.pop_back();
      return client;
    }
  }
  auto tls = node.labels.find(std::string(kNodeLabelTls));
  const bool node_tls = tls != node.labels.end() && tls->second == "true";
  if (options_.fabric != nullptr) {
    auto fabric = node.labels.find(std::string(kNodeLabelFabric));
    if (fabric != node.labels.end() && !fabric->second.empty() && !node_tls) {
      Result<std::unique_ptr<PeerConnection>> connection =
          options_.fabric->Connect(fabric->second, peer_options_);
      if (connection.ok()) fabric_connects_.fetch_add(1, std::memory_order_relaxed);
      return connection;
    }
    fabric_fallbacks_.fetch_add(1, std::memory_order_relaxed);
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(fallback_warned_mu_);
      first = fallback_warned_.insert(node.id).second;
    }
    if (first) {
      log_->warn("cache node {} at {} {}: reaching it over {} instead of {}", Quoted(node.id),
                 Quoted(node.address),
                 node_tls ? "serves TLS, which the fabric does not carry"
                          : "offers no fabric address (its fabric_listen is off, or its "
                            "provider is not available there)",
                 transport_->name(), options_.fabric->name());
    }
  }
  if (node_tls) {
    if (tls_options_.tls == nullptr) {
      return Status::FailedPrecondition(
          "cache node " + Quoted(node.id) +
          " serves TLS and this reader has no TLS context; give it one (tls_ca_file)");
    }
    return transport_->Connect(node.address, tls_options_);
  }
  return transport_->Connect(node.address, peer_options_);
}

void SampleFetcher::Impl::PutClient(const std::string& address,
                                    std::unique_ptr<PeerConnection> client) {
  if (client == nullptr || !client->connected()) return;
  std::lock_guard<std::mutex> lock(pool_mu_);
  std::vector<std::unique_ptr<PeerConnection>>& idle = pool_[address];
  if (idle.size() < kMaxIdleClientsPerNode) idle.push_back(std::move(client));
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

  Result<std::unique_ptr<PeerConnection>> connected = TakeClient(record);
  if (!connected.ok()) {
    NodeFailed(record, connected.status());
    fail_from(0, connected.status(), false);
    return;
  }
  std::unique_ptr<PeerConnection> client = std::move(*connected);
  const ProtocolLimits& limits = client->limits();
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
    Result<PeerReadResult> reply = client->Read(request);
    if (!reply.ok()) {
      if (!client->connected()) {
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
  // Every node that answered refused this reader: running nodes or the
  // source would not change that, its rights would.
  bool refused = !piece.attempts.empty();
  for (const Attempt& a : piece.attempts) {
    refused = refused && a.status.code() == StatusCode::kPermissionDenied;
  }
  return "fetching sample " + std::to_string(target.id) + " (" +
         Quoted(ds.manifest->PathOf(target.id)) + ") of dataset " + Quoted(ds.name) +
         ": no cache node delivered it and source fall-through is off; " + AttemptsText(st, piece) +
         (refused ? ". The cache nodes refused this reader (why is said above): read the dataset "
                    "as an identity it is granted to"
                  : ". Check that the pool's cache nodes are running, or enable source "
                    "fall-through");
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

}  // namespace granary::sidecar
