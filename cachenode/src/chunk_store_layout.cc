#include "chunk_store_layout.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>

#include "granary/cachenode/chunk_store.h"
#include "granary/core/names.h"

namespace granary {
namespace chunk_store_layout {
namespace {

// The marker says "this directory is a chunk store, layout 1". A later layout
// changes the number; this build refuses to scan (and delete from) another.
constexpr std::string_view kMarkerPrefix = "granary chunk store\nlayout ";
constexpr std::string_view kMarkerContents = "granary chunk store\nlayout 1\n";
constexpr uint64_t kDefaultBlockSize = 4096;

}  // namespace

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
  if (name.size() <= kChunkSuffix.size() || !name.ends_with(kChunkSuffix)) {
    return std::nullopt;
  }
  std::string_view digits = name.substr(0, name.size() - kChunkSuffix.size());
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
    if (e.name == kMarkerName) return Status::Ok();
    bool own = e.name == kLockName || e.name == kLostAndFound ||
               e.name.starts_with(fmt::format("{}{}", kMarkerName, kTempInfix));
    if (!own) foreign.push_back(e.name);
  }
  if (foreign.empty()) return Status::Ok();
  return Status::FailedPrecondition(fmt::format(
      "open chunk store {}: the directory holds {} entries (the first is {}) and no {} marker, "
      "so it is not a chunk store; the store deletes files it does not recognise, so it only "
      "adopts an empty directory: give the cache node an empty directory of its own",
      root, foreign.size(), Quoted(foreign.front()), kMarkerName));
}

namespace {

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

}  // namespace

// Takes the store's directory lock and records this process in it.
Result<ScopedFd> LockRoot(const std::string& root) {
  const std::string path = fmt::format("{}/{}", root, kLockName);
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
  const std::string path = fmt::format("{}/{}", root, kMarkerName);
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

}  // namespace chunk_store_layout

}  // namespace granary
