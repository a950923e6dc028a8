#define FUSE_USE_VERSION 34
#include "granary/posix/posix_view.h"

#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "granary/core/log.h"
#include "granary/core/names.h"

namespace granary::posix {
namespace {

// A file opened through the view: its sample, pinned between its first read
// and the read that reaches its end (or close).
struct OpenFile {
  SampleId id = 0;
  uint64_t size = 0;
  std::mutex mu;  // guards pin
  std::shared_ptr<PinnedSample> pin;
};

constexpr uint32_t kBlockSize = 4096;
// A pin kept between the reads of a file is dropped after this long unused.
constexpr std::chrono::milliseconds kPinIdle{1000};

PosixView* ViewOf(fuse_req_t req) { return static_cast<PosixView*>(fuse_req_userdata(req)); }

timespec ToTimespec(int64_t ns) {
  timespec t{};
  int64_t sec = ns / 1'000'000'000;
  int64_t rem = ns % 1'000'000'000;
  if (rem < 0) {
    rem += 1'000'000'000;
    --sec;
  }
  t.tv_sec = static_cast<time_t>(sec);
  t.tv_nsec = static_cast<long>(rem);
  return t;
}

OpenFile* FileOf(const fuse_file_info* fi) {
  return reinterpret_cast<OpenFile*>(static_cast<uintptr_t>(fi->fh));
}

}  // namespace

std::string_view FuseOpName(FuseOp op) {
  switch (op) {
    case FuseOp::kLookup:
      return "lookup";
    case FuseOp::kForget:
      return "forget";
    case FuseOp::kGetattr:
      return "getattr";
    case FuseOp::kOpendir:
      return "opendir";
    case FuseOp::kReaddir:
      return "readdir";
    case FuseOp::kReaddirplus:
      return "readdirplus";
    case FuseOp::kReleasedir:
      return "releasedir";
    case FuseOp::kOpen:
      return "open";
    case FuseOp::kRead:
      return "read";
    case FuseOp::kRelease:
      return "release";
    case FuseOp::kFlush:
      return "flush";
    case FuseOp::kIoctl:
      return "ioctl";
    case FuseOp::kStatfs:
      return "statfs";
    case FuseOp::kGetxattr:
      return "getxattr";
    case FuseOp::kListxattr:
      return "listxattr";
    case FuseOp::kAccess:
      return "access";
    case FuseOp::kWrite:
      return "write";
    case FuseOp::kCount:
      break;
  }
  return "unknown";
}

// The FUSE low-level callbacks, with access to the view's members.
struct PosixView::Callbacks {
  static void FillAttr(const PosixView& v, Inode ino, struct stat* st) {
    std::memset(st, 0, sizeof(*st));
    const MountTree& t = v.tree_;
    st->st_ino = static_cast<ino_t>(ino);
    st->st_uid = v.options_.uid;
    st->st_gid = v.options_.gid;
    const timespec mtime = ToTimespec(t.MtimeNs(ino));
    st->st_mtim = mtime;
    st->st_ctim = mtime;
    st->st_atim = mtime;
    st->st_blksize = kBlockSize;
    if (t.IsDirectory(ino)) {
      st->st_mode = t.Mode(ino);
      st->st_nlink = 2 + t.SubdirectoryCount(ino);
      st->st_size = static_cast<off_t>(kBlockSize);
    } else {
      st->st_mode = t.Mode(ino);
      st->st_nlink = 1;
      const uint64_t size = t.Size(ino);
      st->st_size = static_cast<off_t>(size);
      st->st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
    }
  }

  static fuse_entry_param Entry(const PosixView& v, Inode ino) {
    fuse_entry_param e;
    std::memset(&e, 0, sizeof(e));
    e.ino = ino;
    e.generation = 1;
    const auto timeout = static_cast<double>(v.options_.entry_timeout.count());
    e.attr_timeout = timeout;
    e.entry_timeout = timeout;
    if (ino != kNoInode) FillAttr(v, ino, &e.attr);
    return e;
  }

  static void Init(void* userdata, fuse_conn_info* conn) {
    auto* v = static_cast<PosixView*>(userdata);
    // Readdirplus saves a lookup per entry of a walk; the kernel keeps
    // listings (cache_readdir) and pages (keep_cache) since nothing changes.
    if ((conn->capable & FUSE_CAP_READDIRPLUS) != 0) conn->want |= FUSE_CAP_READDIRPLUS;
    conn->want &= ~static_cast<unsigned>(FUSE_CAP_READDIRPLUS_AUTO);
    // Nothing is ever invalidated: attributes never change.
    conn->want &= ~static_cast<unsigned>(FUSE_CAP_AUTO_INVAL_DATA);
    conn->time_gran = 1;
    // No OPEN/RELEASE (nor OPENDIR/RELEASEDIR) round trip per file: the
    // kernel then opens with keep_cache (and cache_dir) by itself, so a warm
    // open is as cheap as a local one. Reads carry no file handle then.
    if ((conn->capable & FUSE_CAP_NO_OPEN_SUPPORT) != 0) conn->want |= FUSE_CAP_NO_OPEN_SUPPORT;
    if ((conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT) != 0) {
      conn->want |= FUSE_CAP_NO_OPENDIR_SUPPORT;
    }
    v->no_open_ = (conn->want & FUSE_CAP_NO_OPEN_SUPPORT) != 0;
    v->no_opendir_ = (conn->want & FUSE_CAP_NO_OPENDIR_SUPPORT) != 0;
    {
      std::lock_guard<std::mutex> lock(v->state_mu_);
      v->initialized_ = true;
    }
    v->state_cv_.notify_all();
  }

