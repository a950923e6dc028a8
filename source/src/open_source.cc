// OpenSource (source.h): the one place a source URI's scheme picks its
// driver. A new driver (S3, HTTP) is one more branch here.

#include <string>
#include <utility>

#include "granary/core/names.h"
#include "granary/source/posix_source.h"
#include "granary/source/source.h"

namespace granary {

std::string_view AcceptedSourceUris() { return "file:///absolute/path"; }

Result<std::unique_ptr<Source>> OpenSource(std::string_view uri, SourceOptions options) {
  const size_t colon = uri.find("://");
  const std::string_view scheme = colon == std::string_view::npos ? "" : uri.substr(0, colon);
  if (scheme.empty()) {
    return Status::InvalidArgument(
        "source URI " + Quoted(uri) +
        " has no scheme (scheme://...); accepted: " + std::string(AcceptedSourceUris()));
  }
  if (scheme != "file") {
    return Status::InvalidArgument("source URI " + Quoted(uri) + ": no driver reads scheme " +
                                   Quoted(scheme) +
                                   "; accepted: " + std::string(AcceptedSourceUris()));
  }
  GRANARY_ASSIGN_OR_RETURN(std::string root, PosixSource::RootFromUri(uri));
  PosixSourceOptions posix;
  posix.root = std::move(root);
  posix.uri = std::string(uri);
  posix.dataset = std::move(options.dataset);
  posix.owner = std::move(options.owner);
  posix.executor = options.executor;
  posix.max_in_flight = options.max_in_flight;
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<PosixSource> source,
                           PosixSource::Open(std::move(posix)));
  return std::unique_ptr<Source>(std::move(source));
}

}  // namespace granary
