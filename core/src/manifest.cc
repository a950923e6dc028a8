// Manifest (manifest.h, docs/formats.md). Kept whole at about 740 lines: its
// one job is the Manifest's columnar arrays (Manifest::Rep) and everything
// that fills or reads them: building them from entries, decoding and encoding
// the format (manifest_format.h), and the per-sample queries. The Rep is
// private to this file; the decoder's checks are what let the accessors index
// its arrays unchecked, so decoder and accessors stay side by side rather than
// sharing the Rep through a header.

#include "granary/core/manifest.h"

#include <zstd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "granary/core/byte_order.h"
#include "granary/core/file.h"
#include "granary/core/manifest_format.h"
#include "granary/core/names.h"
#include "manifest_codec.h"

namespace granary {

namespace fmt = manifest_format;

namespace {

constexpr uint32_t kEmptySlot = 0xFFFFFFFFu;

// A chunk of whole samples, or all the chunks of one sample larger than a chunk
// (one record for its pieces, so a huge file costs no memory per piece).
struct ChunkRun {
  ChunkId first_chunk;
  SampleId first_sample;
  uint32_t sample_count;   // 1 for a spanning sample
  uint32_t payload_bytes;  // whole-sample chunk only; pieces derive theirs from the size
};

constexpr uint64_t kMaxChunks = 0xFFFFFFFEull;

// A path component: non-empty, not "." or "..", no '/' or NUL, at most NAME_MAX.
Status CheckComponent(std::string_view name, std::string_view path) {
  if (name.empty() || name == "." || name == ".." || name.size() > fmt::kMaxNameLength ||
      name.find('\0') != std::string_view::npos || name.find('/') != std::string_view::npos) {
    return Status::InvalidArgument("path '" + std::string(path) + "' has an invalid component '" +
                                   std::string(name) +
                                   "' (empty, '.', '..', NUL or longer than 255 bytes)");
  }
  return Status::Ok();
}

Status CheckRelativePath(std::string_view path) {
  if (path.empty() || path.size() > fmt::kMaxPathLength) {
    return Status::InvalidArgument("path '" + std::string(path) + "' must be 1 to 4095 bytes long");
  }
  size_t start = 0;
  while (true) {
    size_t slash = path.find('/', start);
    std::string_view comp = path.substr(
        start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    GRANARY_RETURN_IF_ERROR(CheckComponent(comp, path));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return Status::Ok();
}

std::string_view DirPart(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? std::string_view() : path.substr(0, slash);
}

std::string_view NamePart(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

Status CheckChunkSize(uint64_t chunk_size) {
  if (chunk_size < kMinChunkSize || chunk_size > kMaxChunkSize) {
    return Status::InvalidArgument("chunk size " + std::to_string(chunk_size) +
                                   " is out of range; use 1 KiB to 1 GiB (default 16 MiB)");
  }
  return Status::Ok();
}

void PutString32(ByteWriter& w, std::string_view s) {
  w.Put(static_cast<uint32_t>(s.size()));
  w.PutBytes(s);
}

bool GetString32(ByteReader& r, std::string* s) {
  uint32_t len = 0;
  std::string_view bytes;
  if (!r.Get(&len) || !r.GetBytes(len, &bytes)) return false;
  s->assign(bytes);
  return true;
}

// Decompresses one zstd frame that must yield exactly `expected` bytes. The
// output grows only as decompressed bytes arrive, so a header that lies about
// the size cannot make the reader allocate more than the frame really holds.
Result<std::string> Decompress(std::string_view frame, uint64_t expected) {
  auto corrupt = [](const std::string& what) {
    return Status::Corruption("manifest is corrupt: cannot decompress the body: " + what +
                              "; rebuild it with a new snapshot of the dataset");
  };
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (ctx == nullptr) return Status::ResourceExhausted("decode manifest: out of memory");
  std::string out;
  ZSTD_inBuffer in{frame.data(), frame.size(), 0};
  size_t produced = 0;
  while (true) {
    if (produced == out.size()) {
      if (out.size() >= expected) {
        // Full: the frame must be finished; probe with a byte of room.
        char probe;
        ZSTD_outBuffer extra{&probe, 1, 0};
        size_t rc = ZSTD_decompressStream(ctx.get(), &extra, &in);
        if (ZSTD_isError(rc)) return corrupt(ZSTD_getErrorName(rc));
        if (extra.pos != 0) return corrupt("more bytes than the header says");
        if (rc != 0) return corrupt("the frame is incomplete");
        break;
      }
      uint64_t grown = std::min<uint64_t>(expected, std::max<uint64_t>(out.size() * 2, 1u << 20));
      out.resize(static_cast<size_t>(grown));
    }
    ZSTD_outBuffer o{out.data(), out.size(), produced};
    size_t rc = ZSTD_decompressStream(ctx.get(), &o, &in);
    if (ZSTD_isError(rc)) return corrupt(ZSTD_getErrorName(rc));
    bool progressed = o.pos != produced;
    produced = o.pos;
    if (rc == 0) break;  // frame complete
    if (!progressed && in.pos == in.size) return corrupt("the frame is truncated");
  }
  if (produced != expected || in.pos != in.size) {
    return corrupt("got " + std::to_string(produced) + " bytes, the header says " +
                   std::to_string(expected));
  }
  out.resize(produced);
  return out;
}

}  // namespace

struct Manifest::Rep {
  ContentId content_id;
  ManifestHeaderInfo header;
  uint32_t version = fmt::kVersion;  // of the encoding: a decoded manifest keeps its own

  // Directory 0 is the root (""); parents precede children; sorted by path.
  std::vector<uint32_t> dir_parent;
  std::vector<std::string> dir_path;
  std::vector<uint16_t> dir_mode;

  // Per sample, in id order.
  std::vector<uint32_t> sample_dir;
  std::vector<uint32_t> name_end;  // names[name_end[i-1], name_end[i]) is sample i's name
  std::string names;
  std::vector<uint64_t> size;
  std::vector<int64_t> mtime_ns;
  std::vector<uint16_t> mode;
  // Version 3 on; empty for an older manifest (nothing recorded).
  std::vector<int64_t> ctime_ns;
  std::vector<uint64_t> inode;
  std::vector<ChunkId> chunk;
  std::vector<uint32_t> chunk_offset;

  std::vector<ChunkRun> runs;  // sorted by first_chunk
  uint64_t chunk_count = 0;
  uint64_t total_bytes = 0;

  // Path index, built on the first Find(): most users (cache nodes) never need it.
  mutable std::once_flag index_once;
  mutable std::vector<uint32_t> index;  // open addressing, kEmptySlot when free

  size_t sample_count() const { return size.size(); }

  std::string_view NameOf(SampleId s) const {
    uint32_t begin = s == 0 ? 0 : name_end[s - 1];
    return std::string_view(names).substr(begin, name_end[s] - begin);
  }

  void AppendPath(SampleId s, std::string* out) const {
    const std::string& dir = dir_path[sample_dir[s]];
    out->append(dir);
    if (!dir.empty()) out->push_back('/');
    out->append(NameOf(s));
  }

  bool PathEquals(SampleId s, std::string_view path) const {
    const std::string& dir = dir_path[sample_dir[s]];
    std::string_view name = NameOf(s);
    size_t want = dir.size() + (dir.empty() ? 0 : 1) + name.size();
    if (path.size() != want) return false;
    if (!dir.empty() && (path.compare(0, dir.size(), dir) != 0 || path[dir.size()] != '/')) {
      return false;
    }
    return path.substr(path.size() - name.size()) == name;
  }

  // Assigns chunks and offsets from sizes (see "Packing" in manifest.h).
  Status Pack() {
    const uint64_t cs = header.chunk_size;
    const size_t n = sample_count();
    chunk.assign(n, 0);
    chunk_offset.assign(n, 0);
    runs.clear();
    chunk_count = 0;
    total_bytes = 0;
    auto too_many = [] {
      return Status::InvalidArgument(
          "dataset needs more than 2^32-2 chunks; use a larger chunk "
          "size");
    };
    bool open = false;
    for (size_t i = 0; i < n; ++i) {
      const auto sample = static_cast<SampleId>(i);
      const uint64_t sz = size[i];
      if (sz > UINT64_MAX - total_bytes) {
        return Status::InvalidArgument("dataset is larger than 2^64 bytes");
      }
      total_bytes += sz;
      if (sz > cs) {
        open = false;
        uint64_t pieces = sz / cs + (sz % cs != 0 ? 1 : 0);
        if (pieces > kMaxChunks - chunk_count) return too_many();
        chunk[i] = static_cast<ChunkId>(chunk_count);
        runs.push_back({static_cast<ChunkId>(chunk_count), sample, 1, 0});
        chunk_count += pieces;
        continue;
      }
      if (open && (runs.back().payload_bytes + sz > cs ||
                   runs.back().sample_count >= kMaxSamplesPerChunk)) {
        open = false;
      }
      if (!open) {
        if (chunk_count >= kMaxChunks) return too_many();
        runs.push_back({static_cast<ChunkId>(chunk_count), sample, 0, 0});
        chunk_count += 1;
        open = true;
      }
      ChunkRun& c = runs.back();
      chunk[i] = c.first_chunk;
      chunk_offset[i] = c.payload_bytes;
      c.payload_bytes += static_cast<uint32_t>(sz);
      c.sample_count += 1;
    }
    runs.shrink_to_fit();
    return Status::Ok();
  }

  // The chunk `id` (< chunk_count) as a ChunkInfo.
  ChunkInfo ChunkAt(ChunkId id) const {
    auto it = std::upper_bound(runs.begin(), runs.end(), id,
                               [](ChunkId c, const ChunkRun& r) { return c < r.first_chunk; });
    const ChunkRun& r = *(it - 1);
    const uint64_t sz = size[r.first_sample];
    const uint64_t cs = header.chunk_size;
    if (sz > cs) {
      uint64_t piece = id - r.first_chunk;
      return ChunkInfo{id, r.first_sample, 1, static_cast<uint32_t>(std::min(cs, sz - piece * cs))};
    }
    return ChunkInfo{id, r.first_sample, r.sample_count, r.payload_bytes};
  }

  std::string EncodeBody() const {
    std::string body;
    const size_t n = sample_count();
    body.reserve(64 + names.size() + n * 42);
    ByteWriter w(&body);
    w.Put(header.chunk_size);
    w.Put(static_cast<uint64_t>(n));
    w.Put(static_cast<uint32_t>(dir_path.size()));
    PutString32(w, header.source_uri);
    w.Put(static_cast<uint32_t>(header.include.size()));
    for (const auto& g : header.include) PutString32(w, g);
    w.Put(static_cast<uint32_t>(header.exclude.size()));
    for (const auto& g : header.exclude) PutString32(w, g);
    const WalkStats& st = header.stats;
    for (uint64_t v : {st.directories, st.skipped_excluded, st.skipped_not_included,
                       st.skipped_special, st.skipped_symlinks, st.skipped_unreadable}) {
      w.Put(v);
    }
    for (size_t d = 0; d < dir_path.size(); ++d) {
      w.Put(dir_parent[d]);
      std::string_view name = d == 0 ? std::string_view() : NamePart(dir_path[d]);
      w.Put(static_cast<uint16_t>(name.size()));
      w.PutBytes(name);
    }
    for (uint32_t d : sample_dir) w.Put(d);
    for (size_t i = 0; i < n; ++i)
      w.Put(static_cast<uint16_t>(NameOf(static_cast<SampleId>(i)).size()));
    w.PutBytes(names);
    for (uint64_t s : size) w.Put(s);
    for (int64_t m : mtime_ns) w.Put(m);
    if (version >= 2) {
      for (uint16_t m : mode) w.Put(m);
      for (uint16_t m : dir_mode) w.Put(m);
    }
    if (version >= 3) {
      for (int64_t c : ctime_ns) w.Put(c);
      for (uint64_t i : inode) w.Put(i);
    }
    return body;
  }

  void BuildIndex() const {
    const size_t n = sample_count();
    size_t cap = std::bit_ceil(std::max<size_t>(16, n + n / 2 + 1));
    index.assign(cap, kEmptySlot);
    const size_t mask = cap - 1;
    std::string path;
    for (size_t i = 0; i < n; ++i) {
      path.clear();
      AppendPath(static_cast<SampleId>(i), &path);
      size_t slot = Hash64(path) & mask;
      while (index[slot] != kEmptySlot) slot = (slot + 1) & mask;
      index[slot] = static_cast<uint32_t>(i);
    }
  }
};

Manifest::Manifest() : rep_(std::make_unique<Rep>()) {}
Manifest::Manifest(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}
Manifest::~Manifest() = default;
Manifest::Manifest(Manifest&&) noexcept = default;
Manifest& Manifest::operator=(Manifest&&) noexcept = default;

Result<Manifest> Manifest::FromEntries(ManifestHeaderInfo header, std::vector<FileEntry> entries,
                                       std::vector<DirectoryEntry> directories) {
  GRANARY_RETURN_IF_ERROR(CheckChunkSize(header.chunk_size));
  if (entries.size() >= 0xFFFFFFFFull) {
    return Status::InvalidArgument("a manifest holds at most 2^32-2 samples; got " +
                                   std::to_string(entries.size()) + "; split the dataset");
  }
  auto check_mode = [](uint16_t mode, std::string_view path) {
    if (mode <= kMaxMode) return Status::Ok();
    return Status::InvalidArgument("path " + Quoted(path) + " has mode " + std::to_string(mode) +
                                   ", more than permission bits (07777); pass st_mode & 07777");
  };
  for (const auto& e : entries) {
    GRANARY_RETURN_IF_ERROR(CheckRelativePath(e.path));
    GRANARY_RETURN_IF_ERROR(check_mode(e.mode, e.path));
  }
  std::unordered_map<std::string_view, uint16_t> listed_mode;
  listed_mode.reserve(directories.size());
  for (const auto& d : directories) {
    if (!d.path.empty()) GRANARY_RETURN_IF_ERROR(CheckRelativePath(d.path));
    GRANARY_RETURN_IF_ERROR(check_mode(d.mode, d.path));
    if (!listed_mode.emplace(d.path, d.mode).second) {
      return Status::InvalidArgument("directory " + Quoted(d.path) + " is listed twice");
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const FileEntry& a, const FileEntry& b) { return a.path < b.path; });
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].path == entries[i - 1].path) {
      return Status::InvalidArgument("path '" + entries[i].path + "' appears twice");
    }
  }

