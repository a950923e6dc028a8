#include "granary/core/manifest_builder.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include "granary/core/file.h"
#include "granary/core/glob.h"
#include "granary/core/log.h"
#include "granary/core/manifest_format.h"

namespace granary {
namespace {

constexpr uint64_t kProgressEvery = 4096;

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

int64_t CtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec;
}

uint16_t ModeBits(const struct stat& st) { return static_cast<uint16_t>(st.st_mode & kMaxMode); }

std::string Join(const std::string& dir, const char* name) {
  return dir.empty() ? std::string(name) : dir + "/" + name;
}

// Opens a directory under the root without following any symlink on the way,
// so a directory swapped for a link during the walk cannot lead outside.
int OpenDirBeneath(int root_fd, const std::string& rel) {
  const char* path = rel.empty() ? "." : rel.c_str();
  struct open_how how {};
  how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;
  long fd = ::syscall(SYS_openat2, root_fd, path, &how, sizeof(how));
  if (fd < 0 && errno == ENOSYS) {
    fd = ::openat(root_fd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  }
  return static_cast<int>(fd);
}

// `path` with repeated and trailing slashes and "." components dropped.
std::string NormalizedPath(const std::string& path) {
  std::string out = path.empty() || path[0] != '/' ? "" : "/";
  for (const std::string& part : PathComponents(path)) {
    if (!out.empty() && out.back() != '/') out += '/';
    out += part;
  }
  return out.empty() ? "." : out;
}

// The root opened without following links (OpenDirectoryWithoutSymlinks),
// readable.
Result<ScopedFd> OpenRootWithoutSymlinks(const std::string& root, const std::string& what) {
  if (root.empty()) return Status::NotFound(what + ": no source root given");
  ScopedFd at(OpenDirectoryWithoutSymlinks(root));
  if (!at.valid()) {
    const int e = errno;
    if (e == ENOTDIR || e == ELOOP) GRANARY_RETURN_IF_ERROR(RefuseSymlinkInPath(root));
    return Status::FromErrno(e, what + ": open the source root without following links")
        .WithContext("check that the path exists and is a directory the owner may search");
  }
  const int fd = ::openat(at.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return Status::FromErrno(errno, what + ": the source root must be a readable directory");
  }
  return ScopedFd(fd);
}

class Walker {
 public:
  Walker(const ManifestBuildOptions& options, int root_fd, std::string root_real, GlobSet include,
         GlobSet exclude)
      : options_(options),
        root_fd_(root_fd),
        root_real_(std::move(root_real)),
        include_(std::move(include)),
        exclude_(std::move(exclude)),
        log_(GetLogger("core")) {}

  void Run(unsigned threads) {
    queue_.push_back("");
    pending_ = 1;
    std::vector<std::thread> workers;
    workers.reserve(threads);
    for (unsigned i = 0; i < threads; ++i) workers.emplace_back([this] { WorkLoop(); });
    for (auto& t : workers) t.join();
    if (options_.on_progress) options_.on_progress(files_, stats_.directories);
    if (stats_.skipped_unreadable > 1) {
      log_->warn("snapshot of {}: skipped {} entries it could not read or represent", root_real_,
                 stats_.skipped_unreadable);
    }
  }

  std::vector<FileEntry> TakeEntries() { return std::move(entries_); }
  std::vector<DirectoryEntry> TakeDirectories() { return std::move(directories_); }
  const WalkStats& stats() const { return stats_; }

 private:
  struct Local {
    std::vector<FileEntry> entries;
    std::vector<DirectoryEntry> directories;  // the one read, with its mode
    std::vector<std::string> subdirs;
    WalkStats stats;
  };

  void WorkLoop() {
    while (true) {
      std::string dir;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty() || pending_ == 0; });
        if (queue_.empty()) return;
        dir = std::move(queue_.front());
        queue_.pop_front();
      }
      Local local;
      ReadDirectory(dir, &local);
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& d : local.subdirs) queue_.push_back(std::move(d));
      pending_ += local.subdirs.size();
      pending_ -= 1;
      Merge(local);
      cv_.notify_all();
    }
  }

  // Called with mu_ held.
  void Merge(Local& local) {
    uint64_t before = files_;
    files_ += local.entries.size();
    for (auto& e : local.entries) entries_.push_back(std::move(e));
    for (auto& d : local.directories) directories_.push_back(std::move(d));
    stats_.directories += local.stats.directories;
    stats_.skipped_excluded += local.stats.skipped_excluded;
    stats_.skipped_not_included += local.stats.skipped_not_included;
    stats_.skipped_special += local.stats.skipped_special;
    stats_.skipped_symlinks += local.stats.skipped_symlinks;
    stats_.skipped_unreadable += local.stats.skipped_unreadable;
    if (options_.on_progress && files_ / kProgressEvery != before / kProgressEvery) {
      options_.on_progress(files_, stats_.directories);
    }
  }

  // Counts an entry that cannot be a sample; logs the first one only (a tree
  // with many unreadable entries would otherwise flood the log).
  void Skip(Local* local, const std::string& rel, const std::string& why) {
    local->stats.skipped_unreadable++;
    if (!warned_.exchange(true)) {
      log_->warn("snapshot of {}: skipping '{}': {} (further skips are counted, not logged)",
                 root_real_, rel, why);
    }
  }
  void Unreadable(Local* local, const std::string& rel, int err) {
    Skip(local, rel, ErrnoText(err));
  }

  void ReadDirectory(const std::string& rel, Local* local) {
    int fd = OpenDirBeneath(root_fd_, rel);
    if (fd < 0) {
      Unreadable(local, rel.empty() ? "." : rel, errno);
      return;
    }
    DIR* d = ::fdopendir(fd);
    if (d == nullptr) {
      ::close(fd);
      Unreadable(local, rel, errno);
      return;
    }
    local->stats.directories++;
    struct stat st;
    // The directory's own permission bits (the view shows them); if fstat
    // fails on an open directory, the default mode is shown.
    const uint16_t mode = ::fstat(fd, &st) == 0 ? ModeBits(st) : kDefaultDirectoryMode;
    local->directories.push_back(DirectoryEntry{rel, mode});
    while (true) {
      errno = 0;
      struct dirent* ent = ::readdir(d);
      if (ent == nullptr) {
        if (errno != 0) Unreadable(local, rel, errno);
        break;
      }
      const char* name = ent->d_name;
      if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
      Visit(fd, rel, name, ent->d_type, local);
    }
    ::closedir(d);
  }

  void Visit(int dir_fd, const std::string& dir, const char* name, unsigned char type,
             Local* local) {
    std::string rel = Join(dir, name);
    if (rel.size() > manifest_format::kMaxPathLength) {
      Skip(local, rel.substr(0, 80) + "...", "path is longer than 4095 bytes");
      return;
    }
    struct stat st;
    if (type == DT_UNKNOWN || type == DT_REG) {
      if (::fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        Unreadable(local, rel, errno);
        return;
      }
      type = S_ISDIR(st.st_mode)   ? DT_DIR
             : S_ISREG(st.st_mode) ? DT_REG
             : S_ISLNK(st.st_mode) ? DT_LNK
                                   : DT_UNKNOWN;
    }
    switch (type) {
      case DT_DIR:
        if (!exclude_.empty() && exclude_.Match(rel)) {
          local->stats.skipped_excluded++;
        } else {
          local->subdirs.push_back(std::move(rel));
        }
        return;
      case DT_REG:
        AddFile(std::move(rel), st, local);
        return;
      case DT_LNK:
        VisitSymlink(std::move(rel), local);
        return;
      default:
        local->stats.skipped_special++;
        return;
    }
  }

  // Resolves the link exactly as PosixSource's reads will (openat2 from the
  // root, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS), so that the manifest holds
  // no link staging would refuse: an absolute link (even to a file inside the
  // root), one leaving the root, a loop or a dangling link fails here as it
  // would there. Without openat2 the source follows no link, and neither
  // does the manifest.
  void VisitSymlink(std::string rel, Local* local) {
    struct open_how how {};
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    const long fd = ::syscall(SYS_openat2, root_fd_, rel.c_str(), &how, sizeof(how));
    if (fd < 0) {
      local->stats.skipped_symlinks++;
      return;
    }
    struct stat st;
    const int r = ::fstat(static_cast<int>(fd), &st);
    ::close(static_cast<int>(fd));
    if (r < 0 || !S_ISREG(st.st_mode)) {
      local->stats.skipped_symlinks++;  // directories are never followed: no cycles
      return;
    }
    AddFile(std::move(rel), st, local);
  }

  void AddFile(std::string rel, const struct stat& st, Local* local) {
    if (!exclude_.empty() && exclude_.Match(rel)) {
      local->stats.skipped_excluded++;
      return;
    }
    if (!include_.empty() && !include_.Match(rel)) {
      local->stats.skipped_not_included++;
      return;
    }
    // ctime and inode identify this version of the file for the reads that
    // stage or serve it (FileEntry); a file's ctime is never 0 in practice,
    // nor its inode number.
    local->entries.push_back(FileEntry{std::move(rel), static_cast<uint64_t>(st.st_size),
                                       MtimeNs(st), ModeBits(st), CtimeNs(st),
                                       static_cast<uint64_t>(st.st_ino)});
  }

  const ManifestBuildOptions& options_;
  const int root_fd_;
  const std::string root_real_;
  const GlobSet include_;
  const GlobSet exclude_;
  std::shared_ptr<spdlog::logger> log_;
  std::atomic<bool> warned_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;            // guarded by mu_
  size_t pending_ = 0;                       // queued + being read; guarded by mu_
  std::vector<FileEntry> entries_;           // guarded by mu_
  std::vector<DirectoryEntry> directories_;  // guarded by mu_
  WalkStats stats_;                          // guarded by mu_
  uint64_t files_ = 0;                       // guarded by mu_
};

}  // namespace

