#include "granary/core/net_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>

#include "granary/core/names.h"

namespace granary {
namespace {

// An interface name is at most IFNAMSIZ - 1 = 15 characters.
constexpr size_t kMaxZoneLength = 15;
// The longest IPv6 literal inet_pton reads ("ffff:...:255.255.255.255").
constexpr size_t kMaxIpv6Length = INET6_ADDRSTRLEN - 1;
constexpr size_t kMaxPortDigits = 5;

// What to write instead, for every address error.
constexpr char kExample[] =
    "write host:port or [ipv6]:port, e.g. 127.0.0.1:7070, node-3.example:7070 or [::1]:7070 "
    "(port 0, when listening: any free port)";

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAlnum(char c) { return IsDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsHostNameChar(char c) { return IsAlnum(c) || c == '.' || c == '-' || c == '_'; }

bool IsHostName(std::string_view host) {
  return !host.empty() && host.size() <= kMaxHostNameLength &&
         std::all_of(host.begin(), host.end(), IsHostNameChar);
}

bool IsIpv6Literal(std::string_view host) {
  // A zone ("fe80::1%eth0") is allowed; inet_pton does not read it.
  const std::string_view addr = host.substr(0, host.find('%'));
  if (addr.size() != host.size()) {
    const std::string_view zone = host.substr(addr.size() + 1);
    if (zone.empty() || zone.size() > kMaxZoneLength ||
        !std::all_of(zone.begin(), zone.end(), IsAlnum)) {
      return false;
    }
  }
  if (addr.empty() || addr.size() > kMaxIpv6Length) return false;
  in6_addr out{};
  return ::inet_pton(AF_INET6, std::string(addr).c_str(), &out) == 1;
}

}  // namespace

std::string NetAddress::ToString() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<NetAddress> ParseNetAddress(std::string_view text, std::string_view what) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(std::string(what) + " " + Quoted(text) + " " + std::string(why) +
                                   "; " + kExample);
  };
  NetAddress out;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("has an unclosed '['");
    const std::string_view host = text.substr(1, close - 1);
    if (host.empty()) return bad("has empty brackets where the IPv6 host goes");
    if (!IsIpv6Literal(host)) return bad("has a bracketed host that is not an IPv6 address");
    if (close + 1 >= text.size() || text[close + 1] != ':') {
      return bad("has no ':port' right after the bracketed host");
    }
    out.host = std::string(host);
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("has no port");
    const std::string_view host = text.substr(0, colon);
    if (host.find(':') != std::string_view::npos) return bad("has an IPv6 host without brackets");
    if (host.empty()) return bad("has no host");
    if (host.size() > kMaxHostNameLength) {
      return bad("has a host longer than " + std::to_string(kMaxHostNameLength) + " characters");
    }
    if (!IsHostName(host)) return bad("has a host that is neither an IP address nor a host name");
    out.host = std::string(host);
    port_text = text.substr(colon + 1);
  }
  if (port_text.empty() || port_text.size() > kMaxPortDigits ||
      !std::all_of(port_text.begin(), port_text.end(), IsDigit)) {
    return bad("has a port that is not a number from 0 to 65535");
  }
  uint32_t port = 0;
  for (char c : port_text) port = port * 10 + static_cast<uint32_t>(c - '0');
  if (port > 65535) return bad("has a port above 65535");
  out.port = static_cast<uint16_t>(port);
  return out;
}

}  // namespace granary