  auto rep = std::make_unique<Rep>();
  rep->header = std::move(header);

  // Every ancestor directory of every sample and of every listed directory,
  // and the listed ones, sorted; the root "" sorts first.
  std::vector<std::string_view> dirs{std::string_view()};
  for (const auto& e : entries) {
    for (std::string_view d = DirPart(e.path); !d.empty(); d = DirPart(d)) dirs.push_back(d);
  }
  for (const auto& listed : directories) {
    for (std::string_view d = listed.path; !d.empty(); d = DirPart(d)) dirs.push_back(d);
  }
  std::sort(dirs.begin(), dirs.end());
  dirs.erase(std::unique(dirs.begin(), dirs.end()), dirs.end());
  std::unordered_map<std::string_view, uint32_t> dir_index;
  dir_index.reserve(dirs.size());
  for (size_t d = 0; d < dirs.size(); ++d) dir_index.emplace(dirs[d], static_cast<uint32_t>(d));
  rep->dir_path.reserve(dirs.size());
  rep->dir_parent.reserve(dirs.size());
  rep->dir_mode.reserve(dirs.size());
  for (size_t d = 0; d < dirs.size(); ++d) {
    rep->dir_path.emplace_back(dirs[d]);
    rep->dir_parent.push_back(d == 0 ? fmt::kNoParent : dir_index.at(DirPart(dirs[d])));
    auto listed = listed_mode.find(dirs[d]);
    rep->dir_mode.push_back(listed == listed_mode.end() ? kDefaultDirectoryMode : listed->second);
  }

