// One dataset, both schedulers: a site with Kubernetes and Slurm on
// the same GPU hosts runs one metadata store and one set of cache nodes. A
// Dataset applied with kubectl, snapshotted and staged by its CachePool's
// cache node, is read by a Slurm job through `#DW persistentdw name=<its
// Granary name>` (granted to the job's user by the site's admin with
// `granary dataset grant`) without a second snapshot or a second read of the
// source.
//
// Both fixtures at once over the same Redis and the same cache node:
// KubeSuite (tests/testing/kube_suite.h: a real control plane, PodRunner
// running the pool's cache-node DaemonSet as a real granary-cachenode,
// granary-operator as a real process, the example pool) and SlurmCluster
// (tests/testing/slurm_cluster.h: munged, slurmctld and slurmd with Granary's
// burst_buffer.lua and prolog/epilog, pointed at the same store and at that
// cache node's id). The job runs tests/trainer/check_epochs.py, the reader the
// Slurm suite's persistentdw case uses, with the source moved away while it
// runs: any read of the source would fail the job.
//
// Skipped (with the reason) without the Kubernetes tools or the Slurm
// packages, and in an ASan build (its Python module cannot be loaded by
// /usr/bin/python3).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "granary/cli/cli.h"
#include "granary/core/file.h"
#include "granary/core/metadata_store.h"
#include "granary/operator/resources.h"
#include "testing/cachenode_fixture.h"
#include "testing/kube_suite.h"
#include "testing/sidecar_fixture.h"
#include "testing/slurm_cluster.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

constexpr char kNamespace[] = "team-a";
constexpr char kName[] = "shared-train";

std::string PythonPath() { return ::granary::testing::PythonPath(GRANARY_PYTHONPATH); }

// The cache node's counters of source operations (every series of
// granary_cachenode_source_*, and the staging and on-demand counters, which
// count samples read from the source), as "name{labels}" -> value.
using Counters = std::map<std::string, double>;

Result<Counters> SourceCounters(const std::string& metrics_address) {
  GRANARY_ASSIGN_OR_RETURN(HttpResponse r, HttpGet(metrics_address, "/metrics"));
  if (r.status != 200) {
    return Status::Unavailable("GET " + metrics_address + "/metrics: " + std::to_string(r.status));
  }
  GRANARY_ASSIGN_OR_RETURN(std::vector<MetricSample> samples, ParsePrometheusText(r.body));
  Counters out;
  for (const MetricSample& s : samples) {
    if (!s.name.starts_with("granary_cachenode_source_") &&
        s.name != "granary_cachenode_staged_samples_total" &&
        s.name != "granary_cachenode_on_demand_fetches_total" &&
        s.name != "granary_cachenode_snapshots_total") {
      continue;
    }
    std::string key = s.name + "{";
    for (const auto& [k, v] : s.labels) key += k + "=\"" + v + "\",";
    out[key + "}"] = s.value;
  }
  return out;
}

std::string Describe(const Counters& c) {
  std::ostringstream out;
  for (const auto& [k, v] : c) out << "  " << k << " " << v << "\n";
  return out.str();
}

double Value(const Counters& c, const std::string& key) {
  auto it = c.find(key);
  return it == c.end() ? -1 : it->second;
}

// The manifest blobs in the store (P:manifest:<id>, docs/metadata-store.md).
Result<std::vector<std::string>> ManifestKeys(const RedisServer& redis,
                                              const std::string& scratch) {
  KubectlResult r = RunProgram(
      {"redis-cli", "-p", std::to_string(redis.port()), "--scan", "--pattern", "*:manifest:*"}, {},
      "", scratch, seconds(20));
  if (!r.ok()) return Status::Unavailable("redis-cli --scan: " + r.Describe());
  std::vector<std::string> keys;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) keys.push_back(line);
  }
  return keys;
}

