// OpenMetadataStore: the URL forms (redis://, redis+sentinel://, sqlite://), their query
// parameters, and the redaction that keeps passwords out of every message.

#include "granary/store/open_store.h"

#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <limits>
#include <set>
#include <utility>

#include "granary/core/file.h"
#include "granary/core/names.h"
#include "metadata_store_internal.h"
#include "redis_store.h"
#include "sqlite_store.h"

namespace granary {

namespace {

using store_internal::ParseDecimal;

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

// "host[:port]" or "[v6]:port" into *address (its port: `default_port` when
// the text has none).
Status ParseHostPort(std::string_view authority, uint16_t default_port, std::string_view shown,
                     RedisAddress* address) {
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return UrlError(shown, "an IPv6 host lacks its ']'");
    address->host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return UrlError(shown, "unexpected text after the IPv6 host");
      port_text = after.substr(1);
      if (port_text.empty()) return UrlError(shown, "the port after ':' is empty");
    }
  } else {
    size_t colon = authority.find(':');
    address->host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) return UrlError(shown, "the port after ':' is empty");
    }
    for (char c : address->host) {
      if (!IsAsciiAlnum(c) && c != '.' && c != '-' && c != '_') {
        return UrlError(shown, "the host " + Quoted(address->host) +
                                   " has a character that is not "
                                   "allowed in a host name");
      }
    }
  }
  if (address->host.empty()) return UrlError(shown, "the host is missing");
  address->port = default_port;
  if (!port_text.empty()) {
    uint64_t port = 0;
    if (!ParseDecimal(port_text, 65535, &port) || port == 0) {
      return UrlError(shown, "the port " + Quoted(port_text) + " is not a number from 1 to 65535");
    }
    address->port = static_cast<uint16_t>(port);
  }
  return Status::Ok();
}

// "/0" (or empty, or "/") as a database number into *db.
Status ParseDatabase(std::string_view path, std::string_view shown, int* db) {
  if (path.empty() || path == "/") return Status::Ok();
  uint64_t n = 0;
  if (!ParseDecimal(path.substr(1), 1'000'000, &n)) {
    return UrlError(
        shown, "the path " + Quoted(path) + " is not a database number (e.g. /0, the default)");
  }
  *db = static_cast<int>(n);
  return Status::Ok();
}

// The sentinels' password, from the file `path` names (its first line): a
// URL never carries it, so no message or process listing shows it.
Result<std::string> ReadSentinelPassword(std::string_view path, std::string_view shown) {
  if (path.empty() || path.front() != '/') {
    return UrlError(shown, "sentinel_password_file=" + Quoted(path) + " is not an absolute path");
  }
  Result<std::string> text = ReadFileToString(std::string(path));
  if (!text.ok()) {
    return Status(text.status().code(), "open metadata store " + Quoted(shown) +
                                            ": reading sentinel_password_file " + Quoted(path) +
                                            ": " + text.status().message());
  }
  std::string password = text->substr(0, text->find('\n'));
  if (!password.empty() && password.back() == '\r') password.pop_back();
  if (password.empty()) {
    return UrlError(shown, "sentinel_password_file " + Quoted(path) + " is empty");
  }
  return password;
}

