#pragma once

// cachenode_bench (b): serving, a ChunkReadService behind a front end
// serving the staged store to --clients connections, each doing READs of
// --batch random samples. The front end is the TCP Server (over TLS with
// --tls) or the FabricServer (libfabric, --fabric-provider), chosen per
// ServingBench; it listens on 127.0.0.1, or with --netns in one network
// namespace of a NetnsPair while the clients connect from the other. Before
// any timed run every sample is read over the wire once and compared byte for
// byte with the generated content; every timed READ item is checked against
// the source's checksum, and the server's payload count against what the
// clients got.
//
// Thread safety: main thread; TimedRound runs the clients on their own threads.

#include <memory>
#include <string>
#include <vector>

#include "bench_setup.h"
#include "granary/cachenode/chunk_read_service.h"
#include "granary/cachenode/fabric_server.h"
#include "granary/cachenode/server.h"
#include "granary/cachenode/stager.h"
#include "granary/peer/peer_transport.h"
#include "granary/peer/tls.h"
#include "netns_pair.h"
#include "timed_run.h"

namespace granary::cachenode_bench {

class ServingBench {
 public:
  // Serves `setup`'s store with `stager` (complete) over `transport` ("tcp"
  // or "libfabric"), across `netns` when given, connects the clients and
  // verifies every sample over the wire (untimed).
  static Result<std::unique_ptr<ServingBench>> Start(const BenchSetup& setup, const Flags& f,
                                                     const std::shared_ptr<Stager>& stager,
                                                     const std::string& transport,
                                                     const NetnsPair* netns);

  // "tcp loopback", "libfabric/tcp across netns": the report's row.
  const std::string& label() const { return label_; }
  const std::string& transport() const { return transport_; }

  // One timed run of every client (TimedRun); fails unless the server sent
  // exactly the payload the clients got and no item failed.
  Result<LoadFigures> TimedRound(const Flags& f);

  // Fails if serving fetched anything on demand or saw a checksum failure:
  // everything was staged and sound.
  Status CheckServiceCounters() const;

  // The bytes the verification pass compared.
  uint64_t verified_bytes() const { return verified_; }

 private:
  explicit ServingBench(const BenchSetup& setup) : setup_(setup) {}

  // Payload bytes the front end has sent and items (or requests) it failed.
  struct ServerTotals {
    uint64_t payload_bytes = 0;
    uint64_t errors = 0;
    friend bool operator==(const ServerTotals&, const ServerTotals&) = default;
  };
  ServerTotals Totals() const;
  ServerTotals SettledTotals() const;

  const BenchSetup& setup_;
  std::string transport_;
  std::string label_;
  // Declared in the order they start: destroyed clients first, service last.
  std::shared_ptr<ChunkReadService> service_;
  std::shared_ptr<TlsContext> client_tls_;
  std::unique_ptr<Server> server_;               // tcp
  std::unique_ptr<FabricServer> fabric_server_;  // libfabric
  std::vector<std::unique_ptr<PeerConnection>> clients_;
  std::vector<BatchFn> serve_fns_;
  uint64_t verified_ = 0;
};

}  // namespace granary::cachenode_bench
