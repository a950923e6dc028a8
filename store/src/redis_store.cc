// The Redis backend. Every multi-key change is one Lua script (EVAL), so it is
// atomic and its event is published in the same step; see
// docs/metadata-store.md for the key schema the scripts maintain.
//
// Kept whole at about 700 lines: its one job is the RawStore interface over
// one Redis connection (connect, reconnect with backoff, run a script, read a
// reply, the watcher's subscription). The scripts and the reply checks are
// written side by side because each script's reply shape is read right below
// it; splitting them would put the two halves of one contract in two files.

#include "redis_store.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "granary/core/log.h"
#include "granary/core/names.h"
#include "metadata_store_internal.h"

namespace granary {

namespace redis_internal {
void ContextDeleter::operator()(redisContext* c) const { redisFree(c); }
void ReplyDeleter::operator()(redisReply* r) const { freeReplyObject(r); }
}  // namespace redis_internal

namespace {

using redis_internal::ContextPtr;
using redis_internal::ReplyPtr;
using std::chrono::milliseconds;
using std::chrono::steady_clock;
using store_internal::Backoff;
using store_internal::FormatDuration;

constexpr size_t kMaxEventsPerBatch = 1024;

// ---- scripts (KEYS and ARGV as documented in docs/metadata-store.md) ----

// KEYS: dataset hash, dataset index. ARGV: name, record, created_ms, channel, event.
constexpr std::string_view kCreateDataset = R"lua(
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'revision', '1', 'created_ms', ARGV[3], 'record', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
)lua";

// KEYS: dataset hash. ARGV: expected revision, new revision, record, channel,
// event. Returns created_ms, or -1 (absent) / -2 (revision differs).
constexpr std::string_view kUpdateDataset = R"lua(
local rev = redis.call('HGET', KEYS[1], 'revision')
if not rev then return -1 end
if rev ~= ARGV[1] then return -2 end
redis.call('HSET', KEYS[1], 'revision', ARGV[2], 'record', ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return redis.call('HGET', KEYS[1], 'created_ms')
)lua";

// KEYS: dataset hash, dataset index, progress hash, plans hash. ARGV: name,
// channel, event.
constexpr std::string_view kDeleteDataset = R"lua(
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('DEL', KEYS[3], KEYS[4])
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
)lua";

// KEYS: dataset index. ARGV: dataset key prefix. Returns {name, revision,
// created_ms, record} per dataset; drops index entries without a hash.
constexpr std::string_view kListDatasets = R"lua(
local out = {}
for _, name in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local v = redis.call('HMGET', ARGV[1] .. name, 'revision', 'created_ms', 'record')
  if v[1] and v[2] and v[3] then
    table.insert(out, {name, v[1], v[2], v[3]})
  else
    redis.call('SREM', KEYS[1], name)
  end
end
return out
)lua";

// Membership (docs/metadata-store.md, "Membership"): besides the index set,
// a sorted set holds each node's expiry time (Redis' own clock, as PEXPIRE
// uses) and a counter the version: bumped when a node joins or changes
// identity, is removed, or is swept after its key expired. Each heartbeat
// sweeps the expired members (usually none: a range read of the set's head).

// KEYS: node hash, node index, expiry set, version. ARGV: id, record,
// identity, ttl_ms, channel, event, node key prefix. Publishes only when the
// node joins or its identity changes, so periodic heartbeats do not flood
// watchers.
constexpr std::string_view kHeartbeat = R"lua(
local old = redis.call('HGET', KEYS[1], 'identity')
redis.call('HSET', KEYS[1], 'record', ARGV[2], 'identity', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('SADD', KEYS[2], ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), ARGV[1])
local bump = old ~= ARGV[3]
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)) do
  if redis.call('EXISTS', ARGV[7] .. id) == 0 then
    redis.call('ZREM', KEYS[3], id)
    redis.call('SREM', KEYS[2], id)
    bump = true
  end
end
if bump then redis.call('INCR', KEYS[4]) end
if old ~= ARGV[3] then redis.call('PUBLISH', ARGV[5], ARGV[6]) end
return 1
)lua";

// KEYS: node index, expiry set, version. ARGV: node key prefix. Returns {id,
// record} per live node and prunes members whose key expired.
constexpr std::string_view kListNodes = R"lua(
local out = {}
local pruned = false
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local v = redis.call('HGET', ARGV[1] .. id, 'record')
  if v then
    table.insert(out, {id, v})
  else
    redis.call('SREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    pruned = true
  end
end
if pruned then redis.call('INCR', KEYS[3]) end
return out
)lua";

