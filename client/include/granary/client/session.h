#pragma once

// Session: what a training process holds to read one dataset through the
// local granary-sidecar (libgranary-client; docs/client.md). It speaks the
// sidecar protocol (sidecar_protocol.h, docs/protocol.md "Sidecar protocol")
// over a Unix socket and maps the sidecar's shared-memory arena read-only, so
// sample bytes are read in place: no payload crosses the socket and none is
// copied unless the caller asks for a copy (Read).
//
//   auto session = Session::Open("imagenet");           // $GRANARY_SOCKET
//   GRANARY_ASSIGN_OR_RETURN(SampleView v, (*session)->Get(42));
//   Use(v.bytes());                                     // valid until released
//   (*session)->Release(v);
//
// Pins: every SampleView handed out pins its range of the arena in the
// sidecar until Release(view). Releases are queued and sent with the next GET
// or NEXT (or by Flush()), so releasing costs no round trip. Closing the
// session (or the process dying) drops every pin it held.
//
// Lookahead: Get() asks the sidecar for up to lookahead() samples that follow
// the requested one in an active plan of the dataset and are already in the
// arena ("hints"). They are kept in a small table, so a later Get() of one of
// them needs no round trip; hints not used are released, oldest first, once
// the table holds more than 2 × lookahead() or more than 1/kHintArenaShare of
// the arena in bytes, and all of them at close. lookahead() is
// options.lookahead, lowered for large samples so that half that byte budget
// holds it at the dataset's mean sample size: a pinned hint another reader has
// consumed cannot be evicted, so many sessions must not pin the arena full.
//
// Trust: a reply is checked before anything in it is used: request id, reply
// type, the ids asked for, and that every range lies inside the mapping (an
// out-of-range item becomes a kCorruption item), so a sidecar that lies makes a
// call fail, never makes the client read outside its mapping. The mapping's
// file must be at least as large as the arena (checked with fstat); the client
// also seals it against shrinking when the descriptor allows it.
//
// Direct reads: on the sidecar's host, a staged sample need not cross the
// sidecar. Read(id) (and the Python binding's copies) first ask the sidecar
// once per chunk (CHUNK_FILES, protocol version 3) for the local cache node's
// file of the sample's chunk: a read-only descriptor the node handed the
// sidecar, passed over the socket (SCM_RIGHTS), with where each staged sample
// lies in it and its XXH3-64. The client maps the file read-only; a sample is
// then verified with XXH3 in the map and copied (Read) or handed out as a view
// of the map (MapDirect: zero-copy); later samples of the same chunk need no
// round trip. The node unlinks chunk files and never truncates them, so a map
// (and a MappedSample's bytes) stays readable after the file is dropped.
// Anything else goes through the arena as before: a sample not staged yet, a
// chunk the sidecar does not hand over (the node does not have it; the
// client's uid is not root, the sidecar's or the dataset owner's), a sample
// said to lie past the end of its file, a file the node dropped (let go within
// a second, so the space is freed), and a checksum mismatch (counted, logged
// once, the chunk's file let go and the sample read through the sidecar,
// whose own verified read makes the node repair it). A descriptor is of one
// chunk of this dataset's snapshot, checked by the sidecar against the
// manifest; with the per-sample checksum no other bytes can be returned.
// Samples already known to be direct are read even after the sidecar went
// away (the bytes are verified); anything needing the sidecar then fails as
// below. Off with SessionOptions::direct_reads = false. docs/client.md,
// "Direct reads".
//
// Errors: a broken connection (the sidecar closed it, died, sent bytes that
// are not the protocol, or a call timed out) is kUnavailable naming the socket
// path, and the session stays broken: every later call fails the same way
// (open a new Session). Views already handed out stay mapped, but their pins
// are gone. An ERROR reply is that call's Status. A per-sample failure is that
// sample's Result.
//
// Fork: a Session belongs to the process that opened it. In a forked child
// every call fails kFailedPrecondition (open a new Session there), Release is
// a no-op, and destroying it only unmaps and closes its descriptor: the child
// never writes to the parent's connection.
//
// Thread safety: every method may be called from any thread. Calls that talk
// to the sidecar are serialised (one request in flight per session); Release
// never waits for one of them (it only queues), so it is safe from
// destructors.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "granary/core/file.h"
#include "granary/core/hash.h"
#include "granary/core/status.h"
#include "granary/protocol/sidecar_protocol.h"

