// Session's direct reads: chunk files of the local cache node that the
// sidecar hands over (CHUNK_FILES), mapped read-only, each sample verified with
// XXH3, and the fall back to the arena on anything else. Opening and the connection
// are in session.cc, the arena's samples in session_samples.cc.
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <variant>

#include "granary/client/session.h"
#include "granary/core/log.h"
#include "granary/core/names.h"

namespace granary::client {

namespace sp = sidecar_protocol;

namespace {

// Chunk files a session keeps open and mapped at most (least recently handed
// over let go first): a quarter of the process's descriptor limit, within
// [64, 16384]. A shuffled epoch reads every chunk about equally often, so a
// session holding fewer files than the dataset has chunks lets go of one and
// asks for another (a round trip, a new map and its page faults) on most
// samples; with Linux's usual limits (1024 soft, more in containers and under
// systemd) that is 256 files or more: 4 GiB of 16 MiB chunks.
size_t MaxDirectFiles() {
  static const size_t limit = [] {
    rlimit r{};
    if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return size_t{16384};
    return std::clamp<size_t>(static_cast<size_t>(r.rlim_cur / 4), 64, 16384);
  }();
  return limit;
}
// Samples the sidecar said to read through the arena (not staged yet, a
// chunk it does not hand over) are not asked about again before this.
constexpr auto kElsewhereFor = std::chrono::milliseconds(1000);
// After a checksum mismatch the chunk's samples go through the arena (which
// has the node repair the file) for this long.
constexpr auto kCorruptFor = std::chrono::seconds(5);
// Bound on the ids remembered as "through the arena for now".
constexpr size_t kMaxElsewhere = size_t{1} << 20;
// A kept file is checked this often for having been dropped by the node
// (link count 0): let go then, so an eviction frees the space.
constexpr auto kLinkCheckInterval = std::chrono::seconds(1);

}  // namespace

// A chunk file handed over, mapped whole, read-only. The cache node drops a
// chunk file only by unlinking it and never truncates one (its size is set
// before it is linked into place), so the mapping stays readable however long
// a MappedSample holds it: an evicted file's pages stay until the last map of
// it goes. The node writes into a linked file only to fill a segment not
// present yet or to repair one that failed its checksum, never over a
// segment that verifies, so verified bytes do not change under a reader.
struct Session::DirectFile {
  ScopedFd fd;
  uint32_t chunk = 0;
  const char* map = nullptr;  // the whole file; nullptr for an empty one
  size_t map_size = 0;
  std::vector<uint32_t> ids;  // its samples in direct_
  Clock::time_point checked;  // last link-count check; guarded by direct_mu_

  DirectFile() = default;
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;
  ~DirectFile() {
    if (map != nullptr) ::munmap(const_cast<char*>(map), map_size);
  }
};

Status Session::direct_status() const {
  std::lock_guard<std::mutex> lock(direct_mu_);
  return direct_off_;
}

DirectReadCounters Session::direct_counters() const {
  std::lock_guard<std::mutex> lock(direct_mu_);
  return direct_counters_;
}

void Session::TurnDirectOff(Status why) {
  if (!direct_off_.ok()) return;
  direct_off_ = std::move(why);
  direct_on_.store(false, std::memory_order_relaxed);
  GetLogger("client")->info("direct reads of dataset {} are off: {}", Quoted(dataset_),
                            direct_off_.message());
  direct_.clear();
  direct_elsewhere_.clear();
  direct_files_.clear();
}

void Session::ForgetDirectFile(const std::shared_ptr<DirectFile>& file,
                               Clock::time_point retry_after) {
  for (uint32_t id : file->ids) {
    auto it = direct_.find(id);
    if (it != direct_.end() && it->second.file == file) {
      direct_.erase(it);
      if (direct_elsewhere_.size() < kMaxElsewhere) direct_elsewhere_[id] = retry_after;
    }
  }
  direct_files_.remove(file);
}

Status Session::MapChunkFile(DirectFile& file) {
  struct stat st {};
  if (::fstat(file.fd.get(), &st) != 0) {
    return Status::FromErrno(
        errno, fmt::format("direct reads of dataset {}: fstat of chunk {}'s file", Quoted(dataset_),
                           file.chunk));
  }
  if (st.st_size <= 0) return Status::Ok();  // no sample can lie in it
  const auto size = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, file.fd.get(), 0);
  if (map == MAP_FAILED) {
    return Status::FromErrno(errno, fmt::format("direct reads of dataset {}: mmap of chunk {}'s "
                                                "file ({} bytes)",
                                                Quoted(dataset_), file.chunk, size));
  }
  file.map = static_cast<const char*>(map);
  file.map_size = size;
  return Status::Ok();
}

void Session::LogDirectFailureOnce(const Status& failed) {
  if (direct_failure_logged_) return;
  direct_failure_logged_ = true;
  GetLogger("client")->warn("{}; reading it through the sidecar instead (logged once)",
                            failed.message());
}

