#include "slow_fs.h"

#define FUSE_USE_VERSION 312
#include <dirent.h>
#include <fcntl.h>
#include <fuse3/fuse.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "granary/core/names.h"

namespace granary {

std::string SlowFsCountsJson(const SlowFsCounts& c, const SlowFsProfile& profile) {
  nlohmann::ordered_json j;
  j["opens"] = c.opens;
  j["stats"] = c.stats;
  j["readdirs"] = c.readdirs;
  j["reads"] = c.reads;
  j["read_bytes"] = c.read_bytes;
  j["readlinks"] = c.readlinks;
  j["statfs"] = c.statfs;
  j["refused_writes"] = c.refused_writes;
  j["errors"] = c.errors;
  j["waits"] = c.waits;
  j["peak_in_flight"] = c.peak_in_flight;
  j["profile"] = profile.name;
  j["latency_ms"] = profile.latency_ms;
  j["bandwidth_mb_s"] = profile.bandwidth_mb_s;
  j["max_concurrency"] = profile.max_concurrency;
  return j.dump() + "\n";
}

namespace {

// A mount-relative FUSE path ("/a/b", "/") as a path relative to the source's
// descriptor ("a/b", ".").
const char* Relative(const char* path) {
  while (*path == '/') ++path;
  return *path == '\0' ? "." : path;
}

bool IsStatsFile(const char* path) {
  return path[0] == '/' && std::strcmp(path + 1, kSlowFsStatsName) == 0;
}

// What a FUSE file handle points at: a source file, or the counters as they
// were when .slowfs-stats was opened.
struct OpenHandle {
  int fd = -1;
  std::string stats;
};

struct DirHandle {
  DIR* dir = nullptr;
  bool root = false;
};

SlowFs* Self() { return static_cast<SlowFs*>(fuse_get_context()->private_data); }

template <typename T>
T* FromHandle(uint64_t handle) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(handle));
}
template <typename T>
uint64_t ToHandle(T* p) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
}

}  // namespace

class SlowFs::Slot {
 public:
  explicit Slot(SlowFs& fs) : fs_(fs) {
    if (fs_.gate_.Enter()) fs_.waits_.fetch_add(1, std::memory_order_relaxed);
    fs_.PayLatency();
  }
  ~Slot() { fs_.gate_.Leave(); }
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;

 private:
  SlowFs& fs_;
};

SlowFs::SlowFs(SlowFsOptions options, ScopedFd root)
    : options_(std::move(options)),
      root_(std::move(root)),
      // Burst: 5 ms of bandwidth, at least 256 KiB, so one read of a typical
      // sample passes an idle bucket without waiting.
      bucket_(options_.profile.bandwidth_mb_s * 1e6,
              std::max(256.0 * 1024, options_.profile.bandwidth_mb_s * 1e6 * 0.005)),
      gate_(options_.profile.max_concurrency) {}

Result<std::unique_ptr<SlowFs>> SlowFs::Open(const SlowFsOptions& options) {
  const int fd = ::open(options.source.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return Status::FromErrno(errno, "opening the source directory " + Quoted(options.source));
  }
  return std::unique_ptr<SlowFs>(new SlowFs(options, ScopedFd(fd)));
}

SlowFsCounts SlowFs::counts() const {
  SlowFsCounts c;
  c.opens = opens_.load();
  c.stats = stats_.load();
  c.readdirs = readdirs_.load();
  c.reads = reads_.load();
  c.read_bytes = read_bytes_.load();
  c.readlinks = readlinks_.load();
  c.statfs = statfs_.load();
  c.refused_writes = refused_writes_.load();
  c.errors = errors_.load();
  c.waits = waits_.load();
  c.peak_in_flight = gate_.peak_in_flight();
  return c;
}

void SlowFs::PayLatency() const {
  if (options_.profile.latency_ms > 0) {
    std::this_thread::sleep_for(
        std::chrono::duration<double, std::milli>(options_.profile.latency_ms));
  }
}

int SlowFs::Failed(int err) {
  errors_.fetch_add(1, std::memory_order_relaxed);
  return -err;
}

int SlowFs::RefuseWrite() {
  refused_writes_.fetch_add(1, std::memory_order_relaxed);
  return -EROFS;
}

