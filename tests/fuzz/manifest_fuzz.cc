// Feeds arbitrary bytes to the manifest decoder. The first byte picks the entry:
// even → the whole file (header, checksum, zstd) as Manifest::Decode sees it;
// odd → an uncompressed body, which reaches the body parser without having to
// forge checksums. Whatever decodes must answer every lookup without crashing.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "granary/core/manifest.h"
#include "manifest_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  auto m = (data[0] & 1) == 0 ? granary::Manifest::Decode(input)
                              : granary::internal::DecodeManifestBody(input, granary::ContentId{});
  if (!m.ok()) return 0;
  for (granary::ChunkId c = 0; c < m->chunk_count() && c < 1000; ++c) {
    auto segments = m->Segments(c);
    if (!segments.ok()) __builtin_trap();
  }
  for (granary::SampleId s = 0; s < m->sample_count() && s < 1000; ++s) {
    auto found = m->Find(m->PathOf(s));
    if (!found.ok() || *found != s) __builtin_trap();
  }
  (void)m->Find("no/such/file");
  (void)m->Encode();
  return 0;
}
