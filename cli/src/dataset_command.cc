// `granary dataset create|snapshot|list|show|delete|stage|place|wait|grant|revoke|update`
// (docs/cli.md).
//
// Kept whole at about 800 lines: its one job is the `granary dataset`
// subcommands. They are members of one DatasetCommand whose option members
// CLI11 fills, they call one another (create takes the snapshot and then
// waits; stage snapshots first if needed) and they share the compare-and-set
// update of the record; split by subcommand, each file would hold a fragment
// of that one class.

#include <sys/stat.h>
#include <sys/types.h>
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
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cache_options.h"
#include "cli_context.h"
#include "granary/core/config.h"
#include "granary/core/manifest.h"
#include "granary/core/manifest_builder.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "granary/source/posix_source.h"
#include "granary/source/snapshot.h"

namespace granary::cli {
namespace {

// How often `dataset wait` re-reads the store.
constexpr std::chrono::milliseconds kWaitPoll{250};

// "every node of pool P", "node-a, node-b", "no node (readers read the source)".
std::string PlacedOn(const DatasetSpec& spec) {
  if (!spec.nodes.has_value()) return "every node of pool " + spec.pool;
  if (spec.nodes->empty()) return "no node (readers read the source)";
  std::string list;
  for (const std::string& id : *spec.nodes) list += (list.empty() ? "" : ", ") + id;
  return list;
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
  // Not through a symbolic link: the snapshot would refuse it anyway, and a
  // re-pointed link must not swap the tree (docs/source-and-identity.md).
  GRANARY_RETURN_IF_ERROR(RefuseSymlinkInPath(path));
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

// "file:///abs/path" for a path or a file:// URI of a source this host may
// not see (--snapshot-by pool): checked for form only.
Result<std::string> PoolSourceUri(const std::string& source) {
  if (source.rfind("file://", 0) == 0) {
    GRANARY_ASSIGN_OR_RETURN(std::string root, PosixSource::RootFromUri(source));
    (void)root;
    return source;
  }
  if (source.find("://") != std::string::npos) {
    return Status::InvalidArgument("source " + Quoted(source) +
                                   ": only local paths and file:// URIs are supported");
  }
  if (source.empty() || source[0] != '/') {
    return Status::InvalidArgument("source " + Quoted(source) +
                                   " is not an absolute path; write it from / as the cache nodes "
                                   "see it (e.g. /lustre/imagenet/train)");
  }
  return "file://" + source;
}

class DatasetCommand {
 public:
  explicit DatasetCommand(CliContext& context) : c_(context) {}

  void Add(CLI::App& app);

 private:
  Status Create();
  Status TakeSnapshot(const std::string& name);
  Status List();
  Status Show(const std::string& name);
  Status Delete(const std::string& name);
  Status Stage(const std::string& name);
  Status Place(const std::string& name);
  // dataset update: the cache policy.
  Status UpdateCache(const std::string& name);
  // --nodes / --no-nodes / --all-nodes as a DatasetSpec::nodes (create: no
  // option is the whole pool).
  Result<std::optional<std::vector<std::string>>> NodesOption(bool required) const;
  Status Wait(const std::string& name);
  // grant (true) or revoke (false) --user/--group readers.
  Status Readers(const std::string& name, bool grant);

  // Applies `change` to the record with compare-and-set, re-reading on a
  // conflict (a cache node may be writing the message at the same time).
  Result<DatasetRecord> Update(const std::string& name,
                               const std::function<void(DatasetRecord&)>& change);
  Status Snapshot(DatasetRecord record);
  // A dataset its pool snapshots: back to Pending, with `why` as the message.
  Status RequestPoolSnapshot(const std::string& name, const std::string& why);
  // The sample count of the record's current manifest, if it has one that
  // decodes (the expected total of a new snapshot); 0 otherwise.
  uint64_t PreviousFileCount(const DatasetRecord& record);

  CliContext& c_;
  std::string target_;
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
  std::string snapshot_by_ = "client";
  unsigned walk_threads_ = 8;
  std::vector<std::string> nodes_;  // --nodes (comma-separated, repeatable)
  bool no_nodes_ = false;
  bool all_nodes_ = false;
  // dataset wait (and create/stage --wait)
  bool wait_after_ = false;
  std::string timeout_ = "1h";
  std::string wait_for_ = "ready";
  // dataset create|update: the cache policy
  CacheOptions cache_;
  // dataset grant|revoke
  std::vector<std::string> users_;
  std::vector<std::string> groups_;
};

void DatasetCommand::Add(CLI::App& app) {
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
  create->add_option("--nodes", nodes_, "Stage it on these cache nodes of the pool only (ids)")
      ->delimiter(',');
  create->add_flag("--no-nodes", no_nodes_,
                   "Stage it on no node yet (readers read the source; `dataset place` later)");
  create->add_flag("--no-snapshot", no_snapshot_, "Create the record only");
  create->add_option("--snapshot-by", snapshot_by_,
                     "client: walk the source here (the default); pool: a cache node of the pool "
                     "walks it, where the source is mounted (this command does not read it)");
  create->add_option("--walk-threads", walk_threads_, "Directory walkers of the snapshot")
      ->check(CLI::Range(1u, 256u));
  create->add_flag("--wait", wait_after_, "Then wait until it is Ready, with progress");
  create->add_option("--timeout", timeout_, "With --wait: give up after this long (exit 5)");
  cache_.Add(*create);
  c_.OnParsed(create, [this] { return Create(); });

  CLI::App* update =
      dataset->add_subcommand("update", "Change how a dataset keeps its place in a full pool");
  update->add_option("name", target_, "Dataset name")->required();
  cache_.Add(*update);
  c_.OnParsed(update, [this] { return UpdateCache(target_); });

  CLI::App* snapshot = dataset->add_subcommand("snapshot", "Take (or re-take) a snapshot");
  snapshot->add_option("name", target_, "Dataset name")->required();
  c_.OnParsed(snapshot, [this] { return TakeSnapshot(target_); });
  CLI::App* list = dataset->add_subcommand("list", "List datasets with their staging progress");
  c_.OnParsed(list, [this] { return List(); });
  CLI::App* show = dataset->add_subcommand("show", "Show a dataset and its progress per node");
  show->add_option("name", target_, "Dataset name")->required();
  c_.OnParsed(show, [this] { return Show(target_); });
  CLI::App* remove = dataset->add_subcommand("delete", "Delete a dataset and its cached data");
  remove->add_option("name", target_, "Dataset name")->required();
  c_.OnParsed(remove, [this] { return Delete(target_); });
  CLI::App* stage = dataset->add_subcommand("stage", "Resume staging (snapshot first if needed)");
  stage->add_option("name", target_, "Dataset name")->required();
  stage->add_flag("--wait", wait_after_, "Then wait until it is Ready, with progress");
  stage->add_option("--timeout", timeout_, "With --wait: give up after this long (exit 5)");
  c_.OnParsed(stage, [this] { return Stage(target_); });
  CLI::App* place =
      dataset->add_subcommand("place", "Choose the cache nodes of its pool that stage a dataset");
  place->add_option("name", target_, "Dataset name")->required();
  place->add_option("--nodes", nodes_, "These node ids only (comma-separated)")->delimiter(',');
  place->add_flag("--no-nodes", no_nodes_, "No node (readers read the source)");
  place->add_flag("--all-nodes", all_nodes_, "Every node of the pool (the default)");
  c_.OnParsed(place, [this] { return Place(target_); });

  CLI::App* wait = dataset->add_subcommand("wait", "Wait until a dataset is Ready, with progress");
  wait->add_option("name", target_, "Dataset name")->required();
  wait->add_option("--timeout", timeout_, "Give up after this long (exit 5), e.g. 30m");
  wait->add_option("--for", wait_for_, "ready (default) or staging");
  c_.OnParsed(wait, [this] { return Wait(target_); });

  for (const bool grant : {true, false}) {
    CLI::App* access = dataset->add_subcommand(
        grant ? "grant" : "revoke",
        grant ? "Let users or groups read a dataset through a Slurm job (#DW persistentdw)"
              : "Take back what `dataset grant` gave");
    access->add_option("name", target_, "Dataset name")->required();
    access->add_option("--user", users_, "User name or uid (repeatable, comma-separated)")
        ->delimiter(',');
    access->add_option("--group", groups_, "Group name or gid: any member (repeatable)")
        ->delimiter(',');
    c_.OnParsed(access, [this, grant] { return Readers(target_, grant); });
  }
}

Result<DatasetRecord> DatasetCommand::Update(const std::string& name,
                                             const std::function<void(DatasetRecord&)>& change) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    GRANARY_ASSIGN_OR_RETURN(DatasetRecord record, c_.store().GetDataset(name));
    change(record);
    Result<DatasetRecord> updated = c_.store().UpdateDataset(record);
    if (updated.ok() || updated.status().code() != StatusCode::kFailedPrecondition) {
      return updated;
    }
  }
  return Status::FailedPrecondition("dataset " + Quoted(name) +
                                    " kept changing under this update; try again");
}

uint64_t DatasetCommand::PreviousFileCount(const DatasetRecord& record) {
  if (record.manifest_id.empty()) return 0;
  Result<std::string> blob = c_.store().GetManifest(record.manifest_id);
  if (!blob.ok()) return 0;
  Result<Manifest> manifest = Manifest::Decode(*blob);
  return manifest.ok() ? manifest->sample_count() : 0;
}

Status DatasetCommand::Snapshot(DatasetRecord record) {
  const uint64_t expected_files = PreviousFileCount(record);
  DatasetSnapshotOptions options;
  options.walk_threads = walk_threads_;
  const auto start = SteadyClock::now();
  // A re-snapshot expects about as many files as the last one found: that
  // gives the bar and the ETA; a first snapshot shows counts and rate only.
  ProgressMeter meter("snapshot " + record.name, "files", start);
  options.on_progress = [&](uint64_t files, uint64_t dirs) {
    ProgressCounts counts;
    counts.items = files;
    counts.items_total = expected_files > 0 ? std::max(expected_files, files) : 0;
    counts.has_bytes = false;
    c_.Progress(meter.Line(counts, SteadyClock::now(), std::to_string(dirs) + " directories"),
                false);
  };
  // This process is single-threaded: the walk as another owner runs in a
  // fork()ed child (snapshot.h).
  GRANARY_ASSIGN_OR_RETURN(DatasetSnapshot snap, SnapshotDataset(c_.store(), record, options));
  record = snap.record;
  switch (snap.outcome) {
    case SnapshotOutcome::kSnapshotted:
      break;
    case SnapshotOutcome::kFailed:
      return Status(snap.error.code(), "dataset " + Quoted(record.name) + ": " +
                                           SnapshotFailureMessage(record, snap.error, ""));
    default:
      return Status::FailedPrecondition(
          "dataset " + Quoted(record.name) + " changed while its snapshot was taken (it is now " +
          std::string(DatasetPhaseName(record.state.phase)) +
          "); the snapshot was not recorded: look at `granary dataset show " + record.name +
          "` and take it again");
  }
  std::ostringstream rate;
  rate << std::fixed << std::setprecision(1) << snap.seconds << " s";
  c_.Progress("snapshot " + record.name + ": " + snap.summary + " in " + rate.str(), true);
  if (wait_after_) return Wait(record.name);
  if (c_.json_output()) {
    Json j = DatasetJson(record);
    j["snapshot"] = {{"files", snap.files},
                     {"bytes", snap.bytes},
                     {"chunks", snap.chunks},
                     {"seconds", snap.seconds}};
    c_.out() << j.dump(2) << "\n";
  } else {
    c_.out() << "dataset " << record.name << ": " << snap.summary << " (manifest "
             << snap.manifest_id.substr(0, 12) << "); cache nodes of pool " << record.spec.pool
             << " are staging it\n";
  }
  return Status::Ok();
}

Status DatasetCommand::RequestPoolSnapshot(const std::string& name, const std::string& why) {
  GRANARY_ASSIGN_OR_RETURN(DatasetRecord record, Update(name, [&](DatasetRecord& r) {
                             r.state = {DatasetPhase::kPending, why, ""};
                           }));
  if (wait_after_) return Wait(name);
  if (c_.json_output()) {
    c_.out() << DatasetJson(record).dump(2) << "\n";
  } else {
    c_.out() << "dataset " << name << ": Pending; a cache node of pool " << record.spec.pool
             << " takes its snapshot (`granary dataset wait " << name << "` follows it)\n";
  }
  return Status::Ok();
}

Status DatasetCommand::Create() {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(name_));
  if (wait_after_ && no_snapshot_) {
    return Status::InvalidArgument(
        "--wait and --no-snapshot: a dataset without a snapshot "
        "never stages; drop one of them");
  }
  if (wait_after_) {
    Result<std::chrono::milliseconds> timeout = ParseDuration(timeout_);
    if (!timeout.ok()) return Status::InvalidArgument("--timeout: " + timeout.status().message());
  }
  if (snapshot_by_ != "client" && snapshot_by_ != "pool") {
    return Status::InvalidArgument("--snapshot-by " + Quoted(snapshot_by_) +
                                   ": write client (this command walks the source) or pool (a "
                                   "cache node of the pool does)");
  }
  const bool by_pool = snapshot_by_ == "pool";
  if (by_pool && no_snapshot_) {
    return Status::InvalidArgument(
        "--no-snapshot and --snapshot-by pool: the cache nodes snapshot a Pending dataset of "
        "their pool at once; drop one of them");
  }
  DatasetRecord record;
  record.name = name_;
  if (by_pool) {
    // The source is mounted where the cache nodes run, not necessarily here.
    GRANARY_ASSIGN_OR_RETURN(record.spec.source_uri, PoolSourceUri(source_));
    record.spec.snapshot_by = SnapshotBy::kPool;
  } else {
    GRANARY_ASSIGN_OR_RETURN(record.spec.source_uri, NormalizeSource(source_));
  }
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
  GRANARY_ASSIGN_OR_RETURN(record.spec.nodes, NodesOption(false));
  GRANARY_ASSIGN_OR_RETURN(record.spec.cache, cache_.Apply(DatasetCacheSpec()));
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
  record.state = {
      DatasetPhase::kPending,
      by_pool ? "created; waiting for a cache node of pool " + pool_ + " to take its snapshot"
              : "created",
      ""};
  GRANARY_RETURN_IF_ERROR(c_.OpenStore());
  Result<DatasetRecord> created = c_.store().CreateDataset(record);
  if (!created.ok()) {
    if (created.status().code() == StatusCode::kAlreadyExists) {
      return Status::AlreadyExists("dataset " + Quoted(name_) +
                                   " exists; choose another name, or `granary dataset delete " +
                                   name_ + "` first");
    }
    return created.status();
  }
  if (no_snapshot_) {
    if (c_.json_output()) {
      c_.out() << DatasetJson(*created).dump(2) << "\n";
    } else {
      c_.out() << "dataset " << name_ << " created (Pending); `granary dataset snapshot " << name_
               << "` takes its snapshot\n";
    }
    return Status::Ok();
  }
  if (by_pool) {
    if (wait_after_) return Wait(name_);
    if (c_.json_output()) {
      c_.out() << DatasetJson(*created).dump(2) << "\n";
    } else {
      c_.out() << "dataset " << name_ << " created (Pending); a cache node of pool " << pool_
               << " takes its snapshot (`granary dataset wait " << name_ << "` follows it)\n";
    }
    return Status::Ok();
  }
  return Snapshot(*created);
}

