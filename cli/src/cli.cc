#include "granary/cli/cli.h"

#include <grp.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "granary/core/config.h"
#include "granary/core/file.h"
#include "granary/core/manifest.h"
#include "granary/core/manifest_builder.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "granary/core/posix_source.h"

namespace granary {
namespace {

using json = nlohmann::ordered_json;
using SteadyClock = std::chrono::steady_clock;

constexpr const char* kExitCodes =
    "Exit codes: 0 success, 1 the operation failed, 2 bad command line, 3 not found, "
    "4 metadata store unreachable, 5 timed out.";

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  std::ostringstream s;
  if (unit == 0) {
    s << bytes << " B";
  } else {
    s << std::fixed << std::setprecision(value < 10 ? 2 : 1) << value << " " << kUnits[unit];
  }
  return s.str();
}

std::string HumanDuration(double seconds) {
  if (seconds < 0 || seconds > 360000) return "--";
  const auto s = static_cast<uint64_t>(seconds + 0.5);
  std::ostringstream o;
  if (s >= 3600) o << s / 3600 << "h";
  if (s >= 60) o << std::setw(s >= 3600 ? 2 : 1) << std::setfill('0') << (s / 60) % 60 << "m";
  o << std::setw(s >= 60 ? 2 : 1) << std::setfill('0') << s % 60 << "s";
  return o.str();
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

json DatasetJson(const DatasetRecord& d) {
  return json{{"name", d.name},
              {"phase", DatasetPhaseName(d.state.phase)},
              {"message", d.state.message},
              {"source", d.spec.source_uri},
              {"include", d.spec.include},
              {"exclude", d.spec.exclude},
              {"chunk_size", d.spec.chunk_size},
              {"pool", d.spec.pool},
              {"replication", d.spec.replication},
              {"owner", {{"uid", d.owner.uid}, {"gid", d.owner.gid}}},
              {"manifest_id", d.manifest_id},
              {"created_ms", d.created_ms},
              {"updated_ms", d.updated_ms},
              {"revision", d.revision}};
}

json ProgressJson(const ProgressSummary& s) {
  return json{{"nodes", s.nodes_reporting},
              {"chunks_total", s.total.chunks_total},
              {"chunks_staged", s.total.chunks_staged},
              {"bytes_total", s.total.bytes_total},
              {"bytes_staged", s.total.bytes_staged},
              {"samples_failed", s.total.samples_failed}};
}

// A plain table: columns padded to their widest cell.
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

// "file:///abs/path" for a path or a file:// URI; the directory must exist.
Result<std::string> NormalizeSource(const std::string& source) {
  std::string path = source;
  if (source.rfind("file://", 0) == 0) {
    GRANARY_ASSIGN_OR_RETURN(path, PosixSource::RootFromUri(source));
  } else if (source.find("://") != std::string::npos) {
    return Status::InvalidArgument("source " + Quoted(source) +
                                   ": only local paths and file:// URIs are supported");
  }
  if (path.empty() || path[0] != '/') {
    return Status::InvalidArgument("source " + Quoted(source) +
                                   " is not an absolute path; write it from / (e.g. " +
                                   "/lustre/imagenet/train)");
  }
  char* real = realpath(path.c_str(), nullptr);
  if (real == nullptr) {
    const int e = errno;
    return Status(e == ENOENT ? StatusCode::kNotFound : StatusCode::kFailedPrecondition,
                  "source " + Quoted(path) + ": " + std::strerror(e));
  }
  std::string resolved = real;
  std::free(real);
  struct stat st {};
  if (stat(resolved.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("source " + Quoted(path) + " is not a directory");
  }
  return "file://" + resolved;
}

// Builds the manifest of `record`'s source. When this process is root and the
// dataset belongs to someone else, the walk runs in a child process that has
// become the owner (setgroups/setgid/setuid), so a snapshot never lists what
// the owner could not list; the child sends the encoded manifest back.
Result<Manifest> SnapshotAsOwner(const DatasetRecord& record, ManifestBuildOptions options) {
  const bool switch_user = geteuid() == 0 && record.owner.uid != 0;
  if (!switch_user) return BuildManifest(options);
  int fds[2];
  if (pipe(fds) != 0) return Status::IoError(std::string("pipe: ") + std::strerror(errno));
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return Status::IoError(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    close(fds[0]);
    const gid_t gid = record.owner.gid;
    std::string payload;
    if (setgroups(1, &gid) != 0 || setgid(gid) != 0 || setuid(record.owner.uid) != 0) {
      payload = "E" + std::string("cannot switch to uid ") + std::to_string(record.owner.uid) +
                ": " + std::strerror(errno);
    } else {
      options.on_progress = nullptr;
      Result<Manifest> m = BuildManifest(options);
      payload = m.ok() ? "M" + m->Encode() : "E" + m.status().ToString();
    }
    size_t done = 0;
    while (done < payload.size()) {
      const ssize_t n = write(fds[1], payload.data() + done, payload.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) _exit(1);
      done += static_cast<size_t>(n);
    }
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string payload;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fds[0], buffer, sizeof(buffer));
    if (n > 0) {
      payload.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (payload.empty()) return Status::Internal("the snapshot process ended without an answer");
  if (payload[0] == 'E') {
    return Status::PermissionDenied("walking the source as uid " +
                                    std::to_string(record.owner.uid) + ": " + payload.substr(1));
  }
  return Manifest::Decode(std::string_view(payload).substr(1));
}

class Cli {
 public:
  Cli(std::ostream& out, std::ostream& err, bool interactive)
      : out_(out), err_(err), interactive_(interactive) {}

  int Run(const std::vector<std::string>& args);

 private:
  Status Open() {
    if (store_) return Status::Ok();
    std::string url = store_url_;
    if (url.empty()) {
      const char* env = std::getenv("GRANARY_STORE");
      url = env != nullptr && *env != '\0' ? env : DefaultStoreUrl();
    }
    if (url.rfind("sqlite://", 0) == 0) {
      // The embedded store's directory is created on first use.
      const std::string path = url.substr(std::strlen("sqlite://"));
      CreateParentDirectories(path.substr(0, path.find('?')));
    }
    Result<std::unique_ptr<MetadataStore>> store = OpenMetadataStore(url);
    if (!store.ok()) {
      return Status(store.status().code(),
                    "opening the metadata store " + url + ": " + store.status().message() +
                        " (set --store or GRANARY_STORE; `granary doctor` checks the set-up)");
    }
    store_ = std::move(*store);
    return Status::Ok();
  }

  bool json_output() const { return output_ == "json"; }
  int Finish(const Status& status) {
    if (status.ok()) return kCliOk;
    err_ << "granary: error: " << status.message() << "\n";
    return ExitCodeOf(status);
  }

  Status DatasetCreate();
  Status DatasetSnapshot(const std::string& name);
  Status DatasetList();
  Status DatasetShow(const std::string& name);
  Status DatasetDelete(const std::string& name);
  Status DatasetStage(const std::string& name);
  Status DatasetWait(const std::string& name);
  Status NodeList();
  Status PlanShow(const std::string& name);
  Status ClusterStatus();

  // Applies `change` to the record with compare-and-set, re-reading on a
  // conflict (a cache node may be writing the message at the same time).
  Result<DatasetRecord> Update(const std::string& name,
                               const std::function<void(DatasetRecord&)>& change);
  Status Snapshot(DatasetRecord record);
  void Progress(const std::string& line, bool final);

  std::ostream& out_;
  std::ostream& err_;
  const bool interactive_;
  std::unique_ptr<MetadataStore> store_;

  std::string store_url_;
  std::string output_ = "human";

  // dataset create
  std::string name_;
  std::string source_;
  std::vector<std::string> include_;
  std::vector<std::string> exclude_;
  std::string chunk_size_ = "64MiB";
  std::string pool_ = "default";
  uint32_t replication_ = 1;
  std::string owner_;
  bool no_snapshot_ = false;
  unsigned walk_threads_ = 8;
  // dataset wait
  std::string timeout_ = "1h";
  std::string pool_filter_;
  std::string wait_for_ = "ready";
  SteadyClock::time_point last_progress_{};
};

void Cli::Progress(const std::string& line, bool final) {
  if (json_output()) return;
  const auto now = SteadyClock::now();
  if (interactive_) {
    err_ << "\r\033[2K" << line << (final ? "\n" : "") << std::flush;
  } else if (final || now - last_progress_ >= std::chrono::seconds(5)) {
    err_ << line << "\n" << std::flush;
    last_progress_ = now;
  }
}

Result<DatasetRecord> Cli::Update(const std::string& name,
                                  const std::function<void(DatasetRecord&)>& change) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    GRANARY_ASSIGN_OR_RETURN(DatasetRecord record, store_->GetDataset(name));
    change(record);
    Result<DatasetRecord> updated = store_->UpdateDataset(record);
    if (updated.ok() || updated.status().code() != StatusCode::kFailedPrecondition) {
      return updated;
    }
  }
  return Status::FailedPrecondition("dataset " + Quoted(name) +
                                    " kept changing under this update; try again");
}

Status Cli::Snapshot(DatasetRecord record) {
  GRANARY_ASSIGN_OR_RETURN(std::string root, PosixSource::RootFromUri(record.spec.source_uri));
  GRANARY_ASSIGN_OR_RETURN(
      record, Update(record.name, [](DatasetRecord& r) {
        r.state = {DatasetPhase::kSnapshotting, "walking the source to build the manifest"};
      }));
  ManifestBuildOptions options;
  options.source_root = root;
  options.source_uri = record.spec.source_uri;
  options.include = record.spec.include;
  options.exclude = record.spec.exclude;
  options.chunk_size = record.spec.chunk_size;
  options.threads = walk_threads_;
  const auto start = SteadyClock::now();
  options.on_progress = [&](uint64_t files, uint64_t dirs) {
    const double s = std::chrono::duration<double>(SteadyClock::now() - start).count();
    Progress(
        "snapshot " + record.name + ": " + std::to_string(files) + " files in " +
            std::to_string(dirs) + " directories, " +
            std::to_string(static_cast<uint64_t>(static_cast<double>(files) / std::max(s, 1e-3))) +
            " files/s",
        false);
  };
  Result<Manifest> manifest = SnapshotAsOwner(record, options);
  if (!manifest.ok()) {
    const std::string message = "snapshot failed: " + manifest.status().message();
    (void)Update(record.name, [&](DatasetRecord& r) {
      r.state = {DatasetPhase::kFailed, message};
    });
    return Status(manifest.status().code(), "snapshotting dataset " + Quoted(record.name) +
                                                " from " + record.spec.source_uri + ": " +
                                                manifest.status().message());
  }
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  const std::string id = manifest->id().ToHex();
  GRANARY_RETURN_IF_ERROR(store_->PutManifest(id, manifest->Encode()));
  const std::string summary = std::to_string(manifest->sample_count()) + " files, " +
                              HumanBytes(manifest->total_bytes()) + ", " +
                              std::to_string(manifest->chunk_count()) + " chunks";
  GRANARY_ASSIGN_OR_RETURN(record, Update(record.name, [&](DatasetRecord& r) {
                             r.manifest_id = id;
                             r.state = {DatasetPhase::kStaging, "snapshot: " + summary};
                           }));
  std::ostringstream rate;
  rate << std::fixed << std::setprecision(1) << seconds << " s";
  Progress("snapshot " + record.name + ": " + summary + " in " + rate.str(), true);
  if (json_output()) {
    json j = DatasetJson(record);
    j["snapshot"] = {{"files", manifest->sample_count()},
                     {"bytes", manifest->total_bytes()},
                     {"chunks", manifest->chunk_count()},
                     {"seconds", seconds}};
    out_ << j.dump(2) << "\n";
  } else {
    out_ << "dataset " << record.name << ": " << summary << " (manifest " << id.substr(0, 12)
         << "); cache nodes of pool " << record.spec.pool << " are staging it\n";
  }
  return Status::Ok();
}

Status Cli::DatasetCreate() {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(name_));
  DatasetRecord record;
  record.name = name_;
  GRANARY_ASSIGN_OR_RETURN(record.spec.source_uri, NormalizeSource(source_));
  record.spec.include = include_;
  record.spec.exclude = exclude_;
  Result<ByteSize> chunk = ParseByteSize(chunk_size_);
  if (!chunk.ok()) {
    return Status::InvalidArgument("--chunk-size: " + chunk.status().message());
  }
  record.spec.chunk_size = chunk->bytes;
  record.spec.pool = pool_;
  if (replication_ < 1) return Status::InvalidArgument("--replication must be at least 1");
  record.spec.replication = replication_;
  record.owner = {static_cast<uint32_t>(getuid()), static_cast<uint32_t>(getgid())};
  if (!owner_.empty()) {
    unsigned long uid = 0;
    unsigned long gid = 0;
    char extra = 0;
    if (std::sscanf(owner_.c_str(), "%lu:%lu%c", &uid, &gid, &extra) != 2 || uid >= 0xffffffffu ||
        gid >= 0xffffffffu) {
      return Status::InvalidArgument("--owner " + Quoted(owner_) +
                                     ": write UID:GID, e.g. 1000:1000");
    }
    if (geteuid() != 0 && (uid != getuid() || gid != getgid())) {
      return Status::PermissionDenied(
          "--owner: only root may create a dataset owned by another user");
    }
    record.owner = {static_cast<uint32_t>(uid), static_cast<uint32_t>(gid)};
  }
  record.state = {DatasetPhase::kPending, "created"};
  GRANARY_RETURN_IF_ERROR(Open());
  Result<DatasetRecord> created = store_->CreateDataset(record);
  if (!created.ok()) {
    if (created.status().code() == StatusCode::kAlreadyExists) {
      return Status::AlreadyExists("dataset " + Quoted(name_) +
                                   " exists; choose another name, or `granary dataset delete " +
                                   name_ + "` first");
    }
    return created.status();
  }
  if (no_snapshot_) {
    if (json_output()) {
      out_ << DatasetJson(*created).dump(2) << "\n";
    } else {
      out_ << "dataset " << name_ << " created (Pending); `granary dataset snapshot " << name_
           << "` takes its snapshot\n";
    }
    return Status::Ok();
  }
  return Snapshot(*created);
}

Status Cli::DatasetSnapshot(const std::string& name) {
  GRANARY_RETURN_IF_ERROR(Open());
  GRANARY_ASSIGN_OR_RETURN(DatasetRecord record, store_->GetDataset(name));
  if (record.state.phase == DatasetPhase::kSnapshotting) {
    return Status::FailedPrecondition("dataset " + Quoted(name) +
                                      " is being snapshotted already; wait for it");
  }
  return Snapshot(record);
}

Status Cli::DatasetList() {
  GRANARY_RETURN_IF_ERROR(Open());
  GRANARY_ASSIGN_OR_RETURN(std::vector<DatasetRecord> datasets, store_->ListDatasets());
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, store_->ListNodes(""));
  json list = json::array();
  std::vector<std::vector<std::string>> rows = {{"NAME", "PHASE", "POOL", "STAGED", "SOURCE"}};
  for (const DatasetRecord& d : datasets) {
    Result<std::map<std::string, StagingProgress>> progress = store_->ListProgress(d.name);
    const ProgressSummary t =
        progress.ok() ? SummarizeProgress(*progress, nodes) : ProgressSummary{};
    json j = DatasetJson(d);
    j["progress"] = ProgressJson(t);
    list.push_back(j);
    std::ostringstream staged;
    staged << std::fixed << std::setprecision(1) << 100 * t.fraction() << "%";
    rows.push_back({d.name, std::string(DatasetPhaseName(d.state.phase)), d.spec.pool, staged.str(),
                    d.spec.source_uri});
  }
  if (json_output()) {
    out_ << list.dump(2) << "\n";
  } else if (datasets.empty()) {
    out_ << "no datasets; `granary dataset create NAME --source DIR` makes one\n";
  } else {
    PrintTable(out_, rows);
  }
  return Status::Ok();
}

