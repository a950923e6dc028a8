// Snapshots the pool takes (cache_node_impl.h): a dataset to snapshot is
// claimed by compare-and-set and walked on the snapshot thread, in a helper
// process, one walk at a time; Stop abandons a walk in progress.

#include "cache_node_impl.h"
#include "granary/core/thread_name.h"

namespace granary {

// ---- snapshots ----------------------------------------------------------------

void CacheNode::Impl::ClaimSnapshot(const std::vector<DatasetRecord>& datasets) {
  if (snapshot_running_) return;  // one walk at a time
  if (snapshot_thread_.joinable()) {
    snapshot_thread_.join();
    snapshot_dataset_.clear();
  }
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (stopping_) return;
  }
  for (const DatasetRecord& d : datasets) {
    if (d.spec.pool != config_.pool || d.spec.snapshot_by != SnapshotBy::kPool) continue;
    std::string why;
    if (d.state.phase == DatasetPhase::kPending) {
      why = "it is Pending";
    } else if (d.state.phase == DatasetPhase::kSnapshotting) {
      const std::string& claimant = d.state.claimed_by;
      if (claimant.empty()) {
        why = "it is Snapshotting with no claimant";
      } else if (claimant == config_.node_id) {
        // An earlier incarnation of this node claimed it; nothing walks it now.
        why = "this node's claim is from before it restarted";
      } else if (std::none_of(live_nodes_.begin(), live_nodes_.end(),
                              [&](const NodeRecord& n) { return n.id == claimant; })) {
        why = "its claimant, node " + claimant + ", is not live any more";
      }
    }
    if (why.empty()) continue;
    log_->info("dataset {}: claiming its snapshot ({})", Quoted(d.name), why);
    snapshot_dataset_ = d.name;
    snapshot_running_ = true;
    snapshot_thread_ = std::thread([this, d] {
      NameThisThread("snapshot");
      RunSnapshot(d);
    });
    return;
  }
}

void CacheNode::Impl::RunSnapshot(const DatasetRecord& record) {
  DatasetSnapshotOptions options;
  options.claimant = config_.node_id;
  options.process.helper_argv = snapshot_helper_;
  options.stop = &snapshot_stop_;
  options.check_interval = config_.heartbeat_interval;
  Result<DatasetSnapshot> snap = SnapshotDataset(*store_, record, options);
  std::string_view result;
  if (!snap.ok()) {
    result = "error";
    log_->warn("dataset {}: the snapshot could not be recorded: {} (taken again on a later pass)",
               Quoted(record.name), snap.status().ToString());
  } else {
    switch (snap->outcome) {
      case SnapshotOutcome::kNotClaimed:
        log_->info("dataset {}: another node claimed its snapshot first", Quoted(record.name));
        break;
      case SnapshotOutcome::kSnapshotted:
        result = "ok";
        log_->info("dataset {}: snapshot as uid {}: {} in {:.1f} s (manifest {}); Staging",
                   Quoted(record.name), record.owner.uid, snap->summary, snap->seconds,
                   snap->manifest_id);
        break;
      case SnapshotOutcome::kFailed:
        result = "failed";
        log_->warn("dataset {}: {}", Quoted(record.name), snap->record.state.message);
        break;
      case SnapshotOutcome::kSuperseded:
        result = "superseded";
        log_->info(
            "dataset {}: changed during the snapshot (now {}{}); the walk's result is dropped",
            Quoted(record.name), DatasetPhaseName(snap->record.state.phase),
            snap->record.state.claimed_by.empty()
                ? ""
                : ", claimed by " + snap->record.state.claimed_by);
        break;
      case SnapshotOutcome::kAbandoned:
        result = "abandoned";
        log_->info("dataset {}: snapshot abandoned: the node is stopping; the claim is released",
                   Quoted(record.name));
        break;
    }
    if (!result.empty()) metrics_.snapshot_seconds->Observe(snap->seconds);
  }
  for (size_t i = 0; i < kSnapshotResults.size(); ++i) {
    if (kSnapshotResults[i] == result) metrics_.snapshots[i]->Increment();
  }
  snapshot_running_ = false;
  reconcile_now_ = true;  // a dataset may be Staging now, or another waiting to be claimed
}

void CacheNode::Impl::StopSnapshot() {
  snapshot_stop_ = true;
  if (snapshot_thread_.joinable()) snapshot_thread_.join();
}

}  // namespace granary
