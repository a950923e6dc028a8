#include "granary/cachenode/chunk_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <optional>
#include <system_error>
#include <thread>

#include "granary/core/chunk_format.h"
#include "granary/core/log.h"
#include "granary/core/names.h"

namespace granary {

namespace cf = chunk_format;

namespace {

// The marker says "this directory is a chunk store, layout 1". A later layout
// changes the number; this build refuses to scan (and delete from) another.
constexpr std::string_view kMarkerPrefix = "granary chunk store\nlayout ";
constexpr std::string_view kMarkerContents = "granary chunk store\nlayout 1\n";
constexpr std::string_view kLostAndFound = "lost+found";
constexpr std::string_view kTempInfix = ".tmp.";
constexpr uint64_t kDefaultBlockSize = 4096;
// Warnings about individual files the scan removes or skips; the rest are
// only counted (a damaged store must not flood the log).
constexpr uint64_t kMaxScanWarnings = 20;

std::shared_ptr<spdlog::logger> Log() { return GetLogger("cachenode"); }

std::string DescribeChunk(const ChunkKey& key) {
  return fmt::format("chunk {} of dataset {} manifest {}", key.chunk, Quoted(key.dataset),
                     key.manifest_id.ToHex());
}

Status CheckDataset(std::string_view dataset, std::string_view doing) {
  if (IsDnsLabel(dataset)) return Status::Ok();
  return Status::InvalidArgument(fmt::format(
      "{}: dataset name {} is not a DNS-1123 label (1 to {} of [a-z0-9-], starting and ending "
      "alphanumeric)",
      doing, Quoted(dataset), kMaxDnsLabelLength));
}

uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

enum class EntryType { kDirectory, kRegular, kOther };

struct DirEntry {
  std::string name;
  EntryType type = EntryType::kOther;
};

// The entries of `dir` (without . and ..), sorted by name, typed without
// following symlinks: a link in the store is never followed out of it.
Result<std::vector<DirEntry>> ListDirectory(const std::string& dir) {
  GRANARY_ASSIGN_OR_RETURN(ScopedFd fd, OpenFile(dir, O_RDONLY | O_DIRECTORY));
  DIR* d = ::fdopendir(fd.get());
  if (d == nullptr) return Status::FromErrno(errno, "list directory " + dir);
  fd.Release();  // closedir closes it
  std::unique_ptr<DIR, int (*)(DIR*)> closer(d, &::closedir);
  std::vector<DirEntry> entries;
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0) return Status::FromErrno(errno, "list directory " + dir);
      break;
    }
    std::string_view name(e->d_name);
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // removed since readdir
      return Status::FromErrno(errno, fmt::format("stat {}/{}", dir, Quoted(name)));
    }
    EntryType type = S_ISDIR(st.st_mode)   ? EntryType::kDirectory
                     : S_ISREG(st.st_mode) ? EntryType::kRegular
                                           : EntryType::kOther;
    entries.push_back({std::string(name), type});
  }
  std::sort(entries.begin(), entries.end(),
            [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  return entries;
}

// "<decimal chunk id>.chunk", canonical (no sign, no leading zeros).
std::optional<ChunkId> ParseChunkFileName(std::string_view name) {
  if (name.size() <= ChunkStore::kChunkSuffix.size() || !name.ends_with(ChunkStore::kChunkSuffix)) {
    return std::nullopt;
  }
  std::string_view digits = name.substr(0, name.size() - ChunkStore::kChunkSuffix.size());
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  ChunkId id = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), id);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return id;
}

// 32 lowercase hex digits (ContentId::ToHex), nothing else.
std::optional<ContentId> ParseManifestDirName(std::string_view name) {
  auto id = ContentId::Parse(name);
  if (!id.ok() || id->ToHex() != name) return std::nullopt;
  return *id;
}

// mkdir 0700; an existing directory is fine. A new one is made durable in its
// parent, so a chunk file created in it survives a crash.
Status MakeDirectory(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) == 0) return SyncDirectoryOf(path);
  if (errno == EEXIST) return Status::Ok();
  return Status::FromErrno(errno, "create directory " + path);
}

// Keeps the message, code and errno text of `s`, and adds what to do.
Status WithHint(const Status& s, std::string_view hint) {
  if (s.ok()) return s;
  return Status(s.code(), fmt::format("{}; {}", s.message(), hint));
}

// Creates `root` if it is missing (not its parents), else checks it is a
// directory this process alone may write (DataDirOwnershipProblem).
Status PrepareRoot(const std::string& root) {
  const std::string doing = "open chunk store " + root;
  struct stat st;
  if (::stat(root.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return Status::InvalidArgument(fmt::format(
          "{}: it is not a directory; set the data directory to a directory on local NVMe", doing));
    }
    const std::string problem = DataDirOwnershipProblem(root, ::geteuid());
    if (!problem.empty()) return Status::PermissionDenied(doing + ": " + problem);
    return Status::Ok();
  }
  if (errno != ENOENT) {
    return WithHint(Status::FromErrno(errno, doing + ": stat"),
                    "check the permissions of its parent directories");
  }
  if (::mkdir(root.c_str(), 0700) != 0 && errno != EEXIST) {
    if (errno == ENOENT) {
      return Status::NotFound(
          fmt::format("{}: its parent directory does not exist; create it first", doing));
    }
    return WithHint(Status::FromErrno(errno, doing + ": create the directory"),
                    "create it for the cache node's user, or run the cache node as a user who "
                    "may create it");
  }
  return SyncDirectoryOf(root);
}

