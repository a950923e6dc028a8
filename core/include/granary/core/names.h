#pragma once

// Names shared across Granary: the dataset-name rule, the rule for a path a
// client names inside a dataset, and how any untrusted string (a name read
// from disk, a URL, a key from the store) is shown in an error message.
//
// Thread safety: pure functions.

#include <string>
#include <string_view>

#include "granary/core/status.h"

namespace granary {

// A DNS-1123 label: 1..63 of [a-z0-9-], starting and ending with [a-z0-9].
// Dataset names are labels (Kubernetes object names, Slurm directives, files).
inline constexpr size_t kMaxDnsLabelLength = 63;
bool IsDnsLabel(std::string_view name);

// [A-Za-z0-9]: the first character of the token-like names below.
inline bool IsAsciiAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// ---- the names of Granary's records, checked wherever one is received ----
// Each is OK or kInvalidArgument naming the field, the value (Quoted) and the
// rule. The metadata store applies them to every record written and read back.

// Datasets and pools: DNS-1123 labels.
Status ValidateDatasetName(std::string_view name);
Status ValidatePoolName(std::string_view pool);
// 1..253 of [A-Za-z0-9._-], starting with an alphanumeric (host names,
// Kubernetes node names).
Status ValidateNodeId(std::string_view id);
// A plan id: 1..128 of [A-Za-z0-9._-], starting with an alphanumeric.
Status ValidatePlanId(std::string_view id);
// A manifest's content id: 1..128 lowercase hex digits.
Status ValidateManifestId(std::string_view id);

// `s` in single quotes for a message: printable ASCII as is, anything else
// (and ' and \) as \xNN, cut after 80 bytes with the full length noted.
std::string Quoted(std::string_view s);

// A sample path as a client may name it (a LOOKUP, the POSIX view): at most
// this many bytes.
inline constexpr size_t kMaxSamplePathLength = 4096;
// OK for a path relative to the dataset root: non-empty components, none "."
// or "..", no NUL, not absolute, at most kMaxSamplePathLength bytes.
// kInvalidArgument naming the path (Quoted) and what is wrong otherwise.
// The client checks paths with it before asking; the sidecar again on receipt.
Status ValidateSamplePath(std::string_view path);

}  // namespace granary
