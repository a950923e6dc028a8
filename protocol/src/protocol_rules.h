#pragma once

// Inside the cache node protocol's codec (protocol.h): the frame format it
// gives the shared frame layer (wire_frame.h), how its errors name a frame,
// and the field rules that the encoders (protocol_encode.cc) and the decoders
// (protocol_decode.cc) share, so that whatever an encoder produces, a decoder
// with the same limits accepts. Private to core.
//
// Thread safety: pure functions and constants.

#include <cstdint>
#include <string>
#include <string_view>

#include "granary/protocol/protocol.h"
#include "granary/protocol/protocol_format.h"
#include "granary/protocol/wire_frame.h"

namespace granary::protocol_internal {

namespace pf = protocol_format;

// GRNW: flags, payload_length and request_id; types named by
// MessageTypeName, unknown ones in hex.
extern const wire::FrameFormat kFrameFormat;

FrameHeader FromWire(const wire::WireHeader& h);
wire::WireHeader ToWire(const FrameHeader& h);

// "READ frame (request id 7)", or "frame of type 0x1234 (request id 7)".
std::string FrameWhat(const FrameHeader& h);
// "decode <FrameWhat>: <what>" as kInvalidArgument / kOutOfRange.
Status DecodeInvalid(const FrameHeader& h, const std::string& what);
Status DecodeRange(const FrameHeader& h, const std::string& what);

bool IsSpokenVersion(uint16_t v);
// HELLO, HELLO_REPLY and ERROR: frozen, and sent as kHandshakeVersion.
bool IsHandshakeType(uint16_t type);
std::string VersionRange();  // "1..2"

// Field rules: OK, or kInvalidArgument / kOutOfRange saying what is wrong.
Status CheckPeerName(std::string_view name);
Status CheckDatasetName(std::string_view name, bool allow_empty);
Status CheckStatRequest(const StatRequest& r);
Status CheckReadRequest(const ReadRequest& r, const ProtocolLimits& limits);
Status CheckStatKey(std::string_view key);
Status CheckStatReply(const StatReply& r);
Status CheckReplyItems(const ReadReply& r, const ProtocolLimits& limits);
// Authentication frames exist from version 2 on.
Status RequireAuthVersion(uint16_t version);
Status CheckAuthRequest(const AuthRequest& a);
Status CheckAuthScope(std::string_view scope);

// A Status received from the peer. Unknown codes become kInternal, naming them.
Status StatusFromWire(uint16_t wire, std::string message);

}  // namespace granary::protocol_internal
