// `granary cat` and `granary doctor` against the real thing: two
// granary-cachenode processes and Redis (CacheCluster), a granary-sidecar
// (SidecarProcess), the CLI in-process (RunCli) and as the real `granary`
// binary (for another user's rights and for a reader that goes away).

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "granary/cli/cli.h"
#include "granary/core/metadata_store.h"
#include "granary/peer/peer_auth.h"
#include "granary/posix/mount_point.h"
#include "granary/store/open_store.h"
#include "testing/cachenode_fixture.h"
#include "testing/sidecar_fixture.h"
#include "testing/test_util.h"

#ifndef GRANARY_CLI_BINARY
#error "GRANARY_CLI_BINARY must name the granary binary"
#endif

namespace granary {
namespace {

using std::chrono::seconds;
using testing::CacheCluster;
using testing::SidecarOptions;
using testing::SidecarProcess;
using testing::TestDataset;

constexpr uint32_t kNobody = 65534;

struct ProcessRun {
  int code = -1;
  int signal = 0;
  std::string out;
  std::string err;
};

// Runs `binary` with `args`, as `uid` (gid = uid) when given (the test runs
// as root), stdout and stderr captured. With `stdout_limit`, the read end of
// stdout is closed after that many bytes (a reader that goes away). Killed at
// a 60 s deadline.
ProcessRun RunProgram(const std::string& binary, const std::vector<std::string>& args,
                      std::optional<uint32_t> uid = std::nullopt, size_t stdout_limit = SIZE_MAX) {
  ProcessRun run;
  int out[2];
  int err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << std::strerror(errno);
    return run;
  }
  std::vector<std::string> argv_strings = {binary};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    if (uid) {
      if (syscall(SYS_setgroups, 0, nullptr) != 0 || syscall(SYS_setgid, *uid) != 0 ||
          syscall(SYS_setuid, *uid) != 0) {
        _exit(126);
      }
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  int fds[2] = {out[0], err[0]};
  std::string* sinks[2] = {&run.out, &run.err};
  while (fds[0] >= 0 || fds[1] >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ADD_FAILURE() << binary << " did not finish within 60 s";
      kill(pid, SIGKILL);
      break;
    }
    pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    if (poll(p, 2, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i] < 0 || p[i].revents == 0) continue;
      char buffer[65536];
      const ssize_t n = read(fds[i], buffer, sizeof(buffer));
      if (n > 0) sinks[i]->append(buffer, static_cast<size_t>(n));
      if (n == 0 || (n < 0 && errno != EINTR) || (i == 0 && run.out.size() >= stdout_limit)) {
        close(fds[i]);
        fds[i] = -1;
      }
    }
  }
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) run.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) run.signal = WTERMSIG(status);
  return run;
}

// The granary binary with `args` (RunProgram).
ProcessRun RunGranary(const std::vector<std::string>& args,
                      std::optional<uint32_t> uid = std::nullopt, size_t stdout_limit = SIZE_MAX) {
  return RunProgram(GRANARY_CLI_BINARY, args, uid, stdout_limit);
}

class CliClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = CacheCluster::Create();
    ASSERT_OK(cluster);
    cluster_ = std::move(*cluster);
    ASSERT_OK(cluster_->StartNodes(2));
    testing::DatasetOptions d;
    d.name = "pets";
    d.files = 120;
    d.min_size = 1;
    d.max_size = 150 * 1024;  // many span several chunks
    d.files_per_directory = 25;
    d.chunk_size = 64 * 1024;
    auto ds = cluster_->CreateDataset(d);
    ASSERT_OK(ds);
    ds_ = std::move(*ds);
    ASSERT_OK(cluster_->WaitForPhase(ds_.name, DatasetPhase::kReady));
  }

  // RunCli in-process against the cluster's store.
  ProcessRun Cli(std::vector<std::string> args) {
    args.insert(args.begin(), {"--store", cluster_->store_url()});
    std::ostringstream out;
    std::ostringstream err;
    ProcessRun run;
    run.code = RunCli(args, out, err);
    run.out = out.str();
    run.err = err.str();
    return run;
  }

  // `cat NAME` of every file of `ds`, in id order; the expected bytes.
  static std::vector<std::string> CatArgs(const TestDataset& ds, std::string* expected) {
    std::vector<std::string> args = {"cat", ds.name};
    for (SampleId id = 0; id < ds.sample_count(); ++id) {
      args.push_back(ds.manifest->PathOf(id));
      *expected += ds.contents[id];
    }
    return args;
  }

  SidecarProcess& StartSidecar(const std::string& extra_yaml = "") {
    SidecarOptions o;
    o.extra_yaml = extra_yaml;
    auto sidecar = testing::StartClusterSidecar(*cluster_, o);
    EXPECT_OK(sidecar);
    if (sidecar.ok()) sidecar_ = std::move(*sidecar);
    return *sidecar_;
  }

  // Lets uid `kNobody` reach the source trees (not the nodes' data).
  void OpenClusterDirForOthers() {
    ASSERT_EQ(chmod(cluster_->dir().path().c_str(), 0711), 0) << std::strerror(errno);
  }

  std::unique_ptr<CacheCluster> cluster_;
  TestDataset ds_;
  std::unique_ptr<SidecarProcess> sidecar_;
};