Status DatasetCommand::TakeSnapshot(const std::string& name) {
  GRANARY_RETURN_IF_ERROR(c_.OpenStore());
  GRANARY_ASSIGN_OR_RETURN(DatasetRecord record, c_.store().GetDataset(name));
  if (record.spec.snapshot_by == SnapshotBy::kPool) {
    // The walk belongs to the pool: ask for it. A walk in progress is
    // abandoned by its node (the spec may have changed since it started).
    return RequestPoolSnapshot(name, "new snapshot requested");
  }
  if (record.state.phase == DatasetPhase::kSnapshotting) {
    return Status::FailedPrecondition("dataset " + Quoted(name) +
                                      " is being snapshotted already; wait for it");
  }
  return Snapshot(record);
}

Status DatasetCommand::List() {
  GRANARY_RETURN_IF_ERROR(c_.OpenExistingStore());
  GRANARY_ASSIGN_OR_RETURN(std::vector<DatasetRecord> datasets, c_.store().ListDatasets());
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, c_.store().ListNodes(""));
  Json list = Json::array();
  std::vector<std::vector<std::string>> rows = {{"NAME", "PHASE", "POOL", "STAGED", "SOURCE"}};
  for (const DatasetRecord& d : datasets) {
    Result<std::map<std::string, StagingProgress>> progress = c_.store().ListProgress(d.name);
    const ProgressSummary t =
        progress.ok() ? SummarizeProgress(*progress, nodes) : ProgressSummary{};
    Json j = DatasetJson(d);
    j["progress"] = ProgressJson(t);
    list.push_back(j);
    std::ostringstream staged;
    staged << std::fixed << std::setprecision(1) << 100 * t.fraction() << "%";
    rows.push_back({d.name, std::string(DatasetPhaseName(d.state.phase)), d.spec.pool, staged.str(),
                    d.spec.source_uri});
  }
  if (c_.json_output()) {
    c_.out() << list.dump(2) << "\n";
  } else if (datasets.empty()) {
    c_.out() << "no datasets; `granary dataset create NAME --source DIR` makes one\n";
  } else {
    PrintTable(c_.out(), rows);
  }
  return Status::Ok();
}

