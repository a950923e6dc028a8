#include "granary/config/config_keys.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <string>
#include <utility>

#include "granary/core/file.h"
#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/protocol/unix_socket.h"

namespace granary {
bool HasControlCharacter(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return true;
  }
  return false;
}

// A duration as messages show it: "2s", or "250ms" if not whole seconds.
std::string DurationText(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + "s";
  return std::to_string(d.count()) + "ms";
}

// Reads an optional count and checks lo <= value <= hi.
Status OptionalCount(ConfigMap& m, std::string_view key, uint32_t lo, uint32_t hi, uint32_t* out) {
  GRANARY_RETURN_IF_ERROR(m.Optional(key, out));
  if (*out < lo || *out > hi) {
    return Status::InvalidArgument(m.Where(key) + ": " + std::to_string(*out) +
                                   " is out of range; write " + std::to_string(lo) + " to " +
                                   std::to_string(hi));
  }
  return Status::Ok();
}

// Reads an optional string; *given says whether the key had a value (a key
// with an empty YAML value counts as absent, as everywhere in ConfigMap). The
// sentinel starts with a control byte, which no accepted value contains.
Status OptionalString(ConfigMap& m, std::string_view key, std::string* out, bool* given) {
  constexpr std::string_view kUnset = "\x01unset";
  std::string text(kUnset);
  GRANARY_RETURN_IF_ERROR(m.Optional(key, &text));
  *given = text != kUnset;
  if (*given) *out = std::move(text);
  return Status::Ok();
}

Status OptionalAddress(ConfigMap& m, std::string_view key, std::string_view what, NetAddress* out) {
  std::string text;
  bool given = false;
  GRANARY_RETURN_IF_ERROR(OptionalString(m, key, &text, &given));
  if (!given) return Status::Ok();
  Result<NetAddress> address = ParseNetAddress(text, what);
  if (!address.ok()) {
    return Status::InvalidArgument(m.Where(key) + ": " + address.status().message());
  }
  *out = *address;
  return Status::Ok();
}

Status OptionalPositiveDuration(ConfigMap& m, std::string_view key,
                                std::chrono::milliseconds* out) {
  GRANARY_RETURN_IF_ERROR(m.Optional(key, out));
  if (out->count() <= 0) {
    return Status::InvalidArgument(m.Where(key) + ": " + DurationText(*out) +
                                   " is not a positive duration; write e.g. 250ms, 2s or 1m");
  }
  return Status::Ok();
}

bool IsWildcardHost(std::string_view host) { return host == "0.0.0.0" || host == "::"; }

Result<std::string> HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) {
    return Status::FromErrno(errno, "read the host name (gethostname)");
  }
  return std::string(host);
}

Status CheckSocketPath(std::string_view origin, const std::string& path, std::string_view example) {
  const std::string where = std::string(origin) + ": " + Quoted(path);
  if (path.empty() || path.front() != '/') {
    return Status::InvalidArgument(where + " is not an absolute path; write e.g. " +
                                   std::string(example));
  }
  if (HasControlCharacter(path)) {
    return Status::InvalidArgument(where + " contains a control character; write a plain path");
  }
  if (path.size() > kMaxUnixSocketPath) {
    return Status::InvalidArgument(where + " is " + std::to_string(path.size()) +
                                   " bytes long; a Unix socket path holds at most " +
                                   std::to_string(kMaxUnixSocketPath) + "; choose a shorter one");
  }
  return Status::Ok();
}

Status CheckStoreUrl(ConfigMap& m, std::string_view key, const std::string& url) {
  constexpr std::string_view kRedis = "redis://";
  constexpr std::string_view kSqlite = "sqlite:///";
  const std::string where = m.Where(key) + ": " + Quoted(url);
  const std::string_view u = url;
  if (HasControlCharacter(u) || u.find(' ') != std::string_view::npos) {
    return Status::InvalidArgument(where +
                                   " contains a space or a control character; write the URL "
                                   "without them (percent-encode a password)");
  }
  if (u.starts_with(kRedis)) {
    std::string_view rest = u.substr(kRedis.size());
    if (rest.empty() || rest.front() == '/' || rest.front() == '?') {
      return Status::InvalidArgument(
          where +
          " names no Redis host; write redis://host[:port][/db], e.g. redis://10.0.0.2:6379");
    }
    return Status::Ok();
  }
  if (u.starts_with("redis+sentinel://")) {
    std::string_view rest = u.substr(std::string_view("redis+sentinel://").size());
    if (rest.empty() || rest.front() == '/' || rest.front() == '?' ||
        rest.find('/') == std::string_view::npos) {
      return Status::InvalidArgument(
          where +
          " names no sentinel or no master; write redis+sentinel://s1:26379,s2:26379/MASTER, "
          "the master as `sentinel monitor` names it");
    }
    return Status::Ok();
  }
  if (u.starts_with(kSqlite)) {
    std::string_view rest = u.substr(kSqlite.size());
    if (rest.empty() || rest.front() == '?') {
      return Status::InvalidArgument(
          where + " names no database file; write sqlite:///absolute/path/granary.db");
    }
    return Status::Ok();
  }
  if (u.starts_with("sqlite:")) {
    return Status::InvalidArgument(
        where +
        " is not an absolute SQLite path; write sqlite:///absolute/path/granary.db "
        "(three slashes, then the path from /)");
  }
  return Status::InvalidArgument(where +
                                 " is not a metadata store URL; write redis://host[:port][/db], "
                                 "redis+sentinel://s1,s2,s3/MASTER[/db] or "
                                 "sqlite:///absolute/path/granary.db");
}