// A directory becomes a store only if it holds nothing the scan would delete.
Status CheckAdoptable(const std::string& root) {
  GRANARY_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, ListDirectory(root));
  std::vector<std::string_view> foreign;
  for (const DirEntry& e : entries) {
    if (e.name == ChunkStore::kMarkerName) return Status::Ok();
    bool own = e.name == ChunkStore::kLockName || e.name == kLostAndFound ||
               e.name.starts_with(fmt::format("{}{}", ChunkStore::kMarkerName, kTempInfix));
    if (!own) foreign.push_back(e.name);
  }
  if (foreign.empty()) return Status::Ok();
  return Status::FailedPrecondition(fmt::format(
      "open chunk store {}: the directory holds {} entries (the first is {}) and no {} marker, "
      "so it is not a chunk store; the store deletes files it does not recognise, so it only "
      "adopts an empty directory: give the cache node an empty directory of its own",
      root, foreign.size(), Quoted(foreign.front()), ChunkStore::kMarkerName));
}

// "pid 123 on host 'gpu-7'" from the LOCK file's "pid 123 host gpu-7\n".
std::string DescribeHolder(std::string_view contents) {
  if (contents.empty()) return "its pid is not recorded yet";
  if (contents.ends_with('\n')) contents.remove_suffix(1);
  constexpr std::string_view kPid = "pid ";
  constexpr std::string_view kHost = " host ";
  size_t host = contents.find(kHost);
  if (contents.starts_with(kPid) && host != std::string_view::npos) {
    std::string_view pid = contents.substr(kPid.size(), host - kPid.size());
    if (!pid.empty() && pid.find_first_not_of("0123456789") == std::string_view::npos) {
      return fmt::format("pid {} on host {}", pid, Quoted(contents.substr(host + kHost.size())));
    }
  }
  return fmt::format("its lock file says {}", Quoted(contents));
}

// Takes the store's directory lock and records this process in it.
Result<ScopedFd> LockRoot(const std::string& root) {
  const std::string path = fmt::format("{}/{}", root, ChunkStore::kLockName);
  const std::string doing = "open chunk store " + root;
  // O_NOFOLLOW: a symlink planted there is never followed (PrepareRoot has
  // checked that no one else may write the directory; this is the second line).
  auto opened = OpenFile(path, O_RDWR | O_CREAT | O_NOFOLLOW, 0600);
  if (!opened.ok()) {
    struct stat link;
    if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      return Status::PermissionDenied(fmt::format(
          "{}: its lock file {} is a symbolic link, which the cache node never follows; remove "
          "it, and check who else can write {}",
          doing, path, root));
    }
    return WithHint(opened.status().WithContext(doing),
                    "the directory must be writable by the cache node's user");
  }
  ScopedFd fd = std::move(*opened);
  int rc;
  do {
    rc = ::flock(fd.get(), LOCK_EX | LOCK_NB);
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) {
    if (errno != EWOULDBLOCK) return Status::FromErrno(errno, doing + ": lock " + path);
    char buf[256];
    ssize_t n = ::pread(fd.get(), buf, sizeof(buf), 0);
    std::string_view contents(buf, n > 0 ? static_cast<size_t>(n) : 0);
    return Status::Unavailable(
        fmt::format("{}: it is in use by another cache node ({}; lock file {}); stop that one, or "
                    "give this one another data directory",
                    doing, DescribeHolder(contents), path));
  }
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::string holder = fmt::format("pid {} host {}\n", ::getpid(), host);
  if (::ftruncate(fd.get(), 0) != 0) return Status::FromErrno(errno, doing + ": truncate " + path);
  GRANARY_RETURN_IF_ERROR(PwriteFull(fd.get(), holder.data(), holder.size(), 0, path));
  return fd;
}

Status WriteOrCheckMarker(const std::string& root) {
  const std::string path = fmt::format("{}/{}", root, ChunkStore::kMarkerName);
  auto contents = ReadFileToString(path);
  if (!contents.ok()) {
    if (contents.status().code() != StatusCode::kNotFound) {
      return contents.status().WithContext("open chunk store " + root);
    }
    return WriteFileAtomically(path, kMarkerContents, 0600)
        .WithContext("open chunk store " + root + ": create its marker");
  }
  if (*contents == kMarkerContents) return Status::Ok();
  if (contents->starts_with(kMarkerPrefix)) {
    return Status::VersionMismatch(fmt::format(
        "open chunk store {}: its marker {} says layout {}, this build reads layout 1; it was "
        "made by a different Granary release: run that release, or empty the directory",
        root, path, Quoted(std::string_view(*contents).substr(kMarkerPrefix.size()))));
  }
  return Status::Corruption(
      fmt::format("open chunk store {}: its marker {} holds {}, not a chunk store marker; if the "
                  "directory is only cache, empty it",
                  root, path, Quoted(*contents)));
}

// The file system's allocation unit, which is what a chunk file's last block
// takes whatever its length.
uint64_t BlockSizeOf(const std::string& root) {
  struct statvfs vfs;
  if (::statvfs(root.c_str(), &vfs) != 0) return kDefaultBlockSize;
  uint64_t size = vfs.f_frsize != 0 ? vfs.f_frsize : vfs.f_bsize;
  bool sane = size >= 512 && size <= (1u << 20) && (size & (size - 1)) == 0;
  return sane ? size : kDefaultBlockSize;
}

// A chunk file found by the scan, and what its path says it holds.
struct Candidate {
  std::string path;
  ChunkKey key;
};

// What validating one candidate found: keep it, remove it (`problem`: it is
// provably not a sound chunk file of its place), skip it (it vanished), or
// stop (`error`: it could not be checked, so it is neither kept nor deleted).
struct CheckedFile {
  enum class Verdict { kKeep, kRemove, kVanished, kError };
  Verdict verdict = Verdict::kError;
  std::string problem;
  Status error;
  uint32_t segment_count = 0;
  uint64_t payload_size = 0;
  std::vector<bool> present;
  uint32_t present_count = 0;
  uint32_t dropped_corrupt = 0;
};

