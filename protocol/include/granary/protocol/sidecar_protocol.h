#pragma once

// The sidecar's local protocol: what a training process (libgranary-client,
// the Python package) says to granary-sidecar over a Unix stream socket. A pure
// codec, like protocol.h for the cache node's TCP protocol: typed messages,
// their encoders and an incremental frame decoder; no sockets here
// (unix_socket.h moves the bytes and the one file descriptor the protocol
// passes). docs/protocol.md, "Sidecar protocol", describes every byte.
//
// The conversation:
//   client                               sidecar
//   HELLO (versions, client name)   →    HELLO_REPLY (version, name, limits)
//   OPEN (dataset)                  →    OPEN_REPLY (manifest facts, arena size)
//                                        + the arena's memfd (SCM_RIGHTS, sent
//                                          with the reply's first byte)
//   SET_PLAN (plan, epoch, rank)    →    OK        (optional: enables NEXT and
//                                                   exact prefetch)
//   GET (ids, releases)             →    SAMPLES   (per id: where its bytes are
//                                                   in the arena, or why not)
//   NEXT (max, releases)            →    SAMPLES   (the plan's next samples)
//   RELEASE (tokens)                →    OK
//   STAT (first id, count)          →    STAT_REPLY (path, size, mtime each)
//   LOOKUP (paths)                  →    LOOKUP_REPLY (id or why not, each)
//   DIRECTORIES (first, count)      →    DIRECTORIES_REPLY (path, mode each;
//                                                   version 2 and later)
//   PING                            →    PONG
//   CHUNK_FILES (ids)               →    CHUNK_FILES_REPLY (per chunk of the
//                                        ids: where its staged samples lie in
//                                        its file, or which to GET instead)
//                                        + one read-only descriptor per chunk
//                                          file handed over (version 3)
//   anything wrong                  →    ERROR (status; closing or not)
// One connection is one session over one dataset. Sample payloads never cross
// the socket: a SAMPLES item names a range of the shared arena (offset,
// length) and a token that pins it; the client reads the bytes from its
// read-only mapping and releases the token when done (RELEASE, or piggy-backed
// on its next GET/NEXT). The sidecar does not reuse a pinned range; when the
// connection closes, every pin it held is dropped.
//
// Frames: a 24-byte fixed header (the shared one of wire_frame.h: magic
// "GRSC", version, type, flags, body_length, request_id), then the body;
// sidecar_protocol_format.h has the byte layout of every message. Replies
// carry the request's id; ERROR with id 0 blames no request.
//
// Versions: HELLO agrees on the highest version both sides speak; every later
// frame of the connection carries a version no higher than that. A message
// type exists from the version MinVersionOf() names (version 2 added
// DIRECTORIES and DIRECTORIES_REPLY); the encoders refuse, and the decoders
// reject, a frame of an older version carrying it. A client that agreed on an
// older version must not send a newer request: a sidecar of that version
// answers ERROR "unknown request type" (and keeps the connection).
//
// Errors: the decoders return kInvalidArgument (malformed, naming the message
// type and the field), kOutOfRange (over a limit), kVersionMismatch; never
// crash, never read past the input, never allocate more than the limits allow
// (list counts are checked against limits.max_items and against the bytes left
// in the body before anything is reserved). Two classes, as in protocol.h:
//  - framing errors come from FrameDecoder (bad magic, version or flags, a body
//    over max_body_bytes, a stream cut mid-frame): the stream is lost; the
//    sidecar sends ERROR with closing set (best effort) and closes;
//  - message errors come from DecodeRequest/DecodeReply on a complete frame:
//    the stream is still in step; the sidecar answers ERROR with the frame's
//    request id and keeps the connection.
// The encoders refuse (same codes) whatever the decoders would reject, so a
// frame that encodes decodes to an equal message. Item and ERROR messages are
// not refused but cut (kMaxMessageLength, and shorter if a reply's items'
// messages would not otherwise fit limits.max_body_bytes).
//
// Thread safety: free functions are pure and may run on any thread. A
// SidecarFrameDecoder belongs to one connection and one thread at a time.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "granary/core/hash.h"
#include "granary/core/names.h"
#include "granary/core/status.h"
#include "granary/protocol/sidecar_protocol_format.h"
#include "granary/protocol/wire_frame.h"

