// `granary mount NAME DIR`: a dataset as a read-only file system at DIR, for
// training code that opens files by path (docs/posix-view.md). The tree comes
// from the manifest in the metadata store; contents come through the host's
// granary-sidecar (SessionContentReader), so every read takes the
// client library's path (prefetched, local cache node, peer, on demand,
// source fall-through). When the sidecar is gone, reads go straight to the
// cache nodes and the source until it is back (FallbackContentReader,
// mount_fallback.h), unless --no-fallback.
//
// Runs until SIGTERM, SIGINT or SIGHUP (then unmounts cleanly), or until the
// mount is removed from outside (fusermount3 -u DIR). Without --foreground it
// forks: the parent returns once the file system is mounted (or with the
// child's error), the child serves on in a new session with its output sent
// to /dev/null. A stale mount left at DIR by a run that crashed is unmounted
// lazily first (posix::PrepareMountPoint, with a log line).

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "cli_context.h"
#include "granary/cli/cli.h"
#include "granary/client/session.h"
#include "granary/core/config.h"
#include "granary/core/log.h"
#include "granary/core/manifest.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "granary/posix/mount_point.h"
#include "granary/posix/posix_view.h"
#include "granary/posix/readahead.h"
#include "mount_fallback.h"
#include "session_reader.h"

namespace granary::cli {
namespace {

struct MountOptions {
  std::string dataset;
  std::string dir;
  std::string socket;
  bool foreground = false;
  bool allow_other = false;
  uint32_t threads = 8;
  std::string readahead = "auto";
  uint32_t readahead_samples = 256;
  uint32_t pin_ahead = 16;
  std::string readahead_bytes = "64MiB";
  std::string reconnect_timeout;  // default: 1s with the fallback, else 15s
  bool no_fallback = false;
  std::string local_node_socket;  // empty: DefaultLocalNodeSockets()
  std::string local_node;
};

// A mounted view and what it reads through, kept together for the run.
struct Mounted {
  std::shared_ptr<posix::ContentReader> reader;
  std::unique_ptr<posix::PosixView> view;
  std::string readahead;  // what the readahead follows
};

class MountCommand {
 public:
  MountCommand(CliContext& c, const MountOptions& o) : c_(c), o_(o) {}

  Status Run() {
    GRANARY_RETURN_IF_ERROR(CheckOptions());
    if (o_.foreground) return Serve(-1);
    return Background();
  }

 private:
  Status CheckOptions() {
    GRANARY_RETURN_IF_ERROR(ValidateDatasetName(o_.dataset));
    if (o_.readahead != "auto" && o_.readahead != "manifest" && o_.readahead != "off") {
      return Status::InvalidArgument("--readahead " + Quoted(o_.readahead) +
                                     ": write auto (a registered plan, else manifest order), "
                                     "manifest or off");
    }
    if (o_.threads == 0 || o_.threads > 256) {
      return Status::InvalidArgument("--threads must be 1..256");
    }
    Result<ByteSize> bytes = ParseByteSize(o_.readahead_bytes);
    if (!bytes.ok()) return bytes.status().WithContext("--readahead-bytes");
    readahead_bytes_ = bytes->bytes;
    Result<std::chrono::milliseconds> timeout =
        ParseDuration(!o_.reconnect_timeout.empty() ? o_.reconnect_timeout
                      : o_.no_fallback              ? "15s"
                                                    : "1s");
    if (!timeout.ok()) return timeout.status().WithContext("--reconnect-timeout");
    reconnect_timeout_ = *timeout;
    return Status::Ok();
  }

