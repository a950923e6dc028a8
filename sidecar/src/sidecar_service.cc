// SidecarService (sidecar_service.h): the answer to each request of the
// sidecar protocol, and the open datasets they share.

#include "granary/sidecar/sidecar_service.h"

#include <unistd.h>

#include <algorithm>
#include <utility>
#include <variant>

#include "granary/core/names.h"
#include "granary/protocol/plan_request.h"
#include "sidecar_metrics.h"

namespace granary::sidecar {

namespace sp = sidecar_protocol;
using SteadyClock = std::chrono::steady_clock;

SidecarService::SidecarService(SidecarServiceOptions options, MetadataStore* store,
                               SampleFetcher* fetcher, SidecarMetrics* metrics)
    : options_(std::move(options)),
      store_(store),
      fetcher_(fetcher),
      metrics_(metrics),
      plans_(store,
             [this](const std::string& dataset, const PlanRecord& plan, const Status& failed) {
               // Prefetch works without it; only the cache nodes' staging order misses it.
               metrics_->store_errors->Increment();
               log_->warn(
                   "registering plan {} of {} in the store: {}; the next SET_PLAN of it tries "
                   "again",
                   Quoted(plan.plan_id), Quoted(dataset), failed.ToString());
             }) {}

// ---- datasets ---------------------------------------------------------------------------

Result<std::shared_ptr<SampleCache>> SidecarService::OpenDataset(const std::string& dataset) {
  if (options_.datasets.has_value() &&
      std::find(options_.datasets->begin(), options_.datasets->end(), dataset) ==
          options_.datasets->end()) {
    std::string served;
    for (const std::string& name : *options_.datasets)
      served += (served.empty() ? "" : ", ") + name;
    return Status::PermissionDenied(
        "dataset " + Quoted(dataset) + " is not served by this sidecar, which serves " +
        (served.empty() ? std::string("no dataset") : "only " + served) +
        " (its `datasets` option; a Slurm job's sidecar serves the datasets its #DW lines name)");
  }
  std::lock_guard<std::mutex> open_lock(open_mu_);
  std::shared_ptr<SampleCache> cached;
  {
    std::lock_guard<std::mutex> lock(caches_mu_);
    if (auto it = caches_.find(dataset); it != caches_.end()) cached = it->second;
  }
  Result<DatasetRecord> record = store_->GetDataset(dataset);
  if (!record.ok()) {
    if (record.status().code() == StatusCode::kNotFound) {
      return Status::NotFound("dataset " + Quoted(dataset) +
                              " does not exist; create it with `granary dataset create " + dataset +
                              " --source file:///path` and wait for it");
    }
    // Keep serving what we have while the store is away.
    if (cached != nullptr) return cached;
    return record.status().WithContext("look up dataset " + Quoted(dataset));
  }
  if (record->spec.pool != options_.pool) {
    return Status::FailedPrecondition("dataset " + Quoted(dataset) + " is in pool " +
                                      Quoted(record->spec.pool) + "; this sidecar serves pool " +
                                      Quoted(options_.pool) +
                                      ": use the sidecar of that pool's nodes");
  }
  if (record->manifest_id.empty() || (record->state.phase != DatasetPhase::kStaging &&
                                      record->state.phase != DatasetPhase::kReady)) {
    return Status::FailedPrecondition(
        "dataset " + Quoted(dataset) + " is " + std::string(DatasetPhaseName(record->state.phase)) +
        (record->state.message.empty() ? "" : " (" + record->state.message + ")") +
        ", not Staging or Ready; wait with `granary dataset wait " + dataset + "`");
  }
  if (cached != nullptr && cached->manifest().id().ToHex() == record->manifest_id) return cached;

  Result<std::string> bytes = store_->GetManifest(record->manifest_id);
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
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<SampleCache> made,
                           SampleCache::Create(std::move(fd), options_.cache));
  std::shared_ptr<SampleCache> cache = std::move(made);
  {
    std::lock_guard<std::mutex> lock(caches_mu_);
    caches_[dataset] = cache;
  }
  log_->info("opened dataset {} (manifest {}, {} samples, arena {} bytes)", Quoted(dataset),
             record->manifest_id, cache->manifest().sample_count(), cache->arena_bytes());
  return cache;
}

