#include "timed_run.h"

#include <algorithm>
#include <random>
#include <stop_token>
#include <string>
#include <thread>

namespace granary::cachenode_bench {

Json ToJson(const LoadFigures& r, std::string_view batch_name) {
  Json j;
  j["threads"] = r.workers;
  j["seconds"] = r.seconds;
  j["gb_s"] = r.gb_s();
  j[std::string(batch_name) + "_per_s"] = PerSecond(r.batches, r.seconds);
  j["samples_per_s"] = PerSecond(r.samples, r.seconds);
  j["bytes"] = r.bytes;
  j[std::string(batch_name)] = r.batches;
  j["samples"] = r.samples;
  j["latency_p50_ms"] = r.p50_ms;
  j["latency_p99_ms"] = r.p99_ms;
  j["cpu_seconds"] = r.cpu_seconds;
  j["gb_per_cpu_second"] = r.gb_per_cpu_s();
  return j;
}

Result<LoadFigures> TimedRun(std::vector<BatchFn>& fns, uint32_t batch, uint64_t samples,
                             double seconds, uint64_t seed, const std::function<void()>& on_start) {
  const size_t n = fns.size();
  FirstError error;
  std::atomic<size_t> ready{0};
  std::atomic<bool> go{false};
  Clock::time_point start;
  Clock::time_point end;
  std::vector<std::vector<double>> latencies(n);
  std::vector<uint64_t> batches(n, 0);
  std::vector<uint64_t> bytes(n, 0);
  std::vector<Clock::time_point> last_done(n);
  double cpu0 = 0;
  {
    std::vector<std::jthread> threads;
    for (size_t w = 0; w < n; ++w) {
      threads.emplace_back([&, w](std::stop_token stop) {
        std::mt19937_64 rng(seed * 1000003 + w);
        std::uniform_int_distribution<uint64_t> pick(0, samples - 1);
        std::vector<SampleId> ids(batch);
        auto draw = [&] {
          for (SampleId& id : ids) id = static_cast<SampleId>(pick(rng));
        };
        uint64_t ignored = 0;
        for (int i = 0; i < kWarmupBatches; ++i) {
          draw();
          if (Status s = fns[w](ids, &ignored); !s.ok()) {
            error.Set(std::move(s));
            break;
          }
        }
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) {
          if (error.failed() || Interrupted() || stop.stop_requested()) return;
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        latencies[w].reserve(1 << 16);
        // Not stop_requested: the jthreads' destructors request a stop
        // before joining, and the timed part must run to its end.
        while (!error.failed() && !Interrupted()) {
          if (Clock::now() >= end) break;
          draw();
          const auto t0 = Clock::now();
          if (Status s = fns[w](ids, &bytes[w]); !s.ok()) {
            error.Set(std::move(s));
            return;
          }
          const auto t1 = Clock::now();
          latencies[w].push_back(Seconds(t1 - t0) * 1e3);
          ++batches[w];
          last_done[w] = t1;
        }
      });
    }
    while (ready.load() < n && !error.failed() && !Interrupted()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (on_start) on_start();
    cpu0 = CpuSeconds();
    start = Clock::now();
    end =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    for (auto& t : last_done) t = start;
    go.store(true, std::memory_order_release);
  }  // joins
  if (error.failed()) return error.Take();
  if (Interrupted()) return InterruptedStatus();
  LoadFigures r;
  r.workers = static_cast<uint32_t>(n);
  r.cpu_seconds = CpuSeconds() - cpu0;
  std::vector<double> all;
  for (size_t w = 0; w < n; ++w) {
    r.seconds = std::max(r.seconds, Seconds(last_done[w] - start));
    r.batches += batches[w];
    r.bytes += bytes[w];
    all.insert(all.end(), latencies[w].begin(), latencies[w].end());
  }
  r.samples = r.batches * batch;
  if (all.empty())
    return Status::Internal("no batch completed in " + std::to_string(seconds) + " s");
  std::sort(all.begin(), all.end());
  r.p50_ms = all[all.size() / 2];
  r.p99_ms = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return r;
}

void KeepBest(const LoadFigures& run, std::optional<LoadFigures>* best) {
  if (!best->has_value() || run.gb_s() > (*best)->gb_s()) *best = run;
}

}  // namespace granary::cachenode_bench
