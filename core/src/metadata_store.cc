// OpenMetadataStore (URL parsing), validation and the JSON documents shared by
// the Redis and SQLite backends.

#include "granary/core/metadata_store.h"

#include <charconv>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "granary/core/manifest.h"
#include "metadata_store_internal.h"
#include "redis_store.h"
#include "sqlite_store.h"

namespace granary {

namespace {

using nlohmann::json;
using store_internal::Quote;

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool IsAlnum(char c) { return IsLowerAlnum(c) || (c >= 'A' && c <= 'Z'); }

Status ValidateDnsLabel(std::string_view value, std::string_view what) {
  bool ok = !value.empty() && value.size() <= 63 && IsLowerAlnum(value.front()) &&
            IsLowerAlnum(value.back());
  for (char c : value) ok = ok && (IsLowerAlnum(c) || c == '-');
  if (ok) return Status::Ok();
  return Status::InvalidArgument(std::string(what) + " " + Quote(value) +
                                 " is not a DNS-1123 label: use 1 to 63 lowercase letters, "
                                 "digits or '-', starting and ending with a letter or digit "
                                 "(e.g. 'imagenet-train')");
}

// [A-Za-z0-9._-], starting with an alphanumeric, 1..max_len.
Status ValidateToken(std::string_view value, size_t max_len, std::string_view what) {
  bool ok = !value.empty() && value.size() <= max_len && IsAlnum(value.front());
  for (char c : value) ok = ok && (IsAlnum(c) || c == '.' || c == '_' || c == '-');
  if (ok) return Status::Ok();
  return Status::InvalidArgument(std::string(what) + " " + Quote(value) + " is invalid: use 1 to " +
                                 std::to_string(max_len) +
                                 " letters, digits, '.', '_' or '-', starting with a letter or "
                                 "digit");
}

// Throws nlohmann's type_error on invalid UTF-8; callers catch at the boundary.
std::string Dump(const json& j) { return j.dump(); }

template <typename Fn>
Result<std::string> EncodeJson(std::string_view what, Fn&& build) {
  try {
    return Dump(build());
  } catch (const json::exception& e) {
    return Status::InvalidArgument("encode " + std::string(what) + ": " + e.what() +
                                   "; every text field must be valid UTF-8");
  }
}

template <typename T, typename Fn>
Result<T> DecodeJson(std::string_view text, std::string_view where, Fn&& fill) {
  try {
    json j = json::parse(text);
    return fill(j);
  } catch (const json::exception& e) {
    return Status::Corruption("decode " + std::string(where) + ": " + e.what() +
                              "; it was written by an incompatible Granary version or edited by "
                              "hand: rewrite or delete it");
  }
}

// ---- URL parsing ----

Status UrlError(std::string_view shown_url, std::string_view problem) {
  return Status::InvalidArgument(
      "open metadata store " + Quote(shown_url) + ": " + std::string(problem) +
      "; accepted forms: " + std::string(store_internal::kAcceptedUrlForms));
}

// The URL with anything between "://" and the last '@' of the authority replaced,
// so no error message or log line carries a password.
std::string RedactUrl(std::string_view url) {
  size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return std::string(url);
  size_t auth_begin = scheme_end + 3;
  size_t auth_end = url.find_first_of("/?#", auth_begin);
  if (auth_end == std::string_view::npos) auth_end = url.size();
  std::string_view authority = url.substr(auth_begin, auth_end - auth_begin);
  size_t at = authority.rfind('@');
  if (at == std::string_view::npos) return std::string(url);
  std::string_view userinfo = authority.substr(0, at);
  size_t colon = userinfo.find(':');
  std::string shown(url.substr(0, auth_begin));
  shown += colon == std::string_view::npos ? std::string("***")
                                           : std::string(userinfo.substr(0, colon)) + ":***";
  shown += url.substr(auth_begin + at);
  return shown;
}

bool ParseDecimal(std::string_view s, uint64_t max, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || v > max) return false;
  *out = v;
  return true;
}

Result<std::string> PercentDecode(std::string_view s, std::string_view shown_url) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    unsigned value = 0;
    if (i + 2 >= s.size()) {
      return UrlError(shown_url, "a '%' in the user info is not followed by two hex digits");
    }
    auto [ptr, ec] = std::from_chars(s.data() + i + 1, s.data() + i + 3, value, 16);
    if (ec != std::errc() || ptr != s.data() + i + 3) {
      return UrlError(shown_url, "a '%' in the user info is not followed by two hex digits");
    }
    out += static_cast<char>(value);
    i += 2;
  }
  return out;
}

