// PosixSource (posix_source.h, docs/source-and-identity.md). Kept whole at
// about 680 lines: its one job is reading a dataset's files beneath a root,
// as the owner, without following a link out of it: the lexical checks, the
// openat2 open and its component-by-component fallback, the cache of
// directory descriptors, the checks that a file has not changed since the
// snapshot, and CheckReadable, which opens the same way for another reader.
// They share the root descriptor, the directory cache and the counters; the
// steps of one Read are listed in the header and follow each other here.

#include "granary/source/posix_source.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <limits>

#include "granary/core/log.h"
#include "granary/core/manifest_builder.h"
#include "granary/core/names.h"

namespace granary {
namespace {

constexpr size_t kMaxPathBytes = PATH_MAX - 1;  // 4095, as the manifest walk
constexpr int kMaxEintrRetries = 100;
// Flags of every file open: O_NONBLOCK so a FIFO swapped in for a file cannot
// block the open waiting for a writer (regular files ignore it).
constexpr int kFileOpenFlags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;

int64_t Ns(const struct timespec& t) {
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

int64_t Ns(const struct statx_timestamp& t) {
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + static_cast<int64_t>(t.tv_nsec);
}

// What identifies the version of an open file (FileEntry): its type, size,
// mtime, ctime and inode.
struct Version {
  mode_t mode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint64_t inode = 0;
};

Version VersionOf(const struct stat& st) {
  return {st.st_mode, static_cast<uint64_t>(st.st_size), Ns(st.st_mtim), Ns(st.st_ctim),
          static_cast<uint64_t>(st.st_ino)};
}

Version VersionOf(const struct statx& stx) {
  return {static_cast<mode_t>(stx.stx_mode), stx.stx_size, Ns(stx.stx_mtime), Ns(stx.stx_ctime),
          stx.stx_ino};
}

std::string_view FileType(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISLNK(mode)) return "a symlink";
  return "not a regular file";
}

long OpenAt2(int dir_fd, const char* path, int flags, uint64_t resolve) {
  struct open_how how {};
  how.flags = static_cast<__u64>(static_cast<unsigned int>(flags));
  how.resolve = resolve;
  long fd = -1;
  for (int i = 0; i < kMaxEintrRetries; ++i) {
    fd = ::syscall(SYS_openat2, dir_fd, path, &how, sizeof(how));
    if (fd >= 0 || errno != EINTR) break;
  }
  return fd;
}

int OpenAt(int dir_fd, const char* path, int flags) {
  int fd = -1;
  for (int i = 0; i < kMaxEintrRetries; ++i) {
    fd = ::openat(dir_fd, path, flags);
    if (fd >= 0 || errno != EINTR) break;
  }
  return fd;
}

// How an open file differs from the version the manifest recorded: type,
// size, mtime, and the ctime and inode when the manifest recorded them (not 0).
struct Change {
  // Short, for the front of the message: a cache node's reply keeps only the
  // first 192 bytes of an item's message (protocol_format.h).
  std::string summary;
  std::string details;  // the values, both sides
  bool none() const { return summary.empty(); }
};

Change Compare(const Version& v, const SourceFile& file) {
  Change c;
  if (!S_ISREG(v.mode)) {
    c.summary = "it is " + std::string(FileType(v.mode)) + " now";
    return c;
  }
  std::string moved;
  auto add = [&](std::string_view what, const std::string& values) {
    moved += moved.empty() ? "" : ", ";
    moved += what;
    c.details += c.details.empty() ? "" : "; ";
    c.details += values;
  };
  if (v.size != file.size) {
    add("size", "size " + std::to_string(v.size) + " bytes, snapshot " + std::to_string(file.size));
  }
  if (v.mtime_ns != file.mtime_ns) {
    add("mtime",
        "mtime " + std::to_string(v.mtime_ns) + " ns, snapshot " + std::to_string(file.mtime_ns));
  }
  // ctime cannot be set from user space: a rewrite whose writer restored the
  // size and mtime (touch -r, cp -p, rsync -t) still moves it. A new inode
  // is a file renamed over the recorded one (whose ctime differs too).
  if (file.inode != 0 && v.inode != file.inode) {
    add("inode", "inode " + std::to_string(v.inode) + ", snapshot " + std::to_string(file.inode));
  } else if (file.ctime_ns != 0 && v.ctime_ns != file.ctime_ns) {
    add("ctime",
        "ctime " + std::to_string(v.ctime_ns) + " ns, snapshot " + std::to_string(file.ctime_ns));
  }
  if (moved == "inode") {
    c.summary = "another file was renamed over it (new inode; size and mtime kept)";
  } else if (moved == "ctime") {
    c.summary = "its ctime moved, size and mtime kept (rewritten and touch -r'd, or chmod/chown)";
  } else if (!moved.empty()) {
    c.summary = "its " + moved + (moved.find(',') == std::string::npos ? " differs" : " differ");
  }
  return c;
}

// The attributes the open just fetched, without asking the file system again
// (AT_STATX_DONT_SYNC: NFS and FUSE answer from the inode). Local file
// systems answer as fstat does.
constexpr unsigned int kVersionMask =
    STATX_TYPE | STATX_SIZE | STATX_MTIME | STATX_CTIME | STATX_INO;
int StatCached(int fd, struct statx* stx) {
  return ::statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, kVersionMask, stx);
}

// The descriptor's version from what the file system knows (StatCached), or
// from fstat when that did not fill every field the version needs. An error
// names the call that failed ("statx", "fstat") after `what`.
Result<Version> DescriptorVersion(int fd, const std::string& what) {
  struct statx stx {};
  if (StatCached(fd, &stx) != 0) return Status::FromErrno(errno, what + ": statx");
  if ((stx.stx_mask & kVersionMask) == kVersionMask) return VersionOf(stx);
  // A file system that did not fill them all: ask it.
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, what + ": fstat");
  return VersionOf(st);
}

}  // namespace

