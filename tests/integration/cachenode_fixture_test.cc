// Tests of the cache node integration fixture itself (tests/testing/
// daemon_process.h, cachenode_fixture.h), with programs other than the daemon:
// /bin/sh and /bin/sleep for DaemonProcess, a real ObservabilityServer for the
// HTTP and Prometheus helpers, a real redis-server for dataset creation, and a
// fake daemon script for CacheNode's start-up handling.

#include "testing/cachenode_fixture.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>
#include <thread>

#include "granary/core/file.h"
#include "granary/daemon/observability.h"
#include "testing/daemon_process.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

Result<std::unique_ptr<DaemonProcess>> StartShell(const TempDir& dir, const std::string& script,
                                                  std::vector<std::string> env = {}) {
  DaemonProcessOptions o;
  o.binary = "/bin/sh";
  o.args = {"-c", script};
  o.log_path = dir.Join("sh.log");
  o.env = std::move(env);
  return DaemonProcess::Start(std::move(o));
}

TEST(DaemonProcessTest, LogsStdoutAndStderrAndReportsTheExitCode) {
  TempDir dir;
  auto p = StartShell(dir, "echo to-stdout; echo to-stderr >&2; exit 3");
  ASSERT_OK(p);
  EXPECT_GT((*p)->pid(), 0);
  EXPECT_EQ((*p)->name(), "sh");
  auto exit = (*p)->Wait(10s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(3)) << exit->ToString();
  EXPECT_EQ(exit->ToString(), "exit code 3");
  EXPECT_FALSE((*p)->Running());
  EXPECT_EQ((*p)->pid(), -1);
  const std::string log = (*p)->ReadLog();
  EXPECT_THAT(log, HasSubstr("to-stdout\n"));
  EXPECT_THAT(log, HasSubstr("to-stderr\n"));
}

TEST(DaemonProcessTest, ASanitizerReportInTheLogFailsTheTest) {
  TempDir dir;
  EXPECT_NONFATAL_FAILURE(
      {
        auto p = StartShell(dir, "echo 'x.cc:1:2: runtime error: signed integer overflow'");
        ASSERT_OK(p);
        ASSERT_OK((*p)->Wait(10s));
        EXPECT_THAT((*p)->SanitizerReport(), HasSubstr("runtime error: signed integer overflow"));
      },
      "sh logged a sanitizer report: x.cc:1:2: runtime error: signed integer overflow");
  // A later process on the same log only answers for what it logged itself.
  auto clean = StartShell(dir, "echo fine");
  ASSERT_OK(clean);
  ASSERT_OK((*clean)->Wait(10s));
  EXPECT_EQ((*clean)->SanitizerReport(), "");
  // And a handle told not to check does not.
  DaemonProcessOptions o;
  o.binary = "/bin/sh";
  o.args = {"-c", "echo '==1==ERROR: AddressSanitizer: heap-use-after-free'"};
  o.log_path = dir.Join("unchecked.log");
  o.fail_on_sanitizer_report = false;
  auto unchecked = DaemonProcess::Start(o);
  ASSERT_OK(unchecked);
  ASSERT_OK((*unchecked)->Wait(10s));
  EXPECT_THAT((*unchecked)->SanitizerReport(), HasSubstr("heap-use-after-free"));
}

TEST(DaemonProcessTest, AppendsToAnExistingLog) {
  TempDir dir;
  for (const char* word : {"first", "second"}) {
    auto p = StartShell(dir, std::string("echo ") + word);
    ASSERT_OK(p);
    ASSERT_OK((*p)->Wait(10s));
  }
  EXPECT_EQ(ReadAll(dir.Join("sh.log")), "first\nsecond\n");
}

TEST(DaemonProcessTest, TerminateEndsAProgramThatHonoursSigterm) {
  TempDir dir;
  DaemonProcessOptions o;
  o.binary = "/bin/sleep";
  o.args = {"60"};
  o.log_path = dir.Join("sleep.log");
  auto p = DaemonProcess::Start(o);
  ASSERT_OK(p);
  EXPECT_TRUE((*p)->Running());
  const auto start = std::chrono::steady_clock::now();
  auto exit = (*p)->Terminate(10s);
  ASSERT_OK(exit);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_FALSE(exit->exited);
  EXPECT_EQ(exit->signal, SIGTERM);
  EXPECT_THAT(exit->ToString(), HasSubstr("signal 15"));
  // Terminating a reaped process gives its status again.
  auto again = (*p)->Terminate(1s);
  ASSERT_OK(again);
  EXPECT_EQ(again->signal, SIGTERM);
}