Status Cli::DatasetShow(const std::string& name) {
  GRANARY_RETURN_IF_ERROR(Open());
  GRANARY_ASSIGN_OR_RETURN(DatasetRecord d, store_->GetDataset(name));
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, store_->ListNodes(d.spec.pool));
  GRANARY_ASSIGN_OR_RETURN(auto progress, store_->ListProgress(name));
  GRANARY_ASSIGN_OR_RETURN(std::vector<PlanRecord> plans, store_->ListPlans(name));
  const ProgressSummary t = SummarizeProgress(progress, nodes);
  if (json_output()) {
    json j = DatasetJson(d);
    j["progress"] = ProgressJson(t);
    json per_node = json::object();
    for (const auto& [node, p] : progress) {
      per_node[node] = {{"chunks_total", p.chunks_total},     {"chunks_staged", p.chunks_staged},
                        {"bytes_total", p.bytes_total},       {"bytes_staged", p.bytes_staged},
                        {"samples_failed", p.samples_failed}, {"updated_ms", p.updated_ms}};
    }
    j["nodes"] = per_node;
    j["plans"] = plans.size();
    out_ << j.dump(2) << "\n";
    return Status::Ok();
  }
  out_ << "name:        " << d.name << "\n"
       << "phase:       " << DatasetPhaseName(d.state.phase) << "\n"
       << "message:     " << d.state.message << "\n"
       << "source:      " << d.spec.source_uri << "\n"
       << "pool:        " << d.spec.pool << " (replication " << d.spec.replication << ")\n"
       << "chunk size:  " << HumanBytes(d.spec.chunk_size) << "\n"
       << "owner:       uid " << d.owner.uid << " gid " << d.owner.gid << "\n"
       << "manifest:    " << (d.manifest_id.empty() ? "(none yet)" : d.manifest_id) << "\n"
       << "plans:       " << plans.size() << "\n"
       << "staged:      " << HumanBytes(t.total.bytes_staged) << " of "
       << HumanBytes(t.total.bytes_total) << " on " << t.nodes_reporting << " of " << nodes.size()
       << " live nodes";
  if (t.total.samples_failed > 0) out_ << "; " << t.total.samples_failed << " samples failed";
  out_ << "\n";
  if (!progress.empty()) {
    std::vector<std::vector<std::string>> rows = {{"NODE", "CHUNKS", "BYTES", "FAILED", "LIVE"}};
    for (const auto& [node, p] : progress) {
      const std::string& id = node;  // (clang 14 cannot capture a structured binding)
      const bool live =
          std::any_of(nodes.begin(), nodes.end(), [&](const NodeRecord& n) { return n.id == id; });
      rows.push_back({node, std::to_string(p.chunks_staged) + "/" + std::to_string(p.chunks_total),
                      HumanBytes(p.bytes_staged) + "/" + HumanBytes(p.bytes_total),
                      std::to_string(p.samples_failed), live ? "yes" : "no"});
    }
    out_ << "\n";
    PrintTable(out_, rows);
  }
  return Status::Ok();
}