// KEYS: node hash, node index, expiry set, version. ARGV: id, channel, event.
constexpr std::string_view kRemoveNode = R"lua(
local n = redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if n == 0 then return 0 end
redis.call('INCR', KEYS[4])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
)lua";

// KEYS: version, expiry set. Returns {version, members expired and not swept}.
constexpr std::string_view kNodesVersion = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = tonumber(redis.call('GET', KEYS[1]) or '0')
return {v, redis.call('ZCOUNT', KEYS[2], '-inf', now)}
)lua";

// KEYS: dataset hash, child hash (progress or plans). ARGV: field, value,
// channel, event.
constexpr std::string_view kPutChild = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
)lua";

// KEYS: dataset hash, child hash. Returns nil if the dataset is absent.
constexpr std::string_view kListChildren = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return redis.call('HGETALL', KEYS[2])
)lua";

// KEYS: dataset hash, plans hash. ARGV: plan id, channel, event.
constexpr std::string_view kDeletePlan = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('HDEL', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
)lua";

// The hash of a dataset's progress or plans (docs/metadata-store.md).
std::string_view ChildHash(store_internal::RecordStore::RecordKind kind) {
  return kind == store_internal::RecordStore::RecordKind::kProgress ? "progress" : "plans";
}

timeval ToTimeval(milliseconds d) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

std::string_view StrOf(const redisReply* r) { return {r->str, r->len}; }

bool IsString(const redisReply* r) {
  return r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS;
}

