// The Python package `granary` end to end: Redis, two real granary-cachenode
// processes (CacheCluster), a real granary-sidecar (SidecarProcess), and
// /usr/bin/python3 running the scripts in tests/python/ with PYTHONPATH set to
// the built package and GRANARY_SOCKET to the sidecar's socket. Each script
// checks what it reads (against the source files it opens itself) and exits 0
// only if every check held; its output is printed when it fails. A script
// that exits 77 lacks what it needs here (torchvision): the case is skipped.
//
// $GRANARY_TEST_PYTHON runs the scripts with another interpreter (a venv with
// the wheel installed, scripts/python-venv-suite), with $GRANARY_TEST_PYTHONPATH
// as its PYTHONPATH (none when unset).
//
// LABELS python: an ASan build's module cannot be loaded by a plain python,
// so the asan preset skips these (CMakePresets.json), and an ASan build of
// this file skips them too.

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "granary/core/metadata_store.h"
#include "testing/cachenode_fixture.h"
#include "testing/daemon_process.h"
#include "testing/sidecar_fixture.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr char kSkipCode = 77;

// The interpreter: a venv's ($GRANARY_TEST_PYTHON), else Debian's.
std::string Python() {
  const char* venv = std::getenv("GRANARY_TEST_PYTHON");
  return venv != nullptr && *venv != '\0' ? venv : "/usr/bin/python3";
}

std::string PythonPath() {
  if (const char* venv = std::getenv("GRANARY_TEST_PYTHON"); venv != nullptr && *venv != '\0') {
    const char* path = std::getenv("GRANARY_TEST_PYTHONPATH");
    return path != nullptr ? path : "";
  }
  return ::granary::testing::PythonPath(GRANARY_PYTHONPATH);
}

std::string ScriptPath(const std::string& script) {
  return std::string(GRANARY_PYTHON_TESTS_DIR) + "/" + script;
}