TEST(DaemonProcessTest, TerminateKillsAProgramThatIgnoresSigterm) {
  TempDir dir;
  // Each sleep is short, so nothing outlives the test once the shell is killed.
  auto p = StartShell(dir, "trap '' TERM; echo trapped; while true; do sleep 0.05; done");
  ASSERT_OK(p);
  ASSERT_TRUE(WaitFor([&] { return (*p)->ReadLog().find("trapped") != std::string::npos; }));
  auto exit = (*p)->Terminate(300ms);
  ASSERT_FALSE(exit.ok());
  EXPECT_EQ(exit.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(exit.status().message(), HasSubstr("killed it with SIGKILL"));
  ASSERT_TRUE((*p)->exit_status().has_value());
  EXPECT_EQ((*p)->exit_status()->signal, SIGKILL);
}

TEST(DaemonProcessTest, KillAndSignal) {
  TempDir dir;
  auto p = StartShell(dir, "trap 'echo got-hup' HUP; while true; do sleep 0.05; done");
  ASSERT_OK(p);
  // A trap is set once the shell runs its loop; before that HUP would end it.
  ASSERT_TRUE(WaitFor([&] {
    return ::access(("/proc/" + std::to_string((*p)->pid()) + "/status").c_str(), F_OK) == 0;
  }));
  std::this_thread::sleep_for(100ms);  // let the shell install its trap
  ASSERT_OK((*p)->Signal(SIGHUP));
  ASSERT_TRUE(WaitFor([&] { return (*p)->ReadLog().find("got-hup") != std::string::npos; }))
      << (*p)->ReadLog();
  auto exit = (*p)->Kill();
  ASSERT_OK(exit);
  EXPECT_EQ(exit->signal, SIGKILL);
  EXPECT_EQ((*p)->Signal(SIGTERM).code(), StatusCode::kFailedPrecondition);
}

TEST(DaemonProcessTest, WaitTimesOutOnARunningProgram) {
  TempDir dir;
  DaemonProcessOptions o;
  o.binary = "/bin/sleep";
  o.args = {"60"};
  o.log_path = dir.Join("sleep.log");
  auto p = DaemonProcess::Start(o);
  ASSERT_OK(p);
  auto exit = (*p)->Wait(100ms);
  EXPECT_EQ(exit.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE((*p)->Running());
}

TEST(DaemonProcessTest, DestructorKillsAndReaps) {
  TempDir dir;
  pid_t pid = -1;
  {
    DaemonProcessOptions o;
    o.binary = "/bin/sleep";
    o.args = {"60"};
    o.log_path = dir.Join("sleep.log");
    auto p = DaemonProcess::Start(o);
    ASSERT_OK(p);
    pid = (*p)->pid();
    ASSERT_EQ(::kill(pid, 0), 0);
  }
  // Reaped: the pid no longer names our child (not even a zombie).
  EXPECT_NE(::kill(pid, 0), 0);
  EXPECT_EQ(errno, ESRCH);
}

TEST(DaemonProcessTest, ExecFailureIsAStatus) {
  TempDir dir;
  DaemonProcessOptions o;
  o.binary = dir.Join("no-such-binary");
  o.log_path = dir.Join("x.log");
  auto p = DaemonProcess::Start(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(p.status().message(), HasSubstr("no-such-binary"));

  // Not executable.
  WriteAll(dir.Join("script"), "#!/bin/sh\nexit 0\n");
  ASSERT_EQ(::chmod(dir.Join("script").c_str(), 0644), 0);
  o.binary = dir.Join("script");
  if (::geteuid() != 0) {
    auto q = DaemonProcess::Start(o);
    ASSERT_FALSE(q.ok());
    EXPECT_EQ(q.status().code(), StatusCode::kPermissionDenied);
  }

  // Bad options.
  EXPECT_EQ(DaemonProcess::Start({}).status().code(), StatusCode::kInvalidArgument);
  DaemonProcessOptions no_log;
  no_log.binary = "/bin/true";
  EXPECT_EQ(DaemonProcess::Start(no_log).status().code(), StatusCode::kInvalidArgument);
  DaemonProcessOptions bad_log;
  bad_log.binary = "/bin/true";
  bad_log.log_path = dir.Join("no/such/dir/x.log");
  EXPECT_FALSE(DaemonProcess::Start(bad_log).ok());
}

TEST(DaemonProcessTest, ChildGetsOnlyStdioAndTheGivenEnvironment) {
  TempDir dir;
  // A descriptor the test holds without CLOEXEC must not reach the child.
  const int leaked = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(leaked, 0);
  ::setenv("GRANARY_FIXTURE_REPLACED", "old", 1);
  auto p =
      StartShell(dir, "ls /proc/$$/fd; echo \"env=$GRANARY_FIXTURE_NEW/$GRANARY_FIXTURE_REPLACED\"",
                 {"GRANARY_FIXTURE_NEW=new", "GRANARY_FIXTURE_REPLACED=replaced"});
  ::close(leaked);
  ::unsetenv("GRANARY_FIXTURE_REPLACED");
  ASSERT_OK(p);
  auto exit = (*p)->Wait(10s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(0));
  const std::string log = (*p)->ReadLog();
  EXPECT_THAT(log, HasSubstr("env=new/replaced\n"));
  std::set<std::string> fds;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && std::isdigit(static_cast<unsigned char>(line[0]))) fds.insert(line);
  }
  // ls itself opens one directory descriptor (3); nothing else but stdio.
  EXPECT_FALSE(fds.contains(std::to_string(leaked))) << log;
  for (const std::string& fd : fds) EXPECT_LE(std::stoi(fd), 3) << log;
}

TEST(PrometheusTextTest, ParsesSamplesLabelsAndSpecialValues) {
  const std::string text =
      "# HELP granary_x_total Things.\n"
      "# TYPE granary_x_total counter\n"
      "granary_x_total{dataset=\"a\"} 3\n"
      "granary_x_total{dataset=\"b\",kind=\"changed\"} 4.5 1700000000000\n"
      "granary_y_bytes 12\r\n"
      "granary_z{v=\"q\\\"uote\\\\back\\nline\"} +Inf\n"
      "\n"
      "granary_h_bucket{le=\"0.5\"} 1e3\n";
  auto samples = ParsePrometheusText(text);
  ASSERT_OK(samples);
  ASSERT_EQ(samples->size(), 5u);
  EXPECT_EQ((*samples)[1].labels.at("kind"), "changed");
  EXPECT_EQ((*samples)[1].value, 4.5);
  EXPECT_EQ((*samples)[3].labels.at("v"), "q\"uote\\back\nline");
  EXPECT_TRUE(std::isinf((*samples)[3].value));
  EXPECT_EQ((*samples)[4].value, 1000);
  EXPECT_EQ(SumSamples(*samples, "granary_x_total"), 7.5);
  EXPECT_EQ(SumSamples(*samples, "granary_x_total", {{"dataset", "a"}}), 3);
  EXPECT_EQ(SumSamples(*samples, "granary_x_total", {{"dataset", "c"}}), std::nullopt);
  EXPECT_EQ(SumSamples(*samples, "granary_nothing"), std::nullopt);
  EXPECT_EQ(SumSamples(*samples, "granary_y_bytes"), 12);

  for (const char* bad :
       {"{a=\"b\"} 1\n", "granary_x 1\ngranary_y{a=\"b} 2\n", "granary_x{a=b} 1\n",
        "granary_x{a} 1\n", "granary_x\n", "granary_x{a=\"b\"}\n", "granary_x abc\n"}) {
    auto r = ParsePrometheusText(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("metrics line")) << bad;
  }
}

TEST(HttpGetTest, AgainstARealObservabilityServer) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& family = prometheus::BuildCounter()
                     .Name("granary_fixture_things_total")
                     .Help("Things.")
                     .Register(*registry);
  family.Add({{"dataset", "ds"}}).Increment(7);
  bool ready = false;
  auto server = ObservabilityServer::Start("127.0.0.1:0", registry, [&ready] {
    return ready ? Status::Ok() : Status::Unavailable("not yet");
  });
  ASSERT_OK(server);
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());

  auto health = HttpGet(address, "/healthz");
  ASSERT_OK(health);
  EXPECT_EQ(health->status, 200);
  auto notready = HttpGet(address, "/readyz");
  ASSERT_OK(notready);
  EXPECT_EQ(notready->status, 503);
  EXPECT_THAT(notready->body, HasSubstr("not yet"));
  ready = true;
  EXPECT_EQ(HttpGet(address, "/readyz")->status, 200);
  EXPECT_EQ(HttpGet(address, "/nothing")->status, 404);

  auto metrics = HttpGet(address, "/metrics");
  ASSERT_OK(metrics);
  auto samples = ParsePrometheusText(metrics->body);
  ASSERT_OK(samples);
  EXPECT_EQ(SumSamples(*samples, "granary_fixture_things_total", {{"dataset", "ds"}}), 7);

  (*server)->Stop();
  auto gone = HttpGet(address, "/healthz", 2s);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(gone.status().message(), HasSubstr(address));
  EXPECT_FALSE(HttpGet("not-an-address", "/").ok());
}

