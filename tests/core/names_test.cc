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

}  // namespace
}  // namespace granary
