// The `granary` CLI, in-process (RunCli) over a real SQLite store in a temp
// directory: the happy paths a user takes and the bad inputs they make; `ls`
// from the manifest; `cat` and `doctor` where no daemon is needed
// (cli_cluster_test.cc has them on real cache nodes and a sidecar); progress.

#include "granary/cli/cli.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_context.h"
#include "granary/core/manifest.h"
#include "granary/core/metadata_store.h"
#include "granary/peer/peer_auth.h"
#include "granary/store/open_store.h"
#include "testing/test_util.h"

namespace granary {
namespace {

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};

// A command line that must be refused: its exit code and what its message says.
struct Refused {
  std::vector<std::string> args;
  int code;
  std::string says;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_url_ = "sqlite://" + dir_.path() + "/granary.db";
    source_ = dir_.path() + "/src";
    ASSERT_EQ(mkdir(source_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir((source_ + "/cats").c_str(), 0755), 0);
    ASSERT_EQ(mkdir((source_ + "/dogs").c_str(), 0755), 0);
    for (int i = 0; i < 20; ++i) {
      testing::WriteAll(source_ + (i % 2 ? "/cats/" : "/dogs/") + std::to_string(i) + ".jpg",
                        testing::Bytes("f" + std::to_string(i), 1000 + static_cast<size_t>(i)));
    }
  }

  CliRun Run(std::vector<std::string> args, bool interactive = false) {
    args.insert(args.begin(), {"--store", store_url_});
    std::ostringstream out;
    std::ostringstream err;
    CliRun run;
    run.code = RunCli(args, out, err, interactive);
    run.out = out.str();
    run.err = err.str();
    return run;
  }
  void ExpectRefused(const std::vector<Refused>& cases) {
    for (const Refused& c : cases) {
      const CliRun r = Run(c.args);
      EXPECT_EQ(r.code, c.code) << r.err;
      EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    }
  }

  std::unique_ptr<MetadataStore> Store() {
    auto store = OpenMetadataStore(store_url_);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(*store) : nullptr;
  }