TEST_F(CliClusterTest, CatFromTheCacheNodesIsByteEqualWithoutTheSource) {
  // The source moved away: every byte must come from the cache nodes.
  const std::string moved = ds_.root + ".away";
  ASSERT_EQ(rename(ds_.root.c_str(), moved.c_str()), 0);
  std::string expected;
  std::vector<std::string> args = CatArgs(ds_, &expected);
  args.push_back("--direct");
  ProcessRun r = Cli(args);
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_TRUE(r.out == expected) << r.out.size() << " bytes, expected " << expected.size();
  EXPECT_EQ(r.err, "");
  // A file, a directory and a missing file together: the file is written,
  // each bad one named; the exit code is the first failure's.
  const std::string one = ds_.manifest->PathOf(7);
  r = Cli({"cat", ds_.name, "--direct", one, "d000", one + ".nope"});
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  EXPECT_EQ(r.out, ds_.contents[7]);
  EXPECT_NE(r.err.find("d000: is a directory"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no file or directory '" + one + ".nope'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("2 of 3 files could not be read"), std::string::npos) << r.err;
  r = Cli({"cat", ds_.name, "--direct", one + ".nope"});
  EXPECT_EQ(r.code, kCliNotFound) << r.err;
  for (const std::string& bad : {std::string("../etc/passwd"), std::string("/etc/passwd"),
                                 std::string("d000/../d001/x"), std::string(".")}) {
    r = Cli({"cat", ds_.name, "--direct", one, bad});
    EXPECT_EQ(r.code, kCliUsage) << bad << ": " << r.err;
    EXPECT_EQ(r.out, "") << bad << ": nothing is read before every path is checked";
  }
  r = Cli({"cat", "nope", "--direct", one});
  EXPECT_EQ(r.code, kCliNotFound) << r.err;
  ASSERT_EQ(rename(moved.c_str(), ds_.root.c_str()), 0);
}

TEST_F(CliClusterTest, CatThroughTheSidecarIsByteEqual) {
  SidecarProcess& sidecar = StartSidecar();
  std::string expected;
  std::vector<std::string> args = CatArgs(ds_, &expected);
  args.push_back("--socket");
  args.push_back(sidecar.socket_path());
  ProcessRun r = Cli(args);
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_TRUE(r.out == expected) << r.out.size() << " bytes, expected " << expected.size();
  // The sidecar served them (and nothing else did).
  auto served = sidecar.MetricValue("granary_sidecar_served_samples_total");
  ASSERT_OK(served);
  EXPECT_GE(*served, static_cast<double>(ds_.sample_count()));
  // $GRANARY_SOCKET is used when no --socket is given.
  ASSERT_EQ(setenv("GRANARY_SOCKET", sidecar.socket_path().c_str(), 1), 0);
  r = Cli({"cat", ds_.name, ds_.manifest->PathOf(3)});
  unsetenv("GRANARY_SOCKET");
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_EQ(r.out, ds_.contents[3]);
  // A missing file through the sidecar: exit 3, named.
  r = Cli({"cat", ds_.name, "--socket", sidecar.socket_path(), "d000/nope"});
  EXPECT_EQ(r.code, kCliNotFound) << r.err;
  EXPECT_NE(r.err.find("d000/nope"), std::string::npos) << r.err;
  // No sidecar at that path: exit 1 saying what to do.
  r = Cli({"cat", ds_.name, "--socket", cluster_->dir().Join("none.sock"), "d000/x"});
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  EXPECT_NE(r.err.find("--direct"), std::string::npos) << r.err;
  r = Cli({"cat", ds_.name, "--socket", sidecar.socket_path(), "--direct", "d000/x"});
  EXPECT_EQ(r.code, kCliUsage) << r.err;
}

TEST_F(CliClusterTest, CatWithACacheNodeKilled) {
  std::string expected;
  std::vector<std::string> args = CatArgs(ds_, &expected);
  args.push_back("--direct");
  ASSERT_OK(cluster_->node(0).Kill());
  // Fall-through on: every byte, from the other node or the source.
  ProcessRun r = Cli(args);
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_TRUE(r.out == expected) << r.out.size() << " bytes, expected " << expected.size();

  // Fall-through off: what can be read is right, what cannot is named, and
  // the exit status says so.
  args.push_back("--no-source");
  r = Cli(args);
  std::string written;
  size_t failed = 0;
  for (SampleId id = 0; id < ds_.sample_count(); ++id) {
    if (r.err.find("cat " + ds_.manifest->PathOf(id) + ": ") != std::string::npos) {
      ++failed;
    } else {
      written += ds_.contents[id];
    }
  }
  EXPECT_TRUE(r.out == written) << r.err;
  EXPECT_EQ(r.code, failed == 0 ? kCliOk : kCliFailed) << r.err;

  // No node at all and no fall-through: a clean failure for each file.
  ASSERT_OK(cluster_->node(1).Kill());
  r = Cli({"cat", ds_.name, "--direct", "--no-source", ds_.manifest->PathOf(0)});
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  EXPECT_EQ(r.out, "");
  // While the dead nodes' heartbeats live, the file fails by name; once they
  // expired, the pool has no node at all.
  EXPECT_TRUE(r.err.find("cat " + ds_.manifest->PathOf(0) + ": ") != std::string::npos ||
              r.err.find("no live cache node in pool") != std::string::npos)
      << r.err;
  // With fall-through the source still serves it, and the CLI says so.
  r = Cli({"cat", ds_.name, "--direct", ds_.manifest->PathOf(0)});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_EQ(r.out, ds_.contents[0]);
  EXPECT_NE(r.err.find("read from the source"), std::string::npos) << r.err;
}

TEST_F(CliClusterTest, CatAsAnotherUserNeedsTheSourceRights) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the CLI as another user";
  OpenClusterDirForOthers();
  // A dataset whose source only root may enter.
  testing::DatasetOptions d;
  d.name = "secret";
  d.files = 10;
  d.before_snapshot = [](const std::string& root) { ASSERT_EQ(chmod(root.c_str(), 0700), 0); };
  auto secret = cluster_->CreateDataset(d);
  ASSERT_OK(secret);
  ASSERT_OK(cluster_->WaitForPhase(secret->name, DatasetPhase::kReady));

  const std::string path = secret->manifest->PathOf(0);
  ProcessRun r = RunGranary(
      {"--store", cluster_->store_url(), "cat", secret->name, "--direct", path}, kNobody);
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("cannot read its source file"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ask the owner"), std::string::npos) << r.err;

  // `pets` is readable by everyone at the source: nobody may cat it, and it
  // comes from the cache nodes.
  r = RunGranary(
      {"--store", cluster_->store_url(), "cat", ds_.name, "--direct", ds_.manifest->PathOf(5)},
      kNobody);
  EXPECT_EQ(r.code, kCliOk) << r.err;
  EXPECT_EQ(r.out, ds_.contents[5]);

  // Through a sidecar whose socket (0660 root:root) nobody may open.
  SidecarProcess& sidecar = StartSidecar();
  ASSERT_EQ(chmod(cluster_->dir().Join("sidecar").c_str(), 0755), 0);
  r = RunGranary({"cat", ds_.name, "--socket", sidecar.socket_path(), ds_.manifest->PathOf(5)},
                 kNobody);
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("socket's group"), std::string::npos) << r.err;
}