template <typename T>
bool ParseInt(std::string_view s, T* out) {
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// Server errors worth waiting out: the server is starting, busy, or failing over.
bool IsTransient(std::string_view error) {
  for (std::string_view prefix : {"LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "READONLY"}) {
    if (error.starts_with(prefix)) return true;
  }
  return false;
}

Status ServerError(std::string_view what, std::string_view url, std::string_view error) {
  std::string m = std::string(what) + " on " + std::string(url) + ": Redis replied '" +
                  std::string(error) + "'";
  if (error.starts_with("NOAUTH") || error.starts_with("WRONGPASS") ||
      error.starts_with("NOPERM")) {
    return Status::PermissionDenied(m + "; check the user and password in the URL");
  }
  if (error.starts_with("OOM")) {
    return Status::ResourceExhausted(m + "; Redis reached maxmemory: free memory or raise it");
  }
  if (error.starts_with("READONLY")) {
    return Status::Unavailable(m + "; the URL points at a replica: point it at the primary");
  }
  if (error.starts_with("MISCONF")) {
    return Status::Unavailable(m +
                               "; Redis refuses writes because it cannot persist: check its "
                               "disk and log");
  }
  return Status::Internal(m + "; this is a bug in Granary or an incompatible server: report it");
}

Status Malformed(std::string_view what, std::string_view url) {
  return Status::Internal(std::string(what) + " on " + std::string(url) +
                          ": unexpected reply shape from Redis; is this Redis 6 or newer?");
}

// The first attempt of an operation gets the full connect timeout, whatever the
// budget (a budget of 0 means "try once", not "try for 0 ms"); retries get what
// is left of the budget, but never so little that a healthy server on another
// host could not answer.
milliseconds ConnectTimeout(const RedisConfig& config, const Backoff& backoff) {
  constexpr milliseconds kMinRetryConnect{50};
  if (backoff.first_attempt()) return config.connect_timeout;
  return std::min(config.connect_timeout, std::max(kMinRetryConnect, backoff.remaining()));
}

ReplyPtr RunArgv(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  return ReplyPtr(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
}

std::string GaveUp(std::string_view what, const RedisConfig& config, std::string_view last_error,
                   const Backoff& backoff) {
  std::string m = std::string(what) + " on " + config.display_url + ": " + std::string(last_error) +
                  " (gave up after " + backoff.Summary() + ", the retry budget of " +
                  FormatDuration(config.retry_budget) + "; retry_ms in the URL sets it)";
  if (last_error.find("redis-server running") == std::string_view::npos) {
    m += "; is redis-server running and reachable?";
  }
  return m;
}

// Subscriber connection; see MetadataStore::Watcher.
class RedisWatcher final : public MetadataStore::Watcher {
 public:
  explicit RedisWatcher(RedisConfig config) : config_(std::move(config)) {}

  // Connects and subscribes, retrying within `backoff`.
  Status Connect(Backoff& backoff, std::string_view what) {
    std::string last_error;
    do {
      // Bounded by the caller's deadline too: Next(timeout) must not overrun
      // by a whole connect timeout against an unresponsive host.
      auto ctx = RedisConnect(config_, std::min(config_.connect_timeout,
                                                std::max(milliseconds(50), backoff.remaining())));
      if (!ctx.ok()) {
        if (ctx.status().code() != StatusCode::kUnavailable) return ctx.status();
        last_error = ctx.status().message();
        continue;
      }
      ReplyPtr reply = RunArgv(ctx->get(), {"SUBSCRIBE", Channel()});
      if (reply == nullptr) {
        last_error = (*ctx)->errstr;
        continue;
      }
      if (reply->type == REDIS_REPLY_ERROR) {
        if (IsTransient(StrOf(reply.get()))) {
          last_error = std::string(StrOf(reply.get()));
          continue;
        }
        return ServerError(what, config_.display_url, StrOf(reply.get()));
      }
      context_ = std::move(*ctx);
      return Status::Ok();
    } while (backoff.Wait());
    return Status::Unavailable(GaveUp(what, config_, last_error, backoff));
  }

  Result<std::vector<Event>> Next(milliseconds timeout) override {
    const auto deadline = steady_clock::now() + timeout;
    std::vector<Event> events;
    while (true) {
      if (context_ == nullptr) {
        Backoff backoff(deadline);
        GRANARY_RETURN_IF_ERROR(Connect(backoff, "watch events"));
        GetLogger("store")->info("watcher reconnected to {}; consumers resync",
                                 config_.display_url);
        degraded_ = false;
        // Messages published while disconnected are gone: tell the consumer.
        events.push_back(Event{EventKind::kResync, ""});
        return events;
      }
      bool lost = false;
      while (events.size() < kMaxEventsPerBatch) {
        void* raw = nullptr;
        if (redisGetReplyFromReader(context_.get(), &raw) != REDIS_OK) {
          lost = true;
          break;
        }
        if (raw == nullptr) break;
        ReplyPtr reply(static_cast<redisReply*>(raw));
        AppendMessage(*reply, &events);
      }
      if (lost) {
        Lose(context_->errstr);
        continue;
      }
      if (!events.empty()) return events;
      auto remaining = deadline - steady_clock::now();
      if (remaining <= steady_clock::duration::zero()) return events;
      pollfd pfd{context_->fd, POLLIN, 0};
      // Round up so a sub-millisecond remainder still waits instead of spinning.
      auto wait_ms = std::chrono::ceil<milliseconds>(remaining).count();
      int n = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(wait_ms, 1 << 30)));
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, "watch events on " + config_.display_url + ": poll");
      }
      if (n == 0) continue;
      if (redisBufferRead(context_.get()) != REDIS_OK) Lose(context_->errstr);
    }
  }

 private:
  std::string Channel() const { return config_.prefix + ":events"; }

  void Lose(const char* why) {
    if (!degraded_) {
      GetLogger("store")->warn("watcher lost its connection to {}: {}; reconnecting",
                               config_.display_url, why);
      degraded_ = true;
    }
    context_.reset();
  }

  void AppendMessage(const redisReply& reply, std::vector<Event>* events) {
    // Pub/sub pushes are ["message", channel, payload]; confirmations of
    // (un)subscribe look alike with other first elements and are skipped.
    if (reply.type != REDIS_REPLY_ARRAY || reply.elements != 3 || !IsString(reply.element[0]) ||
        StrOf(reply.element[0]) != "message" || !IsString(reply.element[2])) {
      return;
    }
    auto event = store_internal::DecodeEvent(StrOf(reply.element[2]));
    if (event.ok()) {
      events->push_back(std::move(*event));
    } else if (!warned_bad_message_) {
      GetLogger("store")->warn("ignoring a message on {} at {}: {}", Channel(), config_.display_url,
                               event.status().message());
      warned_bad_message_ = true;
    }
  }

  const RedisConfig config_;
  ContextPtr context_;  // null while disconnected
  bool degraded_ = false;
  bool warned_bad_message_ = false;
};

// hiredis writes with write(2), so a server that vanishes mid-command would
// kill the process with SIGPIPE instead of giving us EPIPE to retry on. A
// handler someone installed on purpose is left alone.
void IgnoreSigpipeOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
  });
}

}  // namespace

