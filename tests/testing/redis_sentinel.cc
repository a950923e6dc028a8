#include "testing/redis_sentinel.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace granary::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

struct ContextFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Context = std::unique_ptr<redisContext, ContextFree>;
using Reply = std::unique_ptr<redisReply, ReplyFree>;

// A connection to 127.0.0.1:port (AUTH'd when `password` is set); null if it
// cannot be made within 500 ms.
Context Connect(uint16_t port, const std::string& password) {
  timeval tv{0, 500'000};
  Context c(redisConnectWithTimeout("127.0.0.1", port, tv));
  if (c == nullptr || c->err != 0 || redisSetTimeout(c.get(), tv) != REDIS_OK) return nullptr;
  if (!password.empty()) {
    Reply r(static_cast<redisReply*>(redisCommand(c.get(), "AUTH %s", password.c_str())));
    if (r == nullptr || r->type == REDIS_REPLY_ERROR) return nullptr;
  }
  return c;
}

Reply Command(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  return Reply(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
}

// A field of INFO's text ("role:master\r\n..."), or empty.
std::string InfoField(const std::string& info, const std::string& field) {
  const std::string key = field + ":";
  size_t at = info.find("\r\n" + key);
  if (at == std::string::npos) {
    if (!info.starts_with(key)) return {};
    at = 0;
  } else {
    at += 2;
  }
  at += key.size();
  return info.substr(at, info.find("\r\n", at) - at);
}

std::string Info(uint16_t port, const std::string& password, const std::string& section) {
  Context c = Connect(port, password);
  if (c == nullptr) return {};
  Reply r = Command(c.get(), {"INFO", section});
  return r != nullptr && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len)
                                                       : std::string();
}

}  // namespace

struct RedisSentinelSet::Sentinel {
  uint16_t port = 0;
  pid_t pid = -1;
  std::string dir;

  void Kill() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  std::string Log() const {
    std::ifstream in(dir + "/sentinel.log");
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }
};