namespace granary::client {

// Where the sidecar listens when neither the options nor $GRANARY_SOCKET say.
inline constexpr std::string_view kDefaultSocketPath = "/run/granary/sidecar.sock";
inline constexpr std::string_view kSocketEnvVar = "GRANARY_SOCKET";
// A Get's lookahead is capped so that ids + hints fit in one reply.
inline constexpr uint32_t kMaxLookahead = 1024;
// A session's unused hints hold at most 1/kHintArenaShare of the arena.
inline constexpr uint64_t kHintArenaShare = 32;

struct SessionOptions {
  // Empty: $GRANARY_SOCKET, else kDefaultSocketPath.
  std::string socket_path;
  // Sent in HELLO (1..255 graphic ASCII). Empty: "client/<pid>".
  std::string client_name;
  // Connecting plus HELLO and OPEN.
  std::chrono::milliseconds connect_timeout{10'000};
  // One call's whole round trip.
  std::chrono::milliseconds call_timeout{120'000};
  // Hints asked for with each Get (0: none), at most kMaxLookahead.
  uint32_t lookahead = 64;
  // Check each sample's XXH3-64 against the checksum the sidecar sent (a
  // mismatch is a kCorruption item). The sidecar verified it already; this is
  // for tests and for the suspicious.
  bool verify_checksums = false;
  // Read staged samples straight from the local node's chunk files when the
  // sidecar hands them over (see "Direct reads" above). Each such sample is
  // always verified with XXH3, whatever verify_checksums says.
  bool direct_reads = true;

  // Positive timeouts, a lookahead within the cap, a client name the protocol
  // accepts (after defaults are applied). kInvalidArgument naming the field.
  Status Validate() const;
};

// The socket path Open uses for `configured` (see SessionOptions).
std::string ResolveSocketPath(std::string_view configured);
// "client/<pid>".
std::string DefaultClientName();

// Paths are checked with ValidateSamplePath (core/names.h) before a LOOKUP.
using granary::ValidateSamplePath;

struct DatasetInfo {
  std::string name;
  ContentId manifest_id;
  uint64_t sample_count = 0;
  uint64_t total_bytes = 0;
  uint64_t chunk_count = 0;
};

// A pinned sample in the arena: `data` points into the read-only mapping and
// stays valid (holding these bytes) until the view is released or the session
// destroyed.
struct SampleView {
  uint32_t id = 0;
  const char* data = nullptr;
  uint64_t size = 0;
  uint64_t checksum = 0;  // XXH3-64 of the bytes, as the sidecar recorded it
  uint64_t token = 0;     // the pin; 0 for a view that holds none

  std::string_view bytes() const { return {data, static_cast<size_t>(size)}; }
};

// A sample read directly (see "Direct reads" above): a view of its chunk
// file's read-only map, verified with XXH3 when it was handed out. `data`
// stays valid and unchanged while `mapping` is held (also after the session
// is gone or the node dropped the file: the node unlinks chunk files, never
// truncates or rewrites verified bytes). Holding it keeps the whole chunk
// file mapped; it pins nothing in the sidecar.
struct MappedSample {
  uint32_t id = 0;
  const char* data = nullptr;
  uint64_t size = 0;
  uint64_t checksum = 0;  // XXH3-64 of the bytes, as the chunk file records it
  std::shared_ptr<const void> mapping;

  std::string_view bytes() const { return {data, static_cast<size_t>(size)}; }
};

// What the direct path did (a snapshot; counts since Open).
struct DirectReadCounters {
  uint64_t samples = 0;      // read from a chunk file and verified
  uint64_t bytes = 0;        // their bytes
  uint64_t chunk_files = 0;  // chunk files the sidecar handed over
  uint64_t fallbacks = 0;    // direct reads that failed and went through the arena
  uint64_t corrupt = 0;      // of those, checksum mismatches
  uint64_t dropped = 0;      // chunk files let go because the node dropped them
};

class Session {
 public:
  // Connects to the sidecar, HELLO, OPEN `dataset`, maps the arena. Errors:
  // kInvalidArgument (options, dataset name), kUnavailable (nothing listens:
  // names the socket path), kDeadlineExceeded (connect_timeout), the
  // sidecar's ERROR (e.g. kNotFound for an unknown dataset).
  static Result<std::unique_ptr<Session>> Open(std::string_view dataset,
                                               const SessionOptions& options = {});

  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const DatasetInfo& info() const { return info_; }
  const std::string& socket_path() const { return socket_path_; }
  const std::string& sidecar_name() const { return sidecar_name_; }
  // The sidecar protocol version agreed in HELLO.
  uint16_t protocol_version() const { return version_; }
  uint64_t arena_bytes() const { return map_size_; }
  // Hints asked for with each Get (see above).
  uint32_t lookahead() const { return lookahead_; }
  // The process that opened the session.
  pid_t pid() const { return pid_; }
  // Whether this is still that process (false in a forked child).
  bool InOpeningProcess() const;

  // One sample, pinned. From the hint table when it is there (no round trip),
  // else one GET with lookahead. kOutOfRange for an id past the end (checked
  // here), the sample's error otherwise.
  Result<SampleView> Get(uint32_t id);
  // Many samples, one outcome per id in order; hint-table hits need no round
  // trip, the rest go in as few GETs as the limits allow. A GET that fails as
  // a whole (a broken connection) gives each of its ids that Status.
  std::vector<Result<SampleView>> GetMany(std::span<const uint32_t> ids);
  // The sample if its hint is in the table, taken off it (as Get would), else
  // nullopt, also when the session is unusable, in a forked child, or busy in
  // another thread's call (Get then waits, or says why). Never blocks on the
  // sidecar, so a caller may hold a lock of its own meanwhile (Python's GIL:
  // a hint costs no thread switch).
  std::optional<SampleView> TryGetHinted(uint32_t id);
  // Copies one sample's bytes: from its chunk file when it can be read
  // directly (above), else through the arena (released at once).
  Result<std::string> Read(uint32_t id);

  // The direct path in pieces, for callers that want views or bring their
  // own buffer (the Python binding). LocateDirect: asks the sidecar for the
  // chunk files of those of `ids` not known yet (at most one CHUNK_FILES round
  // trip; none when all are known, direct reads are off or the sidecar cannot
  // hand files over). MapDirect: the sample as a view of its chunk file's
  // read-only map, verified with XXH3 (no I/O but the page cache's, never
  // waits for another thread's call); any error (kNotFound: not direct now,
  // LocateDirect may help; kCorruption: counted as a fallback) means "read it
  // through the arena instead".
  void LocateDirect(std::span<const uint32_t> ids);
  Result<MappedSample> MapDirect(uint32_t id);
  // MapDirect in two steps, for a caller that checks a view when its bytes
  // are first used rather than when it is handed out (the Python binding's
  // zero-copy Samples: the check then brings the bytes into the CPU caches
  // just before the caller reads them). No byte of a view from
  // MapDirectUnverified may be used before VerifyMapped(view) returned OK;
  // kCorruption: read it through the arena (counted, the file let go).
  Result<MappedSample> MapDirectUnverified(uint32_t id);
  Status VerifyMapped(const MappedSample& sample);
  // Why direct reads are off (OK while they are on).
  Status direct_status() const;
  // Whether direct reads may still happen (no lock: for callers that would
  // otherwise pay for a lock or a GIL switch on every sample).
  bool direct_reads_on() const { return direct_on_.load(std::memory_order_relaxed); }
  DirectReadCounters direct_counters() const;

  // Announces the session's plan (enables Next and exact prefetch).
  Status SetPlan(const sidecar_protocol::SetPlan& plan);
  // The plan's next samples (at most `max`, at least 1), one outcome each
  // (a failed one names its id). `*end_of_epoch` (may be null) is set when the
  // plan has no samples left.
  Result<std::vector<Result<SampleView>>> Next(uint32_t max, bool* end_of_epoch);

  // Queues the view's pin for release (sent with the next GET/NEXT or Flush).
  // A view released twice, a view of another session, or a call in a forked
  // child is ignored.
  void Release(const SampleView& view);
  // Sends the queued releases now.
  Status Flush();

  // Manifest facts of one sample.
  Result<sidecar_protocol::StatEntry> Stat(uint32_t id);
  // Of ids [first, first + count), paging with STAT as needed. kOutOfRange if
  // the range passes the end.
  Result<std::vector<sidecar_protocol::StatEntry>> List(uint32_t first, uint32_t count);
  // Path -> id. kInvalidArgument for an unsafe path (ValidateSamplePath, not
  // sent), kNotFound for a path the manifest does not hold.
  Result<uint32_t> Lookup(std::string_view path);
  // One outcome per path, in as few LOOKUPs as the limits allow.
  std::vector<Result<uint32_t>> LookupMany(std::span<const std::string> paths);
  // Every directory of the dataset but the root: paths relative to the root
  // ("a", "a/b"), sorted byte-wise as the manifest holds them (a parent before
  // its children), each with its permission bits; directories that hold no
  // file are listed too. A manifest of format version 1 recorded only the
  // directories its files' paths imply, all with mode 0555. Pages with
  // DIRECTORIES as needed. kVersionMismatch, with nothing sent, when the
  // sidecar speaks a protocol older than kDirectoriesVersion (upgrade
  // granary-sidecar); a reply out of order or with an unsafe path breaks the
  // connection (kUnavailable).
  Result<std::vector<sidecar_protocol::DirectoryItem>> Directories();
  // A round trip.
  Status Ping();

  // Pins held: views handed out and not released, plus unused hints.
  size_t pinned_count() const;
  size_t hint_count() const;

 private:
  using Clock = std::chrono::steady_clock;

  Session(std::string socket_path, SessionOptions options);
  Status Handshake(std::string_view dataset, Clock::time_point deadline);
  Status CheckUsable() const;  // caller holds mu_
  // One request and its reply; receives descriptors into `fds` when given.
  // Breaks the connection on anything but an ERROR that is not closing.
  Result<sidecar_protocol::Reply> Call(const sidecar_protocol::Request& request,
                                       sidecar_protocol::MessageType expected,
                                       Clock::time_point deadline, std::string_view doing,
                                       std::vector<ScopedFd>* fds = nullptr);
  Status SendAll(std::string_view bytes, Clock::time_point deadline, std::string_view doing);
  Result<sidecar_protocol::Frame> ReceiveFrame(Clock::time_point deadline, std::string_view doing,
                                               std::vector<ScopedFd>* fds);
  Status Break(Status status);
  Status Broken(std::string_view doing) const;

  // Pending releases, at most `max` of them (taken off the queue).
  std::vector<uint64_t> TakeReleases(size_t max);
  Status SendQueuedReleases(Clock::time_point deadline);  // caller holds mu_
  // Turns one reply item into a view (pinned: counted as outstanding) or its
  // error; a bad range or checksum becomes kCorruption and its pin is queued
  // for release.
  Result<SampleView> Adopt(const sidecar_protocol::SampleItem& item);
  // The hint table; the caller holds mu_.
  void AddHint(const SampleView& view);
  void TakeHint(std::list<SampleView>::iterator it);  // off the map and the byte count
  void TrimHints();
  // Sends GETs for `ids` (all misses) and fills `out` at `slots`.
  void FetchMisses(std::span<const uint32_t> ids, std::span<const size_t> slots,
                   std::vector<Result<SampleView>>* out);

  // Direct reads (session_direct.cc).
  struct DirectFile;  // one chunk file handed over
  struct DirectExtent {
    std::shared_ptr<DirectFile> file;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t checksum = 0;
  };
  // Forgets a chunk file and its samples; they go through the arena until
  // `retry_after` (caller holds direct_mu_).
  void ForgetDirectFile(const std::shared_ptr<DirectFile>& file, Clock::time_point retry_after);
  void TurnDirectOff(Status why);  // caller holds direct_mu_
  // Maps a handed-over file whole (read-only); caller holds direct_mu_.
  Status MapChunkFile(DirectFile& file);
  void LogDirectFailureOnce(const Status& failed);  // caller holds direct_mu_
  // One CHUNK_FILES round of LocateDirect: how many chunk files it handed over.
  size_t LocateDirectRound(std::span<const uint32_t> ids);
  // The sample's extent if it is direct now (and its file not dropped).
  bool FindDirect(uint32_t id, DirectExtent* extent);

  const std::string socket_path_;
  const SessionOptions options_;
  const pid_t pid_;
  DatasetInfo info_;
  std::string dataset_;
  std::string sidecar_name_;
  // Fixed part of a GET/LOOKUP body, generously: counts, lookahead.
  static constexpr uint32_t kBodyOverhead = 64;

  sidecar_protocol::Limits limits_;  // common with the sidecar's, after HELLO
  uint16_t version_ = sidecar_protocol::kMaxVersion;
  uint32_t lookahead_ = 0;         // set by Open
  uint64_t hint_bytes_limit_ = 0;  // set by Open

  // The arena mapping; immutable after Open, unmapped by the destructor.
  const char* map_ = nullptr;
  size_t map_size_ = 0;

  mutable std::mutex mu_;  // guards everything below until release_mu_
  ScopedFd fd_;
  std::string in_;       // received bytes not yet decoded
  size_t in_begin_ = 0;  // first undecoded byte of in_
  uint64_t next_request_id_ = 1;
  std::chrono::milliseconds timeout_{0};  // of the calls now: for messages
  Status broken_;                         // OK while the connection is usable
  std::list<SampleView> hint_order_;      // oldest first
  std::unordered_map<uint32_t, std::list<SampleView>::iterator> hints_;
  uint64_t hint_bytes_ = 0;  // bytes of the views in hints_

  // Guards the direct-read tables below; never held across I/O but a stat.
  // Taken after mu_ when both are held.
  mutable std::mutex direct_mu_;
  std::atomic<bool> direct_on_{true};  // options_.direct_reads && direct_off_.ok()
  Status direct_off_;                  // not OK: direct reads are off for the session, and why
  std::unordered_map<uint32_t, DirectExtent> direct_;  // id -> where it lies
  // Ids to read through the arena until the time given (bounded).
  std::unordered_map<uint32_t, Clock::time_point> direct_elsewhere_;
  std::list<std::shared_ptr<DirectFile>> direct_files_;  // oldest first, bounded
  Clock::time_point direct_swept_;  // last check of every kept file for a dropped one
  DirectReadCounters direct_counters_;
  bool direct_failure_logged_ = false;

  mutable std::mutex release_mu_;  // guards the two below; never held across I/O
  std::vector<uint64_t> pending_release_;
  std::unordered_map<uint64_t, uint32_t> outstanding_;  // token -> pins handed out
};

}  // namespace granary::client
