#include "testing/redis_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace granary::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr milliseconds kReadyTimeout{10'000};
constexpr milliseconds kExitTimeout{10'000};
constexpr int kPortAttempts = 5;

std::string RedisBinary() {
  if (const char* env = std::getenv("GRANARY_REDIS_SERVER"); env != nullptr && *env != '\0') {
    return env;
  }
  if (::access("/usr/bin/redis-server", X_OK) == 0) return "/usr/bin/redis-server";
  return "redis-server";
}

// Sends PING on a fresh connection; true once the server answers it: "+PONG",
// or "-NOAUTH" when it was started with --requirepass. A server loading its
// append-only file answers "-LOADING", which is not ready yet.
bool Pings(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    static constexpr char kPing[] = "PING\r\n";
    if (::send(fd, kPing, sizeof(kPing) - 1, MSG_NOSIGNAL) == sizeof(kPing) - 1) {
      pollfd pfd{fd, POLLIN, 0};
      char buf[16] = {};
      if (::poll(&pfd, 1, 500) == 1 && ::recv(fd, buf, sizeof(buf) - 1, 0) > 0) {
        ok = std::strncmp(buf, "+PONG", 5) == 0 || std::strncmp(buf, "-NOAUTH", 7) == 0;
      }
    }
  }
  ::close(fd);
  return ok;
}

}  // namespace

RedisServer::RedisServer(std::vector<std::string> extra_args)
    : extra_args_(std::move(extra_args)) {}

Result<std::unique_ptr<RedisServer>> RedisServer::Start(std::vector<std::string> extra_args) {
  std::unique_ptr<RedisServer> server(new RedisServer(std::move(extra_args)));
  // FreeTcpPort is racy (the port is released before Redis binds it), so a
  // failed start is retried on another port a few times.
  Status last;
  for (int attempt = 0; attempt < kPortAttempts; ++attempt) {
    server->port_ = FreeTcpPort();
    last = server->Launch();
    if (last.ok()) last = server->WaitReady();
    if (last.ok()) return server;
    (void)server->Kill();
  }
  return last;
}

RedisServer::~RedisServer() { (void)Kill(); }

std::string RedisServer::url(int db, const std::string& query) const {
  return "redis://127.0.0.1:" + std::to_string(port_) + "/" + std::to_string(db) + query;
}

Status RedisServer::Launch() {
  std::vector<std::string> args = {RedisBinary(),
                                   "--port",
                                   std::to_string(port_),
                                   "--bind",
                                   "127.0.0.1",
                                   "--dir",
                                   dir_.path(),
                                   "--appendonly",
                                   "yes",
                                   "--appendfsync",
                                   "always",
                                   "--save",
                                   "",
                                   "--daemonize",
                                   "no",
                                   "--protected-mode",
                                   "no",
                                   "--logfile",
                                   dir_.Join("redis.log"),
                                   "--loglevel",
                                   "notice"};
  args.insert(args.end(), extra_args_.begin(), extra_args_.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork for redis-server");
  if (pid == 0) {
    // If the test dies without cleaning up, the server must not outlive it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  pid_ = pid;
  return Status::Ok();
}

Status RedisServer::WaitReady() {
  const auto deadline = steady_clock::now() + kReadyTimeout;
  while (steady_clock::now() < deadline) {
    int wstatus = 0;
    if (::waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      pid_ = -1;
      return Status::Unavailable("redis-server on port " + std::to_string(port_) +
                                 " exited during start-up (status " + std::to_string(wstatus) +
                                 "); its log:\n" + ReadLog());
    }
    if (Pings(port_)) return Status::Ok();
    std::this_thread::sleep_for(milliseconds(10));
  }
  return Status::DeadlineExceeded(
      "redis-server on port " + std::to_string(port_) + " did not answer PING within " +
      std::to_string(kReadyTimeout.count()) + " ms; its log:\n" + ReadLog());
}

Status RedisServer::Signal(int sig) {
  if (pid_ <= 0) return Status::Ok();
  ::kill(pid_, sig);
  const auto deadline = steady_clock::now() + kExitTimeout;
  while (true) {
    int wstatus = 0;
    pid_t r = ::waitpid(pid_, &wstatus, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      pid_ = -1;
      return Status::Ok();
    }
    if (steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(milliseconds(5));
  }
  // Did not exit in time: make sure it is gone before reporting.
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
  return Status::DeadlineExceeded("redis-server on port " + std::to_string(port_) +
                                  " did not exit within " + std::to_string(kExitTimeout.count()) +
                                  " ms of signal " + std::to_string(sig) + "; killed it");
}

Status RedisServer::Stop() { return Signal(SIGTERM); }

Status RedisServer::Kill() { return Signal(SIGKILL); }

Status RedisServer::Restart() {
  GRANARY_RETURN_IF_ERROR(Stop());
  GRANARY_RETURN_IF_ERROR(Launch());
  return WaitReady();
}

std::string RedisServer::ReadLog() const {
  std::ifstream in(dir_.Join("redis.log"));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string log = ss.str();
  constexpr size_t kTail = 4000;
  return log.size() > kTail ? log.substr(log.size() - kTail) : log;
}

}  // namespace granary::testing
