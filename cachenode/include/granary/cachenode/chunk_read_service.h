#pragma once

// ChunkReadService: the cache node's ReadService (read_service.h) over its
// chunk store (chunk_store.h) and its stagers (stager.h): what answers a READ
// or a STAT on the wire. docs/cachenode.md ("Reading") describes the policy.
//
// What it does, per READ item (a sample range or a chunk range):
//  - a segment present in the store is read from its chunk file into memory
//    and verified against its checksum before it is served (never sendfile of
//    unverified bytes);
//  - a segment not present is fetched on demand (Stager::FetchSegment): read
//    from the source now, ahead of bulk staging, stored, and served;
//  - a segment failing its checksum is read from the source again and its
//    stored copy replaced by the Stager (Stager::DropAndRefetch, which owns
//    every writer of the chunk, so it never races bulk staging), served
//    correct, and counted (checksum_failures:
//    granary_cachenode_checksum_failures_total);
//  - a segment the store cannot read (an I/O error: EIO from a failing disk)
//    fails its item with an error naming the chunk and the store, never
//    other bytes, and is counted (store_read_errors); the node goes on;
//  - per-sample source errors (changed since the snapshot, gone, permission)
//    fail the item with the source's message and no bytes; ids and ranges past
//    the manifest are kOutOfRange per item; an unknown (dataset, manifest)
//    fails the whole READ with kNotFound.
//
// Who calls it: the cache node's Server, on its service pool; the daemon Adds
// a dataset once its Stager exists and Removes it before tearing it down.
//
// Thread safety: every public method may be called from any number of threads
// at once. The registry is guarded by mu_, held only to look up or change it;
// a READ holds shared_ptrs to its dataset's Manifest and Stager, so Remove
// during a READ is safe (the Stager lives until that READ is done).

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "granary/cachenode/chunk_store.h"
#include "granary/cachenode/read_service.h"
#include "granary/cachenode/stager.h"
#include "granary/core/manifest.h"
#include "granary/core/status.h"
#include "granary/protocol/protocol.h"

namespace granary {

struct ChunkReadServiceOptions {
  // Names this node in error messages ("... is not served by node X").
  std::string node_name = "granary-cachenode";
  // Verify a stored segment once, then serve it as a file range (sendfile,
  // no copy through this process, no hash) while this service serves its
  // manifest (docs/cachenode.md, "Checksums"). Off: every read is verified
  // here. Either way the wire checksum is the one stored at staging, which
  // readers check, so a segment that rots after its check reaches no one.
  bool verify_once = false;
};

// Totals since the service was created (for /metrics and STAT).
struct ChunkReadServiceCounters {
  uint64_t reads = 0;               // READ calls answered (whole-request failures included)
  uint64_t reads_not_found = 0;     // READs failed as a whole: dataset/manifest not served
  uint64_t items_ok = 0;            // items answered with bytes
  uint64_t items_from_disk = 0;     // OK items whose every segment came from the chunk files
  uint64_t items_on_demand = 0;     // OK items with at least one segment fetched on demand
  uint64_t items_out_of_range = 0;  // kOutOfRange: id or range past the manifest
  uint64_t items_source_error = 0;  // per-sample source errors (changed, gone, permission, ...)
  uint64_t items_corrupt = 0;       // kCorruption (e.g. a store read failing it on demand)
  uint64_t items_other_error = 0;   // any other per-item error (store I/O, not owned, ...)
  uint64_t bytes_served = 0;        // bytes of OK items
  uint64_t checksum_failures = 0;   // segments read from disk that failed their checksum
  uint64_t restaged_segments = 0;   // of those, dropped and fetched again correctly
  uint64_t store_read_errors = 0;   // segments the store failed to read (EIO, ...): item failed
  uint64_t items_sendfile = 0;      // OK items served as a file range (verify_once)
};

class ChunkReadService final : public ReadService {
 public:
  ChunkReadService(std::shared_ptr<ChunkStore> store, ChunkReadServiceOptions options = {});
  ~ChunkReadService() override = default;
  ChunkReadService(const ChunkReadService&) = delete;
  ChunkReadService& operator=(const ChunkReadService&) = delete;