Status OptionalFilePath(ConfigMap& m, std::string_view key, std::string* out,
                        std::string_view example) {
  bool given = false;
  std::string path;
  GRANARY_RETURN_IF_ERROR(OptionalString(m, key, &path, &given));
  if (!given) return Status::Ok();
  if (path.empty() || path.front() != '/' || HasControlCharacter(path)) {
    return Status::InvalidArgument(m.Where(key) + ": " + Quoted(path) +
                                   " is not an absolute path; write the full path, e.g. " +
                                   std::string(example));
  }
  *out = std::move(path);
  return Status::Ok();
}

Result<ClientCredentials> LoadPeerCredentials(const std::string& cluster_key_file,
                                              const std::string& token_file) {
  ClientCredentials credentials;
  if (!cluster_key_file.empty()) {
    GRANARY_ASSIGN_OR_RETURN(ClusterKeys keys, ClusterKeys::Load(cluster_key_file));
    credentials.cluster_key = std::make_shared<const ClusterKeys>(std::move(keys));
  }
  credentials.token_file = token_file;
  return credentials;
}

Status ParseStoreKeys(ConfigMap& m, std::string* url, std::string* file) {
  bool file_given = false;
  GRANARY_RETURN_IF_ERROR(OptionalString(m, "metadata_store_file", file, &file_given));
  if (!file_given) {
    GRANARY_RETURN_IF_ERROR(m.Required("metadata_store", url));
    return CheckStoreUrl(m, "metadata_store", *url);
  }
  if (m.Has("metadata_store")) {
    return Status::InvalidArgument(m.Where("metadata_store_file") +
                                   ": write one of 'metadata_store' and 'metadata_store_file', "
                                   "not both");
  }
  if (file->empty() || file->front() != '/' || HasControlCharacter(*file)) {
    return Status::InvalidArgument(m.Where("metadata_store_file") + ": " + Quoted(*file) +
                                   " is not an absolute path; write the full path of the file "
                                   "holding the store URL, e.g. /etc/granary/store/url");
  }
  return Status::Ok();
}

Result<std::string> ReadStoreUrlFile(const std::string& config_path, const std::string& file) {
  Result<std::string> text = ReadFileToString(file);
  if (!text.ok()) {
    return Status(text.status().code(),
                  config_path + ": metadata_store_file " + Quoted(file) + ": " +
                      text.status().message() +
                      "; mount the file holding the store URL there (under Kubernetes, the "
                      "Secret with key url) and make it readable by the daemon's user");
  }
  std::string url = std::move(*text);
  while (!url.empty() && std::isspace(static_cast<unsigned char>(url.back())) != 0) url.pop_back();
  // The same check as a metadata_store key, naming the file.
  GRANARY_ASSIGN_OR_RETURN(ConfigMap m, ConfigMap::FromText("metadata_store: \"\"\n", file));
  if (Status valid = CheckStoreUrl(m, "metadata_store", url); !valid.ok()) {
    return Status::InvalidArgument(config_path + ": metadata_store_file " + Quoted(file) +
                                   " does not hold a store URL: " + valid.message());
  }
  return url;
}

Status OptionalLogLevel(ConfigMap& m, std::string_view key, spdlog::level::level_enum* out) {
  std::string level;
  bool given = false;
  GRANARY_RETURN_IF_ERROR(OptionalString(m, key, &level, &given));
  if (!given) return Status::Ok();
  Result<spdlog::level::level_enum> parsed = ParseLogLevel(level);
  if (!parsed.ok()) {
    return Status::InvalidArgument(m.Where(key) + ": " + Quoted(level) +
                                   " is not a log level; write one of trace, debug, info, warn, "
                                   "error, off");
  }
  *out = *parsed;
  return Status::Ok();
}

Result<std::string> ReadConfigFile(const std::string& path, std::string_view daemon) {
  const std::string what = "read the " + std::string(daemon) + " configuration " + Quoted(path);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    Status s = Status::FromErrno(errno, what);
    return Status(s.code(), s.message() + "; check the path given with --config");
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(what + ": it is " +
                                   (S_ISDIR(st.st_mode) ? "a directory" : "not a regular file") +
                                   "; pass the YAML file itself with --config");
  }
  Result<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return Status(text.status().code(),
                  what + ": " + text.status().message() +
                      "; make the file readable by the user the daemon runs as");
  }
  return text;
}

}  // namespace granary