// /usr/bin/python3 tests/python/<script> <args> with the built package on
// PYTHONPATH and GRANARY_SOCKET=`socket`; its output goes to <log_dir>/<script>.log.
std::unique_ptr<DaemonProcess> StartPython(const std::string& script, std::vector<std::string> args,
                                           const std::string& log_dir, const std::string& socket,
                                           const std::string& tag = "") {
  DaemonProcessOptions o;
  o.binary = Python();
  o.args.push_back(ScriptPath(script));
  for (std::string& a : args) o.args.push_back(std::move(a));
  const std::string name = script + (tag.empty() ? "" : "-" + tag);
  o.name = name;
  o.log_path = log_dir + "/" + name + ".log";
  o.env = {"GRANARY_SOCKET=" + socket, "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1",
           "OMP_NUM_THREADS=1"};
  if (const std::string path = PythonPath(); !path.empty()) o.env.push_back("PYTHONPATH=" + path);
  auto p = DaemonProcess::Start(o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(*p) : nullptr;
}

// Waits for the script and expects exit code 0; prints its output if not.
// Exit code 77 skips the case (the script said what it lacks).
void ExpectSuccess(DaemonProcess* p, milliseconds timeout = seconds(90)) {
  ASSERT_NE(p, nullptr);
  auto status = p->Wait(timeout);
  if (!status.ok()) {
    (void)p->Kill();
    FAIL() << p->name() << " did not finish within " << timeout.count()
           << " ms: " << status.status().ToString() << "\n--- output ---\n"
           << p->LogTail();
  }
  if (status->ExitedWith(kSkipCode)) GTEST_SKIP() << p->LogTail();
  EXPECT_TRUE(status->ExitedWith(0))
      << p->name() << " ended with " << status->ToString() << "\n--- output ---\n"
      << p->LogTail();
}

// The plain-Python parts need no sidecar: the sampler against torch's own.
TEST(PythonSamplerTest, AgreesWithTorchsDistributedSampler) {
  if (kAsanBuild) {
    GTEST_SKIP() << "an AddressSanitizer build of the granary module cannot be loaded by "
                    "/usr/bin/python3";
  }
  if (::access(Python().c_str(), X_OK) != 0) GTEST_SKIP() << Python() << " is not installed";
  TempDir dir;
  auto p = StartPython("sampler_semantics.py", {}, dir.path(), dir.Join("no-sidecar.sock"));
  ExpectSuccess(p.get());
}

// Direct reads from Python: a node with a handoff socket and a sidecar that
// reads its chunk files and hands them to sessions (tests/python/direct_reads.py).
TEST(PythonDirectReadsTest, ItemsAndBatchesAreReadFromTheChunkFiles) {
  if (kAsanBuild) {
    GTEST_SKIP() << "an AddressSanitizer build of the granary module cannot be loaded by "
                    "/usr/bin/python3";
  }
  if (::access(Python().c_str(), X_OK) != 0) GTEST_SKIP() << Python() << " is not installed";
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  const std::string handoff = (*cluster)->dir().path() + "/node.sock";
  CacheNodeOptions node;
  node.extra_yaml = "local_socket: " + handoff + "\n";
  ASSERT_OK((*cluster)->StartNodes(1, node));
  DatasetOptions d;
  d.name = "ds";
  d.files = 200;
  d.min_size = 512;
  d.max_size = 3 * 1024;
  d.chunk_size = 32 * 1024;
  auto ds = (*cluster)->CreateDataset(d);
  ASSERT_OK(ds);
  SidecarOptions o;
  o.local_node_id = (*cluster)->node(0).id();
  o.extra_yaml = "local_node_socket: " + handoff + "\n";
  auto sidecar = StartClusterSidecar(**cluster, o);
  ASSERT_OK(sidecar);
  auto p = StartPython("direct_reads.py",
                       {"--dataset", ds->name, "--source-root", ds->root, "--data-dir",
                        (*cluster)->node(0).data_dir()},
                       (*cluster)->dir().path(), (*sidecar)->socket_path());
  ExpectSuccess(p.get());
}

class PythonClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kAsanBuild) {
      GTEST_SKIP() << "an AddressSanitizer build of the granary module cannot be loaded by "
                      "/usr/bin/python3";
    }
    if (::access(Python().c_str(), X_OK) != 0) {
      GTEST_SKIP() << Python() << " is not installed";
    }
    auto cluster = CacheCluster::Create();
    ASSERT_OK(cluster);
    cluster_ = std::move(*cluster);
    ASSERT_OK(cluster_->StartNodes(2));
    DatasetOptions d;
    d.name = "ds";
    d.files = 301;  // odd: DistributedSampler pads one sample for two ranks
    d.min_size = 512;
    d.max_size = 3 * 1024;
    d.files_per_directory = 50;
    d.chunk_size = 32 * 1024;
    auto ds = cluster_->CreateDataset(d);
    ASSERT_OK(ds);
    ds_ = std::move(*ds);
  }

  // A sidecar for the cluster's pool, preferring node-1 as its local node.
  void StartSidecar(SidecarOptions o = {}) {
    if (o.local_node_id.empty()) o.local_node_id = cluster_->node(0).id();
    if (o.window_bytes == SidecarOptions{}.window_bytes) o.window_bytes = "4MiB";
    auto sidecar = testing::StartClusterSidecar(*cluster_, o);
    ASSERT_OK(sidecar);
    sidecar_ = std::move(*sidecar);
  }

  // /usr/bin/python3 tests/python/<script> <args>, its output in a log.
  std::unique_ptr<DaemonProcess> StartScript(const std::string& script,
                                             std::vector<std::string> args,
                                             const std::string& tag = "") {
    return StartPython(script, std::move(args), cluster_->dir().path(), sidecar_->socket_path(),
                       tag);
  }

  void RunScript(const std::string& script, std::vector<std::string> args,
                 milliseconds timeout = seconds(90)) {
    auto p = StartScript(script, std::move(args));
    ExpectSuccess(p.get(), timeout);
  }

  // Two ranks at once (two python processes), then the union check.
  void RunTwoRanks(const std::vector<std::string>& extra) {
    StartSidecar();
    if (HasFatalFailure()) return;
    std::vector<std::unique_ptr<DaemonProcess>> ranks;
    std::vector<std::string> outs;
    for (int rank = 0; rank < 2; ++rank) {
      outs.push_back(cluster_->dir().Join("rank" + std::to_string(rank) + ".json"));
      std::vector<std::string> args = {
          "--dataset",    ds_.name, "--source-root", ds_.root, "--rank", std::to_string(rank),
          "--world-size", "2",      "--epochs",      "2",      "--out",  outs.back()};
      args.insert(args.end(), extra.begin(), extra.end());
      ranks.push_back(StartScript("dataloader_epochs.py", args, "rank" + std::to_string(rank)));
    }
    for (auto& r : ranks) ExpectSuccess(r.get());
    if (HasFailure()) return;
    RunScript("check_union.py", outs);
    // The sidecar served them all (its counters are per source of the bytes).
    auto served = sidecar_->MetricValue("granary_sidecar_served_samples_total");
    ASSERT_OK(served);
    EXPECT_GE(*served, 2.0 * 2 * 151) << "two ranks, two epochs, 151 samples each";
    // The samplers announced their plans: the sidecar read ahead of them.
    auto prefetched =
        sidecar_->MetricValue("granary_sidecar_served_samples_total", {{"from", "prefetch"}});
    ASSERT_OK(prefetched);
    EXPECT_GT(*prefetched, 0) << "no sample was prefetched: was SET_PLAN sent?";
    auto plans = sidecar_->MetricValue("granary_sidecar_plans_total");
    ASSERT_OK(plans);
    EXPECT_GE(*plans, 4) << "one SET_PLAN per rank and epoch";
  }

  std::unique_ptr<CacheCluster> cluster_;
  TestDataset ds_;
  std::unique_ptr<SidecarProcess> sidecar_;
};

