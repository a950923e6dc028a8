// granary-operator-load: what granary-operator asks of the API server with
// many Datasets, measured on a real control plane (not a test: it asserts
// nothing about speed; it prints figures).
//
//   build/debug/tests/integration/kubernetes/granary-operator-load
//       [--datasets 100] [--namespaces 10] [--nodes 0] [--pools 1] [--seconds 60]
//       [--json FILE]
//
// KubeSuite brings up the control plane, Redis, PodRunner (the pool's cache
// node as a local process) and granary-operator, with the example pool Ready,
// plus `--nodes` fake nodes kwok keeps Ready. With `--pools P` > 1 it also
// applies P - 1 CachePools (load-1 ...), each over its share of the fake nodes
// (label granary.io/load-pool), whose cache-node pods kwok fakes: their
// Datasets get a status but never a snapshot (no cache node runs there).
// The program then makes `--namespaces` namespaces granted uid and gid 1000,
// applies `--datasets` Datasets spread over them and over the pools (all of
// one small source), and reports, from the operator's own counter of its
// requests (granary_operator_api_requests_total, by verb and resource):
//   - the time from `kubectl apply` until every Dataset has a status phase
//     (the first status) and until every Dataset of the real pool is Ready;
//   - the requests made while they became Ready;
//   - the requests per minute over `--seconds` once every Dataset is Ready
//     (the steady state an idle cluster pays for);
//   - the operator's CPU seconds and peak RSS (/proc) over the whole run.
// With --json FILE the same figures as JSON. Needs root (PodRunner) and the
// tools of scripts/k8s-tools. Exit 0 with figures, 1 on a failure.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/kube_cluster.h"
#include "testing/kube_suite.h"

