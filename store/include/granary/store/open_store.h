#pragma once

// Opening a metadata store by URL: the one place that knows the backends
// (Redis through hiredis, SQLite). Part of granary::store, which only the
// daemons, the CLI and the operator link; libraries that take a
// MetadataStore& (the client, the POSIX view, the Python module) do not.
//
// Thread safety: OpenMetadataStore may be called from any thread; the store it
// returns is as documented in granary/core/metadata_store.h.

#include <memory>
#include <string_view>

#include "granary/core/metadata_store.h"
#include "granary/core/status.h"

namespace granary {

// Opens the store named by `url`. Query parameters in the URL override the
// matching options. Errors:
//   kInvalidArgument  a malformed URL (the message lists the accepted forms);
//   kUnavailable      Redis: the server cannot be reached now. Redis is tried
//                     once, without retries: callers that must wait loop
//                     themselves. SQLite: the file stayed locked by other
//                     processes for retry_ms (SQLite open does wait and retry
//                     within retry_ms, e.g. while another process creates the
//                     schema);
//   kPermissionDenied a wrong Redis password;
//   kCorruption       a file that is not a SQLite database, or damaged;
//   kFailedPrecondition a SQLite database that is not a Granary store (other
//                     tables, no Granary mark): it is left untouched;
//   kVersionMismatch  a Granary store of another schema version;
//   kNotFound         the SQLite file's directory does not exist.
Result<std::unique_ptr<MetadataStore>> OpenMetadataStore(std::string_view url,
                                                         const MetadataStoreOptions& options = {});

// As OpenMetadataStore, for callers that only read (`granary dataset show`,
// `node list`, `slurm validate`, ...): a SQLite store whose file does not
// exist is kNotFound saying so, and nothing is created, neither the file nor
// its directory. A Redis URL opens as above.
Result<std::unique_ptr<MetadataStore>> OpenExistingMetadataStore(
    std::string_view url, const MetadataStoreOptions& options = {});

}  // namespace granary
