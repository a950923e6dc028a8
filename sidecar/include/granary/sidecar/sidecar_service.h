#pragma once

// SidecarService: what answers each request of the sidecar protocol
// (sidecar_protocol.h; docs/sidecar.md), apart from the socket that carries
// it, as the cache node's ChunkReadService is apart from its Server. The
// Sidecar (sidecar.h) reads frames off a connection, hands each to
// HandleFrame with that connection's SidecarSession, and writes the answer
// back; a test drives the same calls in process, with no socket.
//
// What it does:
//  - HELLO agrees on a version; every other request before it closes the
//    connection, and a frame newer than the agreed version is refused;
//  - OPEN opens a dataset from the metadata store (record, then manifest),
//    one SampleCache per dataset shared by every session, and answers with
//    the arena's descriptor; a dataset of another pool, or not Staging or
//    Ready, is refused saying what to do;
//  - SET_PLAN turns (plan, epoch, rank, start) into a Plan that NEXT walks and
//    a prefetch cursor, and queues the plan for the store (PlanRegistrar
//    writes it after the answer, best effort);
//  - GET, NEXT pin samples for the session (fetching what is missing with the
//    SampleFetcher, waiting up to wait_timeout); RELEASE unpins; STAT, LOOKUP
//    and DIRECTORIES answer from the manifest alone;
//  - CHUNK_FILES passes a client on this host the local node's chunk files
//    of the samples it names (read-only descriptors the node handed the
//    sidecar, rights-checked there) and where each staged sample lies in
//    them, so it reads them itself; only to a client whose uid (SO_PEERCRED)
//    is root, the sidecar's own or the dataset owner's: any other uid reads
//    through the arena (docs/client.md, "Direct reads").
// Errors are values: a request refused is an ERROR reply, never an
// exception; Close drops every pin of the session, however it ended.
//
// Who calls it: the Sidecar (connection threads: HandleFrame, Close; the
// `mounts` set-up, fetch workers and refresh loop: OpenDataset, Caches,
// FetchFor); tests.
//
// Thread safety: every method may be called from any number of threads at
// once, each with its own SidecarSession (a session is one connection's and
// is used by one thread at a time). The open datasets are guarded by
// caches_mu_; OpenDataset calls are serialised by open_mu_. The store,
// fetcher and metrics must outlive the service.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "granary/core/file.h"
#include "granary/core/log.h"
#include "granary/core/metadata_store.h"
#include "granary/core/plan.h"
#include "granary/core/status.h"
#include "granary/fetcher/sample_fetcher.h"
#include "granary/protocol/sidecar_protocol.h"
#include "granary/sidecar/plan_registrar.h"
#include "granary/sidecar/sample_cache.h"

namespace granary::sidecar {

struct SidecarMetrics;  // sidecar/src/sidecar_metrics.h

struct SidecarServiceOptions {
  std::string name = "granary-sidecar";  // HELLO_REPLY's sidecar_name
  std::string pool = "default";          // the pool whose datasets it opens
  // Set: only these datasets of the pool (SidecarConfig::datasets).
  std::optional<std::vector<std::string>> datasets;
  // Per open dataset: the arena and the prefetch windows (work_available
  // wakes the fetch workers).
  SampleCacheOptions cache;
  // How long a GET or NEXT may wait for its samples.
  std::chrono::milliseconds wait_timeout{120000};
};

// One connection's state: what HELLO agreed, the dataset OPEN opened, the
// plan NEXT walks.
struct SidecarSession {
  uint64_t conn = 0;  // for logs
  bool hello = false;
  // Before HELLO, errors go out as the handshake version every client reads.
  uint16_t version = sidecar_protocol::kHandshakeVersion;
  std::string client_name;
  // The peer's uid (SO_PEERCRED at accept); unset: unknown, never handed a
  // chunk file.
  std::optional<uint32_t> uid;
  std::shared_ptr<SampleCache> cache;  // OPEN
  uint64_t client = 0;                 // this session's pins in `cache`
  std::shared_ptr<const Plan> plan;    // SET_PLAN: what NEXT walks
  size_t next = 0;                     // NEXT's position in plan->samples()
};

// What to send back for one request: a reply (with a descriptor to pass
// along, OPEN's arena), or an ERROR, which may end the connection.
struct SidecarAnswer {
  Status error;          // not OK: an ERROR with this status
  bool closing = false;  // with an error: the connection ends after it
  sidecar_protocol::Reply reply = sidecar_protocol::Ok{};
  int fd = -1;  // passed with the reply; owned by the service (the arena's)
  // Passed with the reply after `fd` (CHUNK_FILES' chunk files); owned here.
  std::vector<ScopedFd> owned_fds;
};

class SidecarService {
 public:
  SidecarService(SidecarServiceOptions options, MetadataStore* store, SampleFetcher* fetcher,
                 SidecarMetrics* metrics);
  SidecarService(const SidecarService&) = delete;
  SidecarService& operator=(const SidecarService&) = delete;

