// PeerSession (cachenode/src/peer_session.h) driven with frames, no wire: the
// handshake, authentication by cluster key and by token, what an identity
// may read, and every refusal, each with what it counts and whether it
// closes the connection.

#include "peer_session.h"

#include <gmock/gmock.h>

#include <memory>
#include <string>
#include <vector>

#include "granary/protocol/protocol_format.h"
#include "testing/test_util.h"

namespace granary::server_internal {
namespace {

namespace pf = protocol_format;
using ::testing::HasSubstr;

constexpr char kKey[] = "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk";  // 32 bytes
constexpr char kOtherKey[] = "oooooooooooooooooooooooooooooooo";
constexpr char kClient[] = "session-test";
const ContentId kManifest{0x1111, 0x2222};

ServerOptions OpenOptions() {
  ServerOptions o;
  o.node_name = "node-test";
  return o;
}

std::shared_ptr<const ClusterKeys> Keys(std::vector<std::string> keys) {
  auto loaded = ClusterKeys::FromKeys(std::move(keys));
  EXPECT_OK(loaded);
  return std::make_shared<const ClusterKeys>(std::move(*loaded));
}

// A node with the cluster key and tokens; namespace team-a owns "team-a-data".
ServerOptions AuthOptions() {
  ServerOptions o = OpenOptions();
  auto auth = std::make_shared<ServerAuth>();
  auth->cluster_keys = Keys({kKey});
  auth->authorize = [](const PeerIdentity& who, const std::string& dataset) {
    return who.namespace_ == "team-a" && dataset == "team-a-data"
               ? Status::Ok()
               : Status::PermissionDenied("not this namespace's");
  };
  // The session only hands a token over; any verifier object will do.
  struct NoVerifier : TokenVerifier {
    Result<PeerIdentity> Verify(std::string_view) override {
      return Status::Internal("not called by the session");
    }
  };
  auth->tokens = std::make_shared<NoVerifier>();
  o.auth = std::move(auth);
  return o;
}

Frame FrameOf(uint64_t id, const RequestMessage& message, uint16_t version = pf::kMaxVersion) {
  Result<std::string> bytes = EncodeRequest(id, message, EncodeOptions{version, {}});
  EXPECT_OK(bytes);
  Result<Frame> frame = DecodeFrame(bytes.ok() ? *bytes : "", FrameDirection::kRequests);
  EXPECT_OK(frame);
  return frame.ok() ? std::move(*frame) : Frame{};
}

// The reply the step carries, decoded.
ResponseMessage ReplyOf(const SessionStep& step) {
  EXPECT_FALSE(step.service.has_value());
  Result<Frame> frame = DecodeFrame(step.reply.header, FrameDirection::kResponses);
  EXPECT_OK(frame);
  if (!frame.ok()) return ErrorReply{};
  Result<ResponseMessage> message = DecodeResponse(*frame);
  EXPECT_OK(message);
  return message.ok() ? std::move(*message) : ResponseMessage{ErrorReply{}};
}

ErrorReply ErrorOf(const SessionStep& step) {
  ResponseMessage reply = ReplyOf(step);
  EXPECT_TRUE(std::holds_alternative<ErrorReply>(reply)) << "not an ERROR";
  return std::holds_alternative<ErrorReply>(reply) ? std::get<ErrorReply>(reply) : ErrorReply{};
}

HelloRequest Hello(uint16_t min = pf::kMinVersion, uint16_t max = pf::kMaxVersion) {
  return HelloRequest{min, max, kClient};
}

ReadRequest Read(std::string dataset = "imagenet") {
  return ReadRequest{std::move(dataset), kManifest, {{ReadKind::kSample, 0, 0, 10}}};
}

void ExpectHello(PeerSession& session, bool auth_required) {
  SessionStep step = session.OnFrame(FrameOf(1, Hello()));
  EXPECT_TRUE(step.hello_agreed);
  EXPECT_FALSE(step.closing);
  ResponseMessage reply = ReplyOf(step);
  ASSERT_TRUE(std::holds_alternative<HelloReply>(reply));
  EXPECT_EQ(std::get<HelloReply>(reply).version, pf::kMaxVersion);
  EXPECT_EQ(std::get<HelloReply>(reply).peer_name, "node-test");
  EXPECT_EQ(std::get<HelloReply>(reply).auth_required, auth_required);
  EXPECT_EQ(session.peer_name(), kClient);
}

// AUTH with `key`'s id: the challenge's server nonce, or nothing when refused.
SessionStep Challenge(PeerSession& session, const std::string& key, const AuthNonce& nonce) {
  KeyId id = ClusterKeyId(key);
  return session.OnFrame(
      FrameOf(2, AuthRequest{AuthMethod::kClusterKey, nonce, std::string(id.begin(), id.end())}));
}

AuthProof ClientProof(const std::string& key, const AuthNonce& client, const AuthNonce& server) {
  return ClusterKeyProof(key, ProofRole::kClient, client, server, "node-test", kClient);
}

TEST(PeerSessionTest, AnOpenNodeServesReadsAndStatsAfterHello) {
  ServerOptions options = OpenOptions();
  PeerSession session(options);
  EXPECT_FALSE(session.hello_done());
  ExpectHello(session, false);
  EXPECT_TRUE(session.authenticated());
  EXPECT_TRUE(
      std::holds_alternative<PongReply>(ReplyOf(session.OnFrame(FrameOf(3, PingRequest{})))));
  SessionStep read = session.OnFrame(FrameOf(4, Read()));
  ASSERT_TRUE(read.service.has_value());
  EXPECT_EQ(std::get<ReadRequest>(*read.service), Read());
  EXPECT_TRUE(read.refusal.ok());
  SessionStep stat = session.OnFrame(FrameOf(5, StatRequest{}));
  ASSERT_TRUE(stat.service.has_value());
  EXPECT_TRUE(std::holds_alternative<StatRequest>(*stat.service));
}

TEST(PeerSessionTest, ARequestBeforeHelloClosesTheConnection) {
  ServerOptions options = OpenOptions();
  for (const RequestMessage& first :
       std::vector<RequestMessage>{Read(), PingRequest{}, StatRequest{}}) {
    PeerSession session(options);
    SessionStep step = session.OnFrame(FrameOf(7, first, pf::kHandshakeVersion));
    EXPECT_TRUE(step.closing);
    EXPECT_TRUE(step.warn);
    EXPECT_TRUE(step.policy_error);
    ErrorReply error = ErrorOf(step);
    EXPECT_EQ(error.status.code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(error.status.message(), HasSubstr("before HELLO"));
    EXPECT_TRUE(error.closing);
    EXPECT_FALSE(session.hello_done());
  }
}

TEST(PeerSessionTest, ASecondHelloAndABadHelloClose) {
  ServerOptions options = OpenOptions();
  PeerSession session(options);
  ExpectHello(session, false);
  SessionStep again = session.OnFrame(FrameOf(9, Hello()));
  EXPECT_TRUE(again.closing);
  EXPECT_TRUE(again.policy_error);
  EXPECT_THAT(ErrorOf(again).status.message(), HasSubstr("a second HELLO"));

  // A HELLO with a body that does not decode leaves no version: closing.
  Frame bad = FrameOf(1, Hello());
  bad.body.pop_back();
  bad.header.body_length = static_cast<uint32_t>(bad.body.size());
  PeerSession fresh(options);
  SessionStep step = fresh.OnFrame(bad);
  EXPECT_TRUE(step.closing);
  EXPECT_TRUE(step.message_error);
  EXPECT_FALSE(step.policy_error);
  EXPECT_FALSE(fresh.hello_done());
}

TEST(PeerSessionTest, AMalformedRequestAfterHelloIsAnsweredAndTheSessionGoesOn) {
  ServerOptions options = OpenOptions();
  PeerSession session(options);
  ExpectHello(session, false);
  Frame bad = FrameOf(4, Read());
  bad.body.resize(bad.body.size() - 3);
  bad.header.body_length = static_cast<uint32_t>(bad.body.size());
  SessionStep step = session.OnFrame(bad);
  EXPECT_FALSE(step.closing);
  EXPECT_TRUE(step.message_error);
  EXPECT_FALSE(step.warn);
  EXPECT_FALSE(ErrorOf(step).closing);
  EXPECT_TRUE(session.OnFrame(FrameOf(5, Read())).service.has_value());
}

TEST(PeerSessionTest, AuthToAnOpenNodeIsRefused) {
  ServerOptions options = OpenOptions();
  PeerSession session(options);
  ExpectHello(session, false);
  SessionStep step = Challenge(session, kKey, RandomNonce());
  EXPECT_TRUE(step.closing);
  EXPECT_TRUE(step.policy_error);
  ErrorReply error = ErrorOf(step);
  EXPECT_EQ(error.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(error.status.message(), HasSubstr("requires no authentication"));
}

TEST(PeerSessionTest, AVersionOneClientIsRefusedWhereAuthenticationIsRequired) {
  ServerOptions options = AuthOptions();
  PeerSession session(options);
  SessionStep step = session.OnFrame(FrameOf(1, Hello(1, 1), pf::kHandshakeVersion));
  EXPECT_TRUE(step.closing);
  EXPECT_TRUE(step.auth_refused);
  EXPECT_TRUE(step.policy_error);
  ErrorReply error = ErrorOf(step);
  EXPECT_EQ(error.status.code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(error.status.message(), HasSubstr("upgrade it"));
  EXPECT_FALSE(session.hello_done());
}

TEST(PeerSessionTest, TheClusterKeyIsProvedThenEveryDatasetIsReadable) {
  ServerOptions options = AuthOptions();
  PeerSession session(options);
  ExpectHello(session, true);
  EXPECT_FALSE(session.authenticated());
  // PING is answered before AUTH; READ is refused and closes.
  EXPECT_TRUE(
      std::holds_alternative<PongReply>(ReplyOf(session.OnFrame(FrameOf(3, PingRequest{})))));

  const AuthNonce client = RandomNonce();
  SessionStep challenge = Challenge(session, kKey, client);
  ResponseMessage reply = ReplyOf(challenge);
  ASSERT_TRUE(std::holds_alternative<AuthReply>(reply));
  const AuthReply& auth = std::get<AuthReply>(reply);
  EXPECT_FALSE(auth.granted);
  // The server proves the key first.
  EXPECT_TRUE(ProofsEqual(
      auth.server_proof,
      ClusterKeyProof(kKey, ProofRole::kServer, client, auth.server_nonce, "node-test", kClient)));
  SessionStep proof =
      session.OnFrame(FrameOf(4, AuthProofRequest{ClientProof(kKey, client, auth.server_nonce)}));
  EXPECT_TRUE(proof.granted);
  EXPECT_TRUE(proof.auth_granted);
  ResponseMessage granted = ReplyOf(proof);
  ASSERT_TRUE(std::holds_alternative<AuthProofReply>(granted));
  EXPECT_EQ(std::get<AuthProofReply>(granted).scope, "cluster");
  EXPECT_TRUE(session.authenticated());
  EXPECT_TRUE(session.OnFrame(FrameOf(5, Read("any-dataset"))).service.has_value());

  // A second AUTH after the grant.
  SessionStep again = Challenge(session, kKey, RandomNonce());
  EXPECT_TRUE(again.closing);
  EXPECT_THAT(ErrorOf(again).status.message(), HasSubstr("a second AUTH"));
}

TEST(PeerSessionTest, AReadBeforeAuthIsRefusedAndCloses) {
  ServerOptions options = AuthOptions();
  PeerSession session(options);
  ExpectHello(session, true);
  SessionStep step = session.OnFrame(FrameOf(3, Read()));
  EXPECT_FALSE(step.service.has_value());
  EXPECT_TRUE(step.closing);
  EXPECT_TRUE(step.auth_refused);
  EXPECT_TRUE(step.policy_error);
  ErrorReply error = ErrorOf(step);
  EXPECT_EQ(error.status.code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(error.status.message(), HasSubstr("READ before authentication"));
}

TEST(PeerSessionTest, AWrongProofAProofWithoutAChallengeAndAnUnknownKeyAreRefused) {
  ServerOptions options = AuthOptions();
  {
    PeerSession session(options);
    ExpectHello(session, true);
    SessionStep step = session.OnFrame(FrameOf(2, AuthProofRequest{ClientProof(kKey, {}, {})}));
    EXPECT_TRUE(step.closing);
    EXPECT_TRUE(step.policy_error);
    EXPECT_THAT(ErrorOf(step).status.message(), HasSubstr("AUTH_PROOF without a challenge"));
  }
  {
    PeerSession session(options);
    ExpectHello(session, true);
    const AuthNonce client = RandomNonce();
    ResponseMessage reply = ReplyOf(Challenge(session, kKey, client));
    ASSERT_TRUE(std::holds_alternative<AuthReply>(reply));
    // A proof made with another key (or for another challenge).
    SessionStep step = session.OnFrame(FrameOf(
        3,
        AuthProofRequest{ClientProof(kOtherKey, client, std::get<AuthReply>(reply).server_nonce)}));
    EXPECT_TRUE(step.closing);
    EXPECT_TRUE(step.auth_refused);
    EXPECT_FALSE(step.granted);
    ErrorReply error = ErrorOf(step);
    EXPECT_EQ(error.status.code(), StatusCode::kPermissionDenied);
    EXPECT_THAT(error.status.message(), HasSubstr("the proof does not match"));
    EXPECT_FALSE(session.authenticated());
  }
  {
    PeerSession session(options);
    ExpectHello(session, true);
    SessionStep step = Challenge(session, kOtherKey, RandomNonce());
    EXPECT_TRUE(step.closing);
    EXPECT_TRUE(step.auth_refused);
    EXPECT_THAT(ErrorOf(step).status.message(), HasSubstr("is not one of this node's"));
  }
}

TEST(PeerSessionTest, TheChannelBindingIsInTheProofsAndItsFailureRefuses) {
  ServerOptions options = AuthOptions();
  {
    PeerSession session(options, [] { return Result<std::string>(std::string("tls-binding")); });
    ExpectHello(session, true);
    const AuthNonce client = RandomNonce();
    ResponseMessage reply = ReplyOf(Challenge(session, kKey, client));
    ASSERT_TRUE(std::holds_alternative<AuthReply>(reply));
    const AuthNonce server = std::get<AuthReply>(reply).server_nonce;
    // A proof without the binding (another channel's) does not pass.
    SessionStep step =
        session.OnFrame(FrameOf(3, AuthProofRequest{ClientProof(kKey, client, server)}));
    EXPECT_TRUE(step.auth_refused);
  }
  {
    PeerSession session(options, [] { return Result<std::string>(std::string("tls-binding")); });
    ExpectHello(session, true);
    const AuthNonce client = RandomNonce();
    ResponseMessage reply = ReplyOf(Challenge(session, kKey, client));
    const AuthNonce server = std::get<AuthReply>(reply).server_nonce;
    AuthProof proof = ClusterKeyProof(kKey, ProofRole::kClient, client, server, "node-test",
                                      kClient, "tls-binding");
    EXPECT_TRUE(session.OnFrame(FrameOf(3, AuthProofRequest{proof})).granted);
  }
  {
    PeerSession session(options,
                        [] { return Result<std::string>(Status::Internal("no binding")); });
    ExpectHello(session, true);
    SessionStep step = Challenge(session, kKey, RandomNonce());
    EXPECT_TRUE(step.closing);
    EXPECT_TRUE(step.auth_refused);
    EXPECT_THAT(ErrorOf(step).status.message(), HasSubstr("no binding"));
  }
}

TEST(PeerSessionTest, ATokenGoesToTheVerifierAndReadsOnlyItsNamespace) {
  ServerOptions options = AuthOptions();
  PeerSession session(options);
  ExpectHello(session, true);
  SessionStep step = session.OnFrame(
      FrameOf(2, AuthRequest{AuthMethod::kKubernetesToken, RandomNonce(), "a.jwt.token"}));
  ASSERT_TRUE(step.service.has_value());
  ASSERT_TRUE(std::holds_alternative<AuthRequest>(*step.service));
  EXPECT_EQ(std::get<AuthRequest>(*step.service).credential, "a.jwt.token");
  // While the verifier works, a second AUTH is refused.
  EXPECT_TRUE(Challenge(session, kKey, RandomNonce()).closing);

  PeerSession granted(options);
  ExpectHello(granted, true);
  (void)granted.OnFrame(
      FrameOf(2, AuthRequest{AuthMethod::kKubernetesToken, RandomNonce(), "a.jwt.token"}));
  granted.Grant(PeerIdentity{PeerIdentity::Kind::kNamespace, "team-a",
                             "system:serviceaccount:team-a:trainer"});
  EXPECT_TRUE(granted.authenticated());
  EXPECT_TRUE(granted.OnFrame(FrameOf(3, Read("team-a-data"))).service.has_value());
  EXPECT_TRUE(granted.OnFrame(FrameOf(4, StatRequest{})).service.has_value());  // the node's own
  // Another namespace's dataset: refused for that request, the session goes on.
  for (const RequestMessage& other :
       std::vector<RequestMessage>{Read("team-b-data"), StatRequest{"team-b-data", ContentId{}}}) {
    SessionStep refused = granted.OnFrame(FrameOf(5, other));
    EXPECT_FALSE(refused.service.has_value());
    EXPECT_FALSE(refused.closing);
    EXPECT_TRUE(refused.policy_error);
    ErrorReply error = ErrorOf(refused);
    EXPECT_EQ(error.status.code(), StatusCode::kPermissionDenied);
    EXPECT_THAT(error.status.message(),
                HasSubstr("dataset 'team-b-data' is not readable as namespace/team-a"));
    EXPECT_FALSE(error.closing);
  }
  EXPECT_TRUE(granted.OnFrame(FrameOf(6, Read("team-a-data"))).service.has_value());
}

TEST(PeerSessionTest, ATokenToANodeWithoutAVerifierIsRefused) {
  ServerOptions options = AuthOptions();
  auto auth = std::make_shared<ServerAuth>(*options.auth);
  auth->tokens = nullptr;
  options.auth = auth;
  PeerSession session(options);
  ExpectHello(session, true);
  SessionStep step = session.OnFrame(
      FrameOf(2, AuthRequest{AuthMethod::kKubernetesToken, RandomNonce(), "a.jwt.token"}));
  EXPECT_FALSE(step.service.has_value());
  EXPECT_TRUE(step.closing);
  EXPECT_TRUE(step.auth_refused);
  EXPECT_THAT(ErrorOf(step).status.message(), HasSubstr("accepts no Kubernetes tokens"));
}

}  // namespace
}  // namespace granary::server_internal
