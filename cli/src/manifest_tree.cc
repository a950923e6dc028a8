#include "manifest_tree.h"

#include <algorithm>
#include <optional>
#include <unordered_set>
#include <utility>

#include "granary/core/names.h"

namespace granary::cli {
namespace {

// The first index in [0, count) whose path (`path_of(index)`) is not less
// than `key`; the paths are sorted byte-wise.
template <typename PathOf>
uint32_t FirstNotBefore(size_t count, std::string_view key, PathOf path_of) {
  uint32_t low = 0;
  auto high = static_cast<uint32_t>(count);
  while (low < high) {
    const uint32_t mid = low + (high - low) / 2;
    if (path_of(mid) < key) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  return low;
}

// The first sample whose path is not less than `key` (byte order).
SampleId LowerBound(const Manifest& manifest, std::string_view key) {
  return FirstNotBefore(manifest.sample_count(), key,
                        [&manifest](uint32_t id) { return manifest.PathOf(id); });
}

// The index of directory `path` in the manifest's directory table (sorted by
// path), or nothing.
std::optional<uint32_t> FindDirectory(const Manifest& manifest, std::string_view path) {
  const uint32_t at = FirstNotBefore(
      manifest.directory_count(), path,
      [&manifest](uint32_t d) -> const std::string& { return manifest.DirectoryPath(d); });
  if (at < manifest.directory_count() && manifest.DirectoryPath(at) == path) return at;
  return std::nullopt;
}

// The newest mtime of the dataset: what a directory with no file beneath shows.
int64_t NewestMtime(const Manifest& manifest) {
  int64_t newest = 0;
  for (SampleId id = 0; id < manifest.sample_count(); ++id) {
    newest = std::max(newest, manifest.MtimeOf(id));
  }
  return newest;
}

std::string_view LastComponent(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

Result<std::string> NormalizeDatasetPath(std::string_view path) {
  if (path.empty() || path == ".") return std::string();
  std::string_view p = path;
  while (p.size() > 1 && p.back() == '/') p.remove_suffix(1);
  GRANARY_RETURN_IF_ERROR(ValidateSamplePath(p));
  return std::string(p);
}

Result<TreeNode> ResolvePath(const Manifest& manifest, std::string_view path,
                             std::string_view dataset) {
  TreeNode node;
  node.path = std::string(path);
  if (path.empty()) {
    node.directory = true;
    node.end = static_cast<SampleId>(manifest.sample_count());
    return node;
  }
  if (Result<SampleId> id = manifest.Find(path); id.ok()) {
    node.first = *id;
    node.end = *id + 1;
    return node;
  }
  // A directory: the samples from "<path>/" up to "<path>0" ('0' follows '/'),
  // none for a directory without files.
  if (std::optional<uint32_t> dir = FindDirectory(manifest, path)) {
    node.directory = true;
    node.dir = *dir;
    node.first = LowerBound(manifest, std::string(path) + "/");
    node.end = LowerBound(manifest, std::string(path) + "0");
    return node;
  }
  return Status::NotFound("no file or directory " + Quoted(path) + " in dataset " +
                          Quoted(dataset) + " (as at its snapshot; `granary ls " +
                          std::string(dataset) + "` lists it)");
}

std::vector<TreeEntry> ListChildren(const Manifest& manifest, const TreeNode& dir) {
  std::vector<TreeEntry> entries;
  const size_t skip = dir.path.empty() ? 0 : dir.path.size() + 1;
  for (SampleId id = dir.first; id < dir.end; ++id) {
    const std::string path = manifest.PathOf(id);
    const std::string_view rest = std::string_view(path).substr(skip);
    const size_t slash = rest.find('/');
    const uint64_t size = manifest.SizeOf(id);
    const int64_t mtime = manifest.MtimeOf(id);
    if (slash == std::string_view::npos) {
      TreeEntry e;
      e.name = std::string(rest);
      e.path = path;
      e.size = size;
      e.mtime_ns = mtime;
      e.mode = manifest.ModeOf(id);
      e.node = {false, path, id, id + 1, 0};
      entries.push_back(std::move(e));
      continue;
    }
    // The samples of one subdirectory are consecutive: extend the last entry
    // while it is this one.
    const std::string_view name = rest.substr(0, slash);
    if (!entries.empty() && entries.back().directory && entries.back().name == name) {
      TreeEntry& d = entries.back();
      d.size += size;
      d.mtime_ns = std::max(d.mtime_ns, mtime);
      ++d.files;
      d.node.end = id + 1;
      continue;
    }
    TreeEntry d;
    d.name = std::string(name);
    d.path = path.substr(0, skip + slash);
    d.directory = true;
    d.size = size;
    d.mtime_ns = mtime;
    d.files = 1;
    // Every directory holding a sample is in the table (the manifest's rule).
    d.node = {true, d.path, id, id + 1, FindDirectory(manifest, d.path).value_or(0)};
    d.mode = manifest.DirectoryMode(d.node.dir);
    entries.push_back(std::move(d));
  }
  // Subdirectories without files: the table's children of `dir`, all within
  // the run of paths starting with "<dir>/" (contiguous in byte order).
  const std::string prefix = dir.path.empty() ? std::string() : dir.path + "/";
  std::optional<int64_t> newest;
  std::unordered_set<std::string> listed;  // subdirectories with files, listed above
  for (const TreeEntry& e : entries) {
    if (e.directory) listed.insert(e.name);
  }
  for (uint32_t c = dir.dir + 1; c < manifest.directory_count(); ++c) {
    const std::string& path = manifest.DirectoryPath(c);
    if (!path.starts_with(prefix)) break;
    if (manifest.DirectoryParent(c) != dir.dir) continue;
    const std::string_view name = manifest.DirectoryName(c);
    if (listed.count(std::string(name)) != 0) continue;
    if (!newest.has_value()) newest = NewestMtime(manifest);
    TreeEntry e;
    e.name = std::string(name);
    e.path = path;
    e.directory = true;
    e.files = 0;
    e.mtime_ns = *newest;
    e.mode = manifest.DirectoryMode(c);
    e.node = {true, path, dir.end, dir.end, c};  // an empty run of samples
    entries.push_back(std::move(e));
  }
  // Byte order of full paths puts "a.txt" before the directory "a" ('.' <
  // '/'); listings are by name.
  std::stable_sort(entries.begin(), entries.end(),
                   [](const TreeEntry& a, const TreeEntry& b) { return a.name < b.name; });
  return entries;
}

TreeEntry EntryOf(const Manifest& manifest, const TreeNode& node) {
  TreeEntry e;
  e.path = node.path;
  e.name = node.path.empty() ? "." : std::string(LastComponent(node.path));
  e.directory = node.directory;
  e.node = node;
  e.files = 0;
  e.mode = node.directory ? manifest.DirectoryMode(node.dir) : manifest.ModeOf(node.first);
  for (SampleId id = node.first; id < node.end; ++id) {
    e.size += manifest.SizeOf(id);
    e.mtime_ns = std::max(e.mtime_ns, manifest.MtimeOf(id));
    ++e.files;
  }
  if (node.directory && e.files == 0) e.mtime_ns = NewestMtime(manifest);
  return e;
}

Result<std::shared_ptr<const Manifest>> LoadManifest(MetadataStore& store,
                                                     const DatasetRecord& record) {
  if (record.manifest_id.empty()) {
    return Status::FailedPrecondition(
        "dataset " + Quoted(record.name) + " has no snapshot yet (it is " +
        std::string(DatasetPhaseName(record.state.phase)) + "); `granary dataset snapshot " +
        record.name + "` takes one");
  }
  Result<std::string> blob = store.GetManifest(record.manifest_id);
  if (!blob.ok()) {
    return blob.status().WithContext("reading the manifest " + record.manifest_id + " of dataset " +
                                     Quoted(record.name));
  }
  Result<Manifest> manifest = Manifest::Decode(*blob);
  if (!manifest.ok()) {
    return manifest.status().WithContext(
        "decoding the manifest " + record.manifest_id + " of dataset " + Quoted(record.name) +
        " (take a new snapshot: `granary dataset snapshot " + record.name + "`)");
  }
  return std::shared_ptr<const Manifest>(std::make_shared<Manifest>(std::move(*manifest)));
}

}  // namespace granary::cli
