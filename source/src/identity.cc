#include "granary/source/identity.h"

#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/core/thread_name.h"

namespace granary {
namespace {

// 32-bit-id system calls: on i386 and 32-bit Arm the plain numbers take 16-bit ids.
#ifdef SYS_setfsuid32
constexpr long kSysSetfsuid = SYS_setfsuid32;
constexpr long kSysSetfsgid = SYS_setfsgid32;
constexpr long kSysSetgroups = SYS_setgroups32;
constexpr long kSysGetgroups = SYS_getgroups32;
#else
constexpr long kSysSetfsuid = SYS_setfsuid;
constexpr long kSysSetfsgid = SYS_setfsgid;
constexpr long kSysSetgroups = SYS_setgroups;
constexpr long kSysGetgroups = SYS_getgroups;
#endif

constexpr size_t kMaxNssBuffer = 1u << 20;
constexpr int kMaxGrouplistAttempts = 8;

// The calling thread's supplementary groups, straight from the kernel.
Result<std::vector<uint32_t>> ThreadGroups() {
  for (int attempt = 0; attempt < 4; ++attempt) {
    long n = ::syscall(kSysGetgroups, 0, nullptr);
    if (n < 0) return Status::FromErrno(errno, "getgroups");
    std::vector<gid_t> buf(static_cast<size_t>(n));
    long got = ::syscall(kSysGetgroups, static_cast<int>(buf.size()), buf.data());
    if (got < 0) {
      if (errno == EINVAL) continue;  // the list grew in between
      return Status::FromErrno(errno, "getgroups");
    }
    buf.resize(static_cast<size_t>(got));
    return std::vector<uint32_t>(buf.begin(), buf.end());
  }
  return Status::Internal("getgroups: the group list kept changing while it was read");
}

void Normalize(std::vector<uint32_t>* groups) {
  std::sort(groups->begin(), groups->end());
  groups->erase(std::unique(groups->begin(), groups->end()), groups->end());
}

// The user name for `uid`; empty if the database has no entry. kUnavailable if
// the lookup itself failed. `primary_gid`, when given, gets the entry's gid.
Result<std::string> UserName(uint32_t uid, uint32_t* primary_gid = nullptr) {
  std::vector<char> buf(1024);
  for (;;) {
    struct passwd pw {};
    struct passwd* found = nullptr;
    int rc = ::getpwuid_r(static_cast<uid_t>(uid), &pw, buf.data(), buf.size(), &found);
    if (rc == ERANGE && buf.size() < kMaxNssBuffer) {
      buf.resize(buf.size() * 2);
      continue;
    }
    if (rc == 0 && found != nullptr) {
      if (primary_gid != nullptr) *primary_gid = static_cast<uint32_t>(pw.pw_gid);
      return std::string(pw.pw_name != nullptr ? pw.pw_name : "");
    }
    // getpwuid_r(3): "not found" may be 0, ENOENT, ESRCH, EBADF or EPERM.
    if (rc == 0 || rc == ENOENT || rc == ESRCH || rc == EBADF || rc == EPERM) return std::string();
    return Status::Unavailable("look up uid " + std::to_string(uid) +
                               " in the user database (NSS): " + ErrnoText(rc) +
                               "; check /etc/nsswitch.conf and the directory service, then retry");
  }
}

bool HasSwitchCapabilities() {
  __user_cap_header_struct header{};
  header.version = _LINUX_CAPABILITY_VERSION_3;
  header.pid = 0;
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  auto has = [&](unsigned cap) { return (data[cap / 32].effective & (1u << (cap % 32))) != 0; };
  return has(CAP_SETUID) && has(CAP_SETGID);
}

// Sets the calling thread's fsuid/fsgid/groups to `who` and checks that the
// kernel applied each. On failure the thread's identity is unknown; the
// caller must not run anything as it until a later switch succeeds.
Status SwitchThreadIdentity(const Identity& who) {
  const std::string what = "switch a source thread to " + who.ToString();
  std::vector<gid_t> groups(who.groups.begin(), who.groups.end());
  if (::syscall(kSysSetgroups, groups.size(), groups.empty() ? nullptr : groups.data()) != 0) {
    int err = errno;
    return Status::PermissionDenied(what + ": setgroups: " + ErrnoText(err) +
                                    "; the cache node needs CAP_SETGID, and every group must be "
                                    "mapped in its user namespace");
  }
  // setfsgid/setfsuid return the previous id and never report failure: the
  // second call's return is the id in force after the first.
  ::syscall(kSysSetfsgid, static_cast<gid_t>(who.gid));
  long fsgid = ::syscall(kSysSetfsgid, static_cast<gid_t>(who.gid));
  if (fsgid != static_cast<long>(who.gid)) {
    return Status::PermissionDenied(what + ": the kernel kept fsgid " + std::to_string(fsgid) +
                                    "; the cache node needs CAP_SETGID, and the gid must be "
                                    "mapped in its user namespace");
  }
  ::syscall(kSysSetfsuid, static_cast<uid_t>(who.uid));
  long fsuid = ::syscall(kSysSetfsuid, static_cast<uid_t>(who.uid));
  if (fsuid != static_cast<long>(who.uid)) {
    return Status::PermissionDenied(what + ": the kernel kept fsuid " + std::to_string(fsuid) +
                                    "; the cache node needs CAP_SETUID, and the uid must be "
                                    "mapped in its user namespace");
  }
  auto now = ThreadGroups();
  if (!now.ok()) return now.status().WithContext(what);
  Normalize(&*now);
  if (*now != who.groups) {
    return Status::PermissionDenied(what + ": the kernel reports " + std::to_string(now->size()) +
                                    " supplementary groups, not the " +
                                    std::to_string(who.groups.size()) + " asked for");
  }
  return Status::Ok();
}

// True if the calling thread's fsuid and fsgid are still `who`'s.
bool StillSwitched(const Identity& who) {
  return ::syscall(kSysSetfsgid, static_cast<gid_t>(who.gid)) == static_cast<long>(who.gid) &&
         ::syscall(kSysSetfsuid, static_cast<uid_t>(who.uid)) == static_cast<long>(who.uid);
}

}  // namespace

std::string Identity::ToString() const {
  std::string s = "uid " + std::to_string(uid);
  if (!name.empty()) s += " (" + Quoted(name) + ")";
  s += " gid " + std::to_string(gid);
  s += ", " + std::to_string(groups.size()) +
       (groups.size() == 1 ? " supplementary group" : " supplementary groups");
  return s;
}

Status ValidateIdentity(const Identity& identity) {
  if (identity.uid == kInvalidId || identity.gid == kInvalidId) {
    return Status::InvalidArgument("identity " + identity.ToString() +
                                   ": uid and gid 4294967295 mean 'no change' to the kernel and "
                                   "cannot own a dataset; record the owner's real ids");
  }
  if (identity.groups.size() > kMaxSupplementaryGroups) {
    return Status::InvalidArgument("identity " + identity.ToString() + ": more than " +
                                   std::to_string(kMaxSupplementaryGroups) +
                                   " supplementary groups (the kernel's limit)");
  }
  for (size_t i = 0; i < identity.groups.size(); ++i) {
    if (identity.groups[i] == kInvalidId) {
      return Status::InvalidArgument("identity " + identity.ToString() +
                                     ": group 4294967295 is not a group");
    }
    if (i > 0 && identity.groups[i] <= identity.groups[i - 1]) {
      return Status::InvalidArgument(
          "identity " + identity.ToString() +
          ": supplementary groups must be sorted and unique (as ResolveOwnerIdentity makes them)");
    }
  }
  return Status::Ok();
}

Result<Identity> ResolveOwnerIdentity(uint32_t uid, uint32_t gid) {
  Identity id;
  id.uid = uid;
  id.gid = gid;
  if (uid == kInvalidId || gid == kInvalidId) return ValidateIdentity(id);
  GRANARY_ASSIGN_OR_RETURN(id.name, UserName(uid));
  if (id.name.empty()) {
    id.groups = {gid};
    return id;
  }
  int count = 64;
  for (int attempt = 0; attempt < kMaxGrouplistAttempts; ++attempt) {
    std::vector<gid_t> buf(static_cast<size_t>(count));
    int n = count;
    if (::getgrouplist(id.name.c_str(), static_cast<gid_t>(gid), buf.data(), &n) >= 0) {
      buf.resize(static_cast<size_t>(n));
      id.groups.assign(buf.begin(), buf.end());
      Normalize(&id.groups);
      if (id.groups.size() > kMaxSupplementaryGroups) id.groups.resize(kMaxSupplementaryGroups);
      return id;
    }
    // Too small: n is the size needed (glibc), or unchanged on some NSS modules.
    count = std::max(n, count * 2);
  }
  return Status::Unavailable("list the groups of user " + Quoted(id.name) + " (uid " +
                             std::to_string(uid) +
                             ") with getgrouplist: the list kept growing; check the directory "
                             "service and retry");
}

Result<Identity> ResolveUserIdentity(uint32_t uid) {
  uint32_t gid = kInvalidId;
  GRANARY_ASSIGN_OR_RETURN(std::string name, UserName(uid, &gid));
  // A passwd entry with an empty name cannot be asked for its groups either.
  if (name.empty() || gid == kInvalidId) {
    return Status::NotFound("uid " + std::to_string(uid) +
                            " has no entry in this host's user database (NSS), so its groups "
                            "cannot be known");
  }
  return ResolveOwnerIdentity(uid, gid);
}

Identity ProcessIdentity() {
  Identity id;
  id.uid = static_cast<uint32_t>(::geteuid());
  id.gid = static_cast<uint32_t>(::getegid());
  auto groups = ThreadGroups();
  if (groups.ok()) {
    id.groups = std::move(*groups);
    Normalize(&id.groups);
  }
  auto name = UserName(id.uid);
  if (name.ok()) id.name = std::move(*name);
  return id;
}

Result<std::unique_ptr<IdentityExecutor>> IdentityExecutor::Start(
    const IdentityExecutorOptions& options) {
  if (options.threads == 0 || options.threads > 1024) {
    return Status::InvalidArgument(
        "start the source identity executor: threads must be 1..1024, "
        "got " +
        std::to_string(options.threads));
  }
  std::unique_ptr<IdentityExecutor> executor(
      new IdentityExecutor(HasSwitchCapabilities(), ProcessIdentity()));
  executor->workers_.reserve(options.threads);
  for (unsigned i = 0; i < options.threads; ++i) {
    executor->workers_.emplace_back([e = executor.get()] {
      NameThisThread("identity");
      e->WorkerLoop();
    });
  }
  GetLogger("core")->debug(
      "identity executor: {} threads, {}", options.threads,
      executor->can_switch_ ? "switching identities" : "reading as the process only");
  return executor;
}

IdentityExecutor::IdentityExecutor(bool can_switch, Identity process)
    : can_switch_(can_switch), process_(std::move(process)) {}

IdentityExecutor::~IdentityExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

Status IdentityExecutor::CheckAllowed(const Identity& who) const {
  GRANARY_RETURN_IF_ERROR(ValidateIdentity(who));
  if (can_switch_) return Status::Ok();
  bool gid_ok = who.gid == process_.gid ||
                std::binary_search(process_.groups.begin(), process_.groups.end(), who.gid);
  if (who.uid == process_.uid && gid_ok) return Status::Ok();
  return Status::PermissionDenied(
      "access the source as " + who.ToString() + ": this process runs as " + process_.ToString() +
      " without CAP_SETUID and CAP_SETGID, so it can read files only with its own identity, and " +
      (who.uid != process_.uid ? std::string("the uid differs")
                               : std::string("the gid is not one of its groups")) +
      "; run the cache node as root (or with those capabilities) to stage other users' "
      "datasets, or as the dataset's owner");
}

Status IdentityExecutor::RunErased(const Identity& who, Status (*thunk)(void*), void* arg) {
  Status allowed = CheckAllowed(who);
  if (!allowed.ok()) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return allowed;
  }
  Task task;
  task.who = &who;
  task.thunk = thunk;
  task.arg = arg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(&task);
  }
  cv_.notify_one();
  std::unique_lock<std::mutex> lock(task.mu);
  task.cv.wait(lock, [&] { return task.finished; });
  return std::move(task.result);
}

