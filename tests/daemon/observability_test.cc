#include "granary/daemon/observability.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "granary/core/names.h"
#include "testing/child_process.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using ::granary::testing::ChildProcess;
using ::granary::testing::TempDir;
using ::granary::testing::WaitFor;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace std::chrono_literals;

// ---- a raw HTTP/1.1 client over loopback ----

struct HttpReply {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lowercased
  std::string body;
};

// Connects to host:port with a blocking, close-on-exec TCP socket.
Result<int> Connect(uint16_t port, const std::string& host = "127.0.0.1") {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_INET;
  if (host.find(':') != std::string::npos) {
    family = AF_INET6;
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(port);
    if (::inet_pton(AF_INET6, host.c_str(), &a6->sin6_addr) != 1) {
      return Status::InvalidArgument("bad host " + host);
    }
    len = sizeof(sockaddr_in6);
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
    a4->sin_family = AF_INET;
    a4->sin_port = htons(port);
    if (::inet_pton(AF_INET, host.c_str(), &a4->sin_addr) != 1) {
      return Status::InvalidArgument("bad host " + host);
    }
    len = sizeof(sockaddr_in);
  }
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "connect to port " + std::to_string(port));
  }
  return fd;
}

Status SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "send");
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

// Reads until the peer closes, or fails after `timeout`.
Result<std::string> ReadToEof(int fd, std::chrono::milliseconds timeout = 10s) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[16384];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status::DeadlineExceeded("no end of file from the server");
    pollfd pfd{fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno(errno, "poll");
    if (r == 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ECONNRESET) return out;
    if (n < 0) return Status::FromErrno(errno, "recv");
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

Result<HttpReply> ParseReply(const std::string& raw) {
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    return Status::Corruption("no end of headers in " + std::to_string(raw.size()) + " bytes");
  }
  HttpReply reply;
  const size_t line_end = raw.find("\r\n");
  const std::string status_line = raw.substr(0, line_end);
  if (status_line.rfind("HTTP/1.1 ", 0) != 0 || status_line.size() < 12) {
    return Status::Corruption("bad status line '" + status_line + "'");
  }
  reply.status = std::atoi(status_line.substr(9, 3).c_str());
  size_t pos = line_end + 2;
  while (pos < head_end) {
    const size_t eol = raw.find("\r\n", pos);
    const std::string line = raw.substr(pos, eol - pos);
    const size_t colon = line.find(':');
    if (colon == std::string::npos) return Status::Corruption("bad header line '" + line + "'");
    std::string name = line.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    reply.headers[name] = value;
    pos = eol + 2;
  }
  reply.body = raw.substr(head_end + 4);
  return reply;
}

// Sends `request` as is on a new connection and reads the reply until the
// server closes the connection.
Result<HttpReply> SendRaw(uint16_t port, std::string_view request,
                          const std::string& host = "127.0.0.1") {
  GRANARY_ASSIGN_OR_RETURN(int fd, Connect(port, host));
  Status sent = SendAll(fd, request);
  Result<std::string> raw = sent.ok() ? ReadToEof(fd) : Result<std::string>(sent);
  ::close(fd);
  if (!raw.ok()) return raw.status();
  return ParseReply(*raw);
}

Result<HttpReply> Fetch(uint16_t port, const std::string& path, const std::string& method = "GET",
                        const std::string& host = "127.0.0.1") {
  return SendRaw(port, method + " " + path + " HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n",
                 host);
}

// ---- promtool ----

struct ToolRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

std::string FindPromtool() {
  const char* path = std::getenv("PATH");
  std::string dirs = std::string(path != nullptr ? path : "") + ":/usr/bin:/usr/local/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string candidate = dirs.substr(start, end - start) + "/promtool";
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

// Runs `promtool check metrics` with `exposition` on its standard input.
Result<ToolRun> PromtoolCheckMetrics(const std::string& exposition) {
  const std::string promtool = FindPromtool();
  if (promtool.empty()) {
    return Status::NotFound(
        "promtool is not installed (Debian package 'prometheus'); run scripts/install-deps");
  }
  TempDir dir;
  dir.WriteFile("metrics.txt", exposition);
  const std::string in_path = dir.Join("metrics.txt");
  const std::string out_path = dir.Join("out.txt");
  // Everything the child touches is prepared before fork: between fork and
  // exec it only opens, dup2s and execs (the server's threads are running).
  std::string arg0 = promtool, arg1 = "check", arg2 = "metrics";
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  GRANARY_ASSIGN_OR_RETURN(auto child, ChildProcess::Start([&](int) {
                             const int in = ::open(in_path.c_str(), O_RDONLY);
                             const int out =
                                 ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
                             if (in < 0 || out < 0) return 125;
                             ::dup2(in, 0);
                             ::dup2(out, 1);
                             ::dup2(out, 2);
                             ::execv(argv[0], argv);
                             return 127;
                           }));
  GRANARY_ASSIGN_OR_RETURN(int code, child->Wait(60s));
  ToolRun run;
  run.exit_code = code;
  Result<std::string> output = [&]() -> Result<std::string> {
    std::FILE* f = std::fopen(out_path.c_str(), "rb");
    if (f == nullptr) return Status::NotFound("no promtool output");
    std::string s;
    char buf[4096];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
    std::fclose(f);
    return s;
  }();
  if (!output.ok()) return output.status();
  run.output = *output;
  if (code == 127 || code == 125) {
    return Status::Internal("could not run " + promtool + " (exit " + std::to_string(code) + ")");
  }
  return run;
}

// ---- helpers ----

// The value of the sample line `series` ("name{labels}" or "name") in an
// exposition, if present.
std::optional<double> SampleValue(const std::string& exposition, const std::string& series) {
  size_t pos = 0;
  while ((pos = exposition.find(series + " ", pos)) != std::string::npos) {
    if (pos == 0 || exposition[pos - 1] == '\n') {
      const size_t eol = exposition.find('\n', pos);
      return std::strtod(exposition.substr(pos + series.size() + 1, eol - pos).c_str(), nullptr);
    }
    pos += series.size();
  }
  return std::nullopt;
}

size_t CountEntries(const char* dir) {
  size_t n = 0;
  DIR* d = ::opendir(dir);
  if (d == nullptr) return 0;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n;
}

std::shared_ptr<prometheus::Registry> NewRegistry() {
  return std::make_shared<prometheus::Registry>();
}

bool HaveIpv6Loopback() {
  const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// ---- the endpoints ----

class ObservabilityServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = NewRegistry();
    MetricRegistrar reg(*registry_, "test");
    Result<prometheus::Counter*> c =
        reg.AddCounter("granary_test_requests_total", "Requests answered.");
    ASSERT_OK(c);
    requests_ = *c;
    requests_->Increment(3);
    auto server = ObservabilityServer::Start("127.0.0.1:0", registry_, [this] {
      std::lock_guard<std::mutex> lock(mu_);
      return readiness_;
    });
    ASSERT_OK(server);
    server_ = std::move(*server);
  }

  void SetReadiness(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    readiness_ = std::move(s);
  }

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter* requests_ = nullptr;
  std::mutex mu_;
  Status readiness_;  // guarded by mu_
  std::unique_ptr<ObservabilityServer> server_;
};