TEST_F(CliClusterTest, BrokenPipeExitsQuietly) {
  std::vector<std::string> args = {"--store", cluster_->store_url(), "cat", ds_.name, "--direct"};
  for (int i = 0; i < 50; ++i) {
    for (SampleId id = 0; id < ds_.sample_count(); ++id) args.push_back(ds_.manifest->PathOf(id));
  }
  // `granary cat ... | head -c1`: far more than a pipe buffer, reader gone after 1 byte.
  ProcessRun r = RunGranary(args, std::nullopt, 1);
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.code, kCliOk);
  EXPECT_EQ(r.err, "");
  ASSERT_GE(r.out.size(), 1u);
  EXPECT_EQ(r.out[0], ds_.contents[0][0]);
}

// Security, end to end: a 300,000-byte file in a dataset
// of 64 KiB chunks on a node with room for two of its five chunks, rewritten
// after the snapshot at the same size with its mtime restored (touch -r).
// `granary cat` returned the staged bytes 0..131071 of the old file joined
// with the rest of the new one, exit 0. Now it writes none of it and fails
// naming the file, what changed and the re-snapshot command; after that
// re-snapshot it reads the new version, whole.
TEST(CliChangedSourceTest, CatNeverJoinsStagedPiecesWithARewrittenFile) {
  auto created = CacheCluster::Create();
  ASSERT_OK(created);
  CacheCluster& cluster = **created;
  testing::CacheNodeOptions small;
  small.capacity_bytes = 150'000;  // two chunk files (4 KiB header + 64 KiB), not three
  ASSERT_OK(cluster.StartNodes(1, small));
  constexpr size_t kSize = 300'000;
  const std::string root = cluster.dir().Join("changing");
  const std::string old_bytes = testing::Bytes("big.bin", kSize);
  cluster.dir().WriteFile("changing/big.bin", old_bytes);
  auto manifest = cluster.RegisterTree("changing", root, 64 * 1024);
  ASSERT_OK(manifest);
  ASSERT_EQ((*manifest)->chunk_count(), 5u);
  const std::map<std::string, std::string> ds = {{"dataset", "changing"}};
  testing::CacheNode& node = cluster.node(0);
  // The node keeps what fits (its cache budget) and streams the rest.
  ASSERT_OK(cluster.WaitForPhase("changing", DatasetPhase::kReady, std::chrono::seconds(60)));
  ASSERT_OK(node.WaitForMetric("granary_cachenode_staged_chunks", ds,
                               [](double staged) { return staged == 2; }));

  auto cat = [&] {
    std::ostringstream out;
    std::ostringstream err;
    ProcessRun run;
    run.code = RunCli({"--store", cluster.store_url(), "cat", "changing", "--direct", "big.bin"},
                      out, err);
    run.out = out.str();
    run.err = err.str();
    return run;
  };
  ProcessRun r = cat();
  ASSERT_EQ(r.code, kCliOk) << r.err;
  ASSERT_TRUE(r.out == old_bytes) << r.out.size() << " bytes";

  const std::string new_bytes = testing::Bytes("big.bin, version 2", kSize);
  testing::RewriteKeepingMtime(root + "/big.bin", new_bytes);
  r = cat();
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  // Nothing of it is written (it was the old file's bytes 0..131071, from the
  // node, and the new file's rest, from the source).
  const bool joined = r.out.size() == kSize &&
                      r.out.compare(0, 131072, old_bytes, 0, 131072) == 0 &&
                      r.out.compare(131072, kSize, new_bytes, 131072, kSize) == 0;
  EXPECT_FALSE(joined) << "the two versions were joined";
  EXPECT_EQ(r.out.size(), 0u);
  EXPECT_NE(r.err.find("big.bin"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("changed since the snapshot"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ctime"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("`granary dataset snapshot changing`"), std::string::npos) << r.err;

  // What the message says to do: then the new version, whole.
  ProcessRun snapshot =
      RunGranary({"--store", cluster.store_url(), "dataset", "snapshot", "changing"});
  ASSERT_EQ(snapshot.code, kCliOk) << snapshot.err;
  r = cat();
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_TRUE(r.out == new_bytes) << r.out.size() << " bytes";
}

// A cache node that requires the cluster key and serves its handoff socket
// (`local_socket`), with a dataset whose d000/f000004.bin only root may read
// at the source: what a user other than root (no key) gets from it.
class CliLocalNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to own the key and run the CLI as another user";
    auto created = CacheCluster::Create();
    ASSERT_OK(created);
    cluster_ = std::move(*created);
    ASSERT_EQ(chmod(cluster_->dir().path().c_str(), 0711), 0);  // others search, not list
    auto hex = GenerateClusterKeyHex();
    ASSERT_OK(hex);
    cluster_->dir().WriteFile("cluster.key", *hex + "\n");
    key_ = cluster_->dir().Join("cluster.key");
    ASSERT_EQ(chmod(key_.c_str(), 0600), 0);
    socket_ = cluster_->dir().Join("node.sock");
    testing::CacheNodeOptions node;
    node.extra_yaml = "local_socket: " + socket_ + "\ncluster_key_file: " + key_ + "\n";
    ASSERT_OK(cluster_->StartNodes(1, node));
    testing::DatasetOptions d;
    d.name = "keyed";
    d.files = 30;
    d.min_size = 100;
    d.max_size = 20'000;
    d.chunk_size = 16 * 1024;
    d.before_snapshot = [](const std::string& root) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
        chmod(e.path().c_str(), e.is_directory() ? 0755 : 0644);
      }
      chmod(root.c_str(), 0755);
      ASSERT_EQ(chmod((root + "/d000/f000004.bin").c_str(), 0600), 0);  // root's alone
    };
    auto ds = cluster_->CreateDataset(d);
    ASSERT_OK(ds);
    ds_ = std::move(*ds);
    ASSERT_OK(cluster_->WaitForPhase(ds_.name, DatasetPhase::kReady));
    local_ = cluster_->node(0).id();
    // Files none of whose chunks holds bytes of the secret one (chunks are
    // handed out whole).
    auto secret = ds_.manifest->Find("d000/f000004.bin");
    ASSERT_OK(secret);
    near_secret_ = ChunkMates(*secret);
    while (near_secret_.count(open_id_) > 0) ++open_id_;
    ASSERT_LT(open_id_, ds_.sample_count());
  }

  // The files sharing a chunk with `id` (itself included).
  std::set<SampleId> ChunkMates(SampleId id) const {
    std::set<SampleId> mates;
    for (ChunkId c = 0; c < ds_.manifest->chunk_count(); ++c) {
      auto segments = ds_.manifest->Segments(c);
      EXPECT_OK(segments);
      if (!segments.ok()) continue;
      std::set<SampleId> in_chunk;
      for (const ChunkSegment& seg : *segments) in_chunk.insert(seg.sample);
      if (in_chunk.count(id) > 0) mates.insert(in_chunk.begin(), in_chunk.end());
    }
    return mates;
  }

  std::unique_ptr<CacheCluster> cluster_;
  TestDataset ds_;
  std::string key_;
  std::string socket_;  // the node's handoff socket
  std::string local_;   // its id
  std::set<SampleId> near_secret_;
  SampleId open_id_ = 0;  // a file away from the secret one's chunks
};