std::vector<std::shared_ptr<SampleCache>> SidecarService::Caches() const {
  std::lock_guard<std::mutex> lock(caches_mu_);
  std::vector<std::shared_ptr<SampleCache>> out;
  for (const auto& [name, cache] : caches_) out.push_back(cache);
  return out;
}

FetchFn SidecarService::FetchFor(const std::shared_ptr<SampleCache>& cache) {
  return [this, cache](std::span<const FetchTarget> targets, std::span<FetchOutcome> outcomes) {
    fetcher_->Fetch(cache->FetchView(), targets, outcomes);
  };
}

// ---- frames -----------------------------------------------------------------------------

SidecarAnswer SidecarService::HandleFrame(SidecarSession& s, const sp::Frame& frame) {
  SidecarAnswer answer;
  Result<sp::Request> request = sp::DecodeRequest(frame);
  if (!request.ok()) {
    answer.error = request.status();
  } else {
    metrics_->Request(frame.header.type);
    if (s.hello && frame.header.version > s.version) {
      // The stream is in step; only this request is refused.
      answer.error = Status::VersionMismatch(
          std::string(sp::MessageTypeName(frame.header.type)) + " frame is version " +
          std::to_string(frame.header.version) + ", newer than the version " +
          std::to_string(s.version) +
          " this connection agreed on in HELLO; send frames of the agreed version");
    } else if (!s.hello && !std::holds_alternative<sp::Hello>(*request)) {
      answer.error =
          Status::FailedPrecondition(std::string(sp::MessageTypeName(frame.header.type)) +
                                     " before HELLO; a connection starts with HELLO");
      answer.closing = true;
    } else {
      return Handle(s, *request);
    }
  }
  metrics_->errors_request->Increment();
  return answer;
}

namespace {

// `result` as an answer: its reply, or its error.
template <typename T>
SidecarAnswer AnswerOf(Result<T> result) {
  SidecarAnswer answer;
  if (result.ok()) {
    answer.reply = std::move(*result);
  } else {
    answer.error = result.status();
  }
  return answer;
}

}  // namespace

SidecarAnswer SidecarService::Handle(SidecarSession& s, const sp::Request& request) {
  SidecarAnswer answer = std::visit(
      [&](const auto& r) -> SidecarAnswer {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, sp::Hello>) {
          const bool again = s.hello;
          SidecarAnswer a = AnswerOf(Hello(s, r));
          // A version no one speaks ends the connection; a second HELLO does not.
          a.closing = !a.error.ok() && !again;
          return a;
        } else if constexpr (std::is_same_v<T, sp::Open>) {
          SidecarAnswer a = AnswerOf(Open(s, r));
          if (a.error.ok()) a.fd = s.cache->arena_fd();
          return a;
        } else if constexpr (std::is_same_v<T, sp::SetPlan>) {
          return AnswerOf(SetPlan(s, r));
        } else if constexpr (std::is_same_v<T, sp::Get>) {
          return AnswerOf(Get(s, r));
        } else if constexpr (std::is_same_v<T, sp::Next>) {
          return AnswerOf(Next(s, r));
        } else if constexpr (std::is_same_v<T, sp::Release>) {
          return AnswerOf(Release(s, r));
        } else if constexpr (std::is_same_v<T, sp::Stat>) {
          return AnswerOf(Stat(s, r));
        } else if constexpr (std::is_same_v<T, sp::Lookup>) {
          return AnswerOf(Lookup(s, r));
        } else if constexpr (std::is_same_v<T, sp::Directories>) {
          return AnswerOf(Directories(s, r));
        } else if constexpr (std::is_same_v<T, sp::ChunkFiles>) {
          std::vector<ScopedFd> fds;
          SidecarAnswer a = AnswerOf(ChunkFiles(s, r, &fds));
          if (a.error.ok()) a.owned_fds = std::move(fds);
          return a;
        } else {
          static_assert(std::is_same_v<T, sp::Ping>, "a request the service does not answer");
          return AnswerOf(Result<sp::Pong>(sp::Pong{}));
        }
      },
      request);
  if (!answer.error.ok()) metrics_->errors_request->Increment();
  return answer;
}

// ---- requests ---------------------------------------------------------------------------