namespace {

// "host:port", or "[v6]:port".
std::string AddressText(const std::string& host, uint16_t port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

// The primary of config.master_name as the sentinels see it, asking each in
// turn until one answers. kUnavailable when none answers (retry: a sentinel
// may be restarting), kInvalidArgument when every one that answered knows no
// such master (a wrong name: waiting will not help), kPermissionDenied for a
// refused AUTH.
Result<RedisAddress> AskSentinels(const RedisConfig& config, milliseconds timeout) {
  std::string tried;
  size_t unknown = 0;
  size_t answered = 0;
  for (const RedisAddress& sentinel : config.sentinels) {
    const std::string at = "sentinel " + AddressText(sentinel.host, sentinel.port);
    auto note = [&](const std::string& what) {
      tried += (tried.empty() ? "" : "; ") + at + ": " + what;
    };
    ContextPtr ctx(
        redisConnectWithTimeout(sentinel.host.c_str(), sentinel.port, ToTimeval(timeout)));
    if (ctx == nullptr) return Status::ResourceExhausted("connect to " + at + ": out of memory");
    if (ctx->err != 0 || redisSetTimeout(ctx.get(), ToTimeval(timeout)) != REDIS_OK) {
      note(ctx->errstr);
      continue;
    }
    if (!config.sentinel_password.empty()) {
      ReplyPtr auth = RunArgv(ctx.get(), {"AUTH", config.sentinel_password});
      if (auth == nullptr) {
        note(ctx->errstr);
        continue;
      }
      if (auth->type == REDIS_REPLY_ERROR) {
        return Status::PermissionDenied("connect to " + config.display_url + ": " + at +
                                        " refused AUTH ('" + std::string(StrOf(auth.get())) +
                                        "'); check sentinel_password_file");
      }
    }
    ReplyPtr reply =
        RunArgv(ctx.get(), {"SENTINEL", "get-master-addr-by-name", config.master_name});
    if (reply == nullptr) {
      note(ctx->errstr);
      continue;
    }
    ++answered;
    if (reply->type == REDIS_REPLY_NIL) {
      ++unknown;
      note("knows no master named " + Quoted(config.master_name));
      continue;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      const std::string error(StrOf(reply.get()));
      if (error.starts_with("NOAUTH")) {
        return Status::PermissionDenied("connect to " + config.display_url + ": " + at +
                                        " requires a password; give sentinel_password_file");
      }
      note("replied '" + error + "' (is it a sentinel? redis-server --sentinel)");
      continue;
    }
    uint64_t port = 0;
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 || !IsString(reply->element[0]) ||
        !IsString(reply->element[1]) ||
        !store_internal::ParseDecimal(StrOf(reply->element[1]), 65535, &port) || port == 0) {
      note("an unexpected reply to SENTINEL get-master-addr-by-name");
      continue;
    }
    return RedisAddress{std::string(StrOf(reply->element[0])), static_cast<uint16_t>(port)};
  }
  if (answered > 0 && unknown == answered) {
    return Status::InvalidArgument(
        "connect to " + config.display_url + ": no sentinel knows a master named " +
        Quoted(config.master_name) + " (" + tried +
        "); write the name `sentinel monitor` gives in sentinel.conf after the sentinels");
  }
  return Status::Unavailable("connect to " + config.display_url +
                             ": no sentinel told the primary (" + tried +
                             "); are the sentinels running and the URL right?");
}

}  // namespace

