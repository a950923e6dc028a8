#include "serving_bench.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "granary/fabric/fabric_transport.h"

namespace granary::cachenode_bench {
namespace {

ReadRequest RequestFor(const Manifest& manifest, std::span<const SampleId> ids) {
  ReadRequest r;
  r.dataset = kDataset;
  r.manifest_id = manifest.id();
  r.items.reserve(ids.size());
  for (SampleId id : ids) {
    r.items.push_back(
        ReadItem{ReadKind::kSample, id, 0, static_cast<uint32_t>(manifest.SizeOf(id))});
  }
  return r;
}

// One READ over the wire, every item checked: OK, the sample's size, the
// source's checksum (PeerClient has checked the bytes against it). With
// `compare`, the bytes are also compared with freshly generated content.
Status ReadOverWire(PeerConnection& client, const Manifest& manifest,
                    const std::vector<uint64_t>& checksums, std::span<const SampleId> ids,
                    bool compare, uint64_t* bytes) {
  Result<PeerReadResult> result = client.Read(RequestFor(manifest, ids));
  if (!result.ok()) {
    return result.status().WithContext("a READ of " + std::to_string(ids.size()) + " samples");
  }
  if (result->size() != ids.size()) {
    return Status::Internal("a READ of " + std::to_string(ids.size()) + " samples got " +
                            std::to_string(result->size()) + " items back");
  }
  std::string expected;
  for (size_t i = 0; i < ids.size(); ++i) {
    const SampleId id = ids[i];
    const std::string what = "sample " + std::to_string(id) + " (" + manifest.PathOf(id) + ")";
    if (!result->status(i).ok()) return result->status(i).WithContext("serving " + what);
    const std::string_view got = result->bytes(i);
    const std::optional<uint64_t>& checksum = result->reply().items[i].checksum;
    if (got.size() != manifest.SizeOf(id) || !checksum.has_value() || *checksum != checksums[id]) {
      return Status::Corruption("serving " + what + ": got " + std::to_string(got.size()) +
                                " bytes with checksum " +
                                (checksum.has_value() ? std::to_string(*checksum) : "none") +
                                "; the source has " + std::to_string(manifest.SizeOf(id)) +
                                " bytes with checksum " + std::to_string(checksums[id]));
    }
    if (compare) {
      expected.resize(got.size());
      FillContent(id, expected);
      if (got != expected) {
        return Status::Corruption("serving " + what + ": the bytes differ from the source's");
      }
    }
    *bytes += got.size();
  }
  return Status::Ok();
}

Result<std::vector<std::unique_ptr<PeerConnection>>> ConnectClients(
    PeerTransport& transport, const std::string& address, uint32_t n,
    std::shared_ptr<const TlsContext> tls) {
  std::vector<std::unique_ptr<PeerConnection>> clients;
  for (uint32_t c = 0; c < n; ++c) {
    PeerClientOptions options;
    options.client_name = "cachenode-bench/" + std::to_string(c);
    options.tls = tls;
    GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<PeerConnection> client,
                             transport.Connect(address, options));
    clients.push_back(std::move(client));
  }
  return clients;
}

// Every sample once over the wire, compared byte for byte (untimed).
Result<uint64_t> VerifyEverySample(std::vector<std::unique_ptr<PeerConnection>>& clients,
                                   const Manifest& manifest, const std::vector<uint64_t>& checksums,
                                   uint32_t batch) {
  const uint64_t samples = manifest.sample_count();
  const uint64_t batches = (samples + batch - 1) / batch;
  FirstError error;
  std::vector<uint64_t> bytes(clients.size(), 0);
  {
    std::vector<std::jthread> threads;
    for (size_t c = 0; c < clients.size(); ++c) {
      threads.emplace_back([&, c] {
        std::vector<SampleId> ids;
        for (uint64_t b = c; b < batches && !error.failed() && !Interrupted();
             b += clients.size()) {
          ids.clear();
          for (uint64_t id = b * batch; id < std::min(samples, (b + 1) * batch); ++id) {
            ids.push_back(static_cast<SampleId>(id));
          }
          if (Status s = ReadOverWire(*clients[c], manifest, checksums, ids, true, &bytes[c]);
              !s.ok()) {
            error.Set(std::move(s));
          }
        }
      });
    }
  }
  if (error.failed()) return error.Take();
  if (Interrupted()) return InterruptedStatus();
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  if (total != manifest.total_bytes()) {
    return Status::Internal("the verification pass read " + std::to_string(total) + " of " +
                            std::to_string(manifest.total_bytes()) + " bytes");
  }
  return total;
}

}  // namespace

