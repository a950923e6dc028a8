#pragma once

// The cache-policy options of `granary dataset create` and `granary dataset
// update` (docs/cli.md, "When the pool is full"): --priority, --pin /
// --no-pin, --ttl, --min-resident, --max-resident. Given as text and checked
// here, so each bad value is refused naming its option.

#include <CLI/CLI.hpp>
#include <string>

#include "granary/core/metadata_store.h"
#include "granary/core/status.h"

namespace granary::cli {

struct CacheOptions {
  std::string priority;
  bool pin = false;
  bool no_pin = false;
  std::string ttl;
  std::string min_resident;
  std::string max_resident;

  // Adds the options to `command`.
  void Add(CLI::App& command);
  // Whether any was given.
  bool any() const;
  // `base` with the given options applied; kInvalidArgument naming the
  // option for a bad value.
  Result<DatasetCacheSpec> Apply(DatasetCacheSpec base) const;
};

// "priority 0; pinned; TTL 12h; keeps at least 40%; at most 10.0 GiB" (what
// `dataset show` prints on its cache: line).
std::string CacheText(const DatasetCacheSpec& cache);

}  // namespace granary::cli
