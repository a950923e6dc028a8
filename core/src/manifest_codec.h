#pragma once

// Internal entry points of the manifest codec, exposed to the fuzz target so it
// can reach the body parser without having to forge checksums.

#include <string_view>

#include "granary/core/manifest.h"
#include "granary/core/manifest_format.h"

namespace granary::internal {

// Parses an uncompressed manifest body (the part under the zstd frame) and
// validates it completely. `id` is recorded as the manifest's id; `version`
// is the format version of the file's header (kOldestVersion..kVersion).
Result<Manifest> DecodeManifestBody(std::string_view body, const ContentId& id,
                                    uint32_t version = manifest_format::kVersion);

}  // namespace granary::internal
