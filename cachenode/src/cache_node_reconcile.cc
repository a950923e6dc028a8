// The cache node's control loop (cache_node_impl.h): each pass reads the
// pool's nodes and datasets and reconciles: datasets activated (manifest,
// source, Stager), re-owned when placement changes, re-staged when plans
// change, dropped when deleted, moved or re-snapshotted; progress and the
// dataset's phase published.

#include <algorithm>
#include <chrono>

#include "cache_node_impl.h"

namespace granary {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::string PlanFingerprint(const std::vector<PlanRecord>& plans) {
  std::string key;
  for (const PlanRecord& p : plans) {
    key += p.plan_id + "/" + std::to_string(p.seed) + "/" + std::to_string(p.first_epoch) + "/" +
           std::to_string(p.world_size) + "/" + std::to_string(p.batch_size) + "/" +
           (p.drop_last ? "1" : "0") + "/" + p.mode + "/" + std::to_string(p.window_chunks) + ";";
  }
  return key;
}

// The order in which the registered plans first read the samples: each plan's
// first epoch, rank by rank in lockstep, oldest plan first. A plan that does
// not compute (a bad record) is skipped with a warning: it cannot be read
// either, so it has no order to follow.
std::vector<SampleId> PlansReadOrder(const std::string& dataset, const Manifest& manifest,
                                     std::vector<PlanRecord> plans) {
  std::stable_sort(plans.begin(), plans.end(), [](const PlanRecord& a, const PlanRecord& b) {
    return a.registered_ms < b.registered_ms;
  });
  std::vector<SampleId> order;
  for (const PlanRecord& plan : plans) {
    Result<PlanSpec> spec = ToPlanSpec(plan, plan.first_epoch, 0);
    Result<std::vector<SampleId>> epoch =
        spec.ok() ? EpochOrder(manifest, *spec) : Result<std::vector<SampleId>>(spec.status());
    Result<std::vector<SampleId>> first =
        epoch.ok() ? FirstReadOrder(*epoch, *spec) : Result<std::vector<SampleId>>(epoch.status());
    if (!first.ok()) {
      GetLogger("cachenode")
          ->warn("ignoring plan {} of dataset {} for the staging order: {}", Quoted(plan.plan_id),
                 Quoted(dataset), first.status().ToString());
      continue;
    }
    order.insert(order.end(), first->begin(), first->end());
  }
  return order;
}

bool IsStaged(DatasetPhase phase) {
  return phase == DatasetPhase::kStaging || phase == DatasetPhase::kReady;
}

}  // namespace

using cache_node_internal::kActivationRetryTicks;
using cache_node_internal::kOnDemandSourceSlots;
using cache_node_internal::Plural;

// ---- the control loop -------------------------------------------------------

void CacheNode::Impl::ControlLoop() {
  auto next_tick = SteadyClock::now();
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(state_mu_);
      if (stopping_) return;
    }
    if (SteadyClock::now() >= next_tick) {
      next_tick = SteadyClock::now() + config_.heartbeat_interval;
      Status beat = Heartbeat();
      if (beat.ok()) {
        NoteStoreOk();
      } else {
        NoteStoreError(beat);
      }
      Reconcile();
    }
    // Wait for events until the next tick, in short slices so Stop is quick.
    const auto slice = std::min<SteadyClock::duration>(
        std::chrono::milliseconds(100),
        std::max<SteadyClock::duration>(next_tick - SteadyClock::now(), SteadyClock::duration(0)));
    if (!watcher_) {
      Result<std::unique_ptr<MetadataStore::Watcher>> watcher = store_->Watch();
      if (watcher.ok()) {
        watcher_ = std::move(*watcher);
        plans_changed_ = true;
        next_tick = SteadyClock::now();  // read everything after the watch began
        continue;
      }
    }
    if (watcher_) {
      Result<std::vector<Event>> events =
          watcher_->Next(std::chrono::duration_cast<std::chrono::milliseconds>(slice));
      if (!events.ok()) continue;  // the watcher reconnects on the next call
      bool relevant = false;
      for (const Event& e : *events) {
        relevant = relevant || e.kind != EventKind::kProgress;
        plans_changed_ =
            plans_changed_ || e.kind == EventKind::kPlan || e.kind == EventKind::kResync;
      }
      if (relevant) next_tick = SteadyClock::now();
      if (reconcile_now_.exchange(false)) next_tick = SteadyClock::now();
    } else {
      if (reconcile_now_.exchange(false)) {
        next_tick = SteadyClock::now();
        continue;
      }
      std::unique_lock<std::mutex> lock(state_mu_);
      state_cv_.wait_for(lock, slice, [this] { return stopping_; });
    }
  }
}