void Session::LocateDirect(std::span<const uint32_t> ids) {
  // A reply describes at most kMaxChunkFilesPerReply chunks: ask again for
  // the ids of the others while replies hand files over. A round that hands
  // none (the node has not staged those chunks: a cold epoch) ends it, so a
  // cold batch waits for one round trip, not one per four chunks; its other
  // ids are asked about again with a later call. Bounded also when the ids
  // span more chunks than a session keeps (the oldest let go may be asked
  // for again).
  const size_t rounds = std::min(ids.size(), MaxDirectFiles() / sp::kMaxChunkFilesPerReply);
  for (size_t round = 0; round < rounds; ++round) {
    if (LocateDirectRound(ids) == 0) return;
  }
}

size_t Session::LocateDirectRound(std::span<const uint32_t> ids) {
  if (!options_.direct_reads || !InOpeningProcess()) return 0;
  const Clock::time_point now = Clock::now();
  std::vector<uint32_t> unknown;
  {
    std::lock_guard<std::mutex> lock(direct_mu_);
    if (!direct_off_.ok()) return 0;
    for (uint32_t id : ids) {
      if (id >= info_.sample_count || direct_.contains(id)) continue;
      auto later = direct_elsewhere_.find(id);
      if (later != direct_elsewhere_.end()) {
        if (now < later->second) continue;
        direct_elsewhere_.erase(later);
      }
      unknown.push_back(id);
      if (unknown.size() >= limits_.max_items) break;
    }
  }
  if (unknown.empty()) return 0;

  std::lock_guard<std::mutex> call_lock(mu_);
  if (!CheckUsable().ok()) return 0;  // the arena path says why
  if (version_ < sp::kChunkFilesVersion) {
    std::lock_guard<std::mutex> lock(direct_mu_);
    TurnDirectOff(Status::VersionMismatch(fmt::format(
        "the sidecar speaks protocol version {}, direct reads need {}; upgrade granary-sidecar",
        version_, sp::kChunkFilesVersion)));
    return 0;
  }
  const std::string doing =
      "CHUNK_FILES of dataset " + Quoted(dataset_) + " at the sidecar at " + socket_path_;
  std::vector<ScopedFd> fds;
  Result<sp::Reply> reply = Call(sp::ChunkFiles{unknown}, sp::MessageType::kChunkFilesReply,
                                 Clock::now() + options_.call_timeout, doing, &fds);
  std::lock_guard<std::mutex> lock(direct_mu_);
  if (!reply.ok()) {
    const StatusCode code = reply.status().code();
    if (code == StatusCode::kPermissionDenied || code == StatusCode::kFailedPrecondition) {
      // The sidecar will not hand this session files: ask no more.
      TurnDirectOff(reply.status());
    } else {
      // A broken connection is the arena path's to report; anything else:
      // these ids through the arena for a while.
      for (uint32_t id : unknown) {
        if (direct_elsewhere_.size() < kMaxElsewhere) direct_elsewhere_[id] = now + kElsewhereFor;
      }
    }
    return 0;
  }
  const auto& chunks = std::get<sp::ChunkFilesReply>(*reply).chunks;
  size_t handed = 0;
  for (const sp::ChunkFile& c : chunks) handed += c.status.ok() ? size_t{1} : size_t{0};
  if (handed != fds.size()) {
    // Not the protocol: the connection cannot be trusted (Break closes the
    // descriptors that came with it).
    (void)Break(Status::Unavailable(fmt::format(
        "{}: the reply hands over {} chunk files with {} descriptors; the connection is closed",
        doing, handed, fds.size())));
    return 0;
  }
  if (direct_elsewhere_.size() + unknown.size() > kMaxElsewhere) {
    std::erase_if(direct_elsewhere_, [&](const auto& e) { return e.second <= now; });
    if (direct_elsewhere_.size() + unknown.size() > kMaxElsewhere) direct_elsewhere_.clear();
  }
  size_t next_fd = 0;
  for (const sp::ChunkFile& c : chunks) {
    for (uint32_t id : c.elsewhere) {
      if (id < info_.sample_count) direct_elsewhere_[id] = now + kElsewhereFor;
    }
    if (!c.status.ok()) continue;
    auto file = std::make_shared<DirectFile>();
    file->fd = std::move(fds[next_fd++]);
    file->chunk = c.chunk;
    file->checked = now;
    Status mapped = MapChunkFile(*file);
    if (!mapped.ok()) {
      // Its samples through the arena for a while (the descriptor is closed).
      for (const sp::DirectSample& d : c.samples) {
        if (d.id < info_.sample_count) direct_elsewhere_[d.id] = now + kElsewhereFor;
      }
      LogDirectFailureOnce(mapped);
      continue;
    }
    for (const sp::DirectSample& d : c.samples) {
      if (d.id >= info_.sample_count) continue;
      if (d.offset > file->map_size || d.length > file->map_size - d.offset) {
        // Past the end of the file: touching it would be SIGBUS. Not the
        // node's layout, so the sidecar's description is wrong: the arena.
        direct_elsewhere_[d.id] = now + kElsewhereFor;
        ++direct_counters_.fallbacks;
        LogDirectFailureOnce(Status::Corruption(fmt::format(
            "direct read of sample {} of dataset {}: its bytes [{}, +{}) lie past the end of "
            "chunk {}'s file ({} bytes)",
            d.id, Quoted(dataset_), d.offset, d.length, c.chunk, file->map_size)));
        continue;
      }
      DirectExtent& e = direct_[d.id];
      e = DirectExtent{file, d.offset, d.length, d.checksum};
      file->ids.push_back(d.id);
      direct_elsewhere_.erase(d.id);
    }
    direct_files_.push_back(std::move(file));
    ++direct_counters_.chunk_files;
  }
  while (direct_files_.size() > MaxDirectFiles()) {
    std::shared_ptr<DirectFile> oldest = direct_files_.front();
    ForgetDirectFile(oldest, now);  // may be asked for again at once
  }
  return handed;
}

