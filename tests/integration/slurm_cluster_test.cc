// The burst buffer and node agent end to end on a real Slurm
// (tests/testing/slurm_cluster.h: munged, slurmctld and slurmd on loopback,
// burst_buffer.lua and the node's prolog.sh/epilog.sh from slurm/plugin/), a
// real cache node and Redis
// (cachenode_fixture.h), jobs submitted by uid 65534 (nobody):
//   - a bad #DW directive is refused by sbatch with its line and reason;
//   - a jobdw + stage_in job trains over its dataset through granary.torch
//     (every sample's SHA-256 checked against the source) and reads files by
//     path under $DW_JOB_STRIPED/<name>;
//   - a job whose source its user cannot read is held with the reason in
//     SystemComment, and nothing of it is staged;
//   - a persistentdw job over a dataset staged earlier reads it all with its
//     source moved away (and the cache node's source counters unchanged);
//   - a persistentdw job over a dataset its user may not read is held at
//     setup with the reason, and never runs; on the node, the prolog refuses
//     it too, and a job's sidecar serves only the job's datasets;
//   - after each job: no sidecar, no mount, no socket, no job directory, no
//     job-scoped dataset or chunk.
// Skipped (with the reason) when the Slurm binaries are not installed.

#include "testing/slurm_cluster.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "granary/cli/cli.h"
#include "granary/client/session.h"
#include "granary/core/file.h"
#include "testing/cachenode_fixture.h"
#include "testing/sidecar_fixture.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using client::Session;
using client::SessionOptions;
using std::chrono::seconds;

constexpr uint32_t kNobody = 65534;

std::string PythonPath() { return ::granary::testing::PythonPath(GRANARY_PYTHONPATH); }

// A /proc file's contents (ReadFileToString reads st_size bytes: 0 there).
std::string ReadProcFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return in ? text.str() : std::string();
}

class SlurmClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    if (!SlurmCluster::Available(&why)) {
      skip_reason_ = new std::string(why);
      return;
    }
    Result<std::unique_ptr<CacheCluster>> cache = CacheCluster::Create();
    ASSERT_OK(cache);
    cache_ = cache->release();
    CacheNodeOptions node;
    node.capacity_bytes = 2ull << 30;
    // A job's sidecar reads from the node only while the node is listed: a
    // 1 s TTL lapsed under a loaded CI machine and a job read the source.
    node.heartbeat_ttl = "10s";
    ASSERT_OK(cache_->StartNodes(1, node));
    SlurmClusterOptions o;
    o.granary_binary = GRANARY_CLI_BINARY;
    o.sidecar_binary = SidecarBinary();
    o.store_url = cache_->store_url();
    o.plugin_dir = std::string(GRANARY_SOURCE_DIR) + "/slurm/plugin";
    o.cache_node_id = cache_->node(0).id();
    Result<std::unique_ptr<SlurmCluster>> slurm = SlurmCluster::Start(o);
    ASSERT_OK(slurm);
    slurm_ = slurm->release();
  }

  static void TearDownTestSuite() {
    delete slurm_;
    slurm_ = nullptr;
    delete cache_;
    cache_ = nullptr;
  }

  void SetUp() override {
    if (skip_reason_ != nullptr) GTEST_SKIP() << *skip_reason_;
    ASSERT_NE(slurm_, nullptr) << "the Slurm cluster did not start (see above)";
  }

  void TearDown() override {
    if (HasFailure() && slurm_ != nullptr) {
      std::fprintf(stderr, "%s\n", slurm_->LogTails(8192).c_str());
    }
  }

  // A source tree under the Slurm dir (readable by the job's user): `files`
  // files in four directories.
  static void MakeSource(const std::string& root, int files) {
    std::filesystem::create_directories(root);
    for (int i = 0; i < files; ++i) {
      const std::string rel = "class-" + std::to_string(i % 4) + "/f" + std::to_string(i) + ".bin";
      const std::string data = Bytes(root + rel, 512 + static_cast<size_t>(i % 7) * 331);
      std::filesystem::create_directories(root + "/class-" + std::to_string(i % 4));
      WriteAll(root + "/" + rel, data);
    }
  }

  static std::string WriteScript(const std::string& name, const std::string& body) {
    const std::string path = slurm_->dir() + "/" + name;
    WriteAll(path, body);
    ::chmod(path.c_str(), 0644);
    return path;
  }

  static std::string JobHeader(const std::string& name) {
    return "#!/bin/sh\n#SBATCH -o " + slurm_->out_dir() + "/" + name + "-%j.out\n";
  }

  static std::string TrainerLine(const std::string& golden, const std::string& mount) {
    return "export PYTHONPATH='" + PythonPath() + "' PYTHONDONTWRITEBYTECODE=1\n" +
           "exec /usr/bin/python3 '" + std::string(GRANARY_SOURCE_DIR) +
           "/tests/trainer/check_epochs.py' --golden '" + golden + "'" +
           (mount.empty() ? "" : " --mount \"" + mount + "\"") + "\n";
  }

  static std::string JobOutput(const std::string& name, const std::string& job) {
    Result<std::string> text =
        ReadFileToString(slurm_->out_dir() + "/" + name + "-" + job + ".out");
    return text.ok() ? *text : "(no output: " + text.status().ToString() + ")";
  }

  // Runs `granary <args>` in-process against the test's store.
  static Status Cli(std::vector<std::string> args, std::string* output = nullptr) {
    args.insert(args.begin(), {"--store", cache_->store_url()});
    std::ostringstream out;
    std::ostringstream err;
    const int code = RunCli(args, out, err, /*interactive=*/false);
    if (output != nullptr) *output = out.str() + err.str();
    if (code != 0)
      return Status::Internal("granary exit " + std::to_string(code) + ": " + err.str());
    return Status::Ok();
  }

  // Sidecar processes started for `job` (their command line names its state).
  static int SidecarsOf(const std::string& job) {
    int n = 0;
    const std::string needle = slurm_->job_root() + "/.job-" + job + "/";
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string name = entry.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      const std::string cmdline = ReadProcFile(entry.path().string() + "/cmdline");
      const std::string stat = ReadProcFile(entry.path().string() + "/stat");
      const size_t paren = stat.rfind(')');
      const bool zombie =
          paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
      if (!zombie && cmdline.find(needle) != std::string::npos) ++n;
    }
    return n;
  }

  static std::vector<std::string> MountsUnderJobRoot() {
    std::vector<std::string> out;
    std::istringstream lines(ReadProcFile("/proc/self/mountinfo"));
    std::string line;
    while (std::getline(lines, line)) {
      if (line.find(slurm_->job_root()) != std::string::npos) out.push_back(line);
    }
    return out;
  }

  static std::vector<std::string> JobDatasets(const std::string& job) {
    std::vector<std::string> out;
    Result<std::vector<DatasetRecord>> all = cache_->store().ListDatasets();
    if (!all.ok()) return {"(store: " + all.status().ToString() + ")"};
    for (const DatasetRecord& d : *all) {
      if (d.name.starts_with("slurm-" + job + "-")) out.push_back(d.name);
    }
    return out;
  }

  // The cache node's chunk files of the job's datasets (<data>/<dataset>/...).
  static size_t JobChunkFiles(const std::string& job) {
    size_t n = 0;
    for (const std::string& f : cache_->node(0).ChunkFiles()) {
      if (f.find("/slurm-" + job + "-") != std::string::npos) ++n;
    }
    return n;
  }

  // Waits until a step failed for `job` (its SystemComment says why), up to
  // 60 s; *fields is `scontrol show job` then.
  static void WaitForSystemComment(const std::string& job,
                                   std::map<std::string, std::string>* fields) {
    ASSERT_TRUE(WaitFor(
        [&] {
          Result<std::map<std::string, std::string>> f = slurm_->ShowJob(job);
          if (f.ok()) *fields = *f;
          return f.ok() && !(*fields)["SystemComment"].empty();
        },
        seconds(60), std::chrono::milliseconds(250)))
        << "state " << (*fields)["JobState"] << " reason " << (*fields)["Reason"];
  }

  // Cancels a job held by a failed step; then nothing of it is left.
  static void CancelHeldJob(const std::string& job) {
    Result<SlurmCommandResult> cancel = slurm_->Run({"scancel", job}, /*as_user=*/false);
    ASSERT_OK(cancel);
    EXPECT_EQ(cancel->exit_code, 0) << cancel->output;
    ExpectNothingLeft(job);
  }

  // After a job: nothing of it left on the node or in the cache.
  static void ExpectNothingLeft(const std::string& job) {
    const std::string dir = slurm_->job_root() + "/job-" + job;
    EXPECT_TRUE(WaitFor(
        [&] {
          return SidecarsOf(job) == 0 && MountsUnderJobRoot().empty() &&
                 ::access(dir.c_str(), F_OK) != 0 && ::access((dir + ".sock").c_str(), F_OK) != 0 &&
                 ::access((slurm_->job_root() + "/.job-" + job).c_str(), F_OK) != 0;
        },
        seconds(30), std::chrono::milliseconds(100)))
        << "job " << job << ": sidecars " << SidecarsOf(job) << ", mounts "
        << MountsUnderJobRoot().size() << ", dir "
        << (::access(dir.c_str(), F_OK) == 0 ? "left" : "gone");
    // The teardown deletes the job's datasets; the node drops their chunks.
    EXPECT_TRUE(WaitFor([&] { return JobDatasets(job).empty(); }, seconds(60),
                        std::chrono::milliseconds(200)))
        << "job " << job << ": datasets left: " << JobDatasets(job).size();
    // ... and the cache node drops their chunk files (<data>/<dataset>/...).
    auto job_chunks = [&] { return JobChunkFiles(job); };
    EXPECT_TRUE(
        WaitFor([&] { return job_chunks() == 0; }, seconds(30), std::chrono::milliseconds(200)))
        << "job " << job << ": chunk files left: " << job_chunks();
  }

  static std::string* skip_reason_;
  static CacheCluster* cache_;
  static SlurmCluster* slurm_;
};

std::string* SlurmClusterTest::skip_reason_ = nullptr;
CacheCluster* SlurmClusterTest::cache_ = nullptr;
SlurmCluster* SlurmClusterTest::slurm_ = nullptr;

