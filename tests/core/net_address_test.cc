// ParseNetAddress and NetAddress: the one "host:port" / "[ipv6]:port" parser
// that cache node addresses (PeerClient), the cache node's listen address and
// the metrics listen address (ObservabilityServer) share.

#include "granary/core/net_address.h"

#include <gmock/gmock.h>

#include <string>
#include <string_view>

#include "testing/test_util.h"

namespace granary {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(ParseNetAddressTest, AcceptsHostPortForms) {
  struct Case {
    std::string text;
    std::string host;
    uint16_t port;
  };
  for (const Case& c : {
           Case{"127.0.0.1:7070", "127.0.0.1", 7070},
           Case{"0.0.0.0:0", "0.0.0.0", 0},
           Case{"localhost:65535", "localhost", 65535},
           Case{"host:65535", "host", 65535},
           Case{"cache-7.example.org:9464", "cache-7.example.org", 9464},
           Case{"node-3.cluster_a:0", "node-3.cluster_a", 0},
           Case{"[::1]:80", "::1", 80},
           Case{"[::]:1", "::", 1},
           Case{"[fe80::1%eth0]:9464", "fe80::1%eth0", 9464},
           Case{"[::ffff:192.0.2.1]:7070", "::ffff:192.0.2.1", 7070},
           Case{std::string(kMaxHostNameLength, 'a') + ":1", std::string(kMaxHostNameLength, 'a'),
                1},
       }) {
    Result<NetAddress> a = ParseNetAddress(c.text);
    ASSERT_OK(a);
    EXPECT_EQ(a->host, c.host) << c.text;
    EXPECT_EQ(a->port, c.port) << c.text;
    // ToString writes what the parser reads back.
    EXPECT_EQ(a->ToString(), c.text);
    EXPECT_EQ(*a, (NetAddress{c.host, c.port})) << c.text;
  }
}

TEST(ParseNetAddressTest, ToStringBracketsIpv6Hosts) {
  EXPECT_EQ((NetAddress{"127.0.0.1", 9464}).ToString(), "127.0.0.1:9464");
  EXPECT_EQ((NetAddress{"::1", 7070}).ToString(), "[::1]:7070");
  EXPECT_NE((NetAddress{"::1", 7070}), (NetAddress{"::1", 7071}));
  EXPECT_NE((NetAddress{"::1", 7070}), (NetAddress{"::2", 7070}));
}

TEST(ParseNetAddressTest, RejectsMalformedAddressesSayingWhatIsWrong) {
  struct Case {
    std::string text;
    const char* why;
  };
  for (const Case& c : {
           // no port, no host
           Case{"", "has no port"},
           Case{"host", "has no port"},
           Case{"127.0.0.1", "has no port"},
           Case{":80", "has no host"},
           Case{":9464", "has no host"},
           // ports
           Case{"host:", "not a number"},
           Case{"host:12a", "not a number"},
           Case{"127.0.0.1:http", "not a number"},
           Case{"host:-1", "not a number"},
           Case{"127.0.0.1:+80", "not a number"},
           Case{"host:123456", "not a number"},
           Case{"127.0.0.1:0000080", "not a number"},
           Case{"host:80 ", "not a number"},
           Case{"127.0.0.1:80 ", "not a number"},
           Case{"host:65536", "above 65535"},
           Case{"nope:99999", "above 65535"},
           // IPv6
           Case{"::1:80", "IPv6 host without brackets"},
           Case{"::1:9464", "IPv6 host without brackets"},
           Case{"[::1:80", "unclosed '['"},
           Case{"[::1:9464", "unclosed '['"},
           Case{"[]:80", "empty brackets"},
           Case{"[::1]80", "no ':port' right after the bracketed host"},
           Case{"[::1]", "no ':port' right after the bracketed host"},
           Case{"[zz]:80", "not an IPv6 address"},
           Case{"[nope]:9464", "not an IPv6 address"},
           Case{"[1.2.3.4]:80", "not an IPv6 address"},
           Case{"[127.0.0.1]:9464", "not an IPv6 address"},
           Case{"[fe80::1%]:9464", "not an IPv6 address"},
           Case{"[fe80::1%eth/0]:9464", "not an IPv6 address"},
           Case{"[fe80::1%" + std::string(16, 'e') + "]:9464", "not an IPv6 address"},
           Case{"[" + std::string(1000, '1') + "]:80", "not an IPv6 address"},
           // host names
           Case{"a b:80", "neither an IP address nor a host name"},
           Case{"bad host:80", "neither an IP address nor a host name"},
           Case{"host/x:80", "neither an IP address nor a host name"},
           Case{"ho\xffst:80", "neither an IP address nor a host name"},
           Case{std::string("a\0b:80", 6), "neither an IP address nor a host name"},
           Case{"\x01\xff:80", "neither an IP address nor a host name"},
           Case{std::string(kMaxHostNameLength + 1, 'a') + ":80", "longer than 253 characters"},
           Case{std::string(300, 'a') + ":80", "longer than 253 characters"},
       }) {
    Result<NetAddress> a = ParseNetAddress(c.text);
    ASSERT_FALSE(a.ok()) << "accepted " << c.text;
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(a.status().message(), HasSubstr(c.why)) << c.text;
    // Names the text, and says what to write instead.
    EXPECT_THAT(a.status().message(), StartsWith("address '")) << c.text;
    EXPECT_THAT(a.status().message(), HasSubstr("write host:port or [ipv6]:port, e.g. 127.0.0.1:"))
        << c.text;
  }
}

TEST(ParseNetAddressTest, MessageStartsWithWhatTheAddressIs) {
  Result<NetAddress> a = ParseNetAddress("nope:99999", "listen address");
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(), StartsWith("listen address 'nope:99999' has a port above"));
  a = ParseNetAddress("::1:80", "cache node address");
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(),
              StartsWith("cache node address '::1:80' has an IPv6 host without brackets"));
}

}  // namespace
}  // namespace granary
