// The cache node's fabric front end (granary/cachenode/fabric_server.h) on a real
// granary-cachenode with `fabric_listen` (provider tcp, 127.0.0.1, port 0),
// driven with granary::fabric::Endpoint directly, message by message: HELLO,
// STAT, a READ whose bytes land in the reader's window equal to the source,
// a READ whose window is too small, a message that is not a frame, a READ
// before HELLO, a node over max_connections, a node with a cluster key
// refusing a READ before AUTH and serving it after a correct proof, and the
// fall-back to TCP only when the provider is not usable.

#include <gmock/gmock.h>
#include <sys/stat.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "granary/fabric/endpoint.h"
#include "granary/fabric/fabric_transport.h"
#include "granary/peer/peer_auth.h"
#include "granary/protocol/protocol.h"
#include "granary/protocol/protocol_format.h"
#include "testing/cachenode_fixture.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

namespace pf = protocol_format;
using namespace std::chrono_literals;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr char kClientName[] = "fabric-test";

const std::string kFabricYaml = "fabric_listen: 127.0.0.1:0\nfabric_provider: tcp\n";

// The node's fabric address from its record (kNodeLabelFabric).
Result<std::string> FabricAddress(CacheCluster& cluster, const std::string& node_id) {
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, cluster.store().ListNodes("default"));
  for (const NodeRecord& n : nodes) {
    if (n.id != node_id) continue;
    auto label = n.labels.find(std::string(kNodeLabelFabric));
    if (label == n.labels.end())
      return Status::NotFound("node " + node_id + " has no fabric label");
    return label->second;
  }
  return Status::NotFound("node " + node_id + " is not registered");
}

// A reader's side of one fabric connection, a message at a time.
class FabricPeer {
 public:
  static Result<std::unique_ptr<FabricPeer>> Connect(const std::string& address) {
    GRANARY_ASSIGN_OR_RETURN(NetAddress where, ParseNetAddress(address));
    fabric::EndpointOptions options;
    options.provider = "tcp";
    options.max_message_bytes =
        fabric::kWindowBytes + pf::kFrameHeaderSize + ProtocolLimits{}.max_body_bytes;
    GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<fabric::Endpoint> endpoint,
                             fabric::Endpoint::Connect(where, options, Clock::now() + 5s));
    return std::unique_ptr<FabricPeer>(new FabricPeer(std::move(endpoint)));
  }

  fabric::Endpoint& endpoint() { return *endpoint_; }

  Status SendRaw(const fabric::RemoteWindow& window, std::string_view frame) {
    return endpoint_->Send(fabric::EncodeRequestMessage(window, frame), Clock::now() + 5s);
  }

  // The next reply frame (a READ_REPLY's payload is in the window, not here).
  Result<ResponseMessage> Receive() {
    std::string message;
    GRANARY_RETURN_IF_ERROR(endpoint_->Receive(message, Clock::now() + 10s));
    FrameDecoder decoder(FrameDirection::kResponses, ProtocolLimits{}, PayloadMode::kDetached);
    GRANARY_ASSIGN_OR_RETURN(size_t used, decoder.Feed(message));
    if (!decoder.has_frame() || used != message.size()) {
      return Status::InvalidArgument("a reply message of " + std::to_string(message.size()) +
                                     " bytes is not one frame");
    }
    last_frame_ = decoder.TakeFrame();
    return DecodeResponse(last_frame_);
  }

  Result<ResponseMessage> Call(const RequestMessage& request,
                               const fabric::RemoteWindow& window = {},
                               uint16_t version = pf::kMaxVersion) {
    GRANARY_ASSIGN_OR_RETURN(std::string frame,
                             EncodeRequest(++next_id_, request, EncodeOptions{version, {}}));
    GRANARY_RETURN_IF_ERROR(SendRaw(window, frame));
    return Receive();
  }

  const Frame& last_frame() const { return last_frame_; }

  Status Hello() {
    GRANARY_ASSIGN_OR_RETURN(ResponseMessage reply,
                             Call(HelloRequest{pf::kMinVersion, pf::kMaxVersion, kClientName}, {},
                                  pf::kHandshakeVersion));
    if (!std::holds_alternative<HelloReply>(reply)) return Status::Internal("no HELLO_REPLY");
    hello_ = std::get<HelloReply>(reply);
    return Status::Ok();
  }
  const HelloReply& hello() const { return hello_; }

 private:
  explicit FabricPeer(std::unique_ptr<fabric::Endpoint> endpoint)
      : endpoint_(std::move(endpoint)) {}

  std::unique_ptr<fabric::Endpoint> endpoint_;
  uint64_t next_id_ = 0;
  Frame last_frame_;
  HelloReply hello_;
};