Result<std::vector<ChunkId>> CacheNode::Impl::Owned(const ActiveDataset& ds,
                                                    const Placement& placement) const {
  // A dataset placed on other nodes only (DatasetSpec::nodes): none here.
  if (!placement.IndexOf(config_.node_id).ok()) return std::vector<ChunkId>();
  return placement.ChunksOwnedBy(ds.manifest_id, ds.manifest->chunk_count(), config_.node_id,
                                 std::max<uint32_t>(1, ds.record.spec.replication));
}

void CacheNode::Impl::Reconcile() {
  Result<std::optional<std::vector<NodeRecord>>> nodes =
      node_follower_.Poll(*store_, std::chrono::steady_clock::now());
  if (!nodes.ok()) return NoteStoreError(nodes.status());
  if (nodes->has_value()) listed_nodes_ = std::move(**nodes);
  Result<std::vector<DatasetRecord>> datasets = store_->ListDatasets();
  if (!datasets.ok()) return NoteStoreError(datasets.status());

  // This node is alive whatever the list says (its heartbeat may have been
  // lost with a restarted store): never compute an ownership without it.
  live_nodes_ = listed_nodes_;
  if (std::none_of(live_nodes_.begin(), live_nodes_.end(),
                   [&](const NodeRecord& n) { return n.id == config_.node_id; })) {
    NodeRecord self;
    self.id = config_.node_id;
    self.pool = config_.pool;
    self.capacity_bytes = chunks_->capacity();
    live_nodes_.push_back(self);
  }
  Result<Placement> placement = PlacementOverNodes(live_nodes_);
  if (!placement.ok()) {
    log_->error("computing placement over the nodes of pool {}: {}", Quoted(config_.pool),
                placement.status().ToString());
    return;
  }

  std::map<std::string, const DatasetRecord*> wanted;
  for (const DatasetRecord& d : *datasets) {
    if (d.spec.pool == config_.pool && IsStaged(d.state.phase) && !d.manifest_id.empty()) {
      wanted[d.name] = &d;
    }
  }

  // Stop what is no longer wanted (or wanted with another manifest). Chunks
  // are kept across a pause (Pending, Snapshotting, Failed with the same
  // manifest): it may come back. They go when the dataset is deleted, moved
  // to another pool or re-snapshotted.
  std::vector<std::pair<std::string, std::string>> stale;  // name, active manifest id
  {
    std::lock_guard<std::mutex> lock(datasets_mu_);
    for (const auto& [name, ds] : datasets_) {
      auto it = wanted.find(name);
      if (it == wanted.end() || it->second->manifest_id != ds->record.manifest_id) {
        stale.emplace_back(name, ds->record.manifest_id);
      }
    }
  }
  for (const auto& entry : stale) {
    const std::string& name = entry.first;
    const std::string& manifest_id = entry.second;
    auto it = std::find_if(datasets->begin(), datasets->end(),
                           [&](const DatasetRecord& d) { return d.name == name; });
    const bool keep = it != datasets->end() && it->spec.pool == config_.pool &&
                      it->manifest_id == manifest_id && !IsStaged(it->state.phase) &&
                      it->state.phase != DatasetPhase::kDeleting;
    const std::string why = it == datasets->end()
                                ? "was deleted"
                                : "is now " + std::string(DatasetPhaseName(it->state.phase));
    Deactivate(name, !keep, why);
  }
  DropOrphans(*datasets);
  ClaimSnapshot(*datasets);

  // Plans are read again only after a plan event, a resync or without a
  // watcher (activation reads them anyway).
  if (!watcher_) plans_changed_ = true;
  bool plans_read = true;
  std::vector<std::pair<std::shared_ptr<ActiveDataset>, std::vector<NodeRecord>>> reconciled;
  for (const auto& [name, record] : wanted) {
    std::shared_ptr<ActiveDataset> ds;
    {
      std::lock_guard<std::mutex> lock(datasets_mu_);
      if (auto it = datasets_.find(name); it != datasets_.end()) ds = it->second;
    }
    // A dataset on some nodes only (spec.nodes) is placed over those alone:
    // the others own none of its chunks.
    std::vector<NodeRecord> ds_nodes = DatasetNodes(record->spec, live_nodes_);
    Result<Placement> own_placement = Placement();
    if (record->spec.nodes.has_value()) {
      own_placement = PlacementOverNodes(ds_nodes);
      if (!own_placement.ok()) {
        log_->error("computing placement of dataset {} over its nodes: {}", Quoted(name),
                    own_placement.status().ToString());
        continue;
      }
    }
    const Placement& ds_placement = record->spec.nodes.has_value() ? *own_placement : *placement;
    // Not placed here and not active: nothing to stage, serve or publish.
    if (!ds && !DatasetUsesNode(record->spec, config_.node_id)) continue;
    if (!ds) {
      auto failure = activation_failures_.find(name);
      if (failure != activation_failures_.end() && --failure->second.second > 0) continue;
      Result<std::shared_ptr<ActiveDataset>> activated = Activate(*record, ds_placement);
      if (!activated.ok()) {
        const std::string message = activated.status().ToString();
        if (failure == activation_failures_.end() || failure->second.first != message) {
          log_->warn("cannot stage dataset {}: {} (retrying)", Quoted(name), message);
          SetDatasetMessage(name, "node " + config_.node_id + " cannot stage it: " + message);
        }
        activation_failures_[name] = {message, kActivationRetryTicks};
        continue;
      }
      activation_failures_.erase(name);
      ds = *activated;
      std::lock_guard<std::mutex> lock(datasets_mu_);
      datasets_[name] = ds;
    } else {
      ds->record = *record;
      Reown(*ds, ds_placement);
      if (plans_changed_) {
        Result<std::vector<PlanRecord>> plans = store_->ListPlans(name);
        plans_read = plans_read && plans.ok();
        if (plans.ok() && PlanFingerprint(*plans) != ds->plans_key) {
          Status restaged = Restage(*ds, std::move(*plans));
          if (!restaged.ok()) {
            log_->warn("re-ordering the staging of dataset {}: {}", Quoted(name),
                       restaged.ToString());
          }
        }
      }
    }
    reconciled.emplace_back(ds, std::move(ds_nodes));
  }
  if (plans_read) plans_changed_ = false;
  ApplyCacheBudgets();
  for (auto& [ds, ds_nodes] : reconciled) {
    if (!ds->started) {
      Status started = ds->stager->Start();
      if (!started.ok()) {
        log_->error("starting the staging of dataset {}: {}", Quoted(ds->name), started.ToString());
      }
      ds->started = true;
    }
    PublishProgress(*ds);
    UpdatePhase(*ds, ds_nodes);
  }
}

