#include "granary/posix/mount_tree.h"

#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "granary/core/names.h"

namespace granary::posix {
namespace {

// No sample under a directory yet (mtimes are signed nanoseconds).
constexpr int64_t kNoMtime = std::numeric_limits<int64_t>::min();

}  // namespace

Result<MountTree> MountTree::Build(std::shared_ptr<const Manifest> manifest) {
  if (manifest == nullptr) {
    return Status::InvalidArgument("building the POSIX view's tree: no manifest was given");
  }
  const size_t n = manifest->sample_count();
  const size_t dir_count = manifest->directory_count();
  // Inodes are 32-bit inside (children_), and the largest is n + directories.
  if (static_cast<uint64_t>(n) + dir_count > std::numeric_limits<uint32_t>::max() - 1) {
    return Status::InvalidArgument("building the POSIX view's tree: " + std::to_string(n) +
                                   " files and " + std::to_string(dir_count) +
                                   " directories are more than 2^32 - 2 inodes; split the dataset");
  }
  MountTree tree;
  tree.manifest_ = std::move(manifest);
  const Manifest& m = *tree.manifest_;
  tree.dirs_.assign(dir_count, Dir{0, 0, 0, kNoMtime});

  // Children per directory (counting sort), and the newest mtime of each
  // directory's own files.
  std::vector<uint32_t> counts(dir_count, 0);
  for (SampleId id = 0; id < n; ++id) {
    const uint32_t d = m.DirectoryOf(id);
    ++counts[d];
    tree.dirs_[d].mtime_ns = std::max(tree.dirs_[d].mtime_ns, m.MtimeOf(id));
  }
  for (uint32_t d = 1; d < dir_count; ++d) {
    ++counts[m.DirectoryParent(d)];
    ++tree.dirs_[m.DirectoryParent(d)].subdirs;
  }
  // Parents precede their children in the manifest: newest mtimes flow up.
  for (uint32_t d = static_cast<uint32_t>(dir_count); d-- > 1;) {
    Dir& parent = tree.dirs_[m.DirectoryParent(d)];
    parent.mtime_ns = std::max(parent.mtime_ns, tree.dirs_[d].mtime_ns);
  }
  const int64_t newest = tree.dirs_[0].mtime_ns == kNoMtime ? 0 : tree.dirs_[0].mtime_ns;
  for (Dir& d : tree.dirs_) {
    if (d.mtime_ns == kNoMtime) d.mtime_ns = newest;
  }

  uint32_t offset = 0;
  for (size_t d = 0; d < dir_count; ++d) {
    tree.dirs_[d].first_child = offset;
    offset += counts[d];
  }
  tree.children_.assign(offset, 0);
  std::vector<uint32_t> fill(dir_count, 0);
  for (SampleId id = 0; id < n; ++id) {
    const uint32_t d = m.DirectoryOf(id);
    tree.children_[tree.dirs_[d].first_child + fill[d]++] =
        static_cast<uint32_t>(InodeOfSample(id));
  }
  for (uint32_t d = 1; d < dir_count; ++d) {
    const uint32_t parent = m.DirectoryParent(d);
    tree.children_[tree.dirs_[parent].first_child + fill[parent]++] =
        static_cast<uint32_t>(tree.DirInode(d));
  }
  for (size_t d = 0; d < dir_count; ++d) {
    Dir& dir = tree.dirs_[d];
    dir.child_count = counts[d];
    auto begin = tree.children_.begin() + dir.first_child;
    auto end = begin + dir.child_count;
    std::sort(begin, end,
              [&tree](uint32_t a, uint32_t b) { return tree.NameOf(a) < tree.NameOf(b); });
    const auto same = std::adjacent_find(
        begin, end, [&tree](uint32_t a, uint32_t b) { return tree.NameOf(a) == tree.NameOf(b); });
    if (same != end) {
      return Status::InvalidArgument(
          "building the POSIX view's tree: " + Quoted(tree.PathOf(*same)) +
          " is both a file and a directory in the manifest; take the "
          "snapshot again");
    }
  }
  return tree;
}

Inode MountTree::Parent(Inode ino) const {
  if (!Valid(ino) || ino == kRootInode) return kRootInode;
  if (IsDirectory(ino)) return DirInode(manifest_->DirectoryParent(DirIndex(ino)));
  return DirInode(manifest_->DirectoryOf(SampleOf(ino)));
}

std::string_view MountTree::NameOf(Inode ino) const {
  if (!Valid(ino) || ino == kRootInode) return {};
  if (IsDirectory(ino)) return manifest_->DirectoryName(DirIndex(ino));
  return manifest_->NameOf(SampleOf(ino));
}

std::string MountTree::PathOf(Inode ino) const {
  if (!Valid(ino)) return {};
  if (IsDirectory(ino)) return manifest_->DirectoryPath(DirIndex(ino));
  return manifest_->PathOf(SampleOf(ino));
}

Inode MountTree::Lookup(Inode dir, std::string_view name) const {
  if (!Valid(dir) || !IsDirectory(dir)) return kNoInode;
  if (name == ".") return dir;
  if (name == "..") return Parent(dir);
  const std::span<const uint32_t> children = Children(dir);
  const auto it = std::lower_bound(
      children.begin(), children.end(), name,
      [this](uint32_t child, std::string_view key) { return NameOf(child) < key; });
  if (it == children.end() || NameOf(*it) != name) return kNoInode;
  return *it;
}

std::span<const uint32_t> MountTree::Children(Inode dir) const {
  if (!Valid(dir) || !IsDirectory(dir)) return {};
  const Dir& d = dirs_[DirIndex(dir)];
  return std::span<const uint32_t>(children_).subspan(d.first_child, d.child_count);
}

uint32_t MountTree::SubdirectoryCount(Inode dir) const {
  if (!Valid(dir) || !IsDirectory(dir)) return 0;
  return dirs_[DirIndex(dir)].subdirs;
}

int64_t MountTree::MtimeNs(Inode ino) const {
  if (!Valid(ino)) return 0;
  if (IsDirectory(ino)) return dirs_[DirIndex(ino)].mtime_ns;
  return manifest_->MtimeOf(SampleOf(ino));
}

uint64_t MountTree::Size(Inode ino) const {
  if (!Valid(ino) || IsDirectory(ino)) return 0;
  return manifest_->SizeOf(SampleOf(ino));
}

uint32_t MountTree::Mode(Inode ino) const {
  if (!Valid(ino)) return 0;
  constexpr uint32_t kShown = 07777 & ~static_cast<uint32_t>(S_ISUID | S_ISGID);
  if (IsDirectory(ino)) return S_IFDIR | (manifest_->DirectoryMode(DirIndex(ino)) & kShown);
  return S_IFREG | (manifest_->ModeOf(SampleOf(ino)) & kShown);
}

size_t MountTree::MemoryBytes() const {
  return children_.capacity() * sizeof(uint32_t) + dirs_.capacity() * sizeof(Dir);
}

}  // namespace granary::posix
