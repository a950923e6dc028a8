#pragma once

// What the Stager's files share (stager.h is the Stager; private to
// cachenode/src). The Stager's work is in three files, by job:
//  - stager.cc: creation, start and stop, ownership, pause and resume, and
//    the bookkeeping of what is staged, failed and in progress;
//  - stager_bulk.cc: the bulk workers: taking chunks in staging order,
//    reading them from the source, writing them (the one writer hold per
//    chunk, which on-demand fills also go through), pausing on a full store,
//    helping to read the last chunks, reusing read buffers;
//  - stager_on_demand.cc: FetchSegment, DropAndRefetch and FetchSample for
//    readers, ahead of the bulk queue, and the lead-in (the first samples of
//    the order, read at Start and SetOrder).

#include <cstdint>
#include <string>

#include "granary/cachenode/chunk_store.h"
#include "granary/core/manifest.h"
#include "granary/core/names.h"
#include "granary/core/status.h"

namespace granary::stager_internal {

inline std::string ChunkName(const std::string& dataset, ChunkId chunk) {
  return "chunk " + std::to_string(chunk) + " of dataset " + Quoted(dataset);
}

// How many chunks sample `sample` spans (pieces of a sample larger than a chunk).
inline uint64_t PieceCount(const Manifest& manifest, SampleId sample) {
  const uint64_t size = manifest.SizeOf(sample);
  const uint64_t chunk_size = manifest.chunk_size();
  return size > chunk_size ? (size + chunk_size - 1) / chunk_size : 1;
}

// Puts a segment read from the source. A present segment is kept, unless the
// bytes replace a stored copy that failed its checksum: that is dropped first.
inline Status PutFill(StoredChunkWriter& writer, uint32_t index, const std::string& bytes,
                      bool replace) {
  if (writer.IsPresent(index)) {
    if (!replace) return Status::Ok();
    GRANARY_RETURN_IF_ERROR(writer.Drop(index));
  }
  return writer.Put(index, bytes);
}

}  // namespace granary::stager_internal
