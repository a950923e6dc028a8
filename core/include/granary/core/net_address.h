#pragma once

// NetAddress: a TCP endpoint written "host:port" or "[ipv6]:port", and the one
// parser of that form. Every place that takes an address from a config, a flag
// or an option parses it here, so every daemon accepts and rejects the same
// texts with the same messages.
//
// Who calls it: PeerClient::Connect (cache node addresses), the cache node
// Server (its listen address), ObservabilityServer (the metrics listen
// address), and config parsers that want to reject a bad address at load time.
//
// The rules (the form only: nothing is resolved or bound here):
//  - host:port, split at the last ':'. The host is an IPv4 literal or a host
//    name: 1..253 ASCII letters, digits, '.', '-' and '_' ('_' is not valid
//    in DNS host names, but is in names that /etc/hosts and container
//    runtimes hand out, and getaddrinfo resolves them). An unbracketed host
//    with a ':' is an error: an IPv6 host must be in brackets.
//  - [ipv6]:port. The bracketed host is an IPv6 literal as inet_pton(AF_INET6)
//    reads it ("::1", "::", "fe80::1", "::ffff:1.2.3.4"), optionally with a
//    zone of 1..15 letters and digits ("fe80::1%eth0"). It is kept without the
//    brackets. Nothing but ":port" may follow the ']'.
//  - The port is 1..5 decimal digits with a value 0..65535 (no sign, no spaces).
//    Port 0 is accepted: a listener reads it as "any free port"; a client
//    rejects it itself.
// Anything else is kInvalidArgument: "<what> '<text>' <what is wrong>; write
// host:port ...".
//
// Thread safety: plain values and pure functions.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "granary/core/status.h"

namespace granary {

// The longest host name (RFC 1035); IPv6 literals are shorter.
inline constexpr size_t kMaxHostNameLength = 253;

struct NetAddress {
  std::string host;   // "127.0.0.1", "::1" (no brackets), "node-3.cluster"
  uint16_t port = 0;  // 0: any free port, for a listener

  // "127.0.0.1:7070", "[::1]:7070": what ParseNetAddress reads back.
  std::string ToString() const;

  friend bool operator==(const NetAddress&, const NetAddress&) = default;
};

// Parses `text` under the rules above. `what` names the address in the error
// ("listen address", "cache node address") and starts its message.
Result<NetAddress> ParseNetAddress(std::string_view text, std::string_view what = "address");

}  // namespace granary