// redis://... and, with `sentinel`, redis+sentinel://...: `rest` is what
// follows the scheme.
Result<std::unique_ptr<MetadataStore>> OpenRedis(std::string_view url, std::string_view rest,
                                                 bool sentinel, const MetadataStoreOptions& options,
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

  if (!sentinel) {
    RedisAddress server;
    GRANARY_RETURN_IF_ERROR(ParseHostPort(authority, 6379, shown, &server));
    config.host = server.host;
    config.port = server.port;
    GRANARY_RETURN_IF_ERROR(ParseDatabase(path, shown, &config.db));
  } else {
    constexpr size_t kMaxSentinels = 16;
    while (true) {
      const size_t comma = authority.find(',');
      RedisAddress s;
      GRANARY_RETURN_IF_ERROR(ParseHostPort(authority.substr(0, comma), 26379, shown, &s));
      config.sentinels.push_back(std::move(s));
      if (comma == std::string_view::npos) break;
      authority = authority.substr(comma + 1);
    }
    if (config.sentinels.size() > kMaxSentinels) {
      return UrlError(shown, "more than " + std::to_string(kMaxSentinels) + " sentinels");
    }
    // "/MASTER" or "/MASTER/db".
    std::string_view master = path.empty() ? path : path.substr(1);
    const size_t next = master.find('/');
    std::string_view db_path =
        next == std::string_view::npos ? std::string_view() : master.substr(next);
    master = master.substr(0, next);
    bool ok = !master.empty() && master.size() <= 128;
    for (char c : master) ok = ok && (IsAsciiAlnum(c) || c == '.' || c == '_' || c == '-');
    if (!ok) {
      return UrlError(shown, "the master name " + Quoted(master) +
                                 " after the sentinels is missing or not 1 to 128 letters, "
                                 "digits, '.', '_' or '-' (the name `sentinel monitor` gives in "
                                 "sentinel.conf, e.g. redis+sentinel://s1,s2,s3/granary)");
    }
    config.master_name = std::string(master);
    GRANARY_RETURN_IF_ERROR(ParseDatabase(db_path, shown, &config.db));
  }

  std::set<std::string_view> accepted = {"prefix", "timeout_ms", "retry_ms"};
  if (sentinel) accepted.insert("sentinel_password_file");
  GRANARY_ASSIGN_OR_RETURN(
      Query q, ParseQuery(query, shown, accepted, sentinel ? "redis+sentinel" : "redis"));
  for (const auto& [key, value] : q.params) {
    if (key == "prefix") {
      bool ok = !value.empty() && value.size() <= 64;
      for (char c : value)
        ok = ok && (IsAsciiAlnum(c) || c == '.' || c == '_' || c == '-' || c == ':');
      if (!ok) {
        return UrlError(shown, "prefix=" + Quoted(value) +
                                   " must be 1 to 64 letters, digits, '.', '_', '-' or ':'");
      }
      config.prefix = value;
    } else if (key == "timeout_ms") {
      GRANARY_ASSIGN_OR_RETURN(config.connect_timeout, ParseMillis(key, value, shown));
    } else if (key == "retry_ms") {
      GRANARY_ASSIGN_OR_RETURN(config.retry_budget, ParseMillis(key, value, shown));
    } else if (key == "sentinel_password_file") {
      GRANARY_ASSIGN_OR_RETURN(config.sentinel_password, ReadSentinelPassword(value, shown));
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

}  // namespace

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
  if (url.starts_with("redis://")) return OpenRedis(url, url.substr(8), false, options, clock);
  if (url.starts_with("redis+sentinel://")) {
    return OpenRedis(url, url.substr(17), true, options, clock);
  }
  if (url.starts_with("sqlite://")) return OpenSqlite(url, url.substr(9), options, clock);
  // The scheme is read from the redacted URL: without "://", what precedes a
  // ':' may be a user name followed by a password.
  size_t colon = shown.find(':');
  return UrlError(shown,
                  colon == std::string::npos || colon == 0
                      ? std::string("there is no scheme")
                      : "unknown scheme " + Quoted(std::string_view(shown).substr(0, colon)));
}

Result<std::unique_ptr<MetadataStore>> OpenExistingMetadataStore(
    std::string_view url, const MetadataStoreOptions& options) {
  if (url.starts_with("sqlite://")) {
    std::string_view path = url.substr(9);
    path = path.substr(0, path.find('?'));
    struct stat st {};
    if (!path.empty() && path.front() == '/' && ::stat(std::string(path).c_str(), &st) != 0 &&
        errno == ENOENT) {
      return Status::NotFound("metadata store " + RedactUrl(url) +
                              ": there is no such file, so there is nothing to read yet (a cache "
                              "node or `granary dataset create` makes it); check --store or "
                              "GRANARY_STORE");
    }
  }
  return OpenMetadataStore(url, options);
}

}  // namespace granary
