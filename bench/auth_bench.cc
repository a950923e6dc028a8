// What authentication costs on the cache node's port (docs/benchmarks.md,
// "Authentication"): one HMAC proof, and a whole connection (TCP connect,
// HELLO, the handshake, one PING, close) to an in-process Server on loopback
// with no authentication and with the cluster key. The difference between the
// two connection figures is the handshake's cost per connection; a connection
// then serves any number of READs at no further cost.
//
//   build/release/bench/auth_bench --benchmark_repetitions=3

#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "granary/cachenode/server.h"
#include "granary/peer/peer_auth.h"
#include "granary/peer/peer_client.h"

namespace granary {
namespace {

class NothingService : public ReadService {
 public:
  Result<ReadAnswer> Read(const ReadRequest&) override { return Status::NotFound("no dataset"); }
  Result<StatReply> Stat(const StatRequest&) override { return StatReply{}; }
};

std::shared_ptr<const ClusterKeys> Keys() {
  static const auto keys = std::make_shared<const ClusterKeys>(
      *ClusterKeys::FromKeys({std::string("0123456789abcdef0123456789abcdef")}));
  return keys;
}

void BM_ClusterKeyProof(benchmark::State& state) {
  const AuthNonce a = RandomNonce(), b = RandomNonce();
  for (auto _ : state) {
    AuthProof p = ClusterKeyProof(Keys()->current(), ProofRole::kClient, a, b, "gpu-7",
                                  "granary-sidecar@gpu-3");
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_ClusterKeyProof);

void BM_Connection(benchmark::State& state) {
  const bool with_key = state.range(0) != 0;
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.node_name = "bench-node";
  if (with_key) {
    auto auth = std::make_shared<ServerAuth>();
    auth->cluster_keys = Keys();
    o.auth = std::move(auth);
  }
  auto server = Server::Start(std::make_shared<NothingService>(), o);
  if (!server.ok()) {
    state.SkipWithError(server.status().ToString().c_str());
    return;
  }
  PeerClientOptions c;
  c.client_name = "auth-bench";
  if (with_key) c.credentials.cluster_key = Keys();
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  for (auto _ : state) {
    auto client = PeerClient::Connect(address, c);
    if (!client.ok() || !client->Ping().ok()) {
      state.SkipWithError("connect or ping failed");
      break;
    }
  }
  state.SetLabel(with_key ? "cluster key" : "no authentication");
}
BENCHMARK(BM_Connection)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace granary

BENCHMARK_MAIN();