// Damage (kCorruption), another format version, or a sound file of another
// chunk is grounds for deleting a file; an I/O error, a permission problem or
// running out of descriptors is not: it says nothing about the file.
CheckedFile Reject(const Status& s) {
  CheckedFile out;
  if (s.code() == StatusCode::kCorruption || s.code() == StatusCode::kVersionMismatch ||
      s.code() == StatusCode::kFailedPrecondition) {
    out.verdict = CheckedFile::Verdict::kRemove;
    out.problem = s.ToString();
  } else if (s.code() == StatusCode::kNotFound) {
    out.verdict = CheckedFile::Verdict::kVanished;
  } else {
    out.verdict = CheckedFile::Verdict::kError;
    out.error = s;
  }
  return out;
}

CheckedFile CheckChunkFile(const Candidate& c, ChunkScanMode mode) {
  auto header = ChunkReader::ReadHeader(c.path);
  if (!header.ok()) return Reject(header.status());
  if (!(header->key == c.key)) {
    return Reject(Status::FailedPrecondition(
        fmt::format("it holds {}, not the chunk its path names", DescribeChunk(header->key))));
  }
  auto reader = ChunkReader::Open(c.path, header->key, header->segments);
  if (!reader.ok()) return Reject(reader.status());
  CheckedFile out;
  out.segment_count = reader->segment_count();
  out.payload_size = header->payload_size;
  if (mode == ChunkScanMode::kVerifyPayload) {
    auto scan = reader->Scan(ChunkScanMode::kVerifyPayload);  // errors are I/O only
    if (!scan.ok()) return Reject(scan.status());
    if (!scan->corrupt.empty()) {
      // Marked absent on disk, so the next scan agrees and they get re-staged.
      auto writer = ChunkWriter::Open(c.path, c.key, header->segments);
      if (!writer.ok()) return Reject(writer.status());
      for (uint32_t index : scan->corrupt) {
        if (Status s = writer->Drop(index); !s.ok()) return Reject(s);
      }
      out.dropped_corrupt = static_cast<uint32_t>(scan->corrupt.size());
    }
    out.present = std::move(scan->valid);
    out.present_count = scan->valid_count;
  } else {
    out.present.resize(out.segment_count);
    for (uint32_t i = 0; i < out.segment_count; ++i) out.present[i] = reader->IsPresent(i);
    out.present_count = reader->present_count();
  }
  out.verdict = CheckedFile::Verdict::kKeep;
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Handles

ChunkStore::Handle& ChunkStore::Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    Reset();
    store_ = std::move(other.store_);
    entry_ = std::move(other.entry_);
    writer_ = other.writer_;
  }
  return *this;
}

void ChunkStore::Handle::Reset() {
  if (store_ != nullptr) store_->ReleaseHandle(*entry_, writer_);
  entry_.reset();
  store_.reset();  // may destroy the store: last
}

Status StoredChunkWriter::Commit() {
  ChunkStore& store = handle_.store();
  GRANARY_RETURN_IF_ERROR(store.CheckNotDropped(*handle_.entry(), "commit", key()));
  GRANARY_RETURN_IF_ERROR(writer_.Commit());
  return store.PublishPresence(*handle_.entry(), writer_);
}

Status StoredChunkWriter::Drop(uint32_t index) {
  ChunkStore& store = handle_.store();
  GRANARY_RETURN_IF_ERROR(store.CheckNotDropped(*handle_.entry(), "drop a segment of", key()));
  GRANARY_RETURN_IF_ERROR(writer_.Drop(index));
  return store.PublishPresence(*handle_.entry(), writer_);
}

// ---------------------------------------------------------------------------
// Open and the restart scan

ChunkStore::ChunkStore(std::string root, uint64_t capacity, const ChunkStoreOptions& options,
                       uint64_t block_size, ScopedFd lock_fd)
    : root_(std::move(root)),
      capacity_(capacity),
      options_(options),
      block_size_(block_size),
      lock_fd_(std::move(lock_fd)) {}

ChunkStore::~ChunkStore() = default;

Result<std::shared_ptr<ChunkStore>> ChunkStore::Open(const std::string& root_arg,
                                                     uint64_t capacity_bytes,
                                                     const ChunkStoreOptions& options) {
  std::string root = root_arg;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  if (root.empty()) {
    return Status::InvalidArgument(
        "open chunk store: the data directory is empty; set it to a directory on local NVMe");
  }
  if (capacity_bytes == 0) {
    return Status::InvalidArgument(fmt::format(
        "open chunk store {}: capacity is 0 bytes; set it to the bytes this node may use there",
        root));
  }
  if (options.scan_threads == 0 || options.scan_threads > kMaxScanThreads) {
    return Status::InvalidArgument(
        fmt::format("open chunk store {}: scan_threads is {}; it must be 1 to {}", root,
                    options.scan_threads, kMaxScanThreads));
  }
  GRANARY_RETURN_IF_ERROR(PrepareRoot(root));
  GRANARY_RETURN_IF_ERROR(CheckAdoptable(root));
  GRANARY_ASSIGN_OR_RETURN(ScopedFd lock_fd, LockRoot(root));
  GRANARY_RETURN_IF_ERROR(WriteOrCheckMarker(root));
  uint64_t block_size = BlockSizeOf(root);
  std::shared_ptr<ChunkStore> store(
      new ChunkStore(root, capacity_bytes, options, block_size, std::move(lock_fd)));
  GRANARY_RETURN_IF_ERROR(store->Scan());
  const ChunkStoreScanReport& r = store->scan_;
  Log()->info(
      "chunk store {}: {} chunk files, {} of {} bytes used; removed {} temporary and {} invalid "
      "files, dropped {} corrupt segments, {} unknown entries left alone",
      root, r.chunk_files, store->used_bytes_, capacity_bytes, r.removed_temp_files,
      r.removed_invalid_files, r.dropped_corrupt_segments, r.unknown_entries);
  if (store->used_bytes_ > capacity_bytes) {
    Log()->warn(
        "chunk store {}: {} bytes used, over its capacity of {} bytes; nothing is created until "
        "chunks are dropped",
        root, store->used_bytes_, capacity_bytes);
  }
  return store;
}

