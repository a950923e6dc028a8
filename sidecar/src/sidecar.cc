// Sidecar (sidecar.h): the daemon around the SidecarService. It owns the
// store, the fetcher, the socket and the threads: the accept loop
// (UnixAcceptLoop) and one thread per connection, which reads frames, hands
// each to the service and writes its answer back; the fetch workers that
// keep the prefetch windows full; the refresh loop (node list, metrics); the
// `mounts` views. What each request does is the service's
// (sidecar_service.cc).

#include "granary/sidecar/sidecar.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache_content_reader.h"
#include "granary/config/config_keys.h"
#include "granary/core/log.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "granary/core/thread_name.h"
#include "granary/daemon/connection_threads.h"
#include "granary/daemon/observability.h"
#include "granary/daemon/unix_accept_loop.h"
#include "granary/fabric/endpoint.h"
#include "granary/fabric/fabric_transport.h"
#include "granary/fetcher/sample_fetcher.h"
#include "granary/peer/peer_auth.h"
#include "granary/posix/mount_point.h"
#include "granary/posix/posix_view.h"
#include "granary/protocol/sidecar_protocol.h"
#include "granary/protocol/unix_socket.h"
#include "granary/sidecar/sample_cache.h"
#include "granary/sidecar/sidecar_service.h"
#include "granary/store/open_store.h"
#include "sidecar_metrics.h"

namespace granary::sidecar {

namespace sp = sidecar_protocol;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kReceiveBuffer = 64 * 1024;
// How long Stop waits for plans queued for the store to be written.
constexpr std::chrono::seconds kPlanFlushTimeout{10};

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

  // The store is thread-safe (metadata_store.h): the service, the refresh
  // loop and the views' plan listing call it without a lock of their own.
  std::unique_ptr<MetadataStore> store;
  std::unique_ptr<IdentityExecutor> executor;
  std::unique_ptr<SampleFetcher> fetcher;
  // Before the service, which counts in them until it is gone.
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  SidecarMetrics metrics;
  std::unique_ptr<SidecarService> service;  // every request's answer, the open datasets

  std::unique_ptr<ObservabilityServer> observability;
  std::mutex ready_mu;
  Status ready = Status::Unavailable("starting");
  std::atomic<bool> started{false};  // listening, and every `mounts` view mounted

  ScopedFd listen_fd;
  std::thread refresh_thread;
  std::vector<std::thread> workers;

