#pragma once

// Chunk handoff: how a sidecar gets read-only file descriptors of the chunk
// files of the cache node on its own host, so that it reads staged samples
// with one pread into its arena (verified against the chunk's stored
// checksums) instead of a READ over TCP that copies every byte four times.
// docs/protocol.md, "Chunk handoff", describes every byte.
//
// The cache node listens on a Unix stream socket (`local_socket` in its
// config); the conversation is one request and one reply at a time:
//   sidecar                                   cache node
//   OPEN_CHUNK (dataset, manifest, chunk) →   OPEN_CHUNK_REPLY (status)
//                                             + the chunk file's descriptor
//                                               (SCM_RIGHTS, with the reply's
//                                               first byte) when OK
// The node hands out a descriptor only to a peer (SO_PEERCRED) that is root,
// the node's own user, or the dataset's owner, only for a chunk it has on disk
// for the manifest it serves, and only opened O_RDONLY. The sidecar checks the
// file itself (ChunkReader::FromFd: magic, layout checksum, the expected key
// and segments) and verifies every segment it reads, so a wrong or damaged
// file costs a fall back to READ, never a wrong byte.
//
// Frames: a 12-byte header (the shared one of wire_frame.h: magic "GRHO",
// version, type, body_length), then the body; chunk_handoff_format.h has the
// byte layout. OPEN_CHUNK carries dataset, manifest id and chunk;
// OPEN_CHUNK_REPLY a status code and message.
//
// Callers: the cache node's handoff server (DecodeHeader, DecodeOpenChunk,
// EncodeReply), the sidecar's SampleFetcher (ChunkHandoffClient), tests and
// the fuzz target.
//
// Thread safety: the free functions are pure. A ChunkHandoffClient may be
// used from many threads: requests are serialized on its one connection
// (they are rare: one per chunk the sidecar opens).

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "granary/core/file.h"
#include "granary/core/hash.h"
#include "granary/core/manifest.h"
#include "granary/core/status.h"
#include "granary/protocol/chunk_handoff_format.h"

namespace granary::handoff {

// The layout's constants (chunk_handoff_format.h), as this codec's names.
using chunk_handoff_format::kHeaderSize;
using chunk_handoff_format::kMagic;
using chunk_handoff_format::kMaxBodySize;
using chunk_handoff_format::kMaxMessageLength;
using chunk_handoff_format::kVersion;

enum class MessageType : uint16_t {
  kOpenChunk = chunk_handoff_format::kTypeOpenChunk,
  kOpenChunkReply = chunk_handoff_format::kTypeOpenChunkReply,
};

struct Header {
  MessageType type = MessageType::kOpenChunk;
  uint32_t body_size = 0;
};

struct OpenChunkRequest {
  std::string dataset;
  ContentId manifest_id;
  ChunkId chunk = 0;
};

// kInvalidArgument: bad magic or type, a body over kMaxBodySize;
// kVersionMismatch: another version. `bytes` must be kHeaderSize long.
Result<Header> DecodeHeader(std::string_view bytes);

// The whole frame (header + body). kInvalidArgument for a dataset name that
// is not a DNS-1123 label.
Result<std::string> EncodeOpenChunk(const OpenChunkRequest& request);
// The body of an OPEN_CHUNK frame. kInvalidArgument naming the field for a
// short or long body or a bad dataset name.
Result<OpenChunkRequest> DecodeOpenChunk(std::string_view body);

// The whole reply frame; messages longer than kMaxMessageLength are cut.
std::string EncodeReply(const Status& status);
// Decodes a reply body into the status it carries (*carried); the return
// value is the decoding's own error (kInvalidArgument), OK otherwise.
Status DecodeReply(std::string_view body, Status* carried);

// The sidecar's end: one connection to the cache node's handoff socket,
// opened at the first request and again after a failure.
class ChunkHandoffClient {
 public:
  ChunkHandoffClient(std::string socket_path, std::chrono::milliseconds timeout)
      : path_(std::move(socket_path)), timeout_(timeout) {}

  const std::string& socket_path() const { return path_; }

  // The chunk file's descriptor (read-only), or the node's error (kNotFound:
  // not on disk or not served; kPermissionDenied: this process may not read
  // that dataset), or kUnavailable / kDeadlineExceeded / kIoError when the
  // node cannot be asked (the connection is dropped; the next call
  // reconnects).
  Result<ScopedFd> OpenChunk(const OpenChunkRequest& request);

 private:
  Result<ScopedFd> Exchange(const std::string& frame);

  const std::string path_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  ScopedFd fd_;  // guarded by mu_
};

}  // namespace granary::handoff
