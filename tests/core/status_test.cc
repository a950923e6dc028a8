#include "granary/core/status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace granary {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  GRANARY_ASSIGN_OR_RETURN(int h, Half(x));
  GRANARY_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  GRANARY_RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}

TEST(StatusTest, OkAndErrorsPrintCodeAndMessage) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  Status s = Status::NotFound("dataset 'x' does not exist");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NotFound: dataset 'x' does not exist");
  EXPECT_EQ(s.WithContext("load").message(), "load: dataset 'x' does not exist");
}

TEST(StatusTest, FromErrnoMapsCommonErrors) {
  EXPECT_EQ(Status::FromErrno(ENOENT, "open a").code(), StatusCode::kNotFound);
  EXPECT_EQ(Status::FromErrno(EACCES, "open a").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Status::FromErrno(ENOSPC, "write a").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(Status::FromErrno(EIO, "read a").code(), StatusCode::kIoError);
  EXPECT_NE(Status::FromErrno(ENOENT, "open a").message().find("open a: "), std::string::npos);
}

TEST(StatusTest, MacrosPropagateFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "odd: 3");
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).code(), StatusCode::kInvalidArgument);
}

// Misuse of a Result is a bug in the caller: it aborts with the status text in
// every build type (no exception to catch far away, no silent OK in release).
TEST(StatusDeathTest, ValueOfAnErrorAbortsWithItsText) {
  Result<int> r = Status::NotFound("dataset imagenet");
  EXPECT_DEATH((void)r.value(), "Result::value\\(\\) called on an error: .*dataset imagenet");
  EXPECT_DEATH((void)*Result<std::string>(Status::Internal("disk")), "disk");
}

TEST(StatusDeathTest, ResultFromAnOkStatusAborts) {
  EXPECT_DEATH((void)Result<int>(Status::Ok()), "built from an OK Status");
}

}  // namespace
}  // namespace granary