Status DatasetCommand::Show(const std::string& name) {
  GRANARY_RETURN_IF_ERROR(c_.OpenExistingStore());
  GRANARY_ASSIGN_OR_RETURN(DatasetRecord d, c_.store().GetDataset(name));
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, c_.store().ListNodes(d.spec.pool));
  GRANARY_ASSIGN_OR_RETURN(auto progress, c_.store().ListProgress(name));
  GRANARY_ASSIGN_OR_RETURN(std::vector<PlanRecord> plans, c_.store().ListPlans(name));
  const ProgressSummary t = SummarizeProgress(progress, nodes);
  std::ostream& out = c_.out();
  if (c_.json_output()) {
    Json j = DatasetJson(d);
    j["progress"] = ProgressJson(t);
    Json per_node = Json::object();
    for (const auto& [node, p] : progress) {
      per_node[node] = {
          {"chunks_total", p.chunks_total},       {"chunks_staged", p.chunks_staged},
          {"bytes_total", p.bytes_total},         {"bytes_staged", p.bytes_staged},
          {"samples_failed", p.samples_failed},   {"updated_ms", p.updated_ms},
          {"chunks_not_kept", p.chunks_not_kept}, {"bytes_not_kept", p.bytes_not_kept},
          {"last_read_ms", p.last_read_ms}};
    }
    j["nodes"] = per_node;
    j["plans"] = plans.size();
    out << j.dump(2) << "\n";
    return Status::Ok();
  }
  out << "name:        " << d.name << "\n"
      << "phase:       " << DatasetPhaseName(d.state.phase) << "\n"
      << "message:     " << d.state.message << "\n"
      << "source:      " << d.spec.source_uri << "\n"
      << "pool:        " << d.spec.pool << " (replication " << d.spec.replication << ")\n"
      << "placed on:   " << PlacedOn(d.spec) << "\n"
      << "chunk size:  " << HumanBytes(d.spec.chunk_size) << "\n"
      << "snapshot by: "
      << (d.spec.snapshot_by == SnapshotBy::kPool ? "the cache nodes of pool " + d.spec.pool
                                                  : std::string("the client"))
      << (d.state.claimed_by.empty() ? "" : " (node " + d.state.claimed_by + " is walking it)")
      << "\n"
      << "owner:       uid " << d.owner.uid << " gid " << d.owner.gid << "\n"
      << "readers:     " << ReadersText(d) << "\n"
      << "cache:       " << CacheText(d.spec.cache) << "\n"
      << "manifest:    " << (d.manifest_id.empty() ? "(none yet)" : d.manifest_id) << "\n"
      << "plans:       " << plans.size() << "\n"
      << "staged:      " << HumanBytes(t.total.bytes_staged) << " of "
      << HumanBytes(t.total.bytes_total) << " on " << t.nodes_reporting << " of " << nodes.size()
      << " live nodes";
  if (t.total.samples_failed > 0) out << "; " << t.total.samples_failed << " samples failed";
  out << "\n";
  out << "resident:    " << static_cast<int>(t.resident_fraction() * 100) << "% ("
      << HumanBytes(t.total.bytes_staged) << " of " << HumanBytes(t.total.bytes_total) << ")";
  if (!t.all_kept) {
    out << "; the nodes keep " << HumanBytes(t.total.bytes_kept())
        << " under their cache budgets and stream the rest from the source";
  }
  out << "\n";
  if (!progress.empty()) {
    std::vector<std::vector<std::string>> rows = {
        {"NODE", "CHUNKS", "BYTES", "KEPT", "FAILED", "LIVE"}};
    for (const auto& [node, p] : progress) {
      const std::string& id = node;  // (clang 14 cannot capture a structured binding)
      const bool live =
          std::any_of(nodes.begin(), nodes.end(), [&](const NodeRecord& n) { return n.id == id; });
      rows.push_back({node, std::to_string(p.chunks_staged) + "/" + std::to_string(p.chunks_total),
                      HumanBytes(p.bytes_staged) + "/" + HumanBytes(p.bytes_total),
                      HumanBytes(p.bytes_kept()), std::to_string(p.samples_failed),
                      live ? "yes" : "no"});
    }
    out << "\n";
    PrintTable(out, rows);
  }
  return Status::Ok();
}