  static void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
    PosixView& v = *ViewOf(req);
    v.Count(FuseOp::kLookup);
    if (!v.tree_.Valid(parent)) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    if (!v.tree_.IsDirectory(parent)) {
      fuse_reply_err(req, ENOTDIR);
      return;
    }
    // A negative entry (ino 0) is cached by the kernel for entry_timeout too.
    const fuse_entry_param e = Entry(v, v.tree_.Lookup(parent, name));
    fuse_reply_entry(req, &e);
  }

  static void GetAttr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* /*fi*/) {
    PosixView& v = *ViewOf(req);
    v.Count(FuseOp::kGetattr);
    if (!v.tree_.Valid(ino)) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    struct stat st;
    FillAttr(v, ino, &st);
    fuse_reply_attr(req, &st, static_cast<double>(v.options_.entry_timeout.count()));
  }

  static void OpenDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    PosixView& v = *ViewOf(req);
    v.Count(FuseOp::kOpendir);
    if (!v.tree_.Valid(ino)) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    if (!v.tree_.IsDirectory(ino)) {
      fuse_reply_err(req, ENOTDIR);
      return;
    }
    if (v.no_opendir_) {
      fuse_reply_err(req, ENOSYS);  // never asked again
      return;
    }
    fi->cache_readdir = 1;
    fi->keep_cache = 1;
    fuse_reply_open(req, fi);
  }

  // Entry k of a listing: ".", "..", then the children.
  static void ReadDir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
    PosixView& v = *ViewOf(req);
    if (!v.tree_.Valid(ino) || !v.tree_.IsDirectory(ino)) {
      fuse_reply_err(req, ENOTDIR);
      return;
    }
    const std::span<const uint32_t> children = v.tree_.Children(ino);
    const uint64_t total = children.size() + 2;
    size = std::min<size_t>(size, 1u << 20);
    std::vector<char> buf(size);
    size_t used = 0;
    for (uint64_t k = off < 0 ? 0 : static_cast<uint64_t>(off); k < total; ++k) {
      Inode child;
      std::string name;
      if (k == 0) {
        child = ino;
        name = ".";
      } else if (k == 1) {
        child = v.tree_.Parent(ino);
        name = "..";
      } else {
        child = children[k - 2];
        name = std::string(v.tree_.NameOf(child));
      }
      size_t need;
      const auto next = static_cast<off_t>(k + 1);
      if (plus) {
        fuse_entry_param e = Entry(v, child);
        // "." and ".." do not count as lookups: the kernel ignores their attrs.
        need = fuse_add_direntry_plus(req, buf.data() + used, size - used, name.c_str(), &e, next);
      } else {
        struct stat st;
        std::memset(&st, 0, sizeof(st));
        st.st_ino = static_cast<ino_t>(child);
        st.st_mode = v.tree_.IsDirectory(child) ? S_IFDIR : S_IFREG;
        need = fuse_add_direntry(req, buf.data() + used, size - used, name.c_str(), &st, next);
      }
      if (need > size - used) break;
      used += need;
    }
    fuse_reply_buf(req, buf.data(), used);
  }

  static void ReadDirPlain(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                           fuse_file_info* /*fi*/) {
    ViewOf(req)->Count(FuseOp::kReaddir);
    ReadDir(req, ino, size, off, false);
  }
  static void ReadDirPlus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                          fuse_file_info* /*fi*/) {
    ViewOf(req)->Count(FuseOp::kReaddirplus);
    ReadDir(req, ino, size, off, true);
  }

  static void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    PosixView& v = *ViewOf(req);
    v.Count(FuseOp::kOpen);
    if (!v.tree_.Valid(ino)) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    if (v.tree_.IsDirectory(ino)) {
      fuse_reply_err(req, EISDIR);
      return;
    }
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC) != 0) {
      v.counters_.refused_writes.fetch_add(1, std::memory_order_relaxed);
      fuse_reply_err(req, EROFS);
      return;
    }
    if (v.no_open_) {
      fuse_reply_err(req, ENOSYS);  // success, and no OPEN again (keep_cache implied)
      return;
    }
    auto file = std::make_unique<OpenFile>();
    file->id = v.tree_.SampleOf(ino);
    file->size = v.tree_.Size(ino);
    fi->fh = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(file.get()));
    fi->keep_cache = 1;
    fi->noflush = 1;
    const SampleId id = file->id;
    if (fuse_reply_open(req, fi) == 0) {
      file.release();  // owned by the kernel's file until Release
    }
    v.OnFirstRead(id, /*pin=*/false);  // reads of an open file keep their own pin
  }

  // One sample pinned through the reader, or an errno (logged).
  static std::shared_ptr<PinnedSample> AcquireFor(PosixView& v, SampleId id, uint64_t size,
                                                  int* error) {
    Result<std::unique_ptr<PinnedSample>> acquired = v.reader_->Acquire(id);
    if (!acquired.ok()) {
      const uint64_t errors = v.counters_.read_errors.fetch_add(1) + 1;
      if (errors <= 20 || errors % 1000 == 0) {
        GetLogger("posix")->warn("read of {} in dataset {}: {} (EIO to the reader; {} so far)",
                                 Quoted(v.tree_.PathOf(MountTree::InodeOfSample(id))),
                                 Quoted(v.options_.dataset), acquired.status().message(), errors);
      }
      *error = EIO;
      return nullptr;
    }
    if ((*acquired)->bytes().size() != size) {
      const uint64_t errors = v.counters_.read_errors.fetch_add(1) + 1;
      GetLogger("posix")->error(
          "read of sample {} in dataset {}: the reader gave {} bytes, the manifest says {} (EIO "
          "to the reader; {} so far)",
          id, Quoted(v.options_.dataset), (*acquired)->bytes().size(), size, errors);
      *error = EIO;
      return nullptr;
    }
    v.counters_.acquires.fetch_add(1, std::memory_order_relaxed);
    return std::shared_ptr<PinnedSample>(std::move(*acquired));
  }

  static void ReplyFrom(PosixView& v, fuse_req_t req, const std::shared_ptr<PinnedSample>& pin,
                        uint64_t offset, size_t size) {
    const std::string_view bytes = pin->bytes();
    const size_t n = static_cast<size_t>(std::min<uint64_t>(size, bytes.size() - offset));
    v.counters_.read_bytes.fetch_add(n, std::memory_order_relaxed);
    // Straight from the pinned bytes (the sidecar's arena) into the reply.
    fuse_reply_buf(req, bytes.data() + offset, n);
  }

  // A read without an open file (no_open): the pin is kept between the
  // reads of one file in a small table; the first read of a file hints.
  static void ReadByInode(PosixView& v, fuse_req_t req, fuse_ino_t ino, size_t size,
                          uint64_t offset) {
    if (!v.tree_.Valid(ino) || v.tree_.IsDirectory(ino)) {
      fuse_reply_err(req, EISDIR);
      return;
    }
    const SampleId id = v.tree_.SampleOf(ino);
    const uint64_t file_size = v.tree_.Size(ino);
    if (offset >= file_size || size == 0) {
      fuse_reply_buf(req, nullptr, 0);
      return;
    }
    const bool reaches_end = offset + size >= file_size;
    bool ahead = false;
    std::shared_ptr<PinnedSample> pin = v.FindPin(id, reaches_end, &ahead);
    if (offset == 0 && (pin == nullptr || ahead)) v.OnFirstRead(id, /*pin=*/true);
    if (pin == nullptr) {
      int error = 0;
      pin = AcquireFor(v, id, file_size, &error);
      if (pin == nullptr) {
        fuse_reply_err(req, error);
        return;
      }
      if (!reaches_end) v.KeepPin(id, pin);
    }
    ReplyFrom(v, req, pin, offset, size);
  }

  static void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
    PosixView& v = *ViewOf(req);
    v.Count(FuseOp::kRead);
    if (off < 0) {
      fuse_reply_err(req, EINVAL);
      return;
    }
    if (fi->fh == 0) {
      ReadByInode(v, req, ino, size, static_cast<uint64_t>(off));
      return;
    }
    OpenFile* file = FileOf(fi);
    const auto offset = static_cast<uint64_t>(off);
    if (offset >= file->size || size == 0) {
      fuse_reply_buf(req, nullptr, 0);
      return;
    }
    // Nothing of `file` may be touched once the reply is sent: the reader may
    // close it at once and Release (on another worker) deletes it. So the pin
    // used for the reply is a reference of our own.
    std::shared_ptr<PinnedSample> pin;
    int error = 0;
    {
      std::lock_guard<std::mutex> lock(file->mu);
      if (file->pin == nullptr) file->pin = AcquireFor(v, file->id, file->size, &error);
      pin = file->pin;
      // The page cache has the file once this is replied; a later read (pages
      // evicted) pins it again.
      if (offset + size >= file->size) file->pin.reset();
    }
    if (pin == nullptr) {
      fuse_reply_err(req, error);
      return;
    }
    ReplyFrom(v, req, pin, offset, size);
  }

  static void Release(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* fi) {
    ViewOf(req)->Count(FuseOp::kRelease);
    if (fi->fh != 0) delete FileOf(fi);
    fuse_reply_err(req, 0);
  }

  static void ReleaseDir(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* /*fi*/) {
    ViewOf(req)->Count(FuseOp::kReleasedir);
    fuse_reply_err(req, 0);
  }

  static void StatFs(fuse_req_t req, fuse_ino_t /*ino*/) {
    PosixView& v = *ViewOf(req);
    v.Count(FuseOp::kStatfs);
    struct statvfs s;
    std::memset(&s, 0, sizeof(s));
    s.f_bsize = kBlockSize;
    s.f_frsize = kBlockSize;
    s.f_blocks =
        static_cast<fsblkcnt_t>((v.tree_.manifest().total_bytes() + kBlockSize - 1) / kBlockSize);
    s.f_files = static_cast<fsfilcnt_t>(v.tree_.max_inode());
    s.f_namemax = 255;
    s.f_flag = ST_RDONLY | ST_NOSUID | ST_NODEV;
    fuse_reply_statfs(req, &s);
  }

  static void ReadLink(fuse_req_t req, fuse_ino_t /*ino*/) { fuse_reply_err(req, EINVAL); }

  // The kernel drops an inode: nothing to do (inodes are the manifest's).
  static void Forget(fuse_req_t req, fuse_ino_t /*ino*/, uint64_t /*nlookup*/) {
    ViewOf(req)->Count(FuseOp::kForget);
    fuse_reply_none(req);
  }
  static void ForgetMulti(fuse_req_t req, size_t /*count*/, fuse_forget_data* /*forgets*/) {
    ViewOf(req)->Count(FuseOp::kForget);
    fuse_reply_none(req);
  }

  // Not implemented: ENOSYS, which the kernel remembers, so each of these
  // arrives once per mount (close() then costs no FLUSH round trip, access()
  // and the xattr calls none either). Handled here only to be counted.
  static void Flush(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* /*fi*/) {
    ViewOf(req)->Count(FuseOp::kFlush);
    fuse_reply_err(req, ENOSYS);
  }
  static void GetXattr(fuse_req_t req, fuse_ino_t /*ino*/, const char* /*name*/, size_t /*size*/) {
    ViewOf(req)->Count(FuseOp::kGetxattr);
    fuse_reply_err(req, ENOSYS);
  }
  static void ListXattr(fuse_req_t req, fuse_ino_t /*ino*/, size_t /*size*/) {
    ViewOf(req)->Count(FuseOp::kListxattr);
    fuse_reply_err(req, ENOSYS);
  }
  static void Access(fuse_req_t req, fuse_ino_t /*ino*/, int /*mask*/) {
    ViewOf(req)->Count(FuseOp::kAccess);
    fuse_reply_err(req, ENOSYS);
  }

  // The kernel sends every ioctl of a file to the server and, unlike FLUSH,
  // never remembers that none is implemented: Python's open(path, "rb") asks
  // isatty() (TCGETS) of every file it opens, so this is one round trip per
  // file even when everything else is cached. Answered at once, before
  // anything else is looked at; ENOTTY is what a regular file says.
  static void Ioctl(fuse_req_t req, fuse_ino_t /*ino*/, int /*cmd*/, void* /*arg*/,
                    fuse_file_info* /*fi*/, unsigned /*flags*/, const void* /*in_buf*/,
                    size_t /*in_bufsz*/, size_t /*out_bufsz*/) {
    ViewOf(req)->Count(FuseOp::kIoctl);
    fuse_reply_err(req, ENOTTY);
  }

  // Everything that would change the tree: EROFS (the kernel's `ro` answers
  // first; these are for a mount that somehow is not).
  static void Refuse(fuse_req_t req) {
    ViewOf(req)->Count(FuseOp::kWrite);
    ViewOf(req)->counters_.refused_writes.fetch_add(1, std::memory_order_relaxed);
    fuse_reply_err(req, EROFS);
  }
  static void SetAttr(fuse_req_t req, fuse_ino_t, struct stat*, int, fuse_file_info*) {
    Refuse(req);
  }
  static void MkNod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t) { Refuse(req); }
  static void MkDir(fuse_req_t req, fuse_ino_t, const char*, mode_t) { Refuse(req); }
  static void Unlink(fuse_req_t req, fuse_ino_t, const char*) { Refuse(req); }
  static void RmDir(fuse_req_t req, fuse_ino_t, const char*) { Refuse(req); }
  static void SymLink(fuse_req_t req, const char*, fuse_ino_t, const char*) { Refuse(req); }
  static void Rename(fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*,
                     unsigned int) {
    Refuse(req);
  }
  static void Link(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) { Refuse(req); }
  static void Write(fuse_req_t req, fuse_ino_t, const char*, size_t, off_t, fuse_file_info*) {
    Refuse(req);
  }
  static void SetXattr(fuse_req_t req, fuse_ino_t, const char*, const char*, size_t, int) {
    Refuse(req);
  }
  static void RemoveXattr(fuse_req_t req, fuse_ino_t, const char*) { Refuse(req); }
  static void Create(fuse_req_t req, fuse_ino_t, const char*, mode_t, fuse_file_info*) {
    Refuse(req);
  }
  static void Fallocate(fuse_req_t req, fuse_ino_t, int, off_t, off_t, fuse_file_info*) {
    Refuse(req);
  }

  static fuse_lowlevel_ops Ops() {
    fuse_lowlevel_ops ops;
    std::memset(&ops, 0, sizeof(ops));
    ops.init = Init;
    ops.lookup = Lookup;
    ops.getattr = GetAttr;
    ops.opendir = OpenDir;
    ops.readdir = ReadDirPlain;
    ops.readdirplus = ReadDirPlus;
    ops.releasedir = ReleaseDir;
    ops.open = Open;
    ops.read = Read;
    ops.release = Release;
    ops.forget = Forget;
    ops.forget_multi = ForgetMulti;
    ops.flush = Flush;
    ops.getxattr = GetXattr;
    ops.listxattr = ListXattr;
    ops.access = Access;
    ops.ioctl = Ioctl;
    ops.statfs = StatFs;
    ops.readlink = ReadLink;
    ops.setattr = SetAttr;
    ops.mknod = MkNod;
    ops.mkdir = MkDir;
    ops.unlink = Unlink;
    ops.rmdir = RmDir;
    ops.symlink = SymLink;
    ops.rename = Rename;
    ops.link = Link;
    ops.write = Write;
    ops.setxattr = SetXattr;
    ops.removexattr = RemoveXattr;
    ops.create = Create;
    ops.fallocate = Fallocate;
    return ops;
  }
};