Status ChunkStore::Scan() {
  const std::string doing = "scan chunk store " + root_;
  uint64_t warnings = 0;
  auto warn = [&](const std::string& message) {
    if (++warnings <= kMaxScanWarnings) Log()->warn("{}: {}", doing, message);
  };
  auto remove_file = [&](const std::string& path, std::string_view why) -> Status {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return WithHint(Status::FromErrno(errno, fmt::format("{}: remove {} ({})", doing, path, why)),
                      "remove it by hand");
    }
    return Status::Ok();
  };

  // 1. Walk the layout: remove temporaries and files not named like chunks,
  //    collect the chunk files. Nothing outside the leaf directories is removed.
  std::vector<Candidate> candidates;
  GRANARY_ASSIGN_OR_RETURN(std::vector<DirEntry> top, ListDirectory(root_));
  for (const DirEntry& d : top) {
    const std::string dataset_dir = root_ + "/" + d.name;
    if (d.name == kMarkerName || d.name == kLockName || d.name == kLostAndFound) continue;
    if (d.type != EntryType::kDirectory &&
        d.name.starts_with(fmt::format("{}{}", kMarkerName, kTempInfix))) {
      GRANARY_RETURN_IF_ERROR(remove_file(dataset_dir, "temporary file"));
      ++scan_.removed_temp_files;
      continue;
    }
    if (d.type != EntryType::kDirectory || !IsDnsLabel(d.name)) {
      ++scan_.unknown_entries;
      warn(fmt::format("left alone {}, which is not a dataset directory", Quoted(d.name)));
      continue;
    }
    GRANARY_ASSIGN_OR_RETURN(std::vector<DirEntry> manifests, ListDirectory(dataset_dir));
    size_t dataset_entries_left = manifests.size();
    for (const DirEntry& m : manifests) {
      const std::string manifest_dir = dataset_dir + "/" + m.name;
      std::optional<ContentId> manifest_id = ParseManifestDirName(m.name);
      if (m.type != EntryType::kDirectory || !manifest_id) {
        ++scan_.unknown_entries;
        warn(fmt::format("left alone {}/{}, which is not a manifest directory", d.name,
                         Quoted(m.name)));
        continue;
      }
      GRANARY_ASSIGN_OR_RETURN(std::vector<DirEntry> files, ListDirectory(manifest_dir));
      size_t manifest_entries_left = files.size();
      for (const DirEntry& f : files) {
        const std::string path = manifest_dir + "/" + f.name;
        if (f.type == EntryType::kDirectory) {
          ++scan_.unknown_entries;
          warn(fmt::format("left alone directory {}/{}/{}", d.name, m.name, Quoted(f.name)));
          continue;
        }
        if (f.name.find(kTempInfix) != std::string::npos) {
          GRANARY_RETURN_IF_ERROR(remove_file(path, "temporary file of an interrupted create"));
          ++scan_.removed_temp_files;
          --manifest_entries_left;
          continue;
        }
        std::optional<ChunkId> chunk = ParseChunkFileName(f.name);
        if (!chunk || f.type != EntryType::kRegular) {
          std::string why = !chunk ? "not named like a chunk file" : "not a regular file";
          GRANARY_RETURN_IF_ERROR(remove_file(path, why));
          ++scan_.removed_invalid_files;
          --manifest_entries_left;
          warn(fmt::format("removed {}/{}/{}: {}", d.name, m.name, Quoted(f.name), why));
          continue;
        }
        candidates.push_back({path, ChunkKey{d.name, *manifest_id, *chunk}});
      }
      if (manifest_entries_left == 0 && ::rmdir(manifest_dir.c_str()) == 0) {
        --dataset_entries_left;
      }
    }
    if (dataset_entries_left == 0) ::rmdir(dataset_dir.c_str());  // tidiness only
  }

  // 2. Validate the chunk files, in parallel: each is opened and its header
  //    region read (and with kVerifyPayload, its whole payload).
  std::vector<CheckedFile> checked(candidates.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < candidates.size(); i = next++) {
      checked[i] = CheckChunkFile(candidates[i], options_.scan_mode);
    }
  };
  std::vector<std::thread> threads;
  size_t extra = std::min<size_t>(options_.scan_threads, candidates.size());
  for (size_t t = 1; t < extra; ++t) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error& e) {  // no more threads: the ones we have finish the job
      Log()->warn("{}: started {} scan threads of {}: {}", doing, t, extra, e.what());
      break;
    }
  }
  work();
  for (std::thread& t : threads) t.join();

  // 3. Remove what failed, then index the rest. No other thread sees the store
  //    yet, but the index is mu_'s all the same.
  for (size_t i = 0; i < candidates.size(); ++i) {
    const CheckedFile& c = checked[i];
    if (c.verdict == CheckedFile::Verdict::kError) {
      return WithHint(
          c.error.WithContext(fmt::format("{}: validate {}", doing, candidates[i].path)),
          "fix the cause and restart; the file is left as it was");
    }
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (checked[i].verdict != CheckedFile::Verdict::kRemove) continue;
    GRANARY_RETURN_IF_ERROR(remove_file(candidates[i].path, checked[i].problem));
    ++scan_.removed_invalid_files;
    warn(fmt::format("removed {}: {}", candidates[i].path, checked[i].problem));
  }
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < candidates.size(); ++i) {
    CheckedFile& c = checked[i];
    if (c.verdict != CheckedFile::Verdict::kKeep) continue;
    auto entry = std::make_shared<Entry>();
    entry->state = EntryState::kReady;
    entry->bytes = ChunkBytes(c.segment_count, c.payload_size);
    entry->present = std::move(c.present);
    entry->present_count = c.present_count;
    const ChunkKey& key = candidates[i].key;
    datasets_[key.dataset][key.manifest_id].chunks[key.chunk] = entry;
    used_bytes_ += entry->bytes;
    ++scan_.chunk_files;
    scan_.dropped_corrupt_segments += c.dropped_corrupt;
    if (c.dropped_corrupt > 0) {
      warn(fmt::format("{}: {} corrupt segments marked absent for re-staging", candidates[i].path,
                       c.dropped_corrupt));
    }
  }
  if (warnings > kMaxScanWarnings) {
    Log()->warn("{}: {} more warnings not shown", doing, warnings - kMaxScanWarnings);
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Sizes and paths

uint64_t ChunkStore::ChunkBytes(uint32_t segment_count, uint64_t payload_size) const {
  return RoundUp(cf::HeaderRegionSize(segment_count) + payload_size, block_size_);
}

uint64_t ChunkStore::ChunkBytes(std::span<const ChunkSegment> segments) const {
  uint64_t end = 0;
  for (const ChunkSegment& s : segments) end = std::max(end, uint64_t{s.chunk_offset} + s.length);
  auto count = static_cast<uint32_t>(std::min<size_t>(segments.size(), UINT32_MAX));
  return ChunkBytes(count, end);
}

std::string ChunkStore::ManifestDirectory(std::string_view dataset,
                                          const ContentId& manifest_id) const {
  return fmt::format("{}/{}/{}", root_, dataset, manifest_id.ToHex());
}

std::string ChunkStore::ChunkPath(const ChunkKey& key) const {
  return fmt::format("{}/{}{}", ManifestDirectory(key.dataset, key.manifest_id), key.chunk,
                     kChunkSuffix);
}

Status ChunkStore::EnsureManifestDirectory(const ChunkKey& key) const {
  GRANARY_RETURN_IF_ERROR(MakeDirectory(fmt::format("{}/{}", root_, key.dataset)));
  return MakeDirectory(ManifestDirectory(key.dataset, key.manifest_id));
}

// ---------------------------------------------------------------------------
// The index (mu_ held)

std::shared_ptr<ChunkStore::Entry> ChunkStore::FindLocked(const ChunkKey& key) const {
  auto d = datasets_.find(key.dataset);
  if (d == datasets_.end()) return nullptr;
  auto m = d->second.find(key.manifest_id);
  if (m == d->second.end()) return nullptr;
  auto c = m->second.chunks.find(key.chunk);
  return c == m->second.chunks.end() ? nullptr : c->second;
}

void ChunkStore::EraseLocked(const ChunkKey& key, const Entry* entry) {
  auto d = datasets_.find(key.dataset);
  if (d == datasets_.end()) return;
  auto m = d->second.find(key.manifest_id);
  if (m == d->second.end()) return;
  auto c = m->second.chunks.find(key.chunk);
  if (c != m->second.chunks.end() && c->second.get() == entry) m->second.chunks.erase(c);
  // A manifest being dropped stays: creates in it are refused until the drop ends.
  if (m->second.chunks.empty() && !m->second.dropping) d->second.erase(m);
  if (d->second.empty()) datasets_.erase(d);
}

void ChunkStore::ReleaseBytesLocked(Entry& entry) {
  used_bytes_ -= entry.bytes;
  entry.bytes = 0;
}

Result<std::shared_ptr<ChunkStore::Entry>> ChunkStore::AcquireLocked(const ChunkKey& key,
                                                                     bool writer,
                                                                     std::string_view doing) {
  std::shared_ptr<Entry> entry = FindLocked(key);
  if (entry == nullptr || entry->state == EntryState::kDropping ||
      entry->state == EntryState::kDropped) {
    return Status::NotFound(
        fmt::format("{}: it is not in the store; create it with CreateChunk", doing));
  }
  if (entry->state == EntryState::kCreating) {
    return Status::Unavailable(
        fmt::format("{}: it is being created; retry when CreateChunk has returned", doing));
  }
  if (writer && entry->writer_open) {
    return Status::Unavailable(
        fmt::format("{}: another writer of it is open; retry when that one is closed", doing));
  }
  ++entry->open_handles;
  if (writer) entry->writer_open = true;
  return entry;
}

void ChunkStore::ReleaseHandle(Entry& entry, bool writer) {
  std::lock_guard lock(mu_);
  --entry.open_handles;
  if (writer) entry.writer_open = false;
  if (entry.state == EntryState::kDropped && entry.open_handles == 0) ReleaseBytesLocked(entry);
}

Status ChunkStore::CheckNotDropped(const Entry& entry, std::string_view doing,
                                   const ChunkKey& key) const {
  std::lock_guard lock(mu_);
  if (entry.state == EntryState::kReady) return Status::Ok();
  return Status::FailedPrecondition(
      fmt::format("{} {} in chunk store {}: the chunk was dropped while this writer was open; "
                  "create it anew",
                  doing, DescribeChunk(key), root_));
}

Status ChunkStore::CheckOpenedFileIsTheEntrys(const Entry& entry, std::string_view doing) const {
  // A drop marks the entry before it unlinks the file, so an entry still ready
  // after the open means the file opened was this entry's, not a later
  // chunk's created under the same name.
  std::lock_guard lock(mu_);
  if (entry.state == EntryState::kReady) return Status::Ok();
  return Status::NotFound(fmt::format("{}: it was dropped while being opened", doing));
}

Status ChunkStore::PublishPresence(Entry& entry, const ChunkWriter& writer) {
  std::vector<bool> present(writer.segment_count());
  for (uint32_t i = 0; i < writer.segment_count(); ++i) present[i] = writer.IsPresent(i);
  std::lock_guard lock(mu_);
  if (entry.state != EntryState::kReady) {
    return Status::FailedPrecondition(
        fmt::format("commit {} in chunk store {}: the chunk was dropped while this writer was "
                    "open; create it anew",
                    DescribeChunk(writer.key()), root_));
  }
  entry.present = std::move(present);
  entry.present_count = writer.present_count();
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Create, open

Result<StoredChunkWriter> ChunkStore::CreateChunk(const ChunkKey& key,
                                                  std::span<const ChunkSegment> segments) {
  const std::string doing = fmt::format("create {} in chunk store {}", DescribeChunk(key), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(key.dataset, doing));
  // The full geometry check is ChunkWriter::Create's; this one only keeps a
  // bogus size from being reported as "does not fit".
  uint64_t payload_end = 0;
  for (const ChunkSegment& s : segments) {
    payload_end = std::max(payload_end, uint64_t{s.chunk_offset} + s.length);
  }
  if (segments.size() > cf::kMaxSegments || payload_end > cf::kMaxPayloadSize) {
    return Status::InvalidArgument(fmt::format(
        "{}: {} segments ending at payload offset {} exceed the chunk file limits ({} segments, "
        "{} bytes); pass the manifest's segment list for the chunk",
        doing, segments.size(), payload_end, cf::kMaxSegments, cf::kMaxPayloadSize));
  }
  const uint64_t bytes = ChunkBytes(static_cast<uint32_t>(segments.size()), payload_end);
  std::shared_ptr<ChunkStore> self = shared_from_this();
  auto entry = std::make_shared<Entry>();
  {
    std::lock_guard lock(mu_);
    if (dropping_datasets_.contains(key.dataset)) {
      return Status::Unavailable(
          fmt::format("{}: the dataset is being dropped; retry when the drop is done", doing));
    }
    if (std::shared_ptr<Entry> existing = FindLocked(key); existing != nullptr) {
      switch (existing->state) {
        case EntryState::kReady:
          return Status::AlreadyExists(fmt::format(
              "{}: it is already in the store; fill it with OpenChunkWriter, or DropChunk it "
              "first",
              doing));
        case EntryState::kCreating:
          return Status::Unavailable(fmt::format(
              "{}: another thread is creating it; retry when that create returns", doing));
        case EntryState::kDropping:
        case EntryState::kDropped:
          return Status::Unavailable(
              fmt::format("{}: it is being dropped; retry when the drop is done", doing));
      }
    }
    auto d = datasets_.find(key.dataset);
    if (d != datasets_.end()) {
      auto m = d->second.find(key.manifest_id);
      if (m != d->second.end() && m->second.dropping) {
        return Status::Unavailable(
            fmt::format("{}: the manifest is being dropped; retry when the drop is done", doing));
      }
    }
    if (used_bytes_ > capacity_ || bytes > capacity_ - used_bytes_) {
      ++creates_refused_;
      return Status::ResourceExhausted(fmt::format(
          "{}: it takes {} bytes and the store has {} of its {} bytes free; drop chunks or "
          "datasets, or raise the capacity",
          doing, bytes, used_bytes_ > capacity_ ? 0 : capacity_ - used_bytes_, capacity_));
    }
    used_bytes_ += bytes;
    entry->bytes = bytes;
    entry->open_handles = 1;
    entry->writer_open = true;
    datasets_[key.dataset][key.manifest_id].chunks[key.chunk] = entry;
  }

  const std::string path = ChunkPath(key);
  Status created = EnsureManifestDirectory(key);
  std::optional<ChunkWriter> writer;
  if (created.ok()) {
    ChunkCreateOptions create_options;
    create_options.preallocate = options_.preallocate;
    auto w = ChunkWriter::Create(path, key, segments, create_options);
    if (w.ok()) {
      writer.emplace(std::move(*w));
    } else {
      created = w.status();
    }
  }
  if (!created.ok()) {
    // Create may fail after its file got its name (syncing the directory):
    // leave nothing behind. kAlreadyExists is a file the index did not know;
    // it is not ours to remove.
    if (created.code() != StatusCode::kAlreadyExists) ::unlink(path.c_str());
    bool no_space = created.code() == StatusCode::kResourceExhausted;
    {
      std::lock_guard lock(mu_);
      EraseLocked(key, entry.get());
      ReleaseBytesLocked(*entry);
      if (no_space) ++creates_no_space_;
    }
    changed_.notify_all();
    if (no_space) {
      return WithHint(created.WithContext(doing),
                      "the file system is full before the store's capacity is reached: free "
                      "space on it, or lower the capacity");
    }
    return created.WithContext(doing);
  }
  {
    std::lock_guard lock(mu_);
    entry->state = EntryState::kReady;
    entry->present.assign(segments.size(), false);
    entry->present_count = 0;
    ++chunks_created_;
  }
  changed_.notify_all();
  return StoredChunkWriter(Handle(std::move(self), std::move(entry), /*writer=*/true),
                           std::move(*writer));
}

Result<StoredChunkWriter> ChunkStore::OpenChunkWriter(const ChunkKey& key,
                                                      std::span<const ChunkSegment> segments) {
  const std::string doing =
      fmt::format("open a writer of {} in chunk store {}", DescribeChunk(key), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(key.dataset, doing));
  std::shared_ptr<ChunkStore> self = shared_from_this();
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard lock(mu_);
    GRANARY_ASSIGN_OR_RETURN(entry, AcquireLocked(key, /*writer=*/true, doing));
  }
  Handle handle(std::move(self), std::move(entry), /*writer=*/true);  // released on failure
  auto writer = ChunkWriter::Open(ChunkPath(key), key, segments);
  if (!writer.ok()) return writer.status().WithContext(doing);
  GRANARY_RETURN_IF_ERROR(CheckOpenedFileIsTheEntrys(*handle.entry(), doing));
  return StoredChunkWriter(std::move(handle), std::move(*writer));
}

Result<StoredChunkReader> ChunkStore::OpenChunkReader(const ChunkKey& key,
                                                      std::span<const ChunkSegment> segments) {
  const std::string doing = fmt::format("open {} in chunk store {}", DescribeChunk(key), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(key.dataset, doing));
  std::shared_ptr<ChunkStore> self = shared_from_this();
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard lock(mu_);
    GRANARY_ASSIGN_OR_RETURN(entry, AcquireLocked(key, /*writer=*/false, doing));
  }
  Handle handle(std::move(self), std::move(entry), /*writer=*/false);
  auto reader = ChunkReader::Open(ChunkPath(key), key, segments);
  if (!reader.ok()) return reader.status().WithContext(doing);
  GRANARY_RETURN_IF_ERROR(CheckOpenedFileIsTheEntrys(*handle.entry(), doing));
  return StoredChunkReader(std::move(handle), std::move(*reader));
}

