#include "granary/core/snapshot.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <utility>

#include "granary/core/byte_order.h"
#include "granary/core/config.h"
#include "granary/core/file.h"
#include "granary/core/identity.h"
#include "granary/core/names.h"
#include "granary/core/posix_source.h"

extern char** environ;

namespace granary {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

// The child's messages on its pipe: progress records ('P', files u64,
// directories u64, little-endian), then one final message that runs to the end
// of the stream: 'M' + the encoded manifest, or 'E' + a StatusCode byte + the
// error message.
constexpr size_t kProgressRecordSize = 1 + 8 + 8;
// The final message may hold a manifest of up to kMaxManifestBytes.
constexpr size_t kMaxAnswerBytes = kMaxManifestBytes + (1u << 20);
// The request a helper reads on stdin; written into the pipe before the spawn,
// so it must fit in the pipe's buffer (raised to this size if needed).
constexpr size_t kMaxRequestBytes = 1u << 20;
// How often the parent looks at keep_going while the child walks.
constexpr std::chrono::milliseconds kPollSlice{100};
// Attempts of a read-modify-write of the record before giving up.
constexpr int kUpdateAttempts = 20;

bool WriteFull(int fd, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

std::string OwnerText(const DatasetOwner& owner) {
  return "uid " + std::to_string(owner.uid) + " gid " + std::to_string(owner.gid);
}

// What the child is asked to do.
struct WalkRequest {
  bool switch_identity = false;
  Identity identity;  // when switch_identity
  int64_t parent_pid = 0;
  ManifestBuildOptions build;  // without on_progress
};

std::string EncodeRequest(const WalkRequest& r) {
  return json{{"switch_identity", r.switch_identity},
              {"uid", r.identity.uid},
              {"gid", r.identity.gid},
              {"groups", r.identity.groups},
              {"parent_pid", r.parent_pid},
              {"source_root", r.build.source_root},
              {"source_uri", r.build.source_uri},
              {"include", r.build.include},
              {"exclude", r.build.exclude},
              {"chunk_size", r.build.chunk_size},
              {"threads", r.build.threads}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<WalkRequest> DecodeRequest(std::string_view text) {
  try {
    const json j = json::parse(text);
    WalkRequest r;
    r.switch_identity = j.at("switch_identity").get<bool>();
    r.identity.uid = j.at("uid").get<uint32_t>();
    r.identity.gid = j.at("gid").get<uint32_t>();
    r.identity.groups = j.at("groups").get<std::vector<uint32_t>>();
    r.parent_pid = j.at("parent_pid").get<int64_t>();
    r.build.source_root = j.at("source_root").get<std::string>();
    r.build.source_uri = j.at("source_uri").get<std::string>();
    r.build.include = j.at("include").get<std::vector<std::string>>();
    r.build.exclude = j.at("exclude").get<std::vector<std::string>>();
    r.build.chunk_size = j.at("chunk_size").get<uint64_t>();
    r.build.threads = j.at("threads").get<unsigned>();
    return r;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("the snapshot request is not valid: ") + e.what());
  }
}

// The root must be a directory the walking identity may list: said plainly
// here, because BuildManifest's own errors do not name the identity.
Status CheckRoot(const std::string& root, uint32_t uid) {
  const std::string as = "uid " + std::to_string(uid);
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR) {
      return Status::NotFound(Quoted(root) + " does not exist (" + ErrnoText(e) + ")");
    }
    if (e == EACCES || e == EPERM) {
      return Status::PermissionDenied(as + " may not reach " + Quoted(root) +
                                      ": no search right on a directory above it (" + ErrnoText(e) +
                                      ")");
    }
    return Status::FromErrno(e, "stat " + Quoted(root));
  }
  if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument(Quoted(root) + " is not a directory");
  const int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == EACCES || e == EPERM) {
      return Status::PermissionDenied(as + " may not read the directory " + Quoted(root) + " (" +
                                      ErrnoText(e) + ")");
    }
    return Status::FromErrno(e, "open the directory " + Quoted(root));
  }
  ::close(fd);
  return Status::Ok();
}