Status DatasetCommand::UpdateCache(const std::string& name) {
  if (!cache_.any()) {
    return Status::InvalidArgument(
        "say what to change: --priority, --pin, --no-pin, --ttl, --min-resident or "
        "--max-resident");
  }
  GRANARY_ASSIGN_OR_RETURN(DatasetCacheSpec checked, cache_.Apply(DatasetCacheSpec()));
  (void)checked;  // the values are good: refused before the store is opened
  GRANARY_RETURN_IF_ERROR(c_.OpenExistingStore());
  Status applied = Status::Ok();
  GRANARY_ASSIGN_OR_RETURN(DatasetRecord record, Update(name, [&](DatasetRecord& r) {
                             Result<DatasetCacheSpec> cache = cache_.Apply(r.spec.cache);
                             if (cache.ok()) {
                               r.spec.cache = *cache;
                             } else {
                               applied = cache.status();
                             }
                           }));
  GRANARY_RETURN_IF_ERROR(applied);
  if (c_.json_output()) {
    c_.out() << DatasetJson(record).dump(2) << "\n";
  } else {
    c_.out() << "dataset " << name << ": cache " << CacheText(record.spec.cache)
             << "; the cache nodes of pool " << record.spec.pool
             << " apply it on their next pass\n";
  }
  return Status::Ok();
}