TEST(MixedSiteTest, KubernetesDatasetIsReadBySlurmPersistentDwWithoutSecondSnapshotOrRead) {
  if (kAsanBuild) {
    GTEST_SKIP() << "an ASan build's Python module cannot be loaded by /usr/bin/python3";
  }
  if (Result<std::string> tools = KubeCluster::ToolsDir(); !tools.ok()) {
    GTEST_SKIP() << tools.status().ToString();
  }
  std::string why;
  if (!SlurmCluster::Available(&why)) GTEST_SKIP() << why;
  const auto started = std::chrono::steady_clock::now();

  // Kubernetes: the pool Ready with its cache node, then the team's Dataset.
  KubeSuiteOptions ko;
  ko.source_dir = GRANARY_SOURCE_DIR;
  ko.pod_bin_dir = GRANARY_POD_BIN_DIR;
  ko.operator_binary = GRANARY_OPERATOR_BINARY;
  KubeSuite kube(ko);
  struct PrintLogs {
    KubeSuite& kube;
    ~PrintLogs() { kube.PrintLogsIfTestFailed(); }
  } print_logs{kube};
  Status up = kube.Start();
  ASSERT_TRUE(up.ok()) << up.ToString() << "\n" << kube.OperatorLogs();

  std::vector<std::pair<std::string, std::string>> files;
  for (int i = 0; i < 64; ++i) {
    const std::string path = "class" + std::to_string(i % 4) + "/img" + std::to_string(i) + ".JPEG";
    files.emplace_back(path, Bytes(path, 100 + static_cast<size_t>(i) * 2311 % 150000));
  }
  kube.WriteSource("shared/train", files);
  const std::string source = kube.datasets() + "/shared/train";
  kube.cluster().MustKubectl({"apply", "--validate=strict", "-f", "-"},
                             KubeSuite::DatasetYaml(kNamespace, kName, source));
  ASSERT_OK(kube.WaitDatasetCondition(kNamespace, kName, "Ready", "True", "", seconds(90)));
  Result<json> dataset = kube.Dataset(kNamespace, kName);
  ASSERT_OK(dataset);
  const std::string gname = (*dataset)["status"].value("granaryName", "");
  const std::string manifest = (*dataset)["status"].value("manifestId", "");
  // What docs/kubernetes.md ("A site with Kubernetes and Slurm") tells users
  // to read, and the rule it states.
  ASSERT_EQ(gname, kube::GranaryDatasetName(kNamespace, kName));
  const std::string jsonpath = kube.cluster().MustKubectl(
      {"get", "dataset", kName, "-n", kNamespace, "-o", "jsonpath={.status.granaryName}"});
  EXPECT_EQ(jsonpath, gname);
  EXPECT_THAT(gname, ::testing::MatchesRegex("team-a-shared-train-[0-9a-f]{10}"));
  ASSERT_FALSE(manifest.empty());
  EXPECT_EQ((*dataset)["status"].value("files", size_t{0}), files.size());

  Result<std::unique_ptr<MetadataStore>> store = kube.Store();
  ASSERT_OK(store);
  Result<DatasetRecord> record = (*store)->GetDataset(gname);
  ASSERT_OK(record);
  EXPECT_EQ(record->manifest_id, manifest);
  EXPECT_EQ(record->state.phase, DatasetPhase::kReady);
  Result<std::vector<std::string>> manifests = ManifestKeys(kube.redis(), kube.dir());
  ASSERT_OK(manifests);
  ASSERT_EQ(manifests->size(), 1u) << ::testing::PrintToString(*manifests);
  EXPECT_THAT(manifests->front(), HasSubstr(manifest));
  Result<std::vector<NodeRecord>> nodes = (*store)->ListNodes("gpu");
  ASSERT_OK(nodes);
  ASSERT_EQ(nodes->size(), 1u) << "the pool runs one cache node (KubeSuite)";
  const std::string node_id = nodes->front().id;

  // Staging opened every file (a file larger than a chunk once per chunk it
  // spans); the counters then settle (the node refreshes its metrics every
  // 500 ms): two scrapes 1.5 s apart agree.
  const std::string opens_key = "granary_cachenode_source_opens_total{dataset=\"" + gname + "\",}";
  Counters before;
  ASSERT_TRUE(WaitFor(
      [&] {
        Result<Counters> first = SourceCounters(kube.metrics_address());
        if (!first.ok() || Value(*first, opens_key) < static_cast<double>(files.size())) {
          return false;
        }
        std::this_thread::sleep_for(milliseconds(1500));
        Result<Counters> second = SourceCounters(kube.metrics_address());
        if (!second.ok() || *second != *first) return false;
        before = *second;
        return true;
      },
      seconds(60), milliseconds(200)))
      << "the cache node's source counters did not settle at " << files.size()
      << " opens: " << Describe(before);
  EXPECT_EQ(Value(before, "granary_cachenode_snapshots_total{result=\"ok\",}"), 1.0)
      << Describe(before);

  // Slurm on the same store, its prolog naming the same cache node.
  SlurmClusterOptions so;
  so.granary_binary = GRANARY_CLI_BINARY;
  so.sidecar_binary = SidecarBinary();
  so.store_url = kube.redis().url();
  so.plugin_dir = std::string(GRANARY_SOURCE_DIR) + "/slurm/plugin";
  so.cache_node_id = node_id;
  // The pool's cache nodes require the cluster key: the Slurm node's sidecars
  // prove the one the operator made (on a real site, /etc/granary/cluster.key).
  Result<std::string> key = kube.ClusterKeyFile();
  ASSERT_OK(key);
  so.cluster_key_file = *key;
  Result<std::unique_ptr<SlurmCluster>> started_slurm = SlurmCluster::Start(so);
  ASSERT_OK(started_slurm);
  SlurmCluster& slurm = **started_slurm;
  struct PrintSlurmLogs {
    SlurmCluster& slurm;
    ~PrintSlurmLogs() {
      if (::testing::Test::HasFailure()) std::cerr << slurm.LogTails(8192) << "\n";
    }
  } print_slurm_logs{slurm};
  auto write_script = [&](const std::string& name, const std::string& directives,
                          const std::string& body) {
    const std::string path = slurm.dir() + "/" + name + ".sh";
    WriteAll(path, "#!/bin/sh\n#SBATCH -o " + slurm.out_dir() + "/" + name + "-%j.out\n" +
                       directives + body);
    std::filesystem::permissions(path, std::filesystem::perms(0644));
    return path;
  };
  auto job_output = [&](const std::string& name, const std::string& job) {
    Result<std::string> text = ReadFileToString(slurm.out_dir() + "/" + name + "-" + job + ".out");
    return text.ok() ? *text : "(no output: " + text.status().ToString() + ")";
  };

  // The Dataset's data is its owner's (the pod's runAsUser); the Slurm job
  // runs as uid 65534, so the site's admin grants that user read access, as
  // `#DW persistentdw` of another user's dataset requires.
  {
    std::ostringstream out;
    std::ostringstream err;
    ASSERT_EQ(RunCli({"--store", kube.redis().url(), "dataset", "grant", gname, "--user", "nobody"},
                     out, err, /*interactive=*/false),
              kCliOk)
        << err.str();
  }

  // The source moved away for the job: a read of it by anyone (the cache
  // node, the job's sidecar falling through) fails the job. The trainer
  // compares every sample with the moved copy.
  const std::string golden = source + ".away";
  std::filesystem::rename(source, golden);
  const std::string script =
      write_script("mixed", "#DW persistentdw name=" + gname + "\n",
                   "set -e\necho \"dataset=$GRANARY_DATASET\"\ntest -S \"$GRANARY_SOCKET\"\n"
                   "export PYTHONPATH='" +
                       PythonPath() +
                       "' PYTHONDONTWRITEBYTECODE=1\n"
                       "exec /usr/bin/python3 '" +
                       std::string(GRANARY_SOURCE_DIR) +
                       "/tests/trainer/check_epochs.py' --golden '" + golden + "'\n");
  Result<std::string> job = slurm.Submit(script);
  ASSERT_OK(job);
  Result<std::map<std::string, std::string>> end =
      slurm.WaitForJobState(*job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, seconds(180));
  ASSERT_OK(end);
  const std::string output = job_output("mixed", *job);
  EXPECT_EQ((*end)["JobState"], "COMPLETED")
      << output << "\nreason " << (*end)["Reason"] << " comment " << (*end)["SystemComment"]
      << " admin " << (*end)["AdminComment"];
  EXPECT_THAT(output, HasSubstr("dataset=" + gname + "\n"));
  EXPECT_THAT(output, HasSubstr("trainer OK: " + std::to_string(files.size()) + " samples"));

  // No source operation during the job: every counter as before, over at
  // least four metric refreshes after it ended.
  std::this_thread::sleep_for(milliseconds(2000));
  Result<Counters> after = SourceCounters(kube.metrics_address());
  ASSERT_OK(after);
  EXPECT_TRUE(*after == before) << "the cache node's source counters moved; before the job:\n"
                                << Describe(before) << "after it:\n"
                                << Describe(*after);
  // One snapshot: the same manifest in the store and in the Dataset's status,
  // and no other manifest blob.
  Result<DatasetRecord> record_after = (*store)->GetDataset(gname);
  ASSERT_OK(record_after);
  EXPECT_EQ(record_after->manifest_id, manifest);
  EXPECT_EQ(record_after->state.phase, DatasetPhase::kReady);
  EXPECT_EQ(record_after->readers.uids, std::vector<uint32_t>{65534})
      << "the operator's updates keep the grant";
  manifests = ManifestKeys(kube.redis(), kube.dir());
  ASSERT_OK(manifests);
  EXPECT_EQ(manifests->size(), 1u) << ::testing::PrintToString(*manifests);
  Result<json> dataset_after = kube.Dataset(kNamespace, kName);
  ASSERT_OK(dataset_after);
  EXPECT_EQ((*dataset_after)["status"].value("manifestId", ""), manifest);
  EXPECT_EQ(ConditionField(*dataset_after, "Ready"), "True");
  std::filesystem::rename(golden, source);

  // The Kubernetes name alone is not a Granary name: sbatch refuses the job.
  const std::string bad =
      write_script("bad", std::string("#DW persistentdw name=") + kName + "\n", "true\n");
  Result<std::string> refused = slurm.Submit(bad);
  ASSERT_FALSE(refused.ok()) << "sbatch accepted job " << *refused;
  const std::string said = refused.status().message();
  EXPECT_THAT(said, HasSubstr("line 3"));
  EXPECT_THAT(said, HasSubstr(std::string("dataset '") + kName + "' does not exist"));
  // It names the Granary name to write instead.
  EXPECT_THAT(said, HasSubstr("write name=" + gname));
  EXPECT_EQ((*store)->GetDataset(kName).status().code(), StatusCode::kNotFound);

  std::cout << "mixed site test took "
            << std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - started)
                   .count()
            << " ms" << std::endl;
}

}  // namespace
}  // namespace granary::testing