int SlowFs::GetAttr(const char* path, struct stat* st, int fd) {
  if (IsStatsFile(path)) {
    std::memset(st, 0, sizeof(*st));
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
    st->st_uid = getuid();
    st->st_gid = getgid();
    st->st_size = static_cast<off_t>(SlowFsCountsJson(counts(), options_.profile).size());
    return 0;
  }
  if (fd < 0 && std::strcmp(Relative(path), ".") == 0) {
    // The root's attributes are free and not counted: the kernel asks for
    // them at every path walk through the mount (reading .slowfs-stats
    // included), where a real client would have them cached.
    return ::fstat(root_.get(), st) == 0 ? 0 : Failed(errno);
  }
  stats_.fetch_add(1, std::memory_order_relaxed);
  Slot slot(*this);
  const int rc =
      fd >= 0 ? ::fstat(fd, st) : ::fstatat(root_.get(), Relative(path), st, AT_SYMLINK_NOFOLLOW);
  return rc == 0 ? 0 : Failed(errno);
}

int SlowFs::ReadLink(const char* path, char* buf, size_t size) {
  if (size == 0) return -EINVAL;
  readlinks_.fetch_add(1, std::memory_order_relaxed);
  Slot slot(*this);
  const ssize_t n = ::readlinkat(root_.get(), Relative(path), buf, size - 1);
  if (n < 0) return Failed(errno);
  buf[n] = '\0';
  return 0;
}

int SlowFs::OpenDir(const char* path, uint64_t* handle) {
  // Opening a directory is free (NFS has no OPEN for directories); listing it
  // is what costs (ReadDir).
  const int fd = ::openat(root_.get(), Relative(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Failed(errno);
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(fd);
    return Failed(err);
  }
  *handle = ToHandle(new DirHandle{dir, std::strcmp(Relative(path), ".") == 0});
  return 0;
}

int SlowFs::ReadDir(const char* /*path*/, void* buf, void* filler, int64_t offset,
                    uint64_t handle) {
  DirHandle* h = FromHandle<DirHandle>(handle);
  auto fill = reinterpret_cast<fuse_fill_dir_t>(filler);
  readdirs_.fetch_add(1, std::memory_order_relaxed);
  Slot slot(*this);
  // Entries are passed with offset 0: libfuse takes the whole listing in one
  // call and pages it to the kernel itself, so one listing is one ReadDir.
  if (offset == 0) ::rewinddir(h->dir);
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(h->dir);
    if (e == nullptr) {
      if (errno != 0) return Failed(errno);
      break;
    }
    if (h->root && std::strcmp(e->d_name, kSlowFsStatsName) == 0) continue;
    struct stat st {};
    st.st_ino = e->d_ino;
    st.st_mode = static_cast<mode_t>(DTTOIF(e->d_type));
    if (fill(buf, e->d_name, &st, 0, static_cast<fuse_fill_dir_flags>(0)) != 0) break;
  }
  return 0;
}

int SlowFs::ReleaseDir(uint64_t handle) {
  DirHandle* h = FromHandle<DirHandle>(handle);
  ::closedir(h->dir);
  delete h;
  return 0;
}

