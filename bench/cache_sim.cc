// A dataset larger than its cache, simulated: what each policy reads from the
// source and writes to the cache per epoch when the epochs are the real
// plans (core/plan.h's EpochOrder: fresh shuffles each epoch, global or
// chunkwise), beside the bound no policy can beat. The first piece of the
// eviction work (docs/benchmarks.md, "Larger than the cache").
//
//   build/release/bench/cache_sim [--samples 4000] [--epochs 4]
//       [--fractions 0.25,0.5,0.75,0.9] [--seed 7] [--json FILE]
//
// Items are samples in global plans (each epoch a fresh shuffle of all of
// them, each read once): the setting where the policies differ most. (Chunks
// read through chunkwise windows are not modelled yet: a window reads a chunk
// more than once, and the resident choice must then count windows.) Policies:
//   lru       the chunk read is stored on a miss, evicting the least
//             recently read (what most caches do);
//   resident  a fixed subset of the capacity's size stays, chosen before the
//             first epoch; a miss is read from the source and not stored
//             (Granary's plan: it knows every epoch reads every chunk once).
// The bound: every epoch reads each chunk once, and a cache of C chunks can
// hit at most C of them, so each epoch reads at least (chunks - C) from the
// source; the resident subset meets it. Epoch 0 fills the cache and is not
// counted in the warm figures.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "granary/core/plan.h"

