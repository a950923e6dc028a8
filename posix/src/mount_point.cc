#include "granary/posix/mount_point.h"

#include <dirent.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "granary/core/log.h"
#include "granary/core/names.h"

extern char** environ;

namespace granary::posix {
namespace {

// /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo.
std::string UnescapeMountField(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() + 0 && s[i + 1] >= '0' && s[i + 1] <= '7') {
      const int value = (s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0');
      out.push_back(static_cast<char>(value));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The absolute form of `dir` with "." and ".." and repeated slashes removed
// lexically (no symlink resolution: a stale mount cannot be resolved).
Result<std::string> Absolute(const std::string& dir) {
  if (dir.empty()) return Status::InvalidArgument("the mount point is an empty path");
  std::string path = dir;
  if (path[0] != '/') {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == nullptr) {
      return Status::FromErrno(errno, "resolving mount point " + Quoted(dir) + " (getcwd)");
    }
    path = std::string(cwd) + "/" + path;
  }
  std::vector<std::string> parts;
  std::stringstream in(path);
  std::string part;
  while (std::getline(in, part, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string out;
  for (const std::string& p : parts) out += "/" + p;
  return out.empty() ? std::string("/") : out;
}

}  // namespace

Result<std::string> MountedFileSystemAt(const std::string& dir) {
  std::ifstream in("/proc/self/mountinfo");
  if (!in) return Status::IoError("reading /proc/self/mountinfo: cannot open it");
  std::string line;
  std::string found;
  // Bounded by the file; the last match is the top of a stack of mounts.
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, devno, root, mount_point;
    fields >> id >> parent >> devno >> root >> mount_point;
    if (UnescapeMountField(mount_point) != dir) continue;
    std::string field;
    while (fields >> field && field != "-") {
    }
    std::string fstype;
    fields >> fstype;
    found = fstype;
  }
  return found;
}

Status LazyUnmount(const std::string& dir) {
  if (geteuid() == 0) {
    if (umount2(dir.c_str(), MNT_DETACH) == 0) return Status::Ok();
    return Status::FromErrno(errno, "unmounting " + Quoted(dir) + " (umount2 MNT_DETACH)");
  }
  const char* argv[] = {"fusermount3", "-u", "-z", "--", dir.c_str(), nullptr};
  pid_t pid = -1;
  const int err =
      posix_spawnp(&pid, "fusermount3", nullptr, nullptr, const_cast<char* const*>(argv), environ);
  if (err != 0) {
    return Status::FromErrno(err, "unmounting " + Quoted(dir) +
                                      " (running fusermount3; is the fuse3 package installed?)");
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Status::FromErrno(errno, "waiting for fusermount3");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::IoError("unmounting " + Quoted(dir) +
                           ": fusermount3 -u -z failed (see its message above)");
  }
  return Status::Ok();
}

Result<std::string> PrepareMountPoint(const std::string& dir) {
  GRANARY_ASSIGN_OR_RETURN(const std::string path, Absolute(dir));
  const std::string what = "checking mount point " + Quoted(path);
  struct stat st;
  if (stat(path.c_str(), &st) != 0 && errno == ENOTCONN) {
    GetLogger("posix")->warn(
        "{}: a stale mount from a run that crashed (its FUSE server is gone); unmounting it "
        "lazily",
        Quoted(path));
    GRANARY_RETURN_IF_ERROR(LazyUnmount(path).WithContext(what));
  }
  if (stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return Status::NotFound(what + ": no such directory; create it (mkdir -p) first");
    }
    return Status::FromErrno(err, what);
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument(what + ": not a directory; mount on an empty directory");
  }
  GRANARY_ASSIGN_OR_RETURN(const std::string mounted, MountedFileSystemAt(path));
  // A FUSE file system there is a view (or another server) in use. Any other
  // mount is fine if it is empty (checked below): in a container the view's
  // directory is always a volume, a bind mount of the kubelet's emptyDir, and
  // mounting over an empty directory hides nothing.
  if (mounted.rfind("fuse", 0) == 0) {
    return Status::FailedPrecondition(what + ": something is mounted there already (" +
                                      Quoted(mounted) + "); unmount it first (fusermount3 -u " +
                                      path + " or umount)");
  }
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return Status::FromErrno(errno, what + " (opendir)");
  std::string first;
  // Bounded: stops at the first entry other than . and ..
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    first = e->d_name;
    break;
  }
  closedir(d);
  if (!first.empty()) {
    return Status::FailedPrecondition(what + ": not empty (it holds " + Quoted(first) +
                                      "); mount on an empty directory");
  }
  return path;
}

}  // namespace granary::posix