void IdentityExecutor::WorkerLoop() {
  // The identity this thread holds now, if known and verified.
  std::unique_ptr<Identity> current;
  for (;;) {
    Task* task = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      task = queue_.front();
      queue_.pop_front();
    }
    const Identity& who = *task->who;
    Status ready;
    if (can_switch_ && !(current != nullptr && current->uid == who.uid && current->gid == who.gid &&
                         current->groups == who.groups && StillSwitched(who))) {
      current.reset();
      ready = SwitchThreadIdentity(who);
      if (ready.ok()) {
        current = std::make_unique<Identity>(who);
        switches_.fetch_add(1, std::memory_order_relaxed);
      } else {
        switch_failures_.fetch_add(1, std::memory_order_relaxed);
        GetLogger("core")->warn("{}", ready.message());
      }
    }
    if (ready.ok()) {
      runs_.fetch_add(1, std::memory_order_relaxed);
      task->result = task->thunk(task->arg);
    } else {
      task->result = std::move(ready);
    }
    {
      // `task` lives on the caller's stack: not touched after this block.
      std::lock_guard<std::mutex> lock(task->mu);
      task->finished = true;
      task->cv.notify_one();
    }
  }
}

IdentityExecutorCounters IdentityExecutor::Counters() const {
  IdentityExecutorCounters c;
  c.runs = runs_.load(std::memory_order_relaxed);
  c.switches = switches_.load(std::memory_order_relaxed);
  c.switch_failures = switch_failures_.load(std::memory_order_relaxed);
  c.refused = refused_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace granary
