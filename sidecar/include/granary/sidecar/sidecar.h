#pragma once

// Sidecar: the granary-sidecar daemon as a library (docs/sidecar.md). One per
// training pod or job node. It
//  - listens on a Unix socket (mode 0660 by default) and serves many client
//    processes at once, one thread per connection (sidecar_protocol.h);
//  - opens datasets from the metadata store (record + manifest), one sample
//    cache per dataset: a shared-memory Arena that clients map read-only, the
//    samples in it, and who pins them;
//  - answers metadata (STAT, LOOKUP) from the manifest alone, never the source;
//  - prefetches: every plan announced with SET_PLAN becomes a cursor over that
//    rank's read order; fetch workers keep the next `window_samples` /
//    `window_bytes` of every cursor in the arena, batching per cache node
//    (SampleFetcher), and the plan is registered in the store so that cache
//    nodes stage in that order;
//  - fetches on demand what a client asks for and is not there, through the
//    owner, another replica, or the source (SampleFetcher);
//  - reclaims every pin of a connection when it closes, however it closes;
//  - closes connections idle for idle_timeout and admits by peer uid
//    (max_clients_per_uid; places reserved for root and its own uid), so one
//    user's connections cannot lock out another (docs/sidecar.md, "Idle and
//    greedy clients");
//  - exports /metrics, /healthz, /readyz.
// What each request does is the SidecarService's (sidecar_service.h); the
// Sidecar is the socket, the threads and the store around it.
//
// Who calls it: sidecar/src/main.cc; tests start the binary.
//
// Thread safety: Start and Stop are called by one owning thread; everything
// else runs on the sidecar's own threads.

#include <memory>
#include <string>

#include "granary/config/sidecar_config.h"
#include "granary/core/status.h"

namespace granary::sidecar {

class Sidecar {
 public:
  // Opens the store (retrying for startup_timeout), the fetcher, the socket and
  // the metrics endpoint, and starts the threads. kUnavailable if the store
  // stays unreachable; kAlreadyExists if another sidecar serves the socket path.
  static Result<std::unique_ptr<Sidecar>> Start(const SidecarConfig& config);
  ~Sidecar();  // Stop()
  Sidecar(const Sidecar&) = delete;
  Sidecar& operator=(const Sidecar&) = delete;

  // Stops accepting, closes every connection (their pins go), stops the
  // workers, removes the socket file. Idempotent.
  void Stop();

  // The metrics endpoint's bound address ("127.0.0.1:9465").
  std::string metrics_address() const;

  struct Impl;

 private:
  explicit Sidecar(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace granary::sidecar