  // One frame of `session`'s connection: decoded, checked against the
  // session's version and HELLO, then answered (Handle). Counts the request
  // and, when refused, the error.
  SidecarAnswer HandleFrame(SidecarSession& session, const sidecar_protocol::Frame& frame);
  // One decoded request (no version or HELLO checks: HandleFrame's).
  SidecarAnswer Handle(SidecarSession& session, const sidecar_protocol::Request& request);

  // Each request on its own. Errors say what was asked, of what, and what to
  // do; a request that needs OPEN (or SET_PLAN) first is kFailedPrecondition.
  Result<sidecar_protocol::HelloReply> Hello(SidecarSession& session,
                                             const sidecar_protocol::Hello& hello);
  Result<sidecar_protocol::OpenReply> Open(SidecarSession& session,
                                           const sidecar_protocol::Open& open);
  Result<sidecar_protocol::Ok> SetPlan(SidecarSession& session,
                                       const sidecar_protocol::SetPlan& plan);
  Result<sidecar_protocol::Samples> Get(SidecarSession& session, const sidecar_protocol::Get& get);
  // The next max_samples of the plan; past its end, none and end_of_epoch.
  Result<sidecar_protocol::Samples> Next(SidecarSession& session,
                                         const sidecar_protocol::Next& next);
  // Tokens the session does not hold are counted (SampleCacheStats::
  // unknown_releases) and ignored: a client retrying a RELEASE is not wrong.
  Result<sidecar_protocol::Ok> Release(SidecarSession& session,
                                       const sidecar_protocol::Release& release);
  Result<sidecar_protocol::StatReply> Stat(SidecarSession& session,
                                           const sidecar_protocol::Stat& stat);
  Result<sidecar_protocol::LookupReply> Lookup(SidecarSession& session,
                                               const sidecar_protocol::Lookup& lookup);
  Result<sidecar_protocol::DirectoriesReply> Directories(SidecarSession& session,
                                                         const sidecar_protocol::Directories& dirs);
  // The chunk files of the ids' chunks (at most kMaxChunkFilesPerReply handed
  // over, their descriptors appended to `fds` in the reply's order).
  // kPermissionDenied for a uid that may not have them, kFailedPrecondition
  // when this sidecar reads no local node's chunk files.
  Result<sidecar_protocol::ChunkFilesReply> ChunkFiles(SidecarSession& session,
                                                       const sidecar_protocol::ChunkFiles& request,
                                                       std::vector<ScopedFd>* fds);
  // Whether a client of `uid` may be handed chunk files of a dataset owned
  // by `owner_uid`: root, this process's effective uid, or the owner.
  static bool MayHaveChunkFiles(uint32_t uid, uint32_t owner_uid);

  // The connection ended: its pins go.
  void Close(SidecarSession& session);

  // The sample cache of `dataset`, opened (or reopened on a new manifest)
  // from the store. While the store is unreachable, a dataset open already
  // is served as it is.
  Result<std::shared_ptr<SampleCache>> OpenDataset(const std::string& dataset);
  // Every dataset open now.
  std::vector<std::shared_ptr<SampleCache>> Caches() const;
  // Fetches for `cache` with the fetcher (the node list as it is now).
  FetchFn FetchFor(const std::shared_ptr<SampleCache>& cache);
  // Waits until every plan SET_PLAN announced so far is written to the store
  // (SET_PLAN answers before that: PlanRegistrar), or until `deadline`;
  // returns how many were not. For tests and shutdown.
  size_t FlushPlans(std::chrono::steady_clock::time_point deadline =
                        std::chrono::steady_clock::time_point::max()) {
    return plans_.Flush(deadline);
  }
  // Plan registrations written (or failed) so far.
  uint64_t plans_registered() const { return plans_.completed(); }

 private:
  // kFailedPrecondition "<what> before OPEN" unless the session has a dataset.
  Status NeedOpen(const SidecarSession& session, std::string_view what) const;
  // Pins `ids` for the session and says where each is.
  sidecar_protocol::Samples Deliver(SidecarSession& session, std::span<const SampleId> ids,
                                    uint32_t lookahead, bool end_of_epoch);

  const SidecarServiceOptions options_;
  MetadataStore* const store_;
  SampleFetcher* const fetcher_;
  SidecarMetrics* const metrics_;
  std::shared_ptr<spdlog::logger> log_ = GetLogger("sidecar");

  std::mutex open_mu_;  // serialises OpenDataset
  mutable std::mutex caches_mu_;
  std::map<std::string, std::shared_ptr<SampleCache>> caches_;  // guarded by caches_mu_
  // Last: its thread, which uses log_ and metrics_, stops first.
  PlanRegistrar plans_;
};

}  // namespace granary::sidecar
