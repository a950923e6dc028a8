#pragma once

// The on-disk layout of the chunk store (chunk_store.h shows it): its marker,
// its lock, how dataset, manifest and chunk entries are named, and the steps
// of opening its directory. Private to cachenode/src; used by the store
// (disk_chunk_store.cc) and its restart scan (chunk_store_scan.cc).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/chunk_file.h"
#include "granary/core/file.h"
#include "granary/core/hash.h"
#include "granary/core/log.h"
#include "granary/core/manifest.h"
#include "granary/core/status.h"

namespace granary::chunk_store_layout {

inline constexpr std::string_view kMarkerName = "GRANARY_CHUNK_STORE";
inline constexpr std::string_view kLockName = "LOCK";
inline constexpr std::string_view kChunkSuffix = ".chunk";
inline constexpr std::string_view kLostAndFound = "lost+found";
// Temporary files of interrupted creates (WriteFileAtomically, ChunkWriter::Create).
inline constexpr std::string_view kTempInfix = ".tmp.";

// The store's logger ("cachenode").
std::shared_ptr<spdlog::logger> Log();

// "chunk 3 of dataset 'x' manifest <hex>", for messages.
std::string DescribeChunk(const ChunkKey& key);

// kInvalidArgument, saying `doing`, unless `dataset` is a DNS-1123 label.
Status CheckDataset(std::string_view dataset, std::string_view doing);

// Keeps the message, code and errno text of `s`, and adds what to do.
Status WithHint(const Status& s, std::string_view hint);

enum class EntryType { kDirectory, kRegular, kOther };

struct DirEntry {
  std::string name;
  EntryType type = EntryType::kOther;
};

// The entries of `dir` (without . and ..), sorted by name, typed without
// following symlinks: a link in the store is never followed out of it.
Result<std::vector<DirEntry>> ListDirectory(const std::string& dir);

// "<decimal chunk id>.chunk", canonical (no sign, no leading zeros).
std::optional<ChunkId> ParseChunkFileName(std::string_view name);

// 32 lowercase hex digits (ContentId::ToHex), nothing else.
std::optional<ContentId> ParseManifestDirName(std::string_view name);

// mkdir 0700; an existing directory is fine. A new one is made durable in its
// parent, so a chunk file created in it survives a crash.
Status MakeDirectory(const std::string& path);

// Opening a store's directory, in this order:
// Creates `root` if it is missing (not its parents), else checks it is a
// directory this process alone may write (DataDirOwnershipProblem).
Status PrepareRoot(const std::string& root);
// A directory becomes a store only if it holds nothing the scan would delete.
Status CheckAdoptable(const std::string& root);
// Takes the store's directory lock and records this process in it.
Result<ScopedFd> LockRoot(const std::string& root);
// Writes the marker of a new store, or checks an existing one's layout.
Status WriteOrCheckMarker(const std::string& root);

// The file system's allocation unit, which is what a chunk file's last block
// takes whatever its length.
uint64_t BlockSizeOf(const std::string& root);

}  // namespace granary::chunk_store_layout