TEST_F(PythonClientTest, DataLoaderTwoRanksTwoEpochsInProcess) {
  RunTwoRanks({"--num-workers", "0"});
}

TEST_F(PythonClientTest, DataLoaderTwoRanksTwoEpochsForkedWorkers) {
  RunTwoRanks({"--num-workers", "2", "--start-method", "fork"});
}

TEST_F(PythonClientTest, DataLoaderTwoRanksSpawnedPersistentWorkers) {
  RunTwoRanks({"--num-workers", "2", "--start-method", "spawn", "--persistent-workers"});
}

TEST_F(PythonClientTest, DataLoaderTwoRanksTwoEpochsFourForkedWorkers) {
  RunTwoRanks({"--num-workers", "4", "--start-method", "fork"});
}

TEST_F(PythonClientTest, EpochCompletesWithCorrectBytesWhenACacheNodeDies) {
  SidecarOptions o;
  // A small window, so most of the second half is fetched after the kill.
  o.window_samples = 16;
  o.window_bytes = "1MiB";  // the least allowed; window_samples binds first
  StartSidecar(o);
  if (HasFatalFailure()) return;
  const std::string half = cluster_->dir().Join("half");
  const std::string go = cluster_->dir().Join("go");
  auto script = StartScript("kill_node.py", {"--dataset", ds_.name, "--source-root", ds_.root,
                                             "--half-file", half, "--go-file", go});
  ASSERT_NE(script, nullptr);
  ASSERT_TRUE(
      WaitFor([&] { return std::filesystem::exists(half) || !script->Running(); }, seconds(60)))
      << "the script never got half-way:\n"
      << script->LogTail();
  ASSERT_TRUE(std::filesystem::exists(half)) << "the script ended early:\n" << script->LogTail();
  auto killed = cluster_->node(1).Kill();
  ASSERT_OK(killed);
  WriteAll(go, "go");
  ExpectSuccess(script.get());
  // The second half needed the dead node's chunks (else this proved nothing).
  // The sidecar copies its counters to /metrics every 250 ms: a failure at
  // the end of the epoch shows there a moment after the script is done.
  Result<double> failures = Status::Unavailable("not read yet");
  WaitFor(
      [&] {
        failures = sidecar_->MetricValue("granary_sidecar_node_failures_total");
        return failures.ok() && *failures >= 1;
      },
      seconds(5));
  ASSERT_OK(failures);
  EXPECT_GE(*failures, 1) << "the reads after the kill never asked the dead node";
}