Result<std::unique_ptr<ServingBench>> ServingBench::Start(const BenchSetup& setup, const Flags& f,
                                                          const std::shared_ptr<Stager>& stager,
                                                          const std::string& transport,
                                                          const NetnsPair* netns) {
  const std::shared_ptr<const Manifest>& manifest = setup.manifest;
  const std::vector<uint64_t>& checksums = setup.checksums;
  std::unique_ptr<ServingBench> bench(new ServingBench(setup));
  const bool fabric = transport == "libfabric";
  bench->transport_ =
      fabric ? "libfabric/" + f.fabric_provider : "tcp" + std::string(f.tls ? "+tls" : "");
  bench->label_ = bench->transport_ + (netns != nullptr ? " across netns" : " loopback") +
                  (f.verify_once ? ", verify once" : "");
  ChunkReadServiceOptions service_options;
  service_options.node_name = "cachenode-bench";
  service_options.verify_once = f.verify_once;
  auto service = std::make_shared<ChunkReadService>(setup.store, service_options);
  GRANARY_RETURN_IF_ERROR(service->Add(manifest, stager));
  bench->service_ = service;
  ServerOptions server_options;
  server_options.node_name = "cachenode-bench";
  server_options.io_threads = f.io_threads;
  server_options.service_threads = f.service_threads;
  const std::string host = netns != nullptr ? netns->address(0) : "127.0.0.1";
  std::shared_ptr<TlsContext> client_tls;
  if (f.tls && !fabric) {
    // A self-signed certificate for the server's address, verified by the clients.
    const std::string cert = setup.Join("node.crt"), key = setup.Join("node.key");
    GRANARY_RETURN_IF_ERROR(MakeSelfSignedCertificate(cert, key, {host}));
    GRANARY_ASSIGN_OR_RETURN(server_options.tls, TlsContext::ForServer(cert, key));
    GRANARY_ASSIGN_OR_RETURN(client_tls, TlsContext::ForClient(cert));
  }
  bench->client_tls_ = client_tls;
  // The front end listens in the server's namespace (its sockets stay there).
  auto start_server = [&]() -> Status {
    if (fabric) {
      FabricServerOptions o;
      o.listen = host + ":0";
      o.provider = f.fabric_provider;
      o.server = server_options;
      GRANARY_ASSIGN_OR_RETURN(bench->fabric_server_, FabricServer::Start(service, o));
      return Status::Ok();
    }
    server_options.listen = host + ":0";
    GRANARY_ASSIGN_OR_RETURN(bench->server_, Server::Start(service, server_options));
    return Status::Ok();
  };
  GRANARY_RETURN_IF_ERROR(netns != nullptr ? netns->In(0, start_server) : start_server());
  const uint16_t port = fabric ? bench->fabric_server_->port() : bench->server_->port();
  std::shared_ptr<PeerTransport> wire =
      fabric ? fabric::FabricPeerTransport(f.fabric_provider) : TcpPeerTransport();
  auto connect = [&]() -> Status {
    GRANARY_ASSIGN_OR_RETURN(
        bench->clients_,
        ConnectClients(*wire, host + ":" + std::to_string(port), f.clients, client_tls));
    return Status::Ok();
  };
  GRANARY_RETURN_IF_ERROR(netns != nullptr ? netns->In(1, connect) : connect());
  const auto t0 = Clock::now();
  GRANARY_ASSIGN_OR_RETURN(bench->verified_,
                           VerifyEverySample(bench->clients_, *manifest, checksums, f.batch));
  Progress("  " + bench->label_ + ": verified every sample over the wire byte for byte (" +
           Fixed(Seconds(Clock::now() - t0), 1) + " s)");

  for (std::unique_ptr<PeerConnection>& client : bench->clients_) {
    PeerConnection* raw = client.get();
    bench->serve_fns_.push_back([raw, &setup](std::span<const SampleId> ids, uint64_t* bytes) {
      return ReadOverWire(*raw, *setup.manifest, setup.checksums, ids, false, bytes);
    });
  }
  return bench;
}

ServingBench::ServerTotals ServingBench::Totals() const {
  if (fabric_server_ != nullptr) {
    const FabricCounters c = fabric_server_->Counters();
    return {c.rma_bytes_total, c.errors_total};
  }
  const ServerCounters c = server_->Counters();
  return {c.payload_bytes_total, c.read_item_errors_total};
}

// The server's totals once no reply is still being counted. A client has its
// reply as soon as the bytes reach it, and the server counts them a moment
// later, on its own thread: a snapshot taken right after the clients stopped
// may miss their last batch (one run failed that way: one batch of 16
// counted on one side only). Every client is idle when this is called, so the
// totals settle at once; two equal readings 5 ms apart say they have.
ServingBench::ServerTotals ServingBench::SettledTotals() const {
  ServerTotals last = Totals();
  for (int i = 0; i < 200; ++i) {  // at most a second
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ServerTotals now = Totals();
    if (now == last) return now;
    last = now;
  }
  return last;
}

Result<LoadFigures> ServingBench::TimedRound(const Flags& f) {
  ServerTotals before;  // after the warm-up READs
  GRANARY_ASSIGN_OR_RETURN(LoadFigures served, TimedRun(serve_fns_, f.batch, f.files, f.seconds,
                                                        f.seed, [&] { before = SettledTotals(); }));
  const ServerTotals after = SettledTotals();
  const uint64_t payload = after.payload_bytes - before.payload_bytes;
  if (payload != served.bytes || after.errors != 0) {
    return Status::Internal(label_ + ": the server sent " + std::to_string(payload) +
                            " payload bytes in a timed run and the clients got " +
                            std::to_string(served.bytes) + "; " + std::to_string(after.errors) +
                            " items failed");
  }
  return served;
}

Status ServingBench::CheckServiceCounters() const {
  const ChunkReadServiceCounters service_counters = service_->Counters();
  if (service_counters.items_on_demand != 0 || service_counters.checksum_failures != 0) {
    return Status::Internal("serving fetched " + std::to_string(service_counters.items_on_demand) +
                            " items on demand and saw " +
                            std::to_string(service_counters.checksum_failures) +
                            " checksum failures; everything should have been staged and sound");
  }
  return Status::Ok();
}

}  // namespace granary::cachenode_bench
