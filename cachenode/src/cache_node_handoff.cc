// The chunk handoff's resolver (cache_node_impl.h, HandoffServer): a
// read-only descriptor of one chunk file for a same-host peer that may read
// the dataset, or that may read every file of the chunk at the source.

#include <fcntl.h>
#include <unistd.h>

#include "cache_node_impl.h"

namespace granary {

Result<ScopedFd> CacheNode::Impl::HandOff(const PeerCredentials& peer,
                                          const handoff::OpenChunkRequest& request) {
  std::shared_ptr<ActiveDataset> ds;
  {
    std::lock_guard<std::mutex> lock(datasets_mu_);
    auto it = datasets_.find(request.dataset);
    if (it != datasets_.end()) ds = it->second;
  }
  const std::string what = "chunk " + std::to_string(request.chunk) + " of dataset " +
                           Quoted(request.dataset) + " on cache node " + Quoted(config_.node_id);
  if (ds == nullptr) {
    return Status::NotFound(what +
                            ": the node does not stage that dataset (yet); read it over "
                            "the network");
  }
  if (!(ds->manifest_id == request.manifest_id)) {
    return Status::NotFound(what + ": the node serves manifest " + ds->manifest_id.ToHex() +
                            ", not " + request.manifest_id.ToHex() + "; reopen the dataset");
  }
  if (request.chunk >= ds->manifest->chunk_count()) {
    return Status::OutOfRange(what + ": the manifest has " +
                              std::to_string(ds->manifest->chunk_count()) + " chunks");
  }
  if (peer.uid != 0 && peer.uid != ::geteuid() && peer.uid != ds->owner_uid) {
    GRANARY_RETURN_IF_ERROR(MayReadChunk(peer.uid, *ds, request.chunk, what));
  }
  GRANARY_ASSIGN_OR_RETURN(std::vector<ChunkSegment> segments,
                           ds->manifest->Segments(request.chunk));
  ChunkKey key{request.dataset, request.manifest_id, request.chunk};
  Result<StoredChunkReader> reader = chunks_->OpenChunkReader(key, segments);
  if (!reader.ok()) return Status(reader.status().code(), what + ": " + reader.status().message());
  const int fd = ::fcntl((*reader)->fd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "duplicate the descriptor of " + what);
  // A same-host reader reads the file itself: the hand-off is its read here.
  ds->stager->NoteReads(1, 0, cache_node_internal::NowMs());
  ds->stager->TouchChunk(request.chunk);
  return ScopedFd(fd);
}

Status CacheNode::Impl::MayReadChunk(uint32_t uid, const ActiveDataset& ds, ChunkId chunk,
                                     const std::string& what) {
  const std::string owner = "the dataset belongs to uid " + std::to_string(ds.owner_uid);
  const ReadRightsKey key{uid, ds.name, ds.manifest_id, chunk};
  Status answer = handoff_rights_.Decide(key, [&]() -> Status {
    Result<Identity> reader = ResolveUserIdentity(uid);
    if (!reader.ok()) {
      if (reader.status().code() != StatusCode::kNotFound) return reader.status();
      return Status::PermissionDenied(reader.status().message() +
                                      ", so the node cannot check what it may read at the "
                                      "source and hands it nothing (" +
                                      owner + "); read through a sidecar");
    }
    GRANARY_ASSIGN_OR_RETURN(std::vector<ChunkSegment> segments, ds.manifest->Segments(chunk));
    std::vector<SourceFile> files;
    files.reserve(segments.size());
    std::optional<SampleId> last;
    for (const ChunkSegment& segment : segments) {
      if (last == segment.sample) continue;
      last = segment.sample;
      GRANARY_ASSIGN_OR_RETURN(SourceFile file, SourceFileOf(*ds.manifest, segment.sample));
      files.push_back(std::move(file));
    }
    Status readable = ds.source->CheckReadable(*reader, files);
    if (readable.code() != StatusCode::kPermissionDenied) return readable;
    const std::string advice = "through a sidecar, or ask the dataset's owner (uid " +
                               std::to_string(ds.owner_uid) + ") for access to it";
    if (files.size() == 1) {
      return Status::PermissionDenied(readable.message() + ": read it " + advice);
    }
    return Status::PermissionDenied(readable.message() + "; the chunk holds " +
                                    std::to_string(files.size()) +
                                    " files and is handed out only to a user who may read them "
                                    "all: read that file " +
                                    advice);
  });
  if (answer.ok()) return answer;
  log_->debug("chunk handoff to uid {} refused: {}: {}", uid, what, answer.ToString());
  return Status(answer.code(), what + ": " + answer.message());
}

// (Re)creates the dataset's Stager with the order of `plans` and puts it in
// service. A running one is stopped first and then replaced in the read
// service in one step, so the dataset is served throughout: a READ that found
// it unserved would be taken for "not placed here" and read from the source
// (which may be gone once the dataset is Ready). A sidecar registers its plan
// when its job starts reading, so this happens at every job's first reads.
}  // namespace granary
