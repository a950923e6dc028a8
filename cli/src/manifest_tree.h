#pragma once

// ManifestTree: a dataset's directories and files as its manifest holds them,
// for `granary ls` and `granary cat` (docs/cli.md). Nothing here touches the
// source or a cache node: a manifest's samples are sorted byte-wise by path,
// so a directory's files are the run of samples whose paths start with
// "<dir>/", found by binary search, and its children are read off that run,
// plus the subdirectories of the manifest's directory table that hold no file
// (an empty class folder). Modes are the source's at snapshot time (0444 and
// 0555 for a version 1 manifest). What a directory "has" (size, mtime) is
// derived: the bytes and the newest mtime of the files beneath it (for one
// with no file beneath, the dataset's newest mtime, as the POSIX view shows).
//
// Who calls it: ls_command.cc, cat_command.cc.
//
// Thread safety: const functions over an immutable Manifest; any thread.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/manifest.h"
#include "granary/core/metadata_store.h"
#include "granary/core/status.h"

namespace granary::cli {

// What a path names: a file (one sample) or a directory (a run of samples).
struct TreeNode {
  bool directory = false;
  std::string path;    // as normalised: "" for the root, no trailing '/'
  SampleId first = 0;  // file: its id; directory: the first sample beneath it
  SampleId end = 0;    // one past the last sample beneath (file: first + 1)
  uint32_t dir = 0;    // directory: its index in the manifest's directory table
};

struct TreeEntry {
  std::string name;  // the last component
  std::string path;  // relative to the dataset root
  bool directory = false;
  uint64_t size = 0;     // file: its size; directory: the bytes of every file beneath
  int64_t mtime_ns = 0;  // file: as at the snapshot; directory: the newest file beneath
  uint64_t files = 1;    // directory: files beneath it (at any depth)
  uint16_t mode = 0;     // permission bits (st_mode & 07777) at the snapshot
  TreeNode node;         // for descending into a directory
};

// The normalised form of a path a user typed: "" and "." are the root;
// trailing slashes are dropped; then ValidateSamplePath (names.h): absolute
// paths and empty, "." or ".." components are kInvalidArgument.
Result<std::string> NormalizeDatasetPath(std::string_view path);

// What `path` (normalised) names in `manifest`; kNotFound when nothing.
Result<TreeNode> ResolvePath(const Manifest& manifest, std::string_view path,
                             std::string_view dataset);

// The entries of a directory node, sorted by name (byte order).
std::vector<TreeEntry> ListChildren(const Manifest& manifest, const TreeNode& dir);

// The entry of a file or directory node itself (ls of a file, ls -d).
TreeEntry EntryOf(const Manifest& manifest, const TreeNode& node);

// The dataset's manifest from the store (GetManifest + Decode). A dataset with
// no snapshot yet is kFailedPrecondition saying how to take one.
Result<std::shared_ptr<const Manifest>> LoadManifest(MetadataStore& store,
                                                     const DatasetRecord& record);

}  // namespace granary::cli