// A dataset's source path passes through no symbolic link (checked as the
// owner, and again by BuildManifest's O_NOFOLLOW open of the root, so a link
// put there in between is refused too): docs/source-and-identity.md, "Source
// paths and symbolic links".
Result<Manifest> CheckAndWalk(ManifestBuildOptions options, uint32_t uid) {
  GRANARY_RETURN_IF_ERROR(RefuseSymlinkInPath(options.source_root));
  GRANARY_RETURN_IF_ERROR(CheckRoot(options.source_root, uid));
  options.follow_root_symlinks = false;
  return BuildManifest(options);
}

std::string ErrorAnswer(const Status& s) {
  std::string answer = "E";
  answer.push_back(static_cast<char>(s.code()));
  answer += s.message();
  return answer;
}

// The child's whole life: become the owner, walk, answer on `out`. Returns
// the exit status. Runs in a fresh process (helper) or right after fork() of a
// single-threaded parent.
int WalkInChild(const WalkRequest& request, int out) {
  const Identity& id = request.identity;
  if (request.switch_identity) {
    std::vector<gid_t> groups(id.groups.begin(), id.groups.end());
    if (groups.empty()) groups.push_back(id.gid);
    // Supplementary groups first, then the gid, then the uid: once the uid is
    // not 0 any more, the other two cannot be changed.
    if (::setgroups(groups.size(), groups.data()) != 0 || ::setgid(id.gid) != 0 ||
        ::setuid(id.uid) != 0) {
      const int e = errno;
      return WriteFull(out, ErrorAnswer(Status::PermissionDenied("cannot become " + id.ToString() +
                                                                 ": " + ErrnoText(e))))
                 ? 0
                 : 1;
    }
    if (::getuid() != id.uid || ::geteuid() != id.uid || ::getgid() != id.gid ||
        ::getegid() != id.gid) {
      return WriteFull(out, ErrorAnswer(Status::PermissionDenied("the switch to " + id.ToString() +
                                                                 " did not take effect")))
                 ? 0
                 : 1;
    }
  }
  // Die with the thread that waits for this process. Set after the switch: a
  // change of credentials clears it.
  (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (static_cast<int64_t>(::getppid()) != request.parent_pid) return 1;  // orphaned already

  ManifestBuildOptions options = request.build;
  options.on_progress = [out](uint64_t files, uint64_t dirs) {
    std::string p(kProgressRecordSize, 'P');
    StoreLe<uint64_t>(p.data() + 1, files);
    StoreLe<uint64_t>(p.data() + 9, dirs);
    (void)WriteFull(out, p);
  };
  Result<Manifest> manifest = CheckAndWalk(options, request.switch_identity ? id.uid : ::geteuid());
  const std::string answer =
      manifest.ok() ? "M" + manifest->Encode() : ErrorAnswer(manifest.status());
  return WriteFull(out, answer) ? 0 : 1;
}

// Closes every descriptor but 0, 1, 2, `in_fd` and `out_fd`: whatever the
// process that spawned the helper did not mark close-on-exec.
void CloseOtherDescriptors(int in_fd, int out_fd) {
  std::vector<int> open;
  if (DIR* d = ::opendir("/proc/self/fd"); d != nullptr) {
    const int own = ::dirfd(d);
    while (const dirent* e = ::readdir(d)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0') continue;
      if (fd > STDERR_FILENO && fd != in_fd && fd != out_fd && fd != own) {
        open.push_back(static_cast<int>(fd));
      }
    }
    ::closedir(d);
  }
  for (int fd : open) ::close(fd);
}

std::string ExitText(int wstatus) {
  if (WIFEXITED(wstatus)) return "exit status " + std::to_string(WEXITSTATUS(wstatus));
  if (WIFSIGNALED(wstatus)) return "killed by signal " + std::to_string(WTERMSIG(wstatus));
  return "status " + std::to_string(wstatus);
}

int Reap(pid_t pid) {
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  return wstatus;
}

// Reads the child's progress and answer until it closes its end, then reaps
// it. keep_going returning false kills it.
Result<Manifest> AwaitChild(pid_t pid, ScopedFd from_child, const std::string& who,
                            const std::function<void(uint64_t, uint64_t)>& on_progress,
                            const std::function<bool()>& keep_going) {
  std::string payload;
  bool final_message = false;
  std::string failure;
  char buffer[1 << 16];
  for (;;) {
    if (keep_going && !keep_going()) {
      ::kill(pid, SIGKILL);
      (void)Reap(pid);
      return Status::Unavailable("the walk of the source as " + who + " was abandoned");
    }
    pollfd p{from_child.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(kPollSlice.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      failure = "poll: " + ErrnoText(errno);
      break;
    }
    if (ready == 0) continue;
    const ssize_t n = ::read(from_child.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      failure = "read: " + ErrnoText(errno);
      break;
    }
    if (n == 0) break;
    payload.append(buffer, static_cast<size_t>(n));
    // Progress records are consumed as they come; the final message is kept.
    size_t at = 0;
    while (!final_message && at < payload.size()) {
      if (payload[at] != 'P') {
        final_message = true;
        break;
      }
      if (payload.size() - at < kProgressRecordSize) break;
      if (on_progress) {
        on_progress(LoadLe<uint64_t>(payload.data() + at + 1),
                    LoadLe<uint64_t>(payload.data() + at + 9));
      }
      at += kProgressRecordSize;
    }
    payload.erase(0, at);
    if (payload.size() > kMaxAnswerBytes) {
      failure = "its answer is larger than " + std::to_string(kMaxAnswerBytes) + " bytes";
      break;
    }
  }
  if (!failure.empty()) ::kill(pid, SIGKILL);
  from_child.Reset();
  const int wstatus = Reap(pid);
  if (!failure.empty() || payload.empty() || (payload[0] != 'M' && payload[0] != 'E')) {
    return Status::Internal("the snapshot process (" + who + ") ended without an answer (" +
                            (failure.empty() ? ExitText(wstatus) : failure) +
                            "); take the snapshot again");
  }
  if (payload[0] == 'E') {
    if (payload.size() < 2 || static_cast<uint8_t>(payload[1]) == 0 ||
        static_cast<uint8_t>(payload[1]) > static_cast<uint8_t>(StatusCode::kInternal)) {
      return Status::Internal("the snapshot process (" + who + ") answered a malformed error");
    }
    return Status(static_cast<StatusCode>(static_cast<uint8_t>(payload[1])), payload.substr(2));
  }
  return Manifest::Decode(std::string_view(payload).substr(1));
}

Result<Manifest> ForkAndWalk(const WalkRequest& request, const std::string& who,
                             const std::function<void(uint64_t, uint64_t)>& on_progress,
                             const std::function<bool()>& keep_going) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe for the snapshot");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return Status::FromErrno(e, "fork the snapshot process");
  }
  if (pid == 0) {
    ::close(fds[0]);
    ::_exit(WalkInChild(request, fds[1]));
  }
  ::close(fds[1]);
  return AwaitChild(pid, ScopedFd(fds[0]), who, on_progress, keep_going);
}

