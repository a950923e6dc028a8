#include "cli_context.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "granary/cli/cli.h"
#include "granary/core/names.h"
#include "granary/fabric/endpoint.h"
#include "granary/fabric/fabric_transport.h"
#include "granary/slurm/node_agent.h"
#include "granary/store/open_store.h"

namespace granary::cli {
namespace {

// Points kept for the rate, whatever the window holds.
constexpr size_t kMaxRatePoints = 256;

// mkdir -p of the directory holding `path` (mode 0700 for what it creates).
// Failures are left for the open that follows to report.
void CreateParentDirectories(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return;
  for (size_t end = path.find('/', 1); end != std::string::npos && end <= slash;
       end = path.find('/', end + 1)) {
    mkdir(path.substr(0, end).c_str(), 0700);
  }
}

}  // namespace

std::string CliContext::StoreUrl() const {
  if (!store_url_.empty()) return store_url_;
  const char* env = std::getenv("GRANARY_STORE");
  return env != nullptr && *env != '\0' ? env : DefaultStoreUrl();
}

std::string CliContext::ClusterKeyPath() const {
  if (!cluster_key_file_.empty()) return cluster_key_file_;
  const char* env = std::getenv("GRANARY_CLUSTER_KEY_FILE");
  if (env != nullptr && *env != '\0') return env;
  // The default place, when this user may read it; other users read
  // without a key (a node that requires one refuses them, saying so).
  return ReadableDefaultClusterKeyPath();
}

std::string CliContext::TlsCaPath() const {
  if (!tls_ca_file_.empty()) return tls_ca_file_;
  const char* env = std::getenv("GRANARY_TLS_CA_FILE");
  return env != nullptr ? env : "";
}

Result<std::shared_ptr<TlsContext>> CliContext::Tls() const {
  Result<std::shared_ptr<TlsContext>> tls = TlsContext::ForClient(TlsCaPath());
  if (!tls.ok()) return tls.status().WithContext("--tls-ca-file");
  return tls;
}

std::shared_ptr<PeerTransport> CliContext::Fabric() {
  if (transport_ != "libfabric") return nullptr;
  if (Status probe = fabric::ProbeProvider(libfabric_provider_); !probe.ok()) {
    err_ << "granary: warning: --transport libfabric: " << probe.message()
         << "; reading every cache node over TCP\n";
    return nullptr;
  }
  return fabric::FabricPeerTransport(libfabric_provider_);
}

Result<ClientCredentials> CliContext::PeerCredentials() const {
  const std::string path = ClusterKeyPath();
  if (path.empty()) return ClientCredentials{};
  Result<ClusterKeys> keys = ClusterKeys::Load(path);
  if (!keys.ok()) return keys.status().WithContext("--cluster-key-file");
  ClientCredentials credentials;
  credentials.cluster_key = std::make_shared<const ClusterKeys>(std::move(*keys));
  return credentials;
}

Status CliContext::OpenStore() { return Open(/*create=*/true); }

Status CliContext::OpenExistingStore() { return Open(/*create=*/false); }

Status CliContext::Open(bool create) {
  if (store_) return Status::Ok();
  const std::string url = StoreUrl();
  if (create && url.rfind("sqlite://", 0) == 0) {
    // The embedded store's directory is created on first use.
    const std::string path = url.substr(std::strlen("sqlite://"));
    CreateParentDirectories(path.substr(0, path.find('?')));
  }
  Result<std::unique_ptr<MetadataStore>> store =
      create ? OpenMetadataStore(url) : OpenExistingMetadataStore(url);
  // A store that does not exist yet says so, naming it, and who makes it.
  if (!store.ok() && !create && store.status().code() == StatusCode::kNotFound) {
    return store.status();
  }
  if (!store.ok()) {
    return Status(store.status().code(),
                  "opening the metadata store " + url + ": " + store.status().message() +
                      " (set --store or GRANARY_STORE; `granary doctor` checks the set-up)");
  }
  store_ = std::move(*store);
  return Status::Ok();
}

void CliContext::Progress(const std::string& line, bool final) {
  if (json_output()) return;
  const auto now = SteadyClock::now();
  if (interactive_) {
    err_ << "\r\033[2K" << line << (final ? "\n" : "") << std::flush;
    progress_drawn_ = !final;
  } else if (final || !progress_drawn_ || now - last_progress_ >= kPlainProgressEvery) {
    err_ << line << "\n" << std::flush;
    last_progress_ = now;
    progress_drawn_ = !final;
  }
}

void CliContext::OnParsed(CLI::App* app, std::function<Status()> run) {
  handlers_.emplace_back(app, std::move(run));
}

std::function<Status()> CliContext::ParsedHandler() const {
  for (const auto& handler : handlers_) {
    if (handler.first->parsed()) return handler.second;
  }
  return nullptr;
}

std::string HumanDuration(double seconds) {
  if (!(seconds >= 0) || seconds > 360000) return "--";
  const auto s = static_cast<uint64_t>(seconds + 0.5);
  std::ostringstream o;
  if (s >= 3600) o << s / 3600 << "h";
  if (s >= 60) o << std::setw(s >= 3600 ? 2 : 1) << std::setfill('0') << (s / 60) % 60 << "m";
  o << std::setw(s >= 60 ? 2 : 1) << std::setfill('0') << s % 60 << "s";
  return o.str();
}

void PrintTable(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

int ExitCodeOf(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return kCliOk;
    case StatusCode::kInvalidArgument:
      return kCliUsage;
    case StatusCode::kNotFound:
      return kCliNotFound;
    case StatusCode::kUnavailable:
      return kCliUnavailable;
    case StatusCode::kDeadlineExceeded:
      return kCliTimeout;
    default:
      return kCliFailed;
  }
}

Status StatusOfExitCode(int code, std::string message) {
  switch (code) {
    case kCliOk:
      return Status::Ok();
    case kCliUsage:
      return Status::InvalidArgument(std::move(message));
    case kCliNotFound:
      return Status::NotFound(std::move(message));
    case kCliUnavailable:
      return Status::Unavailable(std::move(message));
    case kCliTimeout:
      return Status::DeadlineExceeded(std::move(message));
    default:
      return Status::FailedPrecondition(std::move(message));
  }
}

std::string ExitCodesHelp() {
  return "Exit codes:\n"
         "  0  success\n"
         "  1  the operation failed (the message says why and what to do); doctor: a check "
         "failed\n"
         "  2  bad command line: unknown command or option, bad name, size, duration or path\n"
         "  3  not found: no such dataset, node, plan, or path in a dataset\n"
         "  4  the metadata store is unreachable\n"
         "  5  timed out (dataset wait --timeout)\n"
         "Docs: docs/cli.md\n";
}

Json DatasetJson(const DatasetRecord& d) {
  return Json{{"name", d.name},
              {"phase", DatasetPhaseName(d.state.phase)},
              {"message", d.state.message},
              {"source", d.spec.source_uri},
              {"include", d.spec.include},
              {"exclude", d.spec.exclude},
              {"chunk_size", d.spec.chunk_size},
              {"pool", d.spec.pool},
              {"replication", d.spec.replication},
              {"snapshot_by", SnapshotByName(d.spec.snapshot_by)},
              // The cache node walking the source (phase Snapshotting); null otherwise.
              {"claimed_by", d.state.claimed_by.empty() ? Json(nullptr) : Json(d.state.claimed_by)},
              {"owner", {{"uid", d.owner.uid}, {"gid", d.owner.gid}}},
              // Granted besides root and the owner (`granary dataset grant`).
              {"readers", {{"uids", d.readers.uids}, {"gids", d.readers.gids}}},
              {"manifest_id", d.manifest_id},
              {"created_ms", d.created_ms},
              {"updated_ms", d.updated_ms},
              {"revision", d.revision},
              // null: every node of the pool; a list: only those (maybe none).
              {"placed_on", d.spec.nodes.has_value() ? Json(*d.spec.nodes) : Json(nullptr)},
              // How it keeps its place in a full pool (`dataset update`).
              {"cache",
               {{"priority", d.spec.cache.priority},
                {"pinned", d.spec.cache.pinned},
                {"ttl_seconds", d.spec.cache.ttl_seconds},
                {"min_resident_percent", d.spec.cache.min_resident_percent},
                {"max_resident_bytes", d.spec.cache.max_resident_bytes.has_value()
                                           ? Json(*d.spec.cache.max_resident_bytes)
                                           : Json(nullptr)}}}};
}

Json ProgressJson(const ProgressSummary& s) {
  return Json{{"nodes", s.nodes_reporting},
              {"chunks_total", s.total.chunks_total},
              {"chunks_staged", s.total.chunks_staged},
              {"bytes_total", s.total.bytes_total},
              {"bytes_staged", s.total.bytes_staged},
              {"samples_failed", s.total.samples_failed},
              {"bytes_not_kept", s.total.bytes_not_kept},
              {"resident_fraction", s.resident_fraction()}};
}

std::string UserName(uint32_t uid) {
  struct passwd pw {};
  struct passwd* found = nullptr;
  char buffer[4096];
  if (getpwuid_r(uid, &pw, buffer, sizeof(buffer), &found) == 0 && found != nullptr) {
    return found->pw_name;
  }
  return std::to_string(uid);
}

std::string GroupName(uint32_t gid) {
  struct group gr {};
  struct group* found = nullptr;
  char buffer[16384];
  if (getgrgid_r(gid, &gr, buffer, sizeof(buffer), &found) == 0 && found != nullptr) {
    return found->gr_name;
  }
  return std::to_string(gid);
}

Result<uint32_t> UserIdOf(const std::string& option, const std::string& user) {
  // A numeric id as Slurm passes one (slurm::ParseUserOrGroupId's rule).
  if (Result<uint32_t> id = slurm::ParseUserOrGroupId(user, option); id.ok()) return *id;
  struct passwd pw {};
  struct passwd* found = nullptr;
  char buffer[4096];
  if (!user.empty() && getpwnam_r(user.c_str(), &pw, buffer, sizeof(buffer), &found) == 0 &&
      found != nullptr) {
    return static_cast<uint32_t>(found->pw_uid);
  }
  return Status::InvalidArgument(option + " " + Quoted(user) +
                                 ": no such user in this host's user database; write a user "
                                 "name (`getent passwd NAME` finds it) or a numeric uid");
}

Result<uint32_t> GroupIdOf(const std::string& option, const std::string& group) {
  if (Result<uint32_t> id = slurm::ParseUserOrGroupId(group, option); id.ok()) return *id;
  struct group gr {};
  struct group* found = nullptr;
  char buffer[16384];
  if (!group.empty() && getgrnam_r(group.c_str(), &gr, buffer, sizeof(buffer), &found) == 0 &&
      found != nullptr) {
    return static_cast<uint32_t>(found->gr_gid);
  }
  return Status::InvalidArgument(option + " " + Quoted(group) +
                                 ": no such group in this host's group database; write a group "
                                 "name (`getent group NAME` finds it) or a numeric gid");
}

std::string ReadersText(const DatasetRecord& d) {
  std::string text = "root and its owner (" + UserName(d.owner.uid) + ")";
  for (uint32_t uid : d.readers.uids) {
    text += "; user " + UserName(uid) + " (" + std::to_string(uid) + ")";
  }
  for (uint32_t gid : d.readers.gids) {
    text += "; group " + GroupName(gid) + " (" + std::to_string(gid) + ")";
  }
  return text;
}

ProgressMeter::ProgressMeter(std::string label, std::string items_unit,
                             SteadyClock::time_point start)
    : label_(std::move(label)), items_unit_(std::move(items_unit)), start_(start) {}

std::string ProgressMeter::Line(const ProgressCounts& counts, SteadyClock::time_point now,
                                std::string_view note) {
  const uint64_t value = counts.has_bytes ? counts.bytes : counts.items;
  const uint64_t total = counts.has_bytes ? counts.bytes_total : counts.items_total;
  points_.push_back({now, value});
  while (points_.size() > 2 &&
         (points_.size() > kMaxRatePoints || now - points_[1].at >= kRateWindow)) {
    points_.erase(points_.begin());
  }
  const Point& first = points_.front();
  const double span = std::chrono::duration<double>(now - first.at).count();
  rate_ =
      span >= 0.5 && value >= first.value ? static_cast<double>(value - first.value) / span : 0.0;
  eta_ = -1;
  if (total > 0 && value >= total) {
    eta_ = 0;
  } else if (total > 0 && rate_ > 0) {
    eta_ = static_cast<double>(total - value) / rate_;
  }

  std::ostringstream line;
  line << label_;
  if (total > 0) {
    const double fraction = std::min(1.0, static_cast<double>(value) / static_cast<double>(total));
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    line << " [" << std::string(static_cast<size_t>(filled), '#')
         << std::string(static_cast<size_t>(kWidth - filled), '.') << "] " << std::fixed
         << std::setprecision(1) << 100 * fraction << "%";
  }
  line << "  " << counts.items;
  if (counts.items_total > 0) line << "/" << counts.items_total;
  line << " " << items_unit_;
  if (counts.has_bytes) {
    line << "  " << HumanBytes(counts.bytes);
    if (counts.bytes_total > 0) line << "/" << HumanBytes(counts.bytes_total);
  }
  if (counts.has_bytes) {
    line << "  " << HumanBytes(static_cast<uint64_t>(rate_)) << "/s";
  } else {
    line << "  " << static_cast<uint64_t>(rate_) << " " << items_unit_ << "/s";
  }
  if (total > 0) line << "  ETA " << HumanDuration(eta_);
  line << "  " << HumanDuration(std::chrono::duration<double>(now - start_).count()) << " elapsed";
  if (!note.empty()) line << "  " << note;
  return line.str();
}

}  // namespace granary::cli
