// Session's direct reads: chunk files of the local cache node that the
// sidecar hands over (CHUNK_FILES), read with pread and verified with XXH3,
// and the fall back to the arena on anything else. Opening and the connection
// are in session.cc, the arena's samples in session_samples.cc.
#include <fmt/format.h>
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

// Chunk files a session keeps open at most (least recently handed over let
// go first): bounded descriptors, and bounded tables of their samples.
constexpr size_t kMaxDirectFiles = 64;
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

struct Session::DirectFile {
  ScopedFd fd;
  uint32_t chunk = 0;
  std::vector<uint32_t> ids;  // its samples in direct_
  Clock::time_point checked;  // last link-count check; guarded by direct_mu_
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

std::optional<uint64_t> Session::DirectSize(uint32_t id) {
  std::lock_guard<std::mutex> lock(direct_mu_);
  auto it = direct_.find(id);
  if (it == direct_.end()) return std::nullopt;
  return it->second.length;
}

void Session::LocateDirect(std::span<const uint32_t> ids) {
  if (!options_.direct_reads || !InOpeningProcess()) return;
  const Clock::time_point now = Clock::now();
  std::vector<uint32_t> unknown;
  {
    std::lock_guard<std::mutex> lock(direct_mu_);
    if (!direct_off_.ok()) return;
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
  if (unknown.empty()) return;

  std::lock_guard<std::mutex> call_lock(mu_);
  if (!CheckUsable().ok()) return;  // the arena path says why
  if (version_ < sp::kChunkFilesVersion) {
    std::lock_guard<std::mutex> lock(direct_mu_);
    TurnDirectOff(Status::VersionMismatch(fmt::format(
        "the sidecar speaks protocol version {}, direct reads need {}; upgrade granary-sidecar",
        version_, sp::kChunkFilesVersion)));
    return;
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
    return;
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
    return;
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
    for (const sp::DirectSample& d : c.samples) {
      if (d.id >= info_.sample_count) continue;
      DirectExtent& e = direct_[d.id];
      e = DirectExtent{file, d.offset, d.length, d.checksum};
      file->ids.push_back(d.id);
      direct_elsewhere_.erase(d.id);
    }
    direct_files_.push_back(std::move(file));
    ++direct_counters_.chunk_files;
  }
  while (direct_files_.size() > kMaxDirectFiles) {
    std::shared_ptr<DirectFile> oldest = direct_files_.front();
    ForgetDirectFile(oldest, now);  // may be asked for again at once
  }
}

Status Session::ReadDirect(uint32_t id, std::span<char> out) {
  const std::string what =
      fmt::format("direct read of sample {} of dataset {}", id, Quoted(dataset_));
  DirectExtent extent;
  {
    std::lock_guard<std::mutex> lock(direct_mu_);
    auto it = direct_.find(id);
    if (it == direct_.end()) {
      return Status::NotFound(what + ": no chunk file of it is held; read it through the arena");
    }
    extent = it->second;
    const Clock::time_point now = Clock::now();
    if (now - direct_swept_ >= kLinkCheckInterval) {
      // Every kept file, also of chunks no read asks for now: a dropped one
      // is let go, so its space is freed.
      direct_swept_ = now;
      std::vector<std::shared_ptr<DirectFile>> dropped;
      for (const std::shared_ptr<DirectFile>& file : direct_files_) {
        struct stat st {};
        if (file != extent.file && ::fstat(file->fd.get(), &st) == 0 && st.st_nlink == 0) {
          dropped.push_back(file);
        }
      }
      for (const std::shared_ptr<DirectFile>& file : dropped) {
        ForgetDirectFile(file, now);
        ++direct_counters_.dropped;
      }
    }
    if (now - extent.file->checked >= kLinkCheckInterval) {
      extent.file->checked = now;
      struct stat st {};
      if (::fstat(extent.file->fd.get(), &st) == 0 && st.st_nlink == 0) {
        // The node dropped the file (evicted, re-staged): let it go.
        ForgetDirectFile(extent.file, now);
        ++direct_counters_.dropped;
        ++direct_counters_.fallbacks;
        return Status::NotFound(what + ": the cache node dropped its chunk file");
      }
    }
  }
  if (out.size() != extent.length) {
    return Status::InvalidArgument(fmt::format("{}: a buffer of {} bytes for a sample of {}", what,
                                               out.size(), extent.length));
  }
  Status failed;
  size_t done = 0;
  // Each round reads at least one byte or ends: bounded by the length.
  while (done < out.size()) {
    const ssize_t n = ::pread(extent.file->fd.get(), out.data() + done, out.size() - done,
                              static_cast<off_t>(extent.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      failed = Status::FromErrno(
          errno, what + ": pread of chunk " + std::to_string(extent.file->chunk) + "'s file");
      break;
    }
    if (n == 0) {
      failed = Status::Corruption(
          fmt::format("{}: chunk {}'s file ends before the sample's bytes [{}, +{})", what,
                      extent.file->chunk, extent.offset, extent.length));
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (failed.ok()) {
    const uint64_t actual = Checksum64(out.data(), out.size());
    if (actual == extent.checksum) {
      std::lock_guard<std::mutex> lock(direct_mu_);
      ++direct_counters_.samples;
      direct_counters_.bytes += out.size();
      return Status::Ok();
    }
    failed = Status::Corruption(fmt::format(
        "{}: its {} bytes in chunk {}'s file have checksum {:016x}, the chunk file records "
        "{:016x}",
        what, out.size(), extent.file->chunk, actual, extent.checksum));
  }
  std::lock_guard<std::mutex> lock(direct_mu_);
  ++direct_counters_.fallbacks;
  const bool corrupt = failed.code() == StatusCode::kCorruption;
  if (corrupt) ++direct_counters_.corrupt;
  ForgetDirectFile(extent.file, Clock::now() + (corrupt ? kCorruptFor : kElsewhereFor));
  if (!direct_failure_logged_) {
    direct_failure_logged_ = true;
    GetLogger("client")->warn("{}; reading it through the sidecar instead (logged once)",
                              failed.message());
  }
  return failed;
}

Result<std::string> Session::Read(uint32_t id) {
  if (options_.direct_reads && id < info_.sample_count) {
    std::optional<uint64_t> size = DirectSize(id);
    if (!size.has_value()) {
      LocateDirect(std::span<const uint32_t>(&id, 1));
      size = DirectSize(id);
    }
    if (size.has_value()) {
      std::string bytes(static_cast<size_t>(*size), '\0');
      if (ReadDirect(id, std::span<char>(bytes.data(), bytes.size())).ok()) return bytes;
    }
  }
  GRANARY_ASSIGN_OR_RETURN(SampleView view, Get(id));
  std::string bytes(view.bytes());
  Release(view);
  return bytes;
}

}  // namespace granary::client
