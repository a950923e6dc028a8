#pragma once

// SampleFetcher: gets a dataset's samples into caller-provided memory from
// wherever they are, in this order of preference (DESIGN.md, "Data path";
// docs/sidecar.md, "Where samples come from"):
//   1. the chunk's owner(s) by placement over the live cache nodes of the
//      pool (rendezvous hashing weighted by capacity, exactly as the cache
//      nodes compute it), the local node first when it is one of them;
//      requests are batched per node (one READ of many items);
//   2. if an owner is down (cannot connect, connection breaks, times out) or
//      answers kNotFound / kUnavailable / kCorruption for an item: the next
//      owner (replication > 1), then the node that placement picks once the
//      failed ones are excluded;
//   3. if no node has it: the source itself, read with the dataset owner's
//      rights (OpenSource through an IdentityExecutor), when enabled.
// A per-item kFailedPrecondition (the source file changed since the snapshot)
// or kPermissionDenied is final: the source would say the same.
//
// A node that failed at the connection level is skipped for `node_down_for`
// (then tried again), so a dead node costs one connect timeout, not one per
// request.
//
// Callers: the sidecar's prefetch workers and its on-demand path; many threads
// at once.
//
// Thread safety: every method may be called from any number of threads. Fetch
// blocks (network, source). PeerClients are pooled per node; a thread takes
// one for the duration of one READ.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "granary/core/file.h"
#include "granary/core/manifest.h"
#include "granary/core/metadata_store.h"
#include "granary/core/status.h"
#include "granary/peer/peer_client.h"
#include "granary/peer/peer_transport.h"
#include "granary/source/identity.h"

namespace granary::sidecar {

// Where a sample's bytes came from (metrics label values: SampleSourceName).
enum class SampleSource : uint8_t {
  kLocalNode,  // the cache node on this host (SampleFetcherOptions::local_node_id)
  kPeer,       // another cache node
  kSource,     // the dataset's source, read by the sidecar itself
};
inline constexpr size_t kSampleSources = 3;
std::string_view SampleSourceName(SampleSource source);  // "local_node", "peer", "source"

// What the fetcher needs to know of one dataset. Built by the sidecar from the
// DatasetRecord and its decoded manifest.
struct FetchDataset {
  std::string name;
  std::shared_ptr<const Manifest> manifest;
  std::string source_uri;  // file:///...
  DatasetOwner owner;
  uint32_t replication = 1;
  // The cache nodes it is placed on (DatasetSpec::nodes): unset, every node
  // SetNodes gave; else only those ids, the others never asked.
  std::optional<std::vector<std::string>> nodes;
};

// One sample to fetch: all of its bytes (manifest size) into `out`.
struct FetchTarget {
  SampleId id = 0;
  std::span<char> out;  // exactly manifest.SizeOf(id) bytes
};

struct FetchOutcome {
  Status status;
  SampleSource from = SampleSource::kPeer;
  uint64_t checksum = 0;  // XXH3-64 of the bytes (OK only)
};

struct SampleFetcherOptions {
  std::string client_name = "granary-sidecar";  // HELLO peer name
  // The cache node on this host (its NodeRecord id); empty: none.
  std::string local_node_id;
  // That node's chunk handoff socket (its `local_socket`): staged samples it
  // owns are then read straight from its chunk files (LocalChunks). Empty: off.
  std::string local_node_socket;
  // Chunk files kept open through it at most.
  uint32_t local_open_chunks = 256;
  // Per READ sent to one node; also capped by the node's advertised limits.
  uint32_t max_items_per_read = 256;
  uint64_t max_bytes_per_read = 16u << 20;
  std::chrono::milliseconds node_down_for{3000};
  // Connect and call timeouts, credentials; `peer.tls` is used for nodes
  // whose record says they serve TLS (and must then be set).
  PeerClientOptions peer;
  // How nodes are reached (peer_transport.h). Null: TCP (TcpPeerTransport).
  std::shared_ptr<PeerTransport> transport;
  // How nodes that serve the libfabric transport (their record's
  // kNodeLabelFabric address) are reached: the fabric transport
  // (granary/fabric/fabric_transport.h). Null: every node over `transport`.
  // With it set, a node without the label is reached over `transport` (its
  // first connection warns; counted in fabric_fallbacks), and so is a node
  // that serves TLS (the fabric carries none).
  std::shared_ptr<PeerTransport> fabric;
  // Read from the source when no cache node can serve a sample.
  bool source_fallthrough = true;
  unsigned source_concurrency = 8;  // source reads in flight per dataset