  const size_t n = entries.size();
  rep->sample_dir.reserve(n);
  rep->name_end.reserve(n);
  rep->size.reserve(n);
  rep->mtime_ns.reserve(n);
  rep->mode.reserve(n);
  rep->ctime_ns.reserve(n);
  rep->inode.reserve(n);
  for (const auto& e : entries) {
    rep->sample_dir.push_back(dir_index.at(DirPart(e.path)));
    rep->names.append(NamePart(e.path));
    if (rep->names.size() > 0xFFFFFFFFull) {
      return Status::InvalidArgument("file names total more than 4 GiB; split the dataset");
    }
    rep->name_end.push_back(static_cast<uint32_t>(rep->names.size()));
    rep->size.push_back(e.size);
    rep->mtime_ns.push_back(e.mtime_ns);
    rep->mode.push_back(e.mode);
    rep->ctime_ns.push_back(e.ctime_ns);
    rep->inode.push_back(e.inode);
  }
  rep->names.shrink_to_fit();
  GRANARY_RETURN_IF_ERROR(rep->Pack());
  rep->content_id = ContentId::Of(rep->EncodeBody());
  return Manifest(std::move(rep));
}

Result<Manifest> internal::DecodeManifestBody(std::string_view body, const ContentId& id,
                                              uint32_t version) {
  auto corrupt = [](const std::string& what) {
    return Status::Corruption("manifest body is malformed: " + what +
                              "; the file is damaged or was not written by Granary, rebuild it "
                              "with a new snapshot");
  };
  if (version < fmt::kOldestVersion || version > fmt::kVersion) {
    return Status::VersionMismatch("manifest format version " + std::to_string(version) +
                                   " is not supported by this build");
  }
  ByteReader r(body);
  auto rep = std::make_unique<Manifest::Rep>();
  rep->version = version;
  uint64_t n64 = 0;
  uint32_t dir_count = 0;
  r.Get(&rep->header.chunk_size);
  r.Get(&n64);
  r.Get(&dir_count);
  if (!r.ok()) return corrupt("properties are truncated");
  if (!CheckChunkSize(rep->header.chunk_size).ok()) {
    return corrupt("chunk size " + std::to_string(rep->header.chunk_size) + " is out of range");
  }
  if (!GetString32(r, &rep->header.source_uri)) return corrupt("source URI is truncated");
  for (auto* globs : {&rep->header.include, &rep->header.exclude}) {
    uint32_t count = 0;
    if (!r.Get(&count) || count > r.remaining() / 4) return corrupt("glob list is truncated");
    globs->resize(count);
    for (auto& g : *globs) {
      if (!GetString32(r, &g)) return corrupt("glob is truncated");
    }
  }
  WalkStats& st = rep->header.stats;
  for (uint64_t* v : {&st.directories, &st.skipped_excluded, &st.skipped_not_included,
                      &st.skipped_special, &st.skipped_symlinks, &st.skipped_unreadable}) {
    r.Get(v);
  }
  if (!r.ok()) return corrupt("walk statistics are truncated");

  // Directories: each at least 6 bytes, so the count is bounded by what is left.
  if (dir_count == 0 || dir_count > r.remaining() / 6) return corrupt("directory count is wrong");
  rep->dir_parent.resize(dir_count);
  rep->dir_path.resize(dir_count);
  for (uint32_t d = 0; d < dir_count; ++d) {
    uint16_t len = 0;
    std::string_view name;
    if (!r.Get(&rep->dir_parent[d]) || !r.Get(&len) || !r.GetBytes(len, &name)) {
      return corrupt("directory table is truncated");
    }
    if (d == 0) {
      if (rep->dir_parent[0] != fmt::kNoParent || !name.empty()) {
        return corrupt("directory 0 is not the root");
      }
      continue;
    }
    uint32_t parent = rep->dir_parent[d];
    if (parent >= d) return corrupt("directory " + std::to_string(d) + " has a bad parent");
    if (!CheckComponent(name, name).ok()) {
      return corrupt("directory " + std::to_string(d) + " has an invalid name");
    }
    const std::string& pp = rep->dir_path[parent];
    std::string& path = rep->dir_path[d];
    path.reserve(pp.size() + 1 + name.size());
    path = pp;
    if (!path.empty()) path.push_back('/');
    path.append(name);
    if (path.size() > fmt::kMaxPathLength) return corrupt("directory path is too long");
    if (path <= rep->dir_path[d - 1]) return corrupt("directories are not sorted and unique");
  }

  // Samples: 22 fixed bytes each (dir, name length, size, mtime) bound the count.
  if (n64 >= 0xFFFFFFFFull || n64 > r.remaining() / 22) return corrupt("sample count is wrong");
  const size_t n = static_cast<size_t>(n64);
  rep->sample_dir.resize(n);
  for (auto& d : rep->sample_dir) {
    r.Get(&d);
    if (d >= dir_count) return corrupt("a sample names a directory that does not exist");
  }
  rep->name_end.resize(n);
  uint64_t names_total = 0;
  for (auto& e : rep->name_end) {
    uint16_t len = 0;
    r.Get(&len);
    names_total += len;
    e = static_cast<uint32_t>(names_total);
  }
  if (!r.ok() || names_total > r.remaining() || names_total > 0xFFFFFFFFull) {
    return corrupt("sample names are truncated");
  }
  std::string_view names;
  r.GetBytes(static_cast<size_t>(names_total), &names);
  rep->names.assign(names);
  rep->size.resize(n);
  for (auto& s : rep->size) r.Get(&s);
  rep->mtime_ns.resize(n);
  for (auto& m : rep->mtime_ns) r.Get(&m);
  if (!r.ok()) return corrupt("sample columns are truncated");
  if (version >= 2) {
    // Bounded by the counts already checked against the bytes left.
    const size_t want = 2 * (n + static_cast<size_t>(dir_count)) + (version >= 3 ? 16 * n : 0);
    if (r.remaining() != want) {
      return corrupt(std::string(version >= 3 ? "mode, ctime and inode" : "mode") +
                     " columns are " + std::to_string(r.remaining()) + " bytes, not " +
                     std::to_string(want));
    }
    rep->mode.resize(n);
    for (auto& m : rep->mode) r.Get(&m);
    rep->dir_mode.resize(dir_count);
    for (auto& m : rep->dir_mode) r.Get(&m);
    auto bad = [](uint16_t m) { return m > kMaxMode; };
    if (std::any_of(rep->mode.begin(), rep->mode.end(), bad) ||
        std::any_of(rep->dir_mode.begin(), rep->dir_mode.end(), bad)) {
      return corrupt("a mode has bits beyond 07777");
    }
    if (version >= 3) {
      rep->ctime_ns.resize(n);
      for (auto& c : rep->ctime_ns) r.Get(&c);
      rep->inode.resize(n);
      for (auto& i : rep->inode) r.Get(&i);
    }
  } else {
    rep->mode.assign(n, kDefaultFileMode);
    rep->dir_mode.assign(dir_count, kDefaultDirectoryMode);
  }
  if (r.remaining() != 0) return corrupt(std::to_string(r.remaining()) + " trailing bytes");

  // Names valid, paths strictly increasing (sorted and unique).
  std::string prev, cur;
  for (size_t i = 0; i < n; ++i) {
    auto sample = static_cast<SampleId>(i);
    if (!CheckComponent(rep->NameOf(sample), rep->NameOf(sample)).ok()) {
      return corrupt("sample " + std::to_string(i) + " has an invalid name");
    }
    cur.clear();
    rep->AppendPath(sample, &cur);
    if (cur.size() > fmt::kMaxPathLength) return corrupt("a sample path is too long");
    if (i > 0 && cur <= prev) return corrupt("sample paths are not sorted and unique");
    std::swap(prev, cur);
  }
  Status packed = rep->Pack();
  if (!packed.ok()) return corrupt(packed.message());
  rep->content_id = id;
  return Manifest(std::move(rep));
}

Result<Manifest> Manifest::Decode(std::string_view bytes) {
  auto corrupt = [](const std::string& what) {
    return Status::Corruption("manifest is corrupt: " + what +
                              "; rebuild it with a new snapshot of the dataset");
  };
  if (bytes.size() < fmt::kHeaderSize) {
    return corrupt("file is truncated (" + std::to_string(bytes.size()) +
                   " bytes, the header "
                   "alone is 64)");
  }
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (std::memcmp(p + fmt::kMagicOffset, fmt::kMagic, sizeof(fmt::kMagic)) != 0) {
    return Status::Corruption("not a Granary manifest (bad magic); check the path");
  }
  uint32_t version = LoadLe<uint32_t>(p + fmt::kVersionOffset);
  if (version < fmt::kOldestVersion || version > fmt::kVersion) {
    return Status::VersionMismatch("manifest format version " + std::to_string(version) +
                                   " is not supported by this build (reads versions " +
                                   std::to_string(fmt::kOldestVersion) + " to " +
                                   std::to_string(fmt::kVersion) +
                                   "); use a matching Granary or re-snapshot the dataset");
  }
  if (LoadLe<uint32_t>(p + fmt::kHeaderSizeOffset) != fmt::kHeaderSize ||
      LoadLe<uint32_t>(p + fmt::kFlagsOffset) != 0 ||
      LoadLe<uint32_t>(p + fmt::kReservedOffset) != 0) {
    return corrupt("header fields are invalid");
  }
  ContentId id = ContentId::FromBytes(p + fmt::kContentIdOffset);
  uint64_t body_size = LoadLe<uint64_t>(p + fmt::kBodySizeOffset);
  uint64_t compressed_size = LoadLe<uint64_t>(p + fmt::kCompressedSizeOffset);
  uint64_t frame_checksum = LoadLe<uint64_t>(p + fmt::kFrameChecksumOffset);
  if (compressed_size != bytes.size() - fmt::kHeaderSize) {
    return corrupt("file is " + std::to_string(bytes.size()) + " bytes but its header says " +
                   std::to_string(fmt::kHeaderSize + compressed_size) +
                   (compressed_size > bytes.size() - fmt::kHeaderSize ? " (truncated)" : ""));
  }
  std::string_view frame = bytes.substr(fmt::kHeaderSize);
  if (Checksum64(frame) != frame_checksum) return corrupt("checksum mismatch");
  if (body_size > fmt::kMaxBodySize ||
      body_size > compressed_size * fmt::kMaxCompressionRatio + (1u << 20)) {
    return corrupt("body size " + std::to_string(body_size) + " is implausible");
  }
  unsigned long long frame_size = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (frame_size != body_size) return corrupt("compressed body size disagrees with the header");
  GRANARY_ASSIGN_OR_RETURN(std::string body, Decompress(frame, body_size));
  if (ContentId::Of(body) != id) return corrupt("content id does not match the content");
  return internal::DecodeManifestBody(body, id, version);
}

Result<Manifest> Manifest::Load(const std::string& path) {
  GRANARY_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  auto m = Decode(bytes);
  if (!m.ok()) return m.status().WithContext("load manifest " + path);
  return m;
}

std::string Manifest::Encode() const {
  std::string body = rep_->EncodeBody();
  std::string out(fmt::kHeaderSize, '\0');
  size_t bound = ZSTD_compressBound(body.size());
  out.resize(fmt::kHeaderSize + bound);
  size_t written = ZSTD_compress(out.data() + fmt::kHeaderSize, bound, body.data(), body.size(),
                                 fmt::kZstdLevel);
  // Compression into a buffer of compressBound size cannot fail.
  if (ZSTD_isError(written)) std::abort();
  out.resize(fmt::kHeaderSize + written);
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(p + fmt::kMagicOffset, fmt::kMagic, sizeof(fmt::kMagic));
  StoreLe(p + fmt::kVersionOffset, rep_->version);
  StoreLe(p + fmt::kHeaderSizeOffset, static_cast<uint32_t>(fmt::kHeaderSize));
  auto id_bytes = rep_->content_id.ToBytes();
  std::memcpy(p + fmt::kContentIdOffset, id_bytes.data(), id_bytes.size());
  StoreLe(p + fmt::kBodySizeOffset, static_cast<uint64_t>(body.size()));
  StoreLe(p + fmt::kCompressedSizeOffset, static_cast<uint64_t>(written));
  StoreLe(p + fmt::kFrameChecksumOffset,
          Checksum64(std::string_view(out).substr(fmt::kHeaderSize)));
  return out;
}

Status Manifest::Save(const std::string& path) const {
  return WriteFileAtomically(path, Encode(), 0644);
}

const ContentId& Manifest::id() const { return rep_->content_id; }
const ManifestHeaderInfo& Manifest::header() const { return rep_->header; }
size_t Manifest::sample_count() const { return rep_->sample_count(); }
size_t Manifest::chunk_count() const { return static_cast<size_t>(rep_->chunk_count); }
uint64_t Manifest::total_bytes() const { return rep_->total_bytes; }
size_t Manifest::directory_count() const { return rep_->dir_path.size(); }

uint64_t Manifest::SizeOf(SampleId id) const { return rep_->size[id]; }
int64_t Manifest::MtimeOf(SampleId id) const { return rep_->mtime_ns[id]; }
uint16_t Manifest::ModeOf(SampleId id) const { return rep_->mode[id]; }
int64_t Manifest::CtimeOf(SampleId id) const {
  return rep_->ctime_ns.empty() ? 0 : rep_->ctime_ns[id];
}
uint64_t Manifest::InodeOf(SampleId id) const { return rep_->inode.empty() ? 0 : rep_->inode[id]; }
uint32_t Manifest::format_version() const { return rep_->version; }
std::string_view Manifest::NameOf(SampleId id) const { return rep_->NameOf(id); }
uint32_t Manifest::DirectoryOf(SampleId id) const { return rep_->sample_dir[id]; }
uint32_t Manifest::DirectoryParent(uint32_t d) const { return rep_->dir_parent[d]; }
const std::string& Manifest::DirectoryPath(uint32_t d) const { return rep_->dir_path[d]; }
std::string_view Manifest::DirectoryName(uint32_t d) const {
  return d == 0 ? std::string_view() : NamePart(rep_->dir_path[d]);
}
uint16_t Manifest::DirectoryMode(uint32_t d) const { return rep_->dir_mode[d]; }
ChunkId Manifest::ChunkOf(SampleId id) const { return rep_->chunk[id]; }
uint32_t Manifest::ChunkOffsetOf(SampleId id) const { return rep_->chunk_offset[id]; }

std::string Manifest::PathOf(SampleId id) const {
  std::string path;
  rep_->AppendPath(id, &path);
  return path;
}

Result<SampleInfo> Manifest::Sample(SampleId id) const {
  if (id >= sample_count()) {
    return Status::OutOfRange("sample id " + std::to_string(id) + " is past the end (" +
                              std::to_string(sample_count()) + " samples)");
  }
  SampleInfo info;
  info.id = id;
  info.path = PathOf(id);
  info.size = rep_->size[id];
  info.mtime_ns = rep_->mtime_ns[id];
  info.chunk = rep_->chunk[id];
  info.chunk_offset = rep_->chunk_offset[id];
  info.mode = rep_->mode[id];
  info.ctime_ns = CtimeOf(id);
  info.inode = InodeOf(id);
  uint64_t cs = chunk_size();
  info.chunk_count = info.size > cs ? static_cast<uint32_t>((info.size + cs - 1) / cs) : 1;
  return info;
}

Result<SampleId> Manifest::Find(std::string_view path) const {
  std::call_once(rep_->index_once, [this] { rep_->BuildIndex(); });
  const auto& index = rep_->index;
  const size_t mask = index.size() - 1;
  for (size_t slot = Hash64(path) & mask; index[slot] != kEmptySlot; slot = (slot + 1) & mask) {
    if (rep_->PathEquals(index[slot], path)) return index[slot];
  }
  return Status::NotFound("no file '" + std::string(path) + "' in manifest " + id().ToHex());
}

Result<ChunkInfo> Manifest::Chunk(ChunkId id) const {
  if (id >= chunk_count()) {
    return Status::OutOfRange("chunk id " + std::to_string(id) + " is past the end (" +
                              std::to_string(chunk_count()) + " chunks)");
  }
  return rep_->ChunkAt(id);
}

Result<std::vector<ChunkSegment>> Manifest::Segments(ChunkId id) const {
  GRANARY_ASSIGN_OR_RETURN(ChunkInfo c, Chunk(id));
  std::vector<ChunkSegment> segments;
  uint64_t cs = chunk_size();
  SampleId first = c.first_sample;
  if (rep_->size[first] > cs) {
    uint64_t piece = id - rep_->chunk[first];
    segments.push_back({first, piece * cs, 0, c.payload_bytes});
    return segments;
  }
  segments.reserve(c.sample_count);
  for (SampleId s = first; s < first + c.sample_count; ++s) {
    segments.push_back({s, 0, rep_->chunk_offset[s], static_cast<uint32_t>(rep_->size[s])});
  }
  return segments;
}

size_t Manifest::MemoryBytes() const {
  const Rep& r = *rep_;
  size_t bytes = sizeof(Rep);
  for (const auto& d : r.dir_path) bytes += sizeof(std::string) + d.capacity();
  bytes += r.dir_parent.capacity() * sizeof(uint32_t);
  bytes += r.sample_dir.capacity() * sizeof(uint32_t) + r.name_end.capacity() * sizeof(uint32_t);
  bytes += r.names.capacity() + r.size.capacity() * sizeof(uint64_t) +
           r.mtime_ns.capacity() * sizeof(int64_t) + r.mode.capacity() * sizeof(uint16_t) +
           r.ctime_ns.capacity() * sizeof(int64_t) + r.inode.capacity() * sizeof(uint64_t) +
           r.dir_mode.capacity() * sizeof(uint16_t) + r.chunk.capacity() * sizeof(ChunkId) +
           r.chunk_offset.capacity() * sizeof(uint32_t) + r.runs.capacity() * sizeof(ChunkRun) +
           r.index.capacity() * sizeof(uint32_t);
  return bytes;
}

}  // namespace granary
