#pragma once

// ScriptedPeerTransport: a PeerTransport (granary/peer/peer_transport.h) over
// another one, that produces on cue the faults a real wire cannot be made to
// produce in a test: a READ whose reply never comes in time (the connection
// then counts as broken, as PeerClient's does after a timeout), bytes
// corrupted on the way (one byte of one item flipped before the transport's
// own checksum check, so the item arrives as kCorruption the way it would
// from a bad NIC or switch), and refused connections.
//
// Faults are armed per node address and fire on the Nth READ (counted from 1
// over every connection to that address) or the next connects. Everything
// else goes to the wrapped transport unchanged.
//
// Thread safety: any number of threads may use the transport and its
// connections (one thread per connection) while a test arms faults.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "granary/peer/peer_transport.h"

namespace granary::testing {

class ScriptedPeerTransport final : public PeerTransport,
                                    public std::enable_shared_from_this<ScriptedPeerTransport> {
 public:
  static std::shared_ptr<ScriptedPeerTransport> Wrap(std::shared_ptr<PeerTransport> real);

  std::string_view name() const override { return "scripted"; }
  Result<std::unique_ptr<PeerConnection>> Connect(std::string_view address,
                                                  const PeerClientOptions& options) override;

  // The `nth` READ to `address` fails with kDeadlineExceeded and breaks its
  // connection (the request did reach the node).
  void TimeoutRead(const std::string& address, uint64_t nth);
  // In the `nth` READ to `address`, item `item`'s bytes arrive corrupted.
  void CorruptRead(const std::string& address, uint64_t nth, size_t item);
  // The next `count` connects to `address` fail with kUnavailable.
  void RefuseConnects(const std::string& address, uint64_t count);

  // READs sent to `address` so far, and faults fired in all.
  uint64_t reads(const std::string& address) const;
  uint64_t faults_fired() const;

 private:
  class Connection;
  struct Script {
    uint64_t reads = 0;
    std::map<uint64_t, size_t> corrupt;  // nth READ -> item
    std::set<uint64_t> timeout;          // nth READ
    uint64_t refuse_connects = 0;
  };
  enum class Fault { kNone, kTimeout, kCorrupt };
  // Counts a READ to `address` and says which fault it gets.
  Fault NextRead(const std::string& address, size_t* item);

  explicit ScriptedPeerTransport(std::shared_ptr<PeerTransport> real) : real_(std::move(real)) {}

  const std::shared_ptr<PeerTransport> real_;
  mutable std::mutex mu_;
  std::map<std::string, Script> scripts_;  // guarded by mu_
  uint64_t fired_ = 0;                     // guarded by mu_
};

}  // namespace granary::testing
