#include "granary/protocol/unix_socket.h"

#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace granary {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// A connected pair through a real listening socket at `path`.
struct Pair {
  ScopedFd listener;
  ScopedFd client;  // blocking (ConnectUnix)
  ScopedFd server;  // non-blocking (AcceptUnix)
};

Pair Connect(const std::string& path, const UnixListenOptions& options = {}) {
  Pair p;
  auto listener = ListenUnix(path, options);
  EXPECT_OK(listener);
  if (!listener.ok()) return p;
  p.listener = std::move(*listener);
  auto client = ConnectUnix(path, 2s);
  EXPECT_OK(client);
  if (!client.ok()) return p;
  p.client = std::move(*client);
  Result<ScopedFd> server = Status::Unavailable("not yet");
  EXPECT_TRUE(testing::WaitFor([&] {
    server = AcceptUnix(p.listener.get());
    return server.ok();
  })) << server.status().ToString();
  if (server.ok()) p.server = std::move(*server);
  return p;
}

size_t OpenFdCount() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  while (::readdir(d) != nullptr) ++n;
  ::closedir(d);
  return n;
}

ScopedFd Memfd(const std::string& contents) {
  int fd = ::memfd_create("unix_socket_test", MFD_CLOEXEC);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  EXPECT_EQ(::write(fd, contents.data(), contents.size()), static_cast<ssize_t>(contents.size()));
  return ScopedFd(fd);
}

bool HasFlag(int fd, int get, int flag) {
  int flags = ::fcntl(fd, get);
  return flags >= 0 && (flags & flag) != 0;
}

uint32_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  return st.st_mode & 07777;
}

// A socket file left behind by a listener that is gone.
void MakeStaleSocket(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);  // the file stays
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  ASSERT_TRUE(S_ISSOCK(st.st_mode));
}

TEST(UnixSocketTest, BytesBothWaysAndSocketFlags) {
  testing::TempDir dir;
  Pair p = Connect(dir.Join("s.sock"));
  ASSERT_TRUE(p.server.valid());
  EXPECT_TRUE(HasFlag(p.listener.get(), F_GETFL, O_NONBLOCK));
  EXPECT_TRUE(HasFlag(p.listener.get(), F_GETFD, FD_CLOEXEC));
  EXPECT_FALSE(HasFlag(p.client.get(), F_GETFL, O_NONBLOCK));
  EXPECT_TRUE(HasFlag(p.client.get(), F_GETFD, FD_CLOEXEC));
  EXPECT_TRUE(HasFlag(p.server.get(), F_GETFL, O_NONBLOCK));
  EXPECT_TRUE(HasFlag(p.server.get(), F_GETFD, FD_CLOEXEC));

  auto sent = SendWithFds(p.client.get(), "hello");
  ASSERT_OK(sent);
  EXPECT_EQ(*sent, 5u);
  std::array<char, 16> buf{};
  std::vector<ScopedFd> fds;
  Result<size_t> got = Status::Unavailable("");
  ASSERT_TRUE(testing::WaitFor([&] {
    got = ReceiveWithFds(p.server.get(), buf, &fds);
    return got.status().code() != StatusCode::kUnavailable;
  }));
  ASSERT_OK(got);
  EXPECT_EQ(std::string(buf.data(), *got), "hello");
  EXPECT_TRUE(fds.empty());

  ASSERT_OK(SendWithFds(p.server.get(), "back"));
  auto back = ReceiveWithFds(p.client.get(), buf, &fds);  // blocking
  ASSERT_OK(back);
  EXPECT_EQ(std::string(buf.data(), *back), "back");
}

