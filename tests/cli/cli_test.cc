// The `granary` CLI, in-process (RunCli) over a real SQLite store in a temp
// directory: the happy paths a user takes and the bad inputs they make.

#include "granary/cli/cli.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "granary/core/manifest.h"
#include "granary/core/metadata_store.h"
#include "testing/test_util.h"

namespace granary {
namespace {

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
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

  CliRun Run(std::vector<std::string> args) {
    args.insert(args.begin(), {"--store", store_url_});
    std::ostringstream out;
    std::ostringstream err;
    CliRun run;
    run.code = RunCli(args, out, err);
    run.out = out.str();
    run.err = err.str();
    return run;
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

}  // namespace
}  // namespace granary