Result<std::shared_ptr<ActiveDataset>> CacheNode::Impl::Activate(const DatasetRecord& record,
                                                                 const Placement& placement) {
  auto ds = std::make_shared<ActiveDataset>();
  ds->name = record.name;
  ds->record = record;
  ds->owner_uid = record.owner.uid;
  ds->kubernetes_namespace = record.spec.kubernetes_namespace;
  GRANARY_ASSIGN_OR_RETURN(ds->manifest_id, ContentId::Parse(record.manifest_id));
  GRANARY_ASSIGN_OR_RETURN(std::string blob, store_->GetManifest(record.manifest_id));
  Result<Manifest> manifest = Manifest::Decode(blob);
  if (!manifest.ok()) {
    return Status(manifest.status().code(),
                  "decoding manifest " + record.manifest_id + ": " + manifest.status().message());
  }
  if (!(manifest->id() == ds->manifest_id)) {
    return Status::Corruption("the store's manifest blob " + record.manifest_id +
                              " decodes to manifest " + manifest->id().ToHex() +
                              "; re-snapshot the dataset");
  }
  ds->manifest = std::make_shared<const Manifest>(std::move(*manifest));

  GRANARY_ASSIGN_OR_RETURN(Identity owner,
                           ResolveOwnerIdentity(record.owner.uid, record.owner.gid));
  SourceOptions source_options;
  source_options.dataset = record.name;
  source_options.owner = owner;
  source_options.executor = executor_.get();
  source_options.max_in_flight = config_.source_concurrency + kOnDemandSourceSlots;
  Result<std::unique_ptr<Source>> source = OpenSource(record.spec.source_uri, source_options);
  if (!source.ok()) {
    return Status(source.status().code(),
                  "opening the source as " + owner.ToString() + ": " + source.status().message());
  }
  ds->source = std::move(*source);
  GRANARY_ASSIGN_OR_RETURN(ds->owned, Owned(*ds, placement));

  // What the store holds of this manifest but this node does not own (a
  // restart after membership changed) goes once the dataset is Ready.
  if (Result<std::vector<StoredChunk>> held = chunks_->Chunks(ds->name, ds->manifest_id);
      held.ok()) {
    for (const StoredChunk& c : *held) {
      if (!std::binary_search(ds->owned.begin(), ds->owned.end(), c.chunk)) {
        ds->to_drop.insert(c.chunk);
      }
    }
  }
  GRANARY_ASSIGN_OR_RETURN(ds->metrics, metrics_.ForDataset(ds->name));
  ds->activated_ms = cache_node_internal::NowMs();

  Result<std::vector<PlanRecord>> plans = store_->ListPlans(ds->name);
  if (!plans.ok()) return plans.status();
  GRANARY_RETURN_IF_ERROR(Restage(*ds, std::move(*plans)));
  log_->info("staging dataset {} (manifest {}, {}, {} bytes) from {} as {}: {} of {} chunks here",
             Quoted(ds->name), record.manifest_id, Plural(ds->manifest->sample_count(), "file"),
             ds->manifest->total_bytes(), record.spec.source_uri, owner.ToString(),
             ds->owned.size(), ds->manifest->chunk_count());
  return ds;
}