struct Query {
  std::vector<std::pair<std::string, std::string>> params;
};

Result<Query> ParseQuery(std::string_view query, std::string_view shown_url,
                         const std::set<std::string_view>& accepted, std::string_view scheme) {
  Query q;
  std::set<std::string, std::less<>> seen;
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    std::string_view key = item.substr(0, eq);
    std::string_view value =
        eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1);
    if (!accepted.contains(key)) {
      std::string keys;
      for (std::string_view k : accepted) keys += (keys.empty() ? "" : ", ") + std::string(k);
      return UrlError(shown_url, "unknown query parameter " + Quote(key) + " for " +
                                     std::string(scheme) + " (known: " + keys + ")");
    }
    if (!seen.insert(std::string(key)).second) {
      return UrlError(shown_url, "query parameter " + Quote(key) + " is given twice");
    }
    q.params.emplace_back(key, value);
  }
  return q;
}

Result<std::chrono::milliseconds> ParseMillis(std::string_view key, std::string_view value,
                                              std::string_view shown_url) {
  constexpr uint64_t kMaxMillis = 3'600'000;
  uint64_t v = 0;
  if (!ParseDecimal(value, kMaxMillis, &v) || v == 0) {
    return UrlError(shown_url, std::string(key) + "=" + Quote(value) +
                                   " is not a whole number of milliseconds from 1 to 3600000");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(v));
}

Result<std::unique_ptr<MetadataStore>> OpenRedis(std::string_view url, std::string_view rest,
                                                 const MetadataStoreOptions& options,
                                                 Clock* clock) {
  const std::string shown = RedactUrl(url);
  RedisConfig config;
  config.display_url = shown;
  config.connect_timeout = options.connect_timeout;
  config.retry_budget = options.retry_budget;
  config.clock = clock;

  std::string_view query;
  if (size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (rest.find('#') != std::string_view::npos) {
    return UrlError(shown, "fragments ('#') are not allowed");
  }
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);

  if (size_t at = authority.rfind('@'); at != std::string_view::npos) {
    std::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    size_t colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
      return UrlError(shown,
                      "the user info has no ':'; write the password after a colon, "
                      "e.g. redis://:PASSWORD@host");
    }
    GRANARY_ASSIGN_OR_RETURN(config.user, PercentDecode(userinfo.substr(0, colon), shown));
    GRANARY_ASSIGN_OR_RETURN(config.password, PercentDecode(userinfo.substr(colon + 1), shown));
    if (config.password.empty()) return UrlError(shown, "the password after ':' is empty");
  }

  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return UrlError(shown, "an IPv6 host lacks its ']'");
    config.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return UrlError(shown, "unexpected text after the IPv6 host");
      port_text = after.substr(1);
      if (port_text.empty()) return UrlError(shown, "the port after ':' is empty");
    }
  } else {
    size_t colon = authority.find(':');
    config.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) return UrlError(shown, "the port after ':' is empty");
    }
    for (char c : config.host) {
      if (!IsAlnum(c) && c != '.' && c != '-' && c != '_') {
        return UrlError(shown, "the host " + Quote(config.host) +
                                   " has a character that is not "
                                   "allowed in a host name");
      }
    }
  }
  if (config.host.empty()) return UrlError(shown, "the host is missing");
  if (!port_text.empty()) {
    uint64_t port = 0;
    if (!ParseDecimal(port_text, 65535, &port) || port == 0) {
      return UrlError(shown, "the port " + Quote(port_text) + " is not a number from 1 to 65535");
    }
    config.port = static_cast<uint16_t>(port);
  }
  if (!path.empty() && path != "/") {
    uint64_t db = 0;
    if (!ParseDecimal(path.substr(1), 1'000'000, &db)) {
      return UrlError(
          shown, "the path " + Quote(path) + " is not a database number (e.g. /0, the default)");
    }
    config.db = static_cast<int>(db);
  }

  GRANARY_ASSIGN_OR_RETURN(Query q,
                           ParseQuery(query, shown, {"prefix", "timeout_ms", "retry_ms"}, "redis"));
  for (const auto& [key, value] : q.params) {
    if (key == "prefix") {
      bool ok = !value.empty() && value.size() <= 64;
      for (char c : value) ok = ok && (IsAlnum(c) || c == '.' || c == '_' || c == '-' || c == ':');
      if (!ok) {
        return UrlError(shown, "prefix=" + Quote(value) +
                                   " must be 1 to 64 letters, digits, '.', '_', '-' or ':'");
      }
      config.prefix = value;
    } else if (key == "timeout_ms") {
      GRANARY_ASSIGN_OR_RETURN(config.connect_timeout, ParseMillis(key, value, shown));
    } else if (key == "retry_ms") {
      GRANARY_ASSIGN_OR_RETURN(config.retry_budget, ParseMillis(key, value, shown));
    }
  }
  return RedisStore::Open(std::move(config));
}