Result<Manifest> SpawnAndWalk(const WalkRequest& request, const std::vector<std::string>& argv,
                              const std::string& who,
                              const std::function<void(uint64_t, uint64_t)>& on_progress,
                              const std::function<bool()>& keep_going) {
  const std::string text = EncodeRequest(request);
  if (text.size() > kMaxRequestBytes) {
    return Status::InvalidArgument("the snapshot request is " + std::to_string(text.size()) +
                                   " bytes, more than " + std::to_string(kMaxRequestBytes) +
                                   "; shorten the include and exclude lists");
  }
  int to_child[2];
  int from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe for the snapshot");
  ScopedFd to_read(to_child[0]);
  ScopedFd to_write(to_child[1]);
  if (::pipe2(from_child, O_CLOEXEC) != 0) {
    return Status::FromErrno(errno, "pipe for the snapshot");
  }
  ScopedFd answer_read(from_child[0]);
  ScopedFd answer_write(from_child[1]);
  // The whole request goes into the pipe before the child exists, so writing
  // it can neither block nor raise SIGPIPE.
  if (text.size() > 60'000 &&
      ::fcntl(to_write.get(), F_SETPIPE_SZ, static_cast<int>(kMaxRequestBytes)) < 0) {
    return Status::FromErrno(errno, "size the snapshot request pipe");
  }
  if (!WriteFull(to_write.get(), text)) return Status::FromErrno(errno, "write the request");
  to_write.Reset();

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawnattr_init(&attr);
  ::posix_spawn_file_actions_adddup2(&actions, to_read.get(), STDIN_FILENO);
  ::posix_spawn_file_actions_adddup2(&actions, answer_write.get(), STDOUT_FILENO);
#if defined(__GLIBC_PREREQ) && __GLIBC_PREREQ(2, 34)
  // Nothing else of the parent's (chunk files, sockets) reaches the helper
  // (RunSnapshotChild closes them too, for older C libraries).
  ::posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
#endif
  // The daemon blocks its stop signals in every thread and may ignore SIGPIPE:
  // the helper starts with an empty mask and default dispositions.
  sigset_t none;
  sigset_t defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP}) sigaddset(&defaults, sig);
  ::posix_spawnattr_setsigmask(&attr, &none);
  ::posix_spawnattr_setsigdefault(&attr, &defaults);
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, args[0], &actions, &attr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attr);
  if (rc != 0) return Status::FromErrno(rc, "start the snapshot helper " + Quoted(argv[0]));
  to_read.Reset();
  answer_write.Reset();
  return AwaitChild(pid, std::move(answer_read), who, on_progress, keep_going);
}

}  // namespace