Status CacheNode::Impl::Restage(ActiveDataset& ds, std::vector<PlanRecord> plans) {
  StagerOptions options;
  options.dataset = ds.name;
  options.threads = config_.source_concurrency;
  options.lru = config_.cache_lru;
  const std::string key = PlanFingerprint(plans);
  for (const PlanRecord& plan : plans)
    ds.last_plan_ms = std::max(ds.last_plan_ms, plan.registered_ms);
  options.order = PlansReadOrder(ds.name, *ds.manifest, std::move(plans));
  const bool ordered = !options.order.empty();
  if (ds.stager) {
    // A running stager takes the new order in place: replacing it stopped its
    // workers mid-chunk and read some samples twice.
    GRANARY_RETURN_IF_ERROR(ds.stager->SetOrder(options.order));
    std::lock_guard<std::mutex> lock(datasets_mu_);
    ds.plans_key = key;
    log_->info("dataset {}: staging in {} order", Quoted(ds.name),
               ordered ? "the registered plans'" : "chunk");
    return Status::Ok();
  }
  GRANARY_ASSIGN_OR_RETURN(
      std::unique_ptr<Stager> created,
      Stager::Create(ds.manifest, ds.source, chunks_, ds.owned, std::move(options)));
  std::shared_ptr<Stager> stager = std::move(created);
  {
    std::lock_guard<std::mutex> lock(datasets_mu_);
    ds.stager = stager;
    ds.plans_key = key;
  }
  // Started by Reconcile once the cache policy gave it its budget: started
  // now, it would stage chunks beyond the budget only to drop them.
  GRANARY_RETURN_IF_ERROR(reads_->Add(ds.manifest, stager));
  log_->info("dataset {}: staging in {} order", Quoted(ds.name),
             ordered ? "the registered plans'" : "chunk");
  return Status::Ok();
}

void CacheNode::Impl::Reown(ActiveDataset& ds, const Placement& placement) {
  Result<std::vector<ChunkId>> owned = Owned(ds, placement);
  if (!owned.ok()) {
    log_->error("computing the chunks of dataset {} this node owns: {}", Quoted(ds.name),
                owned.status().ToString());
    return;
  }
  if (*owned == ds.owned) return;
  Status set = ds.stager->SetOwnedChunks(*owned);
  if (!set.ok()) {
    log_->error("re-owning dataset {}: {}", Quoted(ds.name), set.ToString());
    return;
  }
  uint64_t gained = 0;
  for (ChunkId c : *owned) {
    if (!std::binary_search(ds.owned.begin(), ds.owned.end(), c)) ++gained;
    ds.to_drop.erase(c);
  }
  uint64_t lost = 0;
  for (ChunkId c : ds.owned) {
    if (!std::binary_search(owned->begin(), owned->end(), c)) {
      ++lost;
      ds.to_drop.insert(c);
    }
  }
  log_->info("dataset {}: membership changed ({} live nodes): {} chunks gained, {} given up",
             Quoted(ds.name), live_nodes_.size(), gained, lost);
  std::lock_guard<std::mutex> lock(datasets_mu_);
  ds.owned = std::move(*owned);
}