Result<std::unique_ptr<MetadataStore>> OpenSqlite(std::string_view url, std::string_view rest,
                                                  const MetadataStoreOptions& options,
                                                  Clock* clock) {
  SqliteConfig config;
  config.retry_budget = options.retry_budget;
  config.poll_interval = options.poll_interval;
  config.event_rows = options.sqlite_event_rows;
  config.clock = clock;

  std::string_view query;
  if (size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  const std::string shown(url);
  if (rest.empty() || rest.front() != '/') {
    return UrlError(shown, rest.empty() ? "the file path is missing"
                                        : "a sqlite URL has no host and its path must be "
                                          "absolute (three slashes: sqlite:///var/lib/granary.db)");
  }
  if (rest.back() == '/') return UrlError(shown, "the path names a directory, not a file");
  if (rest.find('#') != std::string_view::npos || rest.find('\0') != std::string_view::npos) {
    return UrlError(shown, "the path contains '#' or a NUL byte");
  }
  config.path = std::string(rest);
  config.display_url = "sqlite://" + config.path;
  if (config.event_rows == 0) {
    return Status::InvalidArgument("open metadata store " + Quote(shown) +
                                   ": sqlite_event_rows is 0; keep at least 1 event (default "
                                   "10000)");
  }

  GRANARY_ASSIGN_OR_RETURN(Query q, ParseQuery(query, shown, {"retry_ms", "poll_ms"}, "sqlite"));
  for (const auto& [key, value] : q.params) {
    if (key == "retry_ms") {
      GRANARY_ASSIGN_OR_RETURN(config.retry_budget, ParseMillis(key, value, shown));
    } else if (key == "poll_ms") {
      GRANARY_ASSIGN_OR_RETURN(config.poll_interval, ParseMillis(key, value, shown));
    }
  }
  return SqliteStore::Open(std::move(config));
}

constexpr std::pair<DatasetPhase, std::string_view> kPhaseNames[] = {
    {DatasetPhase::kPending, "Pending"}, {DatasetPhase::kSnapshotting, "Snapshotting"},
    {DatasetPhase::kStaging, "Staging"}, {DatasetPhase::kReady, "Ready"},
    {DatasetPhase::kFailed, "Failed"},   {DatasetPhase::kDeleting, "Deleting"},
};

constexpr std::pair<EventKind, std::string_view> kEventKindNames[] = {
    {EventKind::kDataset, "dataset"},   {EventKind::kNode, "node"},
    {EventKind::kProgress, "progress"}, {EventKind::kPlan, "plan"},
    {EventKind::kResync, "resync"},
};

}  // namespace

// ---- public helpers ----

std::string_view DatasetPhaseName(DatasetPhase phase) {
  for (const auto& [p, name] : kPhaseNames) {
    if (p == phase) return name;
  }
  return "Unknown";
}

Result<DatasetPhase> ParseDatasetPhase(std::string_view name) {
  for (const auto& [p, n] : kPhaseNames) {
    if (n == name) return p;
  }
  return Status::InvalidArgument("unknown dataset phase " + Quote(name) +
                                 "; use Pending, Snapshotting, Staging, Ready, Failed or Deleting");
}