Result<std::string> PosixSource::RootFromUri(std::string_view uri) {
  constexpr std::string_view kScheme = "file://";
  if (uri.substr(0, kScheme.size()) != kScheme) {
    return Status::InvalidArgument("source URI " + Quoted(uri) +
                                   ": the POSIX source reads only file:///absolute/path URIs");
  }
  std::string_view path = uri.substr(kScheme.size());
  if (path.empty() || path.front() != '/') {
    return Status::InvalidArgument("source URI " + Quoted(uri) +
                                   ": expected file:///absolute/path (three slashes: no host "
                                   "part, an absolute path)");
  }
  if (path.find('\0') != std::string_view::npos) {
    return Status::InvalidArgument("source URI " + Quoted(uri) + ": contains a NUL byte");
  }
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return std::string(path);
}

Result<std::unique_ptr<PosixSource>> PosixSource::Open(PosixSourceOptions options) {
  const std::string what = "open source root " + Quoted(options.root);
  if (options.executor == nullptr) {
    return Status::InvalidArgument(what + ": no IdentityExecutor given (a bug in the caller)");
  }
  if (options.root.empty() || options.root.find('\0') != std::string::npos) {
    return Status::InvalidArgument(what + ": the root must be a non-empty path without NUL bytes");
  }
  if (options.max_in_flight == 0 || options.max_in_flight > kMaxSourceInFlight) {
    return Status::InvalidArgument(what + ": max_in_flight must be 1.." +
                                   std::to_string(kMaxSourceInFlight) + ", got " +
                                   std::to_string(options.max_in_flight));
  }
  if (options.uri.empty()) options.uri = "file://" + options.root;

  ScopedFd root;
  bool use_openat2 = options.use_openat2;
  const std::string as = " as " + options.owner.ToString();
  bool ran = false;
  Status opened = options.executor->Run(options.owner, [&]() -> Status {
    ran = true;
    auto refused = [&](int err) -> Status {
      switch (err) {
        case ENOENT:
          return Status::NotFound(what + as + ": it does not exist; check the dataset's source");
        case EACCES:
        case EPERM:
          return Status::PermissionDenied(
              what + as + ": " + ErrnoText(err) +
              "; the dataset's owner needs search (x) permission on the root and every "
              "directory above it, as they would to read it themselves");
        case ENOTDIR:
          return Status::InvalidArgument(what +
                                         ": it is not a directory (or a path component "
                                         "is not); the source must be a directory");
        default:
          return Status::FromErrno(err, what + as);
      }
    };
    // O_PATH needs no rights on the root itself: the lookup of "." below
    // checks that the owner may search it. One component at a time with
    // O_NOFOLLOW: a source path through a symbolic link is refused, as the
    // snapshot refuses it, so a link re-pointed after the snapshot cannot
    // swap the tree read (docs/source-and-identity.md, "Source paths and
    // symbolic links").
    ScopedFd candidate(OpenDirectoryWithoutSymlinks(options.root));
    if (!candidate.valid()) {
      const int err = errno;
      if (err == ENOTDIR || err == ELOOP) {
        Status link = RefuseSymlinkInPath(options.root);
        if (!link.ok()) return link.WithContext(what + as);
      }
      return refused(err);
    }
    int dot = OpenAt(candidate.get(), ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dot < 0) return refused(errno);
    ::close(dot);
    root = std::move(candidate);
    if (use_openat2) {
      long probe = OpenAt2(root.get(), ".", O_PATH | O_DIRECTORY | O_CLOEXEC,
                           RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
      int err = errno;
      if (probe >= 0) {
        ::close(static_cast<int>(probe));
      } else if (err == ENOSYS || err == EPERM) {
        // ENOSYS: before Linux 5.6. EPERM: a seccomp filter (older container
        // runtimes) that does not know the call; "." itself was searchable.
        GetLogger("core")->warn(
            "{}: openat2 is not available ({}); opening files component by component "
            "without following symlinks instead",
            what, ErrnoText(err));
        use_openat2 = false;
      } else {
        return Status::FromErrno(err, what + as + ": openat2");
      }
    }
    return Status::Ok();
  });
  if (!ran) return opened.WithContext(what);  // the executor refused the owner
  GRANARY_RETURN_IF_ERROR(opened);
  return std::unique_ptr<PosixSource>(
      new PosixSource(std::move(options), std::move(root), use_openat2));
}

PosixSource::PosixSource(PosixSourceOptions options, ScopedFd root, bool use_openat2)
    : options_(std::move(options)),
      root_(std::move(root)),
      use_openat2_(use_openat2),
      limit_(options_.max_in_flight) {}

std::string PosixSource::Resnapshot() const {
  return "re-snapshot the dataset: `granary dataset snapshot " +
         (options_.dataset.empty() ? std::string("NAME") : options_.dataset) + "`";
}

std::string PosixSource::What(const SourceFile& file, uint64_t offset, size_t length) const {
  std::string s = "read " + Quoted(file.path);
  if (offset != 0 || length != file.size) {
    s += " (bytes " + std::to_string(offset) + ".." + std::to_string(offset + length) + " of " +
         std::to_string(file.size) + ")";
  }
  s += " from " + Quoted(options_.uri) + " as owner " + options_.owner.ToString();
  return s;
}

Status PosixSource::Fail(SourceErrorKind kind, Status status) {
  meter_.CountError(kind);
  if (!warned_[static_cast<size_t>(kind)].exchange(true, std::memory_order_relaxed)) {
    GetLogger("core")->warn("source error ({}; logged once per kind, counted always): {}",
                            SourceErrorKindName(kind), status.message());
  }
  return status;
}

Status PosixSource::CheckRequest(const SourceFile& file, uint64_t offset, size_t length) {
  const std::string& p = file.path;
  auto invalid = [&](std::string_view why) {
    return Fail(SourceErrorKind::kInvalidRequest,
                Status::InvalidArgument("read " + Quoted(p) + " from " + Quoted(options_.uri) +
                                        ": " + std::string(why) +
                                        "; sample paths come from the manifest, so the manifest "
                                        "or the request is corrupt"));
  };
  if (p.empty()) return invalid("the path is empty");
  if (p.size() > kMaxPathBytes) return invalid("the path is longer than 4095 bytes");
  if (p.find('\0') != std::string::npos) return invalid("the path contains a NUL byte");
  if (p.front() == '/') return invalid("the path is absolute; it must be relative to the root");
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    std::string_view part(p.data() + start, end - start);
    if (part.empty()) return invalid("the path has an empty component ('//' or a trailing '/')");
    if (part == "." || part == "..") return invalid("the path has a '.' or '..' component");
    start = end + 1;
  }
  if (file.size > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return invalid("the recorded size is larger than any file can be");
  }
  if (offset > file.size || length > file.size - offset) {
    return Fail(SourceErrorKind::kInvalidRequest,
                Status::OutOfRange(What(file, offset, 0) + ": the range " + std::to_string(offset) +
                                   "+" + std::to_string(length) +
                                   " goes past the end of the file (" + std::to_string(file.size) +
                                   " bytes in the snapshot); a bug in the caller"));
  }
  return Status::Ok();
}

