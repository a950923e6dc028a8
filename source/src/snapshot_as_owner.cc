// SnapshotAsOwner and RunSnapshotChild (snapshot.h): walking a source as the
// dataset's owner, in this process or in a child that has become the owner
// (fork, or posix_spawn of a helper that reads its request as JSON on stdin),
// with progress and the encoded manifest sent back over a pipe. What the
// snapshot does with the dataset's record is in snapshot.cc.
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
#include "granary/core/names.h"
#include "granary/source/identity.h"
#include "granary/source/posix_source.h"
#include "granary/source/snapshot.h"

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

}  // namespace granary
