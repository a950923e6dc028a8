#include "granary/sidecar/sidecar.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache_content_reader.h"
#include "granary/core/log.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "granary/core/plan.h"
#include "granary/core/sidecar_protocol.h"
#include "granary/core/unix_socket.h"
#include "granary/daemon/config_keys.h"
#include "granary/daemon/connection_threads.h"
#include "granary/daemon/observability.h"
#include "granary/posix/mount_point.h"
#include "granary/posix/posix_view.h"
#include "granary/sidecar/sample_cache.h"
#include "granary/sidecar/sample_fetcher.h"
#include "granary/store/open_store.h"
#include "sidecar_metrics.h"

namespace granary::sidecar {

namespace sp = sidecar_protocol;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kReceiveBuffer = 64 * 1024;

timeval TimevalOf(std::chrono::milliseconds d) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

}  // namespace

struct Sidecar::Impl {
  SidecarConfig config;
  std::shared_ptr<spdlog::logger> log = GetLogger("sidecar");
  std::string name;

  std::mutex store_mu;
  std::unique_ptr<MetadataStore> store;
  std::unique_ptr<IdentityExecutor> executor;
  std::unique_ptr<SampleFetcher> fetcher;

  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  SidecarMetrics metrics;
  std::unique_ptr<ObservabilityServer> observability;
  std::mutex ready_mu;
  Status ready = Status::Unavailable("starting");
  std::atomic<bool> started{false};  // listening, and every `mounts` view mounted

  ScopedFd listen_fd;
  ScopedFd wake_fd;  // eventfd: Stop wakes the accept loop
  std::thread accept_thread;
  std::thread refresh_thread;
  std::vector<std::thread> workers;

  // `mounts`: the POSIX views served in process (before `caches`' readers go).
  std::mutex views_mu;  // guards `views` (the refresh loop reads their counters)
  std::vector<std::unique_ptr<posix::PosixView>> views;
  ConnectionThreads connections;
  ConnectionLimits limits;             // from max_clients and max_clients_per_uid
  std::atomic<uint64_t> next_conn{1};  // connection ids, for logs

  std::mutex caches_mu;
  std::map<std::string, std::shared_ptr<SampleCache>> caches;
  std::mutex open_mu;  // serialises loading datasets

  std::mutex work_mu;
  std::condition_variable work_cv;
  uint64_t work_seq = 0;
  std::atomic<bool> stopping{false};
  bool stopped = false;

  // ---- set-up -------------------------------------------------------------------------

  Status OpenStore() {
    const Clock::time_point deadline = Clock::now() + config.startup_timeout;
    std::chrono::milliseconds backoff{100};
    while (true) {
      Result<std::unique_ptr<MetadataStore>> opened = OpenMetadataStore(config.metadata_store);
      if (opened.ok()) {
        store = std::move(*opened);
        return Status::Ok();
      }
      if (opened.status().code() != StatusCode::kUnavailable || Clock::now() + backoff > deadline) {
        return opened.status().WithContext("open the metadata store " +
                                           Quoted(config.metadata_store));
      }
      log->warn("metadata store {} unreachable ({}); retrying", Quoted(config.metadata_store),
                opened.status().message());
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
    }
  }

