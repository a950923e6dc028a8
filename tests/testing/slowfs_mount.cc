#include "testing/slowfs_mount.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <utility>

#include "testing/fuse_mounts.h"
#include "testing/test_util.h"

namespace granary::testing {

using namespace std::chrono_literals;

SlowFsMount::SlowFsMount(std::string binary, std::string src, std::string mnt)
    : binary_(std::move(binary)), src_(std::move(src)), mnt_(std::move(mnt)) {}

SlowFsMount::~SlowFsMount() {
  if (process_) (void)process_->Terminate(10s);
  // Whether or not granary-slowfs unmounted on its way out.
  if (Status detached = DetachMount(mnt_); !detached.ok()) {
    ADD_FAILURE() << "granary-slowfs at " << mnt_ << ": " << detached.ToString();
  }
}

Status SlowFsMount::Start(const SlowFsOptions& options, const std::string& log_path) {
  std::filesystem::create_directories(mnt_);
  DaemonProcessOptions o;
  o.binary = binary_;
  o.args = {src_,
            mnt_,
            "--latency-ms",
            std::to_string(options.latency_ms),
            "--bandwidth-mb-s",
            std::to_string(options.bandwidth_mb_s),
            "--max-concurrency",
            "0"};
  o.log_path = log_path;
  o.name = "granary-slowfs";
  GRANARY_ASSIGN_OR_RETURN(process_, DaemonProcess::Start(o));
  const std::string stats = mnt_ + "/.slowfs-stats";
  if (!WaitFor([&] { return ::access(stats.c_str(), R_OK) == 0 || !process_->Running(); }, 20s)) {
    return Status::DeadlineExceeded("granary-slowfs did not serve " + mnt_ + ":\n" +
                                    process_->LogTail());
  }
  if (!process_->Running()) {
    return Status::Unavailable("granary-slowfs exited:\n" + process_->LogTail());
  }
  return Status::Ok();
}

Status SlowFsMount::KillServer() {
  if (!process_) return Status::FailedPrecondition("granary-slowfs at " + mnt_ + " never started");
  return process_->Kill().status();
}

}  // namespace granary::testing
