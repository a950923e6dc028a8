#pragma once

// Names shared across Granary: the dataset-name rule, and how any untrusted
// string (a name read from disk, a URL, a key from the store) is shown in an
// error message.
//
// Thread safety: pure functions.

#include <string>
#include <string_view>

namespace granary {

// A DNS-1123 label: 1..63 of [a-z0-9-], starting and ending with [a-z0-9].
// Dataset names are labels (Kubernetes object names, Slurm directives, files).
inline constexpr size_t kMaxDnsLabelLength = 63;
bool IsDnsLabel(std::string_view name);

// `s` in single quotes for a message: printable ASCII as is, anything else
// (and ' and \) as \xNN, cut after 80 bytes with the full length noted.
std::string Quoted(std::string_view s);

}  // namespace granary
