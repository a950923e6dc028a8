// libFuzzer target for the chunk handoff codec (protocol/src/chunk_handoff.cc):
// what the cache node's local_socket parses from any process on the host. The
// input is one frame as a peer would send it: the header is decoded, and the
// body (whatever follows, up to the header's length) is decoded both as a
// request and as a reply. Any crash, sanitizer report or broken invariant is a
// finding.
//
// Invariants:
//  - decoding errors are only kInvalidArgument or kVersionMismatch;
//  - a decoded request re-encodes to exactly the frame's bytes (canonical);
//  - a decoded reply re-encodes to the same status.
// Seeds: tests/fuzz/corpus/chunk_handoff (a request, an OK and an error reply,
// a bad magic).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "granary/protocol/chunk_handoff.h"

namespace granary::handoff {
namespace {

void Check(bool condition, const char* what, const Status& status = Status::Ok()) {
  if (condition) return;
  std::fprintf(stderr, "chunk_handoff_fuzz invariant broken: %s (%s)\n", what,
               status.ToString().c_str());
  std::abort();
}

bool ExpectedError(const Status& s) {
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kVersionMismatch;
}

}  // namespace
}  // namespace granary::handoff

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace granary;
  using namespace granary::handoff;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  if (in.size() < kHeaderSize) {
    Result<Header> h = DecodeHeader(in);
    Check(!h.ok() && ExpectedError(h.status()), "short header accepted", h.status());
    return 0;
  }
  Result<Header> header = DecodeHeader(in.substr(0, kHeaderSize));
  if (!header.ok()) {
    Check(ExpectedError(header.status()), "header error code", header.status());
    return 0;
  }
  Check(header->body_size <= kMaxBodySize, "body over the limit accepted");
  const std::string_view body = in.substr(kHeaderSize, header->body_size);

  Result<OpenChunkRequest> request = DecodeOpenChunk(body);
  if (request.ok()) {
    Result<std::string> again = EncodeOpenChunk(*request);
    Check(again.ok(), "a decoded request does not encode", again.status());
    Check(std::string_view(*again).substr(kHeaderSize) == body, "request encoding not canonical");
  } else {
    Check(ExpectedError(request.status()), "request error code", request.status());
  }

  Status carried;
  Status decoded = DecodeReply(body, &carried);
  if (decoded.ok()) {
    const std::string again = EncodeReply(carried);
    Status round;
    Check(DecodeReply(std::string_view(again).substr(kHeaderSize), &round).ok(),
          "a decoded reply does not decode again");
    Check(round.code() == carried.code() && round.message() == carried.message(),
          "reply round trip changed the status", round);
  } else {
    Check(ExpectedError(decoded), "reply error code", decoded);
  }
  return 0;
}
