// LocalChunks (local_chunks.h): chunk descriptors from the local cache node's
// handoff socket, read with pread and verified.

#include "local_chunks.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "granary/core/log.h"
#include "granary/core/names.h"

namespace granary::sidecar {
namespace {

using Clock = std::chrono::steady_clock;

// A chunk the node refused or does not have yet is not asked for again
// before this (staging fills it meanwhile; the network path serves it).
constexpr auto kRetryMissingChunk = std::chrono::milliseconds(250);
// Presence bitmaps are re-read at most this often per chunk.
constexpr auto kRefreshInterval = std::chrono::milliseconds(20);
// Bound on remembered refusals.
constexpr size_t kMaxRemembered = 4096;
// How often a kept descriptor is checked for a file the node dropped (its
// cache policy evicted the chunk): closed then, so the space is freed and the
// reads go to the node, which streams what it no longer keeps.
constexpr auto kLinkCheckInterval = std::chrono::seconds(1);

}  // namespace

LocalChunks::LocalChunks(std::string socket_path, std::chrono::milliseconds timeout,
                         std::chrono::milliseconds down_for, size_t capacity)
    : client_(std::move(socket_path), timeout),
      down_for_(down_for),
      capacity_(std::max<size_t>(1, capacity)) {}

Status LocalChunks::Decline(std::string why) {
  declined_.fetch_add(1, std::memory_order_relaxed);
  return Status::NotFound(std::move(why));
}

void LocalChunks::Forget(const Key& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_.find(key);
  if (it == open_.end()) return;
  lru_.erase(it->second.lru);
  open_.erase(it);
}

Result<std::shared_ptr<LocalChunks::Open>> LocalChunks::Get(const FetchDataset& dataset,
                                                            const Key& key) {
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (now - swept_ >= kLinkCheckInterval) {
      // Every kept descriptor, also of chunks no read asks for now (their
      // samples are in the arena): a dropped file is let go.
      swept_ = now;
      for (auto it = open_.begin(); it != open_.end();) {
        struct stat st {};
        if (::fstat(it->second.open->reader.fd(), &st) == 0 && st.st_nlink == 0) {
          lru_.erase(it->second.lru);
          it = open_.erase(it);
          dropped_.fetch_add(1, std::memory_order_relaxed);
        } else {
          it->second.open->link_checked = now;
          ++it;
        }
      }
    }
    auto it = open_.find(key);
    if (it != open_.end()) {
      Open& open = *it->second.open;
      if (now - open.link_checked < kLinkCheckInterval) {
        lru_.splice(lru_.end(), lru_, it->second.lru);
        return it->second.open;
      }
      open.link_checked = now;
      struct stat st {};
      if (::fstat(open.reader.fd(), &st) != 0 || st.st_nlink > 0) {
        lru_.splice(lru_.end(), lru_, it->second.lru);
        return it->second.open;
      }
      // Dropped by the node: ask it again (it hands out the file it keeps
      // now, or refuses and the network path reads it).
      lru_.erase(it->second.lru);
      open_.erase(it);
      dropped_.fetch_add(1, std::memory_order_relaxed);
    }
    if (now < down_until_) return Decline("the cache node's handoff socket is off for a while");
    auto refused = not_before_.find(key);
    if (refused != not_before_.end()) {
      if (now < refused->second) return Decline("the node did not hand this chunk out just now");
      not_before_.erase(refused);
    }
  }

  Result<ScopedFd> fd = client_.OpenChunk({dataset.name, key.manifest, key.chunk});
  if (!fd.ok() && (fd.status().code() == StatusCode::kUnavailable ||
                   fd.status().code() == StatusCode::kIoError)) {
    // The node closes connections idle for its local_socket_idle_timeout: a
    // kept connection found closed is not a node that is down. Once more, on
    // a new connection (the client dropped the old one).
    fd = client_.OpenChunk({dataset.name, key.manifest, key.chunk});
  }
  const auto remember = [&](Clock::duration for_how_long) {
    std::lock_guard<std::mutex> lock(mu_);
    if (not_before_.size() >= kMaxRemembered) {
      std::erase_if(not_before_, [&](const auto& entry) { return entry.second <= now; });
      if (not_before_.size() >= kMaxRemembered) not_before_.clear();
    }
    not_before_[key] = now + for_how_long;
  };
  if (!fd.ok()) {
    const StatusCode code = fd.status().code();
    const bool transport = code == StatusCode::kUnavailable ||
                           code == StatusCode::kDeadlineExceeded || code == StatusCode::kIoError ||
                           code == StatusCode::kVersionMismatch;
    if (transport) {
      failures_.fetch_add(1, std::memory_order_relaxed);
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        first = now >= down_until_;
        down_until_ = now + down_for_;
      }
      if (first) {
        GetLogger("sidecar")->warn(
            "reading chunk files of the local cache node through {} failed ({}); reading over "
            "the network for the next {} ms",
            Quoted(client_.socket_path()), fd.status().ToString(), down_for_.count());
      }
    } else {
      remember(code == StatusCode::kPermissionDenied ? Clock::duration(down_for_)
                                                     : Clock::duration(kRetryMissingChunk));
    }
    return Decline(fd.status().message());
  }
  Result<std::vector<ChunkSegment>> segments = dataset.manifest->Segments(key.chunk);
  if (!segments.ok()) return Decline(segments.status().message());
  Result<ChunkReader> reader = ChunkReader::FromFd(
      std::move(*fd),
      "chunk " + std::to_string(key.chunk) + " of dataset " + dataset.name + " (handed over)",
      ChunkKey{dataset.name, key.manifest, key.chunk}, *segments);
  if (!reader.ok()) {
    remember(down_for_);
    GetLogger("sidecar")->warn("a chunk file the local cache node handed over does not check: {}",
                               reader.status().ToString());
    return Decline(reader.status().message());
  }
  opens_.fetch_add(1, std::memory_order_relaxed);
  auto open = std::make_shared<Open>(std::move(*reader));
  open->refreshed = now;
  open->link_checked = now;
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = open_.try_emplace(key);
  if (!inserted) {
    // Another thread opened it meanwhile: keep theirs.
    lru_.splice(lru_.end(), lru_, it->second.lru);
    return it->second.open;
  }
  it->second.open = open;
  it->second.lru = lru_.insert(lru_.end(), key);
  while (open_.size() > capacity_) {
    open_.erase(lru_.front());
    lru_.pop_front();
  }
  return open;
}