// A user other than root has no cluster key, so a node that requires it
// refuses that user on its TCP port; `cat --direct` reads the node on this
// host through its handoff socket instead, where the node checks the uid
// (SO_PEERCRED) against the source's permissions (docs/security.md).
TEST_F(CliLocalNodeTest, CatWithoutTheClusterKeyReadsTheLocalNodeThroughItsHandoffSocket) {
  const std::string open_path = ds_.manifest->PathOf(open_id_);
  const std::string socket = socket_;
  const std::string local = local_;
  const std::vector<std::string> cat = {"--store",  cluster_->store_url(), "cat", ds_.name,
                                        "--direct", "--no-source"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = cat;
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };

  // Through the socket: the bytes, from the node alone (--no-source).
  ProcessRun r =
      RunGranary(with({"--local-node", local, "--local-node-socket", socket, open_path}), kNobody);
  EXPECT_EQ(r.code, kCliOk) << r.err;
  EXPECT_TRUE(r.out == ds_.contents[open_id_]) << r.out.size() << " bytes: " << r.err;

  // The file only root may read: refused, naming it.
  r = RunGranary(with({"--local-node", local, "--local-node-socket", socket, "d000/f000004.bin"}),
                 kNobody);
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("d000/f000004.bin"), std::string::npos) << r.err;

  // No socket there: what to do instead.
  r = RunGranary(with({"--local-node", local, "--local-node-socket",
                       cluster_->dir().Join("none.sock"), open_path}),
                 kNobody);
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("no cache node handoff socket at"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("run as root with the cluster key, or read through a sidecar"),
            std::string::npos)
      << r.err;
  // A node of another name: said too.
  r = RunGranary(with({"--local-node", "elsewhere", "--local-node-socket", socket, open_path}),
                 kNobody);
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  EXPECT_NE(r.err.find("is named 'elsewhere'"), std::string::npos) << r.err;
}

