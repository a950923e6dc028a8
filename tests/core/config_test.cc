#include "granary/core/config.h"

#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace granary {
namespace {

struct ExampleConfig {
  std::string node_id;
  ByteSize capacity{1ull << 30};
  uint32_t workers = 4;
  bool verbose = false;
  double ratio = 0.5;
  std::chrono::milliseconds heartbeat{1000};
  std::vector<std::string> labels;
  std::string metrics_listen = "127.0.0.1:9100";
};

Status Parse(ConfigMap& m, ExampleConfig* c) {
  GRANARY_RETURN_IF_ERROR(m.Required("node_id", &c->node_id));
  GRANARY_RETURN_IF_ERROR(m.Optional("capacity", &c->capacity));
  GRANARY_RETURN_IF_ERROR(m.Optional("workers", &c->workers));
  GRANARY_RETURN_IF_ERROR(m.Optional("verbose", &c->verbose));
  GRANARY_RETURN_IF_ERROR(m.Optional("ratio", &c->ratio));
  GRANARY_RETURN_IF_ERROR(m.Optional("heartbeat", &c->heartbeat));
  GRANARY_RETURN_IF_ERROR(m.Optional("labels", &c->labels));
  GRANARY_RETURN_IF_ERROR(
      m.Section("metrics", [&](ConfigMap& s) { return s.Optional("listen", &c->metrics_listen); }));
  return m.Finish();
}

Result<ExampleConfig> ParseText(const std::string& yaml) {
  GRANARY_ASSIGN_OR_RETURN(ConfigMap m, ConfigMap::FromText(yaml, "node.yaml"));
  ExampleConfig c;
  GRANARY_RETURN_IF_ERROR(Parse(m, &c));
  return c;
}

std::string ErrorOf(const std::string& yaml) {
  auto c = ParseText(yaml);
  EXPECT_FALSE(c.ok()) << yaml;
  return c.ok() ? "" : c.status().message();
}

TEST(ConfigTest, ParsesEveryTypeAndKeepsDefaults) {
  auto c = ParseText(
      "node_id: gpu-01\n"
      "capacity: 1.5 TiB\n"
      "verbose: yes\n"
      "heartbeat: 250ms\n"
      "labels: [nvme, a100]\n"
      "metrics:\n"
      "  listen: 0.0.0.0:9200\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->node_id, "gpu-01");
  EXPECT_EQ(c->capacity.bytes, 1649267441664ull);
  EXPECT_EQ(c->workers, 4u);
  EXPECT_TRUE(c->verbose);
  EXPECT_EQ(c->heartbeat.count(), 250);
  EXPECT_EQ(c->labels, (std::vector<std::string>{"nvme", "a100"}));
  EXPECT_EQ(c->metrics_listen, "0.0.0.0:9200");
  EXPECT_DOUBLE_EQ(c->ratio, 0.5);
}

TEST(ConfigTest, UnknownKeysAreRejectedWithLineAndSuggestion) {
  std::string e = ErrorOf("node_id: a\ncapacty: 1GiB\n");
  EXPECT_NE(e.find("node.yaml:2"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'capacty'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'capacity'"), std::string::npos) << e;
  e = ErrorOf("node_id: a\nmetrics:\n  listen: x\n  port: 3\n");
  EXPECT_NE(e.find("node.yaml:4"), std::string::npos) << e;
  EXPECT_NE(e.find("in 'metrics'"), std::string::npos) << e;
  e = ErrorOf("node_id: a\nzzzzzzzzzz: 1\n");
  EXPECT_NE(e.find("known keys:"), std::string::npos) << e;
}

TEST(ConfigTest, BadValuesNameKeyLineAndFix) {
  struct Case {
    std::string yaml;
    std::string want;
  } cases[] = {
      {"capacity: 1GiB\n", "missing required key 'node_id'"},
      {"node_id: a\ncapacity: 10XB\n", "node.yaml:2: key 'capacity': '10XB' is not a byte size"},
      {"node_id: a\nworkers: -1\n", "key 'workers': '-1' is not a whole number"},
      {"node_id: a\nworkers: 99999999999\n", "'99999999999' is out of range"},
      {"node_id: a\nworkers: 4.5\n", "not a whole number"},
      {"node_id: a\nverbose: maybe\n", "'maybe' is not a boolean; use true or false"},
      {"node_id: a\nheartbeat: soon\n", "is not a duration"},
      {"node_id: a\nratio: nan\n", "is not a number"},
      {"node_id: a\nlabels: nvme\n", "expected a list"},
      {"node_id: [a, b]\n", "expected a single value"},
      {"node_id: a\nmetrics: 3\n", "key 'metrics': expected a mapping"},
      {"node_id: a\nmetrics:\n  listen: [1]\n", "key 'metrics.listen'"},
      {"- a\n- b\n", "top level must be a mapping"},
      {"node_id: a\n  bad: indent\n", "not valid YAML"},
      {"node_id: [a, b\n", "not valid YAML"},
  };
  for (const auto& c : cases) {
    std::string e = ErrorOf(c.yaml);
    EXPECT_NE(e.find(c.want), std::string::npos) << "yaml: " << c.yaml << "\nerror: " << e;
  }
}

TEST(ConfigTest, EmptyDocumentUsesDefaultsButRequiredStillRequired) {
  EXPECT_NE(ErrorOf("").find("missing required key 'node_id'"), std::string::npos);
}

TEST(ConfigTest, FromFileNamesTheFile) {
  testing::TempDir dir;
  dir.WriteFile("c.yaml", "node_id: x\nbogus: 1\n");
  auto m = ConfigMap::FromFile(dir.Join("c.yaml"));
  ASSERT_TRUE(m.ok());
  ExampleConfig c;
  Status s = Parse(*m, &c);
  EXPECT_NE(s.message().find(dir.Join("c.yaml") + ":2"), std::string::npos) << s.message();
  auto missing = ConfigMap::FromFile(dir.Join("nope.yaml"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.yaml"), std::string::npos);
}

TEST(ConfigTest, ByteSizesAndDurations) {
  EXPECT_EQ(ParseByteSize("16MiB")->bytes, 16ull << 20);
  EXPECT_EQ(ParseByteSize("16 M")->bytes, 16ull << 20);
  EXPECT_EQ(ParseByteSize("100MB")->bytes, 100'000'000ull);
  EXPECT_EQ(ParseByteSize("4k")->bytes, 4096ull);
  EXPECT_EQ(ParseByteSize("123")->bytes, 123ull);
  EXPECT_EQ(ParseByteSize("0.5GiB")->bytes, 1ull << 29);
  for (const char* bad : {"", "MiB", "-1", "1.2.3", "12 parsecs", "99999999TiB"}) {
    EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
  }
  EXPECT_EQ(ParseDuration("250ms")->count(), 250);
  EXPECT_EQ(ParseDuration("2s")->count(), 2000);
  EXPECT_EQ(ParseDuration("1.5m")->count(), 90000);
  EXPECT_EQ(ParseDuration("3")->count(), 3000);
  for (const char* bad : {"", "s", "5 fortnights", "-3s"}) {
    EXPECT_FALSE(ParseDuration(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace granary
