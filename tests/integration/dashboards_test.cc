// Every panel of Granary's Grafana dashboards answers from real data: a real
// Prometheus (Debian's /usr/bin/prometheus, scrape_interval 1s) scrapes two
// real granary-cachenode processes and a real granary-sidecar
// (cachenode_fixture.h, sidecar_fixture.h) while a dataset stages and a
// trainer reads three epochs through the sidecar (libgranary-client, a plan
// and NEXT, so the sidecar prefetches). Then each panel's query from
// charts/granary/dashboards/*.json, its template variables filled in with
// this run's values, goes through Prometheus' HTTP API and must answer with
// at least one series.
//
// With GRANARY_DASHBOARD_RESULTS=<file> set, the overview's queries are also
// evaluated over the whole run (query_range, 1s steps) and written there as
// JSON for dashboards/render.py, which draws docs/images/overview.png.
//
// Prometheus runs under a DaemonProcess (killed and reaped with the test, also
// on failure) with its config and TSDB in the cluster's TempDir (removed).

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "granary/client/sampler_plan.h"
#include "granary/client/session.h"
#include "granary/core/manifest_builder.h"
#include "testing/cachenode_fixture.h"
#include "testing/daemon_process.h"
#include "testing/sidecar_fixture.h"
#include "testing/slowfs_mount.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr char kPrometheus[] = "/usr/bin/prometheus";
// What Grafana would put for $__rate_interval at a 1s scrape interval (4 ×
// scrape interval), and for $__range (a window holding the whole run).
constexpr char kRateInterval[] = "5s";
constexpr char kRange[] = "10m";

std::string UrlEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A real Prometheus on 127.0.0.1 scraping the given jobs every second.
class PrometheusServer {
 public:
  // jobs: job name -> "host:port" targets.
  static Result<std::unique_ptr<PrometheusServer>> Start(
      const std::string& dir, const std::map<std::string, std::vector<std::string>>& jobs) {
    auto p = std::unique_ptr<PrometheusServer>(new PrometheusServer);
    std::filesystem::create_directories(dir + "/data");
    std::string config =
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n"
        "scrape_configs:\n";
    for (const auto& [job, targets] : jobs) {
      config += "  - job_name: " + job + "\n    static_configs:\n      - targets: [";
      for (size_t i = 0; i < targets.size(); ++i) config += (i ? ", '" : "'") + targets[i] + "'";
      config += "]\n";
    }
    WriteAll(dir + "/prometheus.yml", config);
    for (int attempt = 0; attempt < 3; ++attempt) {
      p->address_ = "127.0.0.1:" + std::to_string(FreeTcpPort());
      DaemonProcessOptions o;
      o.binary = kPrometheus;
      o.name = "prometheus";
      o.log_path = dir + "/prometheus.log";
      o.args = {"--config.file=" + dir + "/prometheus.yml", "--storage.tsdb.path=" + dir + "/data",
                "--web.listen-address=" + p->address_, "--storage.tsdb.retention.time=1h",
                "--log.level=warn"};
      GRANARY_ASSIGN_OR_RETURN(p->process_, DaemonProcess::Start(o));
      const bool ready = WaitFor(
          [&] {
            if (!p->process_->Running()) return true;
            auto r = HttpGet(p->address_, "/-/ready", 1s);
            return r.ok() && r->status == 200;
          },
          60s, 100ms);
      if (ready && p->process_->Running()) return p;
      const std::string tail = p->process_->LogTail(2000);
      (void)p->process_->Kill();
      if (tail.find("address already in use") == std::string::npos) {
        return Status::Unavailable("prometheus did not become ready on " + p->address_ +
                                   "; its log:\n" + tail);
      }
    }
    return Status::Unavailable("prometheus found no free port in 3 tries");
  }

  const std::string& address() const { return address_; }