TEST_F(SlurmClusterTest, BadDirectiveIsRefusedBySbatchWithLineAndReason) {
  const std::string script = WriteScript(
      "bad.sh",
      JobHeader("bad") +
          "#DW jobdw type=scratch capacity=1GiB pool=default\n"
          "#DW stage_in type=directory source=relative/dir destination=$DW_JOB_STRIPED/x\n"
          "#DW swap 1GiB\n"
          "true\n");
  Result<std::string> job = slurm_->Submit(script);
  ASSERT_FALSE(job.ok()) << "sbatch accepted job " << *job;
  const std::string& said = job.status().message();
  EXPECT_NE(said.find("line 4"), std::string::npos) << said;
  EXPECT_NE(said.find("relative"), std::string::npos) << said;
  EXPECT_NE(said.find("line 5"), std::string::npos) << said;
  EXPECT_NE(said.find("not supported"), std::string::npos) << said;
  // A pool slurm_bb_pools did not return is refused by Slurm itself before
  // the script is looked at (docs/slurm.md, troubleshooting).
  const std::string pool = WriteScript(
      "bad-pool.sh", JobHeader("bad") + "#DW jobdw capacity=1GiB pool=nosuchpool\ntrue\n");
  Result<std::string> job2 = slurm_->Submit(pool);
  ASSERT_FALSE(job2.ok()) << "sbatch accepted job " << *job2;
  EXPECT_NE(job2.status().message().find("Burst Buffer request invalid"), std::string::npos)
      << job2.status().message();
}

#define SKIP_IF_ASAN() \
  if (kAsanBuild)      \
  GTEST_SKIP() << "an ASan build's Python module cannot be loaded by /usr/bin/python3"

TEST_F(SlurmClusterTest, StageInJobTrainsOverItsDatasetAndReadsFilesByPath) {
  SKIP_IF_ASAN();
  const std::string src = slurm_->dir() + "/src-train";
  MakeSource(src, 240);
  const std::string go = slurm_->out_dir() + "/train-go";
  const std::string script = WriteScript(
      "train.sh",
      JobHeader("train") +
          "#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=default\n"
          "#DW stage_in type=directory source=" +
          src +
          " destination=$DW_JOB_STRIPED/train\n"
          "set -e\n"
          "echo \"socket=$GRANARY_SOCKET dataset=$GRANARY_DATASET dir=$DW_JOB_STRIPED\"\n"
          // Holds until the test has looked at the node (at most 60 s).
          "i=0; while [ ! -e " +
          go +
          " ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n"
          "test -S \"$GRANARY_SOCKET\"\n"
          "ls \"$DW_JOB_STRIPED/train\"\n"
          "echo \"mounts=$(grep -c \" $DW_JOB_STRIPED/train \" /proc/self/mountinfo)\"\n"
          // Placed on this node's cache node by the prolog (setup made it on none).
          "'" +
          std::string(GRANARY_CLI_BINARY) +
          "' --store \"$GRANARY_STORE\" dataset show \"$GRANARY_DATASET\" | grep 'placed on'\n" +
          TrainerLine(src, "$DW_JOB_STRIPED/train"));
  Result<std::string> job = slurm_->Submit(script);
  ASSERT_OK(job);
  // While it runs: its sidecar, its view, its socket (the job user's), its
  // dataset's chunks; what ExpectNothingLeft must then find gone.
  ASSERT_OK(slurm_->WaitForJobState(*job, {"RUNNING"}, seconds(60)));
  // Slurm may show RUNNING while the prolog still runs; giving the socket to
  // the job's user is the prolog's last step.
  const std::string socket = slurm_->job_root() + "/job-" + *job + ".sock";
  EXPECT_TRUE(WaitFor(
      [&] {
        struct stat st {};
        return ::stat(socket.c_str(), &st) == 0 && st.st_uid == kNobody;
      },
      seconds(60)))
      << "the job's socket " << socket << " was not given to uid " << kNobody;
  EXPECT_EQ(SidecarsOf(*job), 1);
  EXPECT_EQ(MountsUnderJobRoot().size(), 1u);
  EXPECT_TRUE(WaitFor([&] { return JobChunkFiles(*job) > 0; }, seconds(30)))
      << "no chunk of slurm-" << *job << "-train on the cache node";
  WriteAll(go, "");
  Result<std::map<std::string, std::string>> end =
      slurm_->WaitForJobState(*job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, seconds(120));
  ASSERT_OK(end);
  const std::string output = JobOutput("train", *job);
  EXPECT_EQ((*end)["JobState"], "COMPLETED")
      << output << "\nreason " << (*end)["Reason"] << " comment " << (*end)["SystemComment"];
  EXPECT_NE(output.find("trainer OK: 240 samples checked through the sidecar"), std::string::npos)
      << output;
  EXPECT_NE(output.find("dataset=slurm-" + *job + "-train"), std::string::npos) << output;
  EXPECT_NE(output.find("class-0"), std::string::npos) << "ls of the view: " << output;
  // What ExpectNothingLeft looks for after the job was there during it.
  EXPECT_NE(output.find("mounts=1"), std::string::npos) << output;
  EXPECT_NE(output.find("placed on:   " + cache_->node(0).id()), std::string::npos) << output;
  ExpectNothingLeft(*job);
}

