#include "granary/core/names.h"

#include <gtest/gtest.h>

namespace granary {
namespace {

TEST(NamesTest, DnsLabels) {
  for (const char* good : {"a", "imagenet", "imagenet-train-2012", "0abc9", "a-b"}) {
    EXPECT_TRUE(IsDnsLabel(good)) << good;
  }
  EXPECT_TRUE(IsDnsLabel(std::string(63, 'a')));
  for (const char* bad : {"", "-a", "a-", "Imagenet", "a_b", "a.b", "a b", "ä"}) {
    EXPECT_FALSE(IsDnsLabel(bad)) << bad;
  }
  EXPECT_FALSE(IsDnsLabel(std::string(64, 'a')));
  EXPECT_FALSE(IsDnsLabel(std::string("a\0b", 3)));
}

TEST(NamesTest, QuotedEscapesAndCuts) {
  EXPECT_EQ(Quoted("plain"), "'plain'");
  EXPECT_EQ(Quoted(std::string("a\0'\\\n", 5)), "'a\\x00\\x27\\x5c\\x0a'");
  EXPECT_EQ(Quoted("\xff"), "'\\xff'");
  std::string shown = Quoted(std::string(100, 'x'));
  EXPECT_EQ(shown, "'" + std::string(80, 'x') + "...(100 bytes)'");
}

// The record names' rules live here (names.h) so that every side that
// receives a name (the store, the sidecar protocol, the CLI) applies the same.
TEST(NamesTest, RecordNamesFollowTheirRules) {
  EXPECT_TRUE(ValidateDatasetName("imagenet-train").ok());
  EXPECT_TRUE(ValidatePoolName("gpu-a").ok());
  EXPECT_TRUE(ValidateNodeId("node-1.rack_2").ok());
  EXPECT_TRUE(ValidatePlanId("job-17.rank_0").ok());
  EXPECT_TRUE(ValidateManifestId("0123456789abcdef").ok());

  Status bad = ValidateDatasetName("ImageNet");
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("dataset name 'ImageNet' is not a DNS-1123 label"),
            std::string::npos)
      << bad.message();
  bad = ValidatePoolName("-pool");
  EXPECT_NE(bad.message().find("pool name '-pool'"), std::string::npos) << bad.message();
  bad = ValidateNodeId(std::string(254, 'n'));
  EXPECT_NE(bad.message().find("use 1 to 253 letters"), std::string::npos) << bad.message();
  bad = ValidatePlanId(".hidden");
  EXPECT_NE(bad.message().find("plan id '.hidden' is invalid"), std::string::npos) << bad.message();
  EXPECT_FALSE(ValidatePlanId("").ok());
  EXPECT_FALSE(ValidatePlanId("a/b").ok());
  EXPECT_TRUE(ValidatePlanId(std::string(128, 'p')).ok());
  EXPECT_FALSE(ValidatePlanId(std::string(129, 'p')).ok());
  bad = ValidateManifestId("ABCDEF");
  EXPECT_NE(bad.message().find("lowercase hex digits"), std::string::npos) << bad.message();
  EXPECT_FALSE(ValidateManifestId("").ok());
  EXPECT_FALSE(ValidateManifestId(std::string(129, 'a')).ok());
  EXPECT_TRUE(IsAsciiAlnum('z') && IsAsciiAlnum('0') && !IsAsciiAlnum('-') &&
              !IsAsciiAlnum('\xe9'));
}

}  // namespace
}  // namespace granary
