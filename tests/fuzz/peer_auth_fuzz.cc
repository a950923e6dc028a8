// libFuzzer target for the peer protocol's authentication (version 2): the
// frames a cache node and its clients exchange before anything else
// (AUTH, AUTH_PROOF and their replies), the checks each side makes on them,
// and the cluster key file parser. The first byte picks the side:
//   0: a client's byte stream into the server's handshake: HELLO, AUTH and
//      AUTH_PROOF frames decoded as a server does, a cluster-key challenge
//      made for each AUTH that names a key, and each AUTH_PROOF checked;
//   1: a server's byte stream into the client's handshake: HELLO_REPLY,
//      AUTH_REPLY and AUTH_PROOF_REPLY decoded, a challenge's server proof
//      checked;
//   2: the rest is the text of a cluster key file.
// Any crash, sanitizer report or broken invariant is a finding.
//
// Invariants:
//  - decoding errors are kInvalidArgument, kOutOfRange or kVersionMismatch;
//  - a decoded AUTH or AUTH_PROOF re-encodes to exactly the frame's bytes;
//  - a proof is accepted exactly when it equals the one made with the key, and
//    no proof made from the fuzzer's bytes alone matches (it does not know the
//    key);
//  - a parsed key file holds 1 or 2 keys of at least 32 bytes, with distinct ids.
// Seeds: tests/fuzz/corpus/peer_auth.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "granary/peer/peer_auth.h"
#include "granary/protocol/protocol.h"

namespace granary {
namespace {

void Check(bool condition, const char* what, const Status& status = Status::Ok()) {
  if (condition) return;
  std::fprintf(stderr, "peer_auth_fuzz invariant broken: %s (%s)\n", what,
               status.ToString().c_str());
  std::abort();
}

bool ExpectedError(const Status& s) {
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kOutOfRange ||
         s.code() == StatusCode::kVersionMismatch;
}

const ClusterKeys& Keys() {
  static const ClusterKeys keys = [] {
    Result<ClusterKeys> k = ClusterKeys::FromKeys(
        {std::string(32, 'a'), std::string("fuzzer-does-not-know-this-key-0123456789")});
    Check(k.ok(), "test keys", k.status());
    return *k;
  }();
  return keys;
}

// Feeds `bytes` to a decoder of `direction`, calling `on_frame` per frame.
template <typename F>
void ForEachFrame(std::string_view bytes, FrameDirection direction, F on_frame) {
  FrameDecoder decoder(direction);
  decoder.ExpectVersion(2);
  for (int guard = 0; guard < 10000 && !bytes.empty(); ++guard) {
    Result<size_t> used = decoder.Feed(bytes);
    if (!used.ok()) {
      Check(ExpectedError(used.status()), "framing error class", used.status());
      return;
    }
    bytes.remove_prefix(*used);
    if (!decoder.has_frame()) {
      if (*used == 0) return;
      continue;
    }
    Frame frame = decoder.TakeFrame();
    if (decoder.payload_remaining() > 0) bytes.remove_prefix(decoder.ConsumePayload(bytes.size()));
    on_frame(frame);
  }
}

void ServerSide(std::string_view bytes) {
  AuthNonce client_nonce{}, server_nonce{};
  server_nonce.fill(0x5a);
  const std::string* key = nullptr;
  ForEachFrame(bytes, FrameDirection::kRequests, [&](const Frame& frame) {
    Result<RequestMessage> m = DecodeRequest(frame);
    if (!m.ok()) {
      Check(ExpectedError(m.status()), "request error class", m.status());
      return;
    }
    if (const auto* auth = std::get_if<AuthRequest>(&*m)) {
      Result<std::string> again = EncodeRequest(frame.header.request_id, *auth);
      Check(again.ok(), "AUTH re-encodes", again.status());
      Check(again->substr(32) == frame.body, "AUTH is canonical");
      if (auth->method != AuthMethod::kClusterKey) return;
      KeyId id{};
      for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(auth->credential[i]);
      key = Keys().Find(id);
      client_nonce = auth->client_nonce;
      if (key != nullptr) {
        Result<OutgoingFrame> challenge =
            EncodeResponse(frame.header.request_id,
                           AuthReply{false, server_nonce,
                                     ClusterKeyProof(*key, ProofRole::kServer, client_nonce,
                                                     server_nonce, "node", "client"),
                                     ""},
                           {}, EncodeOptions{2, {}});
        Check(challenge.ok(), "challenge encodes", challenge.status());
      }
    } else if (const auto* proof = std::get_if<AuthProofRequest>(&*m)) {
      Result<std::string> again = EncodeRequest(frame.header.request_id, *proof);
      Check(again.ok(), "AUTH_PROOF re-encodes", again.status());
      Check(again->substr(32) == frame.body, "AUTH_PROOF is canonical");
      if (key == nullptr) return;
      const AuthProof expected =
          ClusterKeyProof(*key, ProofRole::kClient, client_nonce, server_nonce, "node", "client");
      const bool accepted = ProofsEqual(expected, proof->proof);
      Check(accepted == (expected == proof->proof), "constant-time compare agrees");
      // The fuzzer cannot make the proof of a key it does not hold.
      if (*key != std::string(32, 'a')) Check(!accepted, "a proof made without the key passed");
    }
  });
}

void ClientSide(std::string_view bytes) {
  const AuthNonce client_nonce{};
  ForEachFrame(bytes, FrameDirection::kResponses, [&](const Frame& frame) {
    Result<ResponseMessage> m = DecodeResponse(frame);
    if (!m.ok()) {
      Check(ExpectedError(m.status()), "response error class", m.status());
      return;
    }
    if (const auto* reply = std::get_if<AuthReply>(&*m)) {
      Check(reply->granted || reply->scope.empty(), "a challenge carries no scope");
      if (reply->granted) Check(!reply->scope.empty(), "a grant names its scope");
      const std::string& key = Keys().current();
      const AuthProof expected = ClusterKeyProof(key, ProofRole::kServer, client_nonce,
                                                 reply->server_nonce, "node", "client");
      Check(ProofsEqual(expected, reply->server_proof) == (expected == reply->server_proof),
            "constant-time compare agrees");
    } else if (const auto* granted = std::get_if<AuthProofReply>(&*m)) {
      Check(!granted->scope.empty(), "a grant names its scope");
    } else if (const auto* hello = std::get_if<HelloReply>(&*m)) {
      Check(!hello->auth_required || hello->version >= 2, "authentication only from version 2");
    }
  });
}

void KeyFile(std::string_view text) {
  Result<ClusterKeys> keys = ClusterKeys::Parse(text, "fuzz");
  if (!keys.ok()) {
    Check(keys.status().code() == StatusCode::kInvalidArgument, "key file error class",
          keys.status());
    return;
  }
  Check(keys->size() >= 1 && keys->size() <= 2, "one or two keys");
  Check(keys->current().size() >= ClusterKeys::kMinKeyBytes, "keys are long enough");
  Check(keys->Find(keys->current_id()) != nullptr, "the current key is found by its id");
}

}  // namespace
}  // namespace granary

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      granary::ServerSide(rest);
      break;
    case 1:
      granary::ClientSide(rest);
      break;
    default:
      granary::KeyFile(rest);
      break;
  }
  return 0;
}
