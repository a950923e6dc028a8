// Feeds arbitrary bytes to the manifest decoder. The first byte picks the entry:
// even → the whole file (header, checksum, zstd) as Manifest::Decode sees it;
// odd → an uncompressed body, which reaches the body parser without having to
// forge checksums (bits 1-2 pick the body's format version: 0 → 2, 1 → 1
// without the mode columns, 2 and 3 → 3 with the ctime and inode columns;
// seeds made before version 3 keep their meaning). Whatever decodes must
// answer every lookup without crashing, and re-encode to a manifest that
// decodes to the same one.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "granary/core/manifest.h"
#include "manifest_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  const uint32_t selector = (data[0] >> 1) & 3u;
  const uint32_t version = selector == 0 ? 2u : selector == 1 ? 1u : 3u;
  auto m = (data[0] & 1) == 0
               ? granary::Manifest::Decode(input)
               : granary::internal::DecodeManifestBody(input, granary::ContentId{}, version);
  if (!m.ok()) return 0;
  for (uint32_t d = 0; d < m->directory_count() && d < 1000; ++d) {
    if (m->DirectoryMode(d) > granary::kMaxMode) __builtin_trap();
    if (d != 0 && m->DirectoryParent(d) >= d) __builtin_trap();
  }
  for (granary::ChunkId c = 0; c < m->chunk_count() && c < 1000; ++c) {
    auto segments = m->Segments(c);
    if (!segments.ok()) __builtin_trap();
  }
  for (granary::SampleId s = 0; s < m->sample_count() && s < 1000; ++s) {
    auto found = m->Find(m->PathOf(s));
    if (!found.ok() || *found != s) __builtin_trap();
    if (m->ModeOf(s) > granary::kMaxMode || m->DirectoryOf(s) >= m->directory_count()) {
      __builtin_trap();
    }
    auto info = m->Sample(s);
    if (!info.ok() || info->ctime_ns != m->CtimeOf(s) || info->inode != m->InodeOf(s)) {
      __builtin_trap();
    }
  }
  (void)m->Find("no/such/file");
  std::string again = m->Encode();
  if ((data[0] & 1) == 0) {
    // A decoded file re-encodes (same version, same id) to one that decodes.
    auto back = granary::Manifest::Decode(again);
    if (!back.ok() || back->id() != m->id() || back->sample_count() != m->sample_count()) {
      __builtin_trap();
    }
  }
  return 0;
}
