#pragma once

// cachenode_bench --netns: two network namespaces joined by a veth pair, so
// that the server and its clients do not share a loopback but talk through a
// real (virtual) link, as two hosts do. One process still holds both: a
// thread enters a namespace (setns, which changes only the calling thread)
// to make the sockets or endpoints that live there, and comes back.
//
//   gb<pid>a  10.<x>.<y>.1/24  veth gb<pid>a0 === gb<pid>b0  10.<x>.<y>.2/24  gb<pid>b
//
// Made with `ip` (each call bounded); the destructor deletes both namespaces
// (which deletes the veth), also after a Create that failed half way.
// Needs root. Thread safety: Enter is per thread; Create and the destructor
// from the main thread.

#include <functional>
#include <memory>
#include <string>

#include "granary/core/status.h"

namespace granary::cachenode_bench {

class NetnsPair {
 public:
  static Result<std::unique_ptr<NetnsPair>> Create();
  ~NetnsPair();
  NetnsPair(const NetnsPair&) = delete;
  NetnsPair& operator=(const NetnsPair&) = delete;

  // Runs `fn` with the calling thread in namespace `side` (0: the server's,
  // 1: the clients'), then returns the thread to where it was.
  Status In(int side, const std::function<Status()>& fn) const;
  // The side's address on the link.
  const std::string& address(int side) const { return address_[side]; }
  const std::string& name(int side) const { return name_[side]; }

 private:
  NetnsPair() = default;
  std::string name_[2];
  std::string address_[2];
};

}  // namespace granary::cachenode_bench
