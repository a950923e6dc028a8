#include "testing/source_fixture.h"

#include "granary/core/manifest_builder.h"

namespace granary::testing {

Result<std::shared_ptr<const Manifest>> SnapshotTree(const std::string& root, uint64_t chunk_size) {
  ManifestBuildOptions options;
  options.source_root = root;
  options.chunk_size = chunk_size;
  options.threads = 2;
  GRANARY_ASSIGN_OR_RETURN(Manifest manifest, BuildManifest(options));
  return std::make_shared<const Manifest>(std::move(manifest));
}

Result<ChunkId> FirstChunkWithSegments(const Manifest& manifest, size_t segments) {
  for (ChunkId c = 0; c < manifest.chunk_count(); ++c) {
    GRANARY_ASSIGN_OR_RETURN(std::vector<ChunkSegment> s, manifest.Segments(c));
    if (s.size() >= segments) return c;
  }
  return Status::NotFound("no chunk of manifest " + manifest.id().ToHex() + " has " +
                          std::to_string(segments) + " segments; generate more small files");
}

Result<std::shared_ptr<PosixSource>> OpenPosixSourceAsProcess(const std::string& root,
                                                              IdentityExecutor* executor,
                                                              uint32_t max_in_flight) {
  PosixSourceOptions o;
  o.root = root;
  o.owner = ProcessIdentity();
  o.executor = executor;
  o.max_in_flight = max_in_flight;
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<PosixSource> source, PosixSource::Open(std::move(o)));
  return std::shared_ptr<PosixSource>(std::move(source));
}

Status ScriptedSource::Read(const SourceFile& file, uint64_t offset, std::span<char> out) {
  GRANARY_RETURN_IF_ERROR(Intercept(file, offset));
  return inner_->Read(file, offset, out);
}

Status ScriptedSource::TryRead(const SourceFile& file, uint64_t offset, std::span<char> out) {
  GRANARY_RETURN_IF_ERROR(Intercept(file, offset));
  return inner_->TryRead(file, offset, out);
}

void ScriptedSource::HoldIf(std::function<bool(const SourceFile&, uint64_t)> hold) {
  std::lock_guard<std::mutex> lock(mu_);
  hold_ = std::move(hold);
  open_ = false;
}

void ScriptedSource::Open() {
  std::lock_guard<std::mutex> lock(mu_);
  open_ = true;
  cv_.notify_all();
}

int ScriptedSource::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

void ScriptedSource::SetHook(Hook hook) {
  std::lock_guard<std::mutex> lock(mu_);
  hook_ = std::move(hook);
}

std::vector<std::pair<std::string, uint64_t>> ScriptedSource::log() const {
  std::lock_guard<std::mutex> lock(mu_);
  return log_;
}

Status ScriptedSource::Intercept(const SourceFile& file, uint64_t offset) {
  Hook hook;
  {
    std::unique_lock<std::mutex> lock(mu_);
    log_.emplace_back(file.path, offset);
    if (!open_ && hold_ && hold_(file, offset)) {
      ++held_;
      cv_.wait(lock, [&] { return open_; });
      --held_;
    }
    hook = hook_;
  }
  return hook ? hook(file, offset) : Status::Ok();
}

}  // namespace granary::testing
