#pragma once

// Internal entry points of the manifest codec, exposed to the fuzz target so it
// can reach the body parser without having to forge checksums.

#include <string_view>

#include "granary/core/manifest.h"

namespace granary::internal {

// Parses an uncompressed manifest body (the part under the zstd frame) and
// validates it completely. `id` is recorded as the manifest's id.
Result<Manifest> DecodeManifestBody(std::string_view body, const ContentId& id);

}  // namespace granary::internal
