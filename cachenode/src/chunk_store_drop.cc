// Drops from the on-disk chunk store (disk_chunk_store.h): a chunk, a
// manifest or a whole dataset. Entries are marked under mu_, their files
// unlinked without it, then taken out of the index (or put back if a file
// could not be removed); bytes of a dropped chunk stay counted until its
// last reader or writer closes.

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "chunk_store_layout.h"
#include "disk_chunk_store.h"
#include "granary/core/names.h"

namespace granary {

using chunk_store_layout::CheckDataset;
using chunk_store_layout::DescribeChunk;

Status DiskChunkStore::UnlinkAndForget(std::vector<DropItem>& items, std::string_view doing) {
  size_t failed = 0;
  Status first;
  for (DropItem& item : items) {
    std::string path = ChunkPath(item.key);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      item.unlinked = Status::FromErrno(errno, "remove " + path);
      if (failed++ == 0) first = item.unlinked;
    }
  }
  {
    std::lock_guard lock(mu_);
    for (DropItem& item : items) {
      Entry& entry = *item.entry;
      if (!item.unlinked.ok()) {
        entry.state = EntryState::kReady;  // the file is still there and still counted
        continue;
      }
      EraseLocked(item.key, &entry);
      entry.state = EntryState::kDropped;
      if (entry.open_handles == 0) ReleaseBytesLocked(entry);
      ++chunks_dropped_;
    }
  }
  if (failed == 0) return Status::Ok();
  return Status(first.code(),
                fmt::format("{}: could not remove {} of {} chunk files (first: {}); they stay in "
                            "the store: fix the file system's permissions or remove them by hand",
                            doing, failed, items.size(), first.message()));
}

Status DiskChunkStore::DropChunk(const ChunkKey& key) {
  const std::string doing = fmt::format("drop {} from chunk store {}", DescribeChunk(key), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(key.dataset, doing));
  std::vector<DropItem> items;
  {
    std::unique_lock lock(mu_);
    // A create in flight ends in one fallocate and a few syncs.
    changed_.wait(lock, [&] {
      std::shared_ptr<Entry> e = FindLocked(key);
      return e == nullptr || e->state != EntryState::kCreating;
    });
    std::shared_ptr<Entry> entry = FindLocked(key);
    if (entry == nullptr || entry->state != EntryState::kReady) {
      return Status::NotFound(fmt::format("{}: it is not in the store", doing));
    }
    entry->state = EntryState::kDropping;
    items.push_back({key, std::move(entry), Status::Ok()});
  }
  Status s = UnlinkAndForget(items, doing);
  changed_.notify_all();
  return s;
}

Status DiskChunkStore::DropManifest(std::string_view dataset, const ContentId& manifest_id) {
  const std::string doing = fmt::format("drop dataset {} manifest {} from chunk store {}",
                                        Quoted(dataset), manifest_id.ToHex(), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(dataset, doing));
  const std::string name(dataset);
  auto find = [&]() -> ManifestChunks* {
    auto d = datasets_.find(name);
    if (d == datasets_.end()) return nullptr;
    auto m = d->second.find(manifest_id);
    return m == d->second.end() ? nullptr : &m->second;
  };
  std::vector<DropItem> items;
  {
    std::unique_lock lock(mu_);
    // Another drop of it (or of its dataset) finishes first.
    changed_.wait(lock, [&] {
      ManifestChunks* m = find();
      return !dropping_datasets_.contains(name) && (m == nullptr || !m->dropping);
    });
    ManifestChunks* m = find();
    if (m == nullptr) return Status::NotFound(fmt::format("{}: it has no chunks here", doing));
    m->dropping = true;  // refuses new creates in it
    changed_.wait(lock, [&] {
      return std::none_of(m->chunks.begin(), m->chunks.end(),
                          [](const auto& c) { return c.second->state == EntryState::kCreating; });
    });
    for (auto& [chunk, entry] : m->chunks) {
      if (entry->state != EntryState::kReady) continue;  // a DropChunk of it is running
      entry->state = EntryState::kDropping;
      items.push_back({ChunkKey{name, manifest_id, chunk}, entry, Status::Ok()});
    }
  }
  Status s = UnlinkAndForget(items, doing);
  if (s.ok()) ::rmdir(ManifestDirectory(name, manifest_id).c_str());  // tidiness only
  {
    std::lock_guard lock(mu_);
    auto d = datasets_.find(name);
    if (d != datasets_.end()) {
      auto m = d->second.find(manifest_id);
      if (m != d->second.end()) {
        m->second.dropping = false;
        if (m->second.chunks.empty()) d->second.erase(m);
      }
      if (d->second.empty()) datasets_.erase(d);
    }
  }
  changed_.notify_all();
  return s;
}

Status DiskChunkStore::DropDataset(std::string_view dataset) {
  const std::string doing =
      fmt::format("drop dataset {} from chunk store {}", Quoted(dataset), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(dataset, doing));
  const std::string name(dataset);
  std::vector<DropItem> items;
  std::vector<ContentId> manifest_ids;
  {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return !dropping_datasets_.contains(name); });
    if (!datasets_.contains(name)) {
      return Status::NotFound(fmt::format("{}: it has no chunks here", doing));
    }
    dropping_datasets_.insert(name);  // refuses new creates in it
    // Creates in flight and drops of its manifests finish first.
    changed_.wait(lock, [&] {
      auto d = datasets_.find(name);
      if (d == datasets_.end()) return true;
      for (const auto& [id, m] : d->second) {
        if (m.dropping) return false;
        for (const auto& [chunk, entry] : m.chunks) {
          if (entry->state == EntryState::kCreating) return false;
        }
      }
      return true;
    });
    auto d = datasets_.find(name);
    if (d != datasets_.end()) {
      for (auto& [id, m] : d->second) {
        manifest_ids.push_back(id);
        for (auto& [chunk, entry] : m.chunks) {
          if (entry->state != EntryState::kReady) continue;
          entry->state = EntryState::kDropping;
          items.push_back({ChunkKey{name, id, chunk}, entry, Status::Ok()});
        }
      }
    }
  }
  Status s = UnlinkAndForget(items, doing);
  if (s.ok()) {  // tidiness only: a directory left behind is harmless
    for (const ContentId& id : manifest_ids) ::rmdir(ManifestDirectory(name, id).c_str());
    ::rmdir(fmt::format("{}/{}", root_, name).c_str());
  }
  {
    std::lock_guard lock(mu_);
    dropping_datasets_.erase(name);
  }
  changed_.notify_all();
  return s;
}
}  // namespace granary