// Their malformed forms are refused by sbatch with the line and why.
TEST_F(SlurmClusterTest, MalformedContinuationAndPercentSymbolAreRefusedBySbatch) {
  const std::string script =
      WriteScript("bad-forms.sh", JobHeader("bad") +
                                      "#DW jobdw type=scratch capacity=1GiB pool=default \\\n"
                                      "#SBATCH -N 1\n"
                                      "#DW stage_in source=/tmp destination=$DW_JOB_STRIPED/d-%u\n"
                                      "true\n");
  Result<std::string> job = slurm_->Submit(script);
  ASSERT_FALSE(job.ok()) << "sbatch accepted job " << *job;
  const std::string& said = job.status().message();
  EXPECT_NE(said.find("line 3: #DW: line 3 ends in '\\' but line 4 does not start with #DW"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("line 5: #DW stage_in: destination=$DW_JOB_STRIPED/d-%u: %u (the user name)"),
            std::string::npos)
      << said;
}

// The two forms Slurm reads its own way: a jobdw continued on a second #DW
// line (Slurm merges them) and a stage_in whose destination holds %j and whose
// source holds %% (Slurm gives setup and data_in a copy with them replaced, as
// /proc/<slurmctld>/fd/<n>; paths and the prolog get the script as submitted).
TEST_F(SlurmClusterTest, ContinuedJobDwAndPercentJDestinationAreStagedAsSlurmPassesThem) {
  const std::string src = slurm_->dir() + "/src-100%";
  MakeSource(src, 24);
  const std::string script =
      WriteScript("percent.sh", JobHeader("percent") +
                                    "#DW jobdw type=scratch capacity=1GiB \\\n"
                                    "#DW access_mode=striped pool=default\n"
                                    "#DW stage_in type=directory source=" +
                                    slurm_->dir() +
                                    "/src-100%% destination=$DW_JOB_STRIPED/data-%j\n"
                                    "set -e\n"
                                    "echo \"dataset=$GRANARY_DATASET\"\n"
                                    "d=\"$DW_JOB_STRIPED/data-$SLURM_JOB_ID\"\n"
                                    "ls \"$d\"\n"
                                    "cmp \"$d/class-1/f5.bin\" '" +
                                    src + "/class-1/f5.bin' && echo same-bytes\n");
  Result<std::string> job = slurm_->Submit(script);
  ASSERT_OK(job);
  Result<std::map<std::string, std::string>> end =
      slurm_->WaitForJobState(*job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, seconds(120));
  ASSERT_OK(end);
  const std::string output = JobOutput("percent", *job);
  EXPECT_EQ((*end)["JobState"], "COMPLETED")
      << output << "\nreason " << (*end)["Reason"] << " comment " << (*end)["SystemComment"];
  EXPECT_NE(output.find("dataset=slurm-" + *job + "-data-" + *job), std::string::npos) << output;
  EXPECT_NE(output.find("class-1"), std::string::npos) << "ls of the view: " << output;
  EXPECT_NE(output.find("same-bytes"), std::string::npos) << output;
  ExpectNothingLeft(*job);
}

TEST_F(SlurmClusterTest, SourceTheUserCannotReadHoldsTheJobWithTheReason) {
  const std::string src = slurm_->dir() + "/src-secret";
  MakeSource(src, 20);
  ASSERT_EQ(::chmod(src.c_str(), 0700), 0);  // root's; uid 65534 cannot list it
  const std::string script = WriteScript("secret.sh", JobHeader("secret") +
                                                          "#DW jobdw capacity=1GiB pool=default\n"
                                                          "#DW stage_in source=" +
                                                          src +
                                                          " destination=$DW_JOB_STRIPED/secret\n"
                                                          "echo ran\n");
  Result<std::string> job = slurm_->Submit(script);
  ASSERT_OK(job);
  std::map<std::string, std::string> fields;
  ASSERT_NO_FATAL_FAILURE(WaitForSystemComment(*job, &fields));
  const std::string& comment = fields["SystemComment"];
  EXPECT_NE(comment.find(src), std::string::npos) << comment;
  EXPECT_TRUE(comment.find("ermission denied") != std::string::npos ||
              comment.find("cannot read") != std::string::npos)
      << comment;
  // Held: pending with priority 0 and data_in's failure as the reason.
  EXPECT_EQ(fields["JobState"], "PENDING") << "the job must not run";
  EXPECT_EQ(fields["Priority"], "0") << "not held";
  EXPECT_NE(fields["Reason"].find("slurm_bb_data_in"), std::string::npos) << fields["Reason"];
  EXPECT_NE(::access((slurm_->out_dir() + "/secret-" + *job + ".out").c_str(), F_OK), 0)
      << "the job ran: " << JobOutput("secret", *job);
  // Nothing of it usable, nothing cached.
  Result<std::vector<DatasetRecord>> all = cache_->store().ListDatasets();
  ASSERT_OK(all);
  for (const DatasetRecord& d : *all) {
    if (!d.name.starts_with("slurm-" + *job + "-")) continue;
    EXPECT_TRUE(d.manifest_id.empty()) << d.name << " has a snapshot";
    EXPECT_NE(d.state.phase, DatasetPhase::kStaging) << d.name;
    EXPECT_NE(d.state.phase, DatasetPhase::kReady) << d.name;
  }
  CancelHeldJob(*job);
}

// A persistentdw job of a dataset its user may not read: Slurm 22.05 gives
// the submission check no user, so setup refuses it and the job is held with
// the reason and the fix; it never runs. (Slurm 23.02+ refuses it at sbatch:
// slurm_bb_job_process passes the user to `granary slurm validate`.)
TEST_F(SlurmClusterTest, PersistentDwOfAnotherUsersDatasetHoldsTheJobWithTheReason) {
  const std::string src = slurm_->dir() + "/src-private";
  MakeSource(src, 10);
  ASSERT_OK(Cli({"dataset", "create", "private", "--source", src, "--pool", "default"}));
  ASSERT_OK(cache_->WaitForPhase("private", DatasetPhase::kReady, seconds(60)));
  const std::string script =
      WriteScript("private.sh", JobHeader("private") + "#DW persistentdw name=private\necho ran\n");
  Result<std::string> job = slurm_->Submit(script);  // as uid 65534
  ASSERT_OK(job);
  std::map<std::string, std::string> fields;
  ASSERT_NO_FATAL_FAILURE(WaitForSystemComment(*job, &fields));
  const std::string& comment = fields["SystemComment"];
  EXPECT_NE(comment.find("may not read dataset 'private'"), std::string::npos) << comment;
  EXPECT_NE(comment.find("granary dataset grant private --user nobody"), std::string::npos)
      << comment;
  EXPECT_EQ(fields["JobState"], "PENDING") << "the job must not run";
  EXPECT_EQ(fields["Priority"], "0") << "not held";
  EXPECT_NE(fields["Reason"].find("slurm_bb_setup"), std::string::npos) << fields["Reason"];
  EXPECT_NE(::access((slurm_->out_dir() + "/private-" + *job + ".out").c_str(), F_OK), 0)
      << "the job ran: " << JobOutput("private", *job);
  CancelHeldJob(*job);
  ASSERT_OK(Cli({"dataset", "delete", "private"}));
}

TEST_F(SlurmClusterTest, PersistentDwJobReadsAStagedDatasetWithoutTheSource) {
  SKIP_IF_ASAN();
  const std::string src = slurm_->dir() + "/src-keep";
  MakeSource(src, 150);
  ASSERT_OK(Cli({"dataset", "create", "keep", "--source", src, "--pool", "default", "--owner",
                 std::to_string(kNobody) + ":" + std::to_string(kNobody)}));
  ASSERT_OK(cache_->WaitForPhase("keep", DatasetPhase::kReady, seconds(60)));
  const std::map<std::string, std::string> kKeep = {{"dataset", "keep"}};
  // Staging opened every file once (metrics lag by up to 500 ms).
  Result<double> opens = cache_->node(0).WaitForMetric("granary_cachenode_source_opens_total",
                                                       kKeep, [](double v) { return v >= 150; });
  ASSERT_OK(opens);
  // A file's read calls come after its open: take them once two scrapes a few
  // refreshes apart agree.
  Result<double> reads = cache_->node(0).WaitForSettledMetric(
      "granary_cachenode_source_read_calls_total", kKeep, [](double) { return true; });
  ASSERT_OK(reads);
  // The source gone: any source operation now fails the job.
  std::filesystem::rename(src, src + ".moved");
  const std::string script =
      WriteScript("keep.sh", JobHeader("keep") + "#DW persistentdw name=keep\nset -e\n" +
                                 "test -z \"$DW_JOB_STRIPED\"\n" + TrainerLine(src + ".moved", ""));
  Result<std::string> job = slurm_->Submit(script);
  ASSERT_OK(job);
  Result<std::map<std::string, std::string>> end =
      slurm_->WaitForJobState(*job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, seconds(120));
  ASSERT_OK(end);
  const std::string output = JobOutput("keep", *job);
  EXPECT_EQ((*end)["JobState"], "COMPLETED") << output;
  EXPECT_NE(output.find("trainer OK: 150 samples"), std::string::npos) << output;
  // No source operation: the counters stay put over 4 refreshes after the job
  // (and the source is not there to be read).
  const double before = *opens + *reads;
  Result<double> changed = cache_->node(0).WaitForMetric(
      "granary_cachenode_source_opens_total", kKeep, [&](double v) { return v != *opens; },
      std::chrono::milliseconds(2000));
  EXPECT_FALSE(changed.ok()) << "the cache node opened source files during the job: " << *opens
                             << " -> " << *changed;
  Result<double> reads_after =
      cache_->node(0).MetricValue("granary_cachenode_source_read_calls_total", kKeep);
  ASSERT_OK(reads_after);
  EXPECT_EQ(*opens + *reads_after, before);
  Result<double> errors =
      cache_->node(0).MetricValue("granary_cachenode_source_errors_total", kKeep);
  EXPECT_TRUE(!errors.ok() || *errors == 0) << "source errors: " << *errors;
  ExpectNothingLeft(*job);
  // The persistent dataset stays after the job.
  Result<DatasetRecord> kept = cache_->store().GetDataset("keep");
  ASSERT_OK(kept);
  EXPECT_EQ(kept->state.phase, DatasetPhase::kReady);
  std::filesystem::rename(src + ".moved", src);
}

// A persistentdw dataset takes part in the cache policy like any other: an
// admin gives it a byte limit with `granary dataset update`, its job reads
// every sample (the part the node does not keep from the source), and the
// limit lifted, the whole dataset is kept.
TEST_F(SlurmClusterTest, PersistentDwDatasetUnderAByteLimitIsReadWholeByItsJob) {
  SKIP_IF_ASAN();
  const std::string src = slurm_->dir() + "/src-part";
  MakeSource(src, 150);
  uint64_t bytes = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(src)) {
    if (e.is_regular_file()) bytes += e.file_size();
  }
  ASSERT_OK(Cli({"dataset", "create", "part", "--source", src, "--pool", "default", "--owner",
                 std::to_string(kNobody) + ":" + std::to_string(kNobody), "--chunk-size", "64KiB",
                 "--max-resident", std::to_string(bytes / 3)}));
  Result<DatasetRecord> ready = cache_->WaitForPhase("part", DatasetPhase::kReady, seconds(60));
  ASSERT_OK(ready);
  EXPECT_NE(ready->state.message.find("% resident"), std::string::npos) << ready->state.message;
  std::string shown;
  ASSERT_OK(Cli({"dataset", "show", "part"}, &shown));
  EXPECT_NE(shown.find("under their cache budgets"), std::string::npos) << shown;

  const std::string script = WriteScript(
      "part.sh", JobHeader("part") + "#DW persistentdw name=part\nset -e\n" + TrainerLine(src, ""));
  Result<std::string> job = slurm_->Submit(script);
  ASSERT_OK(job);
  Result<std::map<std::string, std::string>> end =
      slurm_->WaitForJobState(*job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, seconds(120));
  ASSERT_OK(end);
  const std::string output = JobOutput("part", *job);
  EXPECT_EQ((*end)["JobState"], "COMPLETED") << output;
  EXPECT_NE(output.find("trainer OK: 150 samples"), std::string::npos) << output;
  const std::map<std::string, std::string> kPart = {{"dataset", "part"}};
  EXPECT_OK(cache_->node(0).WaitForMetric("granary_cachenode_streamed_bytes_total", kPart,
                                          [](double v) { return v > 0; }));
  ExpectNothingLeft(*job);

  ASSERT_OK(Cli({"dataset", "update", "part", "--max-resident", "none"}));
  EXPECT_TRUE(WaitFor(
      [&] {
        Result<DatasetRecord> r = cache_->store().GetDataset("part");
        return r.ok() && r->state.phase == DatasetPhase::kReady &&
               r->state.message.rfind("staged on", 0) == 0;
      },
      seconds(60)))
      << cache_->Describe("part");
}

}  // namespace
}  // namespace granary::testing