Status PosixSource::Read(const SourceFile& file, uint64_t offset, std::span<char> out) {
  GRANARY_RETURN_IF_ERROR(CheckRequest(file, offset, out.size()));
  limit_.Acquire();
  InFlightLimit::Slot slot(&limit_);
  return ReadAsOwner(file, offset, out);
}

Status PosixSource::TryRead(const SourceFile& file, uint64_t offset, std::span<char> out) {
  GRANARY_RETURN_IF_ERROR(CheckRequest(file, offset, out.size()));
  if (!limit_.TryAcquire()) {
    meter_.CountBusy();
    return Status::ResourceExhausted(What(file, offset, out.size()) + ": " +
                                     std::to_string(limit_.limit()) +
                                     " source reads are in flight already; retry later, or call "
                                     "Read, which waits for a slot");
  }
  InFlightLimit::Slot slot(&limit_);
  return ReadAsOwner(file, offset, out);
}

Status PosixSource::ReadAsOwner(const SourceFile& file, uint64_t offset, std::span<char> out) {
  bool ran = false;
  Status status = options_.executor->Run(options_.owner, [&]() -> Status {
    ran = true;
    // Messages are built only on the error paths.
    auto what = [&] { return What(file, offset, out.size()); };
    auto hook = [&](SourceReadStage stage) {
      if (options_.stage_hook) options_.stage_hook(stage, file);
    };
    // What changed and what to do first; the read and the values after.
    auto changed = [&](const std::string& summary, const std::string& details) {
      return Fail(
          SourceErrorKind::kChanged,
          Status::FailedPrecondition(Quoted(file.path) + " changed since the snapshot: " + summary +
                                     "; " + Resnapshot() + "; none of its bytes are used (" +
                                     what() + (details.empty() ? "" : ": " + details) + ")"));
    };

    hook(SourceReadStage::kBeforeOpen);
    GRANARY_ASSIGN_OR_RETURN(ScopedFd fd, OpenBeneath(file));

    // The descriptor's attributes, not the path's: what is read below is
    // what was checked, whatever is renamed meanwhile.
    Result<Version> opened = DescriptorVersion(fd.get(), what());
    if (!opened.ok()) return Fail(SourceErrorKind::kIo, opened.status());
    if (Change c = Compare(*opened, file); !c.none()) return changed(c.summary, c.details);
    hook(SourceReadStage::kChecked);

    size_t done = 0;
    int interrupted = 0;
    while (done < out.size()) {
      ssize_t n = ::pread(fd.get(), out.data() + done, out.size() - done,
                          static_cast<off_t>(offset + done));
      if (n < 0) {
        int err = errno;
        if (err == EINTR && ++interrupted < kMaxEintrRetries) continue;
        return Fail(err == EACCES || err == EPERM ? SourceErrorKind::kPermissionDenied
                                                  : SourceErrorKind::kIo,
                    Status::FromErrno(err, what()));
      }
      meter_.CountRead(static_cast<uint64_t>(n));
      if (n == 0) {
        return changed("the file ended after " + std::to_string(offset + done) + " of " +
                           std::to_string(file.size) + " bytes during the read",
                       "");
      }
      done += static_cast<size_t>(n);
    }
    hook(SourceReadStage::kRead);

    // Again after the read, from what the file system knows without being
    // asked (AT_STATX_DONT_SYNC): on a local file system that is the inode as
    // it is now; an NFSv3 read reply carries the file's attributes, so the
    // client knows them too. Asking (fstat) would cost a metadata round trip
    // per file on a network file system, on top of the lookup and the open's
    // own: the source's most expensive operation, for every file of every
    // dataset. A FUSE or NFSv4 mount without an attribute cache
    // knows only what the open fetched, so there a writer racing the read
    // itself goes unseen; one that wrote before the open does not.
    Result<Version> after = DescriptorVersion(fd.get(), what() + " after the read");
    if (!after.ok()) return Fail(SourceErrorKind::kIo, after.status());
    if (Change c = Compare(*after, file); !c.none()) {
      return changed(c.summary + ", during the read", c.details);
    }
    return Status::Ok();
  });
  if (status.ok()) {
    meter_.CountCompleted();
    return status;
  }
  // The closure counted its own errors; if it never ran, the executor refused
  // the owner's identity.
  if (!ran) {
    return Fail(SourceErrorKind::kIdentity, status.WithContext(What(file, offset, out.size())));
  }
  return status;
}

