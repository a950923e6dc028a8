#pragma once

// Placement: which cache node(s) own each chunk of a manifest.
//
// Weighted rendezvous (highest-random-weight) hashing of (manifest id, chunk id)
// over the live nodes of a pool. Every (chunk, node) pair gets a score that
// depends on nothing but the chunk, the node's id and the node's weight, and a
// chunk's owners are the `replication` nodes with the highest scores. So a node
// that joins takes over only the chunks it now scores highest on, and a node that
// leaves hands over only its own chunks; every other chunk keeps its owners.
//
// The score is part of Granary's formats: every cache node, sidecar and CLI in a
// cluster must compute the same owners, whatever the platform and compiler. It is
// therefore integer arithmetic plus one IEEE-754 division, never libm
// (docs/placement-and-plans.md has the exact definition):
//   chunk_key = Hash64(manifest.ToBytes() ‖ LE32(chunk), seed 0)       (20 bytes)
//   node_key  = Hash64(node id bytes, seed 0)
//   h         = Hash64(LE64(chunk_key) ‖ LE64(node_key), seed 0)      (16 bytes)
//   u         = ((h >> 11) + 1/2) / 2^53                                in (0, 1)
//   e         = NegLogQ56(h >> 11) ≈ −ln(u) · 2^56, a fixed-point Exp(1) draw
//   score     = weight / double(e)                                      (higher wins)
// Equal scores are broken by node id, byte-wise smaller first. Because −ln(u) is
// Exp(1)-distributed, a node's share of chunks is its weight over the total
// weight (the same construction as Ceph's straw2 buckets).
//
// Callers: cache nodes (which chunks to stage and serve), sidecars (whom to ask
// for a sample), the CLI and operator (expected distribution, rebalancing).
//
// Thread safety: a Placement is immutable after Create(); any number of threads
// may call its const methods concurrently.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/hash.h"
#include "granary/core/manifest.h"
#include "granary/core/status.h"

namespace granary {

// One cache node as placement sees it.
struct PlacementNode {
  std::string id;  // unique within the pool, non-empty (e.g. the Kubernetes node name)
  // Relative share of chunks, e.g. the node's chunk store capacity in bytes.
  // Must be finite and > 0; only ratios between nodes matter.
  double weight = 1.0;

  friend bool operator==(const PlacementNode&, const PlacementNode&) = default;
};

class Placement {
 public:
  // Validates the nodes and sorts them by id (nodes() is in that order; owner
  // indexes refer to it). An empty list is allowed: every chunk then has no owner.
  static Result<Placement> Create(std::vector<PlacementNode> nodes);

  Placement() = default;  // no nodes

  const std::vector<PlacementNode>& nodes() const { return nodes_; }
  size_t node_count() const { return nodes_.size(); }

  // Index in nodes() of the node with this id, or kNotFound.
  Result<uint32_t> IndexOf(std::string_view node_id) const;

  // The min(replication, node_count()) distinct owners of a chunk as indexes into
  // nodes(), best first: [0] is the primary, the rest are replicas in the order a
  // reader should fall back to them. replication 0 gives no owners. The first k
  // owners for replication r are the owners for replication k (k <= r).
  //
  // OwnersInto writes into *owners and reuses its capacity, so a caller that keeps
  // the vector across calls allocates nothing (for replication <= 16).
  void OwnersInto(const ContentId& manifest, ChunkId chunk, uint32_t replication,
                  std::vector<uint32_t>* owners) const;
  std::vector<uint32_t> Owners(const ContentId& manifest, ChunkId chunk,
                               uint32_t replication) const;
  std::vector<std::string> OwnerIds(const ContentId& manifest, ChunkId chunk,
                                    uint32_t replication) const;

  // The primary owner (replication 1), or kNoOwner when there are no nodes.
  static constexpr uint32_t kNoOwner = 0xFFFFFFFFu;
  uint32_t Primary(const ContentId& manifest, ChunkId chunk) const;

  // The chunks of [0, chunk_count) of which `node_id` is one of the `replication`
  // owners, ascending: what a cache node stages. kNotFound for an unknown node,
  // kInvalidArgument for replication 0.
  Result<std::vector<ChunkId>> ChunksOwnedBy(const ContentId& manifest, uint64_t chunk_count,
                                             std::string_view node_id, uint32_t replication) const;

 private:
  explicit Placement(std::vector<PlacementNode> nodes);

  std::vector<PlacementNode> nodes_;  // sorted by id
  std::vector<uint64_t> node_keys_;   // Hash64(id), parallel to nodes_
};

// The pieces of the score, exposed so that tests and the design note can pin
// them. Not for other callers: use Placement.
namespace placement_internal {

uint64_t ChunkKey(const ContentId& manifest, ChunkId chunk);
uint64_t NodeKey(std::string_view node_id);
uint64_t PairHash(uint64_t chunk_key, uint64_t node_key);

// round(−ln((t + 1/2) / 2^53) · 2^56) for t < 2^53, to within one unit, and at
// least 1; computed with integers only so that it is identical everywhere.
uint64_t NegLogQ56(uint64_t t);

}  // namespace placement_internal

struct NodeRecord;  // metadata_store.h

// Placement over cache nodes as the store lists them, each weighted by its
// capacity in bytes (1 for a node that advertises none): the one computation
// cache nodes and sidecars must share to agree on owners.
Result<Placement> PlacementOverNodes(const std::vector<NodeRecord>& nodes);

}  // namespace granary
