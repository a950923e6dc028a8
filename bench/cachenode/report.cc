#include "report.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "granary/core/file.h"

namespace granary::cachenode_bench {
namespace {

void PrintRate(const std::string& what, const RateFigures& r) {
  char cached[32] = "";
  if (r.resident_before >= 0) {
    std::snprintf(cached, sizeof(cached), "%.1f%%", 100 * r.resident_before);
  }
  std::printf("  %-44s %8.2f %9.0f %9.0f %7.2f %8.2f %8s\n", what.c_str(), r.seconds, r.mb_s(),
              r.files_s(), r.cpu_seconds, r.cpu_s_per_gb(), cached);
}

void PrintLoad(const std::string& what, const LoadFigures& r) {
  std::printf("  %-44s %8.2f %6.2f %9.0f %9.0f %7.2f %7.2f %7.2f %8.2f\n", what.c_str(), r.seconds,
              r.gb_s(), PerSecond(r.batches, r.seconds), PerSecond(r.samples, r.seconds), r.p50_ms,
              r.p99_ms, r.cpu_seconds, r.gb_per_cpu_s());
}

}  // namespace

Status Report(const Flags& f, const BenchSetup& setup, const BenchFigures& figures) {
  const RateFigures& source_cold = figures.source.cold;
  const RateFigures& source_warm = figures.source.warm;
  const RateFigures& staging_cold = figures.staging.cold;
  const RateFigures& staging_warm = figures.staging.warm;
  const RateFigures& disk_write = figures.staging.disk_write;
  // The first transport's figures are the headline ("serving" in the JSON).
  const LoadFigures* serving = &figures.servings.front().second;
  const LoadFigures* local = &figures.local;
  const LoadFigures* local_reopen = &figures.local_reopen;
  const std::shared_ptr<const Manifest>& manifest = setup.manifest;
  const uint64_t dataset_bytes = setup.dataset_bytes;
  const uint64_t verified = figures.verified_bytes;
  const double staging_ratio_cold = staging_cold.mb_s() / source_cold.mb_s();
  const double staging_ratio_warm = staging_warm.mb_s() / source_warm.mb_s();
  const double serving_ratio = serving->gb_s() / local->gb_s();
  const double serving_ratio_reopen = serving->gb_s() / local_reopen->gb_s();
  const double serving_ratio_cpu = serving->gb_per_cpu_s() / local->gb_per_cpu_s();
  // What bounds staging: the lesser of the source's read speed and the store
  // disk's write speed (the staging target is 0.9 of it), or, when both are
  // one device (a source tree and a store in the same file system, as by
  // default here), the two one after the other.
  const double lesser_cold = std::min(source_cold.mb_s(), disk_write.mb_s());
  const double shared_cold = 1 / (1 / source_cold.mb_s() + 1 / disk_write.mb_s());
  std::printf("\n  %-44s %8s %9s %9s %7s %8s %8s\n", "(a) staging vs source", "seconds", "MB/s",
              "files/s", "cpu-s", "cpu-s/GB", "cached");
  PrintRate("source read, cold (" + std::to_string(f.threads) + " threads)", source_cold);
  PrintRate("staging, cold (" + std::to_string(f.threads) + " threads)", staging_cold);
  PrintRate("source read, warm", source_warm);
  PrintRate("staging, warm", staging_warm);
  PrintRate("store disk write (reference)", disk_write);
  std::printf("\n  %-44s %8s %6s %9s %9s %7s %7s %7s %8s\n", "(b) serving vs local", "seconds",
              "GB/s", "batch/s", "samples/s", "p50 ms", "p99 ms", "cpu-s", "GB/cpu-s");
  for (const auto& [label, figures_of] : figures.servings) {
    PrintLoad(
        "serving " + label + " (" + std::to_string(f.clients) + "x" + std::to_string(f.batch) + ")",
        figures_of);
  }
  PrintLoad("local chunk reads (" + std::to_string(f.clients) + " threads)", *local);
  PrintLoad("local, chunks opened per batch", *local_reopen);
  std::printf(
      "\n  ratios: staging/source cold %.2f, warm %.2f; serving/local %.2f (%.2f against chunks "
      "opened per batch; %.2f per CPU-second)\n",
      staging_ratio_cold, staging_ratio_warm, serving_ratio, serving_ratio_reopen,
      serving_ratio_cpu);
  std::printf(
      "  staging cold / the lesser of source read and store disk write %.2f (%.2f if they are one "
      "device: read and write one after the other); %.2f CPU-s per GB staged\n",
      staging_cold.mb_s() / lesser_cold, staging_cold.mb_s() / shared_cold,
      staging_cold.cpu_s_per_gb());
  for (const auto& [label, figures_of] : figures.servings) {
    std::printf("  serving %s: %.2f of local, %.2f per CPU-second\n", label.c_str(),
                figures_of.gb_s() / local->gb_s(),
                figures_of.gb_per_cpu_s() / local->gb_per_cpu_s());
  }

  if (!f.json.empty()) {
    Json j;
    j["dataset"] = {{"files", f.files},
                    {"bytes", dataset_bytes},
                    {"file_bytes", f.size},
                    {"chunks", manifest->chunk_count()},
                    {"chunk_size", manifest->chunk_size()}};
    j["machine"] = {{"cpus", std::thread::hardware_concurrency()}};
    j["source"] = {{"driver", "posix"},
                   {"threads", f.threads},
                   {"cold", ToJson(source_cold)},
                   {"warm", ToJson(source_warm)}};
    Json cold = ToJson(staging_cold);
    cold["ratio_to_source"] = staging_ratio_cold;
    Json warm = ToJson(staging_warm);
    warm["ratio_to_source"] = staging_ratio_warm;
    j["staging"] = {{"threads", f.threads},
                    {"cold", cold},
                    {"warm", warm},
                    {"store_disk_write", ToJson(disk_write)}};
    Json serving_json = ToJson(*serving, "reads");
    serving_json["batch"] = f.batch;
    serving_json["io_threads"] = f.io_threads;
    serving_json["service_threads"] = f.service_threads;
    serving_json["repeat"] = f.repeat;
    serving_json["tls"] = f.tls;
    serving_json["transport"] = figures.servings.front().first;
    j["serving"] = serving_json;
    Json by_transport = Json::array();
    for (const auto& [label, figures_of] : figures.servings) {
      Json one = ToJson(figures_of, "reads");
      one["label"] = label;
      one["vs_local"] = figures_of.gb_s() / local->gb_s();
      one["vs_local_per_cpu_second"] = figures_of.gb_per_cpu_s() / local->gb_per_cpu_s();
      by_transport.push_back(one);
    }
    j["serving_by_transport"] = by_transport;
    j["netns"] = f.netns;
    j["verify_once"] = f.verify_once;
    Json local_json = ToJson(*local, "batches");
    local_json["batch"] = f.batch;
    j["local"] = local_json;
    Json reopen_json = ToJson(*local_reopen, "batches");
    reopen_json["batch"] = f.batch;
    j["local_reopen"] = reopen_json;
    j["ratios"] = {{"staging_vs_source_cold", staging_ratio_cold},
                   {"staging_vs_lesser_of_source_and_disk_cold", staging_cold.mb_s() / lesser_cold},
                   {"staging_vs_shared_device_cold", staging_cold.mb_s() / shared_cold},
                   {"staging_vs_source_warm", staging_ratio_warm},
                   {"serving_vs_local", serving_ratio},
                   {"serving_vs_local_reopen", serving_ratio_reopen},
                   {"serving_vs_local_per_cpu_second", serving_ratio_cpu}};
    j["verified"] = {{"bytes_compared", verified},
                     {"samples_compared", manifest->sample_count()},
                     {"timed_items_checked", serving->samples}};
    std::ofstream out(f.json);
    out << j.dump(2) << "\n";
    out.close();
    if (!out) return Status::IoError("writing " + f.json + ": " + ErrnoText(errno));
  }
  return Status::Ok();
}

}  // namespace granary::cachenode_bench