  testing::TempDir dir_;
  std::string store_url_;
  std::string source_;
};

TEST_F(CliTest, CreateSnapshotsAndStoresTheManifest) {
  CliRun r = Run({"dataset", "create", "pets", "--source", source_, "--chunk-size", "4KiB",
                  "--exclude", "**/19.jpg"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_NE(r.out.find("19 files"), std::string::npos) << r.out;
  auto store = Store();
  auto record = store->GetDataset("pets");
  ASSERT_OK(record);
  EXPECT_EQ(record->state.phase, DatasetPhase::kStaging);
  EXPECT_EQ(record->spec.chunk_size, 4096u);
  EXPECT_EQ(record->owner.uid, getuid());
  auto blob = store->GetManifest(record->manifest_id);
  ASSERT_OK(blob);
  auto manifest = Manifest::Decode(*blob);
  ASSERT_OK(manifest);
  EXPECT_EQ(manifest->sample_count(), 19u);
  EXPECT_FALSE(manifest->Find("cats/19.jpg").ok());
  EXPECT_OK(manifest->Find("dogs/0.jpg"));
}

TEST_F(CliTest, PoolSnapshottedDatasetsAreLeftToTheCacheNodes) {
  // The source is mounted where the cache nodes run, not here: not checked.
  CliRun r = Run({"dataset", "create", "far", "--source", "/mnt/only-on-the-nodes/train",
                  "--snapshot-by", "pool", "--pool", "gpu"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_NE(r.out.find("a cache node of pool gpu takes its snapshot"), std::string::npos) << r.out;
  auto store = Store();
  auto record = store->GetDataset("far");
  ASSERT_OK(record);
  EXPECT_EQ(record->spec.snapshot_by, SnapshotBy::kPool);
  EXPECT_EQ(record->spec.source_uri, "file:///mnt/only-on-the-nodes/train");
  EXPECT_EQ(record->state.phase, DatasetPhase::kPending);
  EXPECT_TRUE(record->manifest_id.empty()) << "the CLI walked nothing";

  // As a cache node would: it failed; a new snapshot is asked, not walked here.
  DatasetRecord failed = *record;
  failed.state = {DatasetPhase::kFailed, "snapshot failed: ...", ""};
  ASSERT_OK(store->UpdateDataset(failed));
  r = Run({"dataset", "snapshot", "far"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  record = store->GetDataset("far");
  ASSERT_OK(record);
  EXPECT_EQ(record->state.phase, DatasetPhase::kPending);
  EXPECT_EQ(record->state.message, "new snapshot requested");
  EXPECT_TRUE(record->manifest_id.empty());
  // Also while a node walks it (the spec may have changed since).
  DatasetRecord walking = *record;
  walking.state = {DatasetPhase::kSnapshotting, "node n1 is walking", "n1"};
  ASSERT_OK(store->UpdateDataset(walking));
  auto shown = nlohmann::json::parse(Run({"dataset", "show", "far", "-o", "json"}).out);
  EXPECT_EQ(shown["snapshot_by"], "pool");
  EXPECT_EQ(shown["claimed_by"], "n1");
  EXPECT_NE(Run({"dataset", "show", "far"}).out.find("(node n1 is walking it)"), std::string::npos);
  ASSERT_EQ(Run({"dataset", "snapshot", "far"}).code, kCliOk);
  record = store->GetDataset("far");
  EXPECT_EQ(record->state.phase, DatasetPhase::kPending);
  EXPECT_EQ(record->state.claimed_by, "");
  // A client-snapshotted dataset says so too.
  ASSERT_EQ(Run({"dataset", "create", "near", "--source", source_}).code, kCliOk);
  shown = nlohmann::json::parse(Run({"dataset", "show", "near", "-o", "json"}).out);
  EXPECT_EQ(shown["snapshot_by"], "client");
  EXPECT_TRUE(shown["claimed_by"].is_null());

  struct Bad {
    std::vector<std::string> args;
    std::string says;
  } bad[] = {
      {{"dataset", "create", "x", "--source", source_, "--snapshot-by", "robot"}, "robot"},
      {{"dataset", "create", "x", "--source", source_, "--snapshot-by", "pool", "--no-snapshot"},
       "drop one of them"},
      {{"dataset", "create", "x", "--source", "relative", "--snapshot-by", "pool"}, "absolute"},
      {{"dataset", "create", "x", "--source", "s3://b/x", "--snapshot-by", "pool"}, "file://"},
  };
  for (const Bad& b : bad) {
    CliRun run = Run(b.args);
    EXPECT_EQ(run.code, kCliUsage) << b.says << "\n" << run.err;
    EXPECT_NE(run.err.find(b.says), std::string::npos) << run.err;
  }
  EXPECT_EQ(store->GetDataset("x").status().code(), StatusCode::kNotFound);
}

TEST_F(CliTest, JsonOutputIsOneDocumentAndGlobalOptionsFollowSubcommands) {
  ASSERT_EQ(Run({"dataset", "create", "pets", "--source", "file://" + source_}).code, kCliOk);
  CliRun r = Run({"dataset", "list", "-o", "json"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  auto list = nlohmann::json::parse(r.out);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["name"], "pets");
  EXPECT_EQ(list[0]["phase"], "Staging");
  EXPECT_EQ(list[0]["progress"]["nodes"], 0);

  r = Run({"--output", "json", "dataset", "show", "pets"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["source"], "file://" + source_);

  r = Run({"status", "-o", "json"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  auto status = nlohmann::json::parse(r.out);
  EXPECT_EQ(status["nodes"], 0);
  EXPECT_EQ(status["datasets"].size(), 1u);
}

TEST_F(CliTest, BadInputsNameWhatWasWrong) {
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"dataset", "create", "Bad_Name", "--source", source_}, kCliUsage, "Bad_Name"},
      {{"dataset", "create", "pets", "--source", "relative/dir"}, kCliUsage, "absolute"},
      {{"dataset", "create", "pets", "--source", source_ + "/missing"}, kCliNotFound, "missing"},
      {{"dataset", "create", "pets", "--source", source_ + "/cats/1.jpg"},
       kCliUsage,
       "not a directory"},
      {{"dataset", "create", "pets", "--source", "s3://bucket/x"}, kCliUsage, "file://"},
      {{"dataset", "create", "pets", "--source", source_, "--chunk-size", "lots"},
       kCliUsage,
       "--chunk-size"},
      {{"dataset", "create", "pets", "--source", source_, "--replication", "0"},
       kCliUsage,
       "replication"},
      {{"dataset", "create", "pets", "--source", source_, "--owner", "nobody"},
       kCliUsage,
       "UID:GID"},
      {{"dataset", "create", "pets"}, kCliUsage, "--source"},
      {{"dataset", "show", "nope"}, kCliNotFound, "nope"},
      {{"dataset", "delete", "nope"}, kCliNotFound, "nope"},
      {{"dataset", "wait", "nope", "--timeout", "1s"}, kCliNotFound, "nope"},
      {{"dataset", "wait", "nope", "--timeout", "soon"}, kCliUsage, "--timeout"},
      {{"frobnicate"}, kCliUsage, "frobnicate"},
      {{"dataset", "list", "-o", "yaml"}, kCliUsage, "yaml"},
  };
  // The store exists (empty): commands that only read need one
  // (ReadOnlyCommandsCreateNoStore covers the missing store).
  ASSERT_NE(Store(), nullptr);
  for (const Case& c : cases) {
    CliRun r = Run(c.args);
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    EXPECT_EQ(r.code, c.code) << joined << "\n" << r.err;
    EXPECT_NE((r.err + r.out).find(c.needle), std::string::npos) << joined << "\n" << r.err;
  }
  // Nothing was created by any of them.
  EXPECT_EQ(Store()->ListDatasets()->size(), 0u);
}

// Security: `--source /data/link` with /data/link -> /etc was
// resolved and walked as /etc. A source path through a symbolic link is now
// refused, naming the link and what it resolves to; and an absolute link
// inside the source, which every read refuses, is left out of the snapshot
// and reported instead of becoming a sample that always fails.
TEST_F(CliTest, SymbolicLinksOnAndInTheSourcePath) {
  const std::string link = dir_.path() + "/link";
  ASSERT_EQ(symlink(source_.c_str(), link.c_str()), 0);
  const std::string alias = dir_.path() + "/alias";
  ASSERT_EQ(symlink(dir_.path().c_str(), alias.c_str()), 0);
  const std::string to_file = dir_.path() + "/to_file";
  ASSERT_EQ(symlink((source_ + "/cats/1.jpg").c_str(), to_file.c_str()), 0);
  const std::string dangling = dir_.path() + "/dangling";
  ASSERT_EQ(symlink((dir_.path() + "/missing").c_str(), dangling.c_str()), 0);
  const std::string loop = dir_.path() + "/loop";
  ASSERT_EQ(symlink(loop.c_str(), loop.c_str()), 0);
  struct Bad {
    std::string source;
    std::string link;
    std::string resolves;
  } bad[] = {{link, link, "resolves to '" + source_ + "'"},
             {"file://" + link, link, "resolves to '" + source_ + "'"},
             {alias + "/src", alias, "resolves to '" + source_ + "'"},
             {to_file, to_file, "resolves to '" + source_ + "/cats/1.jpg'"},
             {dangling, dangling, "does not resolve"},
             {loop, loop, "does not resolve"}};
  for (const Bad& b : bad) {
    CliRun r = Run({"dataset", "create", "linked", "--source", b.source});
    EXPECT_EQ(r.code, kCliUsage) << b.source << "\n" << r.err;
    EXPECT_NE(r.err.find("passes through the symbolic link '" + b.link + "'"), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find(b.resolves), std::string::npos) << r.err;
  }
  EXPECT_EQ(Store()->GetDataset("linked").status().code(), StatusCode::kNotFound);

  ASSERT_EQ(symlink((source_ + "/cats/1.jpg").c_str(), (source_ + "/absolute_in").c_str()), 0);
  ASSERT_EQ(symlink("cats/1.jpg", (source_ + "/relative_in").c_str()), 0);
  ASSERT_EQ(symlink(dir_.path().c_str(), (source_ + "/dir_outside").c_str()), 0);
  ASSERT_EQ(symlink("loop", (source_ + "/loop").c_str()), 0);
  ASSERT_EQ(symlink("gone.jpg", (source_ + "/dangling").c_str()), 0);
  CliRun r = Run({"dataset", "create", "pets", "--source", source_});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_NE(r.out.find("21 files"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4 symbolic links left out"), std::string::npos) << r.out;
  auto record = Store()->GetDataset("pets");
  ASSERT_OK(record);
  EXPECT_NE(record->state.message.find("4 symbolic links left out"), std::string::npos);
  auto manifest = Manifest::Decode(*Store()->GetManifest(record->manifest_id));
  ASSERT_OK(manifest);
  EXPECT_FALSE(manifest->Find("absolute_in").ok());
  EXPECT_OK(manifest->Find("relative_in"));
}

TEST_F(CliTest, DuplicateCreateDeleteAndWaitTimeout) {
  ASSERT_EQ(Run({"dataset", "create", "pets", "--source", source_}).code, kCliOk);
  CliRun dup = Run({"dataset", "create", "pets", "--source", source_});
  EXPECT_EQ(dup.code, kCliFailed);
  EXPECT_NE(dup.err.find("exists"), std::string::npos) << dup.err;

  // No cache node runs: the dataset never becomes Ready.
  CliRun wait = Run({"dataset", "wait", "pets", "--timeout", "300ms"});
  EXPECT_EQ(wait.code, kCliTimeout) << wait.err;
  EXPECT_NE(wait.err.find("still Staging"), std::string::npos) << wait.err;
  EXPECT_EQ(Run({"dataset", "wait", "pets", "--for", "staging"}).code, kCliOk);

  EXPECT_EQ(Run({"dataset", "delete", "pets"}).code, kCliOk);
  EXPECT_EQ(Run({"dataset", "show", "pets"}).code, kCliNotFound);
}

TEST_F(CliTest, DatasetsArePlacedOnChosenNodes) {
  CliRun r = Run({"dataset", "create", "pets", "--source", source_, "--nodes", "gpu-2,gpu-1",
                  "--no-snapshot"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  r = Run({"dataset", "show", "pets"});
  EXPECT_NE(r.out.find("placed on:   gpu-1, gpu-2"), std::string::npos) << r.out;
  r = Run({"dataset", "place", "pets", "--no-nodes"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_NE(r.out.find("no node (readers read the source)"), std::string::npos) << r.out;
  auto placed = nlohmann::json::parse(Run({"dataset", "show", "pets", "-o", "json"}).out);
  EXPECT_EQ(placed["placed_on"], nlohmann::json::array());
  r = Run({"dataset", "place", "pets", "--nodes", "gpu-3"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_NE(r.err.find("not live in pool default now: gpu-3"), std::string::npos) << r.err;
  r = Run({"dataset", "place", "pets", "--all-nodes"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  placed = nlohmann::json::parse(Run({"dataset", "show", "pets", "-o", "json"}).out);
  EXPECT_TRUE(placed["placed_on"].is_null()) << placed.dump();

  ExpectRefused({
      {{"dataset", "place", "pets"}, kCliUsage, "say where"},
      {{"dataset", "place", "pets", "--no-nodes", "--all-nodes"}, kCliUsage, "choose one"},
      {{"dataset", "place", "pets", "--nodes", "a b"}, kCliUsage, "node id 'a b' is invalid"},
      {{"dataset", "place", "pets", "--nodes", "g1,g1"}, kCliUsage, "twice"},
      {{"dataset", "place", "nope", "--no-nodes"}, kCliNotFound, "nope"},
      {{"dataset", "create", "cats", "--source", source_, "--nodes", "g1", "--no-nodes"},
       kCliUsage,
       "choose one"},
  });
}

// Who may read a dataset through a Slurm job: granted and revoked by user or
// group, by name or id, shown by `dataset show`; bad names refused.
TEST_F(CliTest, CachePolicyOnCreateAndUpdate) {
  CliRun r = Run({"dataset", "create", "pets", "--source", source_, "--no-snapshot", "--priority",
                  "-20", "--ttl", "12h", "--min-resident", "40%", "--max-resident", "2GiB"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  auto stored = Store()->GetDataset("pets");
  ASSERT_OK(stored);
  EXPECT_EQ(stored->spec.cache.priority, -20);
  EXPECT_FALSE(stored->spec.cache.pinned);
  EXPECT_EQ(stored->spec.cache.ttl_seconds, 12u * 3600);
  EXPECT_EQ(stored->spec.cache.min_resident_percent, 40u);
  EXPECT_EQ(stored->spec.cache.max_resident_bytes, std::optional<uint64_t>(2ull << 30));
  r = Run({"dataset", "show", "pets"});
  EXPECT_NE(
      r.out.find("cache:       priority -20; TTL 12h; keeps at least 40%; at most 2.00 GiB\n"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("resident:    0%"), std::string::npos) << r.out;

  // update changes only what it names.
  r = Run({"dataset", "update", "pets", "--pin", "--min-resident", "0.25", "--max-resident", "none",
           "--ttl", "0"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_NE(r.out.find("cache priority -20; pinned; keeps at least 25%"), std::string::npos)
      << r.out;
  stored = Store()->GetDataset("pets");
  ASSERT_OK(stored);
  EXPECT_TRUE(stored->spec.cache.pinned);
  EXPECT_EQ(stored->spec.cache.priority, -20);
  EXPECT_EQ(stored->spec.cache.ttl_seconds, 0u);
  EXPECT_EQ(stored->spec.cache.min_resident_percent, 25u);
  EXPECT_FALSE(stored->spec.cache.max_resident_bytes.has_value());
  auto shown = nlohmann::json::parse(Run({"dataset", "show", "pets", "-o", "json"}).out);
  EXPECT_EQ(shown["cache"]["pinned"], true);
  EXPECT_EQ(shown["cache"]["max_resident_bytes"], nullptr);
  EXPECT_EQ(shown["progress"]["resident_fraction"], 0.0);
  r = Run({"dataset", "update", "pets", "--no-pin", "--priority", "1000"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  stored = Store()->GetDataset("pets");
  ASSERT_OK(stored);
  EXPECT_FALSE(stored->spec.cache.pinned);
  EXPECT_EQ(stored->spec.cache.priority, 1000);

  ExpectRefused({
      {{"dataset", "update", "pets"}, kCliUsage, "say what to change: --priority"},
      {{"dataset", "update", "pets", "--priority", "1001"},
       kCliUsage,
       "--priority '1001' is not a whole number from -1000 to 1000"},
      {{"dataset", "update", "pets", "--priority", "high"}, kCliUsage, "--priority 'high'"},
      {{"dataset", "update", "pets", "--priority", "-5000"}, kCliUsage, "--priority '-5000'"},
      {{"dataset", "update", "pets", "--priority", "1.5"}, kCliUsage, "--priority '1.5'"},
      {{"dataset", "update", "pets", "--pin", "--no-pin"}, kCliUsage, "--pin and --no-pin"},
      {{"dataset", "update", "pets", "--ttl", "-1h"}, kCliUsage, "--ttl '-1h'"},
      {{"dataset", "update", "pets", "--ttl", "soon"}, kCliUsage, "--ttl 'soon'"},
      {{"dataset", "update", "pets", "--ttl", "500ms"}, kCliUsage, "whole number of seconds"},
      {{"dataset", "update", "pets", "--ttl", "99999999999"}, kCliUsage, "--ttl"},
      {{"dataset", "update", "pets", "--min-resident", "1.5"},
       kCliUsage,
       "--min-resident '1.5' is outside 0..100%"},
      {{"dataset", "update", "pets", "--min-resident", "-10%"}, kCliUsage, "outside 0..100%"},
      {{"dataset", "update", "pets", "--min-resident", "half"},
       kCliUsage,
       "--min-resident 'half' is not a number"},
      {{"dataset", "update", "pets", "--min-resident", "33.3%"},
       kCliUsage,
       "not a whole percentage"},
      {{"dataset", "update", "pets", "--min-resident", "nan"}, kCliUsage, "is not a number"},
      {{"dataset", "update", "pets", "--max-resident", "-1GiB"},
       kCliUsage,
       "--max-resident '-1GiB'"},
      {{"dataset", "update", "pets", "--max-resident", "lots"}, kCliUsage, "--max-resident 'lots'"},
      {{"dataset", "update", "pets", "--max-resident", "99999999999TiB"},
       kCliUsage,
       "--max-resident"},
      {{"dataset", "update", "nope", "--pin"}, kCliNotFound, "nope"},
      {{"dataset", "create", "other", "--source", source_, "--no-snapshot", "--priority", "x"},
       kCliUsage,
       "--priority 'x'"},
  });
  // Nothing bad was written, and "other" was not created.
  stored = Store()->GetDataset("pets");
  ASSERT_OK(stored);
  EXPECT_EQ(stored->spec.cache.priority, 1000);
  EXPECT_EQ(Store()->GetDataset("other").status().code(), StatusCode::kNotFound);
}

TEST_F(CliTest, GrantAndRevokeReaders) {
  CliRun r = Run(
      {"dataset", "create", "pets", "--source", source_, "--no-snapshot", "--owner", "4300:4300"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  r = Run({"dataset", "show", "pets"});
  EXPECT_NE(r.out.find("readers:     root and its owner (4300)\n"), std::string::npos) << r.out;
  r = Run({"dataset", "grant", "pets", "--user", "nobody,4242", "--group", "nogroup"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_NE(r.out.find("user 4242 (4242); user nobody (65534); group nogroup (65534)"),
            std::string::npos)
      << r.out;
  // Again: nothing twice; the owner needs no grant.
  r = Run({"dataset", "grant", "pets", "--user", "65534", "--user", "4300"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_NE(r.out.find("owns dataset pets and reads it without a grant"), std::string::npos)
      << r.out;
  auto shown = nlohmann::json::parse(Run({"dataset", "show", "pets", "-o", "json"}).out);
  EXPECT_EQ(shown["readers"]["uids"], nlohmann::json({4242, 4300, 65534}));
  EXPECT_EQ(shown["readers"]["gids"], nlohmann::json({65534}));
  auto stored = Store()->GetDataset("pets");
  ASSERT_OK(stored);
  EXPECT_EQ(stored->readers.uids, (std::vector<uint32_t>{4242, 4300, 65534}));
  r = Run({"dataset", "revoke", "pets", "--user", "nobody", "--user", "4300", "--group", "65534"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  r = Run({"dataset", "revoke", "pets", "--user", "nobody"});  // not granted: nothing to do
  ASSERT_EQ(r.code, kCliOk) << r.err;
  stored = Store()->GetDataset("pets");
  ASSERT_OK(stored);
  EXPECT_EQ(stored->readers.uids, std::vector<uint32_t>{4242});
  EXPECT_TRUE(stored->readers.gids.empty());

  ExpectRefused({
      {{"dataset", "grant", "pets"}, kCliUsage, "say whom with --user"},
      {{"dataset", "grant", "pets", "--user", "no-such-user-x"},
       kCliUsage,
       "--user 'no-such-user-x': no such user"},
      {{"dataset", "grant", "pets", "--group", "no-such-group-x"},
       kCliUsage,
       "--group 'no-such-group-x': no such group"},
      {{"dataset", "grant", "pets", "--user", "4294967295"}, kCliUsage, "no such user"},
      {{"dataset", "grant", "pets", "--user", "-1"}, kCliUsage, "no such user"},
      {{"dataset", "grant", "pets", "--user", ""}, kCliUsage, "no such user"},
      {{"dataset", "revoke", "nope", "--user", "nobody"}, kCliNotFound, "nope"},
  });
  stored = Store()->GetDataset("pets");
  ASSERT_OK(stored);
  EXPECT_EQ(stored->readers.uids, std::vector<uint32_t>{4242}) << "a refused grant changed it";
}

TEST_F(CliTest, UnreachableOrBadStore) {
  std::ostringstream out;
  std::ostringstream err;
  const uint16_t port = testing::FreeTcpPort();
  int code =
      RunCli({"--store", "redis://127.0.0.1:" + std::to_string(port) + "/0", "status"}, out, err);
  EXPECT_EQ(code, kCliUnavailable) << err.str();
  EXPECT_NE(err.str().find("GRANARY_STORE"), std::string::npos) << err.str();
  code = RunCli({"--store", "mysql://x", "status"}, out, err);
  EXPECT_EQ(code, kCliUsage) << err.str();
}

// Commands that only read create nothing: against an embedded store that does
// not exist, each says so (naming the store and who makes it) and leaves no
// file and no directory behind; `dataset create` still makes the store.
TEST_F(CliTest, ReadOnlyCommandsCreateNoStore) {
  const std::string dir = dir_.Join("no/such/dir");
  const std::string missing = "sqlite://" + dir + "/granary.db";
  const std::string in_existing_dir = "sqlite://" + dir_.path() + "/absent.db";
  const std::string script = dir_.Join("job.sh");
  testing::WriteAll(script, "#!/bin/sh\n#DW persistentdw name=pets\nsrun true\n");
  const std::vector<std::vector<std::string>> commands = {
      {"dataset", "list"}, {"dataset", "show", "pets"}, {"dataset", "wait", "pets"},
      {"node", "list"},    {"plan", "show", "pets"},    {"status"},
      {"ls", "pets"},      {"cat", "pets", "a.jpg"},    {"slurm", "validate", script},
      {"slurm", "pools"}};
  for (const std::string& url : {missing, in_existing_dir}) {
    for (std::vector<std::string> args : commands) {
      SCOPED_TRACE(url + " " + args.front() + (args.size() > 1 ? " " + args[1] : ""));
      args.insert(args.begin(), {"--store", url});
      std::ostringstream out;
      std::ostringstream err;
      const int code = RunCli(args, out, err);
      EXPECT_NE(code, kCliOk) << out.str();
      EXPECT_NE(err.str().find("there is no such file"), std::string::npos) << err.str();
      EXPECT_NE(err.str().find("granary dataset create"), std::string::npos) << err.str();
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("no")));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("absent.db")));
  // A script without persistentdw needs no store: valid, and still nothing made.
  testing::WriteAll(script, "#!/bin/sh\nsrun true\n");
  std::ostringstream out;
  std::ostringstream err;
  EXPECT_EQ(RunCli({"--store", missing, "slurm", "validate", script}, out, err), kCliOk)
      << err.str();
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("no")));
  // Creating a dataset makes the store, directory and all.
  CliRun r = Run({"dataset", "create", "pets", "--source", source_});
  EXPECT_EQ(r.code, kCliOk) << r.err;
  r = Run({"dataset", "show", "pets"});
  EXPECT_EQ(r.code, kCliOk) << r.err;
}

TEST_F(CliTest, RootSnapshotsAsTheOwner) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch to another owner";
  // A directory only root can list: the owner (nobody) cannot see into it,
  // so its files are not in the manifest.
  ASSERT_EQ(mkdir((source_ + "/secret").c_str(), 0700), 0);
  testing::WriteAll(source_ + "/secret/key.bin", "root only");
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
  CliRun r = Run({"dataset", "create", "pets", "--source", source_, "--owner", "65534:65534"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  auto store = Store();
  auto record = store->GetDataset("pets");
  ASSERT_OK(record);
  EXPECT_EQ(record->owner.uid, 65534u);
  auto manifest = Manifest::Decode(*store->GetManifest(record->manifest_id));
  ASSERT_OK(manifest);
  EXPECT_EQ(manifest->sample_count(), 20u);
  EXPECT_FALSE(manifest->Find("secret/key.bin").ok());

  // As root's own dataset, the file is there.
  ASSERT_EQ(Run({"dataset", "create", "mine", "--source", source_}).code, kCliOk);
  auto mine = Manifest::Decode(*store->GetManifest(store->GetDataset("mine")->manifest_id));
  ASSERT_OK(mine);
  EXPECT_OK(mine->Find("secret/key.bin"));
}

// A tree with nested directories, a name that sorts before its sibling
// directory ("a.txt" < "a/" byte-wise), and an empty directory.
void AddTree(const std::string& source) {
  ASSERT_EQ(mkdir((source + "/a").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((source + "/a/b").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((source + "/dogs/puppies").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((source + "/empty").c_str(), 0750), 0);
  ASSERT_EQ(mkdir((source + "/empty/inner").c_str(), 01777), 0);
  ASSERT_EQ(chmod((source + "/empty/inner").c_str(), 01777), 0);  // past the umask
  testing::WriteAll(source + "/a.txt", "top");
  ASSERT_EQ(chmod((source + "/a.txt").c_str(), 0640), 0);
  testing::WriteAll(source + "/a/b/c.bin", testing::Bytes("c", 3000));
  testing::WriteAll(source + "/dogs/puppies/p1.jpg", testing::Bytes("p1", 500));
}

int64_t MtimeNs(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

TEST_F(CliTest, LsListsTheSnapshotFromTheManifest) {
  AddTree(source_);
  ASSERT_EQ(Run({"dataset", "create", "pets", "--source", source_}).code, kCliOk);

  CliRun r = Run({"ls", "pets"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_EQ(r.out, "a\na.txt\ncats\ndogs\nempty\n");  // by name; a directory without files too
  std::vector<std::string> dogs = {"puppies"};
  for (int i = 0; i < 20; i += 2) dogs.push_back(std::to_string(i) + ".jpg");
  std::sort(dogs.begin(), dogs.end());
  std::string expected;
  for (const auto& d : dogs) expected += d + "\n";
  r = Run({"ls", "pets", "dogs"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_EQ(r.out, expected);
  EXPECT_EQ(Run({"ls", "pets", "dogs/"}).out, expected);
  EXPECT_EQ(Run({"ls", "pets", "dogs/puppies/p1.jpg"}).out, "p1.jpg\n");
  EXPECT_EQ(Run({"ls", "pets", "-d", "dogs"}).out, "dogs\n");
  EXPECT_EQ(Run({"ls", "pets", "."}).out, "a\na.txt\ncats\ndogs\nempty\n");
  EXPECT_EQ(Run({"ls", "pets", "empty"}).out, "inner\n");
  r = Run({"ls", "pets", "empty/inner"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(Run({"ls", "pets", "empty/nope"}).code, 3);

  // -l: mode, owner, group, size, mtime as at the snapshot.
  r = Run({"ls", "-l", "pets", "dogs"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  const std::string owner = cli::UserName(getuid());
  const time_t mtime = static_cast<time_t>(MtimeNs(source_ + "/dogs/2.jpg") / 1'000'000'000);
  char when[32];
  struct tm tm {};
  ASSERT_NE(localtime_r(&mtime, &tm), nullptr);
  ASSERT_GT(strftime(when, sizeof(when), "%Y-%m-%d %H:%M", &tm), 0u);
  std::istringstream lines(r.out);
  std::string line;
  bool saw_file = false;
  bool saw_dir = false;
  while (std::getline(lines, line)) {
    if (line.ends_with(" 2.jpg")) {
      saw_file = true;
      EXPECT_EQ(line.rfind("-rw-r--r--  " + owner + "  ", 0), 0u) << line;  // as at the source
      EXPECT_NE(line.find(" 1002  " + std::string(when) + "  2.jpg"), std::string::npos) << line;
    }
    if (line.ends_with(" puppies")) {
      saw_dir = true;
      EXPECT_EQ(line.rfind("drwxr-xr-x  ", 0), 0u) << line;
      EXPECT_NE(line.find(" 500  "), std::string::npos) << line;  // bytes beneath
    }
  }
  EXPECT_TRUE(saw_file && saw_dir) << r.out;
  // Modes as at the source, the sticky bit as ls shows it; directories
  // without files have no bytes and show the dataset's newest mtime.
  r = Run({"ls", "-l", "-d", "pets", "a.txt"});
  EXPECT_EQ(r.out.rfind("-rw-r-----  ", 0), 0u) << r.out;
  r = Run({"ls", "-l", "pets", "empty"});
  EXPECT_EQ(r.out.rfind("drwxrwxrwt  ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(" 0  "), std::string::npos) << r.out;
  r = Run({"ls", "-d", "pets", "empty", "-o", "json"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  auto empty = nlohmann::json::parse(r.out)["entries"][0];
  EXPECT_EQ(empty["mode"], "0750");
  EXPECT_EQ(empty["files"], 0);
  EXPECT_EQ(empty["type"], "directory");

  // -R: each directory under its heading, depth first.
  r = Run({"ls", "-R", "pets", "a"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_EQ(r.out, "a:\nb\n\na/b:\nc.bin\n");
  r = Run({"ls", "-R", "pets"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_EQ(r.out.rfind(".:\na\na.txt\ncats\ndogs\nempty\n\na:\nb\n\na/b:\nc.bin\n\ncats:\n", 0),
            0u)
      << r.out;
  EXPECT_NE(r.out.find("\n\ndogs/puppies:\np1.jpg\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n\nempty:\ninner\n\nempty/inner:\n"), std::string::npos) << r.out;

  // JSON: every entry with its facts; -R flattens the tree.
  r = Run({"ls", "-R", "pets", "dogs", "-o", "json"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dataset"], "pets");
  EXPECT_EQ(j["path"], "dogs");
  ASSERT_EQ(j["entries"].size(), 12u);  // 10 files, puppies, puppies/p1.jpg
  bool saw_p1 = false;
  for (const auto& e : j["entries"]) {
    if (e["path"] != "dogs/puppies/p1.jpg") continue;
    saw_p1 = true;
    EXPECT_EQ(e["name"], "p1.jpg");
    EXPECT_EQ(e["type"], "file");
    EXPECT_EQ(e["size"], 500);
    EXPECT_EQ(e["mtime_ns"], MtimeNs(source_ + "/dogs/puppies/p1.jpg"));
    EXPECT_EQ(e["mode"], "0644");
    EXPECT_EQ(e["uid"], getuid());
  }
  EXPECT_TRUE(saw_p1) << r.out;
  EXPECT_EQ(j["entries"][0]["type"], "file");

  // The source changes; ls still shows the snapshot (it never looks there).
  ASSERT_EQ(unlink((source_ + "/dogs/2.jpg").c_str()), 0);
  testing::WriteAll(source_ + "/dogs/new.jpg", "new");
  EXPECT_EQ(Run({"ls", "pets", "dogs"}).out, expected);
  // Until a new snapshot.
  ASSERT_EQ(Run({"dataset", "snapshot", "pets"}).code, kCliOk);
  r = Run({"ls", "pets", "dogs"});
  EXPECT_EQ(r.out.find("2.jpg\n4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("new.jpg\n"), std::string::npos) << r.out;
}

TEST_F(CliTest, LsBadPathsAndDatasets) {
  ASSERT_EQ(Run({"dataset", "create", "pets", "--source", source_}).code, kCliOk);
  ASSERT_EQ(Run({"dataset", "create", "later", "--source", source_, "--no-snapshot"}).code, kCliOk);
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"ls", "pets", "nope"}, kCliNotFound, "no file or directory 'nope' in dataset 'pets'"},
      {{"ls", "pets", "cats/1.jpg/x"}, kCliNotFound, "cats/1.jpg/x"},
      {{"ls", "pets", "cat"}, kCliNotFound, "'cat'"},  // a prefix of "cats" is not it
      {{"ls", "pets", ".."}, kCliUsage, ".."},
      {{"ls", "pets", "../src"}, kCliUsage, "../src"},
      {{"ls", "pets", "cats/../dogs"}, kCliUsage, "cats/../dogs"},
      {{"ls", "pets", "/etc"}, kCliUsage, "/etc"},
      {{"ls", "pets", "cats//1.jpg"}, kCliUsage, "cats//1.jpg"},
      {{"ls", "nope"}, kCliNotFound, "nope"},
      {{"ls", "Bad_Name"}, kCliUsage, "Bad_Name"},
      {{"ls", "later"}, kCliFailed, "has no snapshot yet"},
      {{"ls"}, kCliUsage, "name"},
  };
  for (const Case& c : cases) {
    CliRun r = Run(c.args);
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    EXPECT_EQ(r.code, c.code) << joined << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << joined << "\n" << r.err;
    EXPECT_EQ(r.out, "") << joined;
  }
}

TEST_F(CliTest, CatWithoutCacheNodesReadsTheSourceAsTheCaller) {
  ASSERT_EQ(Run({"dataset", "create", "pets", "--source", source_}).code, kCliOk);
  // No cache node is running: the source serves, and the CLI says so.
  CliRun r = Run({"cat", "pets", "dogs/2.jpg", "cats/1.jpg", "--direct"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_EQ(r.out,
            testing::ReadAll(source_ + "/dogs/2.jpg") + testing::ReadAll(source_ + "/cats/1.jpg"));
  EXPECT_NE(r.err.find("2 of 2 files were read from the source"), std::string::npos) << r.err;
  // A file changed since the snapshot is refused, not served.
  testing::WriteAll(source_ + "/dogs/4.jpg", "changed");
  r = Run({"cat", "pets", "dogs/4.jpg", "--direct"});
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("dogs/4.jpg"), std::string::npos) << r.err;

  r = Run({"cat", "pets", "dogs/2.jpg", "--direct", "--no-source"});
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  EXPECT_NE(r.err.find("no live cache node"), std::string::npos) << r.err;
  r = Run({"cat", "pets", "dogs", "--direct"});
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  EXPECT_NE(r.err.find("is a directory"), std::string::npos) << r.err;
  r = Run({"cat", "pets", "../x", "--direct"});
  EXPECT_EQ(r.code, kCliUsage) << r.err;
  r = Run({"cat", "pets", "--direct"});
  EXPECT_EQ(r.code, kCliUsage) << r.err;
  r = Run({"cat", "pets", "dogs/2.jpg", "--direct", "--timeout", "soon"});
  EXPECT_EQ(r.code, kCliUsage) << r.err;
}

TEST_F(CliTest, ClusterKeyGenerateWritesAKeyOnlyItsOwnerReadsAndNeverOverwritesOne) {
  const std::string key = dir_.path() + "/etc/cluster.key";
  CliRun r = Run({"cluster-key", "generate", "--out", key});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_NE(r.out.find("wrote a new cluster key (id "), std::string::npos) << r.out;
  struct stat st {};
  ASSERT_EQ(::stat(key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto loaded = ClusterKeys::Load(key);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const std::string first = testing::ReadAll(key);
  // An existing key is never replaced by accident: every holder would be locked out.
  r = Run({"cluster-key", "generate", "--out", key});
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  EXPECT_NE(r.err.find("exists"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Rotating the cluster key"), std::string::npos) << r.err;
  EXPECT_EQ(testing::ReadAll(key), first);
  r = Run({"-o", "json", "cluster-key", "generate", "--out", key, "--force"});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_NE(testing::ReadAll(key), first);
  EXPECT_NE(r.out.find("\"key_id\""), std::string::npos) << r.out;
  r = Run({"cluster-key", "generate", "--out", "relative.key"});
  EXPECT_EQ(r.code, kCliUsage) << r.err;
  EXPECT_NE(r.err.find("not an absolute path"), std::string::npos) << r.err;
}

TEST_F(CliTest, AClusterKeyFileOthersMayReadIsRefusedBeforeAnyRead) {
  ASSERT_EQ(Run({"dataset", "create", "pets", "--source", source_}).code, kCliOk);
  const std::string loose = dir_.path() + "/loose.key";
  testing::WriteAll(loose, std::string(64, 'a') + "\n");
  ASSERT_EQ(::chmod(loose.c_str(), 0644), 0);
  CliRun r = Run({"--cluster-key-file", loose, "cat", "pets", "dogs/2.jpg", "--direct"});
  EXPECT_EQ(r.code, kCliFailed) << r.err;
  EXPECT_NE(r.err.find("chmod 600 " + loose), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  r = Run(
      {"--cluster-key-file", dir_.path() + "/none.key", "cat", "pets", "dogs/2.jpg", "--direct"});
  EXPECT_EQ(r.code, kCliNotFound) << r.err;
  EXPECT_NE(r.err.find("granary cluster-key generate"), std::string::npos) << r.err;
}

TEST_F(CliTest, DoctorOnAnEmbeddedStoreWithoutDaemons) {
  // A store file that does not exist is a warning, and is not created.
  const std::string path = dir_.path() + "/not-yet.db";
  std::ostringstream out;
  std::ostringstream err;
  int code = RunCli({"--store", "sqlite://" + path, "-o", "json", "doctor", "--socket",
                     dir_.path() + "/none.sock"},
                    out, err);
  EXPECT_EQ(code, kCliFailed) << out.str() << err.str();  // the socket
  auto j = nlohmann::json::parse(out.str());
  EXPECT_EQ(j["checks"][0]["check"], "store");
  EXPECT_EQ(j["checks"][0]["status"], "WARN");
  EXPECT_NE(j["checks"][0]["fix"].get<std::string>().find("dataset create"), std::string::npos);
  struct stat st {};
  EXPECT_NE(stat(path.c_str(), &st), 0) << "doctor created the store";

  // An existing store without nodes: the nodes FAIL with how to start one.
  ASSERT_EQ(Run({"dataset", "create", "pets", "--source", source_}).code, kCliOk);
  CliRun r = Run({"doctor", "--socket", dir_.path() + "/none.sock"});
  EXPECT_EQ(r.code, kCliFailed);
  EXPECT_NE(r.out.find("PASS  store"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(1 datasets, 0 live cache nodes)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAIL  nodes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fix: start granary-cachenode"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 failed"), std::string::npos) << r.out;
}

TEST_F(CliTest, VersionNeedsNoCommand) {
  CliRun r = Run({"--version"});
  EXPECT_EQ(r.code, kCliOk) << r.err;
  EXPECT_NE(r.out.find("granary 0.1.0"), std::string::npos) << r.out;
}

TEST_F(CliTest, HelpListsTheExitCodesAndEveryCommand) {
  CliRun r = Run({"--help"});
  EXPECT_EQ(r.code, kCliOk);
  for (const char* needle : {"Exit codes:", "3  not found", "5  timed out", "dataset", "ls", "cat",
                             "doctor", "status"}) {
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << " in\n" << r.out;
  }
  // An unknown command: the list of commands comes from the parser, so a
  // command added later (one line in command_list.h) is listed too.
  r = Run({"frobnicate"});
  EXPECT_EQ(r.code, kCliUsage);
  EXPECT_NE(r.err.find("the commands are dataset, node, plan, status, cluster-key, ls, cat"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("doctor"), std::string::npos) << r.err;
}

TEST_F(CliTest, ProgressLinesOnATerminalAndInLogs) {
  // Not a terminal: plain lines (here the final one of the walk).
  CliRun r = Run({"dataset", "create", "pets", "--source", source_});
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_NE(r.err.find("snapshot pets  20 files"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("snapshot pets: 20 files"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  // A terminal: redrawn in place; a re-snapshot knows how many files to
  // expect, so it has a bar and an ETA.
  r = Run({"dataset", "snapshot", "pets"}, true);
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_NE(r.err.find("\r\033[2Ksnapshot pets [##############################] 100.0%  20/20 "
                       "files"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("ETA 0s"), std::string::npos) << r.err;
  // dataset wait shows chunks, bytes, rate and the phase.
  r = Run({"dataset", "stage", "pets", "--wait", "--timeout", "300ms"});
  EXPECT_EQ(r.code, kCliTimeout) << r.err;
  EXPECT_NE(r.err.find("pets  0 chunks  0 B  0 B/s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Staging, no live cache node in pool default"), std::string::npos) << r.err;
  // JSON output has no progress at all.
  r = Run({"-o", "json", "dataset", "snapshot", "pets"}, true);
  ASSERT_EQ(r.code, kCliOk) << r.err;
  EXPECT_EQ(r.err, "");
}

TEST(ProgressMeterTest, RateAndEtaOverTheWindow) {
  const auto t0 = cli::SteadyClock::now();
  cli::ProgressMeter meter("ds", "chunks", t0);
  cli::ProgressCounts c;
  c.items_total = 100;
  c.bytes_total = 1000 << 20;
  std::string line = meter.Line(c, t0);
  EXPECT_EQ(meter.rate(), 0);
  EXPECT_LT(meter.eta(), 0);
  EXPECT_NE(line.find("ETA --"), std::string::npos) << line;
  c.items = 10;
  c.bytes = 100 << 20;
  line = meter.Line(c, t0 + std::chrono::seconds(10));
  EXPECT_DOUBLE_EQ(meter.rate(), 10.0 * (1 << 20));  // 100 MiB in 10 s
  EXPECT_DOUBLE_EQ(meter.eta(), 90);                 // 900 MiB left
  const std::string bar = "[###" + std::string(27, '.') + "] 10.0%";
  EXPECT_NE(
      line.find(bar + "  10/100 chunks  100.0 MiB/1000.0 MiB  10.0 MiB/s  ETA 1m30s  10s elapsed"),
      std::string::npos)
      << line;
  // Past the window the rate is the recent one: 500 MiB in the last 20 s.
  c.bytes = 600 << 20;
  meter.Line(c, t0 + std::chrono::seconds(30));
  c.bytes = 700 << 20;
  meter.Line(c, t0 + std::chrono::seconds(40));
  EXPECT_NEAR(meter.rate(), (700.0 - 100.0) / 30 * (1 << 20), 1);
  c.bytes = 1000 << 20;
  line = meter.Line(c, t0 + std::chrono::seconds(41), "Ready");
  EXPECT_EQ(meter.eta(), 0);
  EXPECT_NE(line.find("100.0%"), std::string::npos) << line;
  EXPECT_TRUE(line.ends_with("  Ready")) << line;

  // An unknown total: counts and rate only.
  cli::ProgressMeter walk("snapshot", "files", t0);
  cli::ProgressCounts w;
  w.has_bytes = false;
  w.items = 0;
  walk.Line(w, t0);
  w.items = 5000;
  line = walk.Line(w, t0 + std::chrono::seconds(2));
  EXPECT_EQ(line, "snapshot  5000 files  2500 files/s  2s elapsed");
}

}  // namespace
}  // namespace granary
