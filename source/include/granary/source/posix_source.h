#pragma once

// PosixSource: the Source driver for a mounted file system (a Lustre, GPFS or
// NFS path, or a local directory), reading with the dataset owner's rights.
//
// How one Read goes (docs/source-and-identity.md):
//   1. the path is checked lexically: relative, no empty, '.' or '..'
//      components, no NUL, at most 4095 bytes; the range must lie inside the
//      manifest's size. Failures cost no open;
//   2. a slot of the in-flight limit is taken (Read waits, TryRead does not);
//   3. on an IdentityExecutor worker running as the owner, the file is opened
//      with openat2(2) and RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS relative to
//      an O_PATH descriptor of its directory, itself opened the same way
//      relative to the root once and kept (up to kMaxCachedDirectories), so
//      neither '..' nor a symlink (including one swapped in after the
//      snapshot) leads outside the root, and the source sees one lookup per
//      file, not one per path component; symlinks that stay inside are
//      followed, as the manifest includes them. The open is O_NONBLOCK, so a
//      FIFO swapped in cannot hang it;
//   4. the opened descriptor's attributes as the open just fetched them
//      (statx with AT_STATX_DONT_SYNC: no extra round trip on NFS or FUSE)
//      must show a regular file with the manifest's size and mtime (ns), and
//      its ctime (ns) and inode when the manifest recorded them (format
//      version 3 on), else kFailedPrecondition ("changed since the snapshot",
//      naming what changed and the `granary dataset snapshot` to run) and
//      nothing is read. ctime catches a rewrite that restored size and mtime
//      (touch -r), the inode a file renamed over the recorded one;
//   5. pread until the range is read; end of file first is "changed";
//   6. the attributes again, as the file system knows them after the read
//      (statx with AT_STATX_DONT_SYNC: exact on a local file system, what
//      the read reply carried on NFSv3; no extra round trip): any of those
//      that moved during the read is "changed".
// Every Read does all of this, so each piece of a large sample is checked on
// its own: pieces of two versions of a file are never both returned.
// Kernels without openat2 (before 5.6, or a seccomp filter that refuses it)
// get a component-by-component walk with O_NOFOLLOW instead: as safe, but
// symlinks are refused (kUnsafePath) rather than followed.
//
// The root itself is opened once, in Open, as the owner: the owner needs search
// rights on every directory down to it, as they would to read it themselves.
//
// Callers: the cache node, one PosixSource per dataset.
// Thread safety: as Source: any number of threads may call Read, TryRead and
// Counters at once. The IdentityExecutor must outlive the source.

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "granary/core/file.h"
#include "granary/core/status.h"
#include "granary/source/identity.h"
#include "granary/source/source.h"

namespace granary {

// Points in a read where PosixSourceOptions::stage_hook is called.
enum class SourceReadStage : uint8_t {
  kBeforeOpen,  // holding a slot, as the owner, before the open
  kChecked,     // opened and checked against the manifest, before the first read
  kRead,        // every byte read, before the final check
};

inline constexpr uint32_t kDefaultSourceInFlight = 16;
// Directory descriptors a PosixSource keeps open at most (then it starts over).
inline constexpr size_t kMaxCachedDirectories = 4096;
inline constexpr uint32_t kMaxSourceInFlight = 65536;

struct PosixSourceOptions {
  // The source root: a directory on a mounted file system.
  std::string root;
  // Shown in messages; default "file://" + root.
  std::string uri;
  // The dataset's name, for the re-snapshot command messages give
  // (`granary dataset snapshot NAME`); empty: "NAME".
  std::string dataset;
  // Whose rights every access uses (ResolveOwnerIdentity of the dataset owner).
  Identity owner;
  // Runs the accesses as `owner`; required; must outlive the source.
  IdentityExecutor* executor = nullptr;
  // Reads in flight at most (the cache node's "source concurrency"). 1..65536.
  uint32_t max_in_flight = kDefaultSourceInFlight;
  // false: never use openat2, as on kernels before 5.6 (tests use it to cover
  // that path).
  bool use_openat2 = true;
  // Called at each SourceReadStage on the executor thread, as the owner. For
  // tests and fault injection (e.g. changing a file mid-read); leave empty.
  std::function<void(SourceReadStage stage, const SourceFile& file)> stage_hook;
};

class PosixSource final : public Source {
 public:
  // Opens the root as `owner`. kInvalidArgument for bad options or a root that
  // is not a directory; kNotFound, kPermissionDenied when the owner cannot
  // reach the root; what IdentityExecutor::Run returns for an owner it refuses.
  static Result<std::unique_ptr<PosixSource>> Open(PosixSourceOptions options);