ErrorReply ErrorOf(const Result<ResponseMessage>& reply) {
  EXPECT_OK(reply);
  if (!reply.ok()) return ErrorReply{};
  EXPECT_TRUE(std::holds_alternative<ErrorReply>(*reply)) << "not an ERROR";
  return std::holds_alternative<ErrorReply>(*reply) ? std::get<ErrorReply>(*reply) : ErrorReply{};
}

ReadRequest ReadOf(const TestDataset& ds, const std::vector<SampleId>& ids) {
  ReadRequest read{ds.name, ds.manifest_id, {}};
  for (SampleId id : ids) {
    read.items.push_back(
        ReadItem{ReadKind::kSample, id, 0, static_cast<uint32_t>(ds.contents[id].size())});
  }
  return read;
}

// The READ of `ids` through the peer's window: the samples' bytes, as the
// window holds them after the reply (every item must be OK).
Result<std::vector<std::string>> ReadThroughWindow(FabricPeer& peer, const TestDataset& ds,
                                                   const std::vector<SampleId>& ids) {
  ReadRequest read = ReadOf(ds, ids);
  GRANARY_ASSIGN_OR_RETURN(fabric::RemoteWindow window,
                           peer.endpoint().Window(read.RequestedBytes()));
  GRANARY_ASSIGN_OR_RETURN(ResponseMessage reply, peer.Call(read, window));
  if (const auto* error = std::get_if<ErrorReply>(&reply)) return error->status;
  const auto* items = std::get_if<ReadReply>(&reply);
  if (items == nullptr) return Status::Internal("not a READ_REPLY");
  GRANARY_RETURN_IF_ERROR(CheckReadReply(read, *items));
  std::string_view payload = peer.endpoint().WindowBytes(read.RequestedBytes());
  std::vector<std::string> out;
  uint64_t offset = 0;
  for (const ReadReplyItem& item : items->items) {
    GRANARY_RETURN_IF_ERROR(item.status);
    out.emplace_back(payload.substr(offset, item.length));
    offset += item.length;
  }
  if (peer.last_frame().header.payload_length != offset) {
    return Status::Internal("the reply's payload_length disagrees with its items");
  }
  return out;
}

DatasetOptions Files(size_t files) {
  DatasetOptions options;
  options.files = files;
  return options;
}

struct FabricNode {
  std::unique_ptr<CacheCluster> cluster;
  TestDataset ds;
  std::string address;  // the fabric's, from the record
};

FabricNode StartFabricNode(const std::string& extra_yaml, size_t files = 200) {
  FabricNode f;
  auto cluster = CacheCluster::Create();
  EXPECT_OK(cluster);
  if (!cluster.ok()) return f;
  f.cluster = std::move(*cluster);
  CacheNodeOptions options;
  options.extra_yaml = extra_yaml;
  EXPECT_OK(f.cluster->StartNodes(1, options));
  auto ds = f.cluster->CreateDataset(Files(files));
  EXPECT_OK(ds);
  if (!ds.ok()) return f;
  f.ds = std::move(*ds);
  EXPECT_OK(f.cluster->WaitForPhase(f.ds.name, DatasetPhase::kReady));
  auto address = FabricAddress(*f.cluster, f.cluster->node(0).id());
  EXPECT_OK(address);
  if (address.ok()) f.address = *address;
  return f;
}