// ---------------------------------------------------------------------------
// Queries

bool ChunkStore::HasChunk(const ChunkKey& key) const {
  if (!IsDnsLabel(key.dataset)) return false;
  std::lock_guard lock(mu_);
  std::shared_ptr<Entry> entry = FindLocked(key);
  return entry != nullptr && entry->state == EntryState::kReady;
}

Result<StoredChunk> ChunkStore::Chunk(const ChunkKey& key) const {
  const std::string doing = fmt::format("look up {} in chunk store {}", DescribeChunk(key), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(key.dataset, doing));
  std::lock_guard lock(mu_);
  std::shared_ptr<Entry> entry = FindLocked(key);
  if (entry == nullptr || entry->state != EntryState::kReady) {
    return Status::NotFound(fmt::format("{}: it is not in the store", doing));
  }
  StoredChunk out;
  out.chunk = key.chunk;
  out.segment_count = static_cast<uint32_t>(entry->present.size());
  out.present_count = entry->present_count;
  out.bytes = entry->bytes;
  return out;
}

Result<std::vector<bool>> ChunkStore::PresentSegments(const ChunkKey& key) const {
  const std::string doing =
      fmt::format("list present segments of {} in chunk store {}", DescribeChunk(key), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(key.dataset, doing));
  std::lock_guard lock(mu_);
  std::shared_ptr<Entry> entry = FindLocked(key);
  if (entry == nullptr || entry->state != EntryState::kReady) {
    return Status::NotFound(fmt::format("{}: it is not in the store", doing));
  }
  return entry->present;
}

