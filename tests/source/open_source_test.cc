// OpenSource (source/include/granary/source/source.h): a source URI's scheme picks
// its driver. A file:// URI opens a PosixSource over its path that reads as the
// given owner; every URI it cannot open is kInvalidArgument naming the URI and
// the forms it accepts; a driver that does not answer CheckReadable refuses.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <memory>
#include <string>

#include "granary/source/identity.h"
#include "granary/source/source.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using ::granary::testing::TempDir;
using ::testing::HasSubstr;

struct Opened {
  std::unique_ptr<IdentityExecutor> executor;
  Result<std::unique_ptr<Source>> source = Status::Internal("not opened");
};

Opened Open(const std::string& uri) {
  Opened o;
  Result<std::unique_ptr<IdentityExecutor>> executor = IdentityExecutor::Start({.threads = 2});
  if (!executor.ok()) {
    o.source = executor.status();
    return o;
  }
  o.executor = std::move(*executor);
  SourceOptions options;
  options.dataset = "ds";
  options.owner = ProcessIdentity();
  options.executor = o.executor.get();
  options.max_in_flight = 4;
  o.source = OpenSource(uri, std::move(options));
  return o;
}

TEST(OpenSourceTest, FileUriReadsItsPathAsTheOwner) {
  TempDir dir;
  dir.WriteFile("a/b.bin", "hello");
  Opened o = Open("file://" + dir.path() + "/");
  ASSERT_OK(o.source);
  Source& source = **o.source;
  EXPECT_EQ(source.uri(), "file://" + dir.path() + "/");
  EXPECT_EQ(source.max_in_flight(), 4u);
  struct stat st {};
  ASSERT_EQ(::stat(dir.Join("a/b.bin").c_str(), &st), 0);
  SourceFile file;
  file.path = "a/b.bin";
  file.size = 5;
  file.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  std::string out(5, '\0');
  ASSERT_OK(source.Read(file, 0, out));
  EXPECT_EQ(out, "hello");
  EXPECT_EQ(source.Counters().completed, 1u);
}

TEST(OpenSourceTest, UnknownSchemeNamesTheUriAndTheAcceptedForms) {
  Opened o = Open("s3://bucket/imagenet");
  ASSERT_EQ(o.source.status().code(), StatusCode::kInvalidArgument) << o.source.status().ToString();
  EXPECT_THAT(o.source.status().message(), HasSubstr("s3://bucket/imagenet"));
  EXPECT_THAT(o.source.status().message(), HasSubstr("'s3'"));
  EXPECT_THAT(o.source.status().message(), HasSubstr(std::string(AcceptedSourceUris())));
}

TEST(OpenSourceTest, UriWithoutSchemeNamesTheUriAndTheAcceptedForms) {
  for (const std::string uri : {"/lustre/imagenet", "lustre/imagenet", "", "://x"}) {
    Opened o = Open(uri);
    ASSERT_EQ(o.source.status().code(), StatusCode::kInvalidArgument) << uri;
    EXPECT_THAT(o.source.status().message(), HasSubstr("'" + uri + "'"));
    EXPECT_THAT(o.source.status().message(), HasSubstr("no scheme"));
    EXPECT_THAT(o.source.status().message(), HasSubstr(std::string(AcceptedSourceUris())));
  }
}

TEST(OpenSourceTest, MalformedFileUriNamesTheUri) {
  for (const std::string uri : {"file://host/lustre", "file://", "file://relative/path"}) {
    Opened o = Open(uri);
    ASSERT_EQ(o.source.status().code(), StatusCode::kInvalidArgument) << uri;
    EXPECT_THAT(o.source.status().message(), HasSubstr("'" + uri + "'"));
    EXPECT_THAT(o.source.status().message(), HasSubstr("file:///absolute/path"));
  }
}

TEST(OpenSourceTest, MissingRootIsTheDriversNotFound) {
  TempDir dir;
  Opened o = Open("file://" + dir.Join("gone"));
  EXPECT_EQ(o.source.status().code(), StatusCode::kNotFound) << o.source.status().ToString();
  EXPECT_THAT(o.source.status().message(), HasSubstr(dir.Join("gone")));
}

// A driver with no notion of local users keeps Source's CheckReadable.
class RemoteSource final : public Source {
 public:
  Status Read(const SourceFile&, uint64_t, std::span<char>) override { return Status::Ok(); }
  Status TryRead(const SourceFile&, uint64_t, std::span<char>) override { return Status::Ok(); }
  SourceCounters Counters() const override { return {}; }
  const std::string& uri() const override { return uri_; }
  uint32_t max_in_flight() const override { return 1; }

 private:
  std::string uri_ = "s3://bucket/x";
};

TEST(OpenSourceTest, DriverWithoutLocalUsersRefusesCheckReadable) {
  RemoteSource source;
  const SourceFile file{"a.bin", 1, 0, 0, 0};
  Status s = source.CheckReadable(ProcessIdentity(), std::span<const SourceFile>(&file, 1));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("s3://bucket/x"));
  EXPECT_THAT(s.message(), HasSubstr("sidecar"));
}

}  // namespace
}  // namespace granary