std::string_view EventKindName(EventKind kind) {
  for (const auto& [k, name] : kEventKindNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

Status ValidateDatasetName(std::string_view name) { return ValidateDnsLabel(name, "dataset name"); }

Status ValidateNodeId(std::string_view id) { return ValidateToken(id, 253, "node id"); }

Result<std::unique_ptr<MetadataStore>> OpenMetadataStore(std::string_view url,
                                                         const MetadataStoreOptions& options) {
  Clock* clock = options.clock != nullptr ? options.clock : SystemClock::Default();
  if (options.connect_timeout.count() <= 0 || options.retry_budget.count() < 0 ||
      options.poll_interval.count() <= 0) {
    return Status::InvalidArgument(
        "open metadata store " + Quote(RedactUrl(url)) +
        ": connect_timeout and poll_interval must be positive and retry_budget not negative");
  }
  if (url.starts_with("redis://")) return OpenRedis(url, url.substr(8), options, clock);
  if (url.starts_with("sqlite://")) return OpenSqlite(url, url.substr(9), options, clock);
  size_t colon = url.find(':');
  return UrlError(RedactUrl(url), colon == std::string_view::npos || colon == 0
                                      ? std::string("there is no scheme")
                                      : "unknown scheme " + Quote(url.substr(0, colon)));
}

// ---- shared by the backends ----

namespace store_internal {

std::string Quote(std::string_view s) {
  constexpr size_t kMaxShown = 80;
  std::string out = "'";
  size_t shown = std::min(s.size(), kMaxShown);
  for (size_t i = 0; i < shown; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  if (s.size() > kMaxShown) out += "...(" + std::to_string(s.size()) + " bytes)";
  out += "'";
  return out;
}

std::string FormatDuration(std::chrono::milliseconds d) {
  if (d.count() < 1000) return std::to_string(d.count()) + " ms";
  auto tenths = d.count() / 100;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " s";
}

Status ValidatePoolName(std::string_view pool) { return ValidateDnsLabel(pool, "pool name"); }

Status ValidateManifestId(std::string_view id) {
  bool ok = !id.empty() && id.size() <= 128;
  for (char c : id) ok = ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
  if (ok) return Status::Ok();
  return Status::InvalidArgument("manifest id " + Quote(id) +
                                 " is invalid: use the manifest's content id, 1 to 128 lowercase "
                                 "hex digits");
}

Status ValidatePlanId(std::string_view id) { return ValidateToken(id, 128, "plan id"); }

Status ValidateDataset(const DatasetRecord& record) {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(record.name));
  const std::string what = "dataset " + Quote(record.name) + ": ";
  const DatasetSpec& spec = record.spec;
  if (spec.source_uri.empty()) {
    return Status::InvalidArgument(what +
                                   "spec.source_uri is empty; name the data, e.g. "
                                   "file:///lustre/imagenet/train");
  }
  if (spec.chunk_size < kMinChunkSize || spec.chunk_size > kMaxChunkSize) {
    return Status::InvalidArgument(what + "spec.chunk_size " + std::to_string(spec.chunk_size) +
                                   " is outside " + std::to_string(kMinChunkSize) + ".." +
                                   std::to_string(kMaxChunkSize) + " bytes (default " +
                                   std::to_string(kDefaultChunkSize) + ")");
  }
  GRANARY_RETURN_IF_ERROR(ValidatePoolName(spec.pool).WithContext(what + "spec.pool"));
  if (spec.replication < 1 || spec.replication > 16) {
    return Status::InvalidArgument(what + "spec.replication " + std::to_string(spec.replication) +
                                   " is outside 1..16");
  }
  for (const auto* globs : {&spec.include, &spec.exclude}) {
    for (const std::string& g : *globs) {
      if (g.empty()) return Status::InvalidArgument(what + "an include/exclude glob is empty");
    }
  }
  if (DatasetPhaseName(record.state.phase) == "Unknown") {
    return Status::InvalidArgument(what + "state.phase " +
                                   std::to_string(static_cast<int>(record.state.phase)) +
                                   " is not a DatasetPhase");
  }
  if (!record.manifest_id.empty()) {
    GRANARY_RETURN_IF_ERROR(ValidateManifestId(record.manifest_id).WithContext(what));
  }
  return Status::Ok();
}

Status ValidateNode(const NodeRecord& node, std::chrono::milliseconds ttl) {
  GRANARY_RETURN_IF_ERROR(ValidateNodeId(node.id));
  const std::string what = "node " + Quote(node.id);
  GRANARY_RETURN_IF_ERROR(ValidatePoolName(node.pool).WithContext(what + ": pool"));
  size_t colon = node.address.rfind(':');
  uint64_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !ParseDecimal(std::string_view(node.address).substr(colon + 1), 65535, &port) || port == 0) {
    return Status::InvalidArgument(what + ": address " + Quote(node.address) +
                                   " is not host:port (e.g. 10.0.0.7:7070)");
  }
  for (const auto& [key, value] : node.labels) {
    if (key.empty()) return Status::InvalidArgument(what + ": a label has an empty key");
  }
  if (ttl < kMinNodeTtl || ttl > kMaxNodeTtl) {
    return Status::InvalidArgument(what + ": heartbeat ttl " + std::to_string(ttl.count()) +
                                   " ms is outside " + std::to_string(kMinNodeTtl.count()) + ".." +
                                   std::to_string(kMaxNodeTtl.count()) + " ms");
  }
  return Status::Ok();
}

Status ValidatePlan(const PlanRecord& plan) {
  GRANARY_RETURN_IF_ERROR(ValidatePlanId(plan.plan_id));
  const std::string what = "plan " + Quote(plan.plan_id) + ": ";
  if (plan.mode != "global" && plan.mode != "chunkwise" && plan.mode != "sequential") {
    return Status::InvalidArgument(what + "mode " + Quote(plan.mode) +
                                   " is not one of global, chunkwise, sequential");
  }
  if (plan.world_size == 0 || plan.batch_size == 0 || plan.window_chunks == 0) {
    return Status::InvalidArgument(what + "world_size, batch_size and window_chunks must be >= 1");
  }
  return Status::Ok();
}

// ---- JSON documents (docs/metadata-store.md, "Records") ----

Result<std::string> EncodeDataset(const DatasetRecord& r) {
  return EncodeJson("dataset " + Quote(r.name), [&] {
    return json{
        {"name", r.name},
        {"spec",
         {{"source_uri", r.spec.source_uri},
          {"include", r.spec.include},
          {"exclude", r.spec.exclude},
          {"chunk_size", r.spec.chunk_size},
          {"pool", r.spec.pool},
          {"replication", r.spec.replication}}},
        {"owner", {{"uid", r.owner.uid}, {"gid", r.owner.gid}}},
        {"state", {{"phase", DatasetPhaseName(r.state.phase)}, {"message", r.state.message}}},
        {"manifest_id", r.manifest_id},
        {"updated_ms", r.updated_ms},
    };
  });
}

Result<DatasetRecord> DecodeDataset(std::string_view text, uint64_t revision, int64_t created_ms,
                                    std::string_view where) {
  return DecodeJson<DatasetRecord>(text, where, [&](const json& j) -> Result<DatasetRecord> {
    DatasetRecord r;
    r.name = j.at("name").get<std::string>();
    const json& spec = j.at("spec");
    r.spec.source_uri = spec.at("source_uri").get<std::string>();
    r.spec.include = spec.at("include").get<std::vector<std::string>>();
    r.spec.exclude = spec.at("exclude").get<std::vector<std::string>>();
    r.spec.chunk_size = spec.at("chunk_size").get<uint64_t>();
    r.spec.pool = spec.at("pool").get<std::string>();
    r.spec.replication = spec.at("replication").get<uint32_t>();
    r.owner.uid = j.at("owner").at("uid").get<uint32_t>();
    r.owner.gid = j.at("owner").at("gid").get<uint32_t>();
    auto phase = ParseDatasetPhase(j.at("state").at("phase").get<std::string>());
    if (!phase.ok()) {
      return Status::Corruption("decode " + std::string(where) + ": " + phase.status().message());
    }
    r.state.phase = *phase;
    r.state.message = j.at("state").at("message").get<std::string>();
    r.manifest_id = j.at("manifest_id").get<std::string>();
    r.updated_ms = j.at("updated_ms").get<int64_t>();
    r.created_ms = created_ms;
    r.revision = revision;
    return r;
  });
}

Result<std::string> EncodeNode(const NodeRecord& n) {
  return EncodeJson("node " + Quote(n.id), [&] {
    return json{
        {"id", n.id},
        {"pool", n.pool},
        {"address", n.address},
        {"capacity_bytes", n.capacity_bytes},
        {"used_bytes", n.used_bytes},
        {"labels", n.labels},
        {"started_ms", n.started_ms},
        {"heartbeat_ms", n.heartbeat_ms},
    };
  });
}

Result<NodeRecord> DecodeNode(std::string_view text, std::string_view where) {
  return DecodeJson<NodeRecord>(text, where, [&](const json& j) -> Result<NodeRecord> {
    NodeRecord n;
    n.id = j.at("id").get<std::string>();
    n.pool = j.at("pool").get<std::string>();
    n.address = j.at("address").get<std::string>();
    n.capacity_bytes = j.at("capacity_bytes").get<uint64_t>();
    n.used_bytes = j.at("used_bytes").get<uint64_t>();
    n.labels = j.at("labels").get<std::map<std::string, std::string>>();
    n.started_ms = j.at("started_ms").get<int64_t>();
    n.heartbeat_ms = j.at("heartbeat_ms").get<int64_t>();
    return n;
  });
}

std::string NodeIdentity(const NodeRecord& n) {
  return n.pool + "|" + n.address + "|" + std::to_string(n.capacity_bytes) + "|" +
         std::to_string(n.started_ms);
}

Result<std::string> EncodeProgress(const StagingProgress& p) {
  return EncodeJson("staging progress", [&] {
    return json{
        {"chunks_total", p.chunks_total},     {"chunks_staged", p.chunks_staged},
        {"bytes_total", p.bytes_total},       {"bytes_staged", p.bytes_staged},
        {"samples_failed", p.samples_failed}, {"updated_ms", p.updated_ms},
    };
  });
}

Result<StagingProgress> DecodeProgress(std::string_view text, std::string_view where) {
  return DecodeJson<StagingProgress>(text, where, [&](const json& j) -> Result<StagingProgress> {
    StagingProgress p;
    p.chunks_total = j.at("chunks_total").get<uint64_t>();
    p.chunks_staged = j.at("chunks_staged").get<uint64_t>();
    p.bytes_total = j.at("bytes_total").get<uint64_t>();
    p.bytes_staged = j.at("bytes_staged").get<uint64_t>();
    p.samples_failed = j.at("samples_failed").get<uint64_t>();
    p.updated_ms = j.at("updated_ms").get<int64_t>();
    return p;
  });
}

Result<std::string> EncodePlan(const PlanRecord& p) {
  return EncodeJson("plan " + Quote(p.plan_id), [&] {
    return json{
        {"plan_id", p.plan_id},
        {"seed", p.seed},
        {"first_epoch", p.first_epoch},
        {"world_size", p.world_size},
        {"batch_size", p.batch_size},
        {"drop_last", p.drop_last},
        {"mode", p.mode},
        {"window_chunks", p.window_chunks},
        {"registered_ms", p.registered_ms},
    };
  });
}

Result<PlanRecord> DecodePlan(std::string_view text, std::string_view where) {
  return DecodeJson<PlanRecord>(text, where, [&](const json& j) -> Result<PlanRecord> {
    PlanRecord p;
    p.plan_id = j.at("plan_id").get<std::string>();
    p.seed = j.at("seed").get<uint64_t>();
    p.first_epoch = j.at("first_epoch").get<uint32_t>();
    p.world_size = j.at("world_size").get<uint32_t>();
    p.batch_size = j.at("batch_size").get<uint32_t>();
    p.drop_last = j.at("drop_last").get<bool>();
    p.mode = j.at("mode").get<std::string>();
    p.window_chunks = j.at("window_chunks").get<uint32_t>();
    p.registered_ms = j.at("registered_ms").get<int64_t>();
    return p;
  });
}

std::string EncodeEvent(const Event& event) {
  // Names are validated ASCII, so this cannot throw.
  return Dump(json{{"kind", EventKindName(event.kind)}, {"name", event.name}});
}

Result<Event> DecodeEvent(std::string_view text) {
  return DecodeJson<Event>(text, "event " + Quote(text), [&](const json& j) -> Result<Event> {
    std::string kind = j.at("kind").get<std::string>();
    for (const auto& [k, name] : kEventKindNames) {
      if (name == kind) return Event{k, j.at("name").get<std::string>()};
    }
    return Status::Corruption("decode event " + Quote(text) + ": unknown kind " + Quote(kind));
  });
}

}  // namespace store_internal
}  // namespace granary