  // Store, manifest, sidecar, mount point, mount.
  Result<Mounted> MountIt() {
    GRANARY_ASSIGN_OR_RETURN(const std::string mount_point, posix::PrepareMountPoint(o_.dir));
    GRANARY_RETURN_IF_ERROR(c_.OpenExistingStore());
    Result<DatasetRecord> record = c_.store().GetDataset(o_.dataset);
    if (!record.ok()) {
      if (record.status().code() == StatusCode::kNotFound) {
        return Status::NotFound("no dataset " + Quoted(o_.dataset) +
                                " in the store; `granary dataset list` shows them");
      }
      return record.status().WithContext("reading dataset " + Quoted(o_.dataset));
    }
    const DatasetPhase phase = record->state.phase;
    if ((phase != DatasetPhase::kReady && phase != DatasetPhase::kStaging) ||
        record->manifest_id.empty()) {
      return Status::FailedPrecondition(
          "dataset " + Quoted(o_.dataset) + " is " + std::string(DatasetPhaseName(phase)) +
          (record->state.message.empty() ? "" : " (" + record->state.message + ")") +
          ": only a Staging or Ready dataset can be mounted; `granary dataset stage " + o_.dataset +
          " --wait` gets it there");
    }
    GRANARY_ASSIGN_OR_RETURN(const std::string blob, c_.store().GetManifest(record->manifest_id));
    Result<Manifest> decoded = Manifest::Decode(blob);
    if (!decoded.ok()) {
      return decoded.status().WithContext("reading the manifest of dataset " + Quoted(o_.dataset));
    }
    auto manifest = std::make_shared<const Manifest>(std::move(*decoded));

    SessionReaderOptions ro;
    ro.dataset = o_.dataset;
    ro.session.socket_path = o_.socket;
    ro.session.client_name = "granary-mount/" + std::to_string(getpid());
    ro.max_sessions = o_.threads;
    ro.reconnect_timeout = reconnect_timeout_;
    Result<std::unique_ptr<SessionContentReader>> reader = SessionContentReader::Open(ro);
    if (!reader.ok()) {
      return reader.status().WithContext(
          "opening dataset " + Quoted(o_.dataset) + " through the sidecar at " +
          client::ResolveSocketPath(o_.socket) +
          " (is granary-sidecar running there? --socket or GRANARY_SOCKET names another)");
    }
    if (!((*reader)->info().manifest_id == manifest->id())) {
      return Status::FailedPrecondition(
          "dataset " + Quoted(o_.dataset) + ": the sidecar serves manifest " +
          (*reader)->info().manifest_id.ToHex() + " but the store holds " + manifest->id().ToHex() +
          " (a snapshot is being taken); try again in a moment");
    }

    posix::PosixViewOptions vo;
    vo.mount_point = mount_point;
    vo.dataset = o_.dataset;
    vo.uid = record->owner.uid;
    vo.gid = record->owner.gid;
    vo.allow_other = o_.allow_other;
    vo.threads = o_.threads;
    vo.readahead.window_samples = o_.readahead == "off" ? 0 : o_.readahead_samples;
    vo.readahead.window_bytes = readahead_bytes_;
    vo.pin_ahead = o_.pin_ahead;
    Mounted m;
    m.readahead = "off";
    if (o_.readahead != "off") {
      if (o_.readahead == "auto") {
        // The newest plan now, and the plans of readers in another epoch, or
        // of a plan registered later, as they come (PosixViewOptions::list_plans).
        MetadataStore* store = &c_.store();
        vo.list_plans = [store, dataset = o_.dataset] {
          Result<std::vector<PlanRecord>> listed = store->ListPlans(dataset);
          return listed.ok() ? std::move(*listed) : std::vector<PlanRecord>{};
        };
      }
      const std::vector<PlanRecord> plans =
          vo.list_plans != nullptr ? vo.list_plans() : std::vector<PlanRecord>{};
      GRANARY_ASSIGN_OR_RETURN(vo.readahead_order, posix::ReadaheadOrder::Choose(*manifest, plans));
      m.readahead = vo.readahead_order->description();
    }
    m.reader = std::shared_ptr<SessionContentReader>(std::move(*reader));
    if (!o_.no_fallback) {
      DirectReaderOptions dro;
      dro.client_name = "granary-mount/" + std::to_string(getpid());
      GRANARY_ASSIGN_OR_RETURN(dro.credentials, c_.PeerCredentials());
      // Without the cluster key (a user other than root), nodes that require
      // it refuse these reads: the node on this host serves them through its
      // handoff socket, checking this user's right to each file, as for
      // `granary cat --direct`.
      if (c_.ClusterKeyPath().empty()) {
        ReadThroughLocalHandoff(&dro, o_.local_node_socket, o_.local_node);
      }
      GRANARY_ASSIGN_OR_RETURN(dro.tls, c_.Tls());
      dro.fabric = c_.Fabric();
      Result<std::unique_ptr<DirectReader>> direct =
          DirectReader::Create(c_.store(), *record, manifest, dro);
      if (!direct.ok()) {
        return direct.status().WithContext("preparing reads without the sidecar for dataset " +
                                           Quoted(o_.dataset) + " (--no-fallback skips this)");
      }
      MetadataStore* store = &c_.store();
      m.reader = std::make_shared<FallbackContentReader>(
          std::move(m.reader), std::move(*direct), client::ResolveSocketPath(o_.socket),
          [store](DirectReader& d) { return d.RefreshNodes(*store); });
    }
    GRANARY_ASSIGN_OR_RETURN(m.view, posix::PosixView::Mount(vo, manifest, m.reader));
    return m;
  }