std::vector<std::string> PathComponents(std::string_view path) {
  std::vector<std::string> parts;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t end = path.find('/', pos);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(pos, end - pos);
    pos = end + 1;
    if (!part.empty() && part != ".") parts.emplace_back(part);
  }
  return parts;
}

int OpenDirectoryWithoutSymlinks(const std::string& path) {
  if (path.empty()) {
    errno = ENOENT;
    return -1;
  }
  ScopedFd at(::open(path[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!at.valid()) return -1;
  for (const std::string& part : PathComponents(path)) {
    int next = -1;
    for (int i = 0; i < 8; ++i) {  // EINTR, bounded
      next = ::openat(at.get(), part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (next >= 0 || errno != EINTR) break;
    }
    if (next < 0) {
      const int err = errno;
      at.Reset();
      errno = err;
      return -1;
    }
    at = ScopedFd(next);
  }
  return at.Release();
}

Status RefuseSymlinkInPath(const std::string& path) {
  if (path.empty() || path[0] != '/') return Status::Ok();
  std::string prefix;
  for (const std::string& part : PathComponents(path)) {
    prefix += "/" + part;
    struct stat st;
    if (::lstat(prefix.c_str(), &st) != 0) return Status::Ok();
    if (!S_ISLNK(st.st_mode)) continue;
    char text[PATH_MAX];
    const ssize_t n = ::readlink(prefix.c_str(), text, sizeof(text) - 1);
    const std::string points_to =
        n < 0 ? std::string("?") : std::string(text, static_cast<size_t>(n));
    char* real = ::realpath(path.c_str(), nullptr);
    const std::string resolved = real != nullptr ? real : "";
    std::free(real);
    std::string message = "source path '" + path + "' passes through the symbolic link '" + prefix +
                          "' -> '" + points_to + "'";
    if (resolved.empty()) {
      message += " (which does not resolve: dangling, a loop, or not searchable)";
    } else {
      message += " (the path resolves to '" + resolved + "')";
    }
    message +=
        "; a dataset's source must be a path without symbolic links, so that re-pointing a link "
        "cannot swap the tree a dataset stages and serves";
    if (!resolved.empty()) {
      message += "; if '" + resolved + "' is the tree you mean, give it as the source (--source " +
                 resolved + ")";
    }
    return Status::InvalidArgument(message);
  }
  return Status::Ok();
}

Result<Manifest> BuildManifest(const ManifestBuildOptions& options) {
  const std::string what = "snapshot of '" + options.source_root + "'";
  if (options.threads == 0 || options.threads > 256) {
    return Status::InvalidArgument(what + ": threads must be 1..256, got " +
                                   std::to_string(options.threads));
  }
  auto include = GlobSet::Compile(options.include);
  if (!include.ok()) return include.status().WithContext(what + ": include");
  auto exclude = GlobSet::Compile(options.exclude);
  if (!exclude.ok()) return exclude.status().WithContext(what + ": exclude");

  ScopedFd root_fd;
  std::string root_real;
  if (options.follow_root_symlinks) {
    char resolved[PATH_MAX];
    if (options.source_root.empty() ||
        ::realpath(options.source_root.c_str(), resolved) == nullptr) {
      return Status::FromErrno(options.source_root.empty() ? ENOENT : errno,
                               what + ": cannot resolve the source root")
          .WithContext("check that the path exists and is readable");
    }
    root_real = resolved;
    auto fd = OpenFile(root_real, O_RDONLY | O_DIRECTORY);
    if (!fd.ok()) {
      return fd.status().WithContext(what + ": the source root must be a readable directory");
    }
    root_fd = std::move(*fd);
  } else {
    GRANARY_ASSIGN_OR_RETURN(root_fd, OpenRootWithoutSymlinks(options.source_root, what));
    root_real = NormalizedPath(options.source_root);
  }

  Walker walker(options, root_fd.get(), root_real, std::move(*include), std::move(*exclude));
  walker.Run(options.threads);

  ManifestHeaderInfo header;
  header.source_uri = options.source_uri.empty() ? "file://" + root_real : options.source_uri;
  header.chunk_size = options.chunk_size;
  header.include = options.include;
  header.exclude = options.exclude;
  header.stats = walker.stats();
  auto manifest =
      Manifest::FromEntries(std::move(header), walker.TakeEntries(), walker.TakeDirectories());
  if (!manifest.ok()) return manifest.status().WithContext(what);
  return manifest;
}

}  // namespace granary
