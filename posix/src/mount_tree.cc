#include "granary/posix/mount_tree.h"

#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>

#include "granary/core/names.h"

namespace granary::posix {
namespace {

// NAME_MAX: the kernel looks up no longer component.
constexpr size_t kMaxNameBytes = 255;
constexpr uint64_t kMaxNamesBytes = std::numeric_limits<uint32_t>::max();

}  // namespace

Result<MountTree> MountTree::Build(std::shared_ptr<const Manifest> manifest) {
  if (manifest == nullptr) {
    return Status::InvalidArgument("building the POSIX view's tree: no manifest was given");
  }
  const size_t n = manifest->sample_count();
  // Inodes are 32-bit inside (children_), and the largest is n + directories.
  if (n > std::numeric_limits<uint32_t>::max() / 2) {
    return Status::InvalidArgument("building the POSIX view's tree: " + std::to_string(n) +
                                   " samples are more than it can show; split the dataset");
  }
  MountTree tree;
  tree.manifest_ = manifest;
  tree.file_name_end_.reserve(n);
  tree.file_parent_.reserve(n);
  tree.dirs_.push_back(Dir{});  // the root

  std::unordered_map<std::string, uint32_t> dir_of_path;  // "a/b" -> index; the root is ""
  dir_of_path.emplace("", 0);
  std::string last_dir_path;
  uint32_t last_dir = 0;
  std::vector<std::pair<uint32_t, uint32_t>> dir_children;  // (parent, child dir index)

  // The index of directory `path`, creating it and its missing ancestors.
  auto dir_index = [&](const std::string& path) -> Result<uint32_t> {
    if (auto it = dir_of_path.find(path); it != dir_of_path.end()) return it->second;
    // Walk up to the nearest known ancestor, then create downwards.
    std::vector<size_t> cuts;  // ends of the prefixes to create, deepest first
    size_t end = path.size();
    while (true) {
      cuts.push_back(end);
      const size_t slash = path.rfind('/', end - 1);
      if (slash == std::string::npos) break;
      if (dir_of_path.count(path.substr(0, slash)) != 0) break;
      end = slash;
    }
    for (size_t c = cuts.size(); c-- > 0;) {
      const std::string prefix = path.substr(0, cuts[c]);
      const size_t slash = prefix.rfind('/');
      const std::string parent_path = slash == std::string::npos ? "" : prefix.substr(0, slash);
      const std::string_view name =
          std::string_view(prefix).substr(slash == std::string::npos ? 0 : slash + 1);
      if (name.size() > kMaxNameBytes) {
        return Status::InvalidArgument("building the POSIX view's tree: directory " +
                                       Quoted(prefix) + " has a name longer than 255 bytes, " +
                                       "which no file system can show; rename it at the source");
      }
      if (tree.dir_names_.size() + name.size() > kMaxNamesBytes) {
        return Status::InvalidArgument(
            "building the POSIX view's tree: the directory names pass 4 GiB; split the dataset");
      }
      Dir d;
      d.parent = dir_of_path.at(parent_path);
      d.name_begin = static_cast<uint32_t>(tree.dir_names_.size());
      tree.dir_names_.append(name);
      d.name_end = static_cast<uint32_t>(tree.dir_names_.size());
      const auto index = static_cast<uint32_t>(tree.dirs_.size());
      tree.dirs_.push_back(d);
      dir_children.emplace_back(d.parent, index);
      dir_of_path.emplace(prefix, index);
    }
    return dir_of_path.at(path);
  };

  for (SampleId id = 0; id < n; ++id) {
    const std::string path = manifest->PathOf(id);
    const size_t slash = path.rfind('/');
    const std::string_view name =
        std::string_view(path).substr(slash == std::string::npos ? 0 : slash + 1);
    if (name.empty() || name.size() > kMaxNameBytes) {
      return Status::InvalidArgument(
          "building the POSIX view's tree: sample " + Quoted(path) +
          (name.empty() ? " has an empty file name" : " has a name longer than 255 bytes") +
          "; the manifest cannot be shown as a file system, take the snapshot again");
    }
    uint32_t dir = 0;
    if (slash != std::string::npos) {
      if (path.compare(0, slash, last_dir_path) == 0 && last_dir_path.size() == slash) {
        dir = last_dir;
      } else {
        last_dir_path = path.substr(0, slash);
        GRANARY_ASSIGN_OR_RETURN(last_dir, dir_index(last_dir_path));
        dir = last_dir;
      }
    }
    if (tree.file_names_.size() + name.size() > kMaxNamesBytes) {
      return Status::InvalidArgument(
          "building the POSIX view's tree: the file names pass 4 GiB; split the dataset");
    }
    tree.file_names_.append(name);
    tree.file_name_end_.push_back(static_cast<uint32_t>(tree.file_names_.size()));
    tree.file_parent_.push_back(dir);
    tree.dirs_[dir].mtime_ns = std::max(tree.dirs_[dir].mtime_ns, manifest->MtimeOf(id));
  }
  if (static_cast<uint64_t>(n) + tree.dirs_.size() > std::numeric_limits<uint32_t>::max() - 1) {
    return Status::InvalidArgument(
        "building the POSIX view's tree: more than 2^32 - 2 files and directories; split the "
        "dataset");
  }

  tree.file_names_.shrink_to_fit();
  tree.dir_names_.shrink_to_fit();
  tree.dirs_.shrink_to_fit();

  // Directories were created after their parents: newest mtimes flow upwards.
  for (size_t d = tree.dirs_.size(); d-- > 1;) {
    Dir& parent = tree.dirs_[tree.dirs_[d].parent];
    parent.mtime_ns = std::max(parent.mtime_ns, tree.dirs_[d].mtime_ns);
    ++parent.subdirs;
  }

  // Children grouped by directory (counting sort), then sorted by name.
  std::vector<uint32_t> counts(tree.dirs_.size(), 0);
  for (uint32_t parent : tree.file_parent_) ++counts[parent];
  for (const auto& [parent, child] : dir_children) ++counts[parent];
  uint32_t offset = 0;
  for (size_t d = 0; d < tree.dirs_.size(); ++d) {
    tree.dirs_[d].first_child = offset;
    offset += counts[d];
  }
  tree.children_.assign(offset, 0);
  std::vector<uint32_t> fill(tree.dirs_.size(), 0);
  for (SampleId id = 0; id < n; ++id) {
    const uint32_t d = tree.file_parent_[id];
    tree.children_[tree.dirs_[d].first_child + fill[d]++] =
        static_cast<uint32_t>(InodeOfSample(id));
  }
  for (const auto& [parent, child] : dir_children) {
    tree.children_[tree.dirs_[parent].first_child + fill[parent]++] =
        static_cast<uint32_t>(tree.DirInode(child));
  }
  for (size_t d = 0; d < tree.dirs_.size(); ++d) {
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
  if (IsDirectory(ino)) return DirInode(dirs_[DirIndex(ino)].parent);
  return DirInode(file_parent_[SampleOf(ino)]);
}

std::string_view MountTree::NameOf(Inode ino) const {
  if (!Valid(ino) || ino == kRootInode) return {};
  if (IsDirectory(ino)) {
    const Dir& d = dirs_[DirIndex(ino)];
    return std::string_view(dir_names_).substr(d.name_begin, d.name_end - d.name_begin);
  }
  const SampleId id = SampleOf(ino);
  const uint32_t begin = id == 0 ? 0 : file_name_end_[id - 1];
  return std::string_view(file_names_).substr(begin, file_name_end_[id] - begin);
}

std::string MountTree::PathOf(Inode ino) const {
  if (!Valid(ino)) return {};
  std::vector<std::string_view> parts;
  // Bounded by the depth: every step goes to a directory created before.
  for (Inode at = ino; at != kRootInode && parts.size() <= max_inode(); at = Parent(at)) {
    parts.push_back(NameOf(at));
  }
  std::string path;
  for (size_t i = parts.size(); i-- > 0;) {
    path.append(parts[i]);
    if (i != 0) path.push_back('/');
  }
  return path;
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

size_t MountTree::MemoryBytes() const {
  return file_names_.capacity() + dir_names_.capacity() +
         (file_name_end_.capacity() + file_parent_.capacity() + children_.capacity()) *
             sizeof(uint32_t) +
         dirs_.capacity() * sizeof(Dir);
}

}  // namespace granary::posix