namespace granary::sidecar_protocol {

// The layout's constants (sidecar_protocol_format.h), as this codec's names.
using sidecar_protocol_format::kChunkFilesVersion;
using sidecar_protocol_format::kDefaultMaxBodyBytes;
using sidecar_protocol_format::kDefaultMaxItems;
using sidecar_protocol_format::kDirectoriesVersion;
using sidecar_protocol_format::kFrameHeaderSize;
using sidecar_protocol_format::kHandshakeVersion;
using sidecar_protocol_format::kMagic;
using sidecar_protocol_format::kMaxBodyBytesCap;
using sidecar_protocol_format::kMaxChunkFilesPerReply;
using sidecar_protocol_format::kMaxDirectoryMode;
using sidecar_protocol_format::kMaxItemsCap;
using sidecar_protocol_format::kMaxMessageLength;
using sidecar_protocol_format::kMaxNameLength;
using sidecar_protocol_format::kMaxPathLength;
using sidecar_protocol_format::kMaxVersion;
using sidecar_protocol_format::kMinVersion;
static_assert(kMaxPathLength == kMaxSamplePathLength);

struct Limits {
  uint32_t max_body_bytes = kDefaultMaxBodyBytes;
  uint32_t max_items = kDefaultMaxItems;

  // Nonzero, within the caps, max_body_bytes >= kMinBodyBytes (4096).
  // kInvalidArgument naming the field.
  Status Validate() const;
  friend bool operator==(const Limits&, const Limits&) = default;
};
Limits CommonLimits(const Limits& a, const Limits& b);

enum class MessageType : uint16_t {
  // requests
  kHello = sidecar_protocol_format::kTypeHello,
  kOpen = sidecar_protocol_format::kTypeOpen,
  kSetPlan = sidecar_protocol_format::kTypeSetPlan,
  kGet = sidecar_protocol_format::kTypeGet,
  kNext = sidecar_protocol_format::kTypeNext,
  kRelease = sidecar_protocol_format::kTypeRelease,
  kStat = sidecar_protocol_format::kTypeStat,
  kLookup = sidecar_protocol_format::kTypeLookup,
  kPing = sidecar_protocol_format::kTypePing,
  kDirectories = sidecar_protocol_format::kTypeDirectories,  // version 2
  kChunkFiles = sidecar_protocol_format::kTypeChunkFiles,    // version 3
  // replies
  kHelloReply = sidecar_protocol_format::kTypeHelloReply,
  kOpenReply = sidecar_protocol_format::kTypeOpenReply,
  kOk = sidecar_protocol_format::kTypeOk,
  kSamples = sidecar_protocol_format::kTypeSamples,
  kStatReply = sidecar_protocol_format::kTypeStatReply,
  kLookupReply = sidecar_protocol_format::kTypeLookupReply,
  kPong = sidecar_protocol_format::kTypePong,
  kError = sidecar_protocol_format::kTypeError,
  kDirectoriesReply = sidecar_protocol_format::kTypeDirectoriesReply,  // version 2
  kChunkFilesReply = sidecar_protocol_format::kTypeChunkFilesReply,    // version 3
};
std::string_view MessageTypeName(uint16_t type);  // "HELLO", ..., "unknown"
// The first protocol version that has message `type` (kDirectoriesVersion for
// DIRECTORIES and DIRECTORIES_REPLY, else kMinVersion; also for unknown types).
uint16_t MinVersionOf(uint16_t type);

// ---- requests -----------------------------------------------------------------

struct Hello {
  uint16_t min_version = kMinVersion;
  uint16_t max_version = kMaxVersion;
  std::string client_name;  // 1..kMaxNameLength graphic ASCII, e.g. "python/1234"
  friend bool operator==(const Hello&, const Hello&) = default;
};

struct Open {
  std::string dataset;  // DNS-1123 label (ValidateDatasetName)
  friend bool operator==(const Open&, const Open&) = default;
};

// The session's plan: a PlanRecord's fields (metadata_store.h) plus the epoch
// and rank this session reads, and where in the rank's sample list it resumes
// (0: from the start).
struct SetPlan {
  std::string plan_id;  // 1..128 of [A-Za-z0-9._-]
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint32_t world_size = 1;
  uint32_t rank = 0;
  uint32_t batch_size = 1;
  bool drop_last = false;
  uint8_t mode = 0;  // PlanMode as a number: 0 global, 1 chunkwise, 2 sequential
  uint32_t window_chunks = 8;
  uint64_t start_position = 0;  // index into the rank's samples()
  friend bool operator==(const SetPlan&, const SetPlan&) = default;
};

// Samples by id (map-style). `release` first drops those pins. `lookahead`:
// besides the ids asked for, return up to this many samples that follow the
// last id in an active plan of the dataset and are already in the arena
// (hints the client may use instead of asking again; it releases what it does
// not use).
struct Get {
  std::vector<uint64_t> release;
  std::vector<uint32_t> ids;
  uint32_t lookahead = 0;
  friend bool operator==(const Get&, const Get&) = default;
};

// The next samples of the session's plan (iterable); needs SET_PLAN.
struct Next {
  std::vector<uint64_t> release;
  uint32_t max_samples = 1;  // >= 1
  friend bool operator==(const Next&, const Next&) = default;
};

struct Release {
  std::vector<uint64_t> tokens;
  friend bool operator==(const Release&, const Release&) = default;
};

// Manifest facts of ids [first_id, first_id + count).
struct Stat {
  uint32_t first_id = 0;
  uint32_t count = 1;  // >= 1
  friend bool operator==(const Stat&, const Stat&) = default;
};

// Path -> id, from the manifest. Paths are relative ("a/b.jpg").
struct Lookup {
  std::vector<std::string> paths;
  friend bool operator==(const Lookup&, const Lookup&) = default;
};

struct Ping {
  friend bool operator==(const Ping&, const Ping&) = default;
};

// The dataset's directories (version 2): those of indices [first, first +
// count) in the manifest's directory order (sorted by path), the root not
// counted (index 0 is the manifest's directory 1). Paged like STAT: the reply
// may hold fewer; ask again from where it stopped.
struct Directories {
  uint32_t first = 0;
  uint32_t count = 1;  // >= 1
  friend bool operator==(const Directories&, const Directories&) = default;
};

// The chunk files holding these samples, for a client on the sidecar's host
// to read them itself (version 3; docs/client.md, "Direct reads"). The
// sidecar answers for the distinct chunks of the ids, at most
// kMaxChunkFilesPerReply of them handed over.
struct ChunkFiles {
  std::vector<uint32_t> ids;  // at least one
  friend bool operator==(const ChunkFiles&, const ChunkFiles&) = default;
};

using Request = std::variant<Hello, Open, SetPlan, Get, Next, Release, Stat, Lookup, Ping,
                             Directories, ChunkFiles>;

// ---- replies ------------------------------------------------------------------

struct HelloReply {
  uint16_t version = kMaxVersion;
  std::string sidecar_name;
  Limits limits;
  friend bool operator==(const HelloReply&, const HelloReply&) = default;
};

struct OpenReply {
  ContentId manifest_id;
  uint64_t sample_count = 0;
  uint64_t total_bytes = 0;
  uint64_t chunk_count = 0;
  uint64_t arena_bytes = 0;  // size of the memfd passed with this reply
  friend bool operator==(const OpenReply&, const OpenReply&) = default;
};

struct Ok {
  friend bool operator==(const Ok&, const Ok&) = default;
};

// One sample's outcome. OK: bytes [offset, offset + length) of the arena hold
// the sample, pinned by `token` until released; `checksum` is its XXH3-64.
// Not OK: token 0, no range, status says why.
struct SampleItem {
  uint32_t id = 0;
  Status status;
  uint64_t token = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;
  bool hint = false;  // a lookahead item the client did not ask for
  friend bool operator==(const SampleItem&, const SampleItem&) = default;
};

struct Samples {
  std::vector<SampleItem> items;
  bool end_of_epoch = false;  // NEXT: the plan has no samples left
  friend bool operator==(const Samples&, const Samples&) = default;
};

struct StatEntry {
  std::string path;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  friend bool operator==(const StatEntry&, const StatEntry&) = default;
};

struct StatReply {
  uint32_t first_id = 0;
  std::vector<StatEntry> entries;  // may be fewer than asked near the end or the body limit
  friend bool operator==(const StatReply&, const StatReply&) = default;
};

struct LookupItem {
  Status status;
  uint32_t id = 0;
  friend bool operator==(const LookupItem&, const LookupItem&) = default;
};

struct LookupReply {
  std::vector<LookupItem> items;
  friend bool operator==(const LookupReply&, const LookupReply&) = default;
};

struct Pong {
  friend bool operator==(const Pong&, const Pong&) = default;
};

// One directory: its path relative to the dataset root ("a/b", never empty:
// the root is not listed) and its permission bits at snapshot time.
struct DirectoryItem {
  std::string path;
  uint16_t mode = 0;  // st_mode & 07777
  friend bool operator==(const DirectoryItem&, const DirectoryItem&) = default;
};

struct DirectoriesReply {
  uint32_t first = 0;                  // the request's first
  uint32_t total = 0;                  // directories in the dataset, the root not counted
  std::vector<DirectoryItem> entries;  // from `first`; fewer than asked near the end or the limit
  friend bool operator==(const DirectoriesReply&, const DirectoriesReply&) = default;
};

// Where one whole staged sample lies in a chunk file handed over: bytes
// [offset, offset + length) of the file, whose XXH3-64 is `checksum` (the one
// the chunk file's verified header records).
struct DirectSample {
  uint32_t id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;
  friend bool operator==(const DirectSample&, const DirectSample&) = default;
};

// One chunk's answer. OK: its file's descriptor comes with the reply (the
// n-th OK chunk, the n-th descriptor) and `samples` are the ones staged in it
// now. Not OK: no descriptor, `samples` empty, status says why (the client's
// uid may not have it, the local node does not hold it, ...). `elsewhere`:
// samples of the chunk to read through GET for now (not staged yet, pieces of
// a sample spanning chunks, or the whole chunk when not OK).
struct ChunkFile {
  uint32_t chunk = 0;
  Status status;
  std::vector<DirectSample> samples;
  std::vector<uint32_t> elsewhere;
  friend bool operator==(const ChunkFile&, const ChunkFile&) = default;
};

struct ChunkFilesReply {
  std::vector<ChunkFile> chunks;  // at most kMaxChunkFilesPerReply of them OK
  friend bool operator==(const ChunkFilesReply&, const ChunkFilesReply&) = default;
};

struct Error {
  Status status;  // never OK
  bool closing = false;
  friend bool operator==(const Error&, const Error&) = default;
};

using Reply = std::variant<HelloReply, OpenReply, Ok, Samples, StatReply, LookupReply, Pong, Error,
                           DirectoriesReply, ChunkFilesReply>;

// ---- frames -----------------------------------------------------------------------

struct FrameHeader {
  uint16_t version = kMaxVersion;
  uint16_t type = 0;
  uint32_t body_length = 0;
  uint64_t request_id = 0;
  friend bool operator==(const FrameHeader&, const FrameHeader&) = default;
};

struct Frame {
  FrameHeader header;
  std::string body;
  friend bool operator==(const Frame&, const Frame&) = default;
};

// Whole frames (header + body). Fail on anything the receiver would reject
// under `limits` (request id 0 for a request, bad names, too many items), and
// kVersionMismatch for a message `version` does not have (MinVersionOf).
// HELLO and HELLO_REPLY are sent as kHandshakeVersion whatever `version` says.
Result<std::string> EncodeRequest(uint64_t request_id, const Request& request,
                                  const Limits& limits = {}, uint16_t version = kMaxVersion);
Result<std::string> EncodeReply(uint64_t request_id, const Reply& reply, const Limits& limits = {},
                                uint16_t version = kMaxVersion);
// An ERROR frame; cannot fail (OK is sent as kInternal, long messages are cut).
// A version this build does not speak is replaced by kHandshakeVersion.
std::string EncodeError(uint64_t request_id, const Status& status, bool closing,
                        uint16_t version = kMaxVersion);

// The message in a complete frame. DecodeRequest accepts request types only
// (and request id >= 1), DecodeReply reply types only (request id 0 only for
// ERROR). `limits` are the receiver's own.
Result<Request> DecodeRequest(const Frame& frame, const Limits& limits = {});
Result<Reply> DecodeReply(const Frame& frame, const Limits& limits = {});

// The version a sidecar speaking [kMinVersion, kMaxVersion] picks for `hello`:
// the highest both speak. kVersionMismatch naming both ranges when there is
// none, kInvalidArgument when the client's range is empty or starts at 0.
Result<uint16_t> NegotiateVersion(const Hello& hello);

// Splits a byte stream into frames (the shared wire::FrameReader under this
// protocol's header rules); holds at most one, never more than
// limits.max_body_bytes of body; sticky error after the first failure.
class FrameDecoder {
 public:
  explicit FrameDecoder(Limits limits = {});
  // Consumes bytes until a frame is complete or they run out; returns how many.
  Result<size_t> Feed(std::string_view data);
  bool has_frame() const { return reader_.has_frame(); }
  Frame TakeFrame();
  // OK between frames, else kInvalidArgument saying where the stream was cut.
  Status Finish() const { return reader_.Finish(); }
  const Status& status() const { return reader_.status(); }
  size_t buffered_bytes() const { return reader_.buffered_bytes(); }

 private:
  Limits limits_;
  wire::FrameReader reader_;  // failed at construction when limits are invalid
};

// Exactly one whole frame in `bytes` (for tests, tools and the fuzzer):
// FrameDecoder's errors, kInvalidArgument for a cut frame or trailing bytes.
Result<Frame> DecodeFrame(std::string_view bytes, const Limits& limits = {});

}  // namespace granary::sidecar_protocol