Result<sp::HelloReply> SidecarService::Hello(SidecarSession& s, const sp::Hello& hello) {
  if (s.hello) return Status::FailedPrecondition("HELLO sent twice");
  GRANARY_ASSIGN_OR_RETURN(uint16_t version, sp::NegotiateVersion(hello));
  s.hello = true;
  s.version = version;
  s.client_name = hello.client_name;
  sp::HelloReply reply;
  reply.version = version;
  reply.sidecar_name = options_.name;
  return reply;
}

Result<sp::OpenReply> SidecarService::Open(SidecarSession& s, const sp::Open& open) {
  if (s.cache != nullptr) {
    return Status::FailedPrecondition("this connection already has dataset " +
                                      Quoted(s.cache->dataset().name) +
                                      " open; open another connection for " + Quoted(open.dataset));
  }
  GRANARY_ASSIGN_OR_RETURN(s.cache, OpenDataset(open.dataset));
  // A protocol client reads each sample once (training code): its releases
  // are the first evicted, into memory still in the CPU caches.
  s.client = s.cache->AddClient(/*reads_once=*/true);
  sp::OpenReply reply;
  reply.manifest_id = s.cache->manifest().id();
  reply.sample_count = s.cache->manifest().sample_count();
  reply.total_bytes = s.cache->manifest().total_bytes();
  reply.chunk_count = s.cache->manifest().chunk_count();
  reply.arena_bytes = s.cache->arena_bytes();
  return reply;
}

Status SidecarService::NeedOpen(const SidecarSession& s, std::string_view what) const {
  if (s.cache != nullptr) return Status::Ok();
  return Status::FailedPrecondition(std::string(what) + " before OPEN; open a dataset first");
}

Result<sp::Ok> SidecarService::SetPlan(SidecarSession& s, const sp::SetPlan& p) {
  GRANARY_RETURN_IF_ERROR(NeedOpen(s, "SET_PLAN"));
  Result<Plan> plan = Plan::Create(s.cache->manifest(), PlanSpecOf(p));
  if (!plan.ok()) return plan.status().WithContext("SET_PLAN " + Quoted(p.plan_id));
  if (p.start_position > plan->samples().size()) {
    return Status::OutOfRange("SET_PLAN " + Quoted(p.plan_id) + ": start_position " +
                              std::to_string(p.start_position) + " is past the rank's " +
                              std::to_string(plan->samples().size()) + " samples");
  }
  s.cache->SetCursor(p.plan_id + "/rank" + std::to_string(p.rank), *plan, p.start_position);
  s.plan = std::make_shared<const Plan>(std::move(*plan));
  s.next = p.start_position;
  metrics_->plans->Increment();

  // Off the request path: the first batch does not wait for the store.
  plans_.Register(s.cache->dataset().name, PlanRecordOf(p));
  return sp::Ok{};
}

sp::Samples SidecarService::Deliver(SidecarSession& s, std::span<const SampleId> ids,
                                    uint32_t lookahead, bool end_of_epoch) {
  std::vector<AcquiredSample> got = s.cache->Acquire(s.client, ids, lookahead, FetchFor(s.cache),
                                                     SteadyClock::now() + options_.wait_timeout);
  sp::Samples reply;
  reply.end_of_epoch = end_of_epoch;
  reply.items.reserve(got.size());
  if (!got.empty()) metrics_->client_wait->Observe(got.front().waited_seconds);
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
      metrics_->Served(a.prefetched, a.length);
    } else {
      metrics_->failed_samples->Increment();
    }
    reply.items.push_back(std::move(item));
  }
  return reply;
}

Result<sp::Samples> SidecarService::Get(SidecarSession& s, const sp::Get& get) {
  GRANARY_RETURN_IF_ERROR(NeedOpen(s, "GET"));
  s.cache->Release(s.client, get.release);
  return Deliver(s, get.ids, std::min<uint32_t>(get.lookahead, 1024), false);
}