PosixView::PosixView(PosixViewOptions options, MountTree tree,
                     std::shared_ptr<ContentReader> reader)
    : options_(std::move(options)),
      tree_(std::move(tree)),
      reader_(std::move(reader)),
      readahead_(options_.readahead_order, &tree_.manifest(), options_.readahead),
      max_pins_(2 * static_cast<size_t>(options_.threads) + 8 + options_.pin_ahead),
      order_(options_.readahead_order) {}

Result<std::unique_ptr<PosixView>> PosixView::Mount(PosixViewOptions options,
                                                    std::shared_ptr<const Manifest> manifest,
                                                    std::shared_ptr<ContentReader> reader) {
  const std::string what =
      "mounting dataset " + Quoted(options.dataset) + " at " + Quoted(options.mount_point);
  if (options.mount_point.empty() || options.mount_point[0] != '/') {
    return Status::InvalidArgument(what + ": the mount point must be an absolute path");
  }
  if (reader == nullptr) return Status::InvalidArgument(what + ": no content reader");
  if (options.threads == 0 || options.threads > 256) {
    return Status::InvalidArgument(what + ": threads must be 1..256");
  }
  if (!IsDnsLabel(options.dataset)) {
    return Status::InvalidArgument(what + ": the dataset name must be a DNS-1123 label");
  }
  if (options.readahead_order != nullptr && manifest != nullptr &&
      options.readahead_order->PositionOf(0) > manifest->sample_count()) {
    return Status::InvalidArgument(what + ": the readahead order is not this manifest's");
  }
  GRANARY_ASSIGN_OR_RETURN(MountTree tree, MountTree::Build(std::move(manifest)));
  if (options.readahead_order == nullptr) {
    options.readahead_order = ReadaheadOrder::ManifestOrder(tree.sample_count());
  }
  std::unique_ptr<PosixView> view(
      new PosixView(std::move(options), std::move(tree), std::move(reader)));
  const PosixViewOptions& o = view->options_;

  const int event = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event < 0) return Status::FromErrno(errno, what + ": eventfd");
  view->stop_event_ = ScopedFd(event);

  std::string mount_options = "ro,nosuid,nodev,fsname=granary:" + o.dataset + ",subtype=granary";
  if (o.allow_other) mount_options += ",allow_other,default_permissions";
  std::vector<std::string> argv_strings = {"granary-mount", "-o", mount_options};
  if (o.debug) argv_strings.push_back("-d");
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  const fuse_lowlevel_ops ops = Callbacks::Ops();
  view->session_ = fuse_session_new(&args, &ops, sizeof(ops), view.get());
  fuse_opt_free_args(&args);
  if (view->session_ == nullptr) {
    return Status::InvalidArgument(what + ": libfuse refused the options " + Quoted(mount_options) +
                                   " (see the message above)");
  }
  if (fuse_session_mount(view->session_, o.mount_point.c_str()) != 0) {
    fuse_session_destroy(view->session_);
    view->session_ = nullptr;
    return Status::IoError(what +
                           ": the kernel refused the FUSE mount (see the message above; "
                           "is /dev/fuse there, fusermount3 installed, and with "
                           "--allow-other user_allow_other in /etc/fuse.conf?)");
  }
  const int fd = fuse_session_fd(view->session_);
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    const int err = errno;
    view->Stop();
    return Status::FromErrno(err, what + ": making the FUSE device non-blocking");
  }
  if (o.readahead.window_samples > 0 && (o.pin_ahead > 0 || o.list_plans != nullptr)) {
    view->ahead_thread_ = std::thread([v = view.get()] { v->AheadLoop(); });
  }
  view->workers_left_ = o.threads;
  for (uint32_t i = 0; i < o.threads; ++i) {
    view->workers_.emplace_back([v = view.get()] { v->Serve(); });
  }
  {
    std::unique_lock<std::mutex> lock(view->state_mu_);
    view->state_cv_.wait_for(lock, o.init_timeout,
                             [&view] { return view->initialized_ || view->ended_.load(); });
    if (!view->initialized_) {
      lock.unlock();
      view->Stop();
      return Status::DeadlineExceeded(what + ": the kernel did not start the file system within " +
                                      std::to_string(o.init_timeout.count()) + " ms");
    }
  }
  GetLogger("posix")->info("dataset {} mounted at {}: {} files, {} directories, {} threads",
                           Quoted(o.dataset), Quoted(o.mount_point), view->tree_.sample_count(),
                           view->tree_.directory_count(), o.threads);
  return view;
}

