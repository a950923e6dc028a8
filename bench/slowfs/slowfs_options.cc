#include "slowfs_options.h"

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>

#include "granary/core/names.h"

namespace granary {

const std::vector<SlowFsProfile>& SlowFsProfiles() {
  static const std::vector<SlowFsProfile> kProfiles = {
      {"nfs", 1.0, 200.0, 16},
      {"object", 20.0, 100.0, 32},
      {"none", 0.0, 0.0, 0},
  };
  return kProfiles;
}

Result<SlowFsProfile> FindSlowFsProfile(std::string_view name) {
  std::string known;
  for (const SlowFsProfile& p : SlowFsProfiles()) {
    if (p.name == name) return p;
    known += known.empty() ? p.name : ", " + p.name;
  }
  return Status::InvalidArgument("unknown --profile " + Quoted(name) + "; use one of " + known);
}

namespace {

// The real absolute path of an existing directory, for `flag`.
Result<std::string> RealDirectory(const std::string& path, std::string_view flag) {
  if (path.empty()) {
    return Status::InvalidArgument(std::string(flag) + " is empty; name an existing directory");
  }
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return Status::NotFound(std::string(flag) + " " + Quoted(path) +
                              " does not exist; create the directory first");
    }
    return Status::FromErrno(err,
                             std::string("resolving ") + std::string(flag) + " " + Quoted(path));
  }
  struct stat st {};
  if (stat(resolved, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument(std::string(flag) + " " + Quoted(path) +
                                   " is not a directory; name a directory");
  }
  return std::string(resolved);
}

bool IsWithin(const std::string& path, const std::string& dir) {
  if (path == dir) return true;
  if (dir == "/") return true;
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

}  // namespace

Status ValidateSlowFsOptions(SlowFsOptions& options) {
  const SlowFsProfile& p = options.profile;
  if (!std::isfinite(p.latency_ms) || p.latency_ms < 0 || p.latency_ms > kMaxSlowFsLatencyMs) {
    return Status::InvalidArgument("--latency-ms " + std::to_string(p.latency_ms) +
                                   " is out of range; give 0 to 60000 milliseconds");
  }
  if (!std::isfinite(p.bandwidth_mb_s) || p.bandwidth_mb_s < 0 ||
      p.bandwidth_mb_s > kMaxSlowFsBandwidthMbS) {
    return Status::InvalidArgument("--bandwidth-mb-s " + std::to_string(p.bandwidth_mb_s) +
                                   " is out of range; give 0 (unlimited) to 1000000 MB/s");
  }
  if (p.max_concurrency > kMaxSlowFsConcurrency) {
    return Status::InvalidArgument("--max-concurrency " + std::to_string(p.max_concurrency) +
                                   " is out of range; give 0 (unlimited) to 4096");
  }
  GRANARY_ASSIGN_OR_RETURN(std::string source, RealDirectory(options.source, "--source"));
  GRANARY_ASSIGN_OR_RETURN(std::string mountpoint,
                           RealDirectory(options.mountpoint, "the mount point"));
  if (IsWithin(mountpoint, source)) {
    return Status::InvalidArgument("the mount point " + Quoted(mountpoint) +
                                   " is the source or inside it (" + Quoted(source) +
                                   "); mount it outside the directory it serves");
  }
  options.source = std::move(source);
  options.mountpoint = std::move(mountpoint);
  return Status::Ok();
}

}  // namespace granary
