// Manifest figures at ImageNet scale: build (sort + pack + hash), encode, load
// (decode from bytes and from a file), path-index build, memory per sample, and
// a parallel walk of a real tree. Prints a table; --json writes the same figures.
//
//   build/release/bench/manifest_bench [--samples 1281167] [--walk-files 50000]
//                                      [--walk-threads 8] [--repeat 5] [--json FILE]

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "granary/core/file.h"
#include "granary/core/manifest.h"
#include "granary/core/manifest_builder.h"
#include "process_rss.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// ImageNet's train split: 1000 class folders "nXXXXXXXX", files
// "nXXXXXXXX_NNNN.JPEG", sizes log-normal around 110 KiB.
std::vector<granary::FileEntry> ImageNetLike(size_t samples) {
  std::mt19937_64 rng(1234);
  std::lognormal_distribution<double> size_dist(std::log(110.0 * 1024) - 0.5 * 0.6 * 0.6, 0.6);
  const size_t classes = 1000;
  std::vector<granary::FileEntry> entries;
  entries.reserve(samples);
  for (size_t i = 0; i < samples; ++i) {
    size_t cls = i % classes;
    char dir[16];
    std::snprintf(dir, sizeof(dir), "n%08zu", 1440764 + cls * 9973);
    std::string path =
        std::string(dir) + "/" + dir + "_" + std::to_string(i / classes + 1) + ".JPEG";
    auto size = static_cast<uint64_t>(std::max(1.0, size_dist(rng)));
    entries.push_back({std::move(path), size, 1'600'000'000'000'000'000 + static_cast<int64_t>(i)});
  }
  return entries;
}