void CacheNode::Impl::Deactivate(const std::string& name, bool drop_chunks,
                                 const std::string& why) {
  std::shared_ptr<ActiveDataset> ds;
  {
    std::lock_guard<std::mutex> lock(datasets_mu_);
    auto it = datasets_.find(name);
    if (it == datasets_.end()) return;
    ds = it->second;
    datasets_.erase(it);
  }
  (void)reads_->Remove(name, ds->manifest_id);
  ds->stager->Stop();
  ClearDatasetGauges(ds->metrics);
  log_->info("dataset {} {}: stopped staging it{}", Quoted(name), why,
             drop_chunks ? " and dropping its chunks" : "");
  if (drop_chunks) {
    Status dropped = chunks_->DropManifest(name, ds->manifest_id);
    if (!dropped.ok() && dropped.code() != StatusCode::kNotFound) {
      log_->warn("dropping the chunks of dataset {}: {}", Quoted(name), dropped.ToString());
    }
  }
}

// Chunks of datasets the store no longer has (deleted while this node was
// down), of other pools, or of manifests the dataset no longer uses.
void CacheNode::Impl::DropOrphans(const std::vector<DatasetRecord>& datasets) {
  for (const StoredManifest& held : chunks_->Manifests()) {
    auto it = std::find_if(datasets.begin(), datasets.end(),
                           [&](const DatasetRecord& d) { return d.name == held.dataset; });
    bool orphan = it == datasets.end() || it->spec.pool != config_.pool ||
                  it->state.phase == DatasetPhase::kDeleting;
    if (!orphan && !it->manifest_id.empty()) orphan = it->manifest_id != held.manifest_id.ToHex();
    if (!orphan) continue;
    {
      std::lock_guard<std::mutex> lock(datasets_mu_);
      auto active = datasets_.find(held.dataset);
      if (active != datasets_.end() && active->second->manifest_id == held.manifest_id) continue;
    }
    Status dropped = chunks_->DropManifest(held.dataset, held.manifest_id);
    if (dropped.ok()) {
      log_->info(
          "dropped {} of dataset {} manifest {}: {}", Plural(held.chunk_count, "chunk"),
          Quoted(held.dataset), held.manifest_id.ToHex(),
          it == datasets.end() ? "the dataset no longer exists" : "not used by this pool any more");
    } else if (dropped.code() != StatusCode::kNotFound) {
      log_->warn("dropping the chunks of dataset {}: {}", Quoted(held.dataset), dropped.ToString());
    }
  }
}

void CacheNode::Impl::DropDisowned(ActiveDataset& ds, const std::string& why) {
  if (ds.to_drop.empty()) return;
  uint64_t dropped = 0;
  for (auto it = ds.to_drop.begin(); it != ds.to_drop.end();) {
    Status status = chunks_->DropChunk(ChunkKey{ds.name, ds.manifest_id, *it});
    if (status.ok() || status.code() == StatusCode::kNotFound) {
      if (status.ok()) ++dropped;
      it = ds.to_drop.erase(it);
    } else {
      ++it;  // in use (a writer open): next time
    }
  }
  if (dropped > 0) {
    log_->info("dataset {}: dropped {} this node no longer owns ({})", Quoted(ds.name),
               Plural(dropped, "chunk"), why);
  }
}

void CacheNode::Impl::PublishProgress(ActiveDataset& ds) {
  StagingProgress progress = ds.stager->Progress().ToStagingProgress();
  progress.updated_ms = 0;
  // To the 10 s: a dataset being read is not put again on every pass.
  progress.last_read_ms -= progress.last_read_ms % 10'000;
  const auto now = std::chrono::steady_clock::now();
  if (ds.published_once && progress == ds.published &&
      now - ds.published_at < config_.progress_refresh_interval) {
    return;
  }
  Status put = store_->PutProgress(ds.name, config_.node_id, progress);
  if (!put.ok()) {
    if (put.code() != StatusCode::kNotFound) NoteStoreError(put);
    return;
  }
  ds.published = progress;
  ds.published_once = true;
  ds.published_at = now;
}

void CacheNode::Impl::SetDatasetMessage(const std::string& name, const std::string& message) {
  Result<DatasetRecord> record = store_->GetDataset(name);
  if (!record.ok() || record->state.message == message) return;
  record->state.message = message;
  // A conflict means someone else just wrote: the next tick looks again.
  (void)store_->UpdateDataset(*record);
}

