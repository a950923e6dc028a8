#pragma once

// Base64 (RFC 4648, standard alphabet, padded), as Kubernetes uses it for
// Secret data, kubeconfig *-data fields, caBundle and JSONPatch responses.
// OpenSSL's EVP block codec underneath.
//
// Thread safety: pure functions.

#include <string>
#include <string_view>

#include "granary/core/status.h"

namespace granary::kube {

std::string Base64Encode(std::string_view bytes);
// Whitespace (line breaks in a PEM-like value) is ignored; anything else
// that is not base64 is kInvalidArgument naming `what`.
Result<std::string> Base64Decode(std::string_view text, const std::string& what);

}  // namespace granary::kube
