#pragma once

// PosixView: a dataset shown as a read-only file system (FUSE, libfuse3's
// low-level API) for training code that opens files by path
// (docs/posix-view.md).
//
//  - Tree and attributes come from the manifest (MountTree): lookup,
//    getattr and readdir(plus) are answered from memory and never reach the
//    source or a cache node. Files are regular files of the manifest's size
//    and mtime; owner uid/gid are the dataset owner's; modes are the
//    source's at snapshot time, without set-user/group-ID (r--r--r-- and
//    r-xr-xr-x for a version 1 manifest, which has none). The kernel checks
//    them for every user, the mounting one included (default_permissions);
//    without allow_other only the mounting user gets in at all.
//  - Contents come from a ContentReader (content_reader.h): a file's sample is
//    pinned at its first read and replied from in place until the read that
//    reaches its end, or close. Opens hint the samples that follow
//    (readahead.h).
//  - The kernel caches everything: entries and attributes for
//    entry_timeout (a day by default; the dataset is immutable), negative
//    lookups too, directory listings (cache_readdir) and file pages
//    (keep_cache), so a warm read is a page-cache read. Reads are up to
//    1 MiB per request.
//  - Read-only twice over: the mount is `ro` (the kernel answers EROFS to
//    every write-like call before asking), and every write-like operation
//    that did arrive would get EROFS too. There are no symlinks, and `..` of
//    the root is the root.
//
// Serving: `threads` workers of its own, started by Mount, each waiting in
// its own epoll on the FUSE device (EPOLLEXCLUSIVE: a request wakes one idle
// worker, not all of them) and a stop event. Stop() ends them and unmounts (lazily:
// processes still inside see ENOTCONN afterwards). When the mount is removed
// from outside (fusermount3 -u, umount), the workers end and ended() turns
// true; Stop() must still be called. libfuse's signal handlers are not
// installed: the embedding process decides what its signals do.
//
// Who calls it: `granary mount` (cli/src/mount_command.cc), the sidecar's
// `mounts:` option, tests.
//
// One more thread of its own (the ahead thread, with readahead on and
// pin_ahead or list_plans set) pins samples ahead of their first reads,
// looks for the order a reader follows, and expires idle pins.
//
// Thread safety: Stop(), ended(), WaitEnded(), counters() and
// readahead_order() from any thread; Stop() is idempotent and also run by
// the destructor. The FUSE callbacks run on the workers and touch immutable
// state, atomics, each open file's own mutex, and the pin table, the
// readahead and the ahead thread's queue under their mutexes.

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "granary/core/file.h"
#include "granary/core/manifest.h"
#include "granary/core/status.h"
#include "granary/posix/content_reader.h"
#include "granary/posix/mount_tree.h"
#include "granary/posix/readahead.h"

struct fuse_buf;
struct fuse_session;

