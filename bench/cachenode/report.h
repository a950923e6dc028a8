#pragma once

// cachenode_bench's results: the table on stdout and, with --json, the same
// figures with their ratios as JSON (docs/benchmarks.md, "Cache node").

#include <string>
#include <utility>
#include <vector>

#include "bench_setup.h"
#include "source_read_bench.h"
#include "staging_bench.h"
#include "timed_run.h"

namespace granary::cachenode_bench {

struct BenchFigures {
  SourceReadFigures source;
  StagingFigures staging;
  // The best round of each transport served over, in order, with its label.
  std::vector<std::pair<std::string, LoadFigures>> servings;
  LoadFigures local;         // the best round, chunks opened once
  LoadFigures local_reopen;  // the best round, chunks opened per batch
  uint64_t verified_bytes = 0;
};

// Prints the table; writes --json if given.
Status Report(const Flags& f, const BenchSetup& setup, const BenchFigures& figures);

}  // namespace granary::cachenode_bench
