#pragma once

// Binding the observability endpoint's listen address: what a host name
// stands for, and, when cpp-httplib reports only that binding failed, why it
// failed (in use, not this host's address, needs privilege), said as what to
// do. Plain sockets and the resolver; no cpp-httplib.
//
// Who calls it: ObservabilityServer (observability.cc) only.
//
// Thread safety: pure functions over the resolver and throwaway sockets.

#include <cstdint>
#include <string>
#include <vector>

#include "granary/core/status.h"

namespace granary::observability {

// The addresses `host` stands for, IPv4 first, as numeric strings. Literals
// never touch the resolver.
Result<std::vector<std::string>> ResolveHost(const std::string& host);

// Why binding `host`:`port` fails, found by trying it again with a socket of
// our own (cpp-httplib reports only that it failed). `what` prefixes the
// message.
Status ExplainBindFailure(const std::string& what, const std::string& host, uint16_t port);

}  // namespace granary::observability
