// The cache node's figures for issue 3's closing note, measured side by side
// in one run on one machine (docs/benchmarks.md, "Cache node"):
//  (a) staging: a Stager copying a generated dataset from a PosixSource into a
//      ChunkStore, against the source's own read bandwidth measured the same
//      way (PosixSource::Read of every sample on --threads workers), with the
//      source's page cache dropped before both (cold) and with it warm;
//  (b) serving: ChunkReadService behind Server on 127.0.0.1, --clients
//      PeerClient threads each doing READs of --batch random samples for
//      --seconds, against reading the same samples from the same chunk files in
//      this process (StoredChunkReader::Read, checksums verified) on as many
//      threads with the same random sequences.
//
// Checks (any failure fails the run, exit status 1): every sample read from
// the source matches the checksum of the bytes generated for it; staging
// opens each source file once and completes every chunk; before the timed
// serving run every sample is read over the wire once and compared byte for
// byte with the generated content; every timed READ item must be OK, of the
// sample's size, with the source's checksum (and PeerClient verifies the bytes
// against it); the server's payload count must equal what the clients got.
// The work directory is removed at the end, also on errors and on
// SIGINT/SIGTERM (a second signal kills at once); every thread is joined.
//
//   build/release/bench/cachenode_bench [--dir DIR] [--files 20000] [--size 110KiB]
//       [--threads 16] [--clients 4] [--batch 16] [--seconds 10] [--json FILE]
//
// The benches live in bench/cachenode/, a file each, over one shared set-up
// (bench_setup.h: flags, work directory, dataset, source and store):
// source_read_bench (a, the reference), staging_bench (a), serving_bench (b)
// and local_read_bench (b, the reference); timed_run.h is the load harness
// of (b), report.h the table and the JSON. This file is the command line and
// the order they run in.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cachenode/bench_setup.h"
#include "cachenode/local_read_bench.h"
#include "cachenode/report.h"
#include "cachenode/serving_bench.h"
#include "cachenode/source_read_bench.h"
#include "cachenode/staging_bench.h"
#include "cachenode/timed_run.h"
#include "granary/cachenode/stager.h"
#include "granary/core/log.h"
#include "granary/core/protocol_format.h"

namespace granary::cachenode_bench {
namespace {

Status Run(const Flags& f) {
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<BenchSetup> setup, SetUp(f));
  BenchFigures figures;

  // (a) The source cold, then warm; staging cold, then warm (into an emptied
  // store); the store disk's write bandwidth for reference.
  GRANARY_ASSIGN_OR_RETURN(figures.source, RunSourceReadBench(*setup, f));
  std::shared_ptr<Stager> stager;
  GRANARY_ASSIGN_OR_RETURN(figures.staging, RunStagingBench(*setup, f, &stager));

  // (b) Serving the store over loopback, and the same reads locally.
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<ServingBench> serving,
                           ServingBench::Start(*setup, f, stager));
  figures.verified_bytes = serving->verified_bytes();
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<LocalReadBench> local_bench,
                           LocalReadBench::Open(*setup));
  const std::vector<BatchFn> local_fns = local_bench->OpenedOnce(f.clients);
  const std::vector<BatchFn> reopen_fns = local_bench->OpenedPerBatch(f.clients);

  // Serving and the local reads take turns, --repeat times; the best of each
  // is reported (a shared machine only ever makes a run slower).
  std::optional<LoadFigures> best_serving;
  std::optional<LoadFigures> local;
  std::optional<LoadFigures> local_reopen;
  for (uint32_t round = 0; round < f.repeat; ++round) {
    GRANARY_ASSIGN_OR_RETURN(LoadFigures served, serving->TimedRound(f));
    KeepBest(served, &best_serving);
    std::vector<BatchFn> fns = local_fns;
    GRANARY_ASSIGN_OR_RETURN(LoadFigures read, TimedRun(fns, f.batch, f.files, f.seconds, f.seed));
    KeepBest(read, &local);
    fns = reopen_fns;
    GRANARY_ASSIGN_OR_RETURN(read, TimedRun(fns, f.batch, f.files, f.seconds, f.seed));
    KeepBest(read, &local_reopen);
    Progress("  round " + std::to_string(round + 1) + ": serving " + Fixed(served.gb_s(), 2) +
             " GB/s, local " + Fixed(local->gb_s(), 2) + " GB/s (best so far)");
  }
  GRANARY_RETURN_IF_ERROR(serving->CheckServiceCounters());
  figures.serving = *best_serving;
  figures.local = *local;
  figures.local_reopen = *local_reopen;
  return Report(f, *setup, figures);
}

}  // namespace
}  // namespace granary::cachenode_bench

int main(int argc, char** argv) {
  granary::cachenode_bench::Flags f;
  CLI::App app{
      "Granary cache node benchmark: staging against the source's read bandwidth, and serving "
      "over loopback against local reads of the same chunk files (docs/benchmarks.md)"};
  app.add_option("--dir", f.dir,
                 "work directory (must be empty or not exist; removed at the end); default a new "
                 "directory under /tmp");
  app.add_flag("--keep", f.keep, "keep the work directory");
  app.add_option("--files", f.files, "files in the generated dataset")
      ->check(CLI::Range(uint64_t{1}, uint64_t{10'000'000}));
  app.add_option("--size", f.size, "bytes per file, e.g. 110KiB (KB = 1000, KiB = 1024)")
      ->transform(CLI::AsSizeValue(true));
  app.add_option("--threads", f.threads, "source concurrency: staging and source-read threads")
      ->check(CLI::Range(uint32_t{1}, granary::kMaxStagerThreads));
  app.add_option("--clients", f.clients, "client connections (and local reader threads)")
      ->check(CLI::Range(1, 256));
  app.add_option("--batch", f.batch, "samples per READ")
      ->check(CLI::Range(uint32_t{1}, granary::protocol_format::kDefaultMaxItems));
  app.add_option("--seconds", f.seconds, "length of each timed serving and local run")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--io-threads", f.io_threads, "server event loops")->check(CLI::Range(1, 64));
  app.add_option("--service-threads", f.service_threads, "server read-service threads")
      ->check(CLI::Range(1, 256));
  app.add_option("--repeat", f.repeat,
                 "serving and local runs take turns this many times; the best of each is kept")
      ->check(CLI::Range(1, 100));
  app.add_option("--seed", f.seed, "seed of the random sample order");
  app.add_option("--json", f.json, "also write the figures as JSON to this file");
  app.add_flag("--tls", f.tls, "serve over TLS (a self-signed certificate the clients verify)");
  CLI11_PARSE(app, argc, argv);

  if (std::getenv("GRANARY_LOG_LEVEL") == nullptr) granary::SetLogLevel(spdlog::level::warn);
  granary::cachenode_bench::InstallSignalHandlers();
  granary::Status status = granary::cachenode_bench::Run(f);
  if (!status.ok()) {
    std::fprintf(stderr, "cachenode_bench failed: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