  // Serves `manifest` of `stager->dataset()` from now on. The stager must have
  // been created over `manifest` (the same manifest id) and this service's
  // store. kInvalidArgument for null arguments or a stager of another
  // manifest; kAlreadyExists if served already.
  Status Add(std::shared_ptr<const Manifest> manifest, std::shared_ptr<Stager> stager);
  // Serves it with `stager` from now on in place of the stager serving it now,
  // in one step: no READ finds it unserved in between (READs in progress
  // finish with the old stager). For a Stager created again over the same
  // manifest (a new staging order): readers take kNotFound for "not placed
  // on this node" and go to the source, so the daemon must not Remove and
  // Add. kNotFound if it is not served; otherwise errors as Add.
  Status Replace(std::shared_ptr<const Manifest> manifest, std::shared_ptr<Stager> stager);
  // Stops serving it (READs in progress finish). kNotFound if not served.
  Status Remove(std::string_view dataset, const ContentId& manifest_id);
  size_t dataset_count() const;

  Result<ReadAnswer> Read(const ReadRequest& request) override;
  // Node-wide (request.dataset empty): datasets served, summed progress, and
  // this service's counters. Per dataset: its Stager's Progress; a zero
  // manifest id means the dataset's only (or first) served manifest.
  Result<StatReply> Stat(const StatRequest& request) override;

  ChunkReadServiceCounters Counters() const;

 private:
  // The stored segments of one served manifest already verified here
  // (verify_once), per chunk: a bit per segment.
  struct VerifiedSegments {
    std::mutex mu;
    std::map<ChunkId, std::vector<bool>> chunks;  // guarded by mu
  };
  struct Served {
    std::shared_ptr<const Manifest> manifest;  // the stager's own (same id)
    std::shared_ptr<Stager> stager;
    std::shared_ptr<VerifiedSegments> verified;  // made by Add and Replace
  };
  struct KeyLess {
    bool operator()(const std::pair<std::string, ContentId>& a,
                    const std::pair<std::string, ContentId>& b) const {
      return std::tie(a.first, a.second.high, a.second.low) <
             std::tie(b.first, b.second.high, b.second.low);
    }
  };
  class ItemReader;

  // Add's and Replace's checks of their arguments; `doing` says which.
  Status CheckServable(const std::shared_ptr<const Manifest>& manifest,
                       const std::shared_ptr<Stager>& stager, const std::string& doing) const;
  Result<Served> Find(std::string_view dataset, const ContentId& manifest_id) const;
  void CountError(const Status& status);

  const std::shared_ptr<ChunkStore> store_;
  const ChunkReadServiceOptions options_;

  mutable std::mutex mu_;
  std::map<std::pair<std::string, ContentId>, Served, KeyLess> served_;  // guarded by mu_

  std::atomic<uint64_t> reads_{0};
  std::atomic<uint64_t> reads_not_found_{0};
  std::atomic<uint64_t> items_ok_{0};
  std::atomic<uint64_t> items_from_disk_{0};
  std::atomic<uint64_t> items_on_demand_{0};
  std::atomic<uint64_t> items_out_of_range_{0};
  std::atomic<uint64_t> items_source_error_{0};
  std::atomic<uint64_t> items_corrupt_{0};
  std::atomic<uint64_t> items_other_error_{0};
  std::atomic<uint64_t> bytes_served_{0};
  std::atomic<uint64_t> checksum_failures_{0};
  std::atomic<uint64_t> restaged_segments_{0};
  std::atomic<uint64_t> store_read_errors_{0};
  std::atomic<uint64_t> items_sendfile_{0};
};

}  // namespace granary