Result<ContextPtr> RedisConnect(const RedisConfig& config, milliseconds timeout) {
  IgnoreSigpipeOnce();
  if (!config.sentinels.empty()) {
    GRANARY_ASSIGN_OR_RETURN(RedisAddress primary, AskSentinels(config, timeout));
    RedisConfig direct = config;
    direct.sentinels.clear();
    direct.host = primary.host;
    direct.port = primary.port;
    direct.display_url =
        config.display_url + " (primary " + AddressText(primary.host, primary.port) + ")";
    GRANARY_ASSIGN_OR_RETURN(ContextPtr ctx, RedisConnect(direct, timeout));
    // Right after a failover a sentinel may still name the old primary, now
    // a replica (or about to be one): only a primary takes writes.
    ReplyPtr role = RunArgv(ctx.get(), {"ROLE"});
    if (role == nullptr) {
      return Status::Unavailable("connect to " + direct.display_url + ": ROLE: " + ctx->errstr);
    }
    if (role->type != REDIS_REPLY_ARRAY || role->elements == 0 || !IsString(role->element[0]) ||
        StrOf(role->element[0]) != "master") {
      return Status::Unavailable("connect to " + direct.display_url +
                                 ": the sentinels named a server that is not the primary (a "
                                 "failover is under way); retrying");
    }
    return ctx;
  }
  const std::string where = "connect to " + config.display_url;
  ContextPtr ctx(redisConnectWithTimeout(config.host.c_str(), config.port, ToTimeval(timeout)));
  if (ctx == nullptr) return Status::ResourceExhausted(where + ": out of memory");
  if (ctx->err != 0) {
    return Status::Unavailable(where + ": " + ctx->errstr +
                               "; is redis-server running and the URL right?");
  }
  // The same limit on every later read and write: a server that stops
  // answering is a lost connection, not a hang.
  if (redisSetTimeout(ctx.get(), ToTimeval(config.connect_timeout)) != REDIS_OK ||
      redisEnableKeepAlive(ctx.get()) != REDIS_OK) {
    return Status::Unavailable(where + ": setting socket options failed: " + ctx->errstr);
  }
  auto run = [&](const std::vector<std::string>& args, std::string_view step) -> Status {
    ReplyPtr reply = RunArgv(ctx.get(), args);
    if (reply == nullptr) {
      return Status::Unavailable(where + ": " + std::string(step) + ": " + ctx->errstr +
                                 "; is redis-server running and the URL right?");
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      std::string_view error = StrOf(reply.get());
      if (IsTransient(error)) {
        return Status::Unavailable(where + ": " + std::string(step) + ": Redis replied '" +
                                   std::string(error) + "'; it is starting up, retry shortly");
      }
      return ServerError(where + ": " + std::string(step), config.display_url, error);
    }
    return Status::Ok();
  };
  if (!config.password.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!config.user.empty()) auth.push_back(config.user);
    auth.push_back(config.password);
    GRANARY_RETURN_IF_ERROR(run(auth, "AUTH"));
  }
  if (config.db != 0) {
    Status s = run({"SELECT", std::to_string(config.db)}, "SELECT " + std::to_string(config.db));
    if (s.code() == StatusCode::kInternal) {
      return Status::InvalidArgument(s.message() +
                                     " (does the server have that many databases? "
                                     "see 'databases' in redis.conf)");
    }
    GRANARY_RETURN_IF_ERROR(s);
  }
  GRANARY_RETURN_IF_ERROR(run({"PING"}, "PING"));
  return ctx;
}

RedisStore::RedisStore(RedisConfig config)
    : RecordStore(config.clock), config_(std::move(config)) {}
RedisStore::~RedisStore() = default;

Result<std::unique_ptr<MetadataStore>> RedisStore::Open(RedisConfig config) {
  GRANARY_ASSIGN_OR_RETURN(ContextPtr ctx, RedisConnect(config, config.connect_timeout));
  std::unique_ptr<RedisStore> store(new RedisStore(std::move(config)));
  store->context_ = std::move(ctx);
  return std::unique_ptr<MetadataStore>(std::move(store));
}

std::string RedisStore::Key(std::string_view kind, std::string_view name) const {
  std::string key = config_.prefix;
  key += ':';
  key += kind;
  if (!name.empty()) {
    key += ':';
    key += name;
  }
  return key;
}

std::string RedisStore::Channel() const { return Key("events", ""); }

std::string RedisStore::Location(RecordKind kind, std::string_view name,
                                 std::string_view key) const {
  switch (kind) {
    case RecordKind::kDataset:
      return "key " + Quoted(Key("dataset", name));
    case RecordKind::kNode:
      return "key " + Quoted(Key("node", name));
    case RecordKind::kProgress:
    case RecordKind::kPlan:
      return "field " + Quoted(key) + " of key " + Quoted(Key(ChildHash(kind), name));
  }
  return {};
}

Result<RedisStore::DatasetRow> RedisStore::DatasetFromHash(std::string_view name,
                                                           std::string_view revision_text,
                                                           std::string_view created_text,
                                                           std::string_view record) const {
  DatasetRow row;
  if (!ParseInt(revision_text, &row.revision) || !ParseInt(created_text, &row.created_ms)) {
    return store_internal::CorruptRecord(Where(RecordKind::kDataset, name),
                                         "revision " + Quoted(revision_text) + " or created_ms " +
                                             Quoted(created_text) + " is not a decimal number");
  }
  row.name = name;
  row.record = record;
  return row;
}