Result<std::unique_ptr<RedisSentinelSet>> RedisSentinelSet::Start(RedisSentinelOptions options) {
  std::unique_ptr<RedisSentinelSet> set(new RedisSentinelSet(std::move(options)));
  const RedisSentinelOptions& o = set->options_;
  std::vector<std::string> auth;
  if (!o.password.empty()) auth = {"--requirepass", o.password, "--masterauth", o.password};
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<RedisServer> primary, RedisServer::Start(auth));
  const uint16_t primary_port = primary->port();
  set->servers_.push_back(std::move(primary));
  for (int i = 0; i < o.replicas; ++i) {
    std::vector<std::string> args = auth;
    args.insert(args.end(), {"--replicaof", "127.0.0.1", std::to_string(primary_port)});
    GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<RedisServer> replica, RedisServer::Start(args));
    set->servers_.push_back(std::move(replica));
  }
  // The replicas in sync first: a sentinel learns them from the primary's INFO.
  const auto synced_by = steady_clock::now() + milliseconds(10'000);
  while (true) {
    const std::string info = Info(primary_port, o.password, "replication");
    int online = 0;
    for (int i = 0; i < o.replicas; ++i) {
      online +=
          InfoField(info, "slave" + std::to_string(i)).find("state=online") != std::string::npos;
    }
    if (online == o.replicas) break;
    if (steady_clock::now() > synced_by) {
      return Status::DeadlineExceeded("the replicas did not sync with the primary on port " +
                                      std::to_string(primary_port) + " within 10 s: " + info);
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  for (int i = 0; i < o.sentinels; ++i) GRANARY_RETURN_IF_ERROR(set->StartSentinel(primary_port));
  GRANARY_RETURN_IF_ERROR(set->WaitDiscovered(milliseconds(30'000)));
  return set;
}

RedisSentinelSet::RedisSentinelSet(RedisSentinelOptions options) : options_(std::move(options)) {}

RedisSentinelSet::~RedisSentinelSet() {
  for (auto& s : sentinels_) s->Kill();
}

Status RedisSentinelSet::StartSentinel(uint16_t primary_port) {
  auto s = std::make_unique<Sentinel>();
  s->dir = dir_.Join("sentinel-" + std::to_string(sentinels_.size()));
  if (::mkdir(s->dir.c_str(), 0700) != 0) return Status::FromErrno(errno, "mkdir " + s->dir);
  const RedisSentinelOptions& o = options_;
  for (int attempt = 0; attempt < 5; ++attempt) {
    s->port = FreeTcpPort();
    std::ostringstream conf;
    conf << "port " << s->port << "\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\n"
         << "dir " << s->dir << "\nlogfile " << s->dir << "/sentinel.log\n"
         << "sentinel monitor " << o.master_name << " 127.0.0.1 " << primary_port << " 2\n"
         << "sentinel down-after-milliseconds " << o.master_name << " 1000\n"
         << "sentinel failover-timeout " << o.master_name << " 5000\n"
         << "sentinel parallel-syncs " << o.master_name << " 1\n";
    if (!o.password.empty())
      conf << "sentinel auth-pass " << o.master_name << " " << o.password << "\n";
    if (!o.sentinel_password.empty()) {
      // Sentinels speak to each other with it too.
      conf << "requirepass " << o.sentinel_password << "\nsentinel sentinel-pass "
           << o.sentinel_password << "\n";
    }
    const std::string path = s->dir + "/sentinel.conf";
    WriteAll(path, conf.str());
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return Status::FromErrno(errno, "fork for redis-server --sentinel");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const std::string binary = RedisServer::Binary();
      ::execlp(binary.c_str(), binary.c_str(), path.c_str(), "--sentinel", nullptr);
      ::_exit(127);
    }
    s->pid = pid;
    const auto deadline = steady_clock::now() + milliseconds(10'000);
    bool up = false;
    while (!up && steady_clock::now() < deadline) {
      if (::waitpid(pid, nullptr, WNOHANG) == pid) {
        s->pid = -1;
        break;
      }
      Context c = Connect(s->port, o.sentinel_password);
      up = c != nullptr && Command(c.get(), {"PING"}) != nullptr;
      if (!up) std::this_thread::sleep_for(milliseconds(20));
    }
    if (up) {
      sentinels_.push_back(std::move(s));
      return Status::Ok();
    }
    s->Kill();
  }
  return Status::Unavailable("redis-server --sentinel did not start in " + s->dir + ": " +
                             s->Log());
}

Status RedisSentinelSet::WaitDiscovered(milliseconds timeout) const {
  const auto deadline = steady_clock::now() + timeout;
  std::string last;
  while (steady_clock::now() < deadline) {
    bool all = true;
    for (const auto& s : sentinels_) {
      Context c = Connect(s->port, options_.sentinel_password);
      if (c == nullptr) {
        all = false;
        last = "sentinel " + std::to_string(s->port) + " does not answer";
        break;
      }
      Reply r = Command(c.get(), {"SENTINEL", "master", options_.master_name});
      if (r == nullptr || r->type != REDIS_REPLY_ARRAY) {
        all = false;
        last = "SENTINEL master failed on " + std::to_string(s->port);
        break;
      }
      std::string replicas;
      std::string others;
      for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const std::string key(r->element[i]->str, r->element[i]->len);
        const std::string value(r->element[i + 1]->str, r->element[i + 1]->len);
        if (key == "num-slaves") replicas = value;
        if (key == "num-other-sentinels") others = value;
      }
      if (replicas != std::to_string(options_.replicas) ||
          others != std::to_string(sentinels_.size() - 1)) {
        all = false;
        last = "sentinel " + std::to_string(s->port) + " knows " + replicas + " replicas and " +
               others + " other sentinels";
        break;
      }
    }
    if (all) return Status::Ok();
    std::this_thread::sleep_for(milliseconds(100));
  }
  return Status::DeadlineExceeded("the sentinels did not discover each other and the replicas in " +
                                  std::to_string(timeout.count()) + " ms (" + last + ")\n" +
                                  LogTails());
}

std::string RedisSentinelSet::url(const std::string& query) const {
  std::string u = "redis+sentinel://";
  if (!options_.password.empty()) u += ":" + options_.password + "@";
  for (size_t i = 0; i < sentinels_.size(); ++i) {
    u += (i == 0 ? "" : ",") + std::string("127.0.0.1:") + std::to_string(sentinels_[i]->port);
  }
  return u + "/" + options_.master_name + "/0" + query;
}

std::vector<uint16_t> RedisSentinelSet::sentinel_ports() const {
  std::vector<uint16_t> ports;
  for (const auto& s : sentinels_) ports.push_back(s->port);
  return ports;
}

Result<uint16_t> RedisSentinelSet::PrimaryPort() const {
  for (const auto& s : sentinels_) {
    Context c = Connect(s->port, options_.sentinel_password);
    if (c == nullptr) continue;
    Reply r = Command(c.get(), {"SENTINEL", "get-master-addr-by-name", options_.master_name});
    if (r != nullptr && r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
      return static_cast<uint16_t>(std::atoi(r->element[1]->str));
    }
  }
  return Status::Unavailable("no sentinel names a primary");
}

RedisServer* RedisSentinelSet::ServerOnPort(uint16_t port) {
  for (auto& s : servers_) {
    if (s->port() == port) return s.get();
  }
  return nullptr;
}

Status RedisSentinelSet::WaitReplicated(milliseconds timeout) const {
  GRANARY_ASSIGN_OR_RETURN(uint16_t primary, PrimaryPort());
  const auto deadline = steady_clock::now() + timeout;
  std::string info;
  while (steady_clock::now() < deadline) {
    info = Info(primary, options_.password, "replication");
    const std::string offset = InfoField(info, "master_repl_offset");
    bool all = !offset.empty();
    for (int i = 0; all && i < options_.replicas; ++i) {
      all = InfoField(info, "slave" + std::to_string(i)).find("offset=" + offset + ",") !=
            std::string::npos;
    }
    if (all) return Status::Ok();
    std::this_thread::sleep_for(milliseconds(10));
  }
  return Status::DeadlineExceeded("the replicas did not catch up with the primary: " + info);
}

Result<uint16_t> RedisSentinelSet::KillPrimaryAndWaitForFailover(milliseconds timeout) {
  GRANARY_ASSIGN_OR_RETURN(uint16_t old_port, PrimaryPort());
  RedisServer* old = ServerOnPort(old_port);
  if (old == nullptr) return Status::Internal("the primary is on no server of the set");
  GRANARY_RETURN_IF_ERROR(old->Kill());
  const auto deadline = steady_clock::now() + timeout;
  while (steady_clock::now() < deadline) {
    Result<uint16_t> now = PrimaryPort();
    if (now.ok() && *now != old_port &&
        InfoField(Info(*now, options_.password, "replication"), "role") == "master") {
      return *now;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  return Status::DeadlineExceeded("no failover within " + std::to_string(timeout.count()) +
                                  " ms after the primary on port " + std::to_string(old_port) +
                                  " was killed\n" + LogTails());
}

std::string RedisSentinelSet::LogTails() const {
  std::string out;
  for (const auto& s : sentinels_) {
    const std::string log = s->Log();
    out += "---- sentinel " + std::to_string(s->port) + " ----\n" +
           (log.size() > 2048 ? log.substr(log.size() - 2048) : log);
  }
  return out;
}

}  // namespace granary::testing