Result<Manifest> SnapshotAsOwner(const DatasetOwner& owner, ManifestBuildOptions options,
                                 const SnapshotProcess& process) {
  const uint32_t euid = ::geteuid();
  if (euid != 0 && owner.uid != euid) {
    return Status::PermissionDenied(
        "this process runs as uid " + std::to_string(euid) +
        ", not as root, so it can walk a source only as itself, and the dataset belongs to " +
        OwnerText(owner) + "; run it as root or as uid " + std::to_string(owner.uid));
  }
  WalkRequest request;
  request.switch_identity = euid == 0 && owner.uid != 0;
  request.identity.uid = owner.uid;
  request.identity.gid = owner.gid;
  request.identity.groups = {owner.gid};
  if (request.switch_identity) {
    GRANARY_ASSIGN_OR_RETURN(request.identity, ResolveOwnerIdentity(owner.uid, owner.gid));
  }
  const std::string who = request.identity.ToString();
  if (!request.switch_identity && process.helper_argv.empty()) {
    return CheckAndWalk(options, euid);
  }
  request.parent_pid = ::getpid();
  std::function<void(uint64_t, uint64_t)> on_progress = std::move(options.on_progress);
  options.on_progress = nullptr;
  request.build = std::move(options);
  if (process.helper_argv.empty()) {
    return ForkAndWalk(request, who, on_progress, process.keep_going);
  }
  return SpawnAndWalk(request, process.helper_argv, who, on_progress, process.keep_going);
}

int RunSnapshotChild(int in_fd, int out_fd) {
  CloseOtherDescriptors(in_fd, out_fd);
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(in_fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return WriteFull(out_fd, ErrorAnswer(Status::FromErrno(errno, "read the snapshot request")))
                 ? 0
                 : 1;
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (text.size() > kMaxRequestBytes) {
      return WriteFull(
                 out_fd,
                 ErrorAnswer(Status::InvalidArgument("the snapshot request is larger than " +
                                                     std::to_string(kMaxRequestBytes) + " bytes")))
                 ? 0
                 : 1;
    }
  }
  Result<WalkRequest> request = DecodeRequest(text);
  if (!request.ok()) return WriteFull(out_fd, ErrorAnswer(request.status())) ? 0 : 1;
  return WalkInChild(*request, out_fd);
}

