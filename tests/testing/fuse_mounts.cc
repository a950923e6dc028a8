#include "testing/fuse_mounts.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

extern char** environ;

namespace granary::testing {
namespace {

// mountinfo writes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const std::string digits = field.substr(i + 1, 3);
      if (digits.size() == 3 &&
          std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '7'; })) {
        out.push_back(static_cast<char>(std::stoi(digits, nullptr, 8)));
        i += 3;
        continue;
      }
    }
    out.push_back(field[i]);
  }
  return out;
}

bool IsFuse(const std::string& fs_type) {
  return fs_type == "fuse" || fs_type.rfind("fuse.", 0) == 0 || fs_type == "fuseblk";
}

// Runs fusermount3 -uz; true when it exited 0.
bool Fusermount(const std::string& mount_point) {
  const char* argv[] = {"fusermount3", "-uz", mount_point.c_str(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // Its complaints ("not found in /etc/mtab") say nothing a test needs.
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc =
      posix_spawnp(&pid, "fusermount3", &actions, nullptr, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return false;
  int wstatus = 0;
  pid_t r = 0;
  do {
    r = ::waitpid(pid, &wstatus, 0);
  } while (r < 0 && errno == EINTR);
  return r == pid && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
}

Result<bool> MountedAt(const std::string& mount_point, std::string* fs_type) {
  GRANARY_ASSIGN_OR_RETURN(std::vector<MountEntry> mounts, ListMounts());
  for (auto it = mounts.rbegin(); it != mounts.rend(); ++it) {  // the last mount there is on top
    if (it->mount_point == mount_point) {
      if (fs_type != nullptr) *fs_type = it->fs_type;
      return true;
    }
  }
  return false;
}

}  // namespace

Result<std::vector<MountEntry>> ListMounts() {
  std::ifstream in("/proc/self/mountinfo");
  if (!in) return Status::IoError("reading /proc/self/mountinfo: cannot open it");
  std::vector<MountEntry> mounts;
  std::string line;
  while (std::getline(in, line)) {
    // id parent major:minor root mount-point options [optional...] - type source super
    std::istringstream fields(line);
    std::string id, parent, device, root, mount_point, field;
    if (!(fields >> id >> parent >> device >> root >> mount_point)) continue;
    while (fields >> field && field != "-") {
    }
    std::string fs_type;
    if (!(fields >> fs_type)) continue;
    mounts.push_back({Unescape(mount_point), fs_type});
  }
  return mounts;
}

Status DetachMount(const std::string& mount_point) {
  std::string fs_type;
  GRANARY_ASSIGN_OR_RETURN(bool mounted, MountedAt(mount_point, &fs_type));
  // A mount point can hold several mounts stacked; a few rounds take them all.
  for (int round = 0; mounted && round < 8; ++round) {
    if (!(IsFuse(fs_type) && Fusermount(mount_point)) &&
        ::umount2(mount_point.c_str(), MNT_DETACH) != 0) {
      return Status::FromErrno(errno, "detaching the " + fs_type + " mount at " + mount_point +
                                          " (fusermount3 -uz failed too)");
    }
    GRANARY_ASSIGN_OR_RETURN(mounted, MountedAt(mount_point, &fs_type));
  }
  if (mounted) return Status::Internal(mount_point + " is still mounted after detaching it");
  return Status::Ok();
}

Status DetachMountsUnder(const std::string& dir) {
  GRANARY_ASSIGN_OR_RETURN(std::vector<MountEntry> mounts, ListMounts());
  std::vector<std::string> under;
  for (const MountEntry& m : mounts) {
    if (m.mount_point == dir || m.mount_point.rfind(dir + "/", 0) == 0) {
      under.push_back(m.mount_point);
    }
  }
  // Deepest first, so a mount inside another goes before it.
  std::sort(under.begin(), under.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() > b.size() : a < b;
  });
  under.erase(std::unique(under.begin(), under.end()), under.end());
  Status first = Status::Ok();
  for (const std::string& m : under) {
    Status s = DetachMount(m);
    if (!s.ok() && first.ok()) first = std::move(s);
  }
  return first;
}

}  // namespace granary::testing