Status Cli::DatasetDelete(const std::string& name) {
  GRANARY_RETURN_IF_ERROR(Open());
  GRANARY_RETURN_IF_ERROR(store_->DeleteDataset(name));
  if (json_output()) {
    out_ << json{{"name", name}, {"deleted", true}}.dump(2) << "\n";
  } else {
    out_ << "dataset " << name << " deleted; the cache nodes drop its chunks within a heartbeat\n";
  }
  return Status::Ok();
}

Status Cli::DatasetStage(const std::string& name) {
  GRANARY_RETURN_IF_ERROR(Open());
  GRANARY_ASSIGN_OR_RETURN(DatasetRecord d, store_->GetDataset(name));
  if (d.manifest_id.empty()) return Snapshot(d);
  if (d.state.phase == DatasetPhase::kStaging || d.state.phase == DatasetPhase::kReady) {
    out_ << "dataset " << name << " is " << DatasetPhaseName(d.state.phase) << " already\n";
    return Status::Ok();
  }
  GRANARY_ASSIGN_OR_RETURN(d, Update(name, [](DatasetRecord& r) {
                             r.state = {DatasetPhase::kStaging, "staging resumed"};
                           }));
  if (json_output()) {
    out_ << DatasetJson(d).dump(2) << "\n";
  } else {
    out_ << "dataset " << name << ": staging\n";
  }
  return Status::Ok();
}

