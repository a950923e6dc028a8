#include "listen_address.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>

#include "granary/core/names.h"

namespace granary::observability {
namespace {

// What to write instead, when an address cannot be bound.
constexpr char kListenExample[] =
    "write host:port, e.g. 127.0.0.1:9464 (this host only), 0.0.0.0:9464 (all interfaces) or "
    "[::1]:9464; port 0 picks a free port";

}  // namespace

Result<std::vector<std::string>> ResolveHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    std::string why = rc == EAI_SYSTEM ? ErrnoText(errno) : ::gai_strerror(rc);
    return Status::Unavailable("cannot resolve host " + Quoted(host) + " (" + why +
                               "); use an address of this host, e.g. 127.0.0.1");
  }
  std::vector<std::string> v4;
  std::vector<std::string> v6;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    std::array<char, NI_MAXHOST> text{};
    if (::getnameinfo(ai->ai_addr, ai->ai_addrlen, text.data(), text.size(), nullptr, 0,
                      NI_NUMERICHOST) != 0) {
      continue;
    }
    std::vector<std::string>& into = ai->ai_family == AF_INET ? v4 : v6;
    if (std::find(into.begin(), into.end(), text.data()) == into.end()) {
      into.emplace_back(text.data());
    }
  }
  ::freeaddrinfo(found);
  v4.insert(v4.end(), v6.begin(), v6.end());
  if (v4.empty()) {
    return Status::Unavailable("host " + Quoted(host) +
                               " has no IPv4 or IPv6 address; use an address of this host");
  }
  return v4;
}

// Why binding `host`:`port` fails, found by trying it again with a socket of
// our own (cpp-httplib reports only that it failed). `what` prefixes the
// message.
Status ExplainBindFailure(const std::string& what, const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  if (::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found) != 0 || found == nullptr) {
    return Status::Unavailable(what + ": cannot bind " + Quoted(host) + "; " + kListenExample);
  }
  int err = 0;
  {
    const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
    } else {
      const int yes = 1;
      (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd, 1) != 0) {
        err = errno;
      }
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  const std::string where = port == 0 ? "a free port" : "port " + port_text;
  switch (err) {
    case EADDRINUSE:
      return Status::Unavailable(what + ": " + where +
                                 " is in use by another process; stop it, or choose another "
                                 "port (0 picks a free one)");
    case EADDRNOTAVAIL:
      return Status::Unavailable(what + ": address " + Quoted(host) +
                                 " is not on this host; use one of its addresses, 127.0.0.1 for "
                                 "this host only or 0.0.0.0 for all interfaces");
    case EACCES:
      return Status::PermissionDenied(what + ": binding " + where +
                                      " needs privilege (ports below 1024 need root or "
                                      "CAP_NET_BIND_SERVICE); choose a port above 1023");
    case 0:
      return Status::Unavailable(what + ": binding failed, but the address is free now; retry");
    default:
      return Status::Unavailable(what + ": bind: " + ErrnoText(err) + "; " + kListenExample);
  }
}

}  // namespace granary::observability
