#include "granary/core/glob.h"

#include <gtest/gtest.h>

namespace granary {
namespace {

bool M(const char* pattern, const char* path) {
  auto g = Glob::Compile(pattern);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() && g->Match(path);
}

TEST(GlobTest, StarStaysWithinAComponent) {
  EXPECT_TRUE(M("train/*.jpg", "train/a.jpg"));
  EXPECT_FALSE(M("train/*.jpg", "train/x/a.jpg"));
  EXPECT_FALSE(M("train/*.jpg", "val/a.jpg"));
  EXPECT_TRUE(M("train/*", "train/a.jpg"));
  EXPECT_TRUE(M("a*b*c", "abc"));
  EXPECT_TRUE(M("a*b*c", "aXXbYYc"));
  EXPECT_FALSE(M("a*b*c", "aXXbYY"));
}

TEST(GlobTest, PatternWithoutSlashMatchesBasenameAnywhere) {
  EXPECT_TRUE(M("*.JPEG", "n01/n01_1.JPEG"));
  EXPECT_TRUE(M("*.JPEG", "x.JPEG"));
  EXPECT_FALSE(M("*.JPEG", "n01/n01_1.png"));
  EXPECT_TRUE(M(".git", "a/b/.git"));
}

TEST(GlobTest, DoubleStarSpansComponents) {
  EXPECT_TRUE(M("**/*.jpg", "a.jpg"));
  EXPECT_TRUE(M("**/*.jpg", "a/b/c.jpg"));
  EXPECT_TRUE(M("train/**", "train/a/b"));
  EXPECT_TRUE(M("train/**/x", "train/x"));
  EXPECT_TRUE(M("train/**/x", "train/a/b/x"));
  EXPECT_FALSE(M("train/**/x", "val/a/x"));
  EXPECT_TRUE(M("/train/*.jpg", "train/a.jpg"));  // leading '/' ignored
}

TEST(GlobTest, QuestionMarkClassesAndEscapes) {
  EXPECT_TRUE(M("f?.bin", "f1.bin"));
  EXPECT_FALSE(M("f?.bin", "f12.bin"));
  EXPECT_TRUE(M("[abc]x", "bx"));
  EXPECT_FALSE(M("[abc]x", "dx"));
  EXPECT_TRUE(M("[a-c]x", "cx"));
  EXPECT_TRUE(M("[!a-c]x", "dx"));
  EXPECT_FALSE(M("[^a-c]x", "ax"));
  EXPECT_TRUE(M("[]]x", "]x"));
  EXPECT_TRUE(M("\\*", "*"));
  EXPECT_FALSE(M("\\*", "a"));
}

TEST(GlobTest, ManyDoubleStarsStayPolynomial) {
  // Without memoisation this pattern backtracks exponentially over 2,000 components.
  std::string path;
  for (int i = 0; i < 2000; ++i) path += "a/";
  path += "c";
  auto g = Glob::Compile("**/a/**/a/**/a/**/a/**/a/**/b");
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g->Match(path));
  EXPECT_TRUE(Glob::Compile("**/a/**/a/**/c")->Match(path));
}

TEST(GlobTest, BadPatternsAreClearErrors) {
  for (const char* bad : {"", "/", "a[bc", "x\\"}) {
    auto g = Glob::Compile(bad);
    ASSERT_FALSE(g.ok()) << bad;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find("glob pattern"), std::string::npos);
  }
  auto set = GlobSet::Compile({"*.jpg", "a[b"});
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.status().message().find("a[b"), std::string::npos);
}

TEST(GlobTest, SetMatchesAny) {
  auto set = GlobSet::Compile({"*.jpg", "*.png"});
  ASSERT_TRUE(set.ok());
  EXPECT_TRUE(set->Match("a/b.png"));
  EXPECT_FALSE(set->Match("a/b.gif"));
  auto empty = GlobSet::Compile({});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  EXPECT_FALSE(empty->Match("a"));
}

}  // namespace
}  // namespace granary