std::vector<StoredManifest> ChunkStore::Manifests() const {
  std::vector<StoredManifest> out;
  std::lock_guard lock(mu_);
  for (const auto& [dataset, manifests] : datasets_) {
    for (const auto& [id, m] : manifests) {
      StoredManifest s;
      s.dataset = dataset;
      s.manifest_id = id;
      for (const auto& [chunk, entry] : m.chunks) {
        if (entry->state != EntryState::kReady) continue;
        ++s.chunk_count;
        s.segment_count += entry->present.size();
        s.present_segments += entry->present_count;
        s.bytes += entry->bytes;
        if (entry->present_count == entry->present.size()) ++s.complete_chunks;
      }
      if (s.chunk_count > 0) out.push_back(std::move(s));
    }
  }
  return out;
}

Result<std::vector<StoredChunk>> ChunkStore::Chunks(std::string_view dataset,
                                                    const ContentId& manifest_id) const {
  const std::string doing = fmt::format("list chunks of dataset {} manifest {} in chunk store {}",
                                        Quoted(dataset), manifest_id.ToHex(), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(dataset, doing));
  std::vector<StoredChunk> out;
  std::lock_guard lock(mu_);
  auto d = datasets_.find(dataset);
  if (d != datasets_.end()) {
    auto m = d->second.find(manifest_id);
    if (m != d->second.end()) {
      for (const auto& [chunk, entry] : m->second.chunks) {
        if (entry->state != EntryState::kReady) continue;
        out.push_back({chunk, static_cast<uint32_t>(entry->present.size()), entry->present_count,
                       entry->bytes});
      }
    }
  }
  if (out.empty()) return Status::NotFound(fmt::format("{}: it has no chunks here", doing));
  return out;
}