// A fabric node that requires the cluster key, in the file key_path (0600).
struct KeyedFabricNode {
  std::unique_ptr<TempDir> key_dir;  // first: removed after the node is stopped
  FabricNode node;
  std::string key_path;
};

KeyedFabricNode StartKeyedFabricNode(size_t files) {
  KeyedFabricNode k;
  k.key_dir = std::make_unique<TempDir>();
  auto hex = GenerateClusterKeyHex();
  EXPECT_OK(hex);
  if (!hex.ok()) return k;
  k.key_dir->WriteFile("cluster.key", *hex + "\n");
  k.key_path = k.key_dir->Join("cluster.key");
  EXPECT_EQ(::chmod(k.key_path.c_str(), 0600), 0);
  k.node = StartFabricNode(kFabricYaml + "cluster_key_file: " + k.key_path + "\n", files);
  return k;
}

TEST(FabricServerTest, HelloStatAndAReadWhoseBytesLandInTheWindow) {
  FabricNode f = StartFabricNode(kFabricYaml);
  ASSERT_FALSE(f.address.empty());
  // Advertised with the node's host and the fabric's own port.
  EXPECT_THAT(f.address, HasSubstr("127.0.0.1:"));
  EXPECT_NE(f.address, f.cluster->node(0).address());
  auto peer = FabricPeer::Connect(f.address);
  ASSERT_OK(peer);
  ASSERT_OK((*peer)->Hello());
  EXPECT_EQ((*peer)->hello().version, pf::kMaxVersion);
  EXPECT_EQ((*peer)->hello().peer_name, f.cluster->node(0).id());
  EXPECT_FALSE((*peer)->hello().auth_required);

  auto stat = (*peer)->Call(StatRequest{});
  ASSERT_OK(stat);
  ASSERT_TRUE(std::holds_alternative<StatReply>(*stat));
  EXPECT_EQ(std::get<StatReply>(*stat).state, NodeState::kServing);

  // Every sample, in batches, byte for byte; twice, so the window is reused.
  std::vector<SampleId> all = f.ds.AllIds();
  uint64_t bytes = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t first = 0; first < all.size(); first += 64) {
      const size_t end = std::min(all.size(), first + 64);
      std::vector<SampleId> ids(all.begin() + static_cast<ptrdiff_t>(first),
                                all.begin() + static_cast<ptrdiff_t>(end));
      auto got = ReadThroughWindow(**peer, f.ds, ids);
      ASSERT_OK(got);
      for (size_t i = 0; i < ids.size(); ++i) {
        ASSERT_EQ((*got)[i], f.ds.contents[ids[i]]) << "sample " << ids[i];
        bytes += (*got)[i].size();
      }
    }
  }
  // The window was registered once or a few times (grown), not per READ.
  EXPECT_LE((*peer)->endpoint().registrations(), 8u);

  CacheNode& node = f.cluster->node(0);
  EXPECT_OK(node.WaitForMetric("granary_cachenode_fabric_rma_bytes_total", {},
                               [&](double v) { return v >= static_cast<double>(bytes); }));
  EXPECT_OK(node.WaitForMetric("granary_cachenode_fabric_available", {},
                               [](double v) { return v == 1; }));
  EXPECT_OK(node.WaitForMetric("granary_cachenode_fabric_connections", {},
                               [](double v) { return v == 1; }));
  auto errors = node.MetricValue("granary_cachenode_fabric_errors_total");
  ASSERT_OK(errors);
  EXPECT_EQ(*errors, 0);
}