TEST(UnixSocketTest, MemfdPassedWithTheFirstByteAndReadOnTheOtherSide) {
  testing::TempDir dir;
  Pair p = Connect(dir.Join("s.sock"));
  ASSERT_TRUE(p.server.valid());
  const std::string arena = testing::Bytes("arena", 8192);
  ScopedFd memfd = Memfd(arena);
  const int pass[] = {memfd.get()};
  ASSERT_OK(SendWithFds(p.server.get(), "REPLY", pass));
  memfd.Reset();  // the receiver's copy must stand on its own

  std::array<char, 1> one{};
  std::vector<ScopedFd> fds;
  auto first = ReceiveWithFds(p.client.get(), one, &fds);
  ASSERT_OK(first);
  EXPECT_EQ(*first, 1u);
  ASSERT_EQ(fds.size(), 1u);
  EXPECT_TRUE(HasFlag(fds[0].get(), F_GETFD, FD_CLOEXEC)) << "MSG_CMSG_CLOEXEC";
  // The rest of the bytes come without descriptors.
  std::array<char, 16> rest{};
  auto more = ReceiveWithFds(p.client.get(), rest, &fds);
  ASSERT_OK(more);
  EXPECT_EQ(std::string(rest.data(), *more), "EPLY");
  EXPECT_EQ(fds.size(), 1u);

  // The same memory: read it through a mapping, as the client does.
  void* map = ::mmap(nullptr, arena.size(), PROT_READ, MAP_SHARED, fds[0].get(), 0);
  ASSERT_NE(map, MAP_FAILED);
  EXPECT_EQ(std::memcmp(map, arena.data(), arena.size()), 0);
  ::munmap(map, arena.size());
}

TEST(UnixSocketTest, TooManyDescriptorsAreClosedAndFail) {
  testing::TempDir dir;
  Pair p = Connect(dir.Join("s.sock"));
  ASSERT_TRUE(p.server.valid());
  std::vector<ScopedFd> memfds;
  std::vector<int> raw;
  for (size_t i = 0; i < kMaxPassedFds + 2; ++i) {
    memfds.push_back(Memfd("x"));
    raw.push_back(memfds.back().get());
  }
  // SendWithFds refuses; a hostile peer uses sendmsg directly.
  auto refused = SendWithFds(p.server.get(), "x", raw);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("at most 4"));

  char byte = 'x';
  iovec iov{&byte, 1};
  std::vector<char> control(CMSG_SPACE(raw.size() * sizeof(int)));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(raw.size() * sizeof(int));
  std::memcpy(CMSG_DATA(c), raw.data(), raw.size() * sizeof(int));
  ASSERT_EQ(::sendmsg(p.server.get(), &msg, MSG_NOSIGNAL), 1);
  memfds.clear();

  const size_t before = OpenFdCount();
  std::array<char, 8> buf{};
  std::vector<ScopedFd> fds;
  auto r = ReceiveWithFds(p.client.get(), buf, &fds);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("truncated"));
  EXPECT_TRUE(fds.empty());
  EXPECT_EQ(OpenFdCount(), before) << "descriptors that arrived were leaked";
}

TEST(UnixSocketTest, UnexpectedDescriptorsAreClosed) {
  testing::TempDir dir;
  Pair p = Connect(dir.Join("s.sock"));
  ASSERT_TRUE(p.server.valid());
  {
    ScopedFd memfd = Memfd("x");
    const int pass[] = {memfd.get()};
    ASSERT_OK(SendWithFds(p.server.get(), "x", pass));
  }
  const size_t before = OpenFdCount();
  std::array<char, 8> buf{};
  auto r = ReceiveWithFds(p.client.get(), buf, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenFdCount(), before);
}