Status Cli::DatasetWait(const std::string& name) {
  Result<std::chrono::milliseconds> timeout = ParseDuration(timeout_);
  if (!timeout.ok()) return Status::InvalidArgument("--timeout: " + timeout.status().message());
  if (wait_for_ != "ready" && wait_for_ != "staging") {
    return Status::InvalidArgument("--for " + Quoted(wait_for_) + ": write ready or staging");
  }
  GRANARY_RETURN_IF_ERROR(Open());
  const auto start = SteadyClock::now();
  const auto deadline = start + *timeout;
  uint64_t first_bytes = 0;
  bool have_first = false;
  for (;;) {
    GRANARY_ASSIGN_OR_RETURN(DatasetRecord d, store_->GetDataset(name));
    GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, store_->ListNodes(d.spec.pool));
    Result<std::map<std::string, StagingProgress>> progress = store_->ListProgress(name);
    const ProgressSummary t =
        progress.ok() ? SummarizeProgress(*progress, nodes) : ProgressSummary{};
    const double elapsed = std::chrono::duration<double>(SteadyClock::now() - start).count();
    if (!have_first) {
      first_bytes = t.total.bytes_staged;
      have_first = true;
    }
    const double rate = elapsed > 0.5
                            ? static_cast<double>(t.total.bytes_staged -
                                                  std::min(t.total.bytes_staged, first_bytes)) /
                                  elapsed
                            : 0.0;
    const double eta =
        rate > 0 ? static_cast<double>(t.total.bytes_total - t.total.bytes_staged) / rate : -1;
    const bool done = d.state.phase == DatasetPhase::kReady ||
                      (wait_for_ == "staging" && d.state.phase == DatasetPhase::kStaging);
    const int width = 30;
    const int filled = static_cast<int>(t.fraction() * width);
    std::ostringstream bar;
    bar << name << " [" << std::string(static_cast<size_t>(filled), '#')
        << std::string(static_cast<size_t>(width - filled), '.') << "] " << std::fixed
        << std::setprecision(1) << 100 * t.fraction() << "%  " << HumanBytes(t.total.bytes_staged)
        << "/" << HumanBytes(t.total.bytes_total) << "  " << HumanBytes(static_cast<uint64_t>(rate))
        << "/s  ETA " << (done ? "0s" : HumanDuration(eta)) << "  "
        << DatasetPhaseName(d.state.phase);
    Progress(bar.str(), done || d.state.phase == DatasetPhase::kFailed);
    if (done) {
      if (json_output()) {
        json j = DatasetJson(d);
        j["progress"] = ProgressJson(t);
        j["waited_seconds"] = elapsed;
        out_ << j.dump(2) << "\n";
      } else {
        out_ << "dataset " << name << " is " << DatasetPhaseName(d.state.phase) << ": "
             << d.state.message << "\n";
      }
      return Status::Ok();
    }
    if (d.state.phase == DatasetPhase::kFailed) {
      return Status::FailedPrecondition("dataset " + Quoted(name) + " failed: " + d.state.message);
    }
    if (d.state.phase == DatasetPhase::kDeleting) {
      return Status::FailedPrecondition("dataset " + Quoted(name) + " is being deleted");
    }
    if (SteadyClock::now() >= deadline) {
      return Status::DeadlineExceeded("dataset " + Quoted(name) + " is still " +
                                      std::string(DatasetPhaseName(d.state.phase)) + " after " +
                                      timeout_ + ": " + d.state.message);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

Status Cli::NodeList() {
  GRANARY_RETURN_IF_ERROR(Open());
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, store_->ListNodes(pool_filter_));
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  if (json_output()) {
    json list = json::array();
    for (const NodeRecord& n : nodes) {
      list.push_back({{"id", n.id},
                      {"pool", n.pool},
                      {"address", n.address},
                      {"capacity_bytes", n.capacity_bytes},
                      {"used_bytes", n.used_bytes},
                      {"started_ms", n.started_ms},
                      {"heartbeat_ms", n.heartbeat_ms}});
    }
    out_ << list.dump(2) << "\n";
    return Status::Ok();
  }
  if (nodes.empty()) {
    out_ << "no live cache nodes" << (pool_filter_.empty() ? "" : " in pool " + pool_filter_)
         << "; start granary-cachenode on the GPU hosts (docs/cachenode.md)\n";
    return Status::Ok();
  }
  std::vector<std::vector<std::string>> rows = {
      {"NODE", "POOL", "ADDRESS", "USED", "CAPACITY", "UP", "LAST HEARTBEAT"}};
  for (const NodeRecord& n : nodes) {
    rows.push_back({n.id, n.pool, n.address, HumanBytes(n.used_bytes), HumanBytes(n.capacity_bytes),
                    HumanDuration(static_cast<double>(now_ms - n.started_ms) / 1000),
                    HumanDuration(static_cast<double>(now_ms - n.heartbeat_ms) / 1000) + " ago"});
  }
  PrintTable(out_, rows);
  return Status::Ok();
}

Status Cli::PlanShow(const std::string& name) {
  GRANARY_RETURN_IF_ERROR(Open());
  GRANARY_ASSIGN_OR_RETURN(std::vector<PlanRecord> plans, store_->ListPlans(name));
  if (json_output()) {
    json list = json::array();
    for (const PlanRecord& p : plans) {
      list.push_back({{"plan_id", p.plan_id},
                      {"seed", p.seed},
                      {"first_epoch", p.first_epoch},
                      {"world_size", p.world_size},
                      {"batch_size", p.batch_size},
                      {"drop_last", p.drop_last},
                      {"mode", p.mode},
                      {"window_chunks", p.window_chunks},
                      {"registered_ms", p.registered_ms}});
    }
    out_ << list.dump(2) << "\n";
    return Status::Ok();
  }
  if (plans.empty()) {
    out_ << "no plans registered for dataset " << name
         << "; the cache nodes stage it in chunk order\n";
    return Status::Ok();
  }
  std::vector<std::vector<std::string>> rows = {
      {"PLAN", "MODE", "SEED", "EPOCH", "WORLD", "BATCH", "DROP_LAST"}};
  for (const PlanRecord& p : plans) {
    rows.push_back({p.plan_id, p.mode, std::to_string(p.seed), std::to_string(p.first_epoch),
                    std::to_string(p.world_size), std::to_string(p.batch_size),
                    p.drop_last ? "yes" : "no"});
  }
  PrintTable(out_, rows);
  return Status::Ok();
}

Status Cli::ClusterStatus() {
  GRANARY_RETURN_IF_ERROR(Open());
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, store_->ListNodes(""));
  GRANARY_ASSIGN_OR_RETURN(std::vector<DatasetRecord> datasets, store_->ListDatasets());
  std::map<std::string, std::pair<uint64_t, uint64_t>> pools;  // pool -> used, capacity
  for (const NodeRecord& n : nodes) {
    pools[n.pool].first += n.used_bytes;
    pools[n.pool].second += n.capacity_bytes;
  }
  json j = {{"store", store_->url()}, {"nodes", nodes.size()}};
  json pool_list = json::array();
  std::vector<std::vector<std::string>> pool_rows = {{"POOL", "NODES", "USED", "CAPACITY"}};
  for (const auto& [pool, usage] : pools) {
    const std::string& name = pool;  // (clang 14 cannot capture a structured binding)
    const auto count = std::count_if(nodes.begin(), nodes.end(),
                                     [&](const NodeRecord& n) { return n.pool == name; });
    pool_list.push_back({{"pool", pool},
                         {"nodes", count},
                         {"used_bytes", usage.first},
                         {"capacity_bytes", usage.second}});
    pool_rows.push_back(
        {pool, std::to_string(count), HumanBytes(usage.first), HumanBytes(usage.second)});
  }
  j["pools"] = pool_list;
  json dataset_list = json::array();
  std::vector<std::vector<std::string>> dataset_rows = {{"DATASET", "PHASE", "STAGED", "MESSAGE"}};
  for (const DatasetRecord& d : datasets) {
    Result<std::map<std::string, StagingProgress>> progress = store_->ListProgress(d.name);
    const ProgressSummary t =
        progress.ok() ? SummarizeProgress(*progress, nodes) : ProgressSummary{};
    dataset_list.push_back({{"name", d.name},
                            {"phase", DatasetPhaseName(d.state.phase)},
                            {"message", d.state.message},
                            {"progress", ProgressJson(t)}});
    std::ostringstream staged;
    staged << std::fixed << std::setprecision(1) << 100 * t.fraction() << "% of "
           << HumanBytes(t.total.bytes_total);
    dataset_rows.push_back(
        {d.name, std::string(DatasetPhaseName(d.state.phase)), staged.str(), d.state.message});
  }
  j["datasets"] = dataset_list;
  if (json_output()) {
    out_ << j.dump(2) << "\n";
    return Status::Ok();
  }
  out_ << "store: " << store_->url() << "\n"
       << "nodes: " << nodes.size() << " live\n\n";
  if (pools.empty()) {
    out_ << "no live cache nodes: start granary-cachenode on the GPU hosts\n";
  } else {
    PrintTable(out_, pool_rows);
  }
  out_ << "\n";
  if (datasets.empty()) {
    out_ << "no datasets: `granary dataset create NAME --source DIR` makes one\n";
  } else {
    PrintTable(out_, dataset_rows);
  }
  return Status::Ok();
}