Result<ReplyPtr> RedisStore::Command(std::string_view what, const std::vector<std::string>& args) {
  Backoff backoff(config_.retry_budget);
  std::string last_error;
  do {
    if (context_ == nullptr) {
      auto ctx = RedisConnect(config_, ConnectTimeout(config_, backoff));
      if (!ctx.ok()) {
        // Wrong password or database: waiting will not fix it.
        if (ctx.status().code() != StatusCode::kUnavailable) return ctx.status();
        last_error = ctx.status().message();
      } else {
        context_ = std::move(*ctx);
        ++connections_;
      }
    }
    if (context_ != nullptr) {
      ReplyPtr reply = RunArgv(context_.get(), args);
      if (reply == nullptr) {
        last_error = std::string("connection lost: ") + context_->errstr;
        context_.reset();
      } else if (reply->type == REDIS_REPLY_ERROR) {
        std::string_view error = StrOf(reply.get());
        if (!IsTransient(error)) return ServerError(what, config_.display_url, error);
        last_error = "Redis replied '" + std::string(error) + "'";
        // A primary demoted by a failover: the sentinels name the new one.
        if (error.starts_with("READONLY")) context_.reset();
      } else {
        if (degraded_) {
          GetLogger("store")->info("{} reachable again ({})", config_.display_url,
                                   backoff.Summary());
          degraded_ = false;
        }
        return reply;
      }
    }
    if (!degraded_) {
      GetLogger("store")->warn("{} on {}: {}; retrying with backoff for up to {}", what,
                               config_.display_url, last_error,
                               FormatDuration(config_.retry_budget));
      degraded_ = true;
    }
  } while (backoff.Wait());
  return Status::Unavailable(GaveUp(what, config_, last_error, backoff));
}

Result<ReplyPtr> RedisStore::Eval(std::string_view what, std::string_view script,
                                  const std::vector<std::string>& keys,
                                  const std::vector<std::string>& argv) {
  std::vector<std::string> args = {"EVAL", std::string(script), std::to_string(keys.size())};
  args.insert(args.end(), keys.begin(), keys.end());
  args.insert(args.end(), argv.begin(), argv.end());
  return Command(what, args);
}

Result<bool> RedisStore::InsertDataset(std::string_view what, std::string_view name,
                                       int64_t created_ms, const std::string& record,
                                       const Event& event) {
  GRANARY_ASSIGN_OR_RETURN(ReplyPtr reply,
                           Eval(what, kCreateDataset, {Key("dataset", name), Key("datasets", "")},
                                {std::string(name), record, std::to_string(created_ms), Channel(),
                                 store_internal::EncodeEvent(event)}));
  if (reply->type != REDIS_REPLY_INTEGER) return Malformed(what, config_.display_url);
  return reply->integer != 0;
}

Result<std::optional<RedisStore::DatasetRow>> RedisStore::ReadDataset(std::string_view what,
                                                                      std::string_view name) {
  GRANARY_ASSIGN_OR_RETURN(ReplyPtr reply, Command(what, {"HMGET", Key("dataset", name), "revision",
                                                          "created_ms", "record"}));
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 3) {
    return Malformed(what, config_.display_url);
  }
  for (size_t i = 0; i < 3; ++i) {
    if (!IsString(reply->element[i])) return std::optional<DatasetRow>();
  }
  GRANARY_ASSIGN_OR_RETURN(DatasetRow row,
                           DatasetFromHash(name, StrOf(reply->element[0]), StrOf(reply->element[1]),
                                           StrOf(reply->element[2])));
  return std::optional<DatasetRow>(std::move(row));
}

Status RedisStore::ReadDatasets(std::string_view what,
                                const std::function<Status(const DatasetRow&)>& each) {
  GRANARY_ASSIGN_OR_RETURN(
      ReplyPtr reply, Eval(what, kListDatasets, {Key("datasets", "")}, {Key("dataset", "") + ":"}));
  if (reply->type != REDIS_REPLY_ARRAY) return Malformed(what, config_.display_url);
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* row = reply->element[i];
    if (row->type != REDIS_REPLY_ARRAY || row->elements != 4) {
      return Malformed(what, config_.display_url);
    }
    for (size_t k = 0; k < 4; ++k) {
      if (!IsString(row->element[k])) return Malformed(what, config_.display_url);
    }
    GRANARY_ASSIGN_OR_RETURN(DatasetRow dataset,
                             DatasetFromHash(StrOf(row->element[0]), StrOf(row->element[1]),
                                             StrOf(row->element[2]), StrOf(row->element[3])));
    GRANARY_RETURN_IF_ERROR(each(dataset));
  }
  return Status::Ok();
}