PosixView::~PosixView() { Stop(); }

void PosixView::Serve() {
  fuse_buf buf;
  std::memset(&buf, 0, sizeof(buf));
  const int fd = fuse_session_fd(session_);
  // Each worker waits in an epoll of its own. The device is added with
  // EPOLLEXCLUSIVE, so a request wakes one idle worker instead of every
  // worker (poll() on one descriptor from many threads wakes them all: on a
  // small machine that herd is most of a warm round trip's cost). The stop
  // event is added without it and wakes everyone.
  ScopedFd epoll(epoll_create1(EPOLL_CLOEXEC));
  epoll_event device_event{};
  device_event.events = EPOLLIN | EPOLLEXCLUSIVE;
  device_event.data.u32 = 0;
  epoll_event stop_event{};
  stop_event.events = EPOLLIN;
  stop_event.data.u32 = 1;
  if (!epoll.valid() || epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &device_event) != 0 ||
      epoll_ctl(epoll.get(), EPOLL_CTL_ADD, stop_event_.get(), &stop_event) != 0) {
    GetLogger("posix")->error("serving {}: epoll: {}; this worker ends",
                              Quoted(options_.mount_point), std::strerror(errno));
  } else {
    ServeRequests(epoll.get(), &buf);
  }
  std::free(buf.mem);
  if (workers_left_.fetch_sub(1) == 1) MarkEnded();
  // Wake the others (the device is gone or we are stopping).
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t w = write(stop_event_.get(), &one, sizeof(one));
}

