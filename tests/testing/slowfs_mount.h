#pragma once

// SlowFsMount: granary-slowfs (bench/) serving a tree at a mount point with
// added latency or a bandwidth cap, so that a walk or staging through it
// lasts long enough for a test to act meanwhile (kill a node mid-walk, let
// Prometheus scrape several times). Start waits until the mount serves; the
// destructor stops the process and detaches the mount, also when the test
// failed half-way.
//
//   SlowFsMount slow(GRANARY_SLOWFS_BINARY, dir.Join("src"), dir.Join("mnt"));
//   ASSERT_OK(slow.Start({.latency_ms = 20}, dir.Join("slowfs.log")));
//
// Thread safety: the test's thread owns it.

#include <memory>
#include <string>

#include "granary/core/status.h"
#include "testing/daemon_process.h"

namespace granary::testing {

struct SlowFsOptions {
  double latency_ms = 0;      // added to every operation
  double bandwidth_mb_s = 0;  // 0: unlimited
};

class SlowFsMount {
 public:
  SlowFsMount(std::string binary, std::string src, std::string mnt);
  ~SlowFsMount();
  SlowFsMount(const SlowFsMount&) = delete;
  SlowFsMount& operator=(const SlowFsMount&) = delete;

  // Creates the mount point, starts granary-slowfs and waits (20 s at most)
  // until it serves its stats file: kDeadlineExceeded or kUnavailable with
  // its log's tail otherwise.
  Status Start(const SlowFsOptions& options, const std::string& log_path);

  const std::string& mount_point() const { return mnt_; }

  // SIGKILLs granary-slowfs, as a crash would: the mount stays, dead
  // ("Transport endpoint is not connected"), until the destructor (or a
  // TempDir it lies under) detaches it.
  Status KillServer();

 private:
  std::string binary_;
  std::string src_;
  std::string mnt_;
  std::unique_ptr<DaemonProcess> process_;
};

}  // namespace granary::testing