Result<RedisStore::DatasetSwap> RedisStore::SwapDataset(
    std::string_view what, std::string_view name, uint64_t expected_revision, uint64_t new_revision,
    const std::string& record, const Event& event) {
  GRANARY_ASSIGN_OR_RETURN(
      ReplyPtr reply, Eval(what, kUpdateDataset, {Key("dataset", name)},
                           {std::to_string(expected_revision), std::to_string(new_revision), record,
                            Channel(), store_internal::EncodeEvent(event)}));
  DatasetSwap swap;
  if (reply->type == REDIS_REPLY_INTEGER && reply->integer == -1) {
    swap.outcome = DatasetSwap::Outcome::kAbsent;
  } else if (reply->type == REDIS_REPLY_INTEGER && reply->integer == -2) {
    swap.outcome = DatasetSwap::Outcome::kRevisionDiffers;
  } else if (!IsString(reply.get()) || !ParseInt(StrOf(reply.get()), &swap.created_ms)) {
    return Malformed(what, config_.display_url);
  }
  return swap;
}

Result<bool> RedisStore::EraseDataset(std::string_view what, std::string_view name,
                                      const Event& event) {
  GRANARY_ASSIGN_OR_RETURN(
      ReplyPtr reply,
      Eval(what, kDeleteDataset,
           {Key("dataset", name), Key("datasets", ""), Key("progress", name), Key("plans", name)},
           {std::string(name), Channel(), store_internal::EncodeEvent(event)}));
  if (reply->type != REDIS_REPLY_INTEGER) return Malformed(what, config_.display_url);
  return reply->integer != 0;
}

Status RedisStore::WriteManifest(std::string_view what, std::string_view manifest_id,
                                 std::string_view bytes) {
  // NX: the id names the content, so an existing blob is already this one and
  // rewriting tens of MB would only cost time.
  GRANARY_ASSIGN_OR_RETURN(ReplyPtr reply, Command(what, {"SET", Key("manifest", manifest_id),
                                                          std::string(bytes), "NX"}));
  (void)reply;
  return Status::Ok();
}

Result<std::optional<std::string>> RedisStore::ReadManifest(std::string_view what,
                                                            std::string_view manifest_id) {
  GRANARY_ASSIGN_OR_RETURN(ReplyPtr reply, Command(what, {"GET", Key("manifest", manifest_id)}));
  if (reply->type == REDIS_REPLY_NIL) return std::optional<std::string>();
  if (!IsString(reply.get())) return Malformed(what, config_.display_url);
  return std::optional<std::string>(StrOf(reply.get()));
}

Status RedisStore::WriteNode(std::string_view what, const NodeRecord& node,
                             const std::string& identity, const std::string& record,
                             int64_t /*now_ms: Redis expires the key by its own clock*/,
                             milliseconds ttl, const Event& event) {
  GRANARY_ASSIGN_OR_RETURN(ReplyPtr reply,
                           Eval(what, kHeartbeat,
                                {Key("node", node.id), Key("nodes", ""), Key("nodes-expiry", ""),
                                 Key("nodes-version", "")},
                                {node.id, record, identity, std::to_string(ttl.count()), Channel(),
                                 store_internal::EncodeEvent(event), Key("node", "") + ":"}));
  (void)reply;
  return Status::Ok();
}

// Every pool: the caller filters (docs/metadata-store.md).
Status RedisStore::ReadNodes(std::string_view what, std::string_view /*pool*/,
                             const std::function<Status(const NodeRow&)>& each) {
  GRANARY_ASSIGN_OR_RETURN(
      ReplyPtr reply,
      Eval(what, kListNodes, {Key("nodes", ""), Key("nodes-expiry", ""), Key("nodes-version", "")},
           {Key("node", "") + ":"}));
  if (reply->type != REDIS_REPLY_ARRAY) return Malformed(what, config_.display_url);
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* row = reply->element[i];
    if (row->type != REDIS_REPLY_ARRAY || row->elements != 2 || !IsString(row->element[0]) ||
        !IsString(row->element[1])) {
      return Malformed(what, config_.display_url);
    }
    NodeRow node;
    node.id = StrOf(row->element[0]);
    node.record = StrOf(row->element[1]);
    GRANARY_RETURN_IF_ERROR(each(node));
  }
  return Status::Ok();
}

