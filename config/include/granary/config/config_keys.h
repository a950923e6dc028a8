#pragma once

// Readers of the configuration keys the daemons (cache node, sidecar) have in
// common, on top of ConfigMap (core/config.h): counts with a range, positive
// durations, addresses, optional strings, the metadata store URL's form, and
// reading the file named by --config. Every error names the file, the line,
// the key, the bad value and what to write.
//
// Who calls it: config/src/cachenode_config.cc and config/src/sidecar_config.cc.
//
// Thread safety: pure functions (HostName calls gethostname).

#include <spdlog/common.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "granary/core/config.h"
#include "granary/core/net_address.h"
#include "granary/core/status.h"
#include "granary/peer/peer_auth.h"

namespace granary {

// A duration as messages show it: "2s", or "250ms" if not whole seconds.
std::string DurationText(std::chrono::milliseconds d);

// Reads an optional count and checks lo <= value <= hi.
Status OptionalCount(ConfigMap& m, std::string_view key, uint32_t lo, uint32_t hi, uint32_t* out);

// Reads an optional string; *given says whether the key had a value (a key
// with an empty YAML value counts as absent, as everywhere in ConfigMap).
Status OptionalString(ConfigMap& m, std::string_view key, std::string* out, bool* given);

// Reads an optional host:port (ParseNetAddress); `what` names it in messages.
Status OptionalAddress(ConfigMap& m, std::string_view key, std::string_view what, NetAddress* out);

// Reads an optional duration that must be > 0.
Status OptionalPositiveDuration(ConfigMap& m, std::string_view key, std::chrono::milliseconds* out);

// Reads an optional log level (ParseLogLevel): trace, debug, info, warn, error, off.
Status OptionalLogLevel(ConfigMap& m, std::string_view key, spdlog::level::level_enum* out);

// Whether `s` has a byte below 0x20 or DEL.
bool HasControlCharacter(std::string_view s);

// 0.0.0.0 or ::.
bool IsWildcardHost(std::string_view host);

// gethostname(2).
Result<std::string> HostName();

// The form of a metadata store URL given under `key`: redis://host[:port][/db]
// or sqlite:///absolute/path; nothing is opened.
Status CheckStoreUrl(ConfigMap& m, std::string_view key, const std::string& url);

// The metadata store, given as exactly one of two keys: `metadata_store`
// (the URL, checked by CheckStoreUrl) or `metadata_store_file` (the absolute
// path of a file holding the URL, e.g. a mounted Kubernetes Secret, so a
// Redis password stays out of the configuration file). Sets *url or *file.
Status ParseStoreKeys(ConfigMap& m, std::string* url, std::string* file);

// Reads the URL from `file` (as ParseStoreKeys returned it; `config_path`
// is the configuration file that named it, for messages): trailing white
// space (a newline) dropped, then checked as CheckStoreUrl does.
Result<std::string> ReadStoreUrlFile(const std::string& config_path, const std::string& file);

// The form of a Unix socket path named by `origin` ("file:line: key
// 'socket'" or "$GRANARY_SOCKET"): absolute, no control characters, short
// enough for sockaddr_un. `example` is shown in the fix.
Status CheckSocketPath(std::string_view origin, const std::string& path, std::string_view example);

// An optional key naming a file: absent leaves `out` alone; present, an
// absolute path without control characters, else kInvalidArgument naming the
// key and `example`.
Status OptionalFilePath(ConfigMap& m, std::string_view key, std::string* out,
                        std::string_view example);

// The client side of the peer protocol's authentication (peer_auth.h), as the
// sidecar and the CLI configure it: `cluster_key_file` and `peer_token_file`
// (a Kubernetes projected token). Loads the key file (its rules: owned by the
// caller or root, mode 0600 or stricter); the token file is read at connect
// time. Both empty: no credentials.
Result<ClientCredentials> LoadPeerCredentials(const std::string& cluster_key_file,
                                              const std::string& token_file);

// Reads the configuration file at `path` for `daemon` ("cache node",
// "sidecar"): a missing, unreadable or non-regular file is an error naming the
// path and what to do.
Result<std::string> ReadConfigFile(const std::string& path, std::string_view daemon);

}  // namespace granary