uint64_t ChunkStore::used_bytes() const {
  std::lock_guard lock(mu_);
  return used_bytes_;
}

uint64_t ChunkStore::free_bytes() const {
  std::lock_guard lock(mu_);
  return used_bytes_ >= capacity_ ? 0 : capacity_ - used_bytes_;
}

ChunkStoreStats ChunkStore::Stats() const {
  ChunkStoreStats s;
  s.capacity_bytes = capacity_;
  s.scan = scan_;
  {
    std::lock_guard lock(mu_);
    s.used_bytes = used_bytes_;
    s.free_bytes = used_bytes_ >= capacity_ ? 0 : capacity_ - used_bytes_;
    for (const auto& [dataset, manifests] : datasets_) {
      for (const auto& [id, m] : manifests) {
        bool any = false;
        for (const auto& [chunk, entry] : m.chunks) {
          if (entry->state != EntryState::kReady) continue;
          any = true;
          ++s.chunk_count;
          s.present_segments += entry->present_count;
        }
        if (any) ++s.manifest_count;
      }
    }
    s.chunks_created_total = chunks_created_;
    s.chunks_dropped_total = chunks_dropped_;
    s.creates_refused_total = creates_refused_;
    s.creates_no_space_total = creates_no_space_;
  }
  struct statvfs vfs;
  if (::statvfs(root_.c_str(), &vfs) == 0) {
    s.filesystem_available_bytes = uint64_t{vfs.f_bavail} * uint64_t{vfs.f_frsize};
  }
  return s;
}

// ---------------------------------------------------------------------------
// Drops