Result<std::optional<std::vector<std::string>>> DatasetCommand::NodesOption(bool required) const {
  const int given = (nodes_.empty() ? 0 : 1) + (no_nodes_ ? 1 : 0) + (all_nodes_ ? 1 : 0);
  if (given > 1) {
    return Status::InvalidArgument("--nodes, --no-nodes and --all-nodes: choose one");
  }
  if (given == 0) {
    if (required) {
      return Status::InvalidArgument(
          "say where: --nodes ID,ID (those cache nodes of its pool), --no-nodes (none: readers "
          "read the source) or --all-nodes (every node of the pool)");
    }
    return std::optional<std::vector<std::string>>();
  }
  if (all_nodes_) return std::optional<std::vector<std::string>>();
  if (no_nodes_) return std::optional<std::vector<std::string>>(std::vector<std::string>());
  std::vector<std::string> ids;
  for (const std::string& id : nodes_) {
    Status valid = ValidateNodeId(id);
    if (!valid.ok()) return valid.WithContext("--nodes");
    if (std::find(ids.begin(), ids.end(), id) != ids.end()) {
      return Status::InvalidArgument("--nodes names " + Quoted(id) + " twice");
    }
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return std::optional<std::vector<std::string>>(std::move(ids));
}

Status DatasetCommand::Place(const std::string& name) {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(name));
  GRANARY_ASSIGN_OR_RETURN(std::optional<std::vector<std::string>> nodes, NodesOption(true));
  GRANARY_RETURN_IF_ERROR(c_.OpenStore());
  GRANARY_ASSIGN_OR_RETURN(DatasetRecord record,
                           Update(name, [&](DatasetRecord& r) { r.spec.nodes = nodes; }));
  // Named nodes that are not live in the pool are allowed (a job's nodes may
  // start their cache node later), but said.
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> live, c_.store().ListNodes(record.spec.pool));
  std::vector<std::string> absent;
  if (nodes.has_value()) {
    for (const std::string& id : *nodes) {
      if (std::none_of(live.begin(), live.end(),
                       [&id](const NodeRecord& n) { return n.id == id; })) {
        absent.push_back(id);
      }
    }
  }
  if (c_.json_output()) {
    Json j = DatasetJson(record);
    j["not_live"] = absent;
    c_.out() << j.dump(2) << "\n";
    return Status::Ok();
  }
  c_.out() << "dataset " << name << " placed on " << PlacedOn(record.spec)
           << "; its cache nodes follow within a heartbeat\n";
  if (!absent.empty()) {
    std::string list;
    for (const std::string& id : absent) list += (list.empty() ? "" : ", ") + id;
    c_.err() << "granary: note: not live in pool " << record.spec.pool << " now: " << list
             << " (`granary node list`)\n";
  }
  return Status::Ok();
}