TEST_F(ObservabilityServerTest, PortZeroPicksAFreePortThatServes) {
  EXPECT_NE(server_->port(), 0);
  EXPECT_EQ(server_->address().host, "127.0.0.1");
  EXPECT_EQ(server_->address().ToString(), "127.0.0.1:" + std::to_string(server_->port()));
}

TEST_F(ObservabilityServerTest, HealthzIsOk) {
  Result<HttpReply> r = Fetch(server_->port(), "/healthz");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "ok");
  EXPECT_THAT(r->headers["content-type"], StartsWith("text/plain"));
  // A query string does not change the endpoint.
  r = Fetch(server_->port(), "/healthz?verbose=1");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(ObservabilityServerTest, MetricsServesTheRegistryInTextFormat) {
  Result<HttpReply> r = Fetch(server_->port(), "/metrics");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_THAT(r->body, HasSubstr("# TYPE granary_test_requests_total counter\n"));
  EXPECT_THAT(r->body, HasSubstr("# HELP granary_test_requests_total Requests answered.\n"));
  EXPECT_EQ(SampleValue(r->body, "granary_test_requests_total"), 3.0);

  // Live: a later scrape sees later updates.
  requests_->Increment(4);
  r = Fetch(server_->port(), "/metrics");
  ASSERT_OK(r);
  EXPECT_EQ(SampleValue(r->body, "granary_test_requests_total"), 7.0);
}

TEST_F(ObservabilityServerTest, HeadAnswersWithoutBody) {
  for (const char* path : {"/metrics", "/healthz", "/readyz"}) {
    Result<HttpReply> get = Fetch(server_->port(), path);
    Result<HttpReply> head = Fetch(server_->port(), path, "HEAD");
    ASSERT_OK(get);
    ASSERT_OK(head);
    EXPECT_EQ(head->status, 200) << path;
    EXPECT_EQ(head->body, "") << path;
    EXPECT_EQ(head->headers["content-length"], std::to_string(get->body.size())) << path;
  }
}

TEST_F(ObservabilityServerTest, UnknownPathsAre404) {
  for (const char* path : {"/", "/metrics/", "/METRICS", "/healthz/x", "/favicon.ico",
                           "/%2e%2e/etc/passwd", "/readyz%00"}) {
    Result<HttpReply> r = Fetch(server_->port(), path);
    ASSERT_OK(r);
    EXPECT_EQ(r->status, 404) << path;
    EXPECT_THAT(r->body, HasSubstr("no endpoint '")) << path;
    EXPECT_THAT(r->body, HasSubstr("/metrics, /healthz or /readyz")) << path;
  }
}

TEST_F(ObservabilityServerTest, OtherMethodsAre405) {
  for (const char* method : {"POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"}) {
    for (const char* path : {"/metrics", "/healthz", "/nowhere"}) {
      Result<HttpReply> r = Fetch(server_->port(), path, method);
      ASSERT_OK(r);
      EXPECT_EQ(r->status, 405) << method << " " << path;
      EXPECT_EQ(r->headers["allow"], "GET, HEAD") << method;
      EXPECT_THAT(r->body, HasSubstr("method '" + std::string(method) + "' is not allowed"));
    }
  }
  // A POST with a body is refused the same way and does not disturb the server.
  Result<HttpReply> r = SendRaw(server_->port(),
                                "POST /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                                "Content-Length: 5\r\n\r\nhello");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(requests_->Value(), 3.0);
}

TEST_F(ObservabilityServerTest, ReadinessFollowsTheCheck) {
  Result<HttpReply> r = Fetch(server_->port(), "/readyz");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "ok");

  SetReadiness(Status::Unavailable("metadata store redis://10.0.0.1:6379 is unreachable"));
  r = Fetch(server_->port(), "/readyz");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->body, "metadata store redis://10.0.0.1:6379 is unreachable");
  // Liveness does not depend on readiness.
  r = Fetch(server_->port(), "/healthz");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);

  SetReadiness(Status::Ok());
  r = Fetch(server_->port(), "/readyz");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);

  // Flipping many times: each answer follows the state at the time.
  for (int i = 0; i < 20; ++i) {
    const bool ready = i % 2 == 0;
    SetReadiness(ready ? Status::Ok() : Status::FailedPrecondition("scan " + std::to_string(i)));
    r = Fetch(server_->port(), "/readyz");
    ASSERT_OK(r);
    EXPECT_EQ(r->status, ready ? 200 : 503) << i;
    EXPECT_EQ(r->body, ready ? "ok" : "scan " + std::to_string(i));
  }

  // A failure without a message still says something.
  SetReadiness(Status(StatusCode::kUnavailable, ""));
  r = Fetch(server_->port(), "/readyz");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->body, std::string(StatusCodeName(StatusCode::kUnavailable)));
}

