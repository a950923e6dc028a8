#include "granary/source/identity.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <latch>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/file.h"
#include "testing/child_process.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using ::granary::testing::TempDir;
using ::testing::HasSubstr;

constexpr uint32_t kNobody = 65534;

bool IsRoot() { return ::geteuid() == 0; }

#define SKIP_UNLESS_ROOT()                                                     \
  do {                                                                         \
    if (!IsRoot())                                                             \
      GTEST_SKIP() << "needs root: switching identities needs CAP_SETUID and " \
                      "CAP_SETGID (CI runs the suite as root)";                \
  } while (0)

// The calling thread's credentials as the kernel reports them.
struct ThreadCreds {
  std::vector<uint32_t> uids;  // real, effective, saved, fs
  std::vector<uint32_t> gids;
  std::vector<uint32_t> groups;
  uint32_t fsuid() const { return uids.at(3); }
  uint32_t fsgid() const { return gids.at(3); }
  friend bool operator==(const ThreadCreds&, const ThreadCreds&) = default;
};

ThreadCreds ReadThreadCreds() {
  ThreadCreds c;
  std::ifstream in("/proc/thread-self/status");
  std::string line;
  auto numbers = [](const std::string& rest) {
    std::vector<uint32_t> v;
    std::istringstream s(rest);
    uint32_t x;
    while (s >> x) v.push_back(x);
    return v;
  };
  while (std::getline(in, line)) {
    if (line.rfind("Uid:", 0) == 0) c.uids = numbers(line.substr(4));
    if (line.rfind("Gid:", 0) == 0) c.gids = numbers(line.substr(4));
    if (line.rfind("Groups:", 0) == 0) c.groups = numbers(line.substr(7));
  }
  return c;
}

// A gid no group in the user database has, that this test can use as its own.
uint32_t UnusedGid() {
  for (uint32_t gid = 47011; gid < 48000; ++gid) {
    if (::getgrgid(gid) == nullptr) return gid;
  }
  ADD_FAILURE() << "no unused gid in 47011..47999";
  return 47011;
}

