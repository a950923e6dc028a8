// granary-slowfs: the benchmark's slow source (BENCHMARK.md, docs/benchmarks.md
// "The slow source"). Mounts a read-only pass-through of SOURCE at MOUNTPOINT
// that charges latency, bandwidth and concurrency like NFS or an object store,
// serves until SIGTERM/SIGINT/SIGHUP, unmounts, and prints its counters.
//
// Exit status: 0 after a clean stop, 1 when mounting or serving fails, 2 for a
// bad command line.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "granary/core/names.h"
#include "slow_fs.h"
#include "slowfs_options.h"

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "granary-slowfs: a read-only FUSE pass-through of SOURCE at MOUNTPOINT that is slow the "
      "way shared storage is: a latency per metadata operation and per read, a bandwidth cap, "
      "a cap on operations in flight, and no kernel caching. Its counters (opens, stats, "
      "readdirs, reads, bytes) are in MOUNTPOINT/.slowfs-stats while it runs and printed at "
      "exit.\n"
      "Exit status: 0 clean stop (SIGTERM/SIGINT/SIGHUP), 1 mount or serving failure, 2 bad "
      "command line."};
  granary::SlowFsOptions options;
  std::string profile_name = "nfs";
  std::optional<double> latency_ms;
  std::optional<double> bandwidth_mb_s;
  std::optional<int64_t> max_concurrency;
  app.add_option("source", options.source, "The directory to serve")->required();
  app.add_option("mountpoint", options.mountpoint, "Where to mount it (an existing directory)")
      ->required();
  app.add_option("--profile", profile_name,
                 "nfs (1 ms, 200 MB/s, 16 in flight), object (20 ms, 100 MB/s, 32) or none "
                 "(no limits); the flags below override its values")
      ->capture_default_str();
  app.add_option("--latency-ms", latency_ms, "Milliseconds per metadata operation and per read");
  app.add_option("--bandwidth-mb-s", bandwidth_mb_s,
                 "Bytes per second of all reads together, in MB/s (10^6 bytes); 0 = unlimited");
  app.add_option("--max-concurrency", max_concurrency,
                 "Operations in flight at once; more wait for a slot; 0 = unlimited");
  app.add_option("--stats-file", options.stats_file,
                 "Write the final counters there as JSON at exit");
  app.add_flag("-d,--debug", options.debug, "libfuse's debug output (every request)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }

  granary::Result<granary::SlowFsProfile> profile = granary::FindSlowFsProfile(profile_name);
  if (!profile.ok()) {
    std::fprintf(stderr, "granary-slowfs: %s\n", profile.status().message().c_str());
    return kExitUsage;
  }
  options.profile = *profile;
  if (latency_ms) options.profile.latency_ms = *latency_ms;
  if (bandwidth_mb_s) options.profile.bandwidth_mb_s = *bandwidth_mb_s;
  if (max_concurrency) {
    if (*max_concurrency < 0 || *max_concurrency > granary::kMaxSlowFsConcurrency) {
      std::fprintf(stderr,
                   "granary-slowfs: --max-concurrency %lld is out of range; give 0 (unlimited) "
                   "to %u\n",
                   static_cast<long long>(*max_concurrency), granary::kMaxSlowFsConcurrency);
      return kExitUsage;
    }
    options.profile.max_concurrency = static_cast<uint32_t>(*max_concurrency);
  }
  if (granary::Status s = granary::ValidateSlowFsOptions(options); !s.ok()) {
    std::fprintf(stderr, "granary-slowfs: %s\n", s.message().c_str());
    return kExitUsage;
  }

  granary::Result<std::unique_ptr<granary::SlowFs>> fs = granary::SlowFs::Open(options);
  if (!fs.ok()) {
    std::fprintf(stderr, "granary-slowfs: %s\n", fs.status().ToString().c_str());
    return kExitRuntime;
  }
  const granary::Status served = (*fs)->Serve();
  const granary::SlowFsCounts c = (*fs)->counts();
  const std::string json = granary::SlowFsCountsJson(c, options.profile);
  std::fprintf(
      stderr,
      "granary-slowfs: served %llu opens, %llu stats, %llu readdirs, %llu reads, %llu "
      "bytes (%llu readlinks, %llu statfs, %llu writes refused, %llu errors, %llu "
      "waits for a slot, peak %u in flight)\ngranary-slowfs: counters %s",
      static_cast<unsigned long long>(c.opens), static_cast<unsigned long long>(c.stats),
      static_cast<unsigned long long>(c.readdirs), static_cast<unsigned long long>(c.reads),
      static_cast<unsigned long long>(c.read_bytes), static_cast<unsigned long long>(c.readlinks),
      static_cast<unsigned long long>(c.statfs), static_cast<unsigned long long>(c.refused_writes),
      static_cast<unsigned long long>(c.errors), static_cast<unsigned long long>(c.waits),
      c.peak_in_flight, json.c_str());
  int status = 0;
  if (!options.stats_file.empty()) {
    std::ofstream out(options.stats_file, std::ios::trunc);
    out << json;
    out.close();
    if (!out) {
      std::fprintf(stderr, "granary-slowfs: writing the counters to %s failed; check the path\n",
                   granary::Quoted(options.stats_file).c_str());
      status = kExitRuntime;
    }
  }
  if (!served.ok()) {
    std::fprintf(stderr, "granary-slowfs: %s\n", served.ToString().c_str());
    return kExitRuntime;
  }
  return status;
}