TEST(ObservabilityServer, NullReadinessMeansReady) {
  auto server = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr);
  ASSERT_OK(server);
  Result<HttpReply> r = Fetch((*server)->port(), "/readyz");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
}

TEST(ObservabilityServer, AThrowingReadinessCheckIs500AndTheServerGoesOn) {
  std::atomic<bool> throw_now{true};
  auto server = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), [&]() -> Status {
    if (throw_now) throw std::runtime_error("state is gone");
    return Status::Ok();
  });
  ASSERT_OK(server);
  Result<HttpReply> r = Fetch((*server)->port(), "/readyz");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 500);
  EXPECT_THAT(r->body, HasSubstr("state is gone"));
  throw_now = false;
  r = Fetch((*server)->port(), "/readyz");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(ObservabilityServerTest, MalformedRequestsGetAnErrorAndTheServerGoesOn) {
  struct Case {
    std::string request;
    int status;
  };
  const std::vector<Case> cases = {
      {"garbage\r\n\r\n", 400},
      {std::string("\x00\xff\xfe\x01\r\n\r\n", 8), 400},
      {"GET\r\n\r\n", 400},
      {"GET /healthz\r\n\r\n", 400},
      {"GET /healthz HTTP/9.9\r\n\r\n", 400},
      {"FROB /healthz HTTP/1.1\r\n\r\n", 400},
      {"GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n", 414},
      {"GET /healthz HTTP/1.1\r\nX-Big: " + std::string(20000, 'b') + "\r\n\r\n", 400},
      // cpp-httplib skips a header line without a colon.
      {"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", 200},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(Quoted(c.request));
    // No "Connection: close" from the client: the server closes by itself.
    Result<HttpReply> r = SendRaw(server_->port(), c.request);
    ASSERT_OK(r);
    EXPECT_EQ(r->status, c.status);
    EXPECT_EQ(r->headers["connection"], "close");
    EXPECT_FALSE(r->body.empty());
  }
  // Half a request, then the client goes away; a connection that sends nothing.
  for (std::string_view partial : {std::string_view("GET /metr"), std::string_view("")}) {
    Result<int> fd = Connect(server_->port());
    ASSERT_OK(fd);
    (void)SendAll(*fd, partial);
    ::close(*fd);
  }
  Result<HttpReply> r = Fetch(server_->port(), "/healthz");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(ObservabilityServerTest, OneRequestPerConnection) {
  // Two requests in one write: the first is answered with "Connection: close"
  // and the connection ends; the second is not read as a request.
  Result<HttpReply> r = SendRaw(server_->port(),
                                "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
                                "GET /readyz HTTP/1.1\r\nHost: t\r\n\r\n");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["connection"], "close");
  EXPECT_EQ(r->body, "ok");  // one reply only
}

// ---- promtool ----

// What a component's declaration looks like (docs/observability.md).
struct ExampleMetrics {
  prometheus::Counter* source_opens = nullptr;
  MetricFamily<prometheus::Counter> staged_bytes;
  prometheus::Gauge* capacity_used = nullptr;
  MetricFamily<prometheus::Gauge> queue_depth;
  prometheus::Histogram* request_latency = nullptr;
  MetricFamily<prometheus::Histogram> read_size;

  static Result<ExampleMetrics> Declare(prometheus::Registry& registry) {
    MetricRegistrar reg(registry, "cachenode");
    ExampleMetrics m;
    GRANARY_ASSIGN_OR_RETURN(m.source_opens, reg.AddCounter("granary_cachenode_source_opens_total",
                                                            "Files opened on the source."));
    GRANARY_ASSIGN_OR_RETURN(m.staged_bytes,
                             reg.AddCounterFamily("granary_cachenode_staged_bytes_total",
                                                  "Bytes staged from the source.", {"dataset"}));
    GRANARY_ASSIGN_OR_RETURN(m.capacity_used, reg.AddGauge("granary_cachenode_capacity_used_bytes",
                                                           "Bytes of chunk files on local NVMe."));
    GRANARY_ASSIGN_OR_RETURN(
        m.queue_depth, reg.AddGaugeFamily("granary_cachenode_staging_queue_depth",
                                          "Chunks waiting to be staged.", {"dataset", "priority"}));
    GRANARY_ASSIGN_OR_RETURN(
        m.request_latency,
        reg.AddHistogram("granary_cachenode_request_duration_seconds",
                         "Time from request to last reply byte.", LatencyBucketsSeconds()));
    GRANARY_ASSIGN_OR_RETURN(auto sizes, ExponentialBuckets(1024, 4, 10));
    GRANARY_ASSIGN_OR_RETURN(m.read_size,
                             reg.AddHistogramFamily("granary_cachenode_read_size_bytes",
                                                    "Bytes per read request.", {"dataset"}, sizes));
    return m;
  }
};