  // Mounts, reports (on `ready_fd` when forked, else on the context's
  // streams), then serves until a stop signal or an unmount from outside.
  Status Serve(int ready_fd) {
    // Blocked before any thread starts, so every thread inherits the mask
    // and the signals wait for sigtimedwait below.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGHUP);
    sigset_t previous;
    pthread_sigmask(SIG_BLOCK, &stop, &previous);
    Status result = ServeBlocked(ready_fd, stop);
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    return result;
  }

  Status ServeBlocked(int ready_fd, const sigset_t& stop) {
    Result<Mounted> mounted = MountIt();
    if (!mounted.ok()) return mounted.status();
    posix::PosixView& view = *mounted->view;
    const std::string line = "dataset " + Quoted(o_.dataset) + " mounted at " + view.mount_point() +
                             ": " + std::to_string(view.tree().sample_count()) +
                             " files, readahead " + mounted->readahead;
    if (ready_fd >= 0) {
      const std::string message = "0" + line;
      [[maybe_unused]] const ssize_t w = write(ready_fd, message.data(), message.size());
      close(ready_fd);
      // Nobody reads our output any more.
      const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
      if (null >= 0) {
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
        close(null);
      }
    } else if (c_.json_output()) {
      Json j;
      j["dataset"] = o_.dataset;
      j["mount_point"] = view.mount_point();
      j["files"] = view.tree().sample_count();
      j["pid"] = getpid();
      j["readahead"] = mounted->readahead;
      c_.out() << j.dump() << "\n" << std::flush;
    } else {
      c_.out() << line << "; SIGTERM or Ctrl-C unmounts\n" << std::flush;
    }
    // Bounded by a stop signal or the mount ending; each wait is 200 ms.
    while (!view.ended()) {
      timespec wait{0, 200'000'000};
      const int sig = sigtimedwait(&stop, nullptr, &wait);
      if (sig > 0) {
        GetLogger("posix")->info("{}: unmounting {}", strsignal(sig), view.mount_point());
        break;
      }
    }
    if (view.ended()) {
      GetLogger("posix")->info("{} was unmounted from outside; exiting", view.mount_point());
    }
    view.Stop();
    const posix::PosixView::Counters counters = view.counters();
    GetLogger("posix")->info("served {} reads ({} bytes, {} samples pinned, {} EIO), {} hinted",
                             counters.reads, counters.read_bytes, counters.acquires,
                             counters.read_errors, counters.hinted);
    return Status::Ok();
  }

