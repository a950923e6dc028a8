// OpenMetadataStore (URL parsing), validation and the JSON documents shared by
// the Redis and SQLite backends.

#include "granary/core/metadata_store.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <utility>

#include "granary/core/glob.h"
#include "granary/core/manifest.h"
#include "granary/core/names.h"
#include "granary/core/plan.h"
#include "metadata_store_internal.h"
#include "redis_store.h"
#include "sqlite_store.h"

namespace granary {

namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::steady_clock;
using store_internal::CorruptRecord;

bool IsAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

Status ValidateDnsLabel(std::string_view value, std::string_view what) {
  if (IsDnsLabel(value)) return Status::Ok();
  return Status::InvalidArgument(std::string(what) + " " + Quoted(value) +
                                 " is not a DNS-1123 label: use 1 to 63 lowercase letters, "
                                 "digits or '-', starting and ending with a letter or digit "
                                 "(e.g. 'imagenet-train')");
}

// [A-Za-z0-9._-], starting with an alphanumeric, 1..max_len.
Status ValidateToken(std::string_view value, size_t max_len, std::string_view what) {
  bool ok = !value.empty() && value.size() <= max_len && IsAlnum(value.front());
  for (char c : value) ok = ok && (IsAlnum(c) || c == '.' || c == '_' || c == '-');
  if (ok) return Status::Ok();
  return Status::InvalidArgument(std::string(what) + " " + Quoted(value) +
                                 " is invalid: use 1 to " + std::to_string(max_len) +
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

// Parses `text` and runs `fill` on it; a parse error, a missing field
// (nlohmann throws) or an error `fill` returns becomes kCorruption at `where`.
template <typename T, typename Fn>
Result<T> DecodeJson(std::string_view text, std::string_view where, Fn&& fill) {
  try {
    json j = json::parse(text);
    if (!j.is_object()) return CorruptRecord(where, "the document is not a JSON object");
    Result<T> r = fill(j);
    if (!r.ok()) return CorruptRecord(where, r.status().message());
    return r;
  } catch (const json::exception& e) {
    return CorruptRecord(where, e.what());
  }
}

// Typed field readers for decoding. nlohmann's get<T>() converts silently
// (4294967296 becomes a uint32_t 0, -1 a uint64_t 2^64-1, 2.5 an integer 2),
// so each reader checks the JSON type and the range first. `path` names the
// field in messages. A missing key throws, which DecodeJson reports.

template <typename T>
Result<T> IntField(const json& obj, const char* key, std::string_view path) {
  const json& v = obj.at(key);
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (std::in_range<T>(u)) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const auto i = v.get<int64_t>();
    if (std::in_range<T>(i)) return static_cast<T>(i);
  }
  return Status::InvalidArgument(std::string(path) + " is " + Quoted(v.dump()) +
                                 ", not an integer from " +
                                 std::to_string(std::numeric_limits<T>::min()) + " to " +
                                 std::to_string(std::numeric_limits<T>::max()));
}

Result<std::string> StringField(const json& obj, const char* key, std::string_view path) {
  const json& v = obj.at(key);
  if (!v.is_string()) {
    return Status::InvalidArgument(std::string(path) + " is " + Quoted(v.dump()) +
                                   ", not a string");
  }
  return v.get<std::string>();
}

Result<bool> BoolField(const json& obj, const char* key, std::string_view path) {
  const json& v = obj.at(key);
  if (!v.is_boolean()) {
    return Status::InvalidArgument(std::string(path) + " is " + Quoted(v.dump()) +
                                   ", not true or false");
  }
  return v.get<bool>();
}

Result<const json*> ObjectField(const json& obj, const char* key, std::string_view path) {
  const json& v = obj.at(key);
  if (!v.is_object()) return Status::InvalidArgument(std::string(path) + " is not an object");
  return &v;
}

Result<std::vector<std::string>> StringListField(const json& obj, const char* key,
                                                 std::string_view path) {
  const json& v = obj.at(key);
  bool ok = v.is_array();
  for (size_t i = 0; ok && i < v.size(); ++i) ok = v[i].is_string();
  if (!ok) return Status::InvalidArgument(std::string(path) + " is not a list of strings");
  return v.get<std::vector<std::string>>();
}

Result<std::map<std::string, std::string>> StringMapField(const json& obj, const char* key,
                                                          std::string_view path) {
  const json& v = obj.at(key);
  bool ok = v.is_object();
  for (auto it = v.begin(); ok && it != v.end(); ++it) ok = it->is_string();
  if (!ok) {
    return Status::InvalidArgument(std::string(path) + " is not an object of string values");
  }
  return v.get<std::map<std::string, std::string>>();
}

Status KeyMismatch(std::string_view field, std::string_view value, std::string_view key) {
  return Status::InvalidArgument(std::string(field) + " is " + Quoted(value) +
                                 " but the record is stored under " + Quoted(key));
}

// ---- URL parsing ----

Status UrlError(std::string_view shown_url, std::string_view problem) {
  return Status::InvalidArgument(
      "open metadata store " + Quoted(shown_url) + ": " + std::string(problem) +
      "; accepted forms: " + std::string(store_internal::kAcceptedUrlForms));
}

// The URL with its user info replaced, so no error message or log line carries
// a password. The user info is everything between "://" (or the start, for a
// URL without a scheme) and the LAST '@' of the whole URL: exactly what
// OpenRedis takes as user info, since a password may hold '/', '?', '#' and '@'
// unencoded. A user name before a ':' is kept; everything after it becomes
// "***".
std::string RedactUrl(std::string_view url) {
  const size_t at = url.rfind('@');
  if (at == std::string_view::npos) return std::string(url);
  const size_t scheme_end = url.find("://");
  const size_t begin =
      scheme_end != std::string_view::npos && scheme_end < at ? scheme_end + 3 : size_t{0};
  const std::string_view userinfo = url.substr(begin, at - begin);
  const size_t colon = userinfo.find(':');
  std::string shown(url.substr(0, begin));
  if (colon != std::string_view::npos) {
    shown += userinfo.substr(0, colon);
    shown += ':';
  }
  shown += "***";
  shown += url.substr(at);
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
      return UrlError(shown_url, "unknown query parameter " + Quoted(key) + " for " +
                                     std::string(scheme) + " (known: " + keys + ")");
    }
    if (!seen.insert(std::string(key)).second) {
      return UrlError(shown_url, "query parameter " + Quoted(key) + " is given twice");
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
    return UrlError(shown_url, std::string(key) + "=" + Quoted(value) +
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

  // The user info runs to the last '@' (see RedactUrl): no valid host, port,
  // database or query parameter holds an '@', a password may.
  std::string_view userinfo;
  const size_t at = rest.rfind('@');
  if (at != std::string_view::npos) {
    userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
  }
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

  if (at != std::string_view::npos) {
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
        return UrlError(shown, "the host " + Quoted(config.host) +
                                   " has a character that is not "
                                   "allowed in a host name");
      }
    }
  }
  if (config.host.empty()) return UrlError(shown, "the host is missing");
  if (!port_text.empty()) {
    uint64_t port = 0;
    if (!ParseDecimal(port_text, 65535, &port) || port == 0) {
      return UrlError(shown, "the port " + Quoted(port_text) + " is not a number from 1 to 65535");
    }
    config.port = static_cast<uint16_t>(port);
  }
  if (!path.empty() && path != "/") {
    uint64_t db = 0;
    if (!ParseDecimal(path.substr(1), 1'000'000, &db)) {
      return UrlError(
          shown, "the path " + Quoted(path) + " is not a database number (e.g. /0, the default)");
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
        return UrlError(shown, "prefix=" + Quoted(value) +
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
    return Status::InvalidArgument("open metadata store " + Quoted(shown) +
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

constexpr std::pair<SnapshotBy, std::string_view> kSnapshotByNames[] = {
    {SnapshotBy::kClient, "client"},
    {SnapshotBy::kPool, "pool"},
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
  return Status::InvalidArgument("unknown dataset phase " + Quoted(name) +
                                 "; use Pending, Snapshotting, Staging, Ready, Failed or Deleting");
}

std::string_view SnapshotByName(SnapshotBy by) {
  for (const auto& [b, name] : kSnapshotByNames) {
    if (b == by) return name;
  }
  return "unknown";
}

Result<SnapshotBy> ParseSnapshotBy(std::string_view name) {
  for (const auto& [b, n] : kSnapshotByNames) {
    if (n == name) return b;
  }
  return Status::InvalidArgument("unknown snapshot_by " + Quoted(name) +
                                 "; use client (whoever creates the dataset walks the source) or "
                                 "pool (a cache node of its pool does)");
}

std::string_view EventKindName(EventKind kind) {
  for (const auto& [k, name] : kEventKindNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

Status ValidateDatasetName(std::string_view name) { return ValidateDnsLabel(name, "dataset name"); }

Status ValidateNodeId(std::string_view id) { return ValidateToken(id, 253, "node id"); }

double ProgressSummary::fraction() const {
  if (total.bytes_total > 0) {
    return static_cast<double>(total.bytes_staged) / static_cast<double>(total.bytes_total);
  }
  if (total.chunks_total > 0) {
    return static_cast<double>(total.chunks_staged) / static_cast<double>(total.chunks_total);
  }
  return 0.0;
}

ProgressSummary SummarizeProgress(const std::map<std::string, StagingProgress>& progress,
                                  const std::vector<NodeRecord>& live_nodes) {
  ProgressSummary s;
  for (const NodeRecord& node : live_nodes) {
    auto it = progress.find(node.id);
    if (it == progress.end()) {
      s.all_staged = false;
      continue;
    }
    const StagingProgress& p = it->second;
    s.total.chunks_total += p.chunks_total;
    s.total.chunks_staged += p.chunks_staged;
    s.total.bytes_total += p.bytes_total;
    s.total.bytes_staged += p.bytes_staged;
    s.total.samples_failed += p.samples_failed;
    s.all_staged = s.all_staged && p.chunks_staged == p.chunks_total;
    ++s.nodes_reporting;
  }
  return s;
}

Result<PlanSpec> ToPlanSpec(const PlanRecord& plan, uint64_t epoch, uint32_t rank) {
  const std::string what = "plan " + Quoted(plan.plan_id);
  Result<PlanMode> mode = ParsePlanMode(plan.mode);
  if (!mode.ok()) return mode.status().WithContext(what);
  PlanSpec spec;
  spec.seed = plan.seed;
  spec.epoch = epoch;
  spec.world_size = plan.world_size;
  spec.rank = rank;
  spec.batch_size = plan.batch_size;
  spec.drop_last = plan.drop_last;
  spec.mode = *mode;
  spec.window = plan.window_chunks;
  GRANARY_RETURN_IF_ERROR(ValidatePlanSpec(spec).WithContext(what));
  return spec;
}

Result<std::unique_ptr<MetadataStore>> OpenMetadataStore(std::string_view url,
                                                         const MetadataStoreOptions& options) {
  Clock* clock = options.clock != nullptr ? options.clock : SystemClock::Default();
  const std::string shown = RedactUrl(url);
  if (options.connect_timeout.count() <= 0 || options.retry_budget.count() < 0 ||
      options.poll_interval.count() <= 0) {
    return Status::InvalidArgument(
        "open metadata store " + Quoted(shown) +
        ": connect_timeout and poll_interval must be positive and retry_budget not negative");
  }
  if (url.starts_with("redis://")) return OpenRedis(url, url.substr(8), options, clock);
  if (url.starts_with("sqlite://")) return OpenSqlite(url, url.substr(9), options, clock);
  // The scheme is read from the redacted URL: without "://", what precedes a
  // ':' may be a user name followed by a password.
  size_t colon = shown.find(':');
  return UrlError(shown,
                  colon == std::string::npos || colon == 0
                      ? std::string("there is no scheme")
                      : "unknown scheme " + Quoted(std::string_view(shown).substr(0, colon)));
}

// ---- shared by the backends ----

namespace {
// Whether `listed` (DatasetSpec::nodes: unset is every node) has `node_id`.
bool NodeListed(const std::optional<std::vector<std::string>>& listed, std::string_view node_id) {
  return !listed.has_value() || std::find(listed->begin(), listed->end(), node_id) != listed->end();
}
}  // namespace

std::vector<NodeRecord> DatasetNodes(const DatasetSpec& spec,
                                     const std::vector<NodeRecord>& pool_nodes) {
  return ListedNodes(spec.nodes, pool_nodes);
}

std::vector<NodeRecord> ListedNodes(const std::optional<std::vector<std::string>>& listed,
                                    const std::vector<NodeRecord>& pool_nodes) {
  if (!listed.has_value()) return pool_nodes;
  std::vector<NodeRecord> kept;
  for (const NodeRecord& n : pool_nodes) {
    if (NodeListed(listed, n.id)) kept.push_back(n);
  }
  return kept;
}

bool DatasetUsesNode(const DatasetSpec& spec, std::string_view node_id) {
  return NodeListed(spec.nodes, node_id);
}

namespace store_internal {

Status CorruptRecord(std::string_view where, std::string_view problem) {
  return Status::Corruption("decode " + std::string(where) + ": " + std::string(problem) +
                            "; it was written by an incompatible Granary version or edited by "
                            "hand: rewrite or delete it");
}

Backoff::Backoff(milliseconds budget, milliseconds first, milliseconds max)
    : start_(steady_clock::now()), deadline_(start_ + budget), delay_(first), max_(max) {}

Backoff::Backoff(steady_clock::time_point deadline)
    : start_(steady_clock::now()), deadline_(deadline), delay_(kDefaultFirst), max_(kDefaultMax) {}

bool Backoff::Wait() {
  const auto now = steady_clock::now();
  if (now >= deadline_) return false;
  std::this_thread::sleep_for(std::min<steady_clock::duration>(delay_, deadline_ - now));
  delay_ = std::min(delay_ * 2, max_);
  ++retries_;
  return true;
}

milliseconds Backoff::remaining() const {
  return std::max(milliseconds(0),
                  std::chrono::duration_cast<milliseconds>(deadline_ - steady_clock::now()));
}

std::string Backoff::Summary() const {
  return std::to_string(retries_ + 1) + " attempts in " +
         FormatDuration(std::chrono::duration_cast<milliseconds>(steady_clock::now() - start_));
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
  return Status::InvalidArgument("manifest id " + Quoted(id) +
                                 " is invalid: use the manifest's content id, 1 to 128 lowercase "
                                 "hex digits");
}

Status ValidatePlanId(std::string_view id) { return ValidateToken(id, 128, "plan id"); }

Status ValidateDataset(const DatasetRecord& record) {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(record.name));
  const std::string what = "dataset " + Quoted(record.name) + ": ";
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
  if (spec.nodes.has_value()) {
    if (spec.nodes->size() > kMaxDatasetNodes) {
      return Status::InvalidArgument(what + "spec.nodes lists " +
                                     std::to_string(spec.nodes->size()) + " nodes, more than " +
                                     std::to_string(kMaxDatasetNodes));
    }
    std::vector<std::string> sorted = *spec.nodes;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      GRANARY_RETURN_IF_ERROR(ValidateNodeId(sorted[i]).WithContext(what + "spec.nodes"));
      if (i > 0 && sorted[i] == sorted[i - 1]) {
        return Status::InvalidArgument(what + "spec.nodes names node " + Quoted(sorted[i]) +
                                       " twice");
      }
    }
  }
  // Compiled here so a bad glob is refused when the dataset is created, not
  // when a cache node first snapshots it.
  for (const auto& [globs, field] :
       {std::pair{&spec.include, "spec.include"}, std::pair{&spec.exclude, "spec.exclude"}}) {
    Result<GlobSet> compiled = GlobSet::Compile(*globs);
    if (!compiled.ok()) {
      return Status::InvalidArgument(what + field + ": " + compiled.status().message());
    }
  }
  if (DatasetPhaseName(record.state.phase) == "Unknown") {
    return Status::InvalidArgument(what + "state.phase " +
                                   std::to_string(static_cast<int>(record.state.phase)) +
                                   " is not a DatasetPhase");
  }
  if (SnapshotByName(spec.snapshot_by) == "unknown") {
    return Status::InvalidArgument(what + "spec.snapshot_by " +
                                   std::to_string(static_cast<int>(spec.snapshot_by)) +
                                   " is not a SnapshotBy");
  }
  if (!record.state.claimed_by.empty()) {
    GRANARY_RETURN_IF_ERROR(
        ValidateNodeId(record.state.claimed_by).WithContext(what + "state.claimed_by"));
  }
  if (!spec.kubernetes_namespace.empty() && !IsDnsLabel(spec.kubernetes_namespace)) {
    return Status::InvalidArgument(what + "spec.namespace " + Quoted(spec.kubernetes_namespace) +
                                   " is not a Kubernetes namespace name (a DNS-1123 label)");
  }
  if (!record.manifest_id.empty()) {
    GRANARY_RETURN_IF_ERROR(ValidateManifestId(record.manifest_id).WithContext(what));
  }
  return Status::Ok();
}

Status ValidateNode(const NodeRecord& node) {
  GRANARY_RETURN_IF_ERROR(ValidateNodeId(node.id));
  const std::string what = "node " + Quoted(node.id);
  GRANARY_RETURN_IF_ERROR(ValidatePoolName(node.pool).WithContext(what + ": pool"));
  size_t colon = node.address.rfind(':');
  uint64_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !ParseDecimal(std::string_view(node.address).substr(colon + 1), 65535, &port) || port == 0) {
    return Status::InvalidArgument(what + ": address " + Quoted(node.address) +
                                   " is not host:port (e.g. 10.0.0.7:7070)");
  }
  for (const auto& [key, value] : node.labels) {
    if (key.empty()) return Status::InvalidArgument(what + ": a label has an empty key");
  }
  return Status::Ok();
}

Status ValidateNodeTtl(std::string_view node_id, milliseconds ttl) {
  if (ttl < kMinNodeTtl || ttl > kMaxNodeTtl) {
    return Status::InvalidArgument("node " + Quoted(node_id) + ": heartbeat ttl " +
                                   std::to_string(ttl.count()) + " ms is outside " +
                                   std::to_string(kMinNodeTtl.count()) + ".." +
                                   std::to_string(kMaxNodeTtl.count()) + " ms");
  }
  return Status::Ok();
}

Status ValidatePlan(const PlanRecord& plan) {
  GRANARY_RETURN_IF_ERROR(ValidatePlanId(plan.plan_id));
  // One definition of a valid plan: the one the planner applies. A plan that
  // converts for its first epoch and rank 0 converts for every rank below
  // world_size and every epoch a uint32_t holds.
  return ToPlanSpec(plan, plan.first_epoch, 0).status();
}

// ---- JSON documents (docs/metadata-store.md, "Records") ----

Result<std::string> EncodeDataset(const DatasetRecord& r) {
  return EncodeJson("dataset " + Quoted(r.name), [&] {
    json doc{
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
    // Written only when set, so records of datasets on the whole pool are as
    // before (and readable by builds that do not know the field).
    if (r.spec.nodes.has_value()) doc["spec"]["nodes"] = *r.spec.nodes;
    // Likewise: absent means "client", the only way before the field existed.
    if (r.spec.snapshot_by != SnapshotBy::kClient) {
      doc["spec"]["snapshot_by"] = SnapshotByName(r.spec.snapshot_by);
    }
    if (!r.spec.kubernetes_namespace.empty()) {
      doc["spec"]["namespace"] = r.spec.kubernetes_namespace;
    }
    if (!r.state.claimed_by.empty()) doc["state"]["claimed_by"] = r.state.claimed_by;
    return doc;
  });
}

Result<DatasetRecord> DecodeDataset(std::string_view text, std::string_view key_name,
                                    uint64_t revision, int64_t created_ms, std::string_view where) {
  return DecodeJson<DatasetRecord>(text, where, [&](const json& j) -> Result<DatasetRecord> {
    DatasetRecord r;
    GRANARY_ASSIGN_OR_RETURN(r.name, StringField(j, "name", "name"));
    GRANARY_ASSIGN_OR_RETURN(const json* spec, ObjectField(j, "spec", "spec"));
    GRANARY_ASSIGN_OR_RETURN(r.spec.source_uri,
                             StringField(*spec, "source_uri", "spec.source_uri"));
    GRANARY_ASSIGN_OR_RETURN(r.spec.include, StringListField(*spec, "include", "spec.include"));
    GRANARY_ASSIGN_OR_RETURN(r.spec.exclude, StringListField(*spec, "exclude", "spec.exclude"));
    GRANARY_ASSIGN_OR_RETURN(r.spec.chunk_size,
                             IntField<uint64_t>(*spec, "chunk_size", "spec.chunk_size"));
    GRANARY_ASSIGN_OR_RETURN(r.spec.pool, StringField(*spec, "pool", "spec.pool"));
    GRANARY_ASSIGN_OR_RETURN(r.spec.replication,
                             IntField<uint32_t>(*spec, "replication", "spec.replication"));
    if (spec->contains("nodes")) {
      GRANARY_ASSIGN_OR_RETURN(r.spec.nodes, StringListField(*spec, "nodes", "spec.nodes"));
    }
    if (spec->contains("snapshot_by")) {
      GRANARY_ASSIGN_OR_RETURN(std::string by,
                               StringField(*spec, "snapshot_by", "spec.snapshot_by"));
      GRANARY_ASSIGN_OR_RETURN(r.spec.snapshot_by, ParseSnapshotBy(by));
    }
    if (spec->contains("namespace")) {
      GRANARY_ASSIGN_OR_RETURN(r.spec.kubernetes_namespace,
                               StringField(*spec, "namespace", "spec.namespace"));
    }
    GRANARY_ASSIGN_OR_RETURN(const json* owner, ObjectField(j, "owner", "owner"));
    GRANARY_ASSIGN_OR_RETURN(r.owner.uid, IntField<uint32_t>(*owner, "uid", "owner.uid"));
    GRANARY_ASSIGN_OR_RETURN(r.owner.gid, IntField<uint32_t>(*owner, "gid", "owner.gid"));
    GRANARY_ASSIGN_OR_RETURN(const json* state, ObjectField(j, "state", "state"));
    GRANARY_ASSIGN_OR_RETURN(std::string phase, StringField(*state, "phase", "state.phase"));
    GRANARY_ASSIGN_OR_RETURN(r.state.phase, ParseDatasetPhase(phase));
    GRANARY_ASSIGN_OR_RETURN(r.state.message, StringField(*state, "message", "state.message"));
    if (state->contains("claimed_by")) {
      GRANARY_ASSIGN_OR_RETURN(r.state.claimed_by,
                               StringField(*state, "claimed_by", "state.claimed_by"));
    }
    GRANARY_ASSIGN_OR_RETURN(r.manifest_id, StringField(j, "manifest_id", "manifest_id"));
    GRANARY_ASSIGN_OR_RETURN(r.updated_ms, IntField<int64_t>(j, "updated_ms", "updated_ms"));
    r.created_ms = created_ms;
    r.revision = revision;
    if (r.name != key_name) return KeyMismatch("name", r.name, key_name);
    if (revision == 0) return Status::InvalidArgument("revision is 0; stored revisions start at 1");
    GRANARY_RETURN_IF_ERROR(ValidateDataset(r));
    return r;
  });
}

Result<std::string> EncodeNode(const NodeRecord& n) {
  return EncodeJson("node " + Quoted(n.id), [&] {
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

Result<NodeRecord> DecodeNode(std::string_view text, std::string_view key_id,
                              std::string_view where) {
  return DecodeJson<NodeRecord>(text, where, [&](const json& j) -> Result<NodeRecord> {
    NodeRecord n;
    GRANARY_ASSIGN_OR_RETURN(n.id, StringField(j, "id", "id"));
    GRANARY_ASSIGN_OR_RETURN(n.pool, StringField(j, "pool", "pool"));
    GRANARY_ASSIGN_OR_RETURN(n.address, StringField(j, "address", "address"));
    GRANARY_ASSIGN_OR_RETURN(n.capacity_bytes,
                             IntField<uint64_t>(j, "capacity_bytes", "capacity_bytes"));
    GRANARY_ASSIGN_OR_RETURN(n.used_bytes, IntField<uint64_t>(j, "used_bytes", "used_bytes"));
    GRANARY_ASSIGN_OR_RETURN(n.labels, StringMapField(j, "labels", "labels"));
    GRANARY_ASSIGN_OR_RETURN(n.started_ms, IntField<int64_t>(j, "started_ms", "started_ms"));
    GRANARY_ASSIGN_OR_RETURN(n.heartbeat_ms, IntField<int64_t>(j, "heartbeat_ms", "heartbeat_ms"));
    if (n.id != key_id) return KeyMismatch("id", n.id, key_id);
    GRANARY_RETURN_IF_ERROR(ValidateNode(n));
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

Result<StagingProgress> DecodeProgress(std::string_view text, std::string_view key_node_id,
                                       std::string_view where) {
  return DecodeJson<StagingProgress>(text, where, [&](const json& j) -> Result<StagingProgress> {
    StagingProgress p;
    GRANARY_ASSIGN_OR_RETURN(p.chunks_total, IntField<uint64_t>(j, "chunks_total", "chunks_total"));
    GRANARY_ASSIGN_OR_RETURN(p.chunks_staged,
                             IntField<uint64_t>(j, "chunks_staged", "chunks_staged"));
    GRANARY_ASSIGN_OR_RETURN(p.bytes_total, IntField<uint64_t>(j, "bytes_total", "bytes_total"));
    GRANARY_ASSIGN_OR_RETURN(p.bytes_staged, IntField<uint64_t>(j, "bytes_staged", "bytes_staged"));
    GRANARY_ASSIGN_OR_RETURN(p.samples_failed,
                             IntField<uint64_t>(j, "samples_failed", "samples_failed"));
    GRANARY_ASSIGN_OR_RETURN(p.updated_ms, IntField<int64_t>(j, "updated_ms", "updated_ms"));
    GRANARY_RETURN_IF_ERROR(ValidateNodeId(key_node_id).WithContext("the key's node id"));
    return p;
  });
}

Result<std::string> EncodePlan(const PlanRecord& p) {
  return EncodeJson("plan " + Quoted(p.plan_id), [&] {
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

Result<PlanRecord> DecodePlan(std::string_view text, std::string_view key_plan_id,
                              std::string_view where) {
  return DecodeJson<PlanRecord>(text, where, [&](const json& j) -> Result<PlanRecord> {
    PlanRecord p;
    GRANARY_ASSIGN_OR_RETURN(p.plan_id, StringField(j, "plan_id", "plan_id"));
    GRANARY_ASSIGN_OR_RETURN(p.seed, IntField<uint64_t>(j, "seed", "seed"));
    GRANARY_ASSIGN_OR_RETURN(p.first_epoch, IntField<uint32_t>(j, "first_epoch", "first_epoch"));
    GRANARY_ASSIGN_OR_RETURN(p.world_size, IntField<uint32_t>(j, "world_size", "world_size"));
    GRANARY_ASSIGN_OR_RETURN(p.batch_size, IntField<uint32_t>(j, "batch_size", "batch_size"));
    GRANARY_ASSIGN_OR_RETURN(p.drop_last, BoolField(j, "drop_last", "drop_last"));
    GRANARY_ASSIGN_OR_RETURN(p.mode, StringField(j, "mode", "mode"));
    GRANARY_ASSIGN_OR_RETURN(p.window_chunks,
                             IntField<uint32_t>(j, "window_chunks", "window_chunks"));
    GRANARY_ASSIGN_OR_RETURN(p.registered_ms,
                             IntField<int64_t>(j, "registered_ms", "registered_ms"));
    if (p.plan_id != key_plan_id) return KeyMismatch("plan_id", p.plan_id, key_plan_id);
    GRANARY_RETURN_IF_ERROR(ValidatePlan(p));
    return p;
  });
}

std::string EncodeEvent(const Event& event) {
  // Names are validated ASCII, so this cannot throw.
  return Dump(json{{"kind", EventKindName(event.kind)}, {"name", event.name}});
}

Result<Event> DecodeEvent(std::string_view text) {
  return DecodeJson<Event>(text, "event " + Quoted(text), [&](const json& j) -> Result<Event> {
    GRANARY_ASSIGN_OR_RETURN(std::string kind, StringField(j, "kind", "kind"));
    GRANARY_ASSIGN_OR_RETURN(std::string name, StringField(j, "name", "name"));
    for (const auto& [k, kind_name] : kEventKindNames) {
      if (kind_name == kind) return Event{k, std::move(name)};
    }
    return Status::InvalidArgument("unknown kind " + Quoted(kind));
  });
}

}  // namespace store_internal
}  // namespace granary