  Status Validate() const;
};

// Monotonic counts (a snapshot).
struct SampleFetcherCounters {
  uint64_t samples[kSampleSources] = {};  // delivered, by where from
  uint64_t bytes[kSampleSources] = {};
  uint64_t reads_sent = 0;      // READ requests to cache nodes
  uint64_t node_failures = 0;   // connection-level failures (a node marked down)
  uint64_t item_retries = 0;    // pieces passed on after a node's per-item or whole-READ error
  uint64_t failed_samples = 0;  // outcomes not OK (no path could deliver, or bad input)
  // Chunk handoff (local_node_socket): pieces read from the local node's chunk
  // files, chunk files opened, and pieces passed on to the network path.
  uint64_t local_file_pieces = 0;
  uint64_t local_file_opens = 0;
  uint64_t local_file_declined = 0;
  // With a fabric transport: connections opened over it, and connections to
  // nodes that offer no fabric, opened over `transport` instead.
  uint64_t fabric_connects = 0;
  uint64_t fabric_fallbacks = 0;
};

// One whole staged sample in a chunk file of the local node: bytes [offset,
// offset + length) of the file, XXH3-64 `checksum` (from the file's verified
// header).
struct LocalSampleExtent {
  SampleId id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;
};

// A chunk file of the local cache node, shared with a reader on this host
// (the sidecar passes it to a client session: docs/client.md, "Direct
// reads"). The descriptor is a duplicate of the one LocalChunks keeps
// (read-only, checked against the manifest's key and segments).
struct LocalChunkFile {
  ScopedFd fd;
  std::vector<LocalSampleExtent> samples;  // staged now, whole samples only
  std::vector<SampleId> elsewhere;         // the chunk's other samples (not staged, or pieces)
};

class SampleFetcher {
 public:
  // `executor`: for source reads as the dataset owner; must outlive the
  // fetcher. May be null: the fetcher then starts its own (source_concurrency
  // threads) at its first source read, which reads as the owner when the
  // process may switch identities, else only datasets the process's own
  // identity owns.
  static Result<std::unique_ptr<SampleFetcher>> Create(SampleFetcherOptions options,
                                                       IdentityExecutor* executor);
  ~SampleFetcher();

  // The live cache nodes of the pool (MetadataStore::ListNodes); replaces the
  // previous list. Nodes marked down stay marked.
  void SetNodes(std::vector<NodeRecord> nodes);

  // Fetches every target (any order inside; outcomes[i] is targets[i]'s).
  // Blocks until each has its bytes or a final error. Never returns bytes that
  // failed a checksum.
  void Fetch(const FetchDataset& dataset, std::span<const FetchTarget> targets,
             std::span<FetchOutcome> outcomes);

  // The local node's file of `chunk`, when the chunk handoff is on and the
  // node hands it over (local_node_socket). kNotFound with the reason
  // otherwise (off, the node does not have it or refuses, the file does not
  // check); never blocks longer than one handoff request.
  Result<LocalChunkFile> ShareLocalChunk(const FetchDataset& dataset, ChunkId chunk);
  // Whether the chunk handoff is configured (local_node_socket).
  bool SharesLocalChunks() const;

  SampleFetcherCounters counters() const;

 private:
  struct Impl;
  explicit SampleFetcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace granary::sidecar