template <typename F>
double BestOf(int repeat, F&& f) {
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    auto t0 = Clock::now();
    f();
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Granary manifest benchmark"};
  size_t samples = 1'281'167;
  size_t walk_files = 50'000;
  unsigned walk_threads = 8;
  int repeat = 5;
  std::string json_path;
  app.add_option("--samples", samples, "samples in the synthetic manifest")
      ->check(CLI::Range(1, 100'000'000));
  app.add_option("--walk-files", walk_files, "files in the real tree walked (0 skips the walk)");
  app.add_option("--walk-threads", walk_threads, "walker threads")->check(CLI::Range(1, 256));
  app.add_option("--repeat", repeat, "repetitions; the best time is reported")
      ->check(CLI::Range(1, 100));
  app.add_option("--json", json_path, "also write the figures as JSON to this file");
  std::string measure_load;
  app.add_option("--measure-load", measure_load, "(internal) print RSS growth of loading FILE")
      ->group("");
  CLI11_PARSE(app, argc, argv);

  if (!measure_load.empty()) {
    size_t before = granary::bench::ProcessRssBytes();
    auto m = granary::Manifest::Load(measure_load);
    size_t after = granary::bench::ProcessRssBytes();
    if (!m.ok()) return 1;
    std::printf("%zu\n", after > before ? after - before : 0);
    return 0;
  }

  std::printf("manifest_bench: %zu ImageNet-like samples, best of %d\n", samples, repeat);
  auto entries = ImageNetLike(samples);
  granary::ManifestHeaderInfo header;
  header.source_uri = "file:///datasets/imagenet/train";

  auto t0 = Clock::now();
  auto built = granary::Manifest::FromEntries(header, entries);
  double build_s = Seconds(t0, Clock::now());
  if (!built.ok()) {
    std::fprintf(stderr, "build failed: %s\n", built.status().ToString().c_str());
    return 1;
  }
  std::string bytes;
  double encode_s = BestOf(repeat, [&] { bytes = built->Encode(); });
  std::vector<granary::FileEntry>().swap(entries);

  granary::Manifest loaded;
  double decode_s = BestOf(repeat, [&] {
    auto m = granary::Manifest::Decode(bytes);
    if (!m.ok()) std::abort();
    loaded = std::move(*m);
  });
  size_t mem_no_index = loaded.MemoryBytes();

  t0 = Clock::now();
  auto first = loaded.Find(loaded.PathOf(static_cast<granary::SampleId>(samples / 2)));
  double index_s = Seconds(t0, Clock::now());
  if (!first.ok()) return 1;
  size_t mem_index = loaded.MemoryBytes();

  // Lookups by path, after the index exists.
  std::vector<std::string> probe;
  for (size_t i = 0; i < 100'000; ++i) {
    probe.push_back(loaded.PathOf(static_cast<granary::SampleId>((i * 7919) % samples)));
  }
  t0 = Clock::now();
  for (const auto& p : probe) {
    if (!loaded.Find(p).ok()) return 1;
  }
  double find_ns = Seconds(t0, Clock::now()) * 1e9 / static_cast<double>(probe.size());

  std::string tmp = "/tmp/granary-manifest-bench-" + std::to_string(::getpid());
  std::filesystem::create_directories(tmp);
  if (!granary::WriteFileAtomically(tmp + "/m.grm", bytes).ok()) return 1;
  double load_file_s = BestOf(repeat, [&] {
    if (!granary::Manifest::Load(tmp + "/m.grm").ok()) std::abort();
  });

  // Resident memory a fresh process gains by loading the manifest file: this
  // program re-executed with --measure-load, so no freed heap is reused.
  double rss_per_sample = -1;
  {
    std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    std::string cmd = self + " --measure-load " + tmp + "/m.grm";
    FILE* p = ::popen(cmd.c_str(), "r");
    unsigned long long grown = 0;
    if (p != nullptr && std::fscanf(p, "%llu", &grown) == 1) {
      rss_per_sample = static_cast<double>(grown) / static_cast<double>(samples);
    }
    if (p != nullptr) ::pclose(p);
  }

  double walk_s = 0;
  size_t walked = 0;
  if (walk_files > 0) {
    std::string root = tmp + "/tree";
    for (size_t i = 0; i < walk_files; ++i) {
      std::string dir = root + "/c" + std::to_string(i % 1000);
      if (i < 1000) std::filesystem::create_directories(dir);
      std::ofstream(dir + "/f" + std::to_string(i) + ".JPEG").put('x');
    }
    granary::ManifestBuildOptions o;
    o.source_root = root;
    o.threads = walk_threads;
    walk_s = BestOf(1, [&] {
      auto m = granary::BuildManifest(o);
      if (!m.ok()) std::abort();
      walked = m->sample_count();
    });
  }
  std::filesystem::remove_all(tmp);

  double n = static_cast<double>(samples);
  std::printf("\n%-40s %14s\n", "figure", "value");
  std::printf("%-40s %14.3f\n", "build from entries (s)", build_s);
  std::printf("%-40s %14.3f\n", "encode (s)", encode_s);
  std::printf("%-40s %14.3f\n", "load: decode from memory (s)", decode_s);
  std::printf("%-40s %14.3f\n", "load: from file (s)", load_file_s);
  std::printf("%-40s %14.3f\n", "path index, first Find (s)", index_s);
  std::printf("%-40s %14.1f\n", "Find by path (ns)", find_ns);
  std::printf("%-40s %14.1f\n", "encoded bytes per sample", static_cast<double>(bytes.size()) / n);
  std::printf("%-40s %14.1f\n", "memory bytes/sample (no path index)",
              static_cast<double>(mem_no_index) / n);
  std::printf("%-40s %14.1f\n", "memory bytes/sample (with path index)",
              static_cast<double>(mem_index) / n);
  std::printf("%-40s %14.1f\n", "RSS of a fresh load, bytes/sample", rss_per_sample);
  if (walk_files > 0) {
    std::printf("%-40s %14.3f\n", "walk of real tree (s)", walk_s);
    std::printf("%-40s %14.0f\n", "walk rate (files/s)", static_cast<double>(walked) / walk_s);
  }

  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\"samples\": " << samples << ", \"build_seconds\": " << build_s
        << ", \"encode_seconds\": " << encode_s << ", \"decode_seconds\": " << decode_s
        << ", \"load_file_seconds\": " << load_file_s << ", \"index_seconds\": " << index_s
        << ", \"find_ns\": " << find_ns
        << ", \"encoded_bytes_per_sample\": " << static_cast<double>(bytes.size()) / n
        << ", \"memory_bytes_per_sample\": " << static_cast<double>(mem_no_index) / n
        << ", \"memory_bytes_per_sample_with_index\": " << static_cast<double>(mem_index) / n
        << ", \"rss_bytes_per_sample\": " << rss_per_sample << ", \"walk_files\": " << walked
        << ", \"walk_seconds\": " << walk_s << "}\n";
  }
  return 0;
}