TEST(FabricServerTest, BadMessagesAreRefusedSayingWhy) {
  FabricNode f = StartFabricNode(kFabricYaml, 20);
  ASSERT_FALSE(f.address.empty());
  {
    // A READ whose window is smaller than what it asks: ERROR naming both
    // sizes, and the connection goes on.
    auto peer = FabricPeer::Connect(f.address);
    ASSERT_OK(peer);
    ASSERT_OK((*peer)->Hello());
    ReadRequest read = ReadOf(f.ds, {0, 1, 2});
    auto window = (*peer)->endpoint().Window(read.RequestedBytes());
    ASSERT_OK(window);
    fabric::RemoteWindow small = *window;
    small.length = read.RequestedBytes() - 1;
    ErrorReply error = ErrorOf((*peer)->Call(read, small));
    EXPECT_EQ(error.status.code(), StatusCode::kOutOfRange);
    EXPECT_THAT(error.status.message(),
                HasSubstr("asks for " + std::to_string(read.RequestedBytes()) +
                          " bytes but its window holds " + std::to_string(small.length)));
    EXPECT_FALSE(error.closing);
    auto got = ReadThroughWindow(**peer, f.ds, {0, 1, 2});
    ASSERT_OK(got);
    EXPECT_EQ((*got)[2], f.ds.contents[2]);
  }
  {
    // Not a frame: ERROR (request id 0, closing), then the node closes.
    auto peer = FabricPeer::Connect(f.address);
    ASSERT_OK(peer);
    ASSERT_OK((*peer)->Hello());
    ASSERT_OK((*peer)->SendRaw({}, "this is not a frame of the cache protocol at all"));
    ErrorReply error = ErrorOf((*peer)->Receive());
    EXPECT_EQ(error.status.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(error.status.message(), HasSubstr("bad magic"));
    EXPECT_TRUE(error.closing);
    EXPECT_EQ((*peer)->last_frame().header.request_id, 0u);
    std::string more;
    EXPECT_FALSE((*peer)->endpoint().Receive(more, Clock::now() + 5s).ok());
  }
  {
    // Two frames in one message: closing.
    auto peer = FabricPeer::Connect(f.address);
    ASSERT_OK(peer);
    ASSERT_OK((*peer)->Hello());
    auto ping = EncodeRequest(7, PingRequest{});
    ASSERT_OK(ping);
    ASSERT_OK((*peer)->SendRaw({}, *ping + *ping));
    ErrorReply error = ErrorOf((*peer)->Receive());
    EXPECT_THAT(error.status.message(), HasSubstr("exactly one frame per message"));
    EXPECT_TRUE(error.closing);
  }
  {
    // Shorter than a window: closing.
    auto peer = FabricPeer::Connect(f.address);
    ASSERT_OK(peer);
    ASSERT_OK((*peer)->endpoint().Send("short", Clock::now() + 5s));
    ErrorReply error = ErrorOf((*peer)->Receive());
    EXPECT_THAT(error.status.message(), HasSubstr("shorter than its 24-byte window"));
    EXPECT_TRUE(error.closing);
  }
  {
    // A READ before HELLO: FailedPrecondition, closing.
    auto peer = FabricPeer::Connect(f.address);
    ASSERT_OK(peer);
    ReadRequest read = ReadOf(f.ds, {0});
    auto window = (*peer)->endpoint().Window(read.RequestedBytes());
    ASSERT_OK(window);
    ErrorReply error = ErrorOf((*peer)->Call(read, *window, pf::kHandshakeVersion));
    EXPECT_EQ(error.status.code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(error.status.message(), HasSubstr("READ before HELLO"));
    EXPECT_TRUE(error.closing);
  }
  EXPECT_OK(f.cluster->node(0).WaitForMetric("granary_cachenode_fabric_errors_total", {},
                                             [](double v) { return v >= 5; }));
}

TEST(FabricServerTest, ANodeWithAClusterKeyServesOnlyAfterAProof) {
  KeyedFabricNode k = StartKeyedFabricNode(20);
  ASSERT_FALSE(k.node.address.empty());
  const TestDataset* ds = &k.node.ds;
  const std::string* address = &k.node.address;
  auto keys = ClusterKeys::Load(k.key_path);
  ASSERT_OK(keys);
  const std::string key = *keys->Find(keys->current_id());

  {
    auto peer = FabricPeer::Connect(*address);
    ASSERT_OK(peer);
    ASSERT_OK((*peer)->Hello());
    EXPECT_TRUE((*peer)->hello().auth_required);
    ReadRequest read = ReadOf(*ds, {0});
    auto window = (*peer)->endpoint().Window(read.RequestedBytes());
    ASSERT_OK(window);
    ErrorReply error = ErrorOf((*peer)->Call(read, *window));
    EXPECT_EQ(error.status.code(), StatusCode::kPermissionDenied);
    EXPECT_THAT(error.status.message(), HasSubstr("READ before authentication"));
    EXPECT_TRUE(error.closing);
  }
  {
    auto peer = FabricPeer::Connect(*address);
    ASSERT_OK(peer);
    ASSERT_OK((*peer)->Hello());
    const AuthNonce client = RandomNonce();
    const KeyId id = keys->current_id();
    auto challenge = (*peer)->Call(
        AuthRequest{AuthMethod::kClusterKey, client, std::string(id.begin(), id.end())});
    ASSERT_OK(challenge);
    ASSERT_TRUE(std::holds_alternative<AuthReply>(*challenge));
    const AuthReply& auth = std::get<AuthReply>(*challenge);
    const std::string node = k.node.cluster->node(0).id();
    // The node proves the key too.
    EXPECT_TRUE(ProofsEqual(
        auth.server_proof,
        ClusterKeyProof(key, ProofRole::kServer, client, auth.server_nonce, node, kClientName)));
    auto granted = (*peer)->Call(AuthProofRequest{
        ClusterKeyProof(key, ProofRole::kClient, client, auth.server_nonce, node, kClientName)});
    ASSERT_OK(granted);
    ASSERT_TRUE(std::holds_alternative<AuthProofReply>(*granted));
    EXPECT_EQ(std::get<AuthProofReply>(*granted).scope, "cluster");
    auto got = ReadThroughWindow(**peer, *ds, {0, 1, 2});
    ASSERT_OK(got);
    EXPECT_EQ((*got)[0], ds->contents[0]);
    EXPECT_EQ((*got)[2], ds->contents[2]);
  }
  {
    // A wrong proof: refused, closing.
    auto peer = FabricPeer::Connect(*address);
    ASSERT_OK(peer);
    ASSERT_OK((*peer)->Hello());
    const KeyId id = keys->current_id();
    auto challenge = (*peer)->Call(
        AuthRequest{AuthMethod::kClusterKey, RandomNonce(), std::string(id.begin(), id.end())});
    ASSERT_OK(challenge);
    ErrorReply error = ErrorOf((*peer)->Call(AuthProofRequest{AuthProof{}}));
    EXPECT_EQ(error.status.code(), StatusCode::kPermissionDenied);
    EXPECT_THAT(error.status.message(), HasSubstr("the proof does not match"));
    EXPECT_TRUE(error.closing);
  }
}

TEST(FabricServerTest, TheReadersFabricTransportReadsThroughTheNode) {
  // The reader's side as the fetcher uses it (granary/fabric/fabric_transport.h),
  // with the handshake it runs on every wire, against this front end.
  KeyedFabricNode k = StartKeyedFabricNode(100);
  ASSERT_FALSE(k.node.address.empty());
  const TestDataset* ds = &k.node.ds;
  const std::string* address = &k.node.address;
  auto keys = ClusterKeys::Load(k.key_path);
  ASSERT_OK(keys);

  std::shared_ptr<PeerTransport> transport = fabric::FabricPeerTransport("tcp");
  PeerClientOptions client;
  client.client_name = kClientName;
  client.credentials.cluster_key = std::make_shared<const ClusterKeys>(std::move(*keys));
  auto connection = transport->Connect(*address, client);
  ASSERT_OK(connection);
  std::vector<SampleId> ids = ds->AllIds();
  ReadRequest read = ReadOf(*ds, ids);
  auto result = (*connection)->Read(read);
  ASSERT_OK(result);
  ASSERT_EQ(result->size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_OK(result->status(i));
    ASSERT_EQ(result->bytes(i), ds->contents[ids[i]]) << "sample " << ids[i];
  }
  auto stat = (*connection)->Stat(StatRequest{});
  ASSERT_OK(stat);
  EXPECT_EQ(stat->state, NodeState::kServing);
  EXPECT_OK((*connection)->Ping());

  // Without the key: refused at connect, saying why.
  PeerClientOptions keyless;
  keyless.client_name = kClientName;
  auto refused = transport->Connect(*address, keyless);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("authentication"));
}

TEST(FabricServerTest, ConnectionsOverMaxConnectionsAreRefused) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  CacheNodeOptions options;
  options.max_connections = 1;
  options.extra_yaml = kFabricYaml;
  ASSERT_OK((*cluster)->StartNodes(1, options));
  auto address = FabricAddress(**cluster, (*cluster)->node(0).id());
  ASSERT_OK(address);
  auto first = FabricPeer::Connect(*address);
  ASSERT_OK(first);
  ASSERT_OK((*first)->Hello());
  auto second = FabricPeer::Connect(*address);
  ASSERT_OK(second);
  ErrorReply error = ErrorOf((*second)->Receive());
  EXPECT_EQ(error.status.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(error.status.message(), HasSubstr("max_connections"));
  EXPECT_TRUE(error.closing);
  EXPECT_OK((*cluster)->node(0).WaitForMetric("granary_cachenode_fabric_connections_rejected_total",
                                              {}, [](double v) { return v == 1; }));
  // The first one is still served.
  auto pong = (*first)->Call(PingRequest{});
  ASSERT_OK(pong);
  EXPECT_TRUE(std::holds_alternative<PongReply>(*pong));
  // A node stopping with a fabric connection open and idle closes it at once
  // and exits cleanly (its thread joined, well within the 2 s drain_timeout).
  const auto stopping = Clock::now();
  auto exit = (*cluster)->node(0).Terminate();
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(0)) << exit->ToString();
  EXPECT_LT(Clock::now() - stopping, 2s);
  std::string more;
  EXPECT_FALSE((*first)->endpoint().Receive(more, Clock::now() + 5s).ok());
}

TEST(FabricServerTest, AProviderThatIsNotHereFallsBackToTcpOnly) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  CacheNodeOptions options;
  options.extra_yaml = "fabric_listen: 127.0.0.1:0\nfabric_provider: nosuchprovider\n";
  ASSERT_OK((*cluster)->StartNodes(1, options));
  CacheNode& node = (*cluster)->node(0);
  EXPECT_OK(node.WaitForMetric("granary_cachenode_fabric_available", {},
                               [](double v) { return v == 0; }));
  // Not advertised: readers use TCP, which serves.
  auto label = FabricAddress(**cluster, node.id());
  EXPECT_EQ(label.status().code(), StatusCode::kNotFound) << label.status().ToString();
  auto ds = (*cluster)->CreateDataset(Files(20));
  ASSERT_OK(ds);
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady));
  DatasetReader reader(&(*cluster)->store(), *ds);
  auto got = reader.Read({0, 1});
  ASSERT_OK(got[0].status);
  EXPECT_EQ(got[0].bytes, ds->contents[0]);
  EXPECT_THAT(node.Log(), HasSubstr("serving TCP only"));
}

}  // namespace
}  // namespace granary::testing