Result<sp::Samples> SidecarService::Next(SidecarSession& s, const sp::Next& next) {
  GRANARY_RETURN_IF_ERROR(NeedOpen(s, "NEXT"));
  s.cache->Release(s.client, next.release);
  if (s.plan == nullptr) {
    return Status::FailedPrecondition("NEXT before SET_PLAN; announce the plan first");
  }
  const size_t end = s.plan->read_count();
  const size_t from = std::min(s.next, end);
  const size_t to = std::min<size_t>(end, from + next.max_samples);
  s.next = to;
  std::span<const SampleId> ids(s.plan->samples().data() + from, to - from);
  return Deliver(s, ids, 0, to >= end);
}

Result<sp::Ok> SidecarService::Release(SidecarSession& s, const sp::Release& release) {
  GRANARY_RETURN_IF_ERROR(NeedOpen(s, "RELEASE"));
  s.cache->Release(s.client, release.tokens);
  return sp::Ok{};
}

Result<sp::StatReply> SidecarService::Stat(SidecarSession& s, const sp::Stat& stat) {
  GRANARY_RETURN_IF_ERROR(NeedOpen(s, "STAT"));
  const Manifest& m = s.cache->manifest();
  if (stat.first_id >= m.sample_count()) {
    return Status::OutOfRange("STAT from sample " + std::to_string(stat.first_id) + ": " +
                              Quoted(s.cache->dataset().name) + " has " +
                              std::to_string(m.sample_count()) + " samples");
  }
  sp::StatReply reply;
  reply.first_id = stat.first_id;
  const uint64_t end = std::min<uint64_t>(m.sample_count(), uint64_t{stat.first_id} + stat.count);
  size_t body = 64;
  const size_t budget = sp::kDefaultMaxBodyBytes - 4096;
  for (uint64_t id = stat.first_id; id < end && reply.entries.size() < sp::kDefaultMaxItems; ++id) {
    const auto sid = static_cast<SampleId>(id);
    sp::StatEntry e{m.PathOf(sid), m.SizeOf(sid), m.MtimeOf(sid)};
    body += e.path.size() + 32;
    if (body > budget) break;
    reply.entries.push_back(std::move(e));
  }
  return reply;
}

Result<sp::LookupReply> SidecarService::Lookup(SidecarSession& s, const sp::Lookup& lookup) {
  GRANARY_RETURN_IF_ERROR(NeedOpen(s, "LOOKUP"));
  sp::LookupReply reply;
  for (const std::string& path : lookup.paths) {
    sp::LookupItem item;
    if (Status ok = ValidateSamplePath(path); !ok.ok()) {
      item.status = ok;
    } else if (Result<SampleId> id = s.cache->manifest().Find(path); id.ok()) {
      item.id = *id;
    } else {
      item.status = Status::NotFound("no file " + Quoted(path) + " in dataset " +
                                     Quoted(s.cache->dataset().name));
    }
    reply.items.push_back(std::move(item));
  }
  return reply;
}