  // GET /api/v1/<path>; the "data" member of a "success" answer.
  Result<json> Api(const std::string& path_and_query) const {
    GRANARY_ASSIGN_OR_RETURN(HttpResponse r, HttpGet(address_, "/api/v1/" + path_and_query, 20s));
    json body = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) return Status::Internal("prometheus answered no JSON: " + r.body);
    if (r.status != 200 || body.value("status", "") != "success") {
      return Status::InvalidArgument("prometheus refused " + path_and_query + ": " + r.body);
    }
    return body["data"];
  }

  // An instant query at `time`: data.result (a vector, or a scalar as an array).
  Result<json> Query(const std::string& expr, double time) const {
    return Api("query?query=" + UrlEncode(expr) + "&time=" + std::to_string(time));
  }

  Result<json> QueryRange(const std::string& expr, double start, double end) const {
    return Api("query_range?query=" + UrlEncode(expr) + "&start=" + std::to_string(start) +
               "&end=" + std::to_string(end) + "&step=1");
  }

  // The value of a query answering one series (NaN when none).
  double Scalar(const std::string& expr) const {
    auto r = Query(expr, NowSeconds());
    if (!r.ok() || (*r)["result"].empty()) return std::nan("");
    return std::stod((*r)["result"][0]["value"][1].get<std::string>());
  }

 private:
  PrometheusServer() = default;
  std::string address_;
  std::unique_ptr<DaemonProcess> process_;
};

// A dataset of `files` files of [min_size, max_size] bytes written under
// `src`, snapshotted there (fast) but recorded with the source `source_root`
// (the slow mount of the same tree), so the cache nodes stage through it.
Result<TestDataset> RegisterDataset(CacheCluster& cluster, const std::string& name,
                                    const std::string& src, const std::string& source_root,
                                    size_t files, size_t min_size, size_t max_size) {
  for (size_t i = 0; i < files; ++i) {
    char rel[64];
    std::snprintf(rel, sizeof(rel), "class%03zu/img%06zu.jpg", i / 100, i);
    const size_t size = min_size + (i * 2654435761u) % (max_size - min_size + 1);
    std::filesystem::create_directories(std::filesystem::path(src + "/" + rel).parent_path());
    WriteAll(src + "/" + rel, Bytes(name + "/" + rel, size));
  }
  ManifestBuildOptions build;
  build.source_root = src;
  build.source_uri = "file://" + source_root;
  build.chunk_size = 1024 * 1024;
  GRANARY_ASSIGN_OR_RETURN(Manifest manifest, BuildManifest(build));
  TestDataset ds;
  ds.name = name;
  ds.pool = "default";
  ds.root = src;
  ds.manifest = std::make_shared<const Manifest>(std::move(manifest));
  ds.manifest_id = ds.manifest->id();
  ds.contents.resize(ds.manifest->sample_count());
  for (uint32_t id = 0; id < ds.manifest->sample_count(); ++id) {
    ds.contents[id] = ReadAll(src + "/" + ds.manifest->PathOf(id));
    ds.total_bytes += ds.contents[id].size();
  }
  GRANARY_RETURN_IF_ERROR(cluster.RegisterManifest(name, *ds.manifest));
  return ds;
}

std::vector<json> LoadDashboards() {
  std::vector<json> out;
  const std::string dir = std::string(GRANARY_SOURCE_DIR) + "/charts/granary/dashboards";
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".json") paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  for (const auto& p : paths) out.push_back(json::parse(ReadAll(p)));
  return out;
}

std::string Fill(std::string expr, const std::map<std::string, std::string>& values) {
  for (const auto& [name, value] : values) {
    for (const std::string& form : {"${" + name + "}", "$" + name}) {
      for (size_t at = expr.find(form); at != std::string::npos; at = expr.find(form, at)) {
        // "$dataset" must not match the start of "$datasets".
        const size_t end = at + form.size();
        if (form[1] != '{' && end < expr.size() &&
            (std::isalnum(static_cast<unsigned char>(expr[end])) || expr[end] == '_')) {
          at = end;
          continue;
        }
        expr.replace(at, form.size(), value);
        at += value.size();
      }
    }
  }
  return expr;
}

class DashboardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kPrometheus)) {
      GTEST_SKIP() << kPrometheus
                   << " is missing: apt-get install prometheus (scripts/install-deps)";
    }
    auto cluster = CacheCluster::Create();
    ASSERT_OK(cluster);
    cluster_ = std::move(*cluster);
    ASSERT_OK(cluster_->StartNodes(2));
    SidecarOptions o;
    o.store_url = cluster_->store_url();
    o.local_node_id = cluster_->node(0).id();  // node-1 local, node-2 a peer
    o.window_bytes = "8MiB";
    o.window_samples = 256;
    o.arena_bytes = "32MiB";
    const std::string dir = cluster_->dir().Join("sidecar");
    std::filesystem::create_directories(dir);
    sidecar_ = std::make_unique<SidecarProcess>(o, dir);
    ASSERT_OK(sidecar_->StartAndWaitReady());
    auto prometheus = PrometheusServer::Start(
        cluster_->dir().Join("prometheus"),
        {{"granary-cachenode",
          {cluster_->node(0).metrics_address(), cluster_->node(1).metrics_address()}},
         {"granary-sidecar", {sidecar_->metrics_address()}}});
    ASSERT_OK(prometheus);
    prometheus_ = std::move(*prometheus);
    start_ = NowSeconds();
    ASSERT_TRUE(WaitFor([&] { return prometheus_->Scalar("sum(up)") == 3; }, 30s, 200ms))
        << "Prometheus does not see the 2 cache nodes and the sidecar up";
  }

  // Reads `epochs` epochs of the dataset through the sidecar as a trainer
  // does: a plan per epoch, NEXT in batches, a short pause per batch (the
  // compute step), every sample's bytes checked.
  void Train(const TestDataset& ds, int epochs) {
    client::SessionOptions so;
    so.socket_path = sidecar_->socket_path();
    so.call_timeout = 30s;
    auto session = client::Session::Open(ds.name, so);
    ASSERT_OK(session);
    for (int epoch = 0; epoch < epochs; ++epoch) {
      client::SamplerSpec spec;
      spec.sample_count = ds.sample_count();
      spec.seed = 7;
      spec.epoch = static_cast<uint64_t>(epoch);
      auto plan = client::SamplerSetPlan(spec);
      ASSERT_OK(plan);
      ASSERT_OK((*session)->SetPlan(*plan));
      bool end = false;
      size_t got = 0;
      for (int round = 0; round < 100000 && !end; ++round) {
        auto batch = (*session)->Next(32, &end);
        ASSERT_OK(batch);
        for (auto& v : *batch) {
          ASSERT_OK(v);
          ASSERT_EQ(v->bytes(), ds.contents[v->id]) << "sample " << v->id;
          (*session)->Release(*v);
          ++got;
        }
        std::this_thread::sleep_for(30ms);  // the training step
      }
      ASSERT_EQ(got, ds.sample_count()) << "epoch " << epoch;
    }
  }

  std::unique_ptr<CacheCluster> cluster_;
  std::unique_ptr<SidecarProcess> sidecar_;
  std::unique_ptr<PrometheusServer> prometheus_;
  double start_ = 0;
};

