// `granary node list`, `granary plan show`, `granary status` (docs/cli.md):
// what the store says about the cluster.

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_context.h"
#include "granary/core/file.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "granary/peer/peer_auth.h"

namespace granary::cli {
namespace {

Status NodeList(CliContext& c, const std::string& pool) {
  GRANARY_RETURN_IF_ERROR(c.OpenExistingStore());
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, c.store().ListNodes(pool));
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  if (c.json_output()) {
    Json list = Json::array();
    for (const NodeRecord& n : nodes) {
      list.push_back({{"id", n.id},
                      {"pool", n.pool},
                      {"address", n.address},
                      {"capacity_bytes", n.capacity_bytes},
                      {"used_bytes", n.used_bytes},
                      {"started_ms", n.started_ms},
                      {"heartbeat_ms", n.heartbeat_ms}});
    }
    c.out() << list.dump(2) << "\n";
    return Status::Ok();
  }
  if (nodes.empty()) {
    c.out() << "no live cache nodes" << (pool.empty() ? "" : " in pool " + pool)
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
  PrintTable(c.out(), rows);
  return Status::Ok();
}

Status PlanShow(CliContext& c, const std::string& name) {
  GRANARY_RETURN_IF_ERROR(c.OpenExistingStore());
  GRANARY_ASSIGN_OR_RETURN(std::vector<PlanRecord> plans, c.store().ListPlans(name));
  if (c.json_output()) {
    Json list = Json::array();
    for (const PlanRecord& p : plans) {
      GRANARY_ASSIGN_OR_RETURN(std::string document, PlanRecordJson(p));
      list.push_back(Json::parse(document));
    }
    c.out() << list.dump(2) << "\n";
    return Status::Ok();
  }
  if (plans.empty()) {
    c.out() << "no plans registered for dataset " << name
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
  PrintTable(c.out(), rows);
  return Status::Ok();
}

Status ClusterStatus(CliContext& c) {
  GRANARY_RETURN_IF_ERROR(c.OpenExistingStore());
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, c.store().ListNodes(""));
  GRANARY_ASSIGN_OR_RETURN(std::vector<DatasetRecord> datasets, c.store().ListDatasets());
  std::map<std::string, std::pair<uint64_t, uint64_t>> pools;  // pool -> used, capacity
  for (const NodeRecord& n : nodes) {
    pools[n.pool].first += n.used_bytes;
    pools[n.pool].second += n.capacity_bytes;
  }
  Json j = {{"store", c.store().url()}, {"nodes", nodes.size()}};
  Json pool_list = Json::array();
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
  Json dataset_list = Json::array();
  std::vector<std::vector<std::string>> dataset_rows = {{"DATASET", "PHASE", "STAGED", "MESSAGE"}};
  for (const DatasetRecord& d : datasets) {
    Result<std::map<std::string, StagingProgress>> progress = c.store().ListProgress(d.name);
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
  if (c.json_output()) {
    c.out() << j.dump(2) << "\n";
    return Status::Ok();
  }
  c.out() << "store: " << c.store().url() << "\n"
          << "nodes: " << nodes.size() << " live\n\n";
  if (pools.empty()) {
    c.out() << "no live cache nodes: start granary-cachenode on the GPU hosts\n";
  } else {
    PrintTable(c.out(), pool_rows);
  }
  c.out() << "\n";
  if (datasets.empty()) {
    c.out() << "no datasets: `granary dataset create NAME --source DIR` makes one\n";
  } else {
    PrintTable(c.out(), dataset_rows);
  }
  return Status::Ok();
}

// Writes a fresh cluster key to `out` (mode 0600), never over an existing
// file unless `force`.
Status ClusterKeyGenerate(CliContext& c, const std::string& out, bool force) {
  if (out.empty() || out.front() != '/') {
    return Status::InvalidArgument("--out " + Quoted(out) +
                                   " is not an absolute path; write e.g. /etc/granary/cluster.key");
  }
  struct stat st {};
  if (!force && ::lstat(out.c_str(), &st) == 0) {
    return Status::AlreadyExists(
        Quoted(out) +
        " exists; a new key there would lock out every node and client using the "
        "old one. To rotate, follow docs/security.md (\"Rotating the cluster "
        "key\"); to replace it anyway, add --force");
  }
  GRANARY_ASSIGN_OR_RETURN(std::string hex, GenerateClusterKeyHex());
  std::error_code ignored;  // WriteFileAtomically names the failure if the directory is missing
  std::filesystem::create_directories(std::filesystem::path(out).parent_path(), ignored);
  GRANARY_RETURN_IF_ERROR(WriteFileAtomically(out, hex + "\n", 0600));
  GRANARY_ASSIGN_OR_RETURN(ClusterKeys keys, ClusterKeys::Load(out));
  if (c.json_output()) {
    c.out() << Json{{"path", out}, {"key_id", KeyIdHex(keys.current_id())}}.dump() << "\n";
  } else {
    c.out() << "wrote a new cluster key (id " << KeyIdHex(keys.current_id()) << ") to " << out
            << " (mode 0600); copy it to every cache node, Slurm node and admin host, readable "
               "by root only, and set cluster_key_file in their configurations\n";
  }
  return Status::Ok();
}

}  // namespace

void AddClusterKeyCommand(CLI::App& app, CliContext& context) {
  struct State {
    std::string out = kDefaultClusterKeyFile;
    bool force = false;
  };
  State* state = context.Keep(std::make_unique<State>());
  CLI::App* key =
      app.add_subcommand("cluster-key", "The cluster key cache nodes authenticate with");
  key->require_subcommand(1);
  CLI::App* generate = key->add_subcommand("generate", "Write a new cluster key file (mode 0600)");
  generate->add_option("--out", state->out, "Where to write it")->capture_default_str();
  generate->add_flag("--force", state->force, "Replace an existing file");
  context.OnParsed(generate, [&context, state] {
    return ClusterKeyGenerate(context, state->out, state->force);
  });
}

void AddNodeCommand(CLI::App& app, CliContext& context) {
  std::string* pool = context.Keep(std::make_unique<std::string>());
  CLI::App* node = app.add_subcommand("node", "Cache nodes");
  node->require_subcommand(1);
  CLI::App* list = node->add_subcommand("list", "List the live cache nodes");
  list->add_option("--pool", *pool, "Only this pool");
  context.OnParsed(list, [&context, pool] { return NodeList(context, *pool); });
}

void AddPlanCommand(CLI::App& app, CliContext& context) {
  std::string* name = context.Keep(std::make_unique<std::string>());
  CLI::App* plan = app.add_subcommand("plan", "Registered read plans");
  plan->require_subcommand(1);
  CLI::App* show = plan->add_subcommand("show", "List the plans registered for a dataset");
  show->add_option("name", *name, "Dataset name")->required();
  context.OnParsed(show, [&context, name] { return PlanShow(context, *name); });
}

void AddStatusCommand(CLI::App& app, CliContext& context) {
  CLI::App* status = app.add_subcommand("status", "Cluster overview: nodes, capacity, datasets");
  context.OnParsed(status, [&context] { return ClusterStatus(context); });
}

}  // namespace granary::cli