// Directories of the manifest besides the root (its index 0), paged like STAT.
Result<sp::DirectoriesReply> SidecarService::Directories(SidecarSession& s,
                                                         const sp::Directories& dirs) {
  GRANARY_RETURN_IF_ERROR(NeedOpen(s, "DIRECTORIES"));
  const Manifest& m = s.cache->manifest();
  const auto total = static_cast<uint32_t>(m.directory_count() - 1);
  if (dirs.first > total) {
    return Status::OutOfRange("DIRECTORIES from index " + std::to_string(dirs.first) + ": " +
                              Quoted(s.cache->dataset().name) + " has " + std::to_string(total) +
                              " directories besides the root; ask from 0 up to that");
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
  return reply;
}

bool SidecarService::MayHaveChunkFiles(uint32_t uid, uint32_t owner_uid) {
  return uid == 0 || uid == ::geteuid() || uid == owner_uid;
}

Result<sp::ChunkFilesReply> SidecarService::ChunkFiles(SidecarSession& s,
                                                       const sp::ChunkFiles& request,
                                                       std::vector<ScopedFd>* fds) {
  GRANARY_RETURN_IF_ERROR(NeedOpen(s, "CHUNK_FILES"));
  const FetchDataset& dataset = s.cache->dataset();
  const Manifest& m = s.cache->manifest();
  if (!s.uid.has_value() || !MayHaveChunkFiles(*s.uid, dataset.owner.uid)) {
    metrics_->chunk_files_refused->Increment();
    return Status::PermissionDenied(
        "CHUNK_FILES of dataset " + Quoted(dataset.name) + ": uid " +
        (s.uid.has_value() ? std::to_string(*s.uid) : std::string("(unknown)")) +
        " is neither root, the sidecar's own uid nor the dataset's owner (uid " +
        std::to_string(dataset.owner.uid) +
        "), so it is not handed chunk files; it reads through the sidecar's arena");
  }
  if (!fetcher_->SharesLocalChunks()) {
    return Status::FailedPrecondition(
        "CHUNK_FILES of dataset " + Quoted(dataset.name) +
        ": this sidecar reads no chunk files of a local cache node (local_node_socket is not "
        "set); samples are read through the arena");
  }
  // The distinct chunks of the ids, in the order asked, each with the first
  // id asked in it.
  std::vector<ChunkId> chunks;
  std::vector<uint32_t> first_asked;
  for (uint32_t id : request.ids) {
    if (id >= m.sample_count()) {
      return Status::OutOfRange("CHUNK_FILES: sample " + std::to_string(id) + " is past the " +
                                std::to_string(m.sample_count()) + " samples of " +
                                Quoted(dataset.name));
    }
    const ChunkId c = m.ChunkOf(id);
    if (std::find(chunks.begin(), chunks.end(), c) == chunks.end()) {
      chunks.push_back(c);
      first_asked.push_back(id);
    }
    if (chunks.size() >= sp::kMaxChunkFilesPerReply) break;
  }
  sp::ChunkFilesReply reply;
  // Replies are encoded under the default limits; keep well inside them.
  const size_t budget = sp::kDefaultMaxBodyBytes / 2;
  size_t body = 64;
  // A list in the reply holds at most max_items: a chunk of more samples is
  // described from the first one asked on (the client asks again for the rest).
  const auto window = [](const auto& list, uint32_t from, auto id_of) {
    const size_t max = sp::kDefaultMaxItems;
    using List = std::decay_t<decltype(list)>;
    if (list.size() <= max) return List(list.begin(), list.end());
    size_t begin = 0;
    while (begin < list.size() && id_of(list[begin]) < from) ++begin;
    begin = std::min(begin, list.size() - max);
    return List(list.begin() + static_cast<std::ptrdiff_t>(begin),
                list.begin() + static_cast<std::ptrdiff_t>(begin + max));
  };
  for (size_t k = 0; k < chunks.size(); ++k) {
    const ChunkId c = chunks[k];
    sp::ChunkFile file;
    file.chunk = c;
    Result<LocalChunkFile> shared = fetcher_->ShareLocalChunk(dataset, c);
    if (shared.ok()) {
      body += 16 + shared->samples.size() * sidecar_protocol_format::kDirectSampleSize +
              shared->elsewhere.size() * 4;
      if (body > budget && !reply.chunks.empty()) break;
      for (const LocalSampleExtent& e : window(shared->samples, first_asked[k],
                                               [](const LocalSampleExtent& e) { return e.id; })) {
        file.samples.push_back({e.id, e.offset, e.length, e.checksum});
      }
      for (SampleId id : window(shared->elsewhere, first_asked[k], [](SampleId i) { return i; })) {
        file.elsewhere.push_back(id);
      }
      fds->push_back(std::move(shared->fd));
      metrics_->chunk_files_handed->Increment();
    } else {
      file.status =
          Status::NotFound("chunk " + std::to_string(c) + ": " + shared.status().message());
      Result<std::vector<ChunkSegment>> segments = m.Segments(c);
      if (segments.ok()) {
        std::vector<uint32_t> all;
        for (const ChunkSegment& seg : *segments) {
          if (all.empty() || all.back() != seg.sample) all.push_back(seg.sample);
        }
        file.elsewhere = window(all, first_asked[k], [](uint32_t i) { return i; });
      }
      body += 16 + file.elsewhere.size() * 4 + file.status.message().size();
      if (body > budget && !reply.chunks.empty()) break;
      metrics_->chunk_files_declined->Increment();
    }
    reply.chunks.push_back(std::move(file));
  }
  return reply;
}

void SidecarService::Close(SidecarSession& s) {
  if (s.cache != nullptr) s.cache->DropClient(s.client);
  s.cache.reset();
  s.plan.reset();
}

}  // namespace granary::sidecar
