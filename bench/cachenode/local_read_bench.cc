#include "local_read_bench.h"

#include <map>
#include <span>
#include <string>

namespace granary::cachenode_bench {
namespace {

Status ReadLocally(const StoredChunkReader& reader, const Piece& piece, uint64_t* got) {
  GRANARY_ASSIGN_OR_RETURN(std::string bytes, reader->Read(piece.index));
  *got += bytes.size();
  return Status::Ok();
}

Status CheckLocalSize(const Manifest& manifest, SampleId id, uint64_t got) {
  if (got == manifest.SizeOf(id)) return Status::Ok();
  return Status::Internal("reading sample " + std::to_string(id) + " from the chunk files got " +
                          std::to_string(got) + " of its " + std::to_string(manifest.SizeOf(id)) +
                          " bytes");
}

}  // namespace

Result<std::unique_ptr<LocalReadBench>> LocalReadBench::Open(const BenchSetup& setup) {
  const Manifest& manifest = *setup.manifest;
  std::unique_ptr<LocalReadBench> bench(new LocalReadBench(setup));
  for (ChunkId c = 0; c < manifest.chunk_count(); ++c) {
    GRANARY_ASSIGN_OR_RETURN(
        StoredChunkReader reader,
        setup.store->OpenChunkReader({kDataset, manifest.id(), c}, setup.table.segments[c]));
    bench->readers_.push_back(std::move(reader));
  }
  return bench;
}

std::vector<BatchFn> LocalReadBench::OpenedOnce(uint32_t threads) const {
  return std::vector<BatchFn>(
      threads, [this](std::span<const SampleId> ids, uint64_t* bytes) -> Status {
        const PieceTable& table = setup_.table;
        const Manifest& manifest = *setup_.manifest;
        const std::vector<StoredChunkReader>& readers = readers_;
        for (SampleId id : ids) {
          uint64_t got = 0;
          for (uint64_t p = table.first[id]; p < table.first[id + 1]; ++p) {
            GRANARY_RETURN_IF_ERROR(
                ReadLocally(readers[table.pieces[p].chunk], table.pieces[p], &got));
          }
          GRANARY_RETURN_IF_ERROR(CheckLocalSize(manifest, id, got));
          *bytes += got;
        }
        return Status::Ok();
      });
}

std::vector<BatchFn> LocalReadBench::OpenedPerBatch(uint32_t threads) const {
  return std::vector<BatchFn>(
      threads, [this](std::span<const SampleId> ids, uint64_t* bytes) -> Status {
        const PieceTable& table = setup_.table;
        const Manifest& manifest = *setup_.manifest;
        ChunkStore& store = *setup_.store;
        // As ChunkReadService does: the chunks of one batch opened for that batch.
        std::map<ChunkId, StoredChunkReader> open;
        for (SampleId id : ids) {
          uint64_t got = 0;
          for (uint64_t p = table.first[id]; p < table.first[id + 1]; ++p) {
            const Piece& piece = table.pieces[p];
            auto it = open.find(piece.chunk);
            if (it == open.end()) {
              GRANARY_ASSIGN_OR_RETURN(StoredChunkReader reader,
                                       store.OpenChunkReader({kDataset, manifest.id(), piece.chunk},
                                                             table.segments[piece.chunk]));
              it = open.emplace(piece.chunk, std::move(reader)).first;
            }
            GRANARY_RETURN_IF_ERROR(ReadLocally(it->second, piece, &got));
          }
          GRANARY_RETURN_IF_ERROR(CheckLocalSize(manifest, id, got));
          *bytes += got;
        }
        return Status::Ok();
      });
}

}  // namespace granary::cachenode_bench