namespace granary::posix {

struct PosixViewOptions {
  std::string mount_point;  // an existing empty directory (see mount_point.h)
  std::string dataset;      // shown as the file system's name: granary:<dataset>
  uid_t uid = 0;            // owner of every file and directory
  gid_t gid = 0;
  // Let other users than the mounting one in (needs user_allow_other in
  // /etc/fuse.conf unless root). Modes then keep others out.
  bool allow_other = false;
  uint32_t threads = 8;
  // How long the kernel keeps entries and attributes (and negative entries).
  std::chrono::seconds entry_timeout{86'400};
  // Readahead; null order: manifest order. window_samples 0: none.
  std::shared_ptr<const ReadaheadOrder> readahead_order;
  ReadaheadOptions readahead;
  // The plans registered for the dataset now (e.g. MetadataStore::ListPlans;
  // empty if they cannot be listed). When set (and readahead is on), a
  // reader whose first reads stop following the order (8 in a row) has the
  // view look, on a thread of its own, for the plan epoch or manifest order
  // they follow (ReadaheadOrder::Match) and switch to it. Searches that find
  // nothing back off (1 s, doubling up to 64 s). Null: the order is kept.
  std::function<std::vector<PlanRecord>()> list_plans;
  // Pinned readahead (no_open kernels): on the first read of a file that
  // follows the previous first read in the readahead order, the next
  // pin_ahead samples in that order are pinned by a thread of the view's own, so their first reads
  // find them pinned and cost no reader round trip. At most pin_ahead_bytes are pinned ahead at
  // once (larger samples are not pinned ahead). 0: off; off with readahead off.
  uint32_t pin_ahead = 16;
  uint64_t pin_ahead_bytes = 16ull << 20;
  // How long Mount waits for the kernel's INIT.
  std::chrono::milliseconds init_timeout{10'000};
  bool debug = false;  // libfuse's request trace on stderr
};

// The FUSE requests the view counts, one counter each (Counters::requests).
// A warm pass should cost none; kIoctl is the one an unmodified Python
// `open(path, "rb")` still costs per file (isatty(): the kernel sends every
// ioctl of a FUSE file to its server and remembers no ENOTTY).
enum class FuseOp : uint8_t {
  kLookup,
  kForget,
  kGetattr,
  kOpendir,
  kReaddir,
  kReaddirplus,
  kReleasedir,
  kOpen,
  kRead,
  kRelease,
  kFlush,
  kIoctl,
  kStatfs,
  kGetxattr,
  kListxattr,
  kAccess,
  kWrite,  // every write-like operation (answered EROFS)
  kCount,
};
inline constexpr size_t kFuseOpCount = static_cast<size_t>(FuseOp::kCount);
// "lookup", "getattr", ...: the `op` label of granary_posix_requests_total.
std::string_view FuseOpName(FuseOp op);

class PosixView {
 public:
  struct Counters {
    // FUSE requests received, by FuseOp.
    std::array<uint64_t, kFuseOpCount> requests{};
    // The same, for the common ones (readdirs: plain and plus).
    uint64_t lookups = 0;
    uint64_t getattrs = 0;
    uint64_t readdirs = 0;
    uint64_t opens = 0;
    uint64_t reads = 0;
    uint64_t read_bytes = 0;
    uint64_t acquires = 0;     // samples pinned through the reader
    uint64_t read_errors = 0;  // reads answered EIO
    uint64_t refused_writes = 0;
    uint64_t hinted = 0;             // ids passed to ContentReader::Hint
    uint64_t pinned_ahead = 0;       // samples pinned ahead of their first read
    uint64_t pinned_ahead_used = 0;  // ... whose first read found them pinned
    uint64_t order_searches = 0;     // ReadaheadOrder::Match runs
    uint64_t order_switches = 0;     // ... that switched the order followed
  };

  // Builds the tree (errors from MountTree::Build), mounts at
  // options.mount_point and starts the workers; returns once the kernel's
  // INIT is answered. Errors: kInvalidArgument (options), kIoError /
  // kPermissionDenied from the mount, naming the directory and what to do.
  static Result<std::unique_ptr<PosixView>> Mount(PosixViewOptions options,
                                                  std::shared_ptr<const Manifest> manifest,
                                                  std::shared_ptr<ContentReader> reader);

  ~PosixView();
  PosixView(const PosixView&) = delete;
  PosixView& operator=(const PosixView&) = delete;

  const std::string& mount_point() const { return options_.mount_point; }
  const MountTree& tree() const { return tree_; }

  // Stops the workers and unmounts. Idempotent.
  void Stop();
  // The kernel ended the mount (unmounted from outside), or Stop() ran.
  bool ended() const { return ended_.load(); }
  // Waits up to `timeout` for ended(); returns it.
  bool WaitEnded(std::chrono::milliseconds timeout);

  Counters counters() const;
  // What the readahead follows now: ReadaheadOrder::description().
  std::string readahead_order();
  // Samples pinned between the reads of a file (no_open mode); see below.
  size_t kept_pins();

  // For the FUSE callbacks (fuse_callbacks.cc) only.
  struct Callbacks;

 private:
  PosixView(PosixViewOptions options, MountTree tree, std::shared_ptr<ContentReader> reader);
  void Serve();
  void ServeRequests(int epoll, fuse_buf* buf);
  void MarkEnded();

  // Reads without an open file (the kernel's no_open mode): pins kept
  // between the reads of one file, dropped by the read that reaches its end,
  // when more than max_pins_ are held (oldest first), or after kPinIdle.
  // *ahead: the pin was pinned ahead and this is its first use.
  std::shared_ptr<PinnedSample> FindPin(SampleId id, bool reaches_end, bool* ahead);
  void KeepPin(SampleId id, std::shared_ptr<PinnedSample> pin, uint64_t ahead_bytes = 0);
  void ExpirePins();
  // The first read of sample `id` (an open, or a read at offset 0 without
  // one): hints the readahead window, notes whether the read follows the
  // order, and with `pin` queues the samples after it for pinning.
  void OnFirstRead(SampleId id, bool pin);
  // The ahead thread: pins what OnFirstRead queued, looks for the order a
  // reader follows when asked, expires idle pins.
  void AheadLoop();
  void SearchOrder();

  const PosixViewOptions options_;
  const MountTree tree_;
  const std::shared_ptr<ContentReader> reader_;
  Readahead readahead_;

  fuse_session* session_ = nullptr;
  ScopedFd stop_event_;  // eventfd: readable once Stop() runs
  std::vector<std::thread> workers_;
  std::atomic<uint32_t> workers_left_{0};

  struct KeptPin {
    SampleId id;
    std::shared_ptr<PinnedSample> pin;
    std::chrono::steady_clock::time_point kept;
    uint64_t ahead_bytes;  // pinned ahead and not read yet: its size; else 0
  };
  std::mutex pins_mu_;            // guards the three below
  std::list<KeptPin> pin_order_;  // oldest first
  std::unordered_map<SampleId, std::list<KeptPin>::iterator> pins_;
  uint64_t ahead_bytes_ = 0;  // sum of ahead_bytes
  size_t max_pins_ = 0;
  // A pin kept between the reads of a file is dropped after this long unused.
  static constexpr std::chrono::milliseconds kPinIdle{1000};

  std::mutex ahead_mu_;  // guards the members below up to ahead_thread_; pairs with ahead_cv_
  std::condition_variable ahead_cv_;
  std::shared_ptr<const ReadaheadOrder> order_;  // what pinning and the readahead follow
  std::deque<SampleId> ahead_queue_;
  static constexpr uint64_t kNoPosition = ~uint64_t{0};
  uint64_t ahead_end_ = 0;             // positions in the order below this were queued
  uint64_t ahead_last_ = kNoPosition;  // the position of the last first read
  bool ahead_stop_ = false;
  // Following: the last kRecentReads first reads (a ring), how many in a row
  // jumped away from the previous one, whether a search is wanted, and when
  // the next may run.
  static constexpr size_t kRecentReads = 16;
  std::array<SampleId, kRecentReads> recent_{};
  uint64_t recent_count_ = 0;
  uint32_t jumps_ = 0;
  bool search_wanted_ = false;
  std::chrono::steady_clock::time_point next_search_{};
  std::chrono::milliseconds search_backoff_{1000};
  std::thread ahead_thread_;

  std::mutex state_mu_;  // guards the flags below and pairs with state_cv_
  std::condition_variable state_cv_;
  bool initialized_ = false;  // INIT answered
  // Set by INIT, before any other request: the kernel sends no OPEN/OPENDIR.
  std::atomic<bool> no_open_{false};
  std::atomic<bool> no_opendir_{false};
  bool stopped_ = false;
  std::atomic<bool> ended_{false};

  void Count(FuseOp op) {
    counters_.requests[static_cast<size_t>(op)].fetch_add(1, std::memory_order_relaxed);
  }

  struct AtomicCounters {
    std::array<std::atomic<uint64_t>, kFuseOpCount> requests{};
    std::atomic<uint64_t> read_bytes{0}, acquires{0}, read_errors{0}, refused_writes{0}, hinted{0},
        pinned_ahead{0}, pinned_ahead_used{0}, order_searches{0}, order_switches{0};
  };
  AtomicCounters counters_;
};

}  // namespace granary::posix