  Status Listen() {
    const std::string& path = config.socket_path;
    const size_t slash = path.rfind('/');
    const std::string dir = path.substr(0, std::max<size_t>(slash, 1));
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      if (errno != ENOENT || ::mkdir(dir.c_str(), 0755) != 0) {
        return Status::FromErrno(errno, "create the socket's directory " + Quoted(dir));
      }
    }
    UnixListenOptions options;
    options.mode = config.socket_mode;
    GRANARY_ASSIGN_OR_RETURN(listen_fd, ListenUnix(path, options));
    wake_fd = ScopedFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_fd.valid()) return Status::FromErrno(errno, "create the sidecar's wake-up eventfd");
    return Status::Ok();
  }

  void SignalWork() {
    std::lock_guard<std::mutex> lock(work_mu);
    ++work_seq;
    work_cv.notify_all();
  }

  // ---- datasets -----------------------------------------------------------------------

  Result<std::shared_ptr<SampleCache>> OpenCache(const std::string& dataset) {
    std::lock_guard<std::mutex> open_lock(open_mu);
    std::shared_ptr<SampleCache> cached;
    {
      std::lock_guard<std::mutex> lock(caches_mu);
      if (auto it = caches.find(dataset); it != caches.end()) cached = it->second;
    }
    Result<DatasetRecord> record = [&] {
      std::lock_guard<std::mutex> lock(store_mu);
      return store->GetDataset(dataset);
    }();
    if (!record.ok()) {
      if (record.status().code() == StatusCode::kNotFound) {
        return Status::NotFound("dataset " + Quoted(dataset) +
                                " does not exist; create it with `granary dataset create " +
                                dataset + " --source file:///path` and wait for it");
      }
      // Keep serving what we have while the store is away.
      if (cached != nullptr) return cached;
      return record.status().WithContext("look up dataset " + Quoted(dataset));
    }
    if (record->spec.pool != config.pool) {
      return Status::FailedPrecondition("dataset " + Quoted(dataset) + " is in pool " +
                                        Quoted(record->spec.pool) + "; this sidecar serves pool " +
                                        Quoted(config.pool) +
                                        ": use the sidecar of that pool's nodes");
    }
    if (record->manifest_id.empty() || (record->state.phase != DatasetPhase::kStaging &&
                                        record->state.phase != DatasetPhase::kReady)) {
      return Status::FailedPrecondition(
          "dataset " + Quoted(dataset) + " is " +
          std::string(DatasetPhaseName(record->state.phase)) +
          (record->state.message.empty() ? "" : " (" + record->state.message + ")") +
          ", not Staging or Ready; wait with `granary dataset wait " + dataset + "`");
    }
    if (cached != nullptr && cached->manifest().id().ToHex() == record->manifest_id) return cached;

    Result<std::string> bytes = [&] {
      std::lock_guard<std::mutex> lock(store_mu);
      return store->GetManifest(record->manifest_id);
    }();
    if (!bytes.ok()) return bytes.status().WithContext("read the manifest of " + Quoted(dataset));
    Result<Manifest> manifest = Manifest::Decode(*bytes);
    if (!manifest.ok()) {
      return manifest.status().WithContext("decode the manifest of " + Quoted(dataset));
    }
    FetchDataset fd;
    fd.name = dataset;
    fd.manifest = std::make_shared<const Manifest>(std::move(*manifest));
    fd.source_uri = record->spec.source_uri;
    fd.owner = record->owner;
    fd.replication = record->spec.replication;
    fd.nodes = record->spec.nodes;
    SampleCacheOptions options;
    options.arena_bytes = config.arena_bytes;
    options.window_samples = config.window_samples;
    options.window_bytes = config.window_bytes;
    options.work_available = [this] { SignalWork(); };
    GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<SampleCache> made,
                             SampleCache::Create(std::move(fd), options));
    std::shared_ptr<SampleCache> cache = std::move(made);
    {
      std::lock_guard<std::mutex> lock(caches_mu);
      caches[dataset] = cache;
    }
    log->info("opened dataset {} (manifest {}, {} samples, arena {} bytes)", Quoted(dataset),
              record->manifest_id, cache->manifest().sample_count(), cache->arena_bytes());
    return cache;
  }

  std::vector<std::shared_ptr<SampleCache>> Caches() {
    std::lock_guard<std::mutex> lock(caches_mu);
    std::vector<std::shared_ptr<SampleCache>> out;
    for (auto& [n, c] : caches) out.push_back(c);
    return out;
  }

  // Mounts each `mounts` entry, reading from this sidecar's own cache.
  Status MountViews() {
    for (const SidecarConfig::Mount& m : config.mounts) {
      const std::string what = "mounting dataset " + Quoted(m.dataset) + " at " + Quoted(m.dir);
      Result<std::shared_ptr<SampleCache>> cache = OpenCache(m.dataset);
      if (!cache.ok()) return cache.status().WithContext(what + " (`mounts`)");
      Result<std::string> point = posix::PrepareMountPoint(m.dir);
      if (!point.ok()) return point.status().WithContext(what + " (`mounts`)");
      DatasetOwner owner = (*cache)->dataset().owner;
      posix::PosixViewOptions options;
      options.mount_point = *point;
      options.dataset = m.dataset;
      options.uid = owner.uid;
      options.gid = owner.gid;
      // As root, the training processes are other users: let them in, and
      // the modes (owner and group of the dataset) decide.
      options.allow_other = ::geteuid() == 0;
      // Readahead follows the plan epoch (or manifest order) the readers do.
      options.list_plans = [this, dataset = m.dataset] {
        std::lock_guard<std::mutex> lock(store_mu);
        if (store == nullptr) return std::vector<PlanRecord>{};
        Result<std::vector<PlanRecord>> listed = store->ListPlans(dataset);
        return listed.ok() ? std::move(*listed) : std::vector<PlanRecord>{};
      };
      auto reader =
          std::make_shared<CacheContentReader>(*cache, FetchFor(*cache), config.wait_timeout);
      Result<std::unique_ptr<posix::PosixView>> view =
          posix::PosixView::Mount(options, (*cache)->dataset().manifest, reader);
      if (!view.ok()) return view.status().WithContext(what + " (`mounts`)");
      log->info("mounted dataset {} at {} (read-only, served from this sidecar)", Quoted(m.dataset),
                Quoted(*point));
      std::lock_guard<std::mutex> lock(views_mu);
      views.push_back(std::move(*view));
    }
    return Status::Ok();
  }

  FetchFn FetchFor(const std::shared_ptr<SampleCache>& cache) {
    return [this, cache](std::span<const FetchTarget> targets, std::span<FetchOutcome> outcomes) {
      fetcher->Fetch(cache->FetchView(), targets, outcomes);
    };
  }

  // ---- threads ------------------------------------------------------------------------

  void WorkerLoop() {
    uint64_t seen = 0;
    while (!stopping) {
      bool any = false;
      for (const std::shared_ptr<SampleCache>& cache : Caches()) {
        std::vector<FetchTarget> work = cache->TakePrefetchWork(config.fetch_batch);
        if (work.empty()) continue;
        any = true;
        std::vector<FetchOutcome> outcomes(work.size());
        fetcher->Fetch(cache->FetchView(), work, outcomes);
        cache->CompletePrefetch(work, outcomes);
        for (size_t i = 0; i < work.size(); ++i) {
          if (outcomes[i].status.ok()) {
            metrics.prefetched_samples->Increment();
            metrics.prefetched_bytes->Increment(static_cast<double>(work[i].out.size()));
          } else {
            metrics.prefetch_failures->Increment();
            log->debug("prefetch of sample {} of {} failed: {}", work[i].id,
                       Quoted(cache->dataset().name), outcomes[i].status.ToString());
          }
        }
      }
      if (!any) {
        std::unique_lock<std::mutex> lock(work_mu);
        work_cv.wait_for(lock, std::chrono::milliseconds(200),
                         [&] { return stopping || work_seq != seen; });
        seen = work_seq;
      }
    }
  }

  void RefreshLoop() {
    SidecarMetrics::Last last;
    Clock::time_point next_nodes = Clock::now();
    while (!stopping) {
      if (Clock::now() >= next_nodes) {
        Result<std::vector<NodeRecord>> nodes = [&] {
          std::lock_guard<std::mutex> lock(store_mu);
          return store->ListNodes(config.pool);
        }();
        {
          std::lock_guard<std::mutex> lock(ready_mu);
          if (nodes.ok()) {
            fetcher->SetNodes(std::move(*nodes));
            ready = Status::Ok();
          } else {
            metrics.store_errors->Increment();
            ready = Status::Unavailable("metadata store unreachable: " + nodes.status().message() +
                                        "; serving what is cached and falling through to sources");
            log->warn("listing the nodes of pool {}: {}", Quoted(config.pool),
                      nodes.status().ToString());
          }
        }
        // A dataset's node list may change while it is open (a Slurm job's
        // prologs add the job's nodes one by one).
        for (const std::shared_ptr<SampleCache>& cache : Caches()) {
          Result<DatasetRecord> record = [&] {
            std::lock_guard<std::mutex> lock(store_mu);
            return store->GetDataset(cache->dataset().name);
          }();
          if (record.ok()) cache->SetPlacedNodes(record->spec.nodes);
        }
        next_nodes = Clock::now() + config.refresh_interval;
      }
      SampleCacheStats total;
      for (const std::shared_ptr<SampleCache>& cache : Caches()) total += cache->Stats();
      const size_t sessions = connections.open();
      metrics.Refresh(total, fetcher->counters(), sessions, &last);
      {
        std::array<uint64_t, posix::kFuseOpCount> requests{};
        std::lock_guard<std::mutex> lock(views_mu);
        for (const auto& view : views) {
          const posix::PosixView::Counters c = view->counters();
          for (size_t op = 0; op < posix::kFuseOpCount; ++op) requests[op] += c.requests[op];
        }
        metrics.RefreshPosix(requests, &last);
      }
      std::unique_lock<std::mutex> lock(work_mu);
      work_cv.wait_for(lock, std::chrono::milliseconds(250), [&] { return stopping.load(); });
    }
  }

  void AcceptLoop() {
    while (!stopping) {
      pollfd fds[2] = {{listen_fd.get(), POLLIN, 0}, {wake_fd.get(), POLLIN, 0}};
      const int n = ::poll(fds, 2, 1000);
      connections.ReapFinished();
      if (n < 0 && errno != EINTR) {
        log->error("poll on the sidecar socket failed: {}", std::strerror(errno));
        return;
      }
      if (stopping) return;
      if (n <= 0 || (fds[0].revents & POLLIN) == 0) continue;
      Result<ScopedFd> accepted = AcceptUnix(listen_fd.get());
      if (!accepted.ok()) continue;
      ScopedFd fd = std::move(*accepted);
      // Connections are served with blocking I/O on their own thread.
      const int flags = ::fcntl(fd.get(), F_GETFL);
      ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
      // A client that does not take a reply within idle_timeout is closed.
      const timeval send_timeout = TimevalOf(config.idle_timeout);
      (void)::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
      Result<PeerCredentials> peer = PeerCredentialsOf(fd.get());
      if (!peer.ok()) {
        metrics.rejected_clients_full->Increment();
        log->warn("SO_PEERCRED of a new client failed ({}); refused", peer.status().ToString());
        continue;
      }
      const uint32_t uid = peer->uid;
      const bool privileged = uid == 0 || uid == ::geteuid();
      const uint64_t id = next_conn++;
      const Admission admitted = connections.Start(
          fd, uid, privileged, limits, [this, id](int conn) { ServeConnection(id, conn); });
      if (admitted == Admission::kAdmitted) continue;
      std::string why;
      if (admitted == Admission::kFull) {
        metrics.rejected_clients_full->Increment();
        why = "the sidecar serves at most " + std::to_string(limits.max_open) +
              " clients at once (max_clients); close idle ones or raise max_clients";
      } else {
        metrics.rejected_clients_uid->Increment();
        why = admitted == Admission::kUidFull
                  ? "uid " + std::to_string(uid) + " already has " +
                        std::to_string(limits.per_uid) +
                        " connections to the sidecar (max_clients_per_uid); close idle ones"
                  : "the sidecar keeps its last " + std::to_string(limits.reserved) +
                        " places for root and its own user; uid " + std::to_string(uid) +
                        " must wait for other users' clients to close";
      }
      const std::string error = sp::EncodeError(0, Status::ResourceExhausted(why),
                                                /*closing=*/true, sp::kHandshakeVersion);
      (void)SendWithFds(fd.get(), error);
    }
  }

  // ---- one connection -------------------------------------------------------------------

  struct Session {
    uint64_t conn = 0;
    bool hello = false;
    // Before HELLO, errors go out as the handshake version every client reads.
    uint16_t version = sp::kHandshakeVersion;
    std::string client_name;
    std::shared_ptr<SampleCache> cache;
    uint64_t client = 0;
    std::shared_ptr<const Plan> plan;  // SET_PLAN: what NEXT walks
    size_t next = 0;
  };

  void ServeConnection(uint64_t id, int conn) {
    Session session;
    session.conn = id;
    metrics.sessions_opened->Increment();
    sp::FrameDecoder decoder;
    std::string buffer(kReceiveBuffer, '\0');
    bool open = true;
    // Idle from accept and from the end of each reply until a whole request
    // is in: bytes of a frame that never completes do not keep the place.
    Clock::time_point idle_deadline = Clock::now() + config.idle_timeout;
    while (open && !stopping) {
      if (!AwaitRequestBytes(conn, idle_deadline)) {
        if (stopping) break;
        metrics.idle_closes->Increment();
        log->debug("connection {} ({}): idle for {} ms (idle_timeout); closed", id,
                   session.client_name, config.idle_timeout.count());
        (void)SendAll(conn,
                      sp::EncodeError(0,
                                      Status::DeadlineExceeded(
                                          "the sidecar closed this connection after " +
                                          DurationText(config.idle_timeout) +
                                          " with no request (idle_timeout); its pins are "
                                          "dropped: reconnect, and PING while pausing longer"),
                                      /*closing=*/true, session.version),
                      {});
        break;
      }
      std::vector<ScopedFd> fds;  // clients pass none; any that arrive are closed
      Result<size_t> got =
          ReceiveWithFds(conn, std::span<char>(buffer.data(), buffer.size()), &fds);
      if (!got.ok() || *got == 0) {
        if (got.ok() && !decoder.Finish().ok()) metrics.errors_framing->Increment();
        break;
      }
      std::string_view data(buffer.data(), *got);
      while (open && !data.empty()) {
        Result<size_t> used = decoder.Feed(data);
        if (!used.ok()) {
          metrics.errors_framing->Increment();
          log->debug("connection {} ({}): {}", id, session.client_name, used.status().ToString());
          (void)SendAll(conn, sp::EncodeError(0, used.status(), /*closing=*/true, session.version),
                        {});
          open = false;
          break;
        }
        data.remove_prefix(*used);
        if (decoder.has_frame()) {
          open = HandleFrame(conn, &session, decoder.TakeFrame());
          idle_deadline = Clock::now() + config.idle_timeout;
        }
      }
    }
    // ConnectionThreads shuts the connection down and closes it.
    if (session.cache != nullptr) session.cache->DropClient(session.client);
  }

  // Waits until `conn` has bytes (or end of stream, or is shut down by
  // Stop); false once `deadline` passes first.
  bool AwaitRequestBytes(int conn, Clock::time_point deadline) {
    for (int round = 0; round < kMaxPollRounds; ++round) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{conn, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (r > 0 || (r < 0 && errno != EINTR)) return true;  // recv says which
      if (stopping) return true;
    }
    return false;
  }

  Status SendAll(int fd, std::string_view bytes, std::span<const int> fds) {
    bool first = true;
    while (!bytes.empty()) {
      Result<size_t> sent = SendWithFds(fd, bytes, first ? fds : std::span<const int>());
      if (!sent.ok()) return sent.status();
      first = false;
      bytes.remove_prefix(*sent);
    }
    return Status::Ok();
  }

  // Sends `reply` for `request_id` in the session's version; false if the
  // connection is done.
  bool Reply(int fd, const Session* s, uint64_t request_id, const sp::Reply& reply,
             std::span<const int> fds = {}) {
    Result<std::string> bytes = sp::EncodeReply(request_id, reply, sp::Limits{}, s->version);
    if (!bytes.ok()) {
      log->error("encoding a reply failed: {}", bytes.status().ToString());
      return SendAll(fd, sp::EncodeError(request_id, bytes.status(), false, s->version), {}).ok();
    }
    return SendAll(fd, *bytes, fds).ok();
  }

  bool Fail(int fd, const Session* s, uint64_t request_id, const Status& status,
            bool closing = false) {
    metrics.errors_request->Increment();
    const bool sent =
        SendAll(fd, sp::EncodeError(request_id, status, closing, s->version), {}).ok();
    return sent && !closing;
  }

  bool HandleFrame(int fd, Session* s, const sp::Frame& frame) {
    const uint64_t rid = frame.header.request_id;
    Result<sp::Request> request = sp::DecodeRequest(frame);
    if (!request.ok()) return Fail(fd, s, rid, request.status());
    metrics.Request(frame.header.type);
    if (s->hello && frame.header.version > s->version) {
      // The stream is in step; only this request is refused.
      return Fail(fd, s, rid,
                  Status::VersionMismatch(
                      std::string(sp::MessageTypeName(frame.header.type)) + " frame is version " +
                      std::to_string(frame.header.version) + ", newer than the version " +
                      std::to_string(s->version) +
                      " this connection agreed on in HELLO; send frames of the agreed version"));
    }
    if (!s->hello && !std::holds_alternative<sp::Hello>(*request)) {
      return Fail(fd, s, rid,
                  Status::FailedPrecondition(std::string(sp::MessageTypeName(frame.header.type)) +
                                             " before HELLO; a connection starts with HELLO"),
                  /*closing=*/true);
    }
    return std::visit([&](auto& r) { return Handle(fd, s, rid, r); }, *request);
  }

  bool Handle(int fd, Session* s, uint64_t rid, const sp::Hello& hello) {
    if (s->hello) return Fail(fd, s, rid, Status::FailedPrecondition("HELLO sent twice"));
    Result<uint16_t> version = sp::NegotiateVersion(hello);
    if (!version.ok()) return Fail(fd, s, rid, version.status(), /*closing=*/true);
    s->hello = true;
    s->version = *version;
    s->client_name = hello.client_name;
    sp::HelloReply reply;
    reply.version = *version;
    reply.sidecar_name = name;
    return Reply(fd, s, rid, reply);
  }

  bool Handle(int fd, Session* s, uint64_t rid, const sp::Open& open) {
    if (s->cache != nullptr) {
      return Fail(fd, s, rid,
                  Status::FailedPrecondition(
                      "this connection already has dataset " + Quoted(s->cache->dataset().name) +
                      " open; open another connection for " + Quoted(open.dataset)));
    }
    Result<std::shared_ptr<SampleCache>> cache = OpenCache(open.dataset);
    if (!cache.ok()) return Fail(fd, s, rid, cache.status());
    s->cache = *cache;
    s->client = s->cache->AddClient();
    sp::OpenReply reply;
    reply.manifest_id = s->cache->manifest().id();
    reply.sample_count = s->cache->manifest().sample_count();
    reply.total_bytes = s->cache->manifest().total_bytes();
    reply.chunk_count = s->cache->manifest().chunk_count();
    reply.arena_bytes = s->cache->arena_bytes();
    const int arena = s->cache->arena_fd();
    return Reply(fd, s, rid, reply, std::span<const int>(&arena, 1));
  }

  bool NeedOpen(int fd, const Session* s, uint64_t rid, std::string_view what) {
    if (s->cache != nullptr) return true;
    Fail(fd, s, rid,
         Status::FailedPrecondition(std::string(what) + " before OPEN; open a dataset first"));
    return false;
  }

  bool Handle(int fd, Session* s, uint64_t rid, const sp::SetPlan& p) {
    if (!NeedOpen(fd, s, rid, "SET_PLAN")) return true;
    PlanSpec spec;
    spec.seed = p.seed;
    spec.epoch = p.epoch;
    spec.world_size = p.world_size;
    spec.rank = p.rank;
    spec.batch_size = p.batch_size;
    spec.drop_last = p.drop_last;
    spec.mode = static_cast<PlanMode>(p.mode);
    spec.window = p.window_chunks;
    Result<Plan> plan = Plan::Create(s->cache->manifest(), spec);
    if (!plan.ok())
      return Fail(fd, s, rid, plan.status().WithContext("SET_PLAN " + Quoted(p.plan_id)));
    if (p.start_position > plan->samples().size()) {
      return Fail(fd, s, rid,
                  Status::OutOfRange("SET_PLAN " + Quoted(p.plan_id) + ": start_position " +
                                     std::to_string(p.start_position) + " is past the rank's " +
                                     std::to_string(plan->samples().size()) + " samples"));
    }
    s->cache->SetCursor(p.plan_id + "/rank" + std::to_string(p.rank), *plan, p.start_position);
    s->plan = std::make_shared<const Plan>(std::move(*plan));
    s->next = p.start_position;
    metrics.plans->Increment();

    PlanRecord record;
    record.plan_id = p.plan_id;
    record.seed = p.seed;
    record.first_epoch = static_cast<uint32_t>(p.epoch);
    record.world_size = p.world_size;
    record.batch_size = p.batch_size;
    record.drop_last = p.drop_last;
    record.mode = std::string(PlanModeName(spec.mode));
    record.window_chunks = p.window_chunks;
    Status put = [&] {
      std::lock_guard<std::mutex> lock(store_mu);
      return store->PutPlan(s->cache->dataset().name, record);
    }();
    if (!put.ok()) {
      // Prefetch works without it; only the cache nodes' staging order misses it.
      metrics.store_errors->Increment();
      log->warn("registering plan {} of {} in the store: {}", Quoted(p.plan_id),
                Quoted(s->cache->dataset().name), put.ToString());
    }
    return Reply(fd, s, rid, sp::Ok{});
  }

  bool Deliver(int fd, Session* s, uint64_t rid, std::span<const SampleId> ids, uint32_t lookahead,
               bool end_of_epoch) {
    std::vector<AcquiredSample> got = s->cache->Acquire(
        s->client, ids, lookahead, FetchFor(s->cache), Clock::now() + config.wait_timeout);
    sp::Samples reply;
    reply.end_of_epoch = end_of_epoch;
    reply.items.reserve(got.size());
    if (!got.empty()) metrics.client_wait->Observe(got.front().waited_seconds);
    for (const AcquiredSample& a : got) {
      sp::SampleItem item;
      item.id = a.id;
      item.status = a.status;
      item.hint = a.hint;
      if (a.status.ok()) {
        item.token = a.token;
        item.offset = a.offset;
        item.length = a.length;
        item.checksum = a.checksum;
        // Hints count too: they are handed out, and the client reads them
        // without asking again.
        metrics.Served(a.prefetched, a.length);
      } else {
        metrics.failed_samples->Increment();
      }
      reply.items.push_back(std::move(item));
    }
    return Reply(fd, s, rid, reply);
  }

  bool Handle(int fd, Session* s, uint64_t rid, const sp::Get& get) {
    if (!NeedOpen(fd, s, rid, "GET")) return true;
    s->cache->Release(s->client, get.release);
    return Deliver(fd, s, rid, get.ids, std::min<uint32_t>(get.lookahead, 1024), false);
  }

  bool Handle(int fd, Session* s, uint64_t rid, const sp::Next& next) {
    if (!NeedOpen(fd, s, rid, "NEXT")) return true;
    s->cache->Release(s->client, next.release);
    if (s->plan == nullptr) {
      return Fail(fd, s, rid,
                  Status::FailedPrecondition("NEXT before SET_PLAN; announce the plan first"));
    }
    const size_t end = s->plan->read_count();
    const size_t from = std::min(s->next, end);
    const size_t to = std::min<size_t>(end, from + next.max_samples);
    s->next = to;
    std::span<const SampleId> ids(s->plan->samples().data() + from, to - from);
    return Deliver(fd, s, rid, ids, 0, to >= end);
  }

  bool Handle(int fd, Session* s, uint64_t rid, const sp::Release& release) {
    if (!NeedOpen(fd, s, rid, "RELEASE")) return true;
    s->cache->Release(s->client, release.tokens);
    return Reply(fd, s, rid, sp::Ok{});
  }

  bool Handle(int fd, Session* s, uint64_t rid, const sp::Stat& stat) {
    if (!NeedOpen(fd, s, rid, "STAT")) return true;
    const Manifest& m = s->cache->manifest();
    if (stat.first_id >= m.sample_count()) {
      return Fail(fd, s, rid,
                  Status::OutOfRange("STAT from sample " + std::to_string(stat.first_id) + ": " +
                                     Quoted(s->cache->dataset().name) + " has " +
                                     std::to_string(m.sample_count()) + " samples"));
    }
    sp::StatReply reply;
    reply.first_id = stat.first_id;
    const uint64_t end = std::min<uint64_t>(m.sample_count(), uint64_t{stat.first_id} + stat.count);
    size_t body = 64;
    const size_t budget = sp::kDefaultMaxBodyBytes - 4096;
    for (uint64_t id = stat.first_id; id < end && reply.entries.size() < sp::kDefaultMaxItems;
         ++id) {
      const auto sid = static_cast<SampleId>(id);
      sp::StatEntry e{m.PathOf(sid), m.SizeOf(sid), m.MtimeOf(sid)};
      body += e.path.size() + 32;
      if (body > budget) break;
      reply.entries.push_back(std::move(e));
    }
    return Reply(fd, s, rid, reply);
  }

  bool Handle(int fd, Session* s, uint64_t rid, const sp::Lookup& lookup) {
    if (!NeedOpen(fd, s, rid, "LOOKUP")) return true;
    sp::LookupReply reply;
    for (const std::string& path : lookup.paths) {
      sp::LookupItem item;
      if (Status ok = ValidateSamplePath(path); !ok.ok()) {
        item.status = ok;
      } else if (Result<SampleId> id = s->cache->manifest().Find(path); id.ok()) {
        item.id = *id;
      } else {
        item.status = Status::NotFound("no file " + Quoted(path) + " in dataset " +
                                       Quoted(s->cache->dataset().name));
      }
      reply.items.push_back(std::move(item));
    }
    return Reply(fd, s, rid, reply);
  }

  bool Handle(int fd, Session* s, uint64_t rid, const sp::Ping&) {
    return Reply(fd, s, rid, sp::Pong{});
  }

  // Directories of the manifest besides the root (its index 0), paged like STAT.
  bool Handle(int fd, Session* s, uint64_t rid, const sp::Directories& dirs) {
    if (!NeedOpen(fd, s, rid, "DIRECTORIES")) return true;
    const Manifest& m = s->cache->manifest();
    const auto total = static_cast<uint32_t>(m.directory_count() - 1);
    if (dirs.first > total) {
      return Fail(
          fd, s, rid,
          Status::OutOfRange("DIRECTORIES from index " + std::to_string(dirs.first) + ": " +
                             Quoted(s->cache->dataset().name) + " has " + std::to_string(total) +
                             " directories besides the root; ask from 0 up to that"));
    }
    sp::DirectoriesReply reply;
    reply.first = dirs.first;
    reply.total = total;
    const uint64_t end = std::min<uint64_t>(total, uint64_t{dirs.first} + dirs.count);
    size_t body = 64;
    const size_t budget = sp::kDefaultMaxBodyBytes - 4096;
    for (uint64_t i = dirs.first; i < end && reply.entries.size() < sp::kDefaultMaxItems; ++i) {
      const auto d = static_cast<uint32_t>(i + 1);
      sp::DirectoryItem e{m.DirectoryPath(d), m.DirectoryMode(d)};
      body += e.path.size() + 8;
      if (body > budget) break;
      reply.entries.push_back(std::move(e));
    }
    return Reply(fd, s, rid, reply);
  }
};