namespace granary {
namespace {

struct Options {
  uint64_t samples = 4000;
  uint32_t epochs = 4;
  std::string fractions = "0.25,0.5,0.75,0.9";
  uint64_t seed = 7;
  std::string json;
};

struct Warm {
  double hit_ratio = 0;     // of chunk reads, warm epochs
  double source_reads = 0;  // chunks read from the source per warm epoch
  double cache_writes = 0;  // chunks written to the cache per warm epoch
};

// The chunk reads of one epoch: consecutive reads of one chunk count once.
std::vector<ChunkId> ChunkReads(const std::vector<SampleId>& order,
                                const std::vector<ChunkId>& chunk_of) {
  std::vector<ChunkId> reads;
  for (SampleId s : order) {
    const ChunkId c = chunk_of[s];
    if (reads.empty() || reads.back() != c) reads.push_back(c);
  }
  return reads;
}

Warm RunLru(const std::vector<std::vector<ChunkId>>& epochs, uint64_t capacity) {
  std::list<ChunkId> recency;  // front: most recent
  std::unordered_map<ChunkId, std::list<ChunkId>::iterator> where;
  Warm w;
  uint64_t reads = 0, hits = 0, writes = 0;
  for (size_t e = 0; e < epochs.size(); ++e) {
    for (ChunkId c : epochs[e]) {
      auto it = where.find(c);
      const bool hit = it != where.end();
      if (hit) {
        recency.erase(it->second);
      } else if (capacity > 0) {
        if (where.size() == capacity) {
          where.erase(recency.back());
          recency.pop_back();
        }
        if (e > 0) ++writes;
      }
      if (capacity > 0) {
        recency.push_front(c);
        where[c] = recency.begin();
      }
      if (e > 0) {
        ++reads;
        hits += hit ? 1 : 0;
      }
    }
  }
  const double warm = static_cast<double>(epochs.size() - 1);
  w.hit_ratio = reads == 0 ? 0 : static_cast<double>(hits) / static_cast<double>(reads);
  w.source_reads = static_cast<double>(reads - hits) / warm;
  w.cache_writes = static_cast<double>(writes) / warm;
  return w;
}

// The subset: the first `capacity` chunks (any fixed subset meets the bound
// when each epoch reads every chunk once).
Warm RunResident(const std::vector<std::vector<ChunkId>>& epochs, uint64_t capacity) {
  uint64_t reads = 0, hits = 0;
  for (size_t e = 1; e < epochs.size(); ++e) {
    for (ChunkId c : epochs[e]) {
      ++reads;
      hits += c < capacity ? 1 : 0;
    }
  }
  const double warm = static_cast<double>(epochs.size() - 1);
  Warm w;
  w.hit_ratio = reads == 0 ? 0 : static_cast<double>(hits) / static_cast<double>(reads);
  w.source_reads = static_cast<double>(reads - hits) / warm;
  w.cache_writes = 0;  // filled once in epoch 0, never churned
  return w;
}

int Run(const Options& o) {
  if (o.epochs < 2) {
    std::fprintf(stderr, "cache_sim: --epochs %u: give at least 2 (epoch 0 fills the cache)\n",
                 o.epochs);
    return 2;
  }
  std::vector<double> fractions;
  std::stringstream list(o.fractions);
  for (std::string item; std::getline(list, item, ',');) {
    char* end = nullptr;
    const double f = std::strtod(item.c_str(), &end);
    if (item.empty() || end == nullptr || *end != '\0' || !(f >= 0 && f <= 1)) {
      std::fprintf(stderr,
                   "cache_sim: --fractions: '%s' is not a fraction from 0 to 1; write e.g. "
                   "0.25,0.5\n",
                   item.c_str());
      return 2;
    }
    fractions.push_back(f);
  }
  PlanSpec spec;
  spec.seed = o.seed;
  spec.mode = PlanMode::kGlobal;
  std::vector<ChunkId> chunk_of(o.samples);
  for (uint64_t s = 0; s < o.samples; ++s) chunk_of[s] = static_cast<ChunkId>(s);
  const uint64_t chunks = o.samples == 0 ? 0 : chunk_of.back() + 1;
  std::vector<std::vector<ChunkId>> epochs;
  for (uint32_t e = 0; e < o.epochs; ++e) {
    spec.epoch = e;
    Result<std::vector<SampleId>> order = EpochOrder(chunk_of, spec);
    if (!order.ok()) {
      std::fprintf(stderr, "cache_sim: %s\n", order.status().ToString().c_str());
      return 1;
    }
    epochs.push_back(ChunkReads(*order, chunk_of));
  }
  const double per_epoch = static_cast<double>(epochs[1].size());
  std::printf(
      "%llu samples, global plans, %u epochs (epoch 0 fills the cache); per warm epoch, as "
      "fractions of the reads (%.0f):\n",
      static_cast<unsigned long long>(o.samples), o.epochs, per_epoch);
  std::printf("%-8s  %-22s  %-22s  %-20s\n", "cache", "hit ratio lru/resident",
              "source lru/resident/bound", "cache writes lru/resident");
  nlohmann::json rows = nlohmann::json::array();
  for (double f : fractions) {
    const auto capacity = static_cast<uint64_t>(f * static_cast<double>(chunks));
    const Warm lru = RunLru(epochs, capacity);
    const Warm resident = RunResident(epochs, capacity);
    const double bound = static_cast<double>(chunks - capacity);
    std::printf("%6.0f%%   %6.2f / %-13.2f  %5.2f / %5.2f / %-8.2f  %5.2f / %.2f\n", 100 * f,
                lru.hit_ratio, resident.hit_ratio, lru.source_reads / per_epoch,
                resident.source_reads / per_epoch, bound / per_epoch, lru.cache_writes / per_epoch,
                resident.cache_writes / per_epoch);
    rows.push_back({{"cache_fraction", f},
                    {"capacity_chunks", capacity},
                    {"lru",
                     {{"hit_ratio", lru.hit_ratio},
                      {"source_chunks_per_epoch", lru.source_reads},
                      {"cache_writes_per_epoch", lru.cache_writes}}},
                    {"resident",
                     {{"hit_ratio", resident.hit_ratio},
                      {"source_chunks_per_epoch", resident.source_reads},
                      {"cache_writes_per_epoch", resident.cache_writes}}},
                    {"bound_source_chunks_per_epoch", bound}});
  }
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << nlohmann::json{{"samples", o.samples},
                          {"mode", "global"},
                          {"epochs", o.epochs},
                          {"rows", rows}}
               .dump(2)
        << "\n";
    if (!out) {
      std::fprintf(stderr, "cache_sim: cannot write %s\n", o.json.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace granary

int main(int argc, char** argv) {
  granary::Options o;
  CLI::App app(
      "A dataset larger than its cache, simulated over the real plans: LRU against a "
      "resident subset, beside the bound");
  app.add_option("--samples", o.samples, "samples in the dataset")
      ->check(CLI::Range(uint64_t{1}, uint64_t{100'000'000}));
  app.add_option("--epochs", o.epochs, "epochs, the first filling the cache")
      ->check(CLI::Range(2u, 1000u));
  app.add_option("--fractions", o.fractions, "cache sizes as fractions of the dataset");
  app.add_option("--seed", o.seed, "the plans' seed");
  app.add_option("--json", o.json, "also write the figures to this file");
  CLI11_PARSE(app, argc, argv);
  return granary::Run(o);
}