namespace granary::testing {
namespace {

// `granary slurm prolog|epilog` run directly (as slurmd would), for what a
// job cannot show: bad inputs, failures and their clean-up, a crashed
// sidecar, a requeued job's second prolog.
class SlurmNodeStepsTest : public SlurmClusterTest {
 protected:
  std::string root() const { return slurm_->dir() + "/direct-jobs"; }

  // `extra` options ("--name", value pairs) replace the defaults of the same name.
  Status Prolog(const std::string& job, const std::string& script,
                const std::vector<std::string>& extra = {}, std::string* output = nullptr) {
    std::vector<std::pair<std::string, std::string>> options = {
        {"--uid", "65534"},
        {"--gid", "65534"},
        {"--job-root", root()},
        {"--sidecar", SidecarBinary()},
        {"--log-dir", slurm_->dir() + "/log"},
        {"--timeout", "30s"}};
    if (!script.empty()) options.emplace_back("--script", script);
    for (size_t i = 0; i + 1 < extra.size(); i += 2) {
      bool replaced = false;
      for (auto& option : options) {
        if (option.first == extra[i]) {
          option.second = extra[i + 1];
          replaced = true;
        }
      }
      if (!replaced) options.emplace_back(extra[i], extra[i + 1]);
    }
    std::vector<std::string> args = {"slurm", "prolog", job};
    for (const auto& option : options) args.insert(args.end(), {option.first, option.second});
    return Cli(args, output);
  }
  Status Epilog(const std::string& job, std::string* output = nullptr) {
    return Cli({"slurm", "epilog", job, "--job-root", root(), "--timeout", "10s"}, output);
  }
  // Nothing of `job` under the root, no sidecar of it.
  void ExpectClean(const std::string& job) {
    EXPECT_NE(::access((root() + "/job-" + job).c_str(), F_OK), 0);
    EXPECT_NE(::access((root() + "/job-" + job + ".sock").c_str(), F_OK), 0);
    EXPECT_NE(::access((root() + "/.job-" + job).c_str(), F_OK), 0);
    int sidecars = 0;
    const std::string needle = root() + "/.job-" + job + "/";
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string stat = ReadProcFile(entry.path().string() + "/stat");
      const size_t paren = stat.rfind(')');
      if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z')
        continue;
      if (ReadProcFile(entry.path().string() + "/cmdline").find(needle) != std::string::npos) {
        ++sidecars;
      }
    }
    EXPECT_EQ(sidecars, 0);
    for (const std::string& m : MountsUnderJobRoot()) {
      EXPECT_EQ(m.find(root() + "/job-" + job), std::string::npos) << m;
    }
  }
  // A job dataset slurm-<job>-data (Staging or Ready) and a script naming it.
  std::string JobWithDataset(const std::string& job) {
    DatasetOptions d;
    d.name = "slurm-" + job + "-data";
    d.files = 40;
    d.owner = DatasetOwner{kNobody, kNobody};
    Result<TestDataset> ds = cache_->CreateDataset(d);
    EXPECT_OK(ds);
    return WriteScript("direct-" + job + ".sh",
                       "#!/bin/sh\n#DW jobdw capacity=1GiB pool=default\n"
                       "#DW stage_in source=/unused destination=$DW_JOB_STRIPED/data\n");
  }
};

TEST_F(SlurmNodeStepsTest, BadArgumentsAreRefusedWithTheReason) {
  const std::string script = WriteScript("direct-none.sh", "#!/bin/sh\ntrue\n");
  std::string out;
  EXPECT_FALSE(Prolog("12;rm", script, {}, &out).ok());
  EXPECT_NE(out.find("12;rm"), std::string::npos) << out;
  EXPECT_FALSE(
      Cli({"slurm", "prolog", "12", "--uid", "nobody", "--gid", "1", "--job-root", root()}, &out)
          .ok());
  EXPECT_NE(out.find("'nobody' is not a numeric id"), std::string::npos) << out;
  EXPECT_FALSE(
      Cli({"slurm", "prolog", "12", "--uid", "1", "--gid", "1", "--job-root", "run/x"}, &out).ok());
  EXPECT_NE(out.find("not an absolute path"), std::string::npos) << out;
  EXPECT_FALSE(Prolog("12", script, {"--timeout", "soon"}, &out).ok());
  EXPECT_NE(out.find("soon"), std::string::npos) << out;
  EXPECT_FALSE(Epilog("x/../1", &out).ok());
  EXPECT_FALSE(Prolog("12", slurm_->dir() + "/no-such-script", {}, &out).ok());
  EXPECT_NE(out.find("no-such-script"), std::string::npos) << out;
  ExpectClean("12");
}

TEST_F(SlurmNodeStepsTest, JobsWithoutDirectivesAreLeftAlone) {
  const std::string script = WriteScript("direct-plain.sh", "#!/bin/sh\n#SBATCH -N 1\ntrue\n");
  std::string out;
  ASSERT_OK(Prolog("13", script, {}, &out));
  EXPECT_NE(out.find("nothing to do"), std::string::npos) << out;
  ASSERT_OK(Prolog("13", "", {}, &out));  // not a batch job: no script
  EXPECT_NE(out.find("nothing to do"), std::string::npos) << out;
  ExpectClean("13");
  EXPECT_NE(::access(root().c_str(), F_OK), 0) << "the prolog made " << root();
  ASSERT_OK(Epilog("13", &out));  // an epilog with nothing to do

  // A store that does not answer fails no job without directives (the node
  // would be drained for every job), only a job that needs it.
  auto prolog_without_store = [&](const std::string& job_script, std::string* said) {
    std::vector<std::string> args = {"--store", "redis://127.0.0.1:1/0",
                                     "slurm",   "prolog",
                                     "13",      "--uid",
                                     "65534",   "--gid",
                                     "65534",   "--job-root",
                                     root()};
    if (!job_script.empty()) args.insert(args.end(), {"--script", job_script});
    std::ostringstream o;
    std::ostringstream e;
    const int code = RunCli(args, o, e, /*interactive=*/false);
    *said = o.str() + e.str();
    return code;
  };
  EXPECT_EQ(prolog_without_store(script, &out), 0) << out;
  EXPECT_EQ(prolog_without_store("", &out), 0) << out;
  EXPECT_NE(out.find("the store cannot be asked"), std::string::npos) << out;
  const std::string dw = WriteScript("direct-dw.sh",
                                     "#!/bin/sh\n#DW jobdw capacity=1GiB pool=default\n"
                                     "#DW stage_in source=/x destination=$DW_JOB_STRIPED/x\n");
  EXPECT_NE(prolog_without_store(dw, &out), 0) << out;
  EXPECT_NE(out.find("127.0.0.1:1"), std::string::npos) << out;
  ExpectClean("13");
}

TEST_F(SlurmNodeStepsTest, PrologFailuresSayWhyAndLeaveNothing) {
  // The script names a stage_in dataset setup never made.
  const std::string missing =
      WriteScript("direct-missing.sh",
                  "#!/bin/sh\n#DW jobdw capacity=1GiB pool=default\n"
                  "#DW stage_in source=/x destination=$DW_JOB_STRIPED/gone\n");
  std::string out;
  EXPECT_FALSE(Prolog("14", missing, {}, &out).ok());
  EXPECT_NE(out.find("slurm-14-gone"), std::string::npos) << out;
  EXPECT_NE(out.find("not in the store"), std::string::npos) << out;
  ExpectClean("14");

  // Datasets of the job but no script to check them against.
  const std::string script = JobWithDataset("15");
  EXPECT_FALSE(Prolog("15", "", {}, &out).ok());
  EXPECT_NE(out.find("its script was not given"), std::string::npos) << out;
  // No sidecar binary; a sidecar that exits at start-up: its status and log.
  EXPECT_FALSE(Prolog("15", script, {"--sidecar", slurm_->dir() + "/no-sidecar"}, &out).ok());
  EXPECT_NE(out.find("no-sidecar"), std::string::npos) << out;
  ExpectClean("15");
  EXPECT_FALSE(Prolog("15", script, {"--sidecar", "/bin/false"}, &out).ok());
  EXPECT_NE(out.find("exited at start-up (exit status 1)"), std::string::npos) << out;
  ExpectClean("15");
  // A sidecar that never gets ready: the deadline, then it is stopped.
  const std::string hung = slurm_->dir() + "/hung-sidecar";
  WriteAll(hung, "#!/bin/sh\necho hung sidecar starting\nwhile :; do sleep 0.1; done\n");
  ASSERT_EQ(::chmod(hung.c_str(), 0755), 0);
  EXPECT_FALSE(Prolog("15", script, {"--sidecar", hung, "--timeout", "1s"}, &out).ok());
  EXPECT_NE(out.find("not ready within 1000 ms"), std::string::npos) << out;
  EXPECT_NE(out.find("hung sidecar starting"), std::string::npos) << "the log's tail: " << out;
  ExpectClean("15");
}

TEST_F(SlurmNodeStepsTest, EpilogCleansUpAfterACrashedSidecarAndIsIdempotent) {
  const std::string script = JobWithDataset("16");
  std::string out;
  ASSERT_OK(Prolog("16", script, {}, &out));
  const std::string view = root() + "/job-16/data";
  // Ready: the view holds the dataset, the socket is the job user's.
  std::vector<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(view)) {
    entries.push_back(e.path().filename().string());
  }
  EXPECT_FALSE(entries.empty()) << out;
  struct stat st {};
  ASSERT_EQ(::stat((root() + "/job-16.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kNobody);
  // A requeued job's prolog again: the old sidecar replaced, one left.
  Result<std::string> first_pid = ReadFileToString(root() + "/.job-16/sidecar.pid");
  ASSERT_OK(first_pid);
  ASSERT_OK(Prolog("16", script, {}, &out));
  Result<std::string> pid_text = ReadFileToString(root() + "/.job-16/sidecar.pid");
  ASSERT_OK(pid_text);
  EXPECT_NE(*pid_text, *first_pid);
  EXPECT_NE(
      ReadProcFile("/proc/" + std::to_string(std::stoi(*first_pid)) + "/cmdline").find("/.job-16/"),
      0u);
  // The sidecar crashes: its mount is left dead.
  const pid_t pid = std::stoi(*pid_text);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_TRUE(WaitFor([&] {
    const std::string stat_text = ReadProcFile("/proc/" + std::to_string(pid) + "/stat");
    const size_t paren = stat_text.rfind(')');
    return paren == std::string::npos || paren + 2 >= stat_text.size() ||
           stat_text[paren + 2] == 'Z';
  }));
  // Linux keeps a dead FUSE mount (ENOTCONN) until unmounted; some kernels
  // (gVisor) drop it with its server. The epilog must unmount what is left.
  bool mounted = false;
  for (const std::string& m : MountsUnderJobRoot()) mounted |= m.find(view) != std::string::npos;
  ASSERT_OK(Epilog("16", &out));
  if (mounted) {
    EXPECT_NE(out.find("stale views unmounted"), std::string::npos) << out;
  }
  ExpectClean("16");
  ASSERT_OK(Epilog("16", &out));  // again: nothing left to do, still OK
  EXPECT_NE(out.find("nothing running"), std::string::npos) << out;
  ExpectClean("16");
}

// persistentdw on the node: the prolog refuses a dataset the job's user may
// not read (before any sidecar starts); granted, the job's sidecar serves
// that dataset and no other of the pool; revoked, the next job is refused.
TEST_F(SlurmNodeStepsTest, PersistentDwNeedsTheUsersRightAndTheSidecarServesOnlyTheJobs) {
  for (const char* name : {"rootonly", "other"}) {
    DatasetOptions d;
    d.name = name;
    d.files = 20;
    d.owner = DatasetOwner{0, 0};
    ASSERT_OK(cache_->CreateDataset(d));
  }
  const std::string script =
      WriteScript("direct-pdw.sh", "#!/bin/sh\n#DW persistentdw name=rootonly\ntrue\n");
  std::string out;
  EXPECT_FALSE(Prolog("17", script, {}, &out).ok());  // as uid 65534
  EXPECT_NE(out.find("job 17: line 2: #DW persistentdw: nobody (uid 65534) may not read dataset "
                     "'rootonly'"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("granary dataset grant rootonly --user nobody"), std::string::npos) << out;
  ExpectClean("17");

  ASSERT_OK(Cli({"dataset", "grant", "rootonly", "--group", "nogroup"}));
  ASSERT_OK(Prolog("17", script, {}, &out));
  SessionOptions options;
  options.socket_path = root() + "/job-17.sock";
  Result<std::unique_ptr<Session>> granted = Session::Open("rootonly", options);
  ASSERT_OK(granted);
  EXPECT_EQ((*granted)->info().sample_count, 20u);
  Result<std::unique_ptr<Session>> other = Session::Open("other", options);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kPermissionDenied) << other.status().ToString();
  EXPECT_NE(other.status().message().find("serves only rootonly"), std::string::npos)
      << other.status().ToString();
  granted->reset();
  ASSERT_OK(Epilog("17", &out));
  ExpectClean("17");

  ASSERT_OK(Cli({"dataset", "revoke", "rootonly", "--group", "nogroup"}));
  EXPECT_FALSE(Prolog("18", script, {}, &out).ok());
  EXPECT_NE(out.find("may not read dataset 'rootonly'"), std::string::npos) << out;
  ExpectClean("18");
  // Root's own job may (uid 0 reads everything it stages).
  ASSERT_OK(Prolog("19", script, {"--uid", "0", "--gid", "0"}, &out));
  ASSERT_OK(Epilog("19", &out));
  ExpectClean("19");
}

}  // namespace
}  // namespace granary::testing
