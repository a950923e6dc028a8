#pragma once

// MountTree: the inode table of a dataset's POSIX view (docs/posix-view.md),
// built once from the manifest, so that lookup, getattr and readdir are
// answered from memory and never reach the source or a cache node.
//
// Inodes: 1 is the dataset's root directory; sample `id` is inode id + 2;
// manifest directory d >= 1 is inode sample_count() + 1 + d. The directories
// are the manifest's: every directory the snapshot read, with or without
// samples, with its permission bits (a version 1 manifest lists only the
// ancestors of samples, shown 0555). A directory's children are kept sorted
// byte-wise by name, so Lookup is a binary search.
//
// Memory: 4 bytes per sample (names and sizes stay in the manifest) and a few
// dozen bytes per directory.
//
// Who calls it: PosixView (the FUSE callbacks), the CLI's ls; tests.
//
// Thread safety: immutable after Build; any number of threads may read it.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/manifest.h"
#include "granary/core/status.h"

namespace granary::posix {

using Inode = uint64_t;

inline constexpr Inode kRootInode = 1;
inline constexpr Inode kNoInode = 0;

class MountTree {
 public:
  // Builds the table. kInvalidArgument if the manifest cannot be shown as a
  // tree (a name that is both a file and a directory) or is too large (more
  // than 2^32 - 2 inodes); the message names the path and what to do.
  // The tree keeps `manifest` (names, sizes, mtimes and modes are read from it).
  static Result<MountTree> Build(std::shared_ptr<const Manifest> manifest);

  MountTree() = default;
  MountTree(MountTree&&) noexcept = default;
  MountTree& operator=(MountTree&&) noexcept = default;

  size_t sample_count() const { return manifest_ == nullptr ? 0 : manifest_->sample_count(); }
  size_t directory_count() const { return dirs_.size(); }
  // The largest inode in use.
  Inode max_inode() const { return sample_count() + directory_count(); }

  bool Valid(Inode ino) const { return ino >= 1 && ino <= max_inode(); }
  bool IsDirectory(Inode ino) const { return ino == kRootInode || ino > sample_count() + 1; }
  // The sample of a file inode; only for a valid file inode.
  SampleId SampleOf(Inode ino) const { return static_cast<SampleId>(ino - 2); }
  static Inode InodeOfSample(SampleId id) { return static_cast<Inode>(id) + 2; }

  // The directory holding `ino`; the root's parent is the root.
  Inode Parent(Inode ino) const;
  // The last component of the path ("" for the root).
  std::string_view NameOf(Inode ino) const;
  // The path relative to the root ("" for the root), for messages.
  std::string PathOf(Inode ino) const;
  // The child called `name` of directory `dir`; "." is `dir` and ".." its
  // parent (the root's is the root). kNoInode if there is none or `dir` is
  // not a directory.
  Inode Lookup(Inode dir, std::string_view name) const;
  // A directory's children, sorted by name; empty for a file.
  std::span<const uint32_t> Children(Inode dir) const;
  // Subdirectories of a directory (its link count is this + 2).
  uint32_t SubdirectoryCount(Inode dir) const;
  // Files: the sample's mtime; directories: the newest sample under them, or
  // for a directory with no sample under it, the newest of the dataset.
  int64_t MtimeNs(Inode ino) const;
  // Files: the sample's size; directories: 0.
  uint64_t Size(Inode ino) const;
  // st_mode: the type (S_IFREG or S_IFDIR) and the permission bits at the
  // source, without set-user-ID and set-group-ID (the view is nosuid).
  uint32_t Mode(Inode ino) const;

  const Manifest& manifest() const { return *manifest_; }

  // Heap bytes held (for the docs' memory figure).
  size_t MemoryBytes() const;

 private:
  struct Dir {
    uint32_t first_child = 0;  // into children_
    uint32_t child_count = 0;
    uint32_t subdirs = 0;
    int64_t mtime_ns = 0;
  };

  uint32_t DirIndex(Inode dir) const {
    return dir == kRootInode ? 0 : static_cast<uint32_t>(dir - sample_count() - 1);
  }
  Inode DirInode(uint32_t index) const {
    return index == 0 ? kRootInode : sample_count() + 1 + index;
  }

  std::shared_ptr<const Manifest> manifest_;
  std::vector<Dir> dirs_;           // by the manifest's directory index; 0 is the root
  std::vector<uint32_t> children_;  // inodes (as 32-bit), grouped by directory
};

}  // namespace granary::posix