Status ChunkStore::UnlinkAndForget(std::vector<DropItem>& items, std::string_view doing) {
  size_t failed = 0;
  Status first;
  for (DropItem& item : items) {
    std::string path = ChunkPath(item.key);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      item.unlinked = Status::FromErrno(errno, "remove " + path);
      if (failed++ == 0) first = item.unlinked;
    }
  }
  {
    std::lock_guard lock(mu_);
    for (DropItem& item : items) {
      Entry& entry = *item.entry;
      if (!item.unlinked.ok()) {
        entry.state = EntryState::kReady;  // the file is still there and still counted
        continue;
      }
      EraseLocked(item.key, &entry);
      entry.state = EntryState::kDropped;
      if (entry.open_handles == 0) ReleaseBytesLocked(entry);
      ++chunks_dropped_;
    }
  }
  if (failed == 0) return Status::Ok();
  return Status(first.code(),
                fmt::format("{}: could not remove {} of {} chunk files (first: {}); they stay in "
                            "the store: fix the file system's permissions or remove them by hand",
                            doing, failed, items.size(), first.message()));
}

Status ChunkStore::DropChunk(const ChunkKey& key) {
  const std::string doing = fmt::format("drop {} from chunk store {}", DescribeChunk(key), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(key.dataset, doing));
  std::vector<DropItem> items;
  {
    std::unique_lock lock(mu_);
    // A create in flight ends in one fallocate and a few syncs.
    changed_.wait(lock, [&] {
      std::shared_ptr<Entry> e = FindLocked(key);
      return e == nullptr || e->state != EntryState::kCreating;
    });
    std::shared_ptr<Entry> entry = FindLocked(key);
    if (entry == nullptr || entry->state != EntryState::kReady) {
      return Status::NotFound(fmt::format("{}: it is not in the store", doing));
    }
    entry->state = EntryState::kDropping;
    items.push_back({key, std::move(entry), Status::Ok()});
  }
  Status s = UnlinkAndForget(items, doing);
  changed_.notify_all();
  return s;
}

Status ChunkStore::DropManifest(std::string_view dataset, const ContentId& manifest_id) {
  const std::string doing = fmt::format("drop dataset {} manifest {} from chunk store {}",
                                        Quoted(dataset), manifest_id.ToHex(), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(dataset, doing));
  const std::string name(dataset);
  auto find = [&]() -> ManifestChunks* {
    auto d = datasets_.find(name);
    if (d == datasets_.end()) return nullptr;
    auto m = d->second.find(manifest_id);
    return m == d->second.end() ? nullptr : &m->second;
  };
  std::vector<DropItem> items;
  {
    std::unique_lock lock(mu_);
    // Another drop of it (or of its dataset) finishes first.
    changed_.wait(lock, [&] {
      ManifestChunks* m = find();
      return !dropping_datasets_.contains(name) && (m == nullptr || !m->dropping);
    });
    ManifestChunks* m = find();
    if (m == nullptr) return Status::NotFound(fmt::format("{}: it has no chunks here", doing));
    m->dropping = true;  // refuses new creates in it
    changed_.wait(lock, [&] {
      return std::none_of(m->chunks.begin(), m->chunks.end(),
                          [](const auto& c) { return c.second->state == EntryState::kCreating; });
    });
    for (auto& [chunk, entry] : m->chunks) {
      if (entry->state != EntryState::kReady) continue;  // a DropChunk of it is running
      entry->state = EntryState::kDropping;
      items.push_back({ChunkKey{name, manifest_id, chunk}, entry, Status::Ok()});
    }
  }
  Status s = UnlinkAndForget(items, doing);
  if (s.ok()) ::rmdir(ManifestDirectory(name, manifest_id).c_str());  // tidiness only
  {
    std::lock_guard lock(mu_);
    auto d = datasets_.find(name);
    if (d != datasets_.end()) {
      auto m = d->second.find(manifest_id);
      if (m != d->second.end()) {
        m->second.dropping = false;
        if (m->second.chunks.empty()) d->second.erase(m);
      }
      if (d->second.empty()) datasets_.erase(d);
    }
  }
  changed_.notify_all();
  return s;
}

Status ChunkStore::DropDataset(std::string_view dataset) {
  const std::string doing =
      fmt::format("drop dataset {} from chunk store {}", Quoted(dataset), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(dataset, doing));
  const std::string name(dataset);
  std::vector<DropItem> items;
  std::vector<ContentId> manifest_ids;
  {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return !dropping_datasets_.contains(name); });
    if (!datasets_.contains(name)) {
      return Status::NotFound(fmt::format("{}: it has no chunks here", doing));
    }
    dropping_datasets_.insert(name);  // refuses new creates in it
    // Creates in flight and drops of its manifests finish first.
    changed_.wait(lock, [&] {
      auto d = datasets_.find(name);
      if (d == datasets_.end()) return true;
      for (const auto& [id, m] : d->second) {
        if (m.dropping) return false;
        for (const auto& [chunk, entry] : m.chunks) {
          if (entry->state == EntryState::kCreating) return false;
        }
      }
      return true;
    });
    auto d = datasets_.find(name);
    if (d != datasets_.end()) {
      for (auto& [id, m] : d->second) {
        manifest_ids.push_back(id);
        for (auto& [chunk, entry] : m.chunks) {
          if (entry->state != EntryState::kReady) continue;
          entry->state = EntryState::kDropping;
          items.push_back({ChunkKey{name, id, chunk}, entry, Status::Ok()});
        }
      }
    }
  }
  Status s = UnlinkAndForget(items, doing);
  if (s.ok()) {  // tidiness only: a directory left behind is harmless
    for (const ContentId& id : manifest_ids) ::rmdir(ManifestDirectory(name, id).c_str());
    ::rmdir(fmt::format("{}/{}", root_, name).c_str());
  }
  {
    std::lock_guard lock(mu_);
    dropping_datasets_.erase(name);
  }
  changed_.notify_all();
  return s;
}


}  // namespace granary