  // The root path in a file:// URI ("file:///lustre/x" -> "/lustre/x");
  // kInvalidArgument for another scheme, a host part or a relative path.
  static Result<std::string> RootFromUri(std::string_view uri);

  Status Read(const SourceFile& file, uint64_t offset, std::span<char> out) override;
  Status TryRead(const SourceFile& file, uint64_t offset, std::span<char> out) override;
  SourceCounters Counters() const override;
  const std::string& uri() const override { return options_.uri; }
  uint32_t max_in_flight() const override { return options_.max_in_flight; }

  // Whether `reader` may read every file of `files` at the source, as the
  // kernel decides for that identity (mode bits, ACLs, its groups): on an
  // executor worker switched to `reader`, the root is opened by its path (so
  // `reader` needs search rights on every directory down to it) and must
  // still be the root this source holds; then each file is opened O_RDONLY
  // beneath it as in step 3 (without openat2: component by component, no
  // symlink followed), and its descriptor must still be the snapshot's
  // version as in step 4: staged bytes of a file replaced since could be
  // another file's. No byte is read; nothing is counted in Counters(). Used
  // by the cache node's chunk handoff for local users other than the owner.
  // Ok; else the first failure: kPermissionDenied naming the file and
  // `reader`, kFailedPrecondition (changed), kNotFound (gone), the executor's
  // refusal of `reader` (a node without CAP_SETUID), kInvalidArgument for a
  // path the manifest should never hold.
  Status CheckReadable(const Identity& reader, std::span<const SourceFile> files) override;

  const Identity& owner() const { return options_.owner; }
  // False when Open found openat2 missing or refused and fell back to the walk.
  bool uses_openat2() const { return use_openat2_; }

 private:
  PosixSource(PosixSourceOptions options, ScopedFd root, bool use_openat2);

  // Checks that need no I/O; counted as kInvalidRequest.
  Status CheckRequest(const SourceFile& file, uint64_t offset, size_t length);
  // Steps 3-6, on the executor thread.
  Status ReadAsOwner(const SourceFile& file, uint64_t offset, std::span<char> out);
  Result<ScopedFd> OpenBeneath(const SourceFile& file);
  Status Fail(SourceErrorKind kind, Status status);
  std::string What(const SourceFile& file, uint64_t offset, size_t length) const;
  // "re-snapshot the dataset: `granary dataset snapshot <dataset>`".
  std::string Resnapshot() const;

  const PosixSourceOptions options_;
  // The O_PATH descriptor of directory `dir` (relative, not empty) beneath
  // the root, opened on first use (as the owner; `*fresh` set) and kept; null
  // with `*err` set when it cannot be opened. openat2 path only.
  std::shared_ptr<const ScopedFd> DirectoryBeneath(const std::string& dir, bool* fresh, int* err);
  // Drops the kept descriptor of `dir` if it is still `stale`.
  void ForgetDirectory(const std::string& dir, const std::shared_ptr<const ScopedFd>& stale);

  const ScopedFd root_;  // O_PATH | O_DIRECTORY
  const bool use_openat2_;
  std::mutex dirs_mu_;
  std::unordered_map<std::string, std::shared_ptr<const ScopedFd>> dirs_;  // guarded by dirs_mu_
  // Directories one reader is opening; the others wait for it rather than
  // look the same directory up on the source too. Guarded by dirs_mu_.
  std::unordered_set<std::string> opening_;
  std::condition_variable dirs_cv_;  // opening_ shrank
  SourceMeter meter_;
  InFlightLimit limit_;
  std::array<std::atomic<bool>, kSourceErrorKinds> warned_{};  // one warn log per kind
};

}  // namespace granary
