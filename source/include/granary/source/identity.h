#pragma once

// Identity and IdentityExecutor: running file access with the rights of a
// dataset's owner, so that no one can stage data they could not read
// themselves (DESIGN.md, "Failure and security model"; docs/source-and-identity.md).
//
// A dataset records its owner's uid and gid (DatasetOwner in metadata_store.h).
// ResolveOwnerIdentity turns that into an Identity: the uid, the primary gid and
// the supplementary groups the user database (NSS) lists for that user. An
// IdentityExecutor runs closures that touch the source file system on threads
// of its own whose file-system identity is the one asked for:
//   - Linux keeps credentials per thread at the system-call level. A worker
//     switches with the raw setgroups(2), setfsgid(2) and setfsuid(2) system
//     calls, never glibc's setgroups()/setuid() wrappers, which broadcast the
//     change to every thread of the process. Only the worker's fsuid, fsgid and
//     supplementary groups change; its real/effective uid stays the process's.
//   - A switch is verified before the closure runs: setfsuid/setfsgid return
//     the previous value and report no failure, so each is called twice and the
//     second return must be the id asked for; getgroups(2) must return the
//     list asked for. A switch that cannot be verified refuses the closure
//     (kPermissionDenied); the closure never runs with a wrong identity.
//   - Workers belong to the executor and run nothing else, so a switched
//     identity never reaches a thread that other code shares. A worker keeps
//     its last identity between closures (switching only when the next closure
//     asks for another) and it ends with the thread.
//   - The kernel checks every permission (mode bits, POSIX ACLs, search rights
//     on directories) against the fsuid, fsgid and groups. Setting a non-zero
//     fsuid also drops root's file capabilities (CAP_DAC_OVERRIDE,
//     CAP_DAC_READ_SEARCH, ...) from the worker, so root's override is gone.
// Switching needs CAP_SETUID and CAP_SETGID (a cache node running as root).
// Without them the process can only read as itself: an Identity whose uid is
// not the process's effective uid, or whose gid is not among the process's
// groups, is refused with kPermissionDenied explaining why; an allowed one runs
// with the process's own credentials (and its own group list).
//
// Callers: PosixSource (posix_source.h) runs every open and read of a source
// through an executor; the cache node creates one executor at start-up and
// shares it between its sources.
//
// Thread safety: Identity is a value. ResolveOwnerIdentity and ProcessIdentity
// may be called from any thread. IdentityExecutor::Run and Counters may be
// called from any number of threads at once; it must outlive every caller, and
// nothing else in the process may call glibc's setuid/setgid/setgroups family
// while it runs (their broadcast would overwrite the workers' identities).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "granary/core/status.h"

namespace granary {

// (uid_t)-1 and (gid_t)-1 mean "no change" to the kernel: never an identity.
inline constexpr uint32_t kInvalidId = 0xffffffffu;
// NGROUPS_MAX on Linux.
inline constexpr size_t kMaxSupplementaryGroups = 65536;

// Whose rights a file access uses.
struct Identity {
  uint32_t uid = 0;
  uint32_t gid = 0;              // primary group (the fsgid)
  std::vector<uint32_t> groups;  // supplementary groups, sorted and unique
  std::string name;              // user name from NSS, for messages; may be empty

  // "uid 65534 ('nobody') gid 65534, 1 supplementary group".
  std::string ToString() const;

  friend bool operator==(const Identity&, const Identity&) = default;
};

// kInvalidArgument if an id is kInvalidId, a group repeats or is out of order,
// or there are more than kMaxSupplementaryGroups groups.
Status ValidateIdentity(const Identity& identity);

// The identity of a dataset owner: `uid`, `gid`, and the supplementary groups
// getgrouplist(3) gives for the user name getpwuid_r(3) finds for `uid` (which
// include `gid`). A uid the user database does not know gets no groups but
// `gid`: the fewest rights, never more than the owner has. kInvalidArgument
// for kInvalidId; kUnavailable if the user database fails (retry).
Result<Identity> ResolveOwnerIdentity(uint32_t uid, uint32_t gid);

// The identity of a local user known only by uid (a peer's SO_PEERCRED): the
// primary gid from the user database's entry, then as ResolveOwnerIdentity.
// kNotFound when the user database has no entry for `uid` (its groups cannot
// be known); kUnavailable if the user database fails (retry).
Result<Identity> ResolveUserIdentity(uint32_t uid);

// The calling thread's effective uid and gid and its supplementary groups.
Identity ProcessIdentity();

struct IdentityExecutorOptions {
  // Worker threads: closures running at once, whatever their identity. 1..1024.
  unsigned threads = 8;
};

// Monotonic counts since Start (a snapshot).
struct IdentityExecutorCounters {
  uint64_t runs = 0;             // closures run
  uint64_t switches = 0;         // identity switches made and verified
  uint64_t switch_failures = 0;  // switches that failed or did not verify (closure refused)
  uint64_t refused = 0;          // identities refused without trying (invalid, not allowed)
};

class IdentityExecutor {
 public:
  // Starts the workers. Whether it can switch identities is decided here, from
  // the calling thread's effective capabilities (CAP_SETUID and CAP_SETGID).
  static Result<std::unique_ptr<IdentityExecutor>> Start(const IdentityExecutorOptions& options);

  // Waits for closures already queued to finish, then joins the workers. No Run
  // may start once destruction has begun.
  ~IdentityExecutor();
  IdentityExecutor(const IdentityExecutor&) = delete;
  IdentityExecutor& operator=(const IdentityExecutor&) = delete;

  // True when workers switch identities (CAP_SETUID and CAP_SETGID); false when
  // only the process's own identity is possible.
  bool can_switch() const { return can_switch_; }
  // The identity the process had at Start.
  const Identity& process_identity() const { return process_; }
  unsigned threads() const { return static_cast<unsigned>(workers_.size()); }

  // OK if Run would accept `who` (see the top of this file), else the
  // kInvalidArgument or kPermissionDenied that Run would return.
  Status CheckAllowed(const Identity& who) const;

  // Runs `fn` (callable as Status()) on a worker whose file-system identity is
  // `who`, blocking until it returns, and returns its Status. `fn` is not run
  // if `who` is not allowed or the switch fails; that Status is returned
  // instead. `fn` runs with the worker's identity: it should touch files and
  // nothing else (no locks the caller holds, no Run of its own: that could
  // wait for itself when every worker is busy).
  template <typename F>
  Status Run(const Identity& who, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    return RunErased(
        who, [](void* f) -> Status { return (*static_cast<Fn*>(f))(); },
        const_cast<void*>(static_cast<const void*>(std::addressof(fn))));
  }

  IdentityExecutorCounters Counters() const;

 private:
  struct Task {
    const Identity* who = nullptr;
    Status (*thunk)(void*) = nullptr;
    void* arg = nullptr;
    Status result;
    // The worker sets `finished` and notifies under `mu`, so the caller (whose
    // stack holds the task) cannot return before the worker lets go of it.
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;  // guarded by mu
  };

  IdentityExecutor(bool can_switch, Identity process);
  Status RunErased(const Identity& who, Status (*thunk)(void*), void* arg);
  void WorkerLoop();

  const bool can_switch_;
  const Identity process_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task*> queue_;  // guarded by mu_; bounded by the callers blocked in Run
  bool stopping_ = false;    // guarded by mu_
  std::vector<std::thread> workers_;

  std::atomic<uint64_t> runs_{0};
  std::atomic<uint64_t> switches_{0};
  std::atomic<uint64_t> switch_failures_{0};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace granary
