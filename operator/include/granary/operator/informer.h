#pragma once

// Informer: a local copy of one kind of Kubernetes object, kept current by
// list+watch, as client-go's reflector does:
//   1. LIST the collection; remember its resourceVersion; report every key
//      (and the keys that vanished since the last list);
//   2. WATCH from that resourceVersion with allowWatchBookmarks; apply
//      ADDED/MODIFIED/DELETED, move the resourceVersion on BOOKMARK;
//   3. when the server ends the stream (timeoutSeconds), watch again from the
//      last resourceVersion; on 410 Gone (or an ERROR event with code 410)
//      list again; on any other error back off (0.5 s doubling to 30 s) and
//      try again: an API server restart costs a relist at most.
// Every change calls `on_change(key)` ("namespace/name", or "name" for
// cluster-scoped kinds); consumers read the object back with Get(). Every
// `resync` the informer reports every key again, so work lost to a full
// queue or a failed reconcile is retried.
//
// Thread safety: Start/Stop from one thread; Get, Keys, synced and the
// counters from any thread. on_change runs on the informer's thread.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "granary/kube/kube_client.h"

namespace granary::kube {

struct InformerOptions {
  std::string collection_path;  // e.g. /apis/granary.io/v1alpha1/datasets
  std::string label_selector;   // optional
  std::chrono::seconds watch_timeout{300};
  std::chrono::milliseconds resync{30000};
  std::chrono::milliseconds backoff_base{500};
  std::chrono::milliseconds backoff_max{30000};
  // Watch from this resourceVersion before the first list (tests: a stale
  // one makes the API server answer 410 Gone, which must lead to a list).
  std::string start_resource_version;
  // Optional: the informer keeps a count of its objects by this key (e.g. a
  // Dataset's status.phase), updated with every change, so that a count
  // costs no copy of the objects (Counts).
  std::function<std::string(const Json& object)> count_by;
};

class Informer {
 public:
  Informer(KubeClient& client, InformerOptions options,
           std::function<void(const std::string& key)> on_change);
  ~Informer();  // Stop()
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  void Start();
  void Stop();

  std::optional<Json> Get(const std::string& key) const;
  std::vector<std::string> Keys() const;
  std::vector<Json> List() const;
  // Calls `visit` with each object, under the informer's lock: no copies.
  // `visit` must not call the informer.
  void Visit(const std::function<void(const Json& object)>& visit) const;
  // The objects by options.count_by's key (empty without count_by).
  std::map<std::string, uint64_t> Counts() const;
  bool synced() const { return synced_.load(); }
  uint64_t lists() const { return lists_.load(); }
  uint64_t watches() const { return watches_.load(); }
  uint64_t gone() const { return gone_.load(); }

  static std::string KeyOf(const Json& object);

 private:
  void Run();
  Status ListAll();
  Status WatchOnce();
  void Sleep(std::chrono::milliseconds d);

  KubeClient& client_;
  const InformerOptions options_;
  const std::function<void(const std::string&)> on_change_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> synced_{false};
  std::atomic<uint64_t> lists_{0}, watches_{0}, gone_{0};
  std::thread thread_;
  mutable std::mutex mu_;
  void SetLocked(const std::string& key, const Json* object);  // nullptr: erase
  void CountLocked(const Json& object, int64_t delta);

  std::map<std::string, Json> objects_;     // guarded by mu_
  std::map<std::string, uint64_t> counts_;  // by options_.count_by; guarded by mu_
  std::string resource_version_;            // informer thread only
  std::chrono::steady_clock::time_point last_resync_;
};

}  // namespace granary::kube
