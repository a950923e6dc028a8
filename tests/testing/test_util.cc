#include "testing/test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "granary/core/file.h"
#include "granary/core/net_address.h"
#include "testing/fuse_mounts.h"

namespace granary::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/granary-test-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  // A mount under it (a FUSE view whose server a test killed) would keep it
  // from being removed: detached first, lazily.
  if (Status detached = DetachMountsUnder(path_); !detached.ok()) {
    ADD_FAILURE() << "removing the test directory " << path_ << ": " << detached.ToString();
  }
  std::error_code ec;
  // Tests may drop permissions on files; make everything removable first.
  for (auto it = std::filesystem::recursive_directory_iterator(
           path_, std::filesystem::directory_options::skip_permission_denied, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
  }
  std::filesystem::remove_all(path_, ec);
}

void TempDir::WriteFile(const std::string& rel, const std::string& contents) const {
  std::filesystem::path p = std::filesystem::path(path_) / rel;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

std::string ReadAll(const std::string& path) {
  auto data = ReadFileToString(path);
  EXPECT_TRUE(data.ok()) << data.status().ToString();
  return data.ok() ? *data : std::string();
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

std::string Version1ManifestBytes() {
  const std::string hex =
      "47524e594d414e460100000040000000000000000000000033747e7b8bc57b237a133dc2905bb56dbd00000000"
      "0000006800000000000000dd88926cf736dc4528b52ffd20bdfd02007284101cb0a9310c03261886a1ad1a39ac"
      "4ab3dcf6869c4810b210db5d69650aff8f84c484c93d0f619c53ac73b5c21fa1969cbbbb6f44bade62aa7a28ad"
      "59fee107ce83030b2020a3230f596417250efb015dc971a8307a254891035bdbdd";
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return bytes;
}

std::string Version2ManifestBytes() {
  const std::string hex =
      "47524e594d414e46020000004000000000000000000000000f65f7a0b8ad959b25654bde258efd8cd400000000"
      "0000007800000000000000f08a4bbd8a32ec6228b52ffd20d47d0300040500040003000f00000066696c653a2f"
      "2f2f646174612f763200ffffffff0300636c730500656d7074790100000001050005000300612e6a706762746f"
      "70d0070064c82c01a00124018001ed01e801c0010c006020c86c2513f81913430325a4a43201ab5b0682b8c356"
      "2016c010";
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return bytes;
}

namespace {

int64_t CtimeNs(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec;
}

// Waits until a file created now beside `path` gets a ctime past `path`'s.
void WaitForCtimeToPass(const std::string& path) {
  const int64_t old = CtimeNs(path);
  ASSERT_GE(old, 0) << "stat " << path << ": " << std::strerror(errno);
  const std::string probe = path + ".clock-probe";
  const bool passed = WaitFor(
      [&] {
        WriteAll(probe, "x");
        const int64_t now = CtimeNs(probe);
        ::unlink(probe.c_str());
        return now > old;
      },
      std::chrono::seconds(5), std::chrono::milliseconds(1));
  ASSERT_TRUE(passed) << "the file system's clock did not move past the ctime of " << path;
}

void SetMtimeOf(const std::string& path, const struct timespec& mtime) {
  struct timespec times[2];
  times[0].tv_sec = 0;
  times[0].tv_nsec = UTIME_OMIT;
  times[1] = mtime;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0)
      << "utimensat " << path << ": " << std::strerror(errno);
}

}  // namespace

void RewriteKeepingMtime(const std::string& path, const std::string& bytes) {
  struct stat before {};
  ASSERT_EQ(::stat(path.c_str(), &before), 0) << path << ": " << std::strerror(errno);
  WaitForCtimeToPass(path);
  WriteAll(path, bytes);  // truncates and writes: the same inode
  SetMtimeOf(path, before.st_mtim);
  struct stat after {};
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  ASSERT_EQ(after.st_ino, before.st_ino) << path << " was rewritten in place";
}

void ReplaceKeepingMtime(const std::string& path, const std::string& bytes) {
  struct stat before {};
  ASSERT_EQ(::stat(path.c_str(), &before), 0) << path << ": " << std::strerror(errno);
  WaitForCtimeToPass(path);
  const std::string fresh = path + ".replacement";
  WriteAll(fresh, bytes);
  SetMtimeOf(fresh, before.st_mtim);
  ASSERT_EQ(::rename(fresh.c_str(), path.c_str()), 0)
      << "rename " << fresh << ": " << std::strerror(errno);
}

std::string Bytes(const std::string& name, size_t size) {
  std::string out(size, '\0');
  uint64_t x = std::hash<std::string>{}(name) | 1;
  for (auto& c : out) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    c = static_cast<char>(x >> 56);
  }
  return out;
}

std::string PythonPath(const std::string& built) {
  if (const char* env = std::getenv("GRANARY_PYTHONPATH"); env != nullptr && *env != '\0') {
    return env;
  }
  return built;
}

ScopedFd ConnectLoopback(const std::string& address, int receive_buffer) {
  Result<NetAddress> parsed = ParseNetAddress(address);
  if (!parsed.ok()) return ScopedFd();
  ScopedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (receive_buffer > 0) {
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
  }
  timeval tv{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(parsed->port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ScopedFd();
  }
  return fd;
}

uint64_t RssBytes(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("VmRSS:")) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

bool SendAll(int fd, std::string_view bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

uint16_t FreeTcpPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    ::close(fd);
    throw std::runtime_error("bind failed");
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout,
             std::chrono::milliseconds interval) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(interval);
  }
}

}  // namespace granary::testing