std::unique_ptr<IdentityExecutor> StartExecutor(unsigned threads = 4) {
  auto e = IdentityExecutor::Start({.threads = threads});
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

Identity Nobody() {
  auto id = ResolveOwnerIdentity(kNobody, kNobody);
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  return id.ok() ? *id : Identity{kNobody, kNobody, {kNobody}, ""};
}

// Opens `path` for reading on the calling thread: 0 or errno.
int TryOpen(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  ::close(fd);
  return 0;
}

// ---- Identity values -------------------------------------------------------

TEST(IdentityTest, ValidateRejectsWhatTheKernelCannotTake) {
  EXPECT_OK(ValidateIdentity({1000, 1000, {1000, 1001}, "alice"}));
  EXPECT_OK(ValidateIdentity({0, 0, {}, ""}));
  EXPECT_EQ(ValidateIdentity({kInvalidId, 1, {}, ""}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateIdentity({1, kInvalidId, {}, ""}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateIdentity({1, 1, {5, kInvalidId}, ""}).code(), StatusCode::kInvalidArgument);
  Status unsorted = ValidateIdentity({1, 1, {5, 3}, ""});
  EXPECT_EQ(unsorted.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unsorted.message(), HasSubstr("sorted and unique"));
  EXPECT_EQ(ValidateIdentity({1, 1, {5, 5}, ""}).code(), StatusCode::kInvalidArgument);
  Identity many{1, 1, {}, ""};
  for (uint32_t g = 0; g <= kMaxSupplementaryGroups; ++g) many.groups.push_back(g);
  EXPECT_THAT(ValidateIdentity(many).message(), HasSubstr("kernel's limit"));
}

TEST(IdentityTest, ToStringNamesIdsAndQuotesTheName) {
  EXPECT_EQ((Identity{65534, 65534, {65534}, "nobody"}).ToString(),
            "uid 65534 ('nobody') gid 65534, 1 supplementary group");
  EXPECT_EQ((Identity{7, 8, {}, ""}).ToString(), "uid 7 gid 8, 0 supplementary groups");
  EXPECT_THAT((Identity{7, 8, {}, "a'b\n"}).ToString(), HasSubstr("'a\\x27b\\x0a'"));
}

TEST(IdentityTest, ResolvesKnownUsersWithTheirGroups) {
  auto root = ResolveOwnerIdentity(0, 0);
  ASSERT_OK(root);
  EXPECT_EQ(root->name, "root");
  EXPECT_THAT(root->groups, ::testing::Contains(0u));
  EXPECT_OK(ValidateIdentity(*root));

  if (::getpwuid(kNobody) == nullptr) GTEST_SKIP() << "no user 65534 in the user database";
  auto nobody = ResolveOwnerIdentity(kNobody, kNobody);
  ASSERT_OK(nobody);
  EXPECT_EQ(nobody->uid, kNobody);
  EXPECT_EQ(nobody->gid, kNobody);
  EXPECT_FALSE(nobody->name.empty());
  // getgrouplist includes the primary group it was given.
  EXPECT_THAT(nobody->groups, ::testing::Contains(kNobody));
  EXPECT_OK(ValidateIdentity(*nobody));
}

TEST(IdentityTest, UnknownUidGetsOnlyItsPrimaryGroup) {
  uint32_t uid = 3'999'999;
  while (::getpwuid(uid) != nullptr) --uid;
  auto id = ResolveOwnerIdentity(uid, 4242);
  ASSERT_OK(id);
  EXPECT_EQ(id->name, "");
  EXPECT_EQ(id->groups, std::vector<uint32_t>{4242});
}

// A local peer known only by uid (the chunk handoff's SO_PEERCRED): its
// primary group is the user database's; without an entry it has none.
TEST(IdentityTest, ResolveUserIdentityTakesThePrimaryGroupFromTheUserDatabase) {
  auto root = ResolveUserIdentity(0);
  ASSERT_OK(root);
  EXPECT_EQ(root->gid, 0u);
  EXPECT_EQ(root->name, "root");
  EXPECT_THAT(root->groups, ::testing::Contains(0u));

  uint32_t uid = 3'999'999;
  while (::getpwuid(uid) != nullptr) --uid;
  auto unknown = ResolveUserIdentity(uid);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), ::testing::HasSubstr("no entry in this host's user"));

  const struct passwd* pw = ::getpwuid(kNobody);
  if (pw == nullptr) GTEST_SKIP() << "no user 65534 in the user database";
  auto nobody = ResolveUserIdentity(kNobody);
  ASSERT_OK(nobody);
  EXPECT_EQ(nobody->gid, static_cast<uint32_t>(pw->pw_gid));
  EXPECT_THAT(nobody->groups, ::testing::Contains(static_cast<uint32_t>(pw->pw_gid)));
}

TEST(IdentityTest, ResolveRejectsInvalidIds) {
  EXPECT_EQ(ResolveOwnerIdentity(kInvalidId, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveOwnerIdentity(0, kInvalidId).status().code(), StatusCode::kInvalidArgument);
}

TEST(IdentityTest, ProcessIdentityIsTheEffectiveOne) {
  Identity self = ProcessIdentity();
  EXPECT_EQ(self.uid, ::geteuid());
  EXPECT_EQ(self.gid, ::getegid());
  ThreadCreds creds = ReadThreadCreds();
  std::vector<uint32_t> groups = creds.groups;
  std::sort(groups.begin(), groups.end());
  EXPECT_EQ(self.groups, groups);
}

// ---- IdentityExecutor ------------------------------------------------------

TEST(IdentityExecutorTest, RejectsBadThreadCounts) {
  EXPECT_EQ(IdentityExecutor::Start({.threads = 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(IdentityExecutor::Start({.threads = 1025}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(IdentityExecutorTest, RunsAsTheProcessAndReturnsTheClosuresStatus) {
  auto executor = StartExecutor();
  ASSERT_NE(executor, nullptr);
  EXPECT_EQ(executor->can_switch(), IsRoot());
  Identity self = ProcessIdentity();
  std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  EXPECT_OK(executor->Run(self, [&] {
    ran_on = std::this_thread::get_id();
    return Status::Ok();
  }));
  EXPECT_NE(ran_on, caller);  // a worker ran it, not the calling thread
  Status s = executor->Run(self, [] { return Status::NotFound("the closure's own status"); });
  EXPECT_EQ(s, Status::NotFound("the closure's own status"));
  // A const lvalue callable works too.
  const auto fn = [] { return Status::Ok(); };
  EXPECT_OK(executor->Run(self, fn));
  EXPECT_EQ(executor->Counters().runs, 3u);
}

TEST(IdentityExecutorTest, RefusesInvalidIdentitiesWithoutRunning) {
  auto executor = StartExecutor();
  ASSERT_NE(executor, nullptr);
  bool ran = false;
  Status s = executor->Run(Identity{kInvalidId, 0, {}, ""}, [&] {
    ran = true;
    return Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ran);
  EXPECT_EQ(executor->Counters().refused, 1u);
  EXPECT_EQ(executor->Counters().runs, 0u);
}

TEST(IdentityExecutorTest, WorkerTakesTheIdentityAskedForAndTheCallerKeepsItsOwn) {
  SKIP_UNLESS_ROOT();
  auto executor = StartExecutor(2);
  ASSERT_NE(executor, nullptr);
  ASSERT_TRUE(executor->can_switch());
  const uint32_t extra = UnusedGid();
  Identity who{kNobody, kNobody, {extra, kNobody}, "nobody"};  // sorted: extra < 65534
  ThreadCreds before = ReadThreadCreds();
  ThreadCreds inside;
  ASSERT_OK(executor->Run(who, [&] {
    inside = ReadThreadCreds();
    return Status::Ok();
  }));
  EXPECT_EQ(inside.fsuid(), kNobody);
  EXPECT_EQ(inside.fsgid(), kNobody);
  EXPECT_EQ(inside.groups, who.groups);
  EXPECT_EQ(inside.uids.at(1), 0u);  // the effective uid stays root's: only fs ids change
  EXPECT_EQ(ReadThreadCreds(), before);
  EXPECT_GE(executor->Counters().switches, 1u);
}

TEST(IdentityExecutorTest, OtherThreadsKeepTheirIdentityWhileAWorkerIsSwitched) {
  SKIP_UNLESS_ROOT();
  // glibc's setgroups() would change every thread's groups; the raw system
  // call changes only the worker's. Hold a worker switched and look around.
  auto executor = StartExecutor(1);
  ASSERT_NE(executor, nullptr);
  TempDir dir;
  std::string secret = dir.Join("secret");
  dir.WriteFile("secret", "root only");
  ASSERT_EQ(::chmod(secret.c_str(), 0600), 0);

  Identity who{kNobody, kNobody, {UnusedGid()}, "nobody"};
  ThreadCreds before = ReadThreadCreds();
  std::latch switched(1);
  std::latch looked(1);
  int worker_open = -1;
  std::thread runner([&] {
    EXPECT_OK(executor->Run(who, [&] {
      worker_open = TryOpen(secret);
      switched.count_down();
      looked.wait();
      return Status::Ok();
    }));
  });
  switched.wait();
  ThreadCreds during = ReadThreadCreds();
  int main_open = TryOpen(secret);
  looked.count_down();
  runner.join();

  EXPECT_EQ(during, before);
  EXPECT_EQ(main_open, 0) << "the main thread lost root's rights while a worker was switched";
  EXPECT_EQ(worker_open, EACCES) << "the worker kept root's rights";
}

TEST(IdentityExecutorTest, FileAccessUsesTheOwnersRights) {
  SKIP_UNLESS_ROOT();
  auto executor = StartExecutor();
  ASSERT_NE(executor, nullptr);
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const uint32_t group = UnusedGid();
  dir.WriteFile("secret", "s");
  dir.WriteFile("public", "p");
  dir.WriteFile("group", "g");
  ASSERT_EQ(::chmod(dir.Join("secret").c_str(), 0600), 0);
  ASSERT_EQ(::chmod(dir.Join("public").c_str(), 0644), 0);
  ASSERT_EQ(::chown(dir.Join("group").c_str(), 0, group), 0);
  ASSERT_EQ(::chmod(dir.Join("group").c_str(), 0640), 0);

  auto open_as = [&](const Identity& who, const std::string& name) {
    int err = -1;
    EXPECT_OK(executor->Run(who, [&] {
      err = TryOpen(dir.Join(name));
      return Status::Ok();
    }));
    return err;
  };
  Identity nobody = Nobody();
  Identity member{kNobody, kNobody, {group, kNobody}, "nobody"};
  Identity root{0, 0, {0}, "root"};
  EXPECT_EQ(open_as(nobody, "secret"), EACCES);
  EXPECT_EQ(open_as(nobody, "public"), 0);
  EXPECT_EQ(open_as(nobody, "group"), EACCES);
  EXPECT_EQ(open_as(member, "group"), 0);
  EXPECT_EQ(open_as(member, "secret"), EACCES);
  EXPECT_EQ(open_as(root, "secret"), 0);
  // Back to nobody on a worker that was root a moment ago: no leftover rights.
  EXPECT_EQ(open_as(nobody, "secret"), EACCES);
}

TEST(IdentityExecutorTest, ConcurrentRunsAlwaysSeeTheirOwnIdentity) {
  SKIP_UNLESS_ROOT();
  auto executor = StartExecutor(3);
  ASSERT_NE(executor, nullptr);
  const uint32_t g = UnusedGid();
  const std::vector<Identity> identities = {
      {kNobody, kNobody, {kNobody}, ""},
      {0, 0, {0}, ""},
      {kNobody, g, {g}, ""},
      {12345, 23456, {}, ""},
  };
  std::atomic<int> wrong{0};
  std::atomic<int> runs{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 6; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        const Identity& who = identities[static_cast<size_t>(t + i) % identities.size()];
        Status s = executor->Run(who, [&] {
          ThreadCreds c = ReadThreadCreds();
          if (c.fsuid() != who.uid || c.fsgid() != who.gid || c.groups != who.groups) ++wrong;
          ++runs;
          return Status::Ok();
        });
        if (!s.ok()) ++wrong;
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(runs.load(), 240);
  EXPECT_EQ(executor->Counters().runs, 240u);
  EXPECT_EQ(executor->Counters().switch_failures, 0u);
}

TEST(IdentityExecutorTest, ASwitchTheKernelIgnoresIsDetectedAndTheClosureRefused) {
  SKIP_UNLESS_ROOT();
  // setfsuid reports no failure. Take CAP_SETUID away from the one worker's
  // effective set (capabilities are per thread too) so that its next setfsuid
  // is silently ignored, and check that the executor notices.
  auto executor = StartExecutor(1);
  ASSERT_NE(executor, nullptr);
  Identity root{0, 0, {0}, "root"};
  ASSERT_OK(executor->Run(root, [] {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
    if (::syscall(SYS_capget, &header, data) != 0) return Status::FromErrno(errno, "capget");
    data[0].effective &= ~(1u << CAP_SETUID);
    if (::syscall(SYS_capset, &header, data) != 0) return Status::FromErrno(errno, "capset");
    return Status::Ok();
  }));
  bool ran = false;
  Status s = executor->Run(Nobody(), [&] {
    ran = true;
    return Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("kept fsuid 0"));
  EXPECT_THAT(s.message(), HasSubstr("CAP_SETUID"));
  EXPECT_FALSE(ran);
  EXPECT_EQ(executor->Counters().switch_failures, 1u);
}

// Without CAP_SETUID/CAP_SETGID only the process's own identity is possible.
// Returns 0 if the executor behaves so, else the number of the failed check.
int CheckOnlySelfIsPossible() {
  auto executor = IdentityExecutor::Start({.threads = 2});
  if (!executor.ok()) return 10;
  if ((*executor)->can_switch()) return 11;
  Identity self = ProcessIdentity();
  bool ran = false;
  Status s = (*executor)->Run(self, [&] {
    ran = true;
    return Status::Ok();
  });
  if (!s.ok() || !ran) return 12;
  // Someone else: refused, with the reason, and not run.
  Identity other{self.uid == 0 ? 1u : 0u, self.gid, {self.gid}, "other"};
  ran = false;
  s = (*executor)->Run(other, [&] {
    ran = true;
    return Status::Ok();
  });
  if (ran) return 13;
  if (s.code() != StatusCode::kPermissionDenied) return 14;
  if (s.message().find("without CAP_SETUID and CAP_SETGID") == std::string::npos) return 15;
  if (s.message().find("the uid differs") == std::string::npos) return 16;
  if (s.message().find(other.ToString()) == std::string::npos) return 17;
  // Own uid with a group the process is not in: refused too.
  Identity foreign_group{self.uid, 4'000'123, {}, ""};
  s = (*executor)->Run(foreign_group, [] { return Status::Ok(); });
  if (s.code() != StatusCode::kPermissionDenied) return 18;
  if (s.message().find("gid is not one of its groups") == std::string::npos) return 19;
  if ((*executor)->Counters().refused != 2) return 20;
  return 0;
}

TEST(IdentityExecutorTest, WithoutPrivilegesOnlyTheProcessIdentityIsAllowed) {
  if (!IsRoot()) {
    EXPECT_EQ(CheckOnlySelfIsPossible(), 0);
    return;
  }
  // As root, drop to nobody in a child process (whole-process, single thread).
  auto child = testing::ChildProcess::Start([](int) {
    gid_t none[1] = {kNobody};
    if (::setgroups(1, none) != 0) return 1;
    if (::setresgid(kNobody, kNobody, kNobody) != 0) return 2;
    if (::setresuid(kNobody, kNobody, kNobody) != 0) return 3;
    return CheckOnlySelfIsPossible();
  });
  ASSERT_OK(child);
  auto code = (*child)->Wait(std::chrono::seconds(20));
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0) << "check number " << *code << " failed in the unprivileged child";
}

}  // namespace
}  // namespace granary