TEST(UnixSocketTest, SendArgumentsAreChecked) {
  testing::TempDir dir;
  Pair p = Connect(dir.Join("s.sock"));
  ASSERT_TRUE(p.server.valid());
  ScopedFd memfd = Memfd("x");
  const int pass[] = {memfd.get()};
  EXPECT_EQ(SendWithFds(p.client.get(), "", pass).status().code(), StatusCode::kInvalidArgument);
  auto nothing = SendWithFds(p.client.get(), "");
  ASSERT_OK(nothing);
  EXPECT_EQ(*nothing, 0u);
  std::vector<ScopedFd> fds;
  EXPECT_EQ(ReceiveWithFds(p.client.get(), std::span<char>(), &fds).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(UnixSocketTest, WouldBlockIsUnavailable) {
  testing::TempDir dir;
  Pair p = Connect(dir.Join("s.sock"));
  ASSERT_TRUE(p.server.valid());
  EXPECT_EQ(AcceptUnix(p.listener.get()).status().code(), StatusCode::kUnavailable);
  std::array<char, 8> buf{};
  std::vector<ScopedFd> fds;
  auto r = ReceiveWithFds(p.server.get(), buf, &fds);  // non-blocking, nothing sent
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  // Fill the server's send buffer: the client never reads.
  const std::string chunk(64 * 1024, 'z');
  Status last;
  size_t total = 0;
  for (int i = 0; i < 10000 && last.ok(); ++i) {
    auto n = SendWithFds(p.server.get(), chunk);
    if (n.ok()) {
      total += *n;
    } else {
      last = n.status();
    }
  }
  EXPECT_EQ(last.code(), StatusCode::kUnavailable) << last.ToString();
  EXPECT_GT(total, 0u);
}

TEST(UnixSocketTest, PeerClosed) {
  testing::TempDir dir;
  Pair p = Connect(dir.Join("s.sock"));
  ASSERT_TRUE(p.server.valid());
  p.server.Reset();
  std::array<char, 8> buf{};
  std::vector<ScopedFd> fds;
  auto eof = ReceiveWithFds(p.client.get(), buf, &fds);
  ASSERT_OK(eof);
  EXPECT_EQ(*eof, 0u);
  // No SIGPIPE (it would kill the test), a kIoError instead.
  auto sent = SendWithFds(p.client.get(), "x");
  EXPECT_EQ(sent.status().code(), StatusCode::kIoError);
  EXPECT_THAT(sent.status().message(), HasSubstr("peer closed"));
}

TEST(UnixSocketTest, PeerCredentialsAreThisProcess) {
  testing::TempDir dir;
  Pair p = Connect(dir.Join("s.sock"));
  ASSERT_TRUE(p.server.valid());
  for (int fd : {p.server.get(), p.client.get()}) {
    auto cred = PeerCredentialsOf(fd);
    ASSERT_OK(cred);
    EXPECT_EQ(cred->pid, ::getpid());
    EXPECT_EQ(cred->uid, ::getuid());
    EXPECT_EQ(cred->gid, ::getgid());
  }
  ScopedFd file = Memfd("x");
  EXPECT_FALSE(PeerCredentialsOf(file.get()).ok());
}

TEST(UnixSocketTest, ModeIsApplied) {
  testing::TempDir dir;
  auto a = ListenUnix(dir.Join("a.sock"));
  ASSERT_OK(a);
  EXPECT_EQ(ModeOf(dir.Join("a.sock")), 0660u);
  auto b = ListenUnix(dir.Join("b.sock"), UnixListenOptions{.mode = 0600});
  ASSERT_OK(b);
  EXPECT_EQ(ModeOf(dir.Join("b.sock")), 0600u);
  auto c = ListenUnix(dir.Join("c.sock"), UnixListenOptions{.mode = 0777});
  ASSERT_OK(c);
  EXPECT_EQ(ModeOf(dir.Join("c.sock")), 0777u);
  auto bad = ListenUnix(dir.Join("d.sock"), UnixListenOptions{.mode = 010000});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  auto backlog = ListenUnix(dir.Join("e.sock"), UnixListenOptions{.backlog = 0});
  EXPECT_EQ(backlog.status().code(), StatusCode::kInvalidArgument);
}

TEST(UnixSocketTest, StaleSocketIsReplaced) {
  testing::TempDir dir;
  const std::string path = dir.Join("s.sock");
  MakeStaleSocket(path);
  auto refused = ConnectUnix(path, 1s);
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("nothing listens"));

  auto kept = ListenUnix(path, UnixListenOptions{.replace_stale = false});
  EXPECT_EQ(kept.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(kept.status().message(), HasSubstr("stale"));

  Pair p = Connect(path);
  EXPECT_TRUE(p.server.valid()) << "the replaced socket accepts connections";
}

TEST(UnixSocketTest, LiveSocketIsRefused) {
  testing::TempDir dir;
  const std::string path = dir.Join("s.sock");
  auto first = ListenUnix(path);
  ASSERT_OK(first);
  auto second = ListenUnix(path);
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(second.status().message(), HasSubstr("another process is listening"));
  // The first still serves.
  auto client = ConnectUnix(path, 1s);
  ASSERT_OK(client);
  EXPECT_TRUE(testing::WaitFor([&] { return AcceptUnix(first->get()).ok(); }));
}

TEST(UnixSocketTest, OtherFilesAreNeverRemoved) {
  testing::TempDir dir;
  dir.WriteFile("s.sock", "precious");
  auto r = ListenUnix(dir.Join("s.sock"));
  EXPECT_EQ(r.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(r.status().message(), HasSubstr("not a socket"));
  EXPECT_EQ(testing::ReadAll(dir.Join("s.sock")), "precious");

  ASSERT_EQ(::mkdir(dir.Join("d.sock").c_str(), 0700), 0);
  EXPECT_EQ(ListenUnix(dir.Join("d.sock")).status().code(), StatusCode::kAlreadyExists);

  auto to_file = ConnectUnix(dir.Join("s.sock"), 1s);
  EXPECT_EQ(to_file.status().code(), StatusCode::kUnavailable);
}

TEST(UnixSocketTest, PathsAreChecked) {
  testing::TempDir dir;
  std::string long_path = "/tmp/" + std::string(kMaxUnixSocketPath, 'x');
  auto l = ListenUnix(long_path);
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(l.status().message(), HasSubstr("at most 107 bytes"));
  EXPECT_EQ(ConnectUnix(long_path, 1s).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ListenUnix("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ConnectUnix("", 1s).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ListenUnix(std::string("a\0b", 3)).status().code(), StatusCode::kInvalidArgument);

  // Exactly the longest path works (relative to a short directory).
  std::string base = dir.path() + "/";
  ASSERT_LT(base.size(), kMaxUnixSocketPath);
  std::string longest = base + std::string(kMaxUnixSocketPath - base.size(), 'y');
  Pair p = Connect(longest);
  EXPECT_TRUE(p.server.valid());

  auto missing_dir = ListenUnix(dir.Join("no/such/dir.sock"));
  EXPECT_EQ(missing_dir.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing_dir.status().message(), HasSubstr("directory does not exist"));

  auto missing = ConnectUnix(dir.Join("absent.sock"), 1s);
  EXPECT_EQ(missing.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(missing.status().message(), HasSubstr("no socket file"));
}

TEST(UnixSocketTest, ConnectGivesUpWhenTheBacklogStaysFull) {
  testing::TempDir dir;
  const std::string path = dir.Join("s.sock");
  auto listener = ListenUnix(path, UnixListenOptions{.backlog = 1});
  ASSERT_OK(listener);
  // Fill the backlog with connections nobody accepts.
  std::vector<ScopedFd> pending;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  bool full = false;
  for (int i = 0; i < 1000 && !full; ++i) {
    ScopedFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(fd.valid());
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ASSERT_EQ(errno, EAGAIN) << std::strerror(errno);
      full = true;
    } else {
      pending.push_back(std::move(fd));
    }
  }
  ASSERT_TRUE(full);
  const auto start = std::chrono::steady_clock::now();
  auto r = ConnectUnix(path, 200ms);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("backlog"));
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 10s);

  // Once the sidecar accepts, a waiting connect gets through.
  size_t accepted = 0;
  while (accepted <= pending.size() && AcceptUnix(listener->get()).ok()) ++accepted;
  EXPECT_EQ(accepted, pending.size());
  auto later = ConnectUnix(path, 2s);
  EXPECT_OK(later);
}

}  // namespace
}  // namespace granary