bool Session::FindDirect(uint32_t id, DirectExtent* extent) {
  std::lock_guard<std::mutex> lock(direct_mu_);
  auto it = direct_.find(id);
  if (it == direct_.end()) return false;
  *extent = it->second;
  const Clock::time_point now = Clock::now();
  if (now - direct_swept_ >= kLinkCheckInterval) {
    // Every kept file, also of chunks no read asks for now: a dropped one is
    // let go, so its space is freed (once no MappedSample holds its map).
    direct_swept_ = now;
    std::vector<std::shared_ptr<DirectFile>> dropped;
    for (const std::shared_ptr<DirectFile>& file : direct_files_) {
      struct stat st {};
      if (file != extent->file && ::fstat(file->fd.get(), &st) == 0 && st.st_nlink == 0) {
        dropped.push_back(file);
      }
    }
    for (const std::shared_ptr<DirectFile>& file : dropped) {
      ForgetDirectFile(file, now);
      ++direct_counters_.dropped;
    }
  }
  if (now - extent->file->checked >= kLinkCheckInterval) {
    extent->file->checked = now;
    struct stat st {};
    if (::fstat(extent->file->fd.get(), &st) == 0 && st.st_nlink == 0) {
      // The node dropped the file (evicted, re-staged): let it go.
      ForgetDirectFile(extent->file, now);
      ++direct_counters_.dropped;
      ++direct_counters_.fallbacks;
      return false;
    }
  }
  return true;
}

Result<MappedSample> Session::MapDirectUnverified(uint32_t id) {
  DirectExtent extent;
  if (id >= info_.sample_count || !FindDirect(id, &extent)) {
    return Status::NotFound(
        fmt::format("direct read of sample {} of dataset {}: no chunk file of it is held; read it "
                    "through the arena",
                    id, Quoted(dataset_)));
  }
  // In the map: LocateDirect kept only extents inside the file, and the file
  // never shrinks.
  const char* data = extent.file->map + extent.offset;
  return MappedSample{id, data, extent.length, extent.checksum,
                      std::shared_ptr<const void>(extent.file, extent.file.get())};
}

Status Session::VerifyMapped(const MappedSample& sample) {
  const uint64_t actual = Checksum64(sample.data, static_cast<size_t>(sample.size));
  if (actual == sample.checksum) {
    std::lock_guard<std::mutex> lock(direct_mu_);
    ++direct_counters_.samples;
    direct_counters_.bytes += sample.size;
    return Status::Ok();
  }
  // The mapping is a DirectFile's (MapDirectUnverified made it).
  std::shared_ptr<DirectFile> file(
      sample.mapping,
      const_cast<DirectFile*>(static_cast<const DirectFile*>(sample.mapping.get())));
  Status failed = Status::Corruption(fmt::format(
      "direct read of sample {} of dataset {}: its {} bytes in chunk {}'s file have checksum "
      "{:016x}, the chunk file records {:016x}",
      sample.id, Quoted(dataset_), sample.size, file->chunk, actual, sample.checksum));
  std::lock_guard<std::mutex> lock(direct_mu_);
  ++direct_counters_.fallbacks;
  ++direct_counters_.corrupt;
  ForgetDirectFile(file, Clock::now() + kCorruptFor);
  LogDirectFailureOnce(failed);
  return failed;
}

Result<MappedSample> Session::MapDirect(uint32_t id) {
  GRANARY_ASSIGN_OR_RETURN(MappedSample sample, MapDirectUnverified(id));
  GRANARY_RETURN_IF_ERROR(VerifyMapped(sample));
  return sample;
}

Result<std::string> Session::Read(uint32_t id) {
  if (options_.direct_reads && id < info_.sample_count && direct_reads_on()) {
    Result<MappedSample> mapped = MapDirect(id);
    if (!mapped.ok() && mapped.status().code() == StatusCode::kNotFound) {
      LocateDirect(std::span<const uint32_t>(&id, 1));
      mapped = MapDirect(id);
    }
    if (mapped.ok()) return std::string(mapped->bytes());
  }
  GRANARY_ASSIGN_OR_RETURN(SampleView view, Get(id));
  std::string bytes(view.bytes());
  Release(view);
  return bytes;
}

}  // namespace granary::client
