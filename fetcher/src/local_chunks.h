#pragma once

// LocalChunks: the chunk files of the cache node on this host, opened through
// its chunk handoff socket (chunk_handoff.h) and kept open, so that the
// SampleFetcher reads a staged sample with one pread straight into the arena
// and verifies it against the chunk's stored checksum: no READ over TCP, no
// copy through socket buffers. docs/sidecar.md, "Where samples come from".
//
// Whatever it cannot serve it declines (kNotFound) and the fetcher asks the
// node over the network as before: a segment not staged yet (the node fills it
// on demand there), a chunk the node does not have or refuses, a piece that is
// not one whole segment, a segment failing its checksum (the node repairs it
// when the network READ finds the same), the socket unreachable (then the
// path stays off for `down_for`). It never returns bytes that failed their
// checksum.
//
// Bounded: at most `capacity` chunk files open (least recently used closed
// first). A chunk the node deleted stays readable through the descriptor until
// it is closed; its bytes are still those of the same manifest, verified. A
// kept descriptor is checked for a file the node dropped (link count 0) at
// its first read after a second, and every one at the first Read of each
// second, and closed then, so an eviction frees the space.
//
// Who calls it: SampleFetcher::Impl (ReadFromNode for the local node).
//
// Thread safety: every method may be called from any number of threads. Reads
// of one chunk run concurrently; refreshing its presence bitmap excludes them.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <tuple>

#include "granary/core/chunk_file.h"
#include "granary/core/status.h"
#include "granary/fetcher/sample_fetcher.h"
#include "granary/protocol/chunk_handoff.h"

namespace granary::sidecar {

struct LocalChunksCounters {
  uint64_t opens = 0;     // chunk descriptors received
  uint64_t pieces = 0;    // pieces read locally
  uint64_t declined = 0;  // pieces passed to the network path
  uint64_t corrupt = 0;   // of those, segments that failed their checksum here
  uint64_t failures = 0;  // handoff socket failures (path switched off for a while)
  uint64_t dropped = 0;   // kept descriptors of files the node dropped since (closed)
};

class LocalChunks {
 public:
  LocalChunks(std::string socket_path, std::chrono::milliseconds timeout,
              std::chrono::milliseconds down_for, size_t capacity);

  // Reads the piece [offset, offset + out.size()) of `sample` that `chunk`
  // holds into `out`, when it is exactly one whole segment of the chunk file
  // and is staged. Returns the segment's checksum (XXH3-64 of `out`), or
  // kNotFound with the reason (the caller falls back to the network).
  Result<uint64_t> Read(const FetchDataset& dataset, ChunkId chunk, SampleId sample,
                        uint64_t offset, std::span<char> out);

  // The kept file of `chunk` (opened through the handoff if need be), its
  // presence re-read if older than the refresh interval, duplicated for a
  // reader on this host. kNotFound with the reason when it cannot.
  Result<LocalChunkFile> Share(const FetchDataset& dataset, ChunkId chunk);

  LocalChunksCounters counters() const;

 private:
  struct Key {
    std::string dataset;
    ContentId manifest;
    ChunkId chunk = 0;
    friend bool operator<(const Key& a, const Key& b) {
      return std::tie(a.chunk, a.manifest.low, a.manifest.high, a.dataset) <
             std::tie(b.chunk, b.manifest.low, b.manifest.high, b.dataset);
    }
  };
  struct Open {
    std::shared_mutex mu;  // shared: Read; exclusive: Refresh
    ChunkReader reader;
    std::chrono::steady_clock::time_point refreshed;
    std::chrono::steady_clock::time_point link_checked;  // under LocalChunks::mu_
    explicit Open(ChunkReader r) : reader(std::move(r)) {}
  };
  struct Slot {
    std::shared_ptr<Open> open;
    std::list<Key>::iterator lru;
  };

  Result<std::shared_ptr<Open>> Get(const FetchDataset& dataset, const Key& key);
  void Forget(const Key& key);
  Status Decline(std::string why);

  handoff::ChunkHandoffClient client_;
  const std::chrono::milliseconds down_for_;
  const size_t capacity_;

  mutable std::mutex mu_;
  std::map<Key, Slot> open_;  // guarded by mu_
  std::list<Key> lru_;        // guarded by mu_; front: oldest
  std::map<Key, std::chrono::steady_clock::time_point> not_before_;  // guarded by mu_
  std::chrono::steady_clock::time_point down_until_;                 // guarded by mu_
  std::chrono::steady_clock::time_point swept_;  // guarded by mu_: last check of every descriptor

  std::atomic<uint64_t> opens_{0};
  std::atomic<uint64_t> pieces_{0};
  std::atomic<uint64_t> declined_{0};
  std::atomic<uint64_t> corrupt_{0};
  std::atomic<uint64_t> failures_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace granary::sidecar