Status DatasetCommand::Delete(const std::string& name) {
  GRANARY_RETURN_IF_ERROR(c_.OpenStore());
  GRANARY_RETURN_IF_ERROR(c_.store().DeleteDataset(name));
  if (c_.json_output()) {
    c_.out() << Json{{"name", name}, {"deleted", true}}.dump(2) << "\n";
  } else {
    c_.out() << "dataset " << name
             << " deleted; the cache nodes drop its chunks within a heartbeat\n";
  }
  return Status::Ok();
}

Status DatasetCommand::Stage(const std::string& name) {
  if (wait_after_) {
    Result<std::chrono::milliseconds> timeout = ParseDuration(timeout_);
    if (!timeout.ok()) return Status::InvalidArgument("--timeout: " + timeout.status().message());
  }
  GRANARY_RETURN_IF_ERROR(c_.OpenStore());
  GRANARY_ASSIGN_OR_RETURN(DatasetRecord d, c_.store().GetDataset(name));
  if (d.manifest_id.empty()) {
    if (d.spec.snapshot_by == SnapshotBy::kPool) {
      if (d.state.phase == DatasetPhase::kPending || d.state.phase == DatasetPhase::kSnapshotting) {
        if (wait_after_) return Wait(name);
        c_.out() << "dataset " << name << " is " << DatasetPhaseName(d.state.phase)
                 << " already: " << d.state.message << "\n";
        return Status::Ok();
      }
      return RequestPoolSnapshot(name, "snapshot requested");
    }
    return Snapshot(d);
  }
  if (d.state.phase == DatasetPhase::kStaging || d.state.phase == DatasetPhase::kReady) {
    if (wait_after_) return Wait(name);
    c_.out() << "dataset " << name << " is " << DatasetPhaseName(d.state.phase) << " already\n";
    return Status::Ok();
  }
  GRANARY_ASSIGN_OR_RETURN(d, Update(name, [](DatasetRecord& r) {
                             r.state = {DatasetPhase::kStaging, "staging resumed", ""};
                           }));
  if (wait_after_) return Wait(name);
  if (c_.json_output()) {
    c_.out() << DatasetJson(d).dump(2) << "\n";
  } else {
    c_.out() << "dataset " << name << ": staging\n";
  }
  return Status::Ok();
}