TEST(ObservabilityPromtool, MetricsPassPromtoolCheck) {
  auto registry = NewRegistry();
  Result<ExampleMetrics> m = ExampleMetrics::Declare(*registry);
  ASSERT_OK(m);
  m->source_opens->Increment(12);
  for (const char* dataset : {"imagenet", "laion-5b"}) {
    Result<prometheus::Counter*> staged = m->staged_bytes.WithLabels({dataset});
    ASSERT_OK(staged);
    (*staged)->Increment(1 << 20);
    Result<prometheus::Gauge*> depth = m->queue_depth.WithLabels({dataset, "on_demand"});
    ASSERT_OK(depth);
    (*depth)->Set(3);
    Result<prometheus::Histogram*> size = m->read_size.WithLabels({dataset});
    ASSERT_OK(size);
    (*size)->Observe(110 * 1024);
  }
  m->capacity_used->Set(5e9);
  for (double s : {0.00005, 0.0007, 0.02, 3.0, 60.0}) m->request_latency->Observe(s);

  auto server = ObservabilityServer::Start("127.0.0.1:0", registry, nullptr);
  ASSERT_OK(server);
  Result<HttpReply> r = Fetch((*server)->port(), "/metrics");
  ASSERT_OK(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(SampleValue(r->body, "granary_cachenode_staged_bytes_total{dataset=\"imagenet\"}"),
            1048576.0);
  EXPECT_EQ(SampleValue(r->body, "granary_cachenode_request_duration_seconds_count"), 5.0);
  EXPECT_EQ(SampleValue(r->body, "granary_cachenode_request_duration_seconds_bucket{le=\"+Inf\"}"),
            5.0);

  Result<ToolRun> run = PromtoolCheckMetrics(r->body);
  ASSERT_OK(run);
  EXPECT_EQ(run->exit_code, 0) << run->output << "\n--- exposition:\n" << r->body;
  EXPECT_EQ(run->output, "");
}

TEST(ObservabilityPromtool, PromtoolFlagsABadNameSoTheCheckIsReal) {
  // Straight through prometheus-cpp, which accepts the name; MetricRegistrar
  // would not (below).
  auto registry = NewRegistry();
  prometheus::BuildCounter()
      .Name("granary_test_requests")
      .Help("Requests, named without _total.")
      .Register(*registry)
      .Add({})
      .Increment();
  auto server = ObservabilityServer::Start("127.0.0.1:0", registry, nullptr);
  ASSERT_OK(server);
  Result<HttpReply> r = Fetch((*server)->port(), "/metrics");
  ASSERT_OK(r);
  Result<ToolRun> run = PromtoolCheckMetrics(r->body);
  ASSERT_OK(run);
  EXPECT_NE(run->exit_code, 0) << run->output;
  EXPECT_THAT(run->output, HasSubstr("granary_test_requests"));
  EXPECT_THAT(run->output, HasSubstr("_total"));

  MetricRegistrar reg(*NewRegistry(), "test");
  Result<prometheus::Counter*> refused = reg.AddCounter("granary_test_requests", "Requests.");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("does not end in _total"));
}

// ---- concurrency ----

TEST(ObservabilityConcurrency, ScrapesWhileOtherThreadsUpdate) {
  auto registry = NewRegistry();
  MetricRegistrar reg(*registry, "test");
  Result<prometheus::Counter*> counter = reg.AddCounter("granary_test_events_total", "Events.");
  ASSERT_OK(counter);
  Result<prometheus::Histogram*> hist = reg.AddHistogram("granary_test_event_duration_seconds",
                                                         "Event latency.", LatencyBucketsSeconds());
  ASSERT_OK(hist);
  Result<MetricFamily<prometheus::Counter>> by_dataset =
      reg.AddCounterFamily("granary_test_dataset_events_total", "Events by dataset.", {"dataset"});
  ASSERT_OK(by_dataset);

  ObservabilityOptions options;
  options.worker_threads = 3;
  auto server = ObservabilityServer::Start("127.0.0.1:0", registry, nullptr, options);
  ASSERT_OK(server);
  const uint16_t port = (*server)->port();

  // Writers update until every scraper has scraped kScrapesEach times (so
  // every scrape overlaps updates), at least kMinPerWriter times each, and at
  // most kMaxPerWriter (the bound if scrapes stall).
  constexpr int kWriters = 4;
  constexpr int kScrapers = 3;
  constexpr int kScrapesEach = 15;
  constexpr int64_t kMinPerWriter = 1000;
  constexpr int64_t kMaxPerWriter = 20'000'000;
  std::atomic<int> scrapers_done{0};
  std::vector<int64_t> updates(kWriters, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      // New label values appear while scrapes run, too.
      Result<prometheus::Counter*> mine = by_dataset->WithLabels({"ds-" + std::to_string(w)});
      int64_t i = 0;
      for (; i < kMaxPerWriter && (i < kMinPerWriter || scrapers_done < kScrapers); ++i) {
        (*counter)->Increment();
        (*hist)->Observe(0.001 * static_cast<double>(i % 100));
        if (mine.ok()) (*mine)->Increment();
      }
      updates[static_cast<size_t>(w)] = i;
    });
  }
  std::atomic<int> failures{0};
  std::vector<std::string> last_bodies(kScrapers);
  for (int s = 0; s < kScrapers; ++s) {
    threads.emplace_back([&, s] {
      double last = -1;
      for (int i = 0; i < kScrapesEach; ++i) {
        Result<HttpReply> r = Fetch(port, "/metrics");
        if (!r.ok() || r->status != 200) {
          ++failures;
          continue;
        }
        // Counters never go back, whatever else is updating.
        std::optional<double> v = SampleValue(r->body, "granary_test_events_total");
        if (!v || *v < last) ++failures;
        if (v) last = *v;
        last_bodies[static_cast<size_t>(s)] = r->body;
      }
      ++scrapers_done;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures, 0);

  int64_t total = 0;
  for (int64_t n : updates) total += n;
  ASSERT_LT(total, kWriters * kMaxPerWriter) << "the scrapes did not finish";
  Result<HttpReply> r = Fetch(port, "/metrics");
  ASSERT_OK(r);
  EXPECT_EQ(SampleValue(r->body, "granary_test_events_total"), static_cast<double>(total));
  EXPECT_EQ(SampleValue(r->body, "granary_test_event_duration_seconds_count"),
            static_cast<double>(total));
  for (int w = 0; w < kWriters; ++w) {
    EXPECT_EQ(SampleValue(r->body, "granary_test_dataset_events_total{dataset=\"ds-" +
                                       std::to_string(w) + "\"}"),
              static_cast<double>(updates[static_cast<size_t>(w)]));
  }
  // Scrapes taken while the values changed are still valid expositions.
  for (const std::string& body : last_bodies) {
    ASSERT_FALSE(body.empty());
    Result<ToolRun> run = PromtoolCheckMetrics(body);
    ASSERT_OK(run);
    EXPECT_EQ(run->exit_code, 0) << run->output;
  }
}

TEST(ObservabilityConcurrency, AFullQueueMakesClientsWaitNotFail) {
  // One worker, one queue slot, and silent connections: they wait with the
  // reader (never holding the worker) until the idle timeout, and a real
  // request is answered meanwhile.
  ObservabilityOptions options;
  options.worker_threads = 1;
  options.max_queued_connections = 1;
  options.idle_timeout = 1s;
  auto server = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr, options);
  ASSERT_OK(server);
  std::vector<int> idle;
  for (int i = 0; i < 2; ++i) {
    Result<int> fd = Connect((*server)->port());
    ASSERT_OK(fd);
    idle.push_back(*fd);
  }
  Result<HttpReply> r = Fetch((*server)->port(), "/healthz");
  for (int fd : idle) ::close(fd);
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
}