int SlowFs::OpenFile(const char* path, int flags, uint64_t* handle, bool* direct_io) {
  if ((flags & O_ACCMODE) != O_RDONLY || (flags & (O_TRUNC | O_CREAT | O_APPEND)) != 0) {
    return RefuseWrite();
  }
  *direct_io = true;
  if (IsStatsFile(path)) {
    *handle = ToHandle(new OpenHandle{-1, SlowFsCountsJson(counts(), options_.profile)});
    return 0;
  }
  opens_.fetch_add(1, std::memory_order_relaxed);
  Slot slot(*this);
  const int fd = ::openat(root_.get(), Relative(path), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Failed(errno);
  *handle = ToHandle(new OpenHandle{fd, {}});
  return 0;
}

int SlowFs::Read(uint64_t handle, char* buf, size_t size, int64_t offset) {
  OpenHandle* h = FromHandle<OpenHandle>(handle);
  if (offset < 0) return -EINVAL;
  if (h->fd < 0) {
    const size_t off = static_cast<size_t>(offset);
    if (off >= h->stats.size()) return 0;
    const size_t n = std::min(size, h->stats.size() - off);
    std::memcpy(buf, h->stats.data() + off, n);
    return static_cast<int>(n);
  }
  reads_.fetch_add(1, std::memory_order_relaxed);
  Slot slot(*this);
  const ssize_t n = ::pread(h->fd, buf, size, static_cast<off_t>(offset));
  if (n < 0) return Failed(errno);
  read_bytes_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
  bucket_.Acquire(static_cast<uint64_t>(n));
  return static_cast<int>(n);
}

int SlowFs::Release(uint64_t handle) {
  OpenHandle* h = FromHandle<OpenHandle>(handle);
  if (h->fd >= 0) ::close(h->fd);
  delete h;
  return 0;
}

int SlowFs::StatFs(struct statvfs* st) {
  statfs_.fetch_add(1, std::memory_order_relaxed);
  Slot slot(*this);
  return ::fstatvfs(root_.get(), st) == 0 ? 0 : Failed(errno);
}

int SlowFs::Access(const char* path, int mask) {
  if ((mask & W_OK) != 0) return RefuseWrite();
  if (IsStatsFile(path)) return (mask & X_OK) != 0 ? -EACCES : 0;
  stats_.fetch_add(1, std::memory_order_relaxed);
  Slot slot(*this);
  return ::faccessat(root_.get(), Relative(path), mask, AT_SYMLINK_NOFOLLOW) == 0 ? 0
                                                                                  : Failed(errno);
}

namespace {

// The C callbacks: each hands over to the SlowFs in the FUSE context.
void* FsInit(fuse_conn_info* conn, fuse_config* cfg) {
  // Nothing cached by the kernel: every lookup, stat and read reaches us.
  cfg->entry_timeout = 0;
  cfg->attr_timeout = 0;
  cfg->negative_timeout = 0;
  cfg->direct_io = 1;
  cfg->kernel_cache = 0;
  cfg->auto_cache = 0;
  cfg->use_ino = 1;
  // Plain READDIR: a listing carries no attributes, so each file a reader
  // stats is a getattr of its own (counted), as on a source without
  // READDIRPLUS.
  conn->want &= ~static_cast<unsigned>(FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO);
  return fuse_get_context()->private_data;
}

int FsGetAttr(const char* path, struct stat* st, fuse_file_info* fi) {
  int fd = -1;
  if (fi != nullptr && !IsStatsFile(path)) fd = FromHandle<OpenHandle>(fi->fh)->fd;
  return Self()->GetAttr(path, st, fd);
}
int FsReadLink(const char* path, char* buf, size_t size) {
  return Self()->ReadLink(path, buf, size);
}
int FsOpenDir(const char* path, fuse_file_info* fi) { return Self()->OpenDir(path, &fi->fh); }
int FsReadDir(const char* path, void* buf, fuse_fill_dir_t filler, off_t offset, fuse_file_info* fi,
              fuse_readdir_flags /*flags*/) {
  return Self()->ReadDir(path, buf, reinterpret_cast<void*>(filler), offset, fi->fh);
}
int FsReleaseDir(const char* /*path*/, fuse_file_info* fi) { return Self()->ReleaseDir(fi->fh); }
int FsOpen(const char* path, fuse_file_info* fi) {
  bool direct_io = false;
  const int rc = Self()->OpenFile(path, fi->flags, &fi->fh, &direct_io);
  fi->direct_io = direct_io ? 1 : 0;
  fi->keep_cache = 0;
  return rc;
}
int FsRead(const char* /*path*/, char* buf, size_t size, off_t offset, fuse_file_info* fi) {
  return Self()->Read(fi->fh, buf, size, offset);
}
int FsRelease(const char* /*path*/, fuse_file_info* fi) { return Self()->Release(fi->fh); }
int FsStatFs(const char* /*path*/, struct statvfs* st) { return Self()->StatFs(st); }
int FsAccess(const char* path, int mask) { return Self()->Access(path, mask); }

// Everything that would change the tree: EROFS (the mount is also "ro", so
// the kernel refuses most of these before they get here).
int FsMknod(const char*, mode_t, dev_t) { return Self()->RefuseWrite(); }
int FsMkdir(const char*, mode_t) { return Self()->RefuseWrite(); }
int FsUnlink(const char*) { return Self()->RefuseWrite(); }
int FsRmdir(const char*) { return Self()->RefuseWrite(); }
int FsSymlink(const char*, const char*) { return Self()->RefuseWrite(); }
int FsRename(const char*, const char*, unsigned int) { return Self()->RefuseWrite(); }
int FsLink(const char*, const char*) { return Self()->RefuseWrite(); }
int FsChmod(const char*, mode_t, fuse_file_info*) { return Self()->RefuseWrite(); }
int FsChown(const char*, uid_t, gid_t, fuse_file_info*) { return Self()->RefuseWrite(); }
int FsTruncate(const char*, off_t, fuse_file_info*) { return Self()->RefuseWrite(); }
int FsWrite(const char*, const char*, size_t, off_t, fuse_file_info*) {
  return Self()->RefuseWrite();
}
int FsCreate(const char*, mode_t, fuse_file_info*) { return Self()->RefuseWrite(); }
int FsUtimens(const char*, const timespec*, fuse_file_info*) { return Self()->RefuseWrite(); }
int FsSetXattr(const char*, const char*, const char*, size_t, int) { return Self()->RefuseWrite(); }
int FsRemoveXattr(const char*, const char*) { return Self()->RefuseWrite(); }
int FsFallocate(const char*, int, off_t, off_t, fuse_file_info*) { return Self()->RefuseWrite(); }

fuse_operations Operations() {
  fuse_operations ops{};
  ops.init = FsInit;
  ops.getattr = FsGetAttr;
  ops.readlink = FsReadLink;
  ops.opendir = FsOpenDir;
  ops.readdir = FsReadDir;
  ops.releasedir = FsReleaseDir;
  ops.open = FsOpen;
  ops.read = FsRead;
  ops.release = FsRelease;
  ops.statfs = FsStatFs;
  ops.access = FsAccess;
  ops.mknod = FsMknod;
  ops.mkdir = FsMkdir;
  ops.unlink = FsUnlink;
  ops.rmdir = FsRmdir;
  ops.symlink = FsSymlink;
  ops.rename = FsRename;
  ops.link = FsLink;
  ops.chmod = FsChmod;
  ops.chown = FsChown;
  ops.truncate = FsTruncate;
  ops.write = FsWrite;
  ops.create = FsCreate;
  ops.utimens = FsUtimens;
  ops.setxattr = FsSetXattr;
  ops.removexattr = FsRemoveXattr;
  ops.fallocate = FsFallocate;
  return ops;
}

// Frees the FUSE objects in the right order however Serve leaves.
struct FuseArgsGuard {
  fuse_args args = FUSE_ARGS_INIT(0, nullptr);
  ~FuseArgsGuard() { fuse_opt_free_args(&args); }
};
struct FuseGuard {
  fuse* f = nullptr;
  bool mounted = false;
  bool signals = false;
  fuse_loop_config* loop = nullptr;
  ~FuseGuard() {
    if (loop != nullptr) fuse_loop_cfg_destroy(loop);
    if (signals) fuse_remove_signal_handlers(fuse_get_session(f));
    if (mounted) fuse_unmount(f);
    if (f != nullptr) fuse_destroy(f);
  }
};

}  // namespace

Status SlowFs::Serve() {
  FuseArgsGuard args;
  std::string mount_options = "ro,default_permissions,fsname=granary-slowfs,subtype=granary-slowfs";
  // Root mounts it so that the cache node's identity switch (it reads a
  // dataset as its owner) may read it; default_permissions makes the kernel
  // check the source's modes for every user.
  if (geteuid() == 0) mount_options += ",allow_other";
  for (const char* arg : {"granary-slowfs", "-o", mount_options.c_str()}) {
    if (fuse_opt_add_arg(&args.args, arg) != 0) {
      return Status::ResourceExhausted("building the FUSE arguments: out of memory");
    }
  }
  if (options_.debug && fuse_opt_add_arg(&args.args, "-d") != 0) {
    return Status::ResourceExhausted("building the FUSE arguments: out of memory");
  }
  const fuse_operations ops = Operations();
  FuseGuard guard;
  guard.f = fuse_new(&args.args, &ops, sizeof(ops), this);
  if (guard.f == nullptr) {
    return Status::InvalidArgument("libfuse refused the mount options " + Quoted(mount_options) +
                                   " (its message is above)");
  }
  if (fuse_mount(guard.f, options_.mountpoint.c_str()) != 0) {
    return Status::IoError("mounting " + Quoted(options_.mountpoint) +
                           " failed (libfuse's message is above); check that /dev/fuse exists, "
                           "that fusermount3 is installed (apt-get install fuse3) or you are "
                           "root, and that nothing else is mounted there");
  }
  guard.mounted = true;
  if (fuse_set_signal_handlers(fuse_get_session(guard.f)) != 0) {
    return Status::Internal("installing the SIGTERM/SIGINT/SIGHUP handlers failed");
  }
  guard.signals = true;
  guard.loop = fuse_loop_cfg_create();
  if (guard.loop == nullptr) return Status::ResourceExhausted("fuse_loop_cfg_create failed");
  // Enough workers that every concurrency slot can be busy while more
  // requests wait at the gate (where they are counted as waits).
  const uint32_t limit = options_.profile.max_concurrency;
  const unsigned threads = limit == 0 ? 64u : std::min(2048u, limit + 16u);
  fuse_loop_cfg_set_max_threads(guard.loop, threads);
  fuse_loop_cfg_set_idle_threads(guard.loop, threads);
  std::printf(
      "granary-slowfs: serving %s at %s (profile %s: %g ms per operation, %g MB/s, %u "
      "in flight; 0 = unlimited)\n",
      options_.source.c_str(), options_.mountpoint.c_str(), options_.profile.name.c_str(),
      options_.profile.latency_ms, options_.profile.bandwidth_mb_s,
      options_.profile.max_concurrency);
  std::fflush(stdout);
  const int rc = fuse_loop_mt(guard.f, guard.loop);
  if (rc < 0) {  // 0: unmounted from outside; > 0: the stop signal
    return Status::FromErrno(-rc, "serving " + Quoted(options_.mountpoint));
  }
  return Status::Ok();
}

}  // namespace granary