Result<bool> RedisStore::EraseNode(std::string_view what, std::string_view node_id,
                                   const Event& event) {
  GRANARY_ASSIGN_OR_RETURN(
      ReplyPtr reply, Eval(what, kRemoveNode,
                           {Key("node", node_id), Key("nodes", ""), Key("nodes-expiry", ""),
                            Key("nodes-version", "")},
                           {std::string(node_id), Channel(), store_internal::EncodeEvent(event)}));
  if (reply->type != REDIS_REPLY_INTEGER) return Malformed(what, config_.display_url);
  return reply->integer != 0;
}

Result<uint64_t> RedisStore::ReadNodesVersion(std::string_view what) {
  GRANARY_ASSIGN_OR_RETURN(
      ReplyPtr reply,
      Eval(what, kNodesVersion, {Key("nodes-version", ""), Key("nodes-expiry", "")}, {}));
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
      reply->element[0]->type != REDIS_REPLY_INTEGER ||
      reply->element[1]->type != REDIS_REPLY_INTEGER || reply->element[0]->integer < 0 ||
      reply->element[1]->integer < 0) {
    return Malformed(what, config_.display_url);
  }
  // Expired members not swept yet count in, so a reader sees an expiry at
  // once; the sweep's bump then moves it again (never back to a value read).
  const auto version = static_cast<uint64_t>(reply->element[0]->integer);
  const auto expired = static_cast<uint64_t>(reply->element[1]->integer);
  return ((connections_ & 0xfff) << 52) + ((version & 0xffffffff) << 20) +
         std::min<uint64_t>(expired, (1u << 20) - 1);
}

Result<bool> RedisStore::WriteChild(std::string_view what, RecordKind kind,
                                    std::string_view dataset, std::string_view key,
                                    const std::string& record, const Event& event) {
  GRANARY_ASSIGN_OR_RETURN(
      ReplyPtr reply,
      Eval(what, kPutChild, {Key("dataset", dataset), Key(ChildHash(kind), dataset)},
           {std::string(key), record, Channel(), store_internal::EncodeEvent(event)}));
  if (reply->type != REDIS_REPLY_INTEGER) return Malformed(what, config_.display_url);
  return reply->integer != 0;
}

Result<std::optional<std::map<std::string, std::string>>> RedisStore::ReadChildren(
    std::string_view what, RecordKind kind, std::string_view dataset) {
  GRANARY_ASSIGN_OR_RETURN(
      ReplyPtr reply,
      Eval(what, kListChildren, {Key("dataset", dataset), Key(ChildHash(kind), dataset)}, {}));
  using Children = std::map<std::string, std::string>;
  if (reply->type == REDIS_REPLY_NIL) return std::optional<Children>();
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements % 2 != 0) {
    return Malformed(what, config_.display_url);
  }
  Children out;
  for (size_t i = 0; i < reply->elements; i += 2) {
    if (!IsString(reply->element[i]) || !IsString(reply->element[i + 1])) {
      return Malformed(what, config_.display_url);
    }
    out.emplace(StrOf(reply->element[i]), StrOf(reply->element[i + 1]));
  }
  return std::optional<Children>(std::move(out));
}

Result<RedisStore::PlanErase> RedisStore::ErasePlan(std::string_view what, std::string_view dataset,
                                                    std::string_view plan_id, const Event& event) {
  GRANARY_ASSIGN_OR_RETURN(
      ReplyPtr reply, Eval(what, kDeletePlan, {Key("dataset", dataset), Key("plans", dataset)},
                           {std::string(plan_id), Channel(), store_internal::EncodeEvent(event)}));
  if (reply->type != REDIS_REPLY_INTEGER) return Malformed(what, config_.display_url);
  if (reply->integer == -1) return PlanErase::kNoDataset;
  if (reply->integer == 0) return PlanErase::kNoPlan;
  return PlanErase::kErased;
}

Result<std::unique_ptr<MetadataStore::Watcher>> RedisStore::Watch() {
  auto watcher = std::make_unique<RedisWatcher>(config_);
  Backoff backoff(config_.retry_budget);
  GRANARY_RETURN_IF_ERROR(watcher->Connect(backoff, "watch events"));
  return std::unique_ptr<Watcher>(std::move(watcher));
}

}  // namespace granary