// Idle and greedy clients: half-sent requests held the two workers for io_timeout
// each while the others waited in the queue, so /healthz of a daemon took
// about 160 s to answer behind 66 of them (a kubelet restarts the pod).
// Requests are now read by one thread for every connection at once.

// Opens `n` connections that each send the start of a request and stop.
std::vector<int> HalfSentRequests(uint16_t port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    Result<int> fd = Connect(port);
    EXPECT_OK(fd);
    if (!fd.ok()) break;
    EXPECT_OK(SendAll(*fd, "GET /metrics HTTP/1.1\r\nHost: attacker\r\n"));
    fds.push_back(*fd);
  }
  return fds;
}

// GET `path`, failing unless the whole reply arrives within `within`.
Result<HttpReply> FetchWithin(uint16_t port, const std::string& path,
                              std::chrono::milliseconds within) {
  GRANARY_ASSIGN_OR_RETURN(int fd, Connect(port));
  Status sent = SendAll(fd, "GET " + path + " HTTP/1.1\r\nHost: kubelet\r\n\r\n");
  Result<std::string> raw = sent.ok() ? ReadToEof(fd, within) : Result<std::string>(sent);
  ::close(fd);
  if (!raw.ok()) return raw.status();
  return ParseReply(*raw);
}

TEST(ObservabilitySlowClients, HealthzAnswersWhileHalfSentRequestsAreOpen) {
  auto server = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr);
  ASSERT_OK(server);
  const uint16_t port = (*server)->port();
  std::vector<int> held = HalfSentRequests(port, 100);
  ASSERT_EQ(held.size(), 100u);
  for (const char* path : {"/healthz", "/readyz", "/metrics"}) {
    SCOPED_TRACE(path);
    // Within a second, while all 100 are still open (they are dropped only
    // after io_timeout, 5 s).
    Result<HttpReply> r = FetchWithin(port, path, 1s);
    ASSERT_OK(r);
    EXPECT_EQ(r->status, 200);
  }
  for (int fd : held) ::close(fd);
}

TEST(ObservabilitySlowClients, AHalfSentRequestIsAnswered408AfterIoTimeout) {
  ObservabilityOptions options;
  options.io_timeout = 1s;
  options.idle_timeout = 1s;
  auto server = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr, options);
  ASSERT_OK(server);
  std::vector<int> held = HalfSentRequests((*server)->port(), 1);
  ASSERT_EQ(held.size(), 1u);
  Result<int> silent = Connect((*server)->port());
  ASSERT_OK(silent);
  // Both are let go after about a second, with a reason.
  for (int fd : {held[0], *silent}) {
    Result<std::string> raw = ReadToEof(fd, 5s);
    ::close(fd);
    ASSERT_OK(raw);
    Result<HttpReply> r = ParseReply(*raw);
    ASSERT_OK(r);
    EXPECT_EQ(r->status, 408);
    EXPECT_THAT(r->body, HasSubstr("did not arrive in time"));
  }
}

TEST(ObservabilitySlowClients, MoreHalfSentRequestsThanPlacesCloseTheOldest) {
  ObservabilityOptions options;
  options.max_reading_connections = 8;
  options.worker_threads = 1;
  auto server = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr, options);
  ASSERT_OK(server);
  const uint16_t port = (*server)->port();
  std::vector<int> held = HalfSentRequests(port, 20);
  ASSERT_EQ(held.size(), 20u);
  Result<HttpReply> r = FetchWithin(port, "/healthz", 1s);
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
  // The oldest were closed to make room (end of stream, no reply), long
  // before io_timeout.
  Result<std::string> first = ReadToEof(held[0], 2s);
  ASSERT_OK(first);
  EXPECT_EQ(*first, "");
  for (int fd : held) ::close(fd);
}

// ---- bind errors ----

TEST(ObservabilityBind, PortInUseIsAClearError) {
  auto first = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr);
  ASSERT_OK(first);
  const std::string addr = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = ObservabilityServer::Start(addr, NewRegistry(), nullptr);
  ASSERT_FALSE(second.ok()) << "two servers bound " << addr;
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("'" + addr + "'"));
  EXPECT_THAT(second.status().message(), HasSubstr("is in use by another process"));
  EXPECT_THAT(second.status().message(), HasSubstr("choose another port"));
  // The first one is untouched.
  Result<HttpReply> r = Fetch((*first)->port(), "/healthz");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
}

