#pragma once

// Sources for the cache node's tests (stager_test, chunk_read_service_test):
//  - SnapshotTree: the manifest of a generated source tree;
//  - FirstChunkWithSegments: a chunk of several samples, for tests that need
//    one chunk with work left in it;
//  - OpenPosixSourceAsProcess: a real PosixSource over a directory, read as
//    this process's own identity (no privilege needed);
//  - ScriptedSource: a Source over a real one that logs every read and can
//    hold reads at a gate or run a hook before them (to fail a read with EIO,
//    or to make it wait for something), for the cases a real file system
//    cannot produce on cue.
//
// Thread safety: ScriptedSource may be used from any number of threads, like
// any Source; its hook runs on the reading thread, outside its lock.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "granary/core/manifest.h"
#include "granary/core/status.h"
#include "granary/source/identity.h"
#include "granary/source/posix_source.h"
#include "granary/source/source.h"

namespace granary::testing {

// The manifest of the tree under `root` (BuildManifest, two threads).
Result<std::shared_ptr<const Manifest>> SnapshotTree(const std::string& root, uint64_t chunk_size);

// The first chunk of `manifest` holding at least `segments` segments, or
// kNotFound.
Result<ChunkId> FirstChunkWithSegments(const Manifest& manifest, size_t segments);

// A PosixSource over `root` whose reads run on `executor` as ProcessIdentity().
Result<std::shared_ptr<PosixSource>> OpenPosixSourceAsProcess(const std::string& root,
                                                              IdentityExecutor* executor,
                                                              uint32_t max_in_flight = 16);

class ScriptedSource final : public Source {
 public:
  // Runs before a read reaches the inner source; a non-OK Status fails the
  // read with it (the inner source is not asked).
  using Hook = std::function<Status(const SourceFile& file, uint64_t offset)>;

  explicit ScriptedSource(std::shared_ptr<Source> inner) : inner_(std::move(inner)) {}

  Status Read(const SourceFile& file, uint64_t offset, std::span<char> out) override;
  Status TryRead(const SourceFile& file, uint64_t offset, std::span<char> out) override;
  SourceCounters Counters() const override { return inner_->Counters(); }
  const std::string& uri() const override { return inner_->uri(); }
  uint32_t max_in_flight() const override { return inner_->max_in_flight(); }

  // Reads for which `hold` returns true wait until Open().
  void HoldIf(std::function<bool(const SourceFile&, uint64_t)> hold);
  void Open();
  // Reads waiting at the gate now.
  int held() const;
  void SetHook(Hook hook);
  // Every read asked for, in order: (path, offset).
  std::vector<std::pair<std::string, uint64_t>> log() const;

 private:
  // Logs, gates and runs the hook; OK: ask the inner source.
  Status Intercept(const SourceFile& file, uint64_t offset);

  const std::shared_ptr<Source> inner_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<bool(const SourceFile&, uint64_t)> hold_;  // guarded by mu_
  bool open_ = true;                                       // guarded by mu_
  int held_ = 0;                                           // guarded by mu_
  Hook hook_;                                              // guarded by mu_
  std::vector<std::pair<std::string, uint64_t>> log_;      // guarded by mu_
};

}  // namespace granary::testing
