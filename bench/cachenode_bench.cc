// The cache node's figures, measured side by side
// in one run on one machine (docs/benchmarks.md, "Cache node"):
//  (a) staging: a Stager copying a generated dataset from a PosixSource into a
//      ChunkStore, against the source's own read bandwidth measured the same
//      way (PosixSource::Read of every sample on --threads workers), with the
//      source's page cache dropped before both (cold) and with it warm;
//  (b) serving: ChunkReadService behind a front end (the TCP Server, the
//      libfabric FabricServer, or each in turn: --transport) on 127.0.0.1, or
//      in one network namespace with the clients in another (--netns),
//      --clients connections each doing READs of --batch random samples for
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
//       [--transport tcp|libfabric|both] [--fabric-provider tcp] [--netns] [--tls]
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
#include "granary/protocol/protocol_format.h"

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

  // (b) Serving the store over each transport asked for, and the same reads
  // locally.
  std::unique_ptr<NetnsPair> netns;
  if (f.netns) {
    GRANARY_ASSIGN_OR_RETURN(netns, NetnsPair::Create());
    Progress("  serving across network namespaces " + netns->name(0) + " (" + netns->address(0) +
             ") and " + netns->name(1) + " (" + netns->address(1) + ")");
  }
  std::vector<std::unique_ptr<ServingBench>> servings;
  for (const std::string transport : {"tcp", "libfabric"}) {
    if (f.transport != transport && f.transport != "both") continue;
    GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<ServingBench> serving,
                             ServingBench::Start(*setup, f, stager, transport, netns.get()));
    figures.verified_bytes += serving->verified_bytes();
    servings.push_back(std::move(serving));
  }
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<LocalReadBench> local_bench,
                           LocalReadBench::Open(*setup));
  const std::vector<BatchFn> local_fns = local_bench->OpenedOnce(f.clients);
  const std::vector<BatchFn> reopen_fns = local_bench->OpenedPerBatch(f.clients);

  // Serving and the local reads take turns, --repeat times; the best of each
  // is reported (a shared machine only ever makes a run slower).
  std::vector<std::optional<LoadFigures>> best_serving(servings.size());
  std::optional<LoadFigures> local;
  std::optional<LoadFigures> local_reopen;
  for (uint32_t round = 0; round < f.repeat; ++round) {
    std::string served_text;
    for (size_t s = 0; s < servings.size(); ++s) {
      GRANARY_ASSIGN_OR_RETURN(LoadFigures served, servings[s]->TimedRound(f));
      KeepBest(served, &best_serving[s]);
      served_text += servings[s]->transport() + " " + Fixed(served.gb_s(), 2) + " GB/s, ";
    }
    std::vector<BatchFn> fns = local_fns;
    GRANARY_ASSIGN_OR_RETURN(LoadFigures read, TimedRun(fns, f.batch, f.files, f.seconds, f.seed));
    KeepBest(read, &local);
    fns = reopen_fns;
    GRANARY_ASSIGN_OR_RETURN(read, TimedRun(fns, f.batch, f.files, f.seconds, f.seed));
    KeepBest(read, &local_reopen);
    Progress("  round " + std::to_string(round + 1) + ": serving " + served_text + "local " +
             Fixed(local->gb_s(), 2) + " GB/s (best so far)");
  }
  for (size_t s = 0; s < servings.size(); ++s) {
    GRANARY_RETURN_IF_ERROR(servings[s]->CheckServiceCounters());
    figures.servings.push_back({servings[s]->label(), *best_serving[s]});
  }
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
  app.add_option("--transport", f.transport,
                 "serving's wire: tcp, libfabric, or both (each against the same local reads)")
      ->check(CLI::IsMember({"tcp", "libfabric", "both"}));
  app.add_option("--fabric-provider", f.fabric_provider,
                 "the libfabric provider with --transport libfabric or both (tcp, verbs)");
  app.add_flag("--verify-once", f.verify_once,
               "the node verifies each stored segment once, then sends it with sendfile "
               "(verify_reads: once; docs/cachenode.md, \"Checksums\")");
  app.add_flag("--netns", f.netns,
               "serve from one network namespace to clients in another, over a veth pair "
               "(needs root), instead of over loopback");
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