TEST(ObservabilityBind, PortHeldByAnotherSocketIsAClearError) {
  Result<int> held = []() -> Result<int> {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 1) != 0) {
      ::close(fd);
      return Status::FromErrno(errno, "bind");
    }
    return fd;
  }();
  ASSERT_OK(held);
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(*held, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string addr = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  auto server = ObservabilityServer::Start(addr, NewRegistry(), nullptr);
  ::close(*held);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(server.status().message(), HasSubstr("is in use"));
}

TEST(ObservabilityBind, BadAddressesAreClearErrors) {
  auto bad = ObservabilityServer::Start("nope:99999", NewRegistry(), nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("'nope:99999'"));
  EXPECT_THAT(bad.status().message(),
              HasSubstr("listen address 'nope:99999' has a port above 65535"));
  EXPECT_THAT(bad.status().message(), HasSubstr("write host:port"));

  // TEST-NET-1 (RFC 5737) is on no host.
  bad = ObservabilityServer::Start("192.0.2.1:0", NewRegistry(), nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(bad.status().message(), HasSubstr("'192.0.2.1:0'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("is not on this host"));

  // .invalid never resolves (RFC 6761).
  bad = ObservabilityServer::Start("no-such-host.invalid:0", NewRegistry(), nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(bad.status().message(), HasSubstr("cannot resolve host 'no-such-host.invalid'"));

  bad = ObservabilityServer::Start("0.0.0.0", NewRegistry(), nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("has no port"));
}

TEST(ObservabilityBind, BadArgumentsAreClearErrors) {
  auto bad = ObservabilityServer::Start("127.0.0.1:0", nullptr, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("no metrics registry"));

  ObservabilityOptions o;
  o.worker_threads = 0;
  bad = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("worker_threads 0 is outside 1..64"));
  o = {};
  o.max_queued_connections = 0;
  bad = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("max_queued_connections 0"));
  o = {};
  o.io_timeout = 0s;
  bad = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("io_timeout 0 s"));
  o = {};
  o.idle_timeout = -1s;
  bad = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("idle_timeout -1 s"));
}

TEST(ObservabilityBind, ListensOnlyWhereTold) {
  auto server = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr);
  ASSERT_OK(server);
  // Another loopback address of this host reaches 127.0.0.1's port only if the
  // server listened on every interface.
  Result<int> fd = Connect((*server)->port(), "127.0.0.2");
  if (fd.ok()) ::close(*fd);
  EXPECT_FALSE(fd.ok()) << "the server answered on 127.0.0.2";
  Result<HttpReply> r = Fetch((*server)->port(), "/healthz");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
}

TEST(ObservabilityBind, LocalhostIsBoundAtItsIpv4Address) {
  auto server = ObservabilityServer::Start("localhost:0", NewRegistry(), nullptr);
  ASSERT_OK(server);
  EXPECT_EQ((*server)->address().host, "127.0.0.1");
  Result<HttpReply> r = Fetch((*server)->port(), "/healthz");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
}

TEST(ObservabilityBind, Ipv6Loopback) {
  if (!HaveIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback on this host";
  auto server = ObservabilityServer::Start("[::1]:0", NewRegistry(), nullptr);
  ASSERT_OK(server);
  EXPECT_EQ((*server)->address().ToString(), "[::1]:" + std::to_string((*server)->port()));
  Result<HttpReply> r = Fetch((*server)->port(), "/healthz", "GET", "::1");
  ASSERT_OK(r);
  EXPECT_EQ(r->status, 200);
}

// ---- lifecycle ----

TEST(ObservabilityLifecycle, StartStopManyTimesLeaksNoThreadsOrFds) {
  // One cycle first, so that lazily created process-wide state (loggers,
  // resolver files) is not counted as a leak.
  {
    auto warm = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr);
    ASSERT_OK(warm);
    ASSERT_OK(Fetch((*warm)->port(), "/healthz"));
  }
  const size_t threads_before = CountEntries("/proc/self/task");
  const size_t fds_before = CountEntries("/proc/self/fd");
  ObservabilityOptions options;
  options.worker_threads = 3;
  for (int i = 0; i < 30; ++i) {
    auto server = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr, options);
    ASSERT_OK(server);
    Result<HttpReply> r = Fetch((*server)->port(), i % 2 == 0 ? "/metrics" : "/readyz");
    ASSERT_OK(r);
    EXPECT_EQ(r->status, 200);
    if (i % 3 == 0) {
      (*server)->Stop();
      (*server)->Stop();  // idempotent; the destructor makes it three
    }
  }
  EXPECT_EQ(CountEntries("/proc/self/task"), threads_before);
  EXPECT_EQ(CountEntries("/proc/self/fd"), fds_before);
}

TEST(ObservabilityLifecycle, StopClosesThePortAndIdleConnections) {
  ObservabilityOptions options;
  options.idle_timeout = 1s;
  auto server = ObservabilityServer::Start("127.0.0.1:0", NewRegistry(), nullptr, options);
  ASSERT_OK(server);
  const uint16_t port = (*server)->port();
  Result<int> idle = Connect(port);
  ASSERT_OK(idle);
  (*server)->Stop();
  // The idle client is let go (end of file), and nobody listens any more.
  Result<std::string> rest = ReadToEof(*idle);
  ::close(*idle);
  ASSERT_OK(rest);
  EXPECT_EQ(*rest, "");
  Result<int> again = Connect(port);
  if (again.ok()) ::close(*again);
  EXPECT_FALSE(again.ok());
  // The port is free for the next server (a restarted daemon).
  auto next =
      ObservabilityServer::Start("127.0.0.1:" + std::to_string(port), NewRegistry(), nullptr);
  ASSERT_OK(next);
  EXPECT_EQ((*next)->port(), port);
}

// ---- naming rules ----

