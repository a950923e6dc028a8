#include "manifest_tree.h"

#include <algorithm>
#include <utility>

#include "granary/core/names.h"

namespace granary::cli {
namespace {

// The first sample whose path is not less than `key` (byte order).
SampleId LowerBound(const Manifest& manifest, std::string_view key) {
  SampleId low = 0;
  auto high = static_cast<SampleId>(manifest.sample_count());
  while (low < high) {
    const SampleId mid = low + (high - low) / 2;
    if (manifest.PathOf(mid) < key) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  return low;
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
  // A directory: the samples from "<path>/" up to "<path>0" ('0' follows '/').
  const std::string prefix = std::string(path) + "/";
  const SampleId first = LowerBound(manifest, prefix);
  if (first < manifest.sample_count() && manifest.PathOf(first).starts_with(prefix)) {
    node.directory = true;
    node.first = first;
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
      e.node = {false, path, id, id + 1};
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
    d.node = {true, d.path, id, id + 1};
    entries.push_back(std::move(d));
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
  for (SampleId id = node.first; id < node.end; ++id) {
    e.size += manifest.SizeOf(id);
    e.mtime_ns = std::max(e.mtime_ns, manifest.MtimeOf(id));
    ++e.files;
  }
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