Result<uint64_t> LocalChunks::Read(const FetchDataset& dataset, ChunkId chunk, SampleId sample,
                                   uint64_t offset, std::span<char> out) {
  const Key key{dataset.name, dataset.manifest->id(), chunk};
  GRANARY_ASSIGN_OR_RETURN(std::shared_ptr<Open> open, Get(dataset, key));

  // Segments follow sample order within a chunk: find this sample's.
  const std::span<const ChunkSegment> segs = open->reader.segments();
  const auto it =
      std::lower_bound(segs.begin(), segs.end(), sample,
                       [](const ChunkSegment& s, SampleId id) { return s.sample < id; });
  if (it == segs.end() || it->sample != sample || it->sample_offset != offset ||
      it->length != out.size()) {
    return Decline("the piece is not one whole segment of the chunk file");
  }
  const auto index = static_cast<uint32_t>(it - segs.begin());

  std::shared_lock<std::shared_mutex> read_lock(open->mu);
  if (!open->reader.IsPresent(index)) {
    read_lock.unlock();
    {
      std::unique_lock<std::shared_mutex> write_lock(open->mu);
      const Clock::time_point now = Clock::now();
      if (!open->reader.IsPresent(index) && now - open->refreshed >= kRefreshInterval) {
        open->refreshed = now;
        if (Status s = open->reader.Refresh(); !s.ok()) {
          write_lock.unlock();
          Forget(key);
          return Decline(s.message());
        }
      }
    }
    read_lock.lock();
    if (!open->reader.IsPresent(index)) return Decline("not staged on the local node yet");
  }
  Status read = open->reader.Read(index, out);
  if (!read.ok()) {
    if (read.code() == StatusCode::kCorruption) corrupt_.fetch_add(1, std::memory_order_relaxed);
    read_lock.unlock();
    Forget(key);
    return Decline(read.message());
  }
  pieces_.fetch_add(1, std::memory_order_relaxed);
  return open->reader.checksum(index);
}

Result<LocalChunkFile> LocalChunks::Share(const FetchDataset& dataset, ChunkId chunk) {
  const Key key{dataset.name, dataset.manifest->id(), chunk};
  GRANARY_ASSIGN_OR_RETURN(std::shared_ptr<Open> open, Get(dataset, key));
  {
    std::unique_lock<std::shared_mutex> write_lock(open->mu);
    const Clock::time_point now = Clock::now();
    if (open->reader.present_count() < open->reader.segment_count() &&
        now - open->refreshed >= kRefreshInterval) {
      open->refreshed = now;
      if (Status s = open->reader.Refresh(); !s.ok()) {
        write_lock.unlock();
        Forget(key);
        return Status::NotFound(s.message());
      }
    }
  }
  std::shared_lock<std::shared_mutex> read_lock(open->mu);
  LocalChunkFile out;
  const std::span<const ChunkSegment> segs = open->reader.segments();
  out.samples.reserve(segs.size());
  for (uint32_t i = 0; i < segs.size(); ++i) {
    const ChunkSegment& seg = segs[i];
    const bool whole = seg.sample_offset == 0 && seg.length == dataset.manifest->SizeOf(seg.sample);
    Result<uint64_t> offset =
        whole && open->reader.IsPresent(i) ? open->reader.PayloadOffset(i) : Status::NotFound("");
    if (!offset.ok()) {
      if (out.elsewhere.empty() || out.elsewhere.back() != seg.sample) {
        out.elsewhere.push_back(seg.sample);
      }
      continue;
    }
    out.samples.push_back({seg.sample, *offset, seg.length, open->reader.checksum(i)});
  }
  const int dup = ::fcntl(open->reader.fd(), F_DUPFD_CLOEXEC, 0);
  if (dup < 0) {
    return Status::NotFound(ErrnoText(errno) + " duplicating the descriptor of chunk " +
                            std::to_string(chunk) + " of dataset " + Quoted(dataset.name));
  }
  out.fd = ScopedFd(dup);
  return out;
}

LocalChunksCounters LocalChunks::counters() const {
  LocalChunksCounters c;
  c.opens = opens_.load(std::memory_order_relaxed);
  c.pieces = pieces_.load(std::memory_order_relaxed);
  c.declined = declined_.load(std::memory_order_relaxed);
  c.corrupt = corrupt_.load(std::memory_order_relaxed);
  c.failures = failures_.load(std::memory_order_relaxed);
  c.dropped = dropped_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace granary::sidecar
