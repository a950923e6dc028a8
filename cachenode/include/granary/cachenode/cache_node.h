#pragma once

// CacheNode: the granary-cachenode daemon as a library object. main.cc parses
// the command line, loads the CacheNodeConfig, starts one CacheNode and stops
// it on SIGTERM; tests may start one in-process. docs/cachenode.md ("The
// daemon") describes the behaviour; in short:
//
//  - Start: opens the metadata store (retrying until config.startup_timeout),
//    the chunk store (scan and validate), the identity executor, the TCP
//    server and the /metrics endpoint, registers the node with a first
//    heartbeat, and starts the control loop. Any failure undoes what was
//    started and is returned.
//  - The control loop heartbeats every heartbeat_interval and reconciles: the
//    datasets of its pool (phase Staging or Ready, manifest known) get a
//    Stager over the chunks placement gives this node among the live nodes,
//    in the order the registered plans first read them; ownership is
//    recomputed when nodes join, leave or expire; progress is published;
//    chunks no longer owned are dropped once the dataset is Ready again (the
//    new owners hold them); datasets deleted, moved to another pool or
//    re-snapshotted are dropped. It also moves a dataset to Ready when every
//    live node of the pool reports its share staged, back to Staging when
//    that stops being true, and says in the dataset's message when a node's
//    share does not fit its capacity.
//  - Snapshots: a dataset of its pool that the pool snapshots
//    (SnapshotBy::kPool) in phase Pending, or Snapshotting under a claim whose
//    node is not live any more, is claimed by compare-and-set (one node wins)
//    and walked as its owner on the node's snapshot thread, one walk at a
//    time, in a helper process (`<program> --snapshot-child`, snapshot.h);
//    the record then gets the manifest and Staging, or Failed with the reason.
//  - Stop: abandons a walk in progress (the helper is killed, the claim given
//    back: phase Pending), deregisters (RemoveNode), drains the server (drain_timeout), stops
//    the stagers (a worker finishes the source read it is in), stops the
//    endpoint. Idempotent.
//
// Failures of the metadata store after start-up are not fatal: the node keeps
// serving what it has and staging what it knows, /readyz says 503 with the
// reason, and the loop keeps retrying; the store's own reconnect logic does
// the rest.
//
// Thread safety: Start, Stop and the destructor are called by one owning
// thread. The accessors may be called from any thread.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "granary/config/cachenode_config.h"
#include "granary/core/net_address.h"
#include "granary/core/status.h"

namespace granary {

// The argument that makes a program the snapshot helper: a program that runs a
// CacheNode must answer `<program> --snapshot-child` by returning
// RunSnapshotChild(STDIN_FILENO, STDOUT_FILENO) (snapshot.h) at once, as
// granary-cachenode's main does.
inline constexpr char kSnapshotChildFlag[] = "--snapshot-child";

class CacheNode {
 public:
  // Starts everything the config names; see above. Errors name the part that
  // failed (the store URL, the data directory, the listen address) and what
  // to do. `snapshot_helper`: the helper's program and arguments (default:
  // this program with kSnapshotChildFlag).
  static Result<std::unique_ptr<CacheNode>> Start(const CacheNodeConfig& config,
                                                  std::vector<std::string> snapshot_helper = {
                                                      "/proc/self/exe", kSnapshotChildFlag});

  ~CacheNode();  // Stop()
  CacheNode(const CacheNode&) = delete;
  CacheNode& operator=(const CacheNode&) = delete;

  void Stop();

  // The protocol's bound port and the metrics endpoint's.
  uint16_t port() const;
  uint16_t metrics_port() const;
  // What peers and sidecars are told (NodeRecord::address), port filled in.
  const NetAddress& advertise() const;
  const std::string& node_id() const;

  // Datasets with a Stager now.
  size_t active_datasets() const;

 private:
  class Impl;
  explicit CacheNode(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace granary