Status DatasetCommand::Wait(const std::string& name) {
  Result<std::chrono::milliseconds> timeout = ParseDuration(timeout_);
  if (!timeout.ok()) return Status::InvalidArgument("--timeout: " + timeout.status().message());
  if (wait_for_ != "ready" && wait_for_ != "staging") {
    return Status::InvalidArgument("--for " + Quoted(wait_for_) + ": write ready or staging");
  }
  GRANARY_RETURN_IF_ERROR(c_.OpenExistingStore());
  const auto start = SteadyClock::now();
  const auto deadline = start + *timeout;
  ProgressMeter meter(name, "chunks", start);
  for (;;) {
    GRANARY_ASSIGN_OR_RETURN(DatasetRecord d, c_.store().GetDataset(name));
    GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, c_.store().ListNodes(d.spec.pool));
    Result<std::map<std::string, StagingProgress>> progress = c_.store().ListProgress(name);
    const ProgressSummary t =
        progress.ok() ? SummarizeProgress(*progress, nodes) : ProgressSummary{};
    const auto now = SteadyClock::now();
    const double elapsed = std::chrono::duration<double>(now - start).count();
    const bool done = d.state.phase == DatasetPhase::kReady ||
                      (wait_for_ == "staging" && d.state.phase == DatasetPhase::kStaging);
    ProgressCounts counts;
    counts.items = t.total.chunks_staged;
    counts.items_total = t.total.chunks_total;
    counts.bytes = t.total.bytes_staged;
    counts.bytes_total = t.total.bytes_total;
    std::string note(DatasetPhaseName(d.state.phase));
    if (t.total.samples_failed > 0) {
      note += ", " + std::to_string(t.total.samples_failed) + " samples failed";
    }
    if (nodes.empty()) note += ", no live cache node in pool " + d.spec.pool;
    c_.Progress(meter.Line(counts, now, note), done || d.state.phase == DatasetPhase::kFailed);
    if (done) {
      if (c_.json_output()) {
        Json j = DatasetJson(d);
        j["progress"] = ProgressJson(t);
        j["waited_seconds"] = elapsed;
        c_.out() << j.dump(2) << "\n";
      } else {
        c_.out() << "dataset " << name << " is " << DatasetPhaseName(d.state.phase) << ": "
                 << d.state.message << "\n";
      }
      return Status::Ok();
    }
    if (d.state.phase == DatasetPhase::kFailed) {
      // A failed snapshot's message says what to do already.
      const bool snapshot = d.state.message.rfind("snapshot failed:", 0) == 0;
      return Status::FailedPrecondition(
          "dataset " + Quoted(name) + " failed: " + d.state.message +
          (snapshot ? "" : " (fix the cause, then `granary dataset stage " + name + "`)"));
    }
    if (d.state.phase == DatasetPhase::kDeleting) {
      return Status::FailedPrecondition("dataset " + Quoted(name) + " is being deleted");
    }
    if (now >= deadline) {
      return Status::DeadlineExceeded("dataset " + Quoted(name) + " is still " +
                                      std::string(DatasetPhaseName(d.state.phase)) + " after " +
                                      timeout_ + ": " + d.state.message);
    }
    std::this_thread::sleep_for(std::min<SteadyClock::duration>(kWaitPoll, deadline - now));
  }
}