// `granary mount` by a user other than root: while the host's sidecar
// serves, reads go through it; once it is gone, the mount reads the node on
// this host through its handoff socket (no cluster key needed), and only what
// the source lets that user read: a file whose rights at the source were
// taken away after the snapshot is refused, though the view's modes allow it.
TEST_F(CliLocalNodeTest, MountWithoutTheClusterKeyFallsBackToTheHandoffSocket) {
  // The host's sidecar, root's, with the key; its socket open to nobody's group.
  SidecarOptions so;
  so.store_url = cluster_->store_url();
  so.local_node_id = local_;
  so.extra_yaml = "cluster_key_file: " + key_ + "\n";
  const std::string sidecar_dir = cluster_->dir().Join("sidecar");
  std::filesystem::create_directories(sidecar_dir);
  ASSERT_EQ(chmod(sidecar_dir.c_str(), 0755), 0);
  SidecarProcess sidecar(so, sidecar_dir);
  ASSERT_OK(sidecar.StartAndWaitReady());
  ASSERT_EQ(chown(sidecar.socket_path().c_str(), 0, kNobody), 0);
  // A file readable by all in the snapshot, root's alone at the source now.
  const std::set<SampleId> near_open = ChunkMates(open_id_);
  SampleId taken = open_id_ + 1;
  while (taken < ds_.sample_count() &&
         (near_secret_.count(taken) > 0 || near_open.count(taken) > 0)) {
    ++taken;
  }
  ASSERT_LT(taken, ds_.sample_count());
  const std::string taken_path = ds_.manifest->PathOf(taken);
  const std::set<SampleId> near_taken = ChunkMates(taken);
  ASSERT_EQ(chmod(ds_.PathOf(taken).c_str(), 0600), 0);

  // Debian's udev makes /dev/fuse mode 0666 so that any user may mount
  // (through the set-uid fusermount3); some containers leave it 0600. The
  // Debian default for the length of the test, the mode restored after.
  struct stat fuse_dev {};
  ASSERT_EQ(stat("/dev/fuse", &fuse_dev), 0) << "no /dev/fuse: " << std::strerror(errno);
  struct RestoreMode {
    mode_t mode;
    ~RestoreMode() { chmod("/dev/fuse", mode); }
  } restore{fuse_dev.st_mode & 07777};
  ASSERT_EQ(chmod("/dev/fuse", 0666), 0) << std::strerror(errno);
  const std::string mnt = cluster_->dir().Join("mnt");
  std::filesystem::create_directories(mnt);
  ASSERT_EQ(chown(mnt.c_str(), kNobody, kNobody), 0);
  ProcessRun mounted = RunGranary(
      {"--store", cluster_->store_url(), "mount", ds_.name, mnt, "--socket", sidecar.socket_path(),
       "--local-node", local_, "--local-node-socket", socket_, "--reconnect-timeout", "300ms",
       // Nothing fetched ahead through the sidecar: each file below is read
       // when the test reads it.
       "--readahead", "off", "--pin-ahead", "0"},
      kNobody);
  ASSERT_EQ(mounted.code, kCliOk) << mounted.err;
  const size_t at = mounted.out.find("(pid ");
  ASSERT_NE(at, std::string::npos) << mounted.out;
  const pid_t server = std::stoi(mounted.out.substr(at + 5));
  struct Unmount {
    pid_t pid;
    ~Unmount() { kill(pid, SIGTERM); }
  } unmount{server};
  auto cat_as_nobody = [&](const std::string& path) {
    return RunProgram("/bin/cat", {mnt + "/" + path}, kNobody);
  };

  ProcessRun r = cat_as_nobody(ds_.manifest->PathOf(open_id_));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.out == ds_.contents[open_id_]) << r.out.size() << " bytes: " << r.err;
  // Mode 0600, root's, in the snapshot too: the kernel refuses the open,
  // whoever would serve the bytes.
  r = cat_as_nobody("d000/f000004.bin");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out.size() << " bytes";

  // The sidecar gone: the same file, now through the node's handoff socket.
  ASSERT_OK(sidecar.Kill());
  for (SampleId id = open_id_; id < ds_.sample_count(); ++id) {
    if (near_secret_.count(id) > 0 || near_taken.count(id) > 0) continue;
    r = cat_as_nobody(ds_.manifest->PathOf(id));
    EXPECT_EQ(r.code, 0) << ds_.manifest->PathOf(id) << ": " << r.err;
    EXPECT_TRUE(r.out == ds_.contents[id]) << ds_.manifest->PathOf(id) << ": " << r.out.size();
  }
  // Taken away at the source: the node refuses this user, whatever the view says.
  r = cat_as_nobody(taken_path);
  EXPECT_NE(r.code, 0) << "read " << r.out.size() << " bytes of a file nobody may not read";
  EXPECT_TRUE(r.out.empty()) << r.out.size() << " bytes";
  r = cat_as_nobody("d000/f000004.bin");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(r.out.empty()) << r.out.size() << " bytes";

  ASSERT_EQ(kill(server, SIGTERM), 0);
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        auto fstype = posix::MountedFileSystemAt(mnt);
        return !fstype.ok() || *fstype != "fuse.granary";
      },
      seconds(20)))
      << "still mounted at " << mnt;
}

