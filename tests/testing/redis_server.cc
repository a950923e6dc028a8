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
#include <string_view>
#include <thread>

namespace granary::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr milliseconds kReadyTimeout{10'000};
constexpr milliseconds kExitTimeout{10'000};
constexpr int kPortAttempts = 5;

std::string BinaryPath() {
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

// One RESP request on `fd` and its reply's raw bytes, complete for the reply
// types INFO and AUTH give (a simple string, an error, a bulk string); empty on
// a timeout or a closed connection. Every wait is bounded.
std::string Request(int fd, const std::vector<std::string>& args) {
  std::string out = "*" + std::to_string(args.size()) + "\r\n";
  for (const auto& a : args) out += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
  if (::send(fd, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size())) {
    return {};
  }
  std::string reply;
  const auto deadline = steady_clock::now() + milliseconds(2000);
  while (steady_clock::now() < deadline && reply.size() < (1u << 20)) {
    const size_t eol = reply.find("\r\n");
    if (eol != std::string::npos) {
      if (reply[0] != '$') return reply;  // +OK, -ERR ...: one line
      const long n = std::strtol(reply.c_str() + 1, nullptr, 10);
      if (n < 0) return reply;  // nil
      if (reply.size() >= eol + 2 + static_cast<size_t>(n) + 2) return reply;
    }
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 100) != 1) continue;
    char buf[4096];
    const ssize_t got = ::recv(fd, buf, sizeof(buf), 0);
    if (got <= 0) return {};
    reply.append(buf, static_cast<size_t>(got));
  }
  return {};
}

// The process id the redis-server on `port` reports in INFO server, or -1 if it
// cannot be read (not answering, wrong password, not Redis).
pid_t ServerPid(uint16_t port, const std::string& password) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  pid_t pid = -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      (password.empty() || Request(fd, {"AUTH", password}).starts_with("+OK"))) {
    const std::string info = Request(fd, {"INFO", "server"});
    constexpr std::string_view kField = "\r\nprocess_id:";
    if (size_t at = info.find(kField); at != std::string::npos) {
      pid = static_cast<pid_t>(std::strtol(info.c_str() + at + kField.size(), nullptr, 10));
    }
  }
  ::close(fd);
  return pid > 0 ? pid : -1;
}

std::string PasswordOf(const std::vector<std::string>& args) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--requirepass") return args[i + 1];
  }
  return {};
}

}  // namespace

RedisServer::RedisServer(std::vector<std::string> extra_args)
    : extra_args_(std::move(extra_args)), password_(PasswordOf(extra_args_)) {}

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

std::string RedisServer::Binary() { return BinaryPath(); }

std::string RedisServer::url(int db, const std::string& query) const {
  return "redis://127.0.0.1:" + std::to_string(port_) + "/" + std::to_string(db) + query;
}

Status RedisServer::Launch() {
  std::vector<std::string> args = {BinaryPath(),
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
  // A server that answers but is not our child: another test process took the
  // port (between FreeTcpPort and our bind, or while ours was down for a
  // Restart). Ours will fail to bind and exit; never report that one as ready.
  pid_t other = -1;
  const auto taken = [&] {
    return other > 0
               ? "; port " + std::to_string(port_) + " is answered by another redis-server (pid " +
                     std::to_string(other) + "), so another process took the port"
               : std::string();
  };
  while (steady_clock::now() < deadline) {
    int wstatus = 0;
    if (::waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      pid_ = -1;
      // Usually "Address already in use": say who holds the port, if Redis.
      if (other <= 0) other = ServerPid(port_, password_);
      return Status::Unavailable("redis-server on port " + std::to_string(port_) +
                                 " exited during start-up (status " + std::to_string(wstatus) +
                                 ")" + taken() + "; its log:\n" + ReadLog());
    }
    if (Pings(port_)) {
      const pid_t answering = ServerPid(port_, password_);
      if (answering == pid_) return Status::Ok();
      if (answering > 0) other = answering;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  return Status::DeadlineExceeded("redis-server (pid " + std::to_string(pid_) + ") on port " +
                                  std::to_string(port_) + " did not answer PING and INFO within " +
                                  std::to_string(kReadyTimeout.count()) + " ms" + taken() +
                                  "; its log:\n" + ReadLog());
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
  // Clients know the port, so a restart cannot move. While the server was down
  // another process may have bound the port, often only for a moment (a
  // FreeTcpPort probe): try a few times before giving up.
  Status last;
  for (int attempt = 0; attempt < kPortAttempts; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(milliseconds(100) * attempt);
    last = Launch();
    if (last.ok()) last = WaitReady();
    if (last.ok()) return last;
    (void)Kill();
  }
  return Status(last.code(), "restart redis-server on port " + std::to_string(port_) + " (" +
                                 std::to_string(kPortAttempts) + " attempts): " + last.message());
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