int Cli::Run(const std::vector<std::string>& args) {
  CLI::App app{"granary: datasets staged next to the GPUs.\n" + std::string(kExitCodes), "granary"};
  app.require_subcommand(1);
  // Global options may also follow the subcommand (`granary dataset list -o json`).
  app.fallthrough();
  app.add_option("--store", store_url_,
                 "Metadata store URL (redis://host:port or sqlite:///path); default "
                 "$GRANARY_STORE, else " +
                     DefaultStoreUrl());
  app.add_option("-o,--output", output_, "Output format: human or json")
      ->check(CLI::IsMember({"human", "json"}));

  CLI::App* dataset = app.add_subcommand("dataset", "Create, snapshot, watch and delete datasets");
  dataset->require_subcommand(1);
  CLI::App* create = dataset->add_subcommand("create", "Create a dataset and snapshot its source");
  create->add_option("name", name_, "Dataset name (DNS-1123 label: a-z, 0-9, -)")->required();
  create->add_option("-s,--source", source_, "Source directory (absolute path or file:// URI)")
      ->required();
  create->add_option("--include", include_, "Glob of files to include (repeatable)");
  create->add_option("--exclude", exclude_, "Glob of files or directories to exclude (repeatable)");
  create->add_option("--chunk-size", chunk_size_, "Chunk size, e.g. 64MiB");
  create->add_option("--pool", pool_, "Cache pool that stages it");
  create->add_option("--replication", replication_, "Cache nodes holding each chunk");
  create->add_option("--owner", owner_, "UID:GID whose rights read the source (root only)");
  create->add_flag("--no-snapshot", no_snapshot_, "Create the record only");
  create->add_option("--walk-threads", walk_threads_, "Directory walkers of the snapshot")
      ->check(CLI::Range(1u, 256u));
  std::string target;
  CLI::App* snapshot = dataset->add_subcommand("snapshot", "Take (or re-take) a snapshot");
  snapshot->add_option("name", target, "Dataset name")->required();
  CLI::App* list = dataset->add_subcommand("list", "List datasets with their staging progress");
  CLI::App* show = dataset->add_subcommand("show", "Show a dataset and its progress per node");
  show->add_option("name", target, "Dataset name")->required();
  CLI::App* remove = dataset->add_subcommand("delete", "Delete a dataset and its cached data");
  remove->add_option("name", target, "Dataset name")->required();
  CLI::App* stage = dataset->add_subcommand("stage", "Resume staging (snapshot first if needed)");
  stage->add_option("name", target, "Dataset name")->required();
  CLI::App* wait = dataset->add_subcommand("wait", "Wait until a dataset is Ready, with progress");
  wait->add_option("name", target, "Dataset name")->required();
  wait->add_option("--timeout", timeout_, "Give up after this long (exit 5), e.g. 30m");
  wait->add_option("--for", wait_for_, "ready (default) or staging");

  CLI::App* node = app.add_subcommand("node", "Cache nodes");
  node->require_subcommand(1);
  CLI::App* node_list = node->add_subcommand("list", "List the live cache nodes");
  node_list->add_option("--pool", pool_filter_, "Only this pool");

  CLI::App* plan = app.add_subcommand("plan", "Registered read plans");
  plan->require_subcommand(1);
  CLI::App* plan_show = plan->add_subcommand("show", "List the plans registered for a dataset");
  plan_show->add_option("name", target, "Dataset name")->required();

  CLI::App* status = app.add_subcommand("status", "Cluster overview: nodes, capacity, datasets");

  // An unknown command gets named (CLI11 would only say one is required).
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--store" || a == "-o" || a == "--output") {
      ++i;
      continue;
    }
    if (a.rfind("-", 0) == 0) continue;
    if (a != "dataset" && a != "node" && a != "plan" && a != "status") {
      err_ << "granary: unknown command " << Quoted(a)
           << "; the commands are dataset, node, plan and status (granary --help)\n";
      return kCliUsage;
    }
    break;
  }
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e, out_, err_);
    return code == 0 ? kCliOk : kCliUsage;
  }

  Status result;
  if (create->parsed()) {
    result = DatasetCreate();
  } else if (snapshot->parsed()) {
    result = DatasetSnapshot(target);
  } else if (list->parsed()) {
    result = DatasetList();
  } else if (show->parsed()) {
    result = DatasetShow(target);
  } else if (remove->parsed()) {
    result = DatasetDelete(target);
  } else if (stage->parsed()) {
    result = DatasetStage(target);
  } else if (wait->parsed()) {
    result = DatasetWait(target);
  } else if (node_list->parsed()) {
    result = NodeList();
  } else if (plan_show->parsed()) {
    result = PlanShow(target);
  } else if (status->parsed()) {
    result = ClusterStatus();
  }
  return Finish(result);
}

}  // namespace

std::string DefaultStoreUrl() {
  if (geteuid() == 0) return "sqlite:///var/lib/granary/granary.db";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') {
    return std::string("sqlite://") + home + "/.local/state/granary/granary.db";
  }
  return "sqlite:///tmp/granary-" + std::to_string(geteuid()) + "/granary.db";
}

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           bool interactive) {
  Cli cli(out, err, interactive);
  return cli.Run(args);
}

}  // namespace granary
