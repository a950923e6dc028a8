// PosixView's FUSE low-level callbacks (PosixView::Callbacks): lookups,
// attributes and directory listings answered from the MountTree; opens and
// reads through the ContentReader, with the pins of pinning.cc; EROFS for
// every write-like operation. They run on the view's workers (posix_view.cc).
#define FUSE_USE_VERSION 34
#include "fuse_callbacks.h"

#include <fuse_lowlevel.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/posix/posix_view.h"

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

fuse_lowlevel_ops FuseOps() { return PosixView::Callbacks::Ops(); }

}  // namespace granary::posix
