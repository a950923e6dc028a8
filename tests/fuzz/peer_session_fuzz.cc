// libFuzzer target for the cache node's per-connection protocol rules
// (cachenode/src/peer_session.h, compiled in): a client's byte stream, split
// into frames as a front end does, each given to a PeerSession. The first
// byte picks the node: bit 0 a cluster key required (the fuzzer does not
// know it), bit 1 Kubernetes tokens accepted ("token-a" is namespace team-a's,
// which reads dataset "team-a-data" only; any other token is refused).
// Any crash, sanitizer report or broken invariant is a finding.
//
// Invariants, per step:
//  - a step is a reply or a service request, never both nor neither;
//  - a reply is one response frame that decodes; a closing step's reply is an
//    ERROR with `closing` set, and nothing is read after it; a refused step's
//    reply is an ERROR;
//  - READ or STAT go to the service only after HELLO and authentication, and
//    a namespace identity's only for its own dataset (or the node's STAT);
//  - nothing is granted by a cluster-key proof (the fuzzer cannot make one);
//  - before HELLO is agreed, every reply closes except HELLO_REPLY.
// Seeds: tests/fuzz/corpus/peer_session.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "granary/peer/peer_auth.h"
#include "granary/protocol/protocol.h"
#include "peer_session.h"

namespace granary {
namespace {

using server_internal::PeerSession;
using server_internal::SessionStep;

void Check(bool condition, const char* what, const Status& status = Status::Ok()) {
  if (condition) return;
  std::fprintf(stderr, "peer_session_fuzz invariant broken: %s (%s)\n", what,
               status.ToString().c_str());
  std::abort();
}

ServerOptions Options(uint8_t mode) {
  ServerOptions o;
  o.node_name = "fuzz-node";
  if ((mode & 3) == 0) return o;
  auto auth = std::make_shared<ServerAuth>();
  if ((mode & 1) != 0) {
    Result<ClusterKeys> keys =
        ClusterKeys::FromKeys({std::string("fuzzer-does-not-know-this-key-0123456789")});
    Check(keys.ok(), "test key", keys.status());
    auth->cluster_keys = std::make_shared<const ClusterKeys>(std::move(*keys));
  }
  if ((mode & 2) != 0) {
    struct Unused : TokenVerifier {
      Result<PeerIdentity> Verify(std::string_view) override {
        return Status::Internal("the fuzzer verifies tokens itself");
      }
    };
    auth->tokens = std::make_shared<Unused>();
  }
  auth->authorize = [](const PeerIdentity& who, const std::string& dataset) {
    return who.namespace_ == "team-a" && dataset == "team-a-data"
               ? Status::Ok()
               : Status::PermissionDenied("another namespace's");
  };
  o.auth = std::move(auth);
  return o;
}

// The step's reply, decoded; checks the invariants about it.
void CheckReply(const SessionStep& step, const PeerSession& session, bool hello_before) {
  Result<Frame> frame = DecodeFrame(step.reply.header, FrameDirection::kResponses);
  Check(frame.ok(), "the reply is one response frame", frame.status());
  Result<ResponseMessage> reply = DecodeResponse(*frame);
  Check(reply.ok(), "the reply decodes", reply.status());
  const auto* error = std::get_if<ErrorReply>(&*reply);
  if (step.closing) Check(error != nullptr && error->closing, "a closing step sends ERROR closing");
  if (!step.refusal.ok()) Check(error != nullptr, "a refusal is an ERROR");
  if (error != nullptr && !step.closing) Check(!error->closing, "ERROR closing only when closing");
  if (!hello_before && !step.closing) {
    Check(std::holds_alternative<HelloReply>(*reply) && step.hello_agreed && session.hello_done(),
          "before HELLO only HELLO_REPLY keeps the connection");
  }
}

void Run(std::string_view bytes) {
  if (bytes.empty()) return;
  const uint8_t mode = static_cast<uint8_t>(bytes.front());
  bytes.remove_prefix(1);
  const ServerOptions options = Options(mode);
  PeerSession session(options);
  FrameDecoder decoder(FrameDirection::kRequests, options.limits);
  for (int guard = 0; guard < 10000 && !bytes.empty(); ++guard) {
    Result<size_t> used = decoder.Feed(bytes);
    if (!used.ok()) return;  // a framing error: the front end closes
    bytes.remove_prefix(*used);
    if (!decoder.has_frame()) {
      if (*used == 0) return;
      continue;
    }
    const Frame frame = decoder.TakeFrame();
    const bool hello_before = session.hello_done();
    SessionStep step = session.OnFrame(frame);
    if (step.hello_agreed) decoder.ExpectVersion(session.version());
    Check(!step.granted, "a cluster key proof passed that the fuzzer cannot make");
    if (step.service.has_value()) {
      Check(step.reply.header.empty() && !step.closing, "a service step sends nothing itself");
      Check(session.hello_done(), "a service request after HELLO");
      if (const auto* token = std::get_if<AuthRequest>(&*step.service)) {
        Check((mode & 2) != 0, "a token goes to a verifier only where tokens are accepted");
        if (token->credential != "token-a") return;  // refused: closing
        session.Grant(PeerIdentity{PeerIdentity::Kind::kNamespace, "team-a", "fuzz"});
        continue;
      }
      Check(session.authenticated(), "READ or STAT after authentication");
      const std::string* dataset = nullptr;
      if (const auto* read = std::get_if<ReadRequest>(&*step.service)) dataset = &read->dataset;
      if (const auto* stat = std::get_if<StatRequest>(&*step.service)) dataset = &stat->dataset;
      Check(dataset != nullptr, "a service request is READ, STAT or AUTH");
      if ((mode & 3) != 0) {
        Check(dataset->empty() || *dataset == "team-a-data",
              "a namespace identity reads only its own dataset");
      }
      continue;
    }
    CheckReply(step, session, hello_before);
    if (step.closing) return;
  }
}

}  // namespace
}  // namespace granary

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  granary::Run(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