void PosixView::ServeRequests(int epoll, fuse_buf* buf) {
  // A woken worker takes what is queued (up to kDrain requests) before it
  // waits again. Bounded by Stop() (the event) or the kernel ending the mount.
  constexpr int kDrain = 16;
  while (true) {
    epoll_event events[2];
    const int ready = epoll_wait(epoll, events, 2, static_cast<int>(kPinIdle.count()));
    if (ready == 0) {
      ExpirePins();
      continue;
    }
    if (ready < 0) {
      if (errno == EINTR) continue;
      GetLogger("posix")->error("serving {}: epoll_wait: {}", Quoted(options_.mount_point),
                                std::strerror(errno));
      return;
    }
    bool readable = false;
    for (int i = 0; i < ready; ++i) {
      if (events[i].data.u32 == 1) return;                          // Stop()
      if ((events[i].events & (EPOLLERR | EPOLLHUP)) != 0) return;  // unmounted
      readable = (events[i].events & EPOLLIN) != 0;
    }
    for (int n = 0; readable && n < kDrain; ++n) {
      const int res = fuse_session_receive_buf(session_, buf);
      if (res == -EAGAIN) break;  // another worker took it
      if (res == -EINTR) continue;
      if (res <= 0) return;  // -ENODEV: unmounted; 0: the session exited
      fuse_session_process_buf(session_, buf);
    }
  }
}