TEST(CacheClusterTest, CreateDatasetWritesFilesManifestAndRecord) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  DatasetOptions o;
  o.name = "fixture";
  o.files = 250;
  o.min_size = 100;
  o.max_size = 3000;
  o.files_per_directory = 40;
  o.chunk_size = 16 * 1024;
  o.pool = "pool-a";
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  EXPECT_EQ(ds->sample_count(), 250u);
  EXPECT_EQ(ds->AllIds().size(), 250u);
  EXPECT_GT(ds->manifest->chunk_count(), 10u);
  uint64_t total = 0;
  for (SampleId id : ds->AllIds()) {
    ASSERT_EQ(ReadAll(ds->PathOf(id)), ds->contents[id]) << id;
    EXPECT_GE(ds->contents[id].size(), 100u);
    EXPECT_LE(ds->contents[id].size(), 3000u);
    total += ds->contents[id].size();
  }
  EXPECT_EQ(total, ds->total_bytes);
  EXPECT_EQ(ds->manifest->total_bytes(), total);

  auto record = (*cluster)->store().GetDataset("fixture");
  ASSERT_OK(record);
  EXPECT_EQ(record->state.phase, DatasetPhase::kStaging);
  EXPECT_EQ(record->manifest_id, ds->manifest_id.ToHex());
  EXPECT_EQ(record->spec.pool, "pool-a");
  EXPECT_EQ(record->spec.chunk_size, 16u * 1024);
  EXPECT_EQ(record->spec.source_uri, "file://" + ds->root);
  EXPECT_EQ(record->owner.uid, ::getuid());
  EXPECT_EQ(record->owner.gid, ::getgid());
  auto blob = (*cluster)->store().GetManifest(record->manifest_id);
  ASSERT_OK(blob);
  auto decoded = Manifest::Decode(*blob);
  ASSERT_OK(decoded);
  EXPECT_EQ(decoded->id(), ds->manifest_id);

  // A second dataset of the same name is refused; bad sizes too.
  EXPECT_EQ((*cluster)->CreateDataset(o).status().code(), StatusCode::kAlreadyExists);
  DatasetOptions bad = o;
  bad.name = "bad";
  bad.min_size = 0;
  EXPECT_EQ((*cluster)->CreateDataset(bad).status().code(), StatusCode::kInvalidArgument);

  // The describer and the phase wait.
  EXPECT_THAT((*cluster)->Describe("fixture"), HasSubstr("phase Staging"));
  auto waited = (*cluster)->WaitForPhase("fixture", DatasetPhase::kReady, 200ms);
  ASSERT_FALSE(waited.ok());
  EXPECT_EQ(waited.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(waited.status().message(), HasSubstr("phase Staging"));
  ASSERT_OK((*cluster)->WaitForPhase("fixture", DatasetPhase::kStaging, 1s));
}