TEST_F(CliClusterTest, DoctorPassesOnALiveSetUp) {
  SidecarProcess& sidecar = StartSidecar();
  ProcessRun r = Cli({"doctor", "--socket", sidecar.socket_path(), "--config",
                      cluster_->node(0).config_path(), "--config", sidecar.config_path()});
  EXPECT_EQ(r.code, kCliOk) << r.out << r.err;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PASS  store"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pool default: 2 live nodes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("answers HELLO/PING"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cache node config " + cluster_->node(0).config_path() + " parses"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("sidecar config " + sidecar.config_path() + " parses"), std::string::npos)
      << r.out;

  // The sidecar's config names its socket: no --socket needed.
  r = Cli({"-o", "json", "doctor", "--config", sidecar.config_path()});
  EXPECT_EQ(r.code, kCliOk) << r.out << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["failed"], 0);
  std::set<std::string> passed;
  for (const auto& check : j["checks"]) {
    if (check["status"] == "PASS") passed.insert(check["check"].get<std::string>());
    // FUSE may be missing here (a WARN); nothing else may even warn.
    if (check["check"] != "fuse") {
      EXPECT_EQ(check["status"], "PASS") << check.dump();
    }
  }
  for (const char* name : {"store", "nodes", "config", "sidecar"}) {
    EXPECT_EQ(passed.count(name), 1u) << name << " in " << r.out;
  }
}