TEST(MetricNames, AcceptsDesignNames) {
  EXPECT_OK(
      CheckMetricName("granary_cachenode_staged_bytes_total", "cachenode", MetricKind::kCounter));
  EXPECT_OK(CheckMetricName("granary_cachenode_checksum_failures_total", "cachenode",
                            MetricKind::kCounter));
  EXPECT_OK(CheckMetricName("granary_sidecar_capacity_used_bytes", "sidecar", MetricKind::kGauge));
  EXPECT_OK(
      CheckMetricName("granary_cachenode_staging_queue_depth", "cachenode", MetricKind::kGauge));
  EXPECT_OK(CheckMetricName("granary_cachenode_request_duration_seconds", "cachenode",
                            MetricKind::kHistogram));
  EXPECT_OK(CheckMetricName("granary_store2_hit_ratio", "store2", MetricKind::kGauge));
}

TEST(MetricNames, RejectsWhatBreaksTheRules) {
  struct Case {
    std::string name;
    MetricKind kind;
    const char* why;
  };
  const std::vector<Case> cases = {
      {"cachenode_staged_bytes_total", MetricKind::kCounter,
       "does not start with 'granary_cachenode_'"},
      {"granary_sidecar_staged_bytes_total", MetricKind::kCounter, "does not start with"},
      {"granary_cachenode_", MetricKind::kGauge, "names nothing after"},
      {"granary_cachenode_Staged_bytes_total", MetricKind::kCounter, "snake_case"},
      {"granary_cachenode_staged-bytes_total", MetricKind::kCounter, "snake_case"},
      {"granary_cachenode_staged__bytes_total", MetricKind::kCounter, "empty word"},
      {"granary_cachenode_staged_bytes_", MetricKind::kGauge, "empty word"},
      {"granary_cachenode__x", MetricKind::kGauge, "starts with '_' or a digit"},
      {"granary_cachenode_9lives", MetricKind::kGauge, "starts with '_' or a digit"},
      {"granary_cachenode_staged_bytes", MetricKind::kCounter, "does not end in _total"},
      {"granary_cachenode_total", MetricKind::kCounter, "nothing before _total"},
      {"granary_cachenode_used_bytes_total", MetricKind::kGauge, "only counters"},
      {"granary_cachenode_latency_seconds_total", MetricKind::kHistogram, "only counters"},
      {"granary_cachenode_request_ms", MetricKind::kHistogram, "use _seconds"},
      {"granary_cachenode_request_milliseconds", MetricKind::kGauge, "use _seconds"},
      {"granary_cachenode_uptime_minutes", MetricKind::kGauge, "use _seconds"},
      {"granary_cachenode_staged_mib_total", MetricKind::kCounter, "use _bytes"},
      {"granary_cachenode_capacity_used_percent", MetricKind::kGauge, "use _ratio"},
      {"granary_cachenode_chunks_count", MetricKind::kGauge, "ends in _count"},
      {"granary_cachenode_latency_sum", MetricKind::kGauge, "ends in _sum"},
      {"granary_cachenode_latency_bucket", MetricKind::kHistogram, "ends in _bucket"},
      {std::string("granary_cachenode_a\0b", 21), MetricKind::kGauge, "snake_case"},
  };
  for (const Case& c : cases) {
    Status s = CheckMetricName(c.name, "cachenode", c.kind);
    ASSERT_FALSE(s.ok()) << c.name;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(c.why)) << c.name;
    EXPECT_THAT(s.message(), HasSubstr("granary_<component>_<what>_<unit>"));
  }
  for (const char* component : {"", "Cachenode", "cache_node", "9node", "cache-node"}) {
    Status s = CheckMetricName("granary_x_y", component, MetricKind::kGauge);
    ASSERT_FALSE(s.ok()) << component;
    EXPECT_THAT(s.message(), HasSubstr("is not [a-z][a-z0-9]*"));
  }
}

TEST(MetricNames, LabelRules) {
  EXPECT_OK(CheckLabelNames({}));
  EXPECT_OK(CheckLabelNames({"dataset"}));
  EXPECT_OK(CheckLabelNames({"dataset", "op", "status", "tier"}));
  struct Case {
    std::vector<std::string> labels;
    const char* why;
  };
  for (const Case& c : std::vector<Case>{
           {{"dataset", "op", "status", "tier", "node"}, "at most 4"},
           {{"Dataset"}, "not snake_case"},
           {{"__name__"}, "not snake_case"},
           {{""}, "not snake_case"},
           {{"data-set"}, "not snake_case"},
           {{"le"}, "reserved"},
           {{"quantile"}, "reserved"},
           {{"sample_id"}, "one time series per value"},
           {{"dataset", "path"}, "one time series per value"},
           {{"pod"}, "one time series per value"},
           {{"pod_name"}, "one time series per value"},
           {{"dataset", "dataset"}, "given twice"},
       }) {
    Status s = CheckLabelNames(c.labels);
    ASSERT_FALSE(s.ok()) << ::testing::PrintToString(c.labels);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(c.why)) << ::testing::PrintToString(c.labels);
  }
}

