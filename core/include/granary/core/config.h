#pragma once

// YAML configuration into typed structs, the same way for every daemon.
//
// A component declares its fields in one Parse function over a ConfigMap:
//
//   Status ParseCacheNodeConfig(ConfigMap& m, CacheNodeConfig* c) {
//     GRANARY_RETURN_IF_ERROR(m.Required("node_id", &c->node_id));
//     GRANARY_RETURN_IF_ERROR(m.Optional("capacity", &c->capacity));     // ByteSize
//     GRANARY_RETURN_IF_ERROR(m.Section("metrics", [&](ConfigMap& s) {
//       return s.Optional("listen", &c->metrics_listen);
//     }));
//     return m.Finish();  // any key not asked for is an error
//   }
//
// Every error names the file, the line, the key path and what to write instead:
//   "cachenode.yaml:7: unknown key 'capacty' in 'cachenode' (did you mean 'capacity'?)"
// yaml-cpp throws; nothing here does: its exceptions stop at this boundary.
//
// Thread safety: a ConfigMap is used by one thread while parsing; the parse
// functions below are pure.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/status.h"

namespace YAML {
class Node;
}

namespace granary {

// A byte count written as a number with an optional unit: 1048576, "16MiB",
// "1.5 GiB", "100MB", "4k". Binary units (KiB, MiB, GiB, TiB; K, M, G, T) are
// powers of 1024, decimal units (KB, MB, GB, TB) powers of 1000.
struct ByteSize {
  uint64_t bytes = 0;
};
Result<ByteSize> ParseByteSize(std::string_view text);
// A byte count as people read it: "512 B", "1.50 GiB", "16.0 MiB".
std::string HumanBytes(uint64_t bytes);

// A duration: "250ms", "5s", "2m", "1h", or a bare number of seconds.
Result<std::chrono::milliseconds> ParseDuration(std::string_view text);

class ConfigMap {
 public:
  // Parses a whole document whose top level must be a mapping. `source_name`
  // (usually the file path) prefixes every error.
  static Result<ConfigMap> FromText(std::string_view yaml, std::string source_name);
  static Result<ConfigMap> FromFile(const std::string& path);

  ConfigMap(ConfigMap&&) noexcept;
  ConfigMap& operator=(ConfigMap&&) noexcept;
  ~ConfigMap();

  // Reads `key` into *out. Required fails if the key is absent; Optional leaves
  // *out (its default) unchanged. Supported: std::string, bool, int, int64_t,
  // uint32_t, uint64_t, double, ByteSize, std::chrono::milliseconds,
  // std::vector<std::string>.
  template <typename T>
  Status Required(std::string_view key, T* out);
  template <typename T>
  Status Optional(std::string_view key, T* out);

  // A nested mapping; `parse` must call Finish() on it (Section does if it returns OK).
  Status Section(std::string_view key, const std::function<Status(ConfigMap&)>& parse,
                 bool required = false);

  bool Has(std::string_view key) const;

  // Fails on the first key that no Required/Optional/Section asked for.
  Status Finish() const;

  // "file:line: key 'a.b'" for messages of the caller's own checks.
  std::string Where(std::string_view key) const;

 private:
  struct Rep;
  explicit ConfigMap(std::unique_ptr<Rep> rep);
  Status Read(std::string_view key, bool required,
              const std::function<Status(const YAML::Node&)>& read);
  std::unique_ptr<Rep> rep_;
};

}  // namespace granary