TEST_F(PythonClientTest, PinsOfAKilledClientAreReclaimed) {
  StartSidecar();
  if (HasFatalFailure()) return;
  const std::string ready = cluster_->dir().Join("ready.json");
  auto script =
      StartScript("hold_pins.py", {"--dataset", ds_.name, "--count", "20", "--ready-file", ready});
  ASSERT_NE(script, nullptr);
  ASSERT_TRUE(
      WaitFor([&] { return std::filesystem::exists(ready) || !script->Running(); }, seconds(60)))
      << script->LogTail();
  ASSERT_TRUE(std::filesystem::exists(ready)) << "the script ended early:\n" << script->LogTail();
  // Measured on the sidecar, not assumed: 20 pins held, then none.
  auto pins = sidecar_->WaitForMetric("granary_sidecar_pins", {}, [](double v) { return v >= 20; });
  ASSERT_OK(pins);
  auto bytes = sidecar_->WaitForMetric("granary_sidecar_pinned_bytes", {},
                                       [](double v) { return v >= 20 * 512; });
  ASSERT_OK(bytes);
  auto killed = script->Kill();
  ASSERT_OK(killed);
  EXPECT_EQ(killed->signal, SIGKILL);
  EXPECT_OK(sidecar_->WaitForMetric("granary_sidecar_pins", {}, [](double v) { return v == 0; }));
  EXPECT_OK(
      sidecar_->WaitForMetric("granary_sidecar_pinned_bytes", {}, [](double v) { return v == 0; }));
  EXPECT_OK(
      sidecar_->WaitForMetric("granary_sidecar_sessions", {}, [](double v) { return v == 0; }));
}

TEST_F(PythonClientTest, ResumeMidEpochReadsExactlyTheRest) {
  StartSidecar();
  if (HasFatalFailure()) return;
  const std::string state = cluster_->dir().Join("state.json");
  const std::vector<std::string> common = {"--dataset", ds_.name,  "--source-root",
                                           ds_.root,    "--state", state};
  std::vector<std::string> first = {"--phase", "first", "--stop-after", "5"};
  first.insert(first.end(), common.begin(), common.end());
  RunScript("resume.py", first);
  ASSERT_TRUE(std::filesystem::exists(state));
  std::vector<std::string> second = {"--phase", "second"};
  second.insert(second.end(), common.begin(), common.end());
  RunScript("resume.py", second);
}

// torchdata's StatefulDataLoader over granary.torch, stopped mid-epoch and
// resumed in a new process from loader.state_dict(), with 0 and 2 workers:
// exactly the rest of the epoch (needs torchdata: the torch 2.x venv's run;
// skipped elsewhere).
TEST_F(PythonClientTest, StatefulDataLoaderResumesMidEpoch) {
  StartSidecar();
  if (HasFatalFailure()) return;
  for (const char* workers : {"0", "2"}) {
    SCOPED_TRACE(std::string(workers) + " workers");
    const std::string state = cluster_->dir().Join(std::string("stateful-") + workers + ".json");
    const std::vector<std::string> common = {"--dataset", ds_.name, "--source-root", ds_.root,
                                             "--state",   state,    "--num-workers", workers};
    std::vector<std::string> first = {"--phase", "first"};
    first.insert(first.end(), common.begin(), common.end());
    auto p = StartScript("stateful_resume.py", first, std::string("first-") + workers);
    ExpectSuccess(p.get());
    if (IsSkipped() || HasFailure()) return;
    ASSERT_TRUE(std::filesystem::exists(state));
    std::vector<std::string> second = {"--phase", "second"};
    second.insert(second.end(), common.begin(), common.end());
    p = StartScript("stateful_resume.py", second, std::string("second-") + workers);
    ExpectSuccess(p.get());
    if (HasFailure()) return;
  }
}