TEST(MetricRegistrar, DeclaresAndRefuses) {
  prometheus::Registry registry;
  MetricRegistrar reg(registry, "test");
  Result<prometheus::Counter*> a = reg.AddCounter("granary_test_x_total", "X.");
  ASSERT_OK(a);
  // Declaring the same name and type again gives the same metric.
  Result<prometheus::Counter*> again = reg.AddCounter("granary_test_x_total", "X.");
  ASSERT_OK(again);
  EXPECT_EQ(*a, *again);

  // A name cannot change type: prometheus-cpp's exception becomes a Status.
  // (A gauge name cannot end in _total, so collide on a gauge name.)
  ASSERT_OK(reg.AddGauge("granary_test_depth", "Depth."));
  Result<prometheus::Histogram*> clash =
      reg.AddHistogram("granary_test_depth", "Depth.", LatencyBucketsSeconds());
  ASSERT_FALSE(clash.ok());
  EXPECT_EQ(clash.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(clash.status().message(), HasSubstr("'granary_test_depth'"));
  EXPECT_THAT(clash.status().message(), HasSubstr("rename one of them"));

  Result<prometheus::Gauge*> no_help = reg.AddGauge("granary_test_free_bytes", "");
  ASSERT_FALSE(no_help.ok());
  EXPECT_THAT(no_help.status().message(), HasSubstr("no help text"));

  Result<MetricFamily<prometheus::Counter>> bad_labels =
      reg.AddCounterFamily("granary_test_reads_total", "Reads.", {"path"});
  ASSERT_FALSE(bad_labels.ok());
  EXPECT_THAT(bad_labels.status().message(), HasSubstr("'granary_test_reads_total'"));

  Result<prometheus::Histogram*> bad_buckets =
      reg.AddHistogram("granary_test_wait_seconds", "Wait.", {1.0, 0.5});
  ASSERT_FALSE(bad_buckets.ok());
  EXPECT_THAT(bad_buckets.status().message(), HasSubstr("not strictly increasing"));

  MetricRegistrar wrong(registry, "Bad");
  EXPECT_FALSE(wrong.AddCounter("granary_Bad_x_total", "X.").ok());

  // Nothing refused ended up in the registry.
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    EXPECT_TRUE(f.name == "granary_test_x_total" || f.name == "granary_test_depth") << f.name;
  }
}

TEST(MetricRegistrar, FamiliesCheckLabelValues) {
  prometheus::Registry registry;
  MetricRegistrar reg(registry, "test");
  Result<MetricFamily<prometheus::Histogram>> f =
      reg.AddHistogramFamily("granary_test_op_duration_seconds", "Op latency.", {"dataset", "op"},
                             LatencyBucketsSeconds());
  ASSERT_OK(f);
  EXPECT_EQ(f->label_names(), (std::vector<std::string>{"dataset", "op"}));
  Result<prometheus::Histogram*> h = f->WithLabels({"imagenet", "read"});
  ASSERT_OK(h);
  (*h)->Observe(0.003);
  // Same values, same metric.
  Result<prometheus::Histogram*> h2 = f->WithLabels({"imagenet", "read"});
  ASSERT_OK(h2);
  EXPECT_EQ(*h, *h2);

  Result<prometheus::Histogram*> wrong = f->WithLabels({"imagenet"});
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("1 label values for 2 labels"));
  wrong = f->WithLabels({"imagenet", ""});
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("of label 'op' must be 1..128 bytes"));
  wrong = f->WithLabels({std::string(129, 'x'), "read"});
  ASSERT_FALSE(wrong.ok());

  MetricFamily<prometheus::Counter> undeclared;
  Result<prometheus::Counter*> c = undeclared.WithLabels({});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);

  // The histogram's buckets are the declared ones.
  bool found = false;
  for (const prometheus::MetricFamily& fam : registry.Collect()) {
    if (fam.name != "granary_test_op_duration_seconds") continue;
    ASSERT_EQ(fam.metric.size(), 1u);
    EXPECT_EQ(fam.metric[0].histogram.bucket.size(), LatencyBucketsSeconds().size() + 1);
    EXPECT_EQ(fam.metric[0].histogram.sample_count, 1u);
    found = true;
  }
  EXPECT_TRUE(found);
}

// ---- buckets ----

TEST(Buckets, LatencyBucketsSpan100MicrosecondsTo10Seconds) {
  const auto b = LatencyBucketsSeconds();
  EXPECT_OK(CheckBuckets(b));
  EXPECT_EQ(b.front(), 0.0001);
  EXPECT_EQ(b.back(), 10.0);
  EXPECT_EQ(b.size(), 16u);
}

TEST(Buckets, Exponential) {
  Result<prometheus::Histogram::BucketBoundaries> b = ExponentialBuckets(1024, 4, 4);
  ASSERT_OK(b);
  EXPECT_EQ(*b, (prometheus::Histogram::BucketBoundaries{1024, 4096, 16384, 65536}));
  EXPECT_OK(CheckBuckets(*b));
  EXPECT_OK(ExponentialBuckets(1e-6, 1.5, 64));

  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (auto [start, factor, count] :
       {std::tuple{0.0, 2.0, size_t{4}}, std::tuple{-1.0, 2.0, size_t{4}},
        std::tuple{kNan, 2.0, size_t{4}}, std::tuple{1.0, 1.0, size_t{4}},
        std::tuple{1.0, kInf, size_t{4}}, std::tuple{1.0, 2.0, size_t{0}},
        std::tuple{1.0, 2.0, size_t{65}}, std::tuple{1e300, 1e10, size_t{10}}}) {
    Result<prometheus::Histogram::BucketBoundaries> bad = ExponentialBuckets(start, factor, count);
    ASSERT_FALSE(bad.ok()) << start << " " << factor << " " << count;
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.status().message(), HasSubstr("exponential buckets"));
  }
}

TEST(Buckets, CheckRefusesWhatAHistogramCannotUse) {
  EXPECT_THAT(CheckBuckets({}).message(), HasSubstr("no bucket bounds"));
  EXPECT_THAT(CheckBuckets({1, 1}).message(), HasSubstr("not strictly increasing"));
  EXPECT_THAT(CheckBuckets({2, 1}).message(), HasSubstr("not strictly increasing"));
  EXPECT_THAT(CheckBuckets({1, std::numeric_limits<double>::infinity()}).message(),
              HasSubstr("not finite"));
  EXPECT_THAT(CheckBuckets({std::numeric_limits<double>::quiet_NaN()}).message(),
              HasSubstr("not finite"));
  EXPECT_OK(CheckBuckets({-1, 0, 1}));
}

}  // namespace
}  // namespace granary