  // `mounts`: the POSIX views served in process (before `caches`' readers go).
  std::mutex views_mu;  // guards `views` (the refresh loop reads their counters)
  std::vector<std::unique_ptr<posix::PosixView>> views;
  ConnectionThreads connections;
  ConnectionLimits limits;  // from max_clients and max_clients_per_uid
  // Over listen_fd, into `connections` (declared after them: it goes first).
  std::unique_ptr<UnixAcceptLoop> accept_loop;

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
    return Status::Ok();
  }

  void SignalWork() {
    std::lock_guard<std::mutex> lock(work_mu);
    ++work_seq;
    work_cv.notify_all();
  }

  // ---- datasets -----------------------------------------------------------------------

  // Mounts each `mounts` entry, reading from this sidecar's own cache.
  Status MountViews() {
    for (const SidecarConfig::Mount& m : config.mounts) {
      const std::string what = "mounting dataset " + Quoted(m.dataset) + " at " + Quoted(m.dir);
      Result<std::shared_ptr<SampleCache>> cache = service->OpenDataset(m.dataset);
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
        if (store == nullptr) return std::vector<PlanRecord>{};
        Result<std::vector<PlanRecord>> listed = store->ListPlans(dataset);
        return listed.ok() ? std::move(*listed) : std::vector<PlanRecord>{};
      };
      auto reader = std::make_shared<CacheContentReader>(*cache, service->FetchFor(*cache),
                                                         config.wait_timeout);
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

  // ---- threads ------------------------------------------------------------------------

  void WorkerLoop() {
    uint64_t seen = 0;
    while (!stopping) {
      bool any = false;
      for (const std::shared_ptr<SampleCache>& cache : service->Caches()) {
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
    // The pool's nodes, listed only when the store's membership version moved.
    NodeListFollower follower(config.pool);
    while (!stopping) {
      if (Clock::now() >= next_nodes) {
        Result<std::optional<std::vector<NodeRecord>>> nodes =
            follower.Poll(*store, std::chrono::steady_clock::now());
        {
          std::lock_guard<std::mutex> lock(ready_mu);
          if (nodes.ok()) {
            if (nodes->has_value()) fetcher->SetNodes(std::move(**nodes));
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
        for (const std::shared_ptr<SampleCache>& cache : service->Caches()) {
          Result<DatasetRecord> record = store->GetDataset(cache->dataset().name);
          if (record.ok()) cache->SetPlacedNodes(record->spec.nodes);
        }
        next_nodes = Clock::now() + config.refresh_interval;
      }
      SampleCacheStats total;
      for (const std::shared_ptr<SampleCache>& cache : service->Caches()) total += cache->Stats();
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

  // How the accept loop admits, refuses and serves the sidecar socket's peers.
  UnixAcceptLoopOptions AcceptOptions() {
    UnixAcceptLoopOptions o;
    o.socket_name = "the sidecar socket " + Quoted(config.socket_path);
    o.log = log;
    o.limits = limits;
    o.prepare = [this](int fd) {
      // Connections are served with blocking I/O on their own thread.
      const int flags = ::fcntl(fd, F_GETFL);
      ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
      // A client that does not take a reply within idle_timeout is closed.
      const timeval send_timeout = TimevalOf(config.idle_timeout);
      (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    };
    o.unnamed = [this](const Status& why) {
      metrics.rejected_clients_full->Increment();
      log->warn("SO_PEERCRED of a new client failed ({}); refused", why.ToString());
    };
    o.refused = [this](int fd, uint32_t uid, Admission admitted) {
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
      (void)SendWithFds(fd, error);
    };
    o.serve = [this](uint64_t id, int fd) {
      NameThisThread("session");
      ServeConnection(id, fd);
    };
    return o;
  }

  // ---- one connection -------------------------------------------------------------------

  void ServeConnection(uint64_t id, int conn) {
    SidecarSession session;
    session.conn = id;
    if (Result<PeerCredentials> peer = PeerCredentialsOf(conn); peer.ok()) session.uid = peer->uid;
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
          const sp::Frame frame = decoder.TakeFrame();
          open =
              Answer(conn, session, frame.header.request_id, service->HandleFrame(session, frame));
          idle_deadline = Clock::now() + config.idle_timeout;
        }
      }
    }
    // ConnectionThreads shuts the connection down and closes it.
    service->Close(session);
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

  // Sends `answer` to request `request_id` in the session's version; false
  // if the connection is done (the answer closes it, or sending failed).
  bool Answer(int fd, const SidecarSession& s, uint64_t request_id, const SidecarAnswer& answer) {
    if (!answer.error.ok()) {
      const bool sent =
          SendAll(fd, sp::EncodeError(request_id, answer.error, answer.closing, s.version), {})
              .ok();
      return sent && !answer.closing;
    }
    Result<std::string> bytes = sp::EncodeReply(request_id, answer.reply, sp::Limits{}, s.version);
    if (!bytes.ok()) {
      log->error("encoding a reply failed: {}", bytes.status().ToString());
      return SendAll(fd, sp::EncodeError(request_id, bytes.status(), false, s.version), {}).ok();
    }
    std::vector<int> fds;
    if (answer.fd >= 0) fds.push_back(answer.fd);
    for (const ScopedFd& owned : answer.owned_fds) fds.push_back(owned.get());
    return SendAll(fd, *bytes, fds).ok();
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
    // Neither configured: the default key where this user may read it (a
    // root sidecar on a host set up with `granary cluster-key generate`).
    std::string key_file = config.cluster_key_file;
    if (key_file.empty() && config.peer_token_file.empty()) {
      key_file = ReadableDefaultClusterKeyPath();
      if (!key_file.empty()) {
        GetLogger("sidecar")->info("cluster_key_file not set: using {}", key_file);
      }
    }
    Result<ClientCredentials> credentials = LoadPeerCredentials(key_file, config.peer_token_file);
    if (!credentials.ok()) return credentials.status().WithContext("`cluster_key_file`");
    fetch.peer.credentials = std::move(*credentials);
    Result<std::shared_ptr<TlsContext>> tls = TlsContext::ForClient(config.tls_ca_file);
    if (!tls.ok()) return tls.status().WithContext("`tls_ca_file`");
    fetch.peer.tls = std::move(*tls);
  }
  bool fabric_available = false;
  if (config.transport == "libfabric") {
    // Falls back to TCP, loudly, when the provider is not there: the
    // training still reads, at TCP's cost.
    Status probe = fabric::ProbeProvider(config.libfabric_provider);
    if (probe.ok()) {
      fetch.fabric = fabric::FabricPeerTransport(config.libfabric_provider);
      fabric_available = true;
    } else {
      impl->log->warn("transport libfabric: {}; reaching every cache node over TCP",
                      probe.message());
    }
  }
  impl->metrics.fabric_available->Set(fabric_available ? 1 : 0);
  fetch.source_fallthrough = config.source_fallthrough;
  fetch.source_concurrency = config.source_concurrency;
  GRANARY_ASSIGN_OR_RETURN(impl->fetcher, SampleFetcher::Create(fetch, impl->executor.get()));
  {
    Result<std::vector<NodeRecord>> nodes = impl->store->ListNodes(config.pool);
    if (nodes.ok()) impl->fetcher->SetNodes(std::move(*nodes));
  }

  Impl* raw = impl.get();
  SidecarServiceOptions service;
  service.name = impl->name;
  service.pool = config.pool;
  service.datasets = config.datasets;
  service.cache.arena_bytes = config.arena_bytes;
  service.cache.window_samples = config.window_samples;
  service.cache.window_bytes = config.window_bytes;
  service.cache.work_available = [raw] { raw->SignalWork(); };
  service.wait_timeout = config.wait_timeout;
  impl->service = std::make_unique<SidecarService>(std::move(service), impl->store.get(),
                                                   impl->fetcher.get(), &impl->metrics);

  GRANARY_RETURN_IF_ERROR(impl->Listen());
  GRANARY_ASSIGN_OR_RETURN(
      impl->observability,
      ObservabilityServer::Start(config.metrics_listen.ToString(), impl->registry, [raw] {
        if (!raw->started) return Status::Unavailable("starting");
        std::lock_guard<std::mutex> lock(raw->ready_mu);
        return raw->ready;
      }));
  GRANARY_ASSIGN_OR_RETURN(
      impl->accept_loop,
      UnixAcceptLoop::Start(impl->listen_fd.get(), &impl->connections, impl->AcceptOptions()));
  for (uint32_t i = 0; i < config.fetch_threads; ++i) {
    impl->workers.emplace_back([raw] {
      NameThisThread("prefetch");
      raw->WorkerLoop();
    });
  }
  impl->refresh_thread = std::thread([raw] {
    NameThisThread("refresh");
    raw->RefreshLoop();
  });
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
  if (i.accept_loop != nullptr) i.accept_loop->Stop();
  ::unlink(i.config.socket_path.c_str());
  i.connections.ShutdownAll();
  i.SignalWork();
  for (std::thread& t : i.workers) t.join();
  if (i.refresh_thread.joinable()) i.refresh_thread.join();
  i.connections.JoinAll();
  // No request is left to announce a plan: write those still queued, for as
  // long as a stop may take.
  if (i.service != nullptr) {
    const size_t unwritten = i.service->FlushPlans(Clock::now() + kPlanFlushTimeout);
    if (unwritten > 0) {
      i.log->warn(
          "stopping with {} plans not written to the store (it did not answer within "
          "{} s); the cache nodes stage without them until the jobs announce them again",
          unwritten, kPlanFlushTimeout.count());
    }
  }
  if (i.observability != nullptr) i.observability->Stop();
  i.log->info("stopped");
}

}  // namespace granary::sidecar