TEST_F(PythonClientTest, TwoDatasetsNeverSeeEachOthersBytes) {
  DatasetOptions d;
  d.name = "other";
  d.files = 120;
  d.min_size = 512;
  d.max_size = 2048;
  d.chunk_size = 32 * 1024;
  auto other = cluster_->CreateDataset(d);
  ASSERT_OK(other);
  StartSidecar();
  if (HasFatalFailure()) return;
  RunScript("two_datasets.py",
            {"--a", ds_.name, "--root-a", ds_.root, "--b", other->name, "--root-b", other->root});
}

// A wrong type for every argument, an unknown dataset, unsafe and unknown
// paths: the documented exception, naming what was wrong.
TEST_F(PythonClientTest, BadInputsAreClearErrors) {
  StartSidecar();
  if (HasFatalFailure()) return;
  RunScript("bad_inputs.py", {"--dataset", ds_.name});
}

// The sidecar killed half-way through an epoch: ConnectionError naming the
// socket, and no wrong bytes before or after.
TEST_F(PythonClientTest, SidecarGoneMidEpochIsAConnectionError) {
  StartSidecar();
  if (HasFatalFailure()) return;
  const std::string half = cluster_->dir().Join("half");
  const std::string go = cluster_->dir().Join("go");
  auto script = StartScript("sidecar_gone.py", {"--dataset", ds_.name, "--source-root", ds_.root,
                                                "--half-file", half, "--go-file", go});
  ASSERT_NE(script, nullptr);
  ASSERT_TRUE(
      WaitFor([&] { return std::filesystem::exists(half) || !script->Running(); }, seconds(60)))
      << script->LogTail();
  ASSERT_TRUE(std::filesystem::exists(half)) << "the script ended early:\n" << script->LogTail();
  auto killed = sidecar_->Kill();
  ASSERT_OK(killed);
  WriteAll(go, "go");
  ExpectSuccess(script.get());
}

// torchvision's ImageFolder on the files and granary's on the dataset: the
// same classes, samples, order, PIL images and trained model (needs
// torchvision: the torch 2.x venv's run; skipped elsewhere).
TEST_F(PythonClientTest, ImageFolderIsTorchvisionsDropIn) {
  const std::string root = cluster_->dir().Join("src-animals");
  std::filesystem::create_directories(root);
  auto make = StartPython("imagefolder_dropin.py", {"--make", root}, cluster_->dir().path(),
                          cluster_->dir().Join("none.sock"), "make");
  ExpectSuccess(make.get());
  if (IsSkipped() || HasFailure()) return;
  auto manifest = cluster_->RegisterTree("animals", root);
  ASSERT_OK(manifest);
  StartSidecar();
  if (HasFatalFailure()) return;
  RunScript("imagefolder_dropin.py", {"--dataset", "animals", "--dir", root}, seconds(180));
}

TEST_F(PythonClientTest, MapStyleApiZeroCopyAndUnsafePaths) {
  StartSidecar();
  if (HasFatalFailure()) return;
  RunScript("api.py", {"--dataset", ds_.name, "--source-root", ds_.root});
}

// A dataset with class folders (one nested), and files at the root that
// ImageFolder must skip.
TEST_F(PythonClientTest, ImageFolderReturnsClassIndices) {
  const std::string root = cluster_->dir().Join("src-pets");
  const std::vector<std::pair<std::string, int>> classes = {{"bird", 7}, {"cat", 12}, {"dog", 9}};
  for (const auto& [name, count] : classes) {
    for (int i = 0; i < count; ++i) {
      const std::string rel = name + (i % 4 == 3 ? "/sub/" : "/") + std::to_string(i) + ".jpg";
      std::filesystem::create_directories(std::filesystem::path(root + "/" + rel).parent_path());
      WriteAll(root + "/" + rel, Bytes("pets/" + rel, 600 + 13 * static_cast<size_t>(i)));
    }
  }
  WriteAll(root + "/README.txt", "not a sample of any class");
  WriteAll(root + "/labels.csv", "bird,cat,dog");
  auto manifest = cluster_->RegisterTree("pets", root);
  ASSERT_OK(manifest);
  ASSERT_EQ((*manifest)->sample_count(), 7u + 12u + 9u + 2u);
  StartSidecar();
  if (HasFatalFailure()) return;
  RunScript("imagefolder.py", {"--dataset", "pets", "--source-root", root});
}