TEST(CacheClusterTest, PlacementAndReaderOwnersFollowTheLiveNodes) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  DatasetOptions o;
  o.files = 300;
  o.chunk_size = 8 * 1024;
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  MetadataStore& store = (*cluster)->store();
  for (const char* id : {"a", "b", "c"}) {
    NodeRecord n;
    n.id = id;
    n.pool = "default";
    n.address = "127.0.0.1:1";
    n.capacity_bytes = id[0] == 'c' ? 3u << 30 : 1u << 30;
    ASSERT_OK(store.Heartbeat(n, 60s));
  }
  std::map<std::string, std::string> addresses;
  auto placement = PlacementOf(store, "default", &addresses);
  ASSERT_OK(placement);
  EXPECT_EQ(placement->node_count(), 3u);
  EXPECT_EQ(addresses.size(), 3u);
  DatasetReader reader(&store, *ds, 1s);
  ASSERT_OK(reader.Refresh());
  std::map<std::string, int> owned;
  for (SampleId id : ds->AllIds()) {
    auto owner = reader.OwnerOf(id);
    ASSERT_OK(owner);
    EXPECT_EQ(
        *owner,
        placement->nodes()[placement->Primary(ds->manifest_id, ds->manifest->ChunkOf(id))].id);
    ++owned[*owner];
  }
  EXPECT_EQ(owned.size(), 3u);
  EXPECT_GT(owned["c"], owned["a"]);  // three times the weight

  // Nobody listens on port 1: reads fail per sample, never crash or hang.
  auto got = reader.Read({0, 1, 2});
  for (const auto& outcome : got) EXPECT_FALSE(outcome.status.ok());
  std::vector<std::string> wrong;
  auto all = reader.ReadAllCorrect({0, 1}, 200ms, &wrong);
  EXPECT_EQ(all.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(all.message(), HasSubstr("2 of 2 samples still failed"));
  EXPECT_TRUE(wrong.empty());

  for (const char* id : {"a", "b", "c"}) ASSERT_OK(store.RemoveNode(id));
  ASSERT_OK(reader.Refresh());
  EXPECT_EQ(reader.OwnerOf(0).status().code(), StatusCode::kNotFound);
}

