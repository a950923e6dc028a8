// PosixView's life: mounting (the FUSE session, its options and INIT), the
// workers that read the FUSE device, stopping and unmounting, and the
// counters. The callbacks the workers run are in fuse_callbacks.cc; the pins
// and the ahead thread in pinning.cc.
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

#include "fuse_callbacks.h"
#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/core/thread_name.h"

namespace granary::posix {

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

  // default_permissions always: the kernel checks the source's modes against
  // the dataset's owner and group for every user, the mounting one too (a
  // user who is not the owner reads what the source let others read).
  std::string mount_options =
      "ro,nosuid,nodev,default_permissions,fsname=granary:" + o.dataset + ",subtype=granary";
  if (o.allow_other) mount_options += ",allow_other";
  std::vector<std::string> argv_strings = {"granary-mount", "-o", mount_options};
  if (o.debug) argv_strings.push_back("-d");
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  const fuse_lowlevel_ops ops = FuseOps();
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
    view->ahead_thread_ = std::thread([v = view.get()] {
      NameThisThread("pin-ahead");
      v->AheadLoop();
    });
  }
  view->workers_left_ = o.threads;
  for (uint32_t i = 0; i < o.threads; ++i) {
    view->workers_.emplace_back([v = view.get()] {
      NameThisThread("fuse");
      v->Serve();
    });
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
