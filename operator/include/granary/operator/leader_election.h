#pragma once

// LeaderElector: one acting replica of granary-operator, through a
// coordination.k8s.io/v1 Lease (as client-go's leaderelection does):
//   - a candidate takes the Lease when it does not exist, when it is its own,
//     or when its holder has not renewed it for leaseDurationSeconds (judged
//     by this replica's clock from when it last saw the Lease change, so
//     clock skew between replicas does not matter);
//   - the leader renews every `retry_period`; every write carries the
//     Lease's resourceVersion, so two candidates never both win;
//   - a leader that cannot renew within `renew_deadline` stops leading
//     (on_stopped): better no operator for a moment than two.
// On Stop() a leader releases the Lease (holder cleared), so a successor
// takes over at once rather than after the lease duration.
//
// Thread safety: Start/Stop from one thread; is_leader from any.

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "granary/kube/kube_client.h"

namespace granary::kube {

struct LeaderElectionOptions {
  std::string lease_namespace;
  std::string lease_name = "granary-operator";
  std::string identity;  // this replica (pod name)
  std::chrono::milliseconds lease_duration{15000};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
};

class LeaderElector {
 public:
  LeaderElector(KubeClient& client, LeaderElectionOptions options, std::function<void()> on_started,
                std::function<void()> on_stopped);
  ~LeaderElector();
  void Start();
  void Stop();
  bool is_leader() const { return leader_.load(); }

  // RFC 3339 with microseconds ("MicroTime"), UTC.
  static std::string MicroTime(std::chrono::system_clock::time_point t);

 private:
  void Run();
  // One attempt to acquire or renew; true if this replica holds the Lease.
  Result<bool> TryAcquireOrRenew();
  void Release();

  KubeClient& client_;
  const LeaderElectionOptions options_;
  std::function<void()> on_started_, on_stopped_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> leader_{false};
  std::thread thread_;
  // What this replica last saw of the Lease, and when (steady clock).
  std::string observed_record_;
  std::chrono::steady_clock::time_point observed_at_;
  std::chrono::steady_clock::time_point last_renew_;
};

}  // namespace granary::kube