TEST_F(CliClusterTest, DoctorFailsEachWayWithItsFix) {
  struct Expect {
    std::string check;
    std::string message;
    std::string fix;
  };
  auto fails = [](const ProcessRun& r, const Expect& e) {
    EXPECT_EQ(r.code, kCliFailed) << r.out << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_EQ(j["ok"], false);
    bool found = false;
    for (const auto& check : j["checks"]) {
      if (check["check"] != e.check || check["status"] != "FAIL") continue;
      const std::string message = check["message"];
      const std::string fix = check.value("fix", "");
      if (message.find(e.message) != std::string::npos && fix.find(e.fix) != std::string::npos) {
        found = true;
      }
    }
    EXPECT_TRUE(found) << "no FAIL of " << e.check << " with '" << e.message << "' and fix '"
                       << e.fix << "' in\n"
                       << r.out;
  };
  // An unreachable store.
  const std::string dead = "redis://127.0.0.1:" + std::to_string(testing::FreeTcpPort()) + "/0";
  std::ostringstream out;
  std::ostringstream err;
  ProcessRun r;
  r.code = RunCli({"--store", dead, "-o", "json", "doctor"}, out, err);
  r.out = out.str();
  fails(r, {"store", "unreachable", "start redis-server"});
  // A URL that does not parse.
  out.str("");
  r.code = RunCli({"--store", "mysql://x", "-o", "json", "doctor"}, out, err);
  r.out = out.str();
  fails(r, {"store", "does not parse", "redis://host:port"});
  // A store with no live node.
  const std::string empty = "sqlite://" + cluster_->dir().Join("empty.db");
  ASSERT_OK(OpenMetadataStore(empty));
  out.str("");
  r.code = RunCli({"--store", empty, "-o", "json", "doctor"}, out, err);
  r.out = out.str();
  fails(r, {"nodes", "no live cache node", "start granary-cachenode"});
  // A socket path with nothing there, and one that is not a socket.
  r = Cli({"-o", "json", "doctor", "--socket", cluster_->dir().Join("none.sock")});
  fails(r, {"sidecar", "no socket at", "start granary-sidecar"});
  r = Cli({"-o", "json", "doctor", "--socket", cluster_->node(0).config_path()});
  fails(r, {"sidecar", "is a regular file, not a socket", "point --socket"});
  // A stale socket: the file is there, nobody listens.
  SidecarProcess& sidecar = StartSidecar();
  ASSERT_OK(sidecar.Kill());
  r = Cli({"-o", "json", "doctor", "--socket", sidecar.socket_path()});
  fails(r, {"sidecar", "does not answer HELLO/PING", "start granary-sidecar"});
  // Bad config files: a wrong value, an unknown key, a missing file.
  const std::string bad_node = cluster_->dir().Join("bad-node.yaml");
  testing::WriteAll(bad_node, "data_dir: /var/lib/x\ncapacity: lots\nmetadata_store: " +
                                  cluster_->store_url() + "\n");
  r = Cli({"-o", "json", "doctor", "--config", bad_node});
  fails(r, {"config", "capacity", "docs/cachenode.md"});
  const std::string bad_sidecar = cluster_->dir().Join("bad-sidecar.yaml");
  testing::WriteAll(bad_sidecar, "socket: /tmp/x.sock\nwindow_samplez: 4\nmetadata_store: " +
                                     cluster_->store_url() + "\n");
  r = Cli({"-o", "json", "doctor", "--config", bad_sidecar});
  fails(r, {"config", "window_samplez", "docs/sidecar.md"});
  r = Cli({"-o", "json", "doctor", "--config", cluster_->dir().Join("missing.yaml")});
  fails(r, {"config", "cannot read", "check the path"});
  // A sidecar and a node configured for a libfabric provider this host lacks:
  // a warning each (they fall back to TCP), naming the provider and the key.
  const std::string no_provider = cluster_->dir().Join("no-provider.yaml");
  testing::WriteAll(no_provider,
                    "socket: /tmp/x.sock\ntransport: libfabric\n"
                    "libfabric_provider: no-such-provider\nmetadata_store: " +
                        cluster_->store_url() + "\n");
  const std::string node_no_provider = cluster_->dir().Join("node-no-provider.yaml");
  testing::WriteAll(node_no_provider, "data_dir: " + cluster_->dir().Join("fabric-data") +
                                          "\ncapacity: 1GiB\nserve_without_authentication: true\n"
                                          "fabric_listen: 127.0.0.1:7171\nfabric_provider: "
                                          "no-such-provider\nmetadata_store: " +
                                          cluster_->store_url() + "\n");
  for (const std::string& file : {no_provider, node_no_provider}) {
    r = Cli({"-o", "json", "doctor", "--config", file});
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    bool warned = false;
    for (const auto& check : j["checks"]) {
      if (check["check"] != "fabric") continue;
      EXPECT_EQ(check["status"], "WARN") << check.dump();
      const std::string message = check["message"];
      const std::string fix = check.value("fix", "");
      warned = message.find("'no-such-provider' is not usable") != std::string::npos &&
               fix.find("fi_info") != std::string::npos;
    }
    EXPECT_TRUE(warned) << r.out;
  }
  // The tcp provider is usable here: a pass.
  testing::WriteAll(no_provider, "socket: /tmp/x.sock\ntransport: libfabric\nmetadata_store: " +
                                     cluster_->store_url() + "\n");
  r = Cli({"-o", "json", "doctor", "--config", no_provider});
  EXPECT_NE(r.out.find("libfabric provider 'tcp' is usable"), std::string::npos) << r.out;
  // A cache node config whose data_dir cannot be made.
  const std::string blocked = cluster_->dir().Join("blocked.yaml");
  testing::WriteAll(blocked, "data_dir: " + bad_node + "/data\ncapacity: 1GiB\nmetadata_store: " +
                                 cluster_->store_url() + "\n");
  r = Cli({"-o", "json", "doctor", "--config", blocked});
  fails(r, {"config", "not a directory", "create " + bad_node + "/data"});
  const std::string deep = cluster_->dir().Join("deep.yaml");
  testing::WriteAll(deep, "data_dir: " + cluster_->dir().Join("no/such/data") +
                              "\ncapacity: 1GiB\nmetadata_store: " + cluster_->store_url() + "\n");
  r = Cli({"-o", "json", "doctor", "--config", deep});
  fails(r, {"config", "neither it nor its parent", "mkdir -p"});
  // ... and it has no cluster key, no kubernetes_auth, no opt-out: the node
  // would refuse to start, and doctor says how to make a key.
  fails(r, {"auth", "no authentication", "granary cluster-key generate"});
  // A data_dir another user owns, or that others may write: the
  // node would refuse it; doctor says so, with the fix.
  const std::string foreign_dir = cluster_->dir().Join("foreign-data");
  std::filesystem::create_directories(foreign_dir);
  ASSERT_EQ(::chown(foreign_dir.c_str(), 65534, 65534), 0);
  const std::string foreign = cluster_->dir().Join("foreign.yaml");
  testing::WriteAll(foreign, "data_dir: " + foreign_dir + "\ncapacity: 1GiB\nmetadata_store: " +
                                 cluster_->store_url() + "\n");
  r = Cli({"-o", "json", "doctor", "--config", foreign});
  fails(r, {"config", "is unsafe: it is owned by uid 65534", "refuses it"});
  ASSERT_EQ(::chown(foreign_dir.c_str(), ::geteuid(), ::getegid()), 0);
  ASSERT_EQ(::chmod(foreign_dir.c_str(), 0777), 0);
  r = Cli({"-o", "json", "doctor", "--config", foreign});
  fails(r, {"config", "mode 0777 lets group or others write", "refuses it"});

  // Human output: every FAIL line is followed by its fix, then the summary.
  r = Cli({"doctor", "--socket", cluster_->dir().Join("none.sock")});
  EXPECT_EQ(r.code, kCliFailed);
  EXPECT_NE(r.out.find("FAIL  sidecar"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fix: start granary-sidecar"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 failed"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("checks failed"), std::string::npos) << r.err;
}

TEST_F(CliClusterTest, DoctorAsAUserTheSocketRefuses) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run doctor as another user";
  OpenClusterDirForOthers();
  SidecarProcess& sidecar = StartSidecar("socket_mode: \"0600\"\n");
  ASSERT_EQ(chmod(cluster_->dir().Join("sidecar").c_str(), 0755), 0);
  struct stat st {};
  ASSERT_EQ(stat(sidecar.socket_path().c_str(), &st), 0);
  ASSERT_EQ(st.st_mode & 0777, 0600u);
  ProcessRun r = RunGranary(
      {"--store", cluster_->store_url(), "doctor", "--socket", sidecar.socket_path()}, kNobody);
  EXPECT_EQ(r.code, kCliFailed) << r.out << r.err;
  EXPECT_NE(r.out.find("FAIL  sidecar"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("does not let you connect"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mode 0600"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("socket_mode: \"0660\""), std::string::npos) << r.out;
  // The same as root passes.
  r = RunGranary({"--store", cluster_->store_url(), "doctor", "--socket", sidecar.socket_path()});
  EXPECT_EQ(r.code, kCliOk) << r.out << r.err;

  // A socket in a directory nobody may search.
  ASSERT_EQ(chmod(cluster_->dir().Join("sidecar").c_str(), 0700), 0);
  r = RunGranary({"--store", cluster_->store_url(), "doctor", "--socket", sidecar.socket_path()},
                 kNobody);
  EXPECT_EQ(r.code, kCliFailed) << r.out << r.err;
  EXPECT_NE(r.out.find("not searchable by you"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace granary
