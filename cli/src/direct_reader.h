#pragma once

// DirectReader: a dataset's samples read straight from its cache nodes, with
// the source as fall-through, in this process and without a sidecar. Used by
// `granary cat --direct` (or when no sidecar runs) and by `granary mount`
// when its sidecar is gone (FallbackContentReader, mount_fallback.h).
//
// Who may read what: the cache nodes' protocol carries no user, so MayRead
// applies the rule the source applies (DESIGN.md: a user only reads datasets
// they could read at the source): root and the dataset's owner read it;
// anyone else must be able to read the file at the source themselves
// (faccessat with the effective ids: one metadata call on the source per
// file). When no cache node can serve a sample, the fetcher reads the source
// as the invoking user, never with more rights: root reads as the dataset's
// owner (the identity the cache nodes stage with), anyone else as themselves.
//
// A user without the cluster key (not root) is refused by cache nodes that
// require it; with `local_node_sockets` the reader takes staged chunks of the
// cache node on this host through that node's chunk handoff socket instead,
// where the node itself checks the user's uid (SO_PEERCRED) and hands over
// only chunks whose every file the user may read at the source
// (docs/security.md).
//
// Thread safety: MayRead, Read, RefreshNodes and counters() from any number
// of threads at once.

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "granary/core/manifest.h"
#include "granary/core/metadata_store.h"
#include "granary/core/status.h"
#include "granary/peer/peer_auth.h"
#include "granary/peer/peer_transport.h"
#include "granary/peer/tls.h"

namespace granary::sidecar {
class SampleFetcher;
struct SampleFetcherCounters;
}  // namespace granary::sidecar

namespace granary::cli {

// Where cache nodes keep their chunk handoff socket (`local_socket`): the
// example configuration's, then the Kubernetes chart's. Readers without the
// cluster key try them in this order (`cat --direct`, `mount`).
inline const std::vector<std::string>& DefaultLocalNodeSockets() {
  static const std::vector<std::string> sockets = {"/run/granary/cachenode.sock",
                                                   "/run/granary-node/cachenode.sock"};
  return sockets;
}

struct DirectReaderOptions;
// For a reader without the cluster key (nodes that require it refuse it):
// read through the handoff socket of this host's cache node, which checks the
// caller's rights; `socket` (empty: DefaultLocalNodeSockets()) and `node`
// (empty: the host name) as the command line gave them.
void ReadThroughLocalHandoff(DirectReaderOptions* options, const std::string& socket,
                             const std::string& node);

struct DirectReaderOptions {
  std::string client_name = "granary-cli";
  // Read the source when no cache node can serve a sample.
  bool source_fallthrough = true;
  // Per cache-node call (connects take at most 2 s of it).
  std::chrono::milliseconds timeout{120'000};
  // Proved to cache nodes that require authentication (CliContext::PeerCredentials).
  ClientCredentials credentials;
  // The chunk handoff sockets (a cache node's `local_socket`) to try, in
  // order: the first that exists and is a socket is used, for the live node
  // `local_node_id` of the pool. Empty: none.
  std::vector<std::string> local_node_sockets;
  // The cache node on this host (its NodeRecord id); empty: the host name.
  std::string local_node_id;
  // For nodes that serve TLS (CliContext::Tls); null: made unverified.
  std::shared_ptr<const TlsContext> tls;
  // --transport libfabric (CliContext::Fabric): nodes offering a fabric
  // address are read over it. Null: TCP.
  std::shared_ptr<PeerTransport> fabric;
};

class DirectReader {
 public:
  // Reads the pool's live nodes from `store`. kFailedPrecondition when the
  // pool has no live node and source_fallthrough is off; kInvalidArgument for
  // a source URI that is not file://.
  static Result<std::unique_ptr<DirectReader>> Create(MetadataStore& store,
                                                      const DatasetRecord& record,
                                                      std::shared_ptr<const Manifest> manifest,
                                                      DirectReaderOptions options);
  ~DirectReader();
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;

  // Ok if the calling user may read sample `id` (the rule above), else
  // kPermissionDenied naming the owner, the caller, the file and the fix.
  Status MayRead(SampleId id) const;

  // The whole of sample `id` into `out` (exactly its size; checksums checked
  // on the way). The sample's own error otherwise (no node and no source:
  // kUnavailable; changed at the source: kFailedPrecondition; ...).
  Status Read(SampleId id, std::span<char> out);

  // Takes the pool's live nodes from `store` again (nodes come and go).
  Status RefreshNodes(MetadataStore& store);

  const Manifest& manifest() const { return *manifest_; }
  size_t node_count() const;
  // What became of local_node_sockets, for messages: "node 'n' through its
  // handoff socket '/run/...'", or why none is used.
  const std::string& local_node_note() const;
  // Samples by where they came from, node failures.
  sidecar::SampleFetcherCounters counters() const;

 private:
  struct State;
  DirectReader(std::shared_ptr<const Manifest> manifest, std::unique_ptr<State> state);

  std::shared_ptr<const Manifest> manifest_;
  std::unique_ptr<State> state_;
};

}  // namespace granary::cli