namespace granary::testing {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using Counts = std::map<std::string, double>;  // "verb resource" -> requests

struct Args {
  int datasets = 100;
  int namespaces = 10;
  int nodes = 0;
  int pools = 1;
  int seconds = 60;
  std::string json_path;
};

// Seconds since the epoch of an RFC 3339 time the API server writes
// ("2026-12-02T08:26:14Z"); -1 if it is not one.
double ApiTime(const std::string& text) {
  std::tm tm{};
  const char* end = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (end == nullptr) return -1;
  return static_cast<double>(timegm(&tm));
}

// For each Dataset, the seconds from its creation (metadata.creationTimestamp)
// to its first status (the earliest lastTransitionTime of its conditions),
// sorted; whole seconds, as the API server keeps them.
std::vector<double> FirstStatusLatencies(const json& list) {
  std::vector<double> out;
  for (const json& d : list.value("items", json::array())) {
    const double created = ApiTime(d["metadata"].value("creationTimestamp", ""));
    double first = -1;
    for (const json& c : d.value("status", json::object()).value("conditions", json::array())) {
      const double t = ApiTime(c.value("lastTransitionTime", ""));
      if (t >= 0 && (first < 0 || t < first)) first = t;
    }
    if (created >= 0 && first >= 0) out.push_back(first - created);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The pool of Dataset `d`: the example pool for every P-th, load-k else.
std::string PoolOf(int d, int pools) {
  const int k = d % pools;
  return k == 0 ? std::string("gpu") : "load-" + std::to_string(k);
}

// /proc files report no size: read them as a stream.
std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The operator's own count of its requests, by "verb resource".
Result<Counts> ApiRequests(const DaemonProcess& op) {
  GRANARY_ASSIGN_OR_RETURN(std::vector<MetricSample> samples, KubeSuite::OperatorMetrics(op));
  Counts counts;
  for (const MetricSample& m : samples) {
    if (m.name != "granary_operator_api_requests_total") continue;
    counts[m.labels.at("verb") + " " + m.labels.at("resource")] += m.value;
  }
  return counts;
}

Counts Minus(const Counts& a, const Counts& b) {
  Counts d;
  for (const auto& [k, v] : a) {
    const double delta = v - (b.count(k) != 0 ? b.at(k) : 0.0);
    if (delta > 0) d[k] = delta;
  }
  return d;
}

double Sum(const Counts& c) {
  double n = 0;
  for (const auto& [k, v] : c) n += v;
  return n;
}

// The operator process's CPU seconds (utime + stime) and peak RSS in MiB.
std::pair<double, double> CpuAndPeakRss(pid_t pid) {
  std::istringstream stat(ReadFile("/proc/" + std::to_string(pid) + "/stat"));
  std::string field;
  std::vector<std::string> fields;
  while (stat >> field) fields.push_back(field);
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  double cpu = 0;
  if (fields.size() > 15) cpu = (std::stod(fields[13]) + std::stod(fields[14])) / ticks;
  double rss = 0;
  std::istringstream status(ReadFile("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) rss = std::stod(line.substr(6)) / 1024.0;
  }
  return {cpu, rss};
}

void Print(const std::string& title, const Counts& c, double scale, const char* unit) {
  std::printf("%s: %.0f %s\n", title.c_str(), Sum(c) * scale, unit);
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [k, v] : c) rows.push_back({v * scale, k});
  std::sort(rows.rbegin(), rows.rend());
  for (const auto& [v, k] : rows) std::printf("  %-40s %8.1f\n", k.c_str(), v);
}

json ToJson(const Counts& c, double scale) {
  json j = json::object();
  for (const auto& [k, v] : c) j[k] = v * scale;
  return j;
}

int Run(const Args& args) {
  KubeSuiteOptions o;
  o.source_dir = GRANARY_SOURCE_DIR;
  o.pod_bin_dir = GRANARY_POD_BIN_DIR;
  o.operator_binary = GRANARY_OPERATOR_BINARY;
  for (int i = 0; i < args.nodes; ++i) {
    FakeNode node{"load-node-" + std::to_string(i), {{"nvidia.com/gpu.present", "true"}}};
    if (args.pools > 1)
      node.labels["granary.io/load-pool"] = std::to_string(1 + i % (args.pools - 1));
    o.extra_nodes.push_back(std::move(node));
  }
  // kwok makes fake nodes Ready at a bounded rate: a few hundred a minute here.
  o.cluster_start_timeout = std::chrono::milliseconds(120'000 + 500 * args.nodes);
  KubeSuite suite(o);
  std::cerr << "starting the control plane, Redis, the cache node and the operator...\n";
  if (Status s = suite.Start(); !s.ok()) {
    std::cerr << "granary-operator-load: " << s.ToString() << "\n" << suite.OperatorLogs();
    return 1;
  }
  const DaemonProcess& op = *suite.operators().front();
  std::vector<std::pair<std::string, std::string>> files;
  for (int i = 0; i < 8; ++i)
    files.push_back({"f" + std::to_string(i), std::string(4096, static_cast<char>('a' + i))});
  suite.WriteSource("load", files);

  // The other pools, each over its share of the fake nodes.
  std::string pools_yaml;
  const std::string example =
      ReadAll(std::string(GRANARY_SOURCE_DIR) + "/examples/kubernetes/cachepool.yaml");
  for (int k = 1; k < args.pools; ++k) {
    std::string pool =
        ReplaceAll(example, "  name: gpu\n", "  name: load-" + std::to_string(k) + "\n");
    pool = ReplaceAll(pool, "granary.io/nvme: \"true\"",
                      "granary.io/load-pool: \"" + std::to_string(k) + "\"");
    pool = ReplaceAll(pool, "/var/run/granary/gpu", "/var/run/granary/load-" + std::to_string(k));
    pools_yaml += pool + "\n---\n";
  }
  if (!pools_yaml.empty()) {
    KubectlResult applied_pools = suite.cluster().Kubectl({"apply", "-f", "-"}, pools_yaml);
    if (!applied_pools.ok()) {
      std::cerr << "granary-operator-load: applying the pools: " << applied_pools.Describe()
                << "\n";
      return 1;
    }
  }

  std::string namespaces_yaml;
  for (int n = 0; n < args.namespaces; ++n) {
    namespaces_yaml += "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: load-" +
                       std::to_string(n) +
                       "\n  annotations:\n    granary.io/allowed-uids: \"1000\"\n"
                       "    granary.io/allowed-gids: \"1000\"\n---\n";
  }
  if (KubectlResult r = suite.cluster().Kubectl({"apply", "-f", "-"}, namespaces_yaml); !r.ok()) {
    std::cerr << "granary-operator-load: applying the namespaces: " << r.Describe() << "\n";
    return 1;
  }
  // The Datasets in batches of 100 (one kubectl each, so none runs into
  // kubectl's time limit on a loaded machine); the clock starts at the first.
  std::vector<std::string> batches;
  int in_real_pool = 0;
  for (int d = 0; d < args.datasets; ++d) {
    in_real_pool += PoolOf(d, args.pools) == "gpu";
    if (d % 100 == 0) batches.emplace_back();
    batches.back() +=
        ReplaceAll(KubeSuite::DatasetYaml("load-" + std::to_string(d % args.namespaces),
                                          "d" + std::to_string(d), suite.datasets() + "/load"),
                   "cachePool: gpu", "cachePool: " + PoolOf(d, args.pools)) +
        "---\n";
  }
  Result<Counts> before = ApiRequests(op);
  if (!before.ok()) {
    std::cerr << "granary-operator-load: " << before.status().ToString() << "\n";
    return 1;
  }
  const auto applied = Clock::now();
  for (const std::string& batch : batches) {
    KubectlResult r = suite.cluster().Kubectl({"apply", "-f", "-"}, batch);
    if (!r.ok()) {
      std::cerr << "granary-operator-load: kubectl apply: " << r.Describe() << "\n";
      return 1;
    }
  }
  const double apply_s = std::chrono::duration<double>(Clock::now() - applied).count();
  double first_status_s = -1, ready_s = -1;
  std::vector<double> latencies;
  const auto deadline = applied + std::chrono::seconds(120 + args.datasets);
  while (Clock::now() < deadline) {
    Result<json> list = suite.cluster().GetJson({"datasets", "-A"});
    int with_status = 0, ready = 0;
    if (list.ok()) {
      for (const json& d : (*list)["items"]) {
        const json status = d.value("status", json::object());
        if (status.contains("phase")) ++with_status;
        if (status.value("phase", "") == "Ready") ++ready;
      }
    }
    const double t = std::chrono::duration<double>(Clock::now() - applied).count();
    if (first_status_s < 0 && with_status == args.datasets) {
      first_status_s = t;
      latencies = FirstStatusLatencies(*list);
    }
    if (ready == in_real_pool && first_status_s >= 0) {
      ready_s = t;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (ready_s < 0) {
    std::cerr << "granary-operator-load: not every Dataset had a status, or those of pool gpu "
                 "were not Ready, within the deadline\n"
              << suite.OperatorLogs();
    return 1;
  }
  Result<Counts> at_ready = ApiRequests(op);
  std::this_thread::sleep_for(std::chrono::seconds(args.seconds));
  Result<Counts> after = ApiRequests(op);
  if (!at_ready.ok() || !after.ok()) {
    std::cerr << "granary-operator-load: the operator's metrics could not be read\n";
    return 1;
  }
  // The Events the operator recorded, by reason (what its writes were about).
  std::map<std::string, int> reasons;
  if (Result<json> events = suite.cluster().GetJson({"events", "-A"}); events.ok()) {
    for (const json& e : (*events)["items"]) ++reasons[e.value("reason", "?")];
  }
  const auto [cpu, rss] = CpuAndPeakRss(op.pid());
  const Counts ramp = Minus(*at_ready, *before);
  const Counts steady = Minus(*after, *at_ready);
  const double per_minute = 60.0 / args.seconds;
  std::printf(
      "%d Datasets in %d namespaces and %d pools, %d more fake nodes: applied in %.1f s, every "
      "one with a status %.1f s after the first kubectl apply, the %d of the pool with a cache "
      "node Ready after %.1f s\n",
      args.datasets, args.namespaces, args.pools, args.nodes, apply_s, first_status_s, in_real_pool,
      ready_s);
  const double median = latencies.empty() ? -1 : latencies[latencies.size() / 2];
  const double worst = latencies.empty() ? -1 : latencies.back();
  std::printf(
      "from each Dataset's creation to its first status (whole seconds, %zu Datasets): median "
      "%.0f s, longest %.0f s\n",
      latencies.size(), median, worst);
  Print("requests until every Dataset was Ready", ramp, 1.0, "requests");
  Print("requests per minute once every Dataset is Ready (over " + std::to_string(args.seconds) +
            " s)",
        steady, per_minute, "per minute");
  std::printf("operator: %.1f CPU seconds in all, peak RSS %.1f MiB\n", cpu, rss);
  std::printf("Events by reason:");
  for (const auto& [reason, n] : reasons) std::printf(" %s %d", reason.c_str(), n);
  std::printf("\n");
  if (!args.json_path.empty()) {
    json j = {{"datasets", args.datasets},
              {"namespaces", args.namespaces},
              {"pools", args.pools},
              {"extra_nodes", args.nodes},
              {"apply_seconds", apply_s},
              {"first_status_seconds", first_status_s},
              {"creation_to_first_status_median_seconds", median},
              {"creation_to_first_status_longest_seconds", worst},
              {"ready_seconds", ready_s},
              {"ramp_requests", ToJson(ramp, 1.0)},
              {"steady_requests_per_minute", ToJson(steady, per_minute)},
              {"steady_total_per_minute", Sum(steady) * per_minute},
              {"operator_cpu_seconds", cpu},
              {"operator_peak_rss_mib", rss}};
    std::ofstream(args.json_path) << j.dump(2) << "\n";
  }
  return 0;
}

int Main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    auto number = [&](int* out) {
      if (!has_value) return false;
      try {
        *out = std::stoi(argv[++i]);
      } catch (...) {
        return false;
      }
      return *out > 0;
    };
    bool ok = true;
    if (a == "--datasets") {
      ok = number(&args.datasets);
    } else if (a == "--namespaces") {
      ok = number(&args.namespaces);
    } else if (a == "--nodes") {
      ok = number(&args.nodes);
    } else if (a == "--pools") {
      ok = number(&args.pools);
    } else if (a == "--seconds") {
      ok = number(&args.seconds);
    } else if (a == "--json" && has_value) {
      args.json_path = argv[++i];
    } else {
      ok = false;
    }
    if (!ok) {
      std::cerr << "granary-operator-load: bad argument " << a
                << "; usage: granary-operator-load [--datasets N] [--namespaces N] [--nodes N] "
                   "[--pools N] [--seconds N] [--json FILE] (N a positive integer)\n";
      return 2;
    }
  }
  if (geteuid() != 0) {
    std::cerr << "granary-operator-load: run as root (PodRunner runs the cache node's pod)\n";
    return 1;
  }
  return Run(args);
}

}  // namespace
}  // namespace granary::testing

int main(int argc, char** argv) { return granary::testing::Main(argc, argv); }