void PosixView::MarkEnded() {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    ended_ = true;
  }
  state_cv_.notify_all();
}

bool PosixView::WaitEnded(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(state_mu_);
  return state_cv_.wait_for(lock, timeout, [this] { return ended_.load(); });
}

void PosixView::Stop() {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (stop_event_.valid()) {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t w = write(stop_event_.get(), &one, sizeof(one));
  }
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
  workers_.clear();
  {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    ahead_stop_ = true;
    ahead_queue_.clear();
  }
  ahead_cv_.notify_all();
  if (ahead_thread_.joinable()) ahead_thread_.join();
  if (session_ != nullptr) {
    // Lazy: a process still inside keeps its references, and sees ENOTCONN
    // once the device closes below.
    fuse_session_unmount(session_);
    fuse_session_destroy(session_);
    session_ = nullptr;
    std::lock_guard<std::mutex> lock(pins_mu_);
    pins_.clear();
    pin_order_.clear();
    GetLogger("posix")->info("dataset {} unmounted from {}", Quoted(options_.dataset),
                             Quoted(options_.mount_point));
  }
  MarkEnded();
}

std::shared_ptr<PinnedSample> PosixView::FindPin(SampleId id, bool reaches_end, bool* ahead) {
  std::lock_guard<std::mutex> lock(pins_mu_);
  auto it = pins_.find(id);
  *ahead = false;
  if (it == pins_.end()) return nullptr;
  std::shared_ptr<PinnedSample> pin = it->second->pin;
  if (it->second->ahead_bytes > 0) {
    *ahead = true;
    ahead_bytes_ -= it->second->ahead_bytes;
    it->second->ahead_bytes = 0;
    counters_.pinned_ahead_used.fetch_add(1, std::memory_order_relaxed);
  }
  if (reaches_end) {
    pin_order_.erase(it->second);
    pins_.erase(it);
  }
  return pin;
}