void CacheNode::Impl::UpdatePhase(ActiveDataset& ds, const std::vector<NodeRecord>& nodes) {
  const StagerProgress mine = ds.stager->Progress();
  if (mine.state == StagingState::kCapacity && !ds.to_drop.empty()) {
    // Chunks this node gave up are in the way of the ones it owns now.
    DropDisowned(ds, "to make room for the chunks it owns now");
    ds.stager->Resume();
  }

  Result<std::map<std::string, StagingProgress>> all = store_->ListProgress(ds.name);
  if (!all.ok()) {
    if (all.status().code() != StatusCode::kNotFound) NoteStoreError(all.status());
    return;
  }
  const uint64_t replicas =
      std::min<uint64_t>(std::max<uint32_t>(1, ds.record.spec.replication), nodes.size());
  const ProgressSummary summary = SummarizeProgress(*all, nodes);
  const uint64_t total = summary.total.chunks_total;
  const uint64_t staged = summary.total.chunks_staged;
  const uint64_t failed = summary.total.samples_failed;
  const uint64_t bytes = summary.total.bytes_staged;
  // Every node's share adds up to the whole dataset only once they all
  // computed placement over the same membership.
  const bool complete = summary.all_staged && total == ds.manifest->chunk_count() * replicas;
  ds.pool_last_read_ms = std::max(ds.pool_last_read_ms, summary.total.last_read_ms);

  DatasetRecord record = ds.record;
  const DatasetPhase phase = record.state.phase;
  std::string message;
  // What Ready says when the pool keeps only part of the dataset: the same on
  // every node (it is computed from the pool's progress alone).
  const std::string partly =
      "Ready, " + std::to_string(static_cast<int>(summary.resident_fraction() * 100)) +
      "% resident (" + std::to_string(bytes) + " of " + std::to_string(summary.total.bytes_total) +
      " bytes on " + Plural(nodes.size(), "node") +
      "); the rest is streamed from the source in plan order when read";
  if (complete && phase == DatasetPhase::kStaging) {
    record.state.phase = DatasetPhase::kReady;
    message = summary.all_kept ? "staged on " + Plural(nodes.size(), "node") + ": " +
                                     Plural(ds.manifest->chunk_count(), "chunk") + ", " +
                                     std::to_string(bytes) + " bytes"
                               : partly;
    if (failed > 0) message += "; " + Plural(failed, "sample") + " failed (see the node logs)";
    // Links the source's reads refuse were left out at the snapshot, not
    // failed here: say so, so their absence is not a surprise.
    if (const uint64_t links = ds.manifest->header().stats.skipped_symlinks; links > 0) {
      message += "; " + Plural(links, "symbolic link") + " left out at the snapshot";
    }
  } else if (!complete && phase == DatasetPhase::kReady) {
    record.state.phase = DatasetPhase::kStaging;
    message = "re-staging after a change of the nodes of pool " + config_.pool + ": " +
              std::to_string(staged) + " of " + std::to_string(total) + " chunks staged";
  } else if (complete && phase == DatasetPhase::kReady && !summary.all_kept &&
             record.state.message != partly) {
    message = partly;  // its budget moved
  } else if (complete && phase == DatasetPhase::kReady && summary.all_kept &&
             record.state.message.rfind("Ready, ", 0) == 0) {
    message = "staged on " + Plural(nodes.size(), "node") + ": " +
              Plural(ds.manifest->chunk_count(), "chunk") + ", " + std::to_string(bytes) + " bytes";
  } else if (!complete && mine.state == StagingState::kCapacity) {
    // Said again whenever its figures move, so it agrees with the progress.
    message = "does not fit: node " + config_.node_id + " holds " +
              std::to_string(mine.chunks_staged) + " of the " + std::to_string(mine.chunks_owned) +
              " chunks it owns (" + std::to_string(mine.bytes_staged) + " of " +
              std::to_string(mine.bytes_owned) + " bytes) within its capacity of " +
              std::to_string(chunks_->capacity()) +
              " bytes; it staged what the plans read first and serves the rest from the source";
    if (message == record.state.message) message.clear();
  }
  if (complete) DropDisowned(ds, "the dataset is Ready on the new owners");
  if (message.empty()) return;
  record.state.message = message;
  Result<DatasetRecord> updated = store_->UpdateDataset(record);
  if (updated.ok()) {
    if (updated->state.phase != phase) {
      log_->info("dataset {}: {} -> {}: {}", Quoted(ds.name), DatasetPhaseName(phase),
                 DatasetPhaseName(updated->state.phase), message);
    }
    ds.record = *updated;
  }
}

}  // namespace granary