// ---- Sidecar ------------------------------------------------------------------------------

Result<std::unique_ptr<Sidecar>> Sidecar::Start(const SidecarConfig& config) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->limits = ConnectionLimits::DefaultFor(config.max_clients);
  if (config.max_clients_per_uid != 0) impl->limits.per_uid = config.max_clients_per_uid;
  Result<std::string> host = HostName();
  impl->name = "granary-sidecar@" + (host.ok() ? *host : std::string("unknown"));
  GRANARY_ASSIGN_OR_RETURN(impl->metrics, SidecarMetrics::Declare(*impl->registry));
  GRANARY_RETURN_IF_ERROR(impl->OpenStore());

  IdentityExecutorOptions executor_options;
  executor_options.threads = config.source_concurrency;
  GRANARY_ASSIGN_OR_RETURN(impl->executor, IdentityExecutor::Start(executor_options));
  SampleFetcherOptions fetch;
  fetch.client_name = impl->name.substr(0, 200);
  fetch.local_node_id = config.local_node;
  fetch.local_node_socket = config.local_node_socket;
  fetch.node_down_for = config.node_down_for;
  fetch.peer.connect_timeout = config.connect_timeout;
  fetch.peer.call_timeout = config.call_timeout;
  {
    Result<ClientCredentials> credentials =
        LoadPeerCredentials(config.cluster_key_file, config.peer_token_file);
    if (!credentials.ok()) return credentials.status().WithContext("`cluster_key_file`");
    fetch.peer.credentials = std::move(*credentials);
    Result<std::shared_ptr<TlsContext>> tls = TlsContext::ForClient(config.tls_ca_file);
    if (!tls.ok()) return tls.status().WithContext("`tls_ca_file`");
    fetch.peer.tls = std::move(*tls);
  }
  fetch.source_fallthrough = config.source_fallthrough;
  fetch.source_concurrency = config.source_concurrency;
  GRANARY_ASSIGN_OR_RETURN(impl->fetcher, SampleFetcher::Create(fetch, impl->executor.get()));
  {
    Result<std::vector<NodeRecord>> nodes = impl->store->ListNodes(config.pool);
    if (nodes.ok()) impl->fetcher->SetNodes(std::move(*nodes));
  }

  GRANARY_RETURN_IF_ERROR(impl->Listen());
  Impl* raw = impl.get();
  GRANARY_ASSIGN_OR_RETURN(
      impl->observability,
      ObservabilityServer::Start(config.metrics_listen.ToString(), impl->registry, [raw] {
        if (!raw->started) return Status::Unavailable("starting");
        std::lock_guard<std::mutex> lock(raw->ready_mu);
        return raw->ready;
      }));
  for (uint32_t i = 0; i < config.fetch_threads; ++i) {
    impl->workers.emplace_back([raw] { raw->WorkerLoop(); });
  }
  impl->refresh_thread = std::thread([raw] { raw->RefreshLoop(); });
  impl->accept_thread = std::thread([raw] { raw->AcceptLoop(); });
  impl->log->info("serving on {} (mode {:o}), metrics on {}, pool {}, window {} samples / {} bytes",
                  Quoted(config.socket_path), config.socket_mode,
                  impl->observability->address().ToString(), Quoted(config.pool),
                  config.window_samples, config.window_bytes);
  auto sidecar = std::unique_ptr<Sidecar>(new Sidecar(std::move(impl)));
  // Mounted last, over a running sidecar; a mount that fails stops it all.
  if (Status mounted = raw->MountViews(); !mounted.ok()) {
    sidecar->Stop();
    return mounted;
  }
  raw->started = true;
  return sidecar;
}

Sidecar::Sidecar(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Sidecar::~Sidecar() { Stop(); }

std::string Sidecar::metrics_address() const { return impl_->observability->address().ToString(); }

void Sidecar::Stop() {
  Impl& i = *impl_;
  if (i.stopped) return;
  i.stopped = true;
  // The views first: their reads need the fetcher and the caches.
  std::vector<std::unique_ptr<posix::PosixView>> views;
  {
    std::lock_guard<std::mutex> lock(i.views_mu);
    views.swap(i.views);
  }
  for (auto& view : views) view->Stop();
  views.clear();
  i.stopping = true;
  const uint64_t one = 1;
  if (i.wake_fd.valid()) (void)::write(i.wake_fd.get(), &one, sizeof(one));
  if (i.accept_thread.joinable()) i.accept_thread.join();
  ::unlink(i.config.socket_path.c_str());
  i.connections.ShutdownAll();
  i.SignalWork();
  for (std::thread& t : i.workers) t.join();
  if (i.refresh_thread.joinable()) i.refresh_thread.join();
  i.connections.JoinAll();
  if (i.observability != nullptr) i.observability->Stop();
  i.log->info("stopped");
}

}  // namespace granary::sidecar