// ---- the snapshot of a dataset record -------------------------------------------

std::string_view SnapshotOutcomeName(SnapshotOutcome outcome) {
  switch (outcome) {
    case SnapshotOutcome::kSnapshotted:
      return "ok";
    case SnapshotOutcome::kFailed:
      return "failed";
    case SnapshotOutcome::kNotClaimed:
      return "not_claimed";
    case SnapshotOutcome::kSuperseded:
      return "superseded";
    case SnapshotOutcome::kAbandoned:
      return "abandoned";
  }
  return "unknown";
}

std::string SnapshotFailureMessage(const DatasetRecord& record, const Status& error,
                                   const std::string& claimant) {
  const std::string again = claimant.empty()
                                ? "then `granary dataset snapshot " + record.name + "`"
                                : "then ask for a new snapshot (`granary dataset snapshot " +
                                      record.name + "`, or set the phase to Pending)";
  std::string hint;
  switch (error.code()) {
    case StatusCode::kNotFound:
      hint = claimant.empty()
                 ? "check the path, " + again
                 : "check that the source is mounted at that path on the cache nodes of pool " +
                       record.spec.pool + " (a CachePool's sourceMounts), " + again;
      break;
    case StatusCode::kInvalidArgument:
      hint = "point the dataset at a directory, " + again;
      break;
    case StatusCode::kPermissionDenied:
      hint = "give uid " + std::to_string(record.owner.uid) +
             " read and search rights on the source (mode bits or an ACL), or make the "
             "dataset's owner a user who has them, " +
             again;
      break;
    default:
      hint = "fix the cause, " + again;
      break;
  }
  return "snapshot failed: source " + record.spec.source_uri + " as " + OwnerText(record.owner) +
         (claimant.empty() ? "" : " on node " + claimant) + ": " + error.message() + "; " + hint;
}

namespace {

// Whether `current` is still the snapshot taken by `claimant`.
bool StillClaimed(const DatasetRecord& current, const std::string& claimant) {
  return current.state.phase == DatasetPhase::kSnapshotting && current.state.claimed_by == claimant;
}

// The parts of a record a manifest is built from.
bool SameSnapshotInputs(const DatasetRecord& a, const DatasetRecord& b) {
  return a.spec.source_uri == b.spec.source_uri && a.spec.include == b.spec.include &&
         a.spec.exclude == b.spec.exclude && a.spec.chunk_size == b.spec.chunk_size &&
         a.owner == b.owner;
}

enum class WriteResult { kWritten, kNotOurs };

// Re-reads the record and, while it is still this snapshot's, applies
// `change` with compare-and-set (re-reading on a conflict).
Result<WriteResult> WriteIfClaimed(MetadataStore& store, const std::string& name,
                                   const std::string& claimant,
                                   const std::function<void(DatasetRecord&)>& change,
                                   DatasetRecord* written) {
  for (int attempt = 0; attempt < kUpdateAttempts; ++attempt) {
    Result<DatasetRecord> current = store.GetDataset(name);
    if (!current.ok()) {
      if (current.status().code() == StatusCode::kNotFound) return WriteResult::kNotOurs;
      return current.status();
    }
    if (!StillClaimed(*current, claimant)) {
      *written = *current;
      return WriteResult::kNotOurs;
    }
    change(*current);
    Result<DatasetRecord> updated = store.UpdateDataset(*current);
    if (updated.ok()) {
      *written = *updated;
      return WriteResult::kWritten;
    }
    if (updated.status().code() == StatusCode::kNotFound) return WriteResult::kNotOurs;
    if (updated.status().code() != StatusCode::kFailedPrecondition) return updated.status();
  }
  return Status::FailedPrecondition("dataset " + Quoted(name) +
                                    " kept changing under the snapshot's update; take it again");
}

}  // namespace