TEST_F(DashboardsTest, EveryPanelAnswersFromRealData) {
  // About 40 MB: staging at 10 MB/s through the slow source lasts ~4 s.
  const std::string src = cluster_->dir().Join("source");
  std::string source_root = src;
#ifdef GRANARY_SLOWFS_BINARY
  source_root = cluster_->dir().Join("slow-source");
  SlowFsMount slow(GRANARY_SLOWFS_BINARY, src, source_root);
  std::filesystem::create_directories(src);
  ASSERT_OK(slow.Start({.bandwidth_mb_s = 10}, cluster_->dir().Join("slowfs.log")));
#endif
  auto ds =
      RegisterDataset(*cluster_, "imagenet-mini", src, source_root, 2000, 4 * 1024, 36 * 1024);
  ASSERT_OK(ds);
  ASSERT_OK(cluster_->WaitForPhase(ds->name, DatasetPhase::kReady, 120s));
  // A few scrapes of the finished staging before training starts.
  std::this_thread::sleep_for(2s);
  ASSERT_NO_FATAL_FAILURE(Train(*ds, 3));
  const double served = *sidecar_->MetricValue("granary_sidecar_served_samples_total");
  ASSERT_GE(served, 3.0 * static_cast<double>(ds->sample_count()));
  // Wait until Prometheus has scraped the end of training, and a few seconds
  // more so the rates fall back too.
  ASSERT_TRUE(WaitFor(
      [&] { return prometheus_->Scalar("sum(granary_sidecar_served_samples_total)") >= served; },
      20s, 200ms))
      << "Prometheus never scraped the sidecar's final counters";
  std::this_thread::sleep_for(2s);
  const double end = NowSeconds();
  // Evaluate at a time when the trainer's rates are still in the 5s window.
  const double during = end - 3;

  const std::map<std::string, std::string> variables = {
      {"dataset", ds->name},
      {"instance", cluster_->node(0).metrics_address()},
      {"cachenode_job", "granary-cachenode"},
      {"__rate_interval", kRateInterval},
      {"__range", kRange},
  };
  const std::vector<json> dashboards = LoadDashboards();
  ASSERT_EQ(dashboards.size(), 3u);
  json results = json::object({{"start", start_}, {"end", end}, {"dashboards", json::array()}});
  size_t queries = 0;
  for (const json& dashboard : dashboards) {
    const std::string uid = dashboard["uid"];
    // The template variables' own queries give this run's values.
    for (const json& v : dashboard["templating"]["list"]) {
      if (v["type"] != "query") continue;
      std::smatch m;
      const std::string def = v["definition"];
      const std::string name = v["name"];
      ASSERT_TRUE(std::regex_match(def, m, std::regex(R"(label_values\((\w+), (\w+)\))"))) << def;
      auto values =
          prometheus_->Api("label/" + m[2].str() + "/values?match[]=" + UrlEncode(m[1].str()));
      ASSERT_OK(values);
      EXPECT_NE(std::find(values->begin(), values->end(), variables.at(name)), values->end())
          << uid << ": variable " << name << " does not offer " << variables.at(name) << " (offers "
          << values->dump() << ")";
    }
    json panels = json::array();
    for (const json& panel : dashboard["panels"]) {
      if (panel["type"] == "row") continue;
      json targets = json::array();
      for (const json& target : panel["targets"]) {
        const std::string expr = Fill(target["expr"], variables);
        ASSERT_EQ(expr.find('$'), std::string::npos) << "unfilled variable in " << expr;
        auto answer = prometheus_->Query(expr, during);
        ASSERT_TRUE(answer.ok()) << uid << ": '" << panel["title"].get<std::string>()
                                 << "': " << answer.status().ToString();
        ++queries;
        // No granary-operator runs here: its gauges (the namespace quotas) are
        // checked by operator_test; their queries must only be valid.
        const bool operator_only = expr.find("granary_operator_") != std::string::npos &&
                                   expr.find("granary_cachenode_") == std::string::npos &&
                                   expr.find("granary_sidecar_") == std::string::npos;
        EXPECT_TRUE(operator_only || !(*answer)["result"].empty())
            << uid << ": '" << panel["title"].get<std::string>() << "' answers nothing: " << expr;
        json t = {
            {"expr", expr}, {"legend", target["legendFormat"]}, {"instant", (*answer)["result"]}};
        if (uid == "granary-overview" && getenv("GRANARY_DASHBOARD_RESULTS") != nullptr) {
          auto range = prometheus_->QueryRange(expr, start_, end);
          ASSERT_OK(range);
          t["range"] = (*range)["result"];
        }
        targets.push_back(t);
      }
      panels.push_back({{"title", panel["title"]},
                        {"type", panel["type"]},
                        {"unit", panel["fieldConfig"]["defaults"]["unit"]},
                        {"gridPos", panel["gridPos"]},
                        {"targets", targets}});
    }
    results["dashboards"].push_back(
        {{"uid", uid}, {"title", dashboard["title"]}, {"panels", panels}});
  }
  EXPECT_GE(queries, 59u);
  // The picture should show real traffic: bytes from the local node and a
  // peer, prefetched samples handed out, source opens saved.
  EXPECT_GT(prometheus_->Scalar("sum(granary_sidecar_fetched_bytes_total{from=\"local_node\"})"),
            0);
  EXPECT_GT(prometheus_->Scalar("sum(granary_sidecar_fetched_bytes_total{from=\"peer\"})"), 0);
  EXPECT_GT(prometheus_->Scalar("sum(granary_sidecar_served_samples_total{from=\"prefetch\"})"), 0);
  EXPECT_GT(prometheus_->Scalar("sum(granary_sidecar_served_samples_total) - "
                                "sum(granary_cachenode_source_opens_total)"),
            static_cast<double>(ds->sample_count()))
      << "three epochs read from cache should save at least an epoch of source opens";
  if (const char* out = getenv("GRANARY_DASHBOARD_RESULTS")) {
    std::ofstream(out) << results.dump(1) << "\n";
  }
}

}  // namespace
}  // namespace granary::testing