void PosixView::KeepPin(SampleId id, std::shared_ptr<PinnedSample> pin, uint64_t ahead_bytes) {
  std::vector<std::shared_ptr<PinnedSample>> dropped;  // released outside the lock
  std::lock_guard<std::mutex> lock(pins_mu_);
  if (pins_.count(id) != 0) return;
  pin_order_.push_back(KeptPin{id, std::move(pin), std::chrono::steady_clock::now(), ahead_bytes});
  pins_.emplace(id, std::prev(pin_order_.end()));
  ahead_bytes_ += ahead_bytes;
  while (pins_.size() > max_pins_) {
    ahead_bytes_ -= pin_order_.front().ahead_bytes;
    pins_.erase(pin_order_.front().id);
    dropped.push_back(std::move(pin_order_.front().pin));
    pin_order_.pop_front();
  }
}

void PosixView::ExpirePins() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<PinnedSample>> dropped;
  std::lock_guard<std::mutex> lock(pins_mu_);
  while (!pin_order_.empty() && now - pin_order_.front().kept >= kPinIdle) {
    ahead_bytes_ -= pin_order_.front().ahead_bytes;
    pins_.erase(pin_order_.front().id);
    dropped.push_back(std::move(pin_order_.front().pin));
    pin_order_.pop_front();
  }
}

void PosixView::OnFirstRead(SampleId id, bool pin) {
  const std::vector<SampleId> hints = readahead_.OnOpen(id);
  if (!hints.empty()) {
    counters_.hinted.fetch_add(hints.size(), std::memory_order_relaxed);
    reader_->Hint(hints);
  }
  if (!ahead_thread_.joinable()) return;
  // How far a first read may land from the previous one and still count as
  // following (several reader threads or DataLoader workers interleave):
  // 256 positions, less in a small order. A jump counts one up, a near read
  // one down; at kJumpsBeforeSearch a search is asked for.
  constexpr uint32_t kJumpsBeforeSearch = 8;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    if (ahead_stop_) return;
    const uint64_t p = order_->PositionOf(id);
    recent_[recent_count_++ % kRecentReads] = id;
    const uint64_t near_span = std::clamp<uint64_t>(order_->size() / 16, 4, 256);
    const bool near = p < order_->size() && ahead_last_ != kNoPosition &&
                      p + near_span >= ahead_last_ && p <= ahead_last_ + near_span;
    if (!near) {
      ++jumps_;
    } else if (jumps_ > 0) {
      --jumps_;
    }
    if (options_.list_plans != nullptr && jumps_ >= kJumpsBeforeSearch && !search_wanted_ &&
        std::chrono::steady_clock::now() >= next_search_) {
      search_wanted_ = true;
      wake = true;
    }
    // Only a reader that follows the order is pinned ahead of: a first read
    // shortly after the previous one. A jump (a random reader, another
    // order) pins nothing and starts over from here, so random reads do not
    // cost pin_ahead sidecar fetches each.
    const bool follows = p < order_->size() && ahead_last_ != kNoPosition && p > ahead_last_ &&
                         p <= ahead_last_ + 2 * static_cast<uint64_t>(options_.pin_ahead) + 2;
    ahead_last_ = p < order_->size() ? p : kNoPosition;
    if (pin && options_.pin_ahead > 0 && p < order_->size()) {
      if (!follows) {
        ahead_queue_.clear();
        ahead_end_ = p + 1;
      } else {
        const uint64_t want_end = std::min<uint64_t>(p + 1 + options_.pin_ahead, order_->size());
        ahead_end_ = std::max(ahead_end_, p + 1);
        for (; ahead_end_ < want_end; ++ahead_end_) ahead_queue_.push_back(order_->At(ahead_end_));
        while (ahead_queue_.size() > options_.pin_ahead) ahead_queue_.pop_front();
        wake = wake || !ahead_queue_.empty();
      }
    }
  }
  if (wake) ahead_cv_.notify_one();
}

