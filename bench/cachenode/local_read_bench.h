#pragma once

// cachenode_bench (b), the reference for serving: the same random samples
// read from the same chunk files in this process (StoredChunkReader::Read,
// checksums verified), on as many threads as serving has clients, with every
// chunk opened once, or with the chunks of each batch opened for that batch
// as ChunkReadService does.
//
// Thread safety: the batch functions may run on several threads at once; the
// readers they share are read-only.

#include <memory>
#include <vector>

#include "bench_setup.h"
#include "timed_run.h"

namespace granary::cachenode_bench {

class LocalReadBench {
 public:
  // Opens every chunk of the set-up's (staged) store once.
  static Result<std::unique_ptr<LocalReadBench>> Open(const BenchSetup& setup);

  // `threads` batch functions reading through the chunks opened once.
  std::vector<BatchFn> OpenedOnce(uint32_t threads) const;
  // `threads` batch functions opening the chunks of each batch for it.
  std::vector<BatchFn> OpenedPerBatch(uint32_t threads) const;

 private:
  explicit LocalReadBench(const BenchSetup& setup) : setup_(setup) {}

  const BenchSetup& setup_;
  std::vector<StoredChunkReader> readers_;  // every chunk, opened once
};

}  // namespace granary::cachenode_bench