Status DatasetCommand::Readers(const std::string& name, bool grant) {
  const std::string verb = grant ? "grant" : "revoke";
  if (users_.empty() && groups_.empty()) {
    return Status::InvalidArgument("granary dataset " + verb +
                                   ": say whom with --user NAME|UID or --group NAME|GID "
                                   "(repeatable)");
  }
  std::vector<uint32_t> uids;
  std::vector<uint32_t> gids;
  for (const std::string& u : users_) {
    GRANARY_ASSIGN_OR_RETURN(uint32_t uid, UserIdOf("--user", u));
    uids.push_back(uid);
  }
  for (const std::string& g : groups_) {
    GRANARY_ASSIGN_OR_RETURN(uint32_t gid, GroupIdOf("--group", g));
    gids.push_back(gid);
  }
  GRANARY_RETURN_IF_ERROR(c_.OpenExistingStore());
  // Kept sorted and unique, as the record requires.
  auto apply = [grant](std::vector<uint32_t>& ids, const std::vector<uint32_t>& change) {
    for (uint32_t id : change) {
      auto at = std::lower_bound(ids.begin(), ids.end(), id);
      const bool there = at != ids.end() && *at == id;
      if (grant && !there) ids.insert(at, id);
      if (!grant && there) ids.erase(at);
    }
  };
  GRANARY_ASSIGN_OR_RETURN(DatasetRecord d, Update(name, [&](DatasetRecord& r) {
                             apply(r.readers.uids, uids);
                             apply(r.readers.gids, gids);
                           }));
  if (c_.json_output()) {
    c_.out() << DatasetJson(d).dump(2) << "\n";
    return Status::Ok();
  }
  for (uint32_t uid : uids) {
    if (uid == 0 || uid == d.owner.uid) {
      c_.out() << "note: " << UserName(uid) << " (uid " << uid << ") "
               << (uid == 0 ? "is root" : "owns dataset " + name) << " and reads it "
               << (grant ? "without a grant" : "whatever is revoked") << "\n";
    }
  }
  c_.out() << "dataset " << name << " may be read by " << ReadersText(d) << "\n";
  return Status::Ok();
}

}  // namespace

void AddDatasetCommand(CLI::App& app, CliContext& context) {
  context.Keep(std::make_unique<DatasetCommand>(context))->Add(app);
}

}  // namespace granary::cli