  // Forks; the child mounts and serves, the parent waits for its first word.
  Status Background() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno(errno, "mount: pipe");
    const pid_t pid = fork();
    if (pid < 0) {
      const int err = errno;
      close(fds[0]);
      close(fds[1]);
      return Status::FromErrno(err, "mount: fork");
    }
    if (pid == 0) {
      close(fds[0]);
      setsid();
      const Status s = Serve(fds[1]);
      if (!s.ok()) {
        const std::string message = std::to_string(ExitCodeOf(s)) + s.message();
        [[maybe_unused]] const ssize_t w = write(fds[1], message.data(), message.size());
      }
      _exit(s.ok() ? 0 : ExitCodeOf(s));
    }
    close(fds[1]);
    std::string reply;
    char buf[4096];
    // Bounded by the child: it writes once and closes (or exits).
    while (true) {
      const ssize_t n = read(fds[0], buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      reply.append(buf, static_cast<size_t>(n));
    }
    close(fds[0]);
    if (!reply.empty() && reply[0] == '0') {
      if (c_.json_output()) {
        Json j;
        j["dataset"] = o_.dataset;
        j["pid"] = pid;
        j["message"] = reply.substr(1);
        c_.out() << j.dump() << "\n";
      } else {
        c_.out() << reply.substr(1) << " (pid " << pid
                 << "; `fusermount3 -u DIR` or SIGTERM unmounts)\n";
      }
      return Status::Ok();
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (reply.empty()) {
      return Status::Internal(
          "mount: the serving process died before mounting (" +
          std::string(WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "exited") +
          "); run with --foreground to see why");
    }
    // "<exit code><message>": the code's Status class is what ExitCodeOf maps.
    const int code = reply[0] - '0';
    return StatusOfExitCode(code == kCliOk ? kCliFailed : code, reply.substr(1));
  }

  CliContext& c_;
  const MountOptions& o_;
  uint64_t readahead_bytes_ = 0;
  std::chrono::milliseconds reconnect_timeout_{0};
};

}  // namespace

void AddMountCommand(CLI::App& app, CliContext& context) {
  MountOptions* o = context.Keep(std::make_unique<MountOptions>());
  CLI::App* mount = app.add_subcommand(
      "mount", "Mount a dataset as a read-only file system (FUSE), read through the sidecar");
  mount->add_option("name", o->dataset, "Dataset name")->required();
  mount->add_option("dir", o->dir, "An empty directory to mount on")->required();
  mount->add_option("--socket", o->socket,
                    "The sidecar's socket (default $GRANARY_SOCKET, else " +
                        std::string(client::kDefaultSocketPath) + ")");
  mount->add_flag("-f,--foreground", o->foreground,
                  "Serve in this process until SIGTERM/SIGINT (default: in the background)");
  mount->add_flag("--allow-other", o->allow_other,
                  "Let other users in (the kernel then checks the source's modes against the "
                  "dataset owner and group; "
                  "non-root needs user_allow_other in /etc/fuse.conf)");
  mount->add_option("--threads", o->threads, "FUSE worker threads and sidecar sessions (8)");
  mount->add_option("--readahead", o->readahead,
                    "What opens hint ahead: auto (a registered plan, else manifest order), "
                    "manifest, off");
  mount->add_option("--readahead-samples", o->readahead_samples, "Readahead window in files (256)");
  mount->add_option("--readahead-bytes", o->readahead_bytes, "Readahead window in bytes (64MiB)");
  mount->add_option("--pin-ahead", o->pin_ahead,
                    "Files pinned ahead of their first read, 0 for none (16)");
  mount->add_option("--reconnect-timeout", o->reconnect_timeout,
                    "How long a read retries a sidecar that went away before reading without it "
                    "(1s), or with --no-fallback before EIO (15s)");
  mount->add_option("--local-node-socket", o->local_node_socket,
                    "Reads without the sidecar and without the cluster key: the handoff socket "
                    "(`local_socket`) of the cache node on this host (default " +
                        DefaultLocalNodeSockets()[0] + ", else " + DefaultLocalNodeSockets()[1] +
                        ")");
  mount->add_option("--local-node", o->local_node,
                    "Reads without the sidecar and without the cluster key: that cache node's id "
                    "(default: the host name)");
  mount->add_flag("--no-fallback", o->no_fallback,
                  "Never read without the sidecar: when it is gone, reads fail with EIO");
  context.OnParsed(mount, [&context, o] { return MountCommand(context, *o).Run(); });
}

}  // namespace granary::cli