// Class folders without any file ("ant" is empty, "cat" holds only an empty
// folder): listed by Dataset.directories(); ImageFolder refuses them by default
// and keeps torchvision's class indices with allow_empty=True.
TEST_F(PythonClientTest, ImageFolderSeesEmptyClassFolders) {
  namespace fs = std::filesystem;
  const std::string root = cluster_->dir().Join("src-zoo");
  for (const char* dir : {"ant", "cat/kittens", "dog/sub"})
    fs::create_directories(root + "/" + dir);
  fs::permissions(root + "/ant", fs::perms(0750));
  for (int i = 0; i < 6; ++i) {
    const std::string rel =
        (i % 2 == 0 ? "bird/" : (i == 5 ? "dog/sub/" : "dog/")) + std::to_string(i) + ".jpg";
    fs::create_directories(fs::path(root + "/" + rel).parent_path());
    WriteAll(root + "/" + rel, Bytes("zoo/" + rel, 700 + 31 * static_cast<size_t>(i)));
  }
  WriteAll(root + "/README.txt", "not a sample of any class");
  auto manifest = cluster_->RegisterTree("zoo", root);
  ASSERT_OK(manifest);
  ASSERT_EQ((*manifest)->sample_count(), 7u);
  StartSidecar();
  if (HasFatalFailure()) return;
  RunScript("imagefolder_empty.py",
            {"--dataset", "zoo", "--source-root", root, "--empty-classes", "ant,cat"});
}

}  // namespace
// Files of the sidecar's mount read by path: granary.read_file gives every
// file's bytes and sends no ioctl to the view; Python's default open() asks
// isatty() of every file, one ioctl each (docs/posix-view.md).
TEST_F(PythonClientTest, ReadFileOverTheMountSendsNoIoctl) {
  const std::string view = cluster_->dir().Join("view");
  std::filesystem::create_directories(view);
  // However the test ends, the view goes: the sidecar is stopped with SIGTERM
  // (it unmounts), and a view a killed sidecar left behind is detached.
  struct StopAndDetach {
    std::unique_ptr<SidecarProcess>& sidecar;
    std::string dir;
    ~StopAndDetach() {
      if (sidecar) (void)sidecar->Terminate(std::chrono::seconds(30));
      ::umount2(dir.c_str(), MNT_DETACH);
    }
  } stop_and_detach{sidecar_, view};
  SidecarOptions o;
  o.extra_yaml = "mounts: \"" + ds_.name + ":" + view + "\"\n";
  StartSidecar(o);
  if (HasFatalFailure()) return;
  // The view's ioctl count once the metrics show everything up to a statvfs
  // (the `statfs`-th one).
  auto ioctls_after_statfs = [&](double statfs) -> double {
    struct statvfs sv {};
    EXPECT_EQ(::statvfs(view.c_str(), &sv), 0);
    EXPECT_OK(sidecar_
                  ->WaitForMetric("granary_sidecar_posix_requests_total", {{"op", "statfs"}},
                                  [statfs](double v) { return v >= statfs; })
                  .status());
    auto v = sidecar_->MetricValue("granary_sidecar_posix_requests_total", {{"op", "ioctl"}});
    EXPECT_OK(v);
    return v.ok() ? *v : -1;
  };
  const double before = ioctls_after_statfs(1);
  RunScript("mount_reads.py", {"--view", view, "--source-root", ds_.root});
  EXPECT_EQ(ioctls_after_statfs(2), before) << "granary.read_file sent ioctls";
  RunScript("mount_reads.py", {"--view", view, "--source-root", ds_.root, "--buffered"});
  EXPECT_GE(ioctls_after_statfs(3), before + static_cast<double>(ds_.sample_count()))
      << "Python's buffered open() asks isatty() of every file";
}

}  // namespace granary::testing