void PosixView::SearchOrder() {
  std::vector<SampleId> recent;
  std::shared_ptr<const ReadaheadOrder> current;
  {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    const uint64_t n = std::min<uint64_t>(recent_count_, kRecentReads);
    for (uint64_t i = recent_count_ - n; i < recent_count_; ++i) {
      recent.push_back(recent_[i % kRecentReads]);
    }
    current = order_;
  }
  counters_.order_searches.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<const ReadaheadOrder> found;
  if (!current->Fits(recent)) {  // else the reader does follow, only not in step
    found = ReadaheadOrder::Match(tree_.manifest(), options_.list_plans(), recent,
                                  current->plan_id(), current->epoch() + 1);
  }
  const bool switching = found != nullptr && found->description() != current->description();
  if (switching) {
    readahead_.SetOrder(found);
    GetLogger("posix")->info("dataset {}: readahead now follows {} (the reads left {})",
                             Quoted(options_.dataset), found->description(),
                             current->description());
  }
  std::lock_guard<std::mutex> lock(ahead_mu_);
  search_wanted_ = false;
  jumps_ = 0;
  if (switching) {
    order_ = std::move(found);
    ahead_queue_.clear();
    ahead_last_ = kNoPosition;
    search_backoff_ = std::chrono::milliseconds(1000);
    counters_.order_switches.fetch_add(1, std::memory_order_relaxed);  // once it holds
  } else {
    search_backoff_ =
        std::min<std::chrono::milliseconds>(2 * search_backoff_, std::chrono::milliseconds(64'000));
  }
  next_search_ = std::chrono::steady_clock::now() + search_backoff_;
}

void PosixView::AheadLoop() {
  // Bounded by Stop() (ahead_stop_).
  while (true) {
    SampleId id;
    {
      std::unique_lock<std::mutex> lock(ahead_mu_);
      if (!ahead_cv_.wait_for(lock, kPinIdle, [this] {
            return ahead_stop_ || !ahead_queue_.empty() || search_wanted_;
          })) {
        lock.unlock();
        ExpirePins();
        continue;
      }
      if (ahead_stop_) return;
      if (search_wanted_) {
        lock.unlock();
        SearchOrder();
        continue;
      }
      id = ahead_queue_.front();
      ahead_queue_.pop_front();
    }
    const uint64_t size = tree_.manifest().SizeOf(id);
    if (size == 0 || size > options_.pin_ahead_bytes) continue;
    {
      std::lock_guard<std::mutex> lock(pins_mu_);
      if (pins_.count(id) != 0 || ahead_bytes_ + size > options_.pin_ahead_bytes) continue;
    }
    Result<std::unique_ptr<PinnedSample>> pin = reader_->Acquire(id);
    if (!pin.ok() || (*pin)->bytes().size() != size) continue;  // its read will say why
    counters_.acquires.fetch_add(1, std::memory_order_relaxed);
    counters_.pinned_ahead.fetch_add(1, std::memory_order_relaxed);
    KeepPin(id, std::shared_ptr<PinnedSample>(std::move(*pin)), size);
  }
}

std::string PosixView::readahead_order() {
  std::lock_guard<std::mutex> lock(ahead_mu_);
  return order_->description();
}

size_t PosixView::kept_pins() {
  std::lock_guard<std::mutex> lock(pins_mu_);
  return pins_.size();
}

PosixView::Counters PosixView::counters() const {
  Counters c;
  for (size_t i = 0; i < kFuseOpCount; ++i) c.requests[i] = counters_.requests[i].load();
  auto count = [&c](FuseOp op) { return c.requests[static_cast<size_t>(op)]; };
  c.lookups = count(FuseOp::kLookup);
  c.getattrs = count(FuseOp::kGetattr);
  c.readdirs = count(FuseOp::kReaddir) + count(FuseOp::kReaddirplus);
  c.opens = count(FuseOp::kOpen);
  c.reads = count(FuseOp::kRead);
  c.read_bytes = counters_.read_bytes.load();
  c.acquires = counters_.acquires.load();
  c.pinned_ahead = counters_.pinned_ahead.load();
  c.pinned_ahead_used = counters_.pinned_ahead_used.load();
  c.read_errors = counters_.read_errors.load();
  c.refused_writes = counters_.refused_writes.load();
  c.hinted = counters_.hinted.load();
  c.order_searches = counters_.order_searches.load();
  c.order_switches = counters_.order_switches.load();
  return c;
}

}  // namespace granary::posix
