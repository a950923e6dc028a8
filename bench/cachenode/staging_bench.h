#pragma once

// cachenode_bench (a): staging, a Stager copying the dataset from the
// set-up's PosixSource into its ChunkStore on --threads workers, cold (the
// source's page cache dropped first) and warm (into the emptied store); and,
// for reference, the store disk's own write bandwidth written the way staging
// writes. The warm staging's Stager is kept: the serving bench serves it.
//
// Thread safety: main thread; staging runs on the Stager's workers.

#include <memory>

#include "bench_setup.h"
#include "granary/cachenode/stager.h"

namespace granary::cachenode_bench {

struct StagingFigures {
  RateFigures cold;
  RateFigures warm;
  RateFigures disk_write;  // the store disk's write bandwidth (reference)
};

// Stages the dataset twice (the second time into the emptied store) and
// measures the disk; *stager is the last Stager, its chunks complete.
Result<StagingFigures> RunStagingBench(const BenchSetup& setup, const Flags& f,
                                       std::shared_ptr<Stager>* stager);

}  // namespace granary::cachenode_bench