Result<ScopedFd> PosixSource::OpenBeneath(const SourceFile& file) {
  meter_.CountOpen();
  int fd = -1;
  int err = 0;
  if (use_openat2_) {
    const size_t slash = file.path.rfind('/');
    if (slash == std::string::npos) {
      fd = static_cast<int>(OpenAt2(root_.get(), file.path.c_str(), kFileOpenFlags,
                                    RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS));
      err = errno;
    } else {
      const std::string dir_path = file.path.substr(0, slash);
      const char* name = file.path.c_str() + slash + 1;
      // Twice at most: a kept descriptor of a directory deleted (or replaced)
      // since is dropped and the directory opened afresh.
      for (int attempt = 0; attempt < 2 && fd < 0; ++attempt) {
        bool fresh = false;
        std::shared_ptr<const ScopedFd> dir = DirectoryBeneath(dir_path, &fresh, &err);
        if (dir == nullptr) break;
        long r = OpenAt2(dir->get(), name, kFileOpenFlags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
        err = errno;
        if (r < 0 && err == EXDEV) {
          // A symlink leaving its directory ("../other/f") may still stay
          // inside the root, as the snapshot allowed: judge it from the root.
          r = OpenAt2(root_.get(), file.path.c_str(), kFileOpenFlags,
                      RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
          err = errno;
        }
        fd = static_cast<int>(r);
        if (fd >= 0 || fresh || (err != ENOENT && err != ENOTDIR && err != ESTALE)) break;
        ForgetDirectory(dir_path, dir);
      }
    }
  } else {
    // Walk the directories without following any symlink, then open the file
    // the same way; each step is relative to a descriptor already checked.
    ScopedFd dir;
    int at = root_.get();
    size_t start = 0;
    for (;;) {
      size_t slash = file.path.find('/', start);
      if (slash == std::string::npos) break;
      std::string part = file.path.substr(start, slash - start);
      int next = OpenAt(at, part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (next < 0) {
        err = errno;
        struct stat st;
        if (err == ENOTDIR && ::fstatat(at, part.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISLNK(st.st_mode)) {
          err = ELOOP;  // a symlinked directory: refused like a symlinked file
        }
        break;
      }
      dir = ScopedFd(next);
      at = next;
      start = slash + 1;
    }
    if (err == 0) {
      fd = OpenAt(at, file.path.c_str() + start, kFileOpenFlags | O_NOFOLLOW);
      err = errno;
    }
  }
  if (fd >= 0) return ScopedFd(fd);
  const std::string what = What(file, 0, static_cast<size_t>(file.size));

  switch (err) {
    case ENOENT:
      return Fail(SourceErrorKind::kNotFound,
                  Status::NotFound(what +
                                   ": it no longer exists (deleted or renamed since the "
                                   "snapshot); " +
                                   Resnapshot()));
    case ENOTDIR:
      return Fail(SourceErrorKind::kNotFound,
                  Status::NotFound(what + ": a directory on its path is no longer a directory; "
                                          "re-snapshot the dataset"));
    case EACCES:
    case EPERM:
      return Fail(SourceErrorKind::kPermissionDenied,
                  Status::PermissionDenied(
                      what + ": " + ErrnoText(err) +
                      "; the dataset's owner may not read this file at the source: grant them "
                      "read access to it (and search access to its directories), or have a "
                      "user who can read it own the dataset"));
    case EXDEV:
      return Fail(SourceErrorKind::kUnsafePath,
                  Status::PermissionDenied(
                      what + ": it resolves outside the source root (a symlink or '..' leading "
                             "out of it, perhaps swapped in since the snapshot); refused. Remove "
                             "the link or re-snapshot the dataset"));
    case ELOOP:
      if (!use_openat2_) {
        return Fail(SourceErrorKind::kUnsafePath,
                    Status::PermissionDenied(
                        what + ": its path goes through a symlink, and without openat2 (Linux "
                               "5.6+) symlinks in a source are not followed; refused. Replace "
                               "the link by the file, or run on a newer kernel"));
      }
      return Fail(SourceErrorKind::kUnsafePath,
                  Status::PermissionDenied(what + ": too many levels of symlinks (a loop?); "
                                                  "refused. Fix the link at the source"));
    default:
      return Fail(SourceErrorKind::kIo, Status::FromErrno(err, what + ": open"));
  }
}

std::shared_ptr<const ScopedFd> PosixSource::DirectoryBeneath(const std::string& dir, bool* fresh,
                                                              int* err) {
  std::unique_lock<std::mutex> lock(dirs_mu_);
  for (;;) {
    if (auto it = dirs_.find(dir); it != dirs_.end()) return it->second;
    if (!opening_.contains(dir)) break;
    // Another reader is looking it up: one lookup on the source, not one
    // per reader that starts in the directory at once.
    dirs_cv_.wait(lock);
  }
  opening_.insert(dir);
  lock.unlock();
  *fresh = true;
  const long r = OpenAt2(root_.get(), dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC,
                         RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
  const int open_errno = errno;
  lock.lock();
  opening_.erase(dir);
  dirs_cv_.notify_all();
  if (r < 0) {
    *err = open_errno;  // the waiters try for themselves
    return nullptr;
  }
  auto opened = std::make_shared<const ScopedFd>(static_cast<int>(r));
  // Bounded: starting over costs one lookup per directory again; readers
  // holding an evicted descriptor keep it until they are done.
  if (dirs_.size() >= kMaxCachedDirectories) dirs_.clear();
  // Another reader may have opened it meanwhile: keep the first.
  return dirs_.emplace(dir, std::move(opened)).first->second;
}

void PosixSource::ForgetDirectory(const std::string& dir,
                                  const std::shared_ptr<const ScopedFd>& stale) {
  std::lock_guard<std::mutex> lock(dirs_mu_);
  if (auto it = dirs_.find(dir); it != dirs_.end() && it->second == stale) dirs_.erase(it);
}

namespace {

// Why `path` cannot be a manifest's relative path (CheckRequest's rules), or
// null when it can.
const char* BadRelativePath(const std::string& path) {
  if (path.empty() || path.size() > kMaxPathBytes) return "it is empty or longer than 4095 bytes";
  if (path.find('\0') != std::string::npos) return "it contains a NUL byte";
  if (path.front() == '/') return "it is absolute";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string_view part(path.data() + start, end - start);
    if (part.empty() || part == "." || part == "..") {
      return "it has an empty, '.' or '..' component";
    }
    start = end + 1;
  }
  return nullptr;
}

// Opens `path` beneath `root` one component at a time, following no symlink
// (the walk of kernels without openat2); -1 with `*err` set on failure.
int OpenWalkingNoFollow(int root, const std::string& path, int* err) {
  ScopedFd dir;
  int at = root;
  size_t start = 0;
  for (size_t slash; (slash = path.find('/', start)) != std::string::npos; start = slash + 1) {
    const std::string part = path.substr(start, slash - start);
    const int next = OpenAt(at, part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) {
      *err = errno;
      return -1;
    }
    dir = ScopedFd(next);
    at = next;
  }
  const int fd = OpenAt(at, path.c_str() + start, kFileOpenFlags | O_NOFOLLOW);
  *err = errno;
  return fd;
}

}  // namespace

Status PosixSource::CheckReadable(const Identity& reader, std::span<const SourceFile> files) {
  const std::string who = reader.ToString();
  bool ran = false;
  Status status = options_.executor->Run(reader, [&]() -> Status {
    ran = true;
    auto refused = [&](const std::string& what, int err) -> Status {
      switch (err) {
        case EACCES:
        case EPERM:
          return Status::PermissionDenied(who + " may not read " + what + " at the source (" +
                                          ErrnoText(err) + ")");
        case ENOENT:
        case ENOTDIR:
          return Status::NotFound(what +
                                  " no longer exists (deleted or renamed since the "
                                  "snapshot); " +
                                  Resnapshot());
        case EXDEV:
        case ELOOP:
          return Status::PermissionDenied(what +
                                          " resolves outside the source root, or through a "
                                          "symlink this host does not follow; refused");
        default:
          return Status::FromErrno(err, "open " + what + " as " + who);
      }
    };
    // By its path, as `reader`: search rights on every directory above it.
    const int at = OpenAt(AT_FDCWD, options_.root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (at < 0) return refused("the source root " + Quoted(options_.root), errno);
    ScopedFd root(at);
    const int dot = OpenAt(root.get(), ".", O_PATH | O_DIRECTORY | O_CLOEXEC);  // search right
    if (dot < 0) return refused("the source root " + Quoted(options_.root), errno);
    ::close(dot);
    struct stat mine;
    struct stat held;
    if (::fstat(root.get(), &mine) != 0 || ::fstat(root_.get(), &held) != 0) {
      return Status::FromErrno(errno, "fstat the source root " + Quoted(options_.root));
    }
    if (mine.st_dev != held.st_dev || mine.st_ino != held.st_ino) {
      return Status::FailedPrecondition("the source root " + Quoted(options_.root) +
                                        " now names another directory than the one staged "
                                        "from; refused");
    }
    for (const SourceFile& file : files) {
      const std::string what = Quoted(file.path) + " in " + Quoted(options_.uri);
      if (const char* bad = BadRelativePath(file.path)) {
        return Status::InvalidArgument(what + ": " + bad + "; the manifest is corrupt");
      }
      int err = 0;
      int fd = -1;
      if (use_openat2_) {
        fd = static_cast<int>(OpenAt2(root.get(), file.path.c_str(), kFileOpenFlags,
                                      RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS));
        err = errno;
      } else {
        fd = OpenWalkingNoFollow(root.get(), file.path, &err);
      }
      if (fd < 0) return refused(what, err);
      ScopedFd opened(fd);
      struct stat st;
      if (::fstat(opened.get(), &st) != 0) return Status::FromErrno(errno, "fstat " + what);
      if (Change c = Compare(VersionOf(st), file); !c.none()) {
        return Status::FailedPrecondition(
            Quoted(file.path) + " changed since the snapshot: " + c.summary + "; whether " + who +
            " may read the staged version cannot be told; " + Resnapshot());
      }
    }
    return Status::Ok();
  });
  if (!ran) return status.WithContext("check what " + who + " may read in " + Quoted(options_.uri));
  return status;
}

SourceCounters PosixSource::Counters() const {
  SourceCounters c;
  meter_.Fill(&c);
  limit_.Fill(&c);
  return c;
}

}  // namespace granary
