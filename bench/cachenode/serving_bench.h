#pragma once

// cachenode_bench (b): serving, a ChunkReadService behind a Server on
// 127.0.0.1 (over TLS with --tls) serving the staged store to --clients
// PeerClient connections, each doing READs of --batch random samples. Before
// any timed run every sample is read over the wire once and compared byte for
// byte with the generated content; every timed READ item is checked against
// the source's checksum, and the server's payload count against what the
// clients got.
//
// Thread safety: main thread; TimedRound runs the clients on their own threads.

#include <memory>
#include <vector>

#include "bench_setup.h"
#include "granary/cachenode/chunk_read_service.h"
#include "granary/cachenode/server.h"
#include "granary/cachenode/stager.h"
#include "granary/core/peer_client.h"
#include "granary/core/tls.h"
#include "timed_run.h"

namespace granary::cachenode_bench {

class ServingBench {
 public:
  // Serves `setup`'s store with `stager` (complete), connects the clients
  // and verifies every sample over the wire (untimed).
  static Result<std::unique_ptr<ServingBench>> Start(const BenchSetup& setup, const Flags& f,
                                                     const std::shared_ptr<Stager>& stager);

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

  const BenchSetup& setup_;
  // Declared in the order they start: destroyed clients first, service last.
  std::shared_ptr<ChunkReadService> service_;
  std::shared_ptr<TlsContext> client_tls_;
  std::unique_ptr<Server> server_;
  std::vector<PeerClient> clients_;
  std::vector<BatchFn> serve_fns_;
  uint64_t verified_ = 0;
};

}  // namespace granary::cachenode_bench