Result<DatasetSnapshot> SnapshotDataset(MetadataStore& store, const DatasetRecord& record,
                                        const DatasetSnapshotOptions& options) {
  const std::string& claimant = options.claimant;
  const bool node = !claimant.empty();
  const std::string what = "snapshot of dataset " + Quoted(record.name);
  DatasetSnapshot out;
  const std::string walking =
      node ? "node " + claimant + " is walking the source as " + OwnerText(record.owner)
           : "walking the source to build the manifest";

  // 1. Claim: phase Snapshotting.
  DatasetRecord claimed = record;
  for (int attempt = 0;; ++attempt) {
    DatasetRecord change = claimed;
    change.state = {DatasetPhase::kSnapshotting, walking, claimant};
    Result<DatasetRecord> updated = store.UpdateDataset(change);
    if (updated.ok()) {
      claimed = *updated;
      break;
    }
    if (updated.status().code() != StatusCode::kFailedPrecondition) {
      return updated.status().WithContext(what + ": setting phase Snapshotting");
    }
    if (node) {
      out.outcome = SnapshotOutcome::kNotClaimed;
      out.record = record;
      return out;
    }
    if (attempt + 1 >= kUpdateAttempts) {
      return Status::FailedPrecondition("dataset " + Quoted(record.name) +
                                        " kept changing under this update; try again");
    }
    GRANARY_ASSIGN_OR_RETURN(claimed, store.GetDataset(record.name));
  }
  out.record = claimed;

  // 2. Walk.
  GRANARY_ASSIGN_OR_RETURN(std::string root, PosixSource::RootFromUri(claimed.spec.source_uri));
  ManifestBuildOptions build;
  build.source_root = root;
  build.source_uri = claimed.spec.source_uri;
  build.include = claimed.spec.include;
  build.exclude = claimed.spec.exclude;
  build.chunk_size = claimed.spec.chunk_size;
  build.threads = options.walk_threads;
  uint64_t files_seen = 0;
  uint64_t dirs_seen = 0;
  build.on_progress = [&](uint64_t files, uint64_t dirs) {
    files_seen = files;
    dirs_seen = dirs;
    if (options.on_progress) options.on_progress(files, dirs);
  };
  bool stopped = false;
  bool superseded = false;
  auto next_check = SteadyClock::now() + options.check_interval;
  auto next_progress = SteadyClock::now() + options.progress_interval;
  uint64_t files_written = 0;
  SnapshotProcess process = options.process;
  process.keep_going = [&]() {
    if (options.stop != nullptr && options.stop->load()) {
      stopped = true;
      return false;
    }
    if (!node || SteadyClock::now() < next_check) return true;
    next_check = SteadyClock::now() + options.check_interval;
    Result<DatasetRecord> current = store.GetDataset(claimed.name);
    if (!current.ok()) {
      // Deleted: nobody wants the result. Unreachable: keep walking; the
      // final write decides.
      superseded = current.status().code() == StatusCode::kNotFound;
      return !superseded;
    }
    if (!StillClaimed(*current, claimant) || !SameSnapshotInputs(*current, claimed)) {
      superseded = true;
      return false;
    }
    if (files_seen != files_written && SteadyClock::now() >= next_progress) {
      next_progress = SteadyClock::now() + options.progress_interval;
      current->state.message = walking + ": " + std::to_string(files_seen) + " files, " +
                               std::to_string(dirs_seen) + " directories so far";
      // A conflict only means someone else wrote: the next check looks again.
      if (store.UpdateDataset(*current).ok()) files_written = files_seen;
    }
    return true;
  };
  const auto start = SteadyClock::now();
  Result<Manifest> manifest = SnapshotAsOwner(claimed.owner, build, process);
  out.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();

  if (stopped) {
    // 3a. Stopping: give the claim back so another node takes it at once.
    out.outcome = SnapshotOutcome::kAbandoned;
    GRANARY_ASSIGN_OR_RETURN(
        WriteResult w, WriteIfClaimed(
                           store, claimed.name, claimant,
                           [&](DatasetRecord& r) {
                             r.state = {DatasetPhase::kPending,
                                        (node ? "node " + claimant : std::string("the client")) +
                                            " stopped during the snapshot; it is taken again",
                                        ""};
                           },
                           &out.record));
    (void)w;
    return out;
  }
  if (superseded) {
    // Still this claim, but the spec or the owner changed: give it back, so
    // that it is taken again from the new inputs.
    out.outcome = SnapshotOutcome::kSuperseded;
    GRANARY_ASSIGN_OR_RETURN(WriteResult w, WriteIfClaimed(
                                                store, claimed.name, claimant,
                                                [&](DatasetRecord& r) {
                                                  r.state = {
                                                      DatasetPhase::kPending,
                                                      "the spec changed during the snapshot; it is "
                                                      "taken again",
                                                      ""};
                                                },
                                                &out.record));
    (void)w;
    return out;
  }

  // 3b. The record must still be this snapshot's, with the inputs it was
  // taken from; otherwise the result is dropped.
  auto finish = [&](const std::function<void(DatasetRecord&)>& change) -> Result<bool> {
    bool inputs_changed = false;
    GRANARY_ASSIGN_OR_RETURN(WriteResult w, WriteIfClaimed(
                                                store, claimed.name, claimant,
                                                [&](DatasetRecord& r) {
                                                  inputs_changed =
                                                      node && !SameSnapshotInputs(r, claimed);
                                                  if (inputs_changed) {
                                                    r.state = {DatasetPhase::kPending,
                                                               "the spec changed during the "
                                                               "snapshot; it is taken again",
                                                               ""};
                                                  } else {
                                                    change(r);
                                                  }
                                                },
                                                &out.record));
    return w == WriteResult::kWritten && !inputs_changed;
  };

  if (!manifest.ok()) {
    out.error = manifest.status();
    const std::string message = SnapshotFailureMessage(claimed, manifest.status(), claimant);
    GRANARY_ASSIGN_OR_RETURN(bool written, finish([&](DatasetRecord& r) {
                               r.state = {DatasetPhase::kFailed, message, ""};
                             }));
    out.outcome = written ? SnapshotOutcome::kFailed : SnapshotOutcome::kSuperseded;
    return out;
  }

  out.manifest_id = manifest->id().ToHex();
  out.files = manifest->sample_count();
  out.bytes = manifest->total_bytes();
  out.chunks = manifest->chunk_count();
  out.summary = std::to_string(out.files) + " files, " + HumanBytes(out.bytes) + ", " +
                std::to_string(out.chunks) + " chunks";
  // Links the source's reads would refuse are not samples: say how many were
  // left out, so a missing file is explained here rather than found later.
  if (const uint64_t links = manifest->header().stats.skipped_symlinks; links > 0) {
    out.summary += "; " + std::to_string(links) + " symbolic link" + (links == 1 ? "" : "s") +
                   " left out (absolute, leaving the source, to a directory, a loop or dangling)";
  }
  Status put = store.PutManifest(out.manifest_id, manifest->Encode());
  if (!put.ok() && put.code() == StatusCode::kUnavailable) {
    return put.WithContext(what + ": storing manifest " + out.manifest_id);
  }
  if (!put.ok()) {
    // Refused for good (e.g. larger than kMaxManifestBytes): taking the
    // snapshot again would not help.
    out.error = Status(StatusCode::kResourceExhausted,
                       "the store refused the manifest (" + out.summary + "): " + put.message());
    const std::string message = SnapshotFailureMessage(claimed, out.error, claimant);
    GRANARY_ASSIGN_OR_RETURN(bool written, finish([&](DatasetRecord& r) {
                               r.state = {DatasetPhase::kFailed, message, ""};
                             }));
    out.outcome = written ? SnapshotOutcome::kFailed : SnapshotOutcome::kSuperseded;
    return out;
  }
  GRANARY_ASSIGN_OR_RETURN(bool written, finish([&](DatasetRecord& r) {
                             r.manifest_id = out.manifest_id;
                             r.state = {DatasetPhase::kStaging, "snapshot: " + out.summary, ""};
                           }));
  out.outcome = written ? SnapshotOutcome::kSnapshotted : SnapshotOutcome::kSuperseded;
  return out;
}

}  // namespace granary