TEST(CacheNodeTest, WritesItsConfigAndReportsAnEarlyExitWithTheLog) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  // A stand-in daemon that prints its config and fails.
  const std::string fake = (*cluster)->dir().Join("fake-cachenode");
  WriteAll(fake, "#!/bin/sh\necho \"args: $*\"\ncat \"$2\"\nexit 2\n");
  ASSERT_EQ(::chmod(fake.c_str(), 0755), 0);
  ::setenv("GRANARY_CACHENODE_BINARY", fake.c_str(), 1);
  CacheNodeOptions o;
  o.capacity_bytes = 12345;
  o.extra_yaml = "scan_mode: verify\n";
  CacheNode& node = (*cluster)->AddNode(o);
  EXPECT_EQ(node.id(), "node-1");
  const Status started = node.StartAndWaitReady(10s);
  ::unsetenv("GRANARY_CACHENODE_BINARY");
  ASSERT_FALSE(started.ok());
  EXPECT_EQ(started.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(started.message(), HasSubstr("node-1 exited (exit code 2)"));
  EXPECT_THAT(started.message(), HasSubstr("args: --config " + node.config_path()));
  for (const std::string& line : std::vector<std::string>{
           "node_id: node-1\n", "pool: default\n", "listen: " + node.address() + "\n",
           "advertise: " + node.address() + "\n", "data_dir: " + node.data_dir() + "\n",
           "capacity: 12345\n", "metadata_store: " + (*cluster)->store_url() + "\n",
           "metrics_listen: " + node.metrics_address() + "\n", "heartbeat_interval: 200ms\n",
           "heartbeat_ttl: 1s\n", "scan_mode: verify\n"}) {
    EXPECT_THAT(started.message(), HasSubstr(line));
    EXPECT_THAT(ReadAll(node.config_path()), HasSubstr(line));
  }
  EXPECT_NE(node.address(), node.metrics_address());
  EXPECT_THAT(node.data_dir(), HasSubstr((*cluster)->dir().path()));
  auto exit = node.WaitExit(1s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(2));
  EXPECT_THAT(node.Log(), HasSubstr("args: --config"));
  EXPECT_THAT(node.Log(), Not(HasSubstr("in use")));
}

TEST(CacheNodeTest, WaitReadyTimesOutOnADaemonThatNeverAnswers) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  const std::string fake = (*cluster)->dir().Join("silent-cachenode");
  WriteAll(fake, "#!/bin/sh\nexec sleep 60\n");
  ASSERT_EQ(::chmod(fake.c_str(), 0755), 0);
  ::setenv("GRANARY_CACHENODE_BINARY", fake.c_str(), 1);
  CacheNode& node = (*cluster)->AddNode();
  const Status started = node.Start();
  ::unsetenv("GRANARY_CACHENODE_BINARY");
  ASSERT_OK(started);
  EXPECT_EQ(node.Start().code(), StatusCode::kFailedPrecondition);  // already running
  const Status ready = node.WaitReady(300ms);
  EXPECT_EQ(ready.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(ready.message(), HasSubstr("the last /readyz"));
  EXPECT_TRUE(node.Running());
  auto exit = node.Terminate(5s);
  ASSERT_OK(exit);
  EXPECT_EQ(exit->signal, SIGTERM);
  EXPECT_EQ(node.MetricValue("x").status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace granary::testing
