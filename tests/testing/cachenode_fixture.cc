#include "testing/cachenode_fixture.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include "granary/config/cachenode_config.h"
#include "granary/core/file.h"
#include "granary/core/manifest_builder.h"
#include "granary/core/names.h"
#include "granary/core/net_address.h"
#include "granary/store/open_store.h"

namespace granary::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using namespace std::chrono_literals;

int RemainingMs(steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// A connected TCP socket to host:port (IPv4 literal), within the deadline.
Result<ScopedFd> ConnectTcp(const std::string& address, steady_clock::time_point deadline) {
  GRANARY_ASSIGN_OR_RETURN(NetAddress parsed, ParseNetAddress(address));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(parsed.port);
  if (::inet_pton(AF_INET, parsed.host.c_str(), &addr.sin_addr) != 1) {
    return Status::InvalidArgument("connect to " + address + ": not an IPv4 address");
  }
  ScopedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return Status::FromErrno(errno, "socket for " + address);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS) {
      return Status::Unavailable("connect to " + address + ": " + ErrnoText(errno));
    }
    pollfd pfd{fd.get(), POLLOUT, 0};
    const int n = ::poll(&pfd, 1, RemainingMs(deadline));
    if (n == 0) return Status::DeadlineExceeded("connect to " + address + ": timed out");
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (n < 0 || err != 0) {
      return Status::Unavailable("connect to " + address + ": " + ErrnoText(n < 0 ? errno : err));
    }
  }
  return fd;
}

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

Status WriteSourceFile(const std::string& path, const std::string& data) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return Status::IoError("create the directory of " + path + ": " + ec.message());
  GRANARY_ASSIGN_OR_RETURN(ScopedFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0644));
  GRANARY_RETURN_IF_ERROR(PwriteFull(fd.get(), data.data(), data.size(), 0, path));
  return Status::Ok();
}

std::string Tail(const std::string& s, size_t n) {
  return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

}  // namespace

// ---- HTTP and Prometheus text -------------------------------------------------

Result<HttpResponse> HttpGet(const std::string& address, const std::string& path,
                             milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  const std::string doing = "GET http://" + address + path;
  auto connected = ConnectTcp(address, deadline);
  if (!connected.ok()) return connected.status().WithContext(doing);
  ScopedFd fd = std::move(*connected);
  const std::string request =
      "GET " + path + " HTTP/1.1\r\nHost: " + address + "\r\nConnection: close\r\n\r\n";
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return Status::Unavailable(doing + ": send: " + ErrnoText(errno));
    }
    pollfd pfd{fd.get(), POLLOUT, 0};
    if (::poll(&pfd, 1, RemainingMs(deadline)) == 0) {
      return Status::DeadlineExceeded(doing + ": send timed out");
    }
  }
  std::string raw;
  while (true) {
    char buf[16384];
    const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n > 0) {
      raw.append(buf, static_cast<size_t>(n));
      if (raw.size() > (64u << 20)) return Status::OutOfRange(doing + ": reply over 64 MiB");
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    if (errno != EAGAIN) {
      if (errno == ECONNRESET && !raw.empty()) break;
      return Status::Unavailable(doing + ": recv: " + ErrnoText(errno));
    }
    pollfd pfd{fd.get(), POLLIN, 0};
    if (::poll(&pfd, 1, RemainingMs(deadline)) == 0) {
      return Status::DeadlineExceeded(doing + ": no complete reply within " +
                                      std::to_string(timeout.count()) + " ms (got " +
                                      std::to_string(raw.size()) + " bytes)");
    }
  }
  const size_t head_end = raw.find("\r\n\r\n");
  if (!raw.starts_with("HTTP/1.") || head_end == std::string::npos || raw.size() < 12) {
    return Status::InvalidArgument(doing + ": not an HTTP reply: " + Quoted(raw.substr(0, 200)));
  }
  HttpResponse response;
  response.status = std::atoi(raw.c_str() + 9);
  response.body = raw.substr(head_end + 4);
  // Content-Length, when given, must match what arrived before the close.
  std::string head = raw.substr(0, head_end);
  std::transform(head.begin(), head.end(), head.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (const size_t at = head.find("\r\ncontent-length:"); at != std::string::npos) {
    const uint64_t length = std::strtoull(head.c_str() + at + 17, nullptr, 10);
    if (length != response.body.size()) {
      return Status::InvalidArgument(doing + ": Content-Length " + std::to_string(length) +
                                     " but " + std::to_string(response.body.size()) +
                                     " bytes of body");
    }
  }
  return response;
}

Result<std::vector<MetricSample>> ParsePrometheusText(std::string_view text) {
  std::vector<MetricSample> samples;
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    const auto bad = [&](std::string_view why) {
      return Status::InvalidArgument("metrics line " + std::to_string(line_no) + " " +
                                     Quoted(line) + ": " + std::string(why));
    };
    MetricSample sample;
    size_t i = 0;
    while (i < line.size() && (std::isalnum(static_cast<unsigned char>(line[i])) ||
                               line[i] == '_' || line[i] == ':')) {
      ++i;
    }
    if (i == 0) return bad("no metric name");
    sample.name = std::string(line.substr(0, i));
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (true) {
        while (i < line.size() && line[i] == ' ') ++i;
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        const size_t key_start = i;
        while (i < line.size() && line[i] != '=' && line[i] != '}') ++i;
        if (i >= line.size() || line[i] != '=') return bad("label without '='");
        std::string key(line.substr(key_start, i - key_start));
        ++i;
        if (i >= line.size() || line[i] != '"') return bad("label value not quoted");
        ++i;
        std::string value;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\' && i + 1 < line.size()) {
            ++i;
            value += line[i] == 'n' ? '\n' : line[i];
          } else {
            value += line[i];
          }
          ++i;
        }
        if (i >= line.size()) return bad("unterminated label value");
        ++i;
        sample.labels[key] = value;
        if (i < line.size() && line[i] == ',') ++i;
      }
    }
    if (i >= line.size() || line[i] != ' ') return bad("no value after the name");
    while (i < line.size() && line[i] == ' ') ++i;
    const std::string rest(line.substr(i));
    char* end = nullptr;
    sample.value = std::strtod(rest.c_str(), &end);
    if (end == rest.c_str()) return bad("the value is not a number");
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::optional<double> SumSamples(const std::vector<MetricSample>& samples, std::string_view name,
                                 const std::map<std::string, std::string>& labels) {
  std::optional<double> sum;
  for (const MetricSample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) {
        match = false;
        break;
      }
    }
    if (match) sum = sum.value_or(0) + s.value;
  }
  return sum;
}

// ---- one cache node -------------------------------------------------------------

std::string CacheNodeBinary() {
  if (const char* env = std::getenv("GRANARY_CACHENODE_BINARY"); env != nullptr && *env != '\0') {
    return env;
  }
#ifdef GRANARY_CACHENODE_BINARY
  return GRANARY_CACHENODE_BINARY;
#else
  return "granary-cachenode";
#endif
}

TestDaemon::TestDaemon(std::string name, std::string binary, std::string dir, std::string file_stem)
    : name_(std::move(name)),
      binary_(std::move(binary)),
      dir_(std::move(dir)),
      config_path_(dir_ + "/" + file_stem + ".yaml"),
      log_path_(dir_ + "/" + file_stem + ".log") {}

TestDaemon::~TestDaemon() = default;

std::string TestDaemon::metrics_address() const {
  return host_ + ":" + std::to_string(metrics_port_);
}

void TestDaemon::BindTo(std::string host) {
  host_ = std::move(host);
  ChoosePorts();
}

void TestDaemon::ChoosePorts() { metrics_port_ = FreeTcpPort(); }

Status TestDaemon::Start(std::vector<std::string> extra_args) {
  if (process_ != nullptr && process_->Running()) {
    return Status::FailedPrecondition("start " + name() + ": it is already running (pid " +
                                      std::to_string(process_->pid()) + ")");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return Status::IoError("start " + name() + ": create " + dir_ + ": " + ec.message());
  GRANARY_RETURN_IF_ERROR(WriteFileAtomically(config_path_, ConfigYaml(), 0644));
  if (process_ != nullptr) process_->PrintLogIfTestFailed();
  process_.reset();
  DaemonProcessOptions o;
  o.binary = binary_;
  o.args = {"--config", config_path_};
  o.args.insert(o.args.end(), extra_args.begin(), extra_args.end());
  if (!command_prefix_.empty()) {
    o.args.insert(o.args.begin(), binary_);
    o.args.insert(o.args.begin(), command_prefix_.begin() + 1, command_prefix_.end());
    o.binary = command_prefix_.front();
  }
  o.log_path = log_path_;
  o.name = name();
  GRANARY_ASSIGN_OR_RETURN(process_, DaemonProcess::Start(std::move(o)));
  return Status::Ok();
}

Status TestDaemon::WaitReady(milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  std::string last = "no answer yet";
  while (true) {
    if (!Running()) {
      const auto& exit = process_ != nullptr ? process_->exit_status() : std::nullopt;
      return Status::FailedPrecondition(
          name() + " exited (" + (exit ? exit->ToString() : std::string("never started")) +
          ") before /readyz answered 200; its log ends:\n" + Tail(Log(), 4000));
    }
    auto reply = HttpGet(metrics_address(), "/readyz", 2s);
    if (reply.ok() && reply->status == 200) return Status::Ok();
    last = reply.ok() ? std::to_string(reply->status) + " " + Quoted(reply->body)
                      : reply.status().ToString();
    if (steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(50ms);
  }
  return Status::DeadlineExceeded(
      name() + " was not ready within " + std::to_string(timeout.count()) +
      " ms; the last /readyz: " + last + "; its log ends:\n" + Tail(Log(), 4000));
}

Status TestDaemon::StartAndWaitReady(milliseconds timeout) {
  constexpr int kAttempts = 4;
  Status last;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const size_t log_before = Log().size();
    GRANARY_RETURN_IF_ERROR(Start());
    last = WaitReady(timeout);
    if (last.ok()) return last;
    // A port taken between FreeTcpPort and the daemon's bind: new ports.
    const std::string log = Log().substr(std::min(log_before, Log().size()));
    if (Running() || log.find("in use") == std::string::npos) return last;
    ChoosePorts();
  }
  return last;
}

bool TestDaemon::Running() { return process_ != nullptr && process_->Running(); }

Result<ExitStatus> TestDaemon::Terminate(milliseconds timeout) {
  if (process_ == nullptr) return Status::FailedPrecondition(name() + " was never started");
  return process_->Terminate(timeout);
}

Result<ExitStatus> TestDaemon::Kill() {
  if (process_ == nullptr) return Status::FailedPrecondition(name() + " was never started");
  return process_->Kill();
}

Result<ExitStatus> TestDaemon::WaitExit(milliseconds timeout) {
  if (process_ == nullptr) return Status::FailedPrecondition(name() + " was never started");
  return process_->Wait(timeout);
}

std::string TestDaemon::Log() const {
  auto data = ReadFileToString(log_path_);
  return data.ok() ? *data : std::string();
}

Result<HttpResponse> TestDaemon::Get(const std::string& path) const {
  return HttpGet(metrics_address(), path);
}

Result<std::vector<MetricSample>> TestDaemon::Metrics() const {
  GRANARY_ASSIGN_OR_RETURN(HttpResponse reply, Get("/metrics"));
  if (reply.status != 200) {
    return Status::Unavailable(name_ + " /metrics answered " + std::to_string(reply.status) + ": " +
                               Quoted(reply.body.substr(0, 200)));
  }
  auto parsed = ParsePrometheusText(reply.body);
  if (!parsed.ok()) return parsed.status().WithContext(name_ + " /metrics");
  return parsed;
}

Result<double> TestDaemon::MetricValue(std::string_view name,
                                       const std::map<std::string, std::string>& labels) const {
  GRANARY_ASSIGN_OR_RETURN(std::vector<MetricSample> samples, Metrics());
  auto sum = SumSamples(samples, name, labels);
  if (!sum) {
    std::string wanted(name);
    for (const auto& [k, v] : labels) wanted += " " + k + "=" + Quoted(v);
    return Status::NotFound(name_ + " /metrics has no sample " + wanted);
  }
  return *sum;
}

Result<double> TestDaemon::WaitForMetric(std::string_view name,
                                         const std::map<std::string, std::string>& labels,
                                         const std::function<bool(double)>& holds,
                                         milliseconds timeout) const {
  const auto deadline = steady_clock::now() + timeout;
  std::string last;
  while (true) {
    auto value = MetricValue(name, labels);
    if (value.ok() && holds(*value)) return *value;
    last = value.ok() ? "the last value was " + std::to_string(*value) : value.status().ToString();
    if (steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(50ms);
  }
  std::string wanted(name);
  for (const auto& [k, v] : labels) wanted += " " + k + "=" + Quoted(v);
  return Status::DeadlineExceeded(name_ + ": " + wanted +
                                  " did not reach the expected value within " +
                                  std::to_string(timeout.count()) + " ms; " + last);
}

Result<double> TestDaemon::WaitForSettledMetric(std::string_view name,
                                                const std::map<std::string, std::string>& labels,
                                                const std::function<bool(double)>& holds,
                                                milliseconds gap, milliseconds timeout) const {
  const auto deadline = steady_clock::now() + timeout;
  Result<double> first = WaitForMetric(name, labels, holds, timeout);
  while (first.ok() && steady_clock::now() + gap < deadline) {
    std::this_thread::sleep_for(gap);
    Result<double> second = MetricValue(name, labels);
    if (second.ok() && *second == *first) return first;
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now());
    first = second.ok() && holds(*second) ? second : WaitForMetric(name, labels, holds, left);
  }
  if (!first.ok()) return first;
  return Status::DeadlineExceeded(name_ + ": " + std::string(name) + " did not settle within " +
                                  std::to_string(timeout.count()) + " ms; the last value was " +
                                  std::to_string(*first));
}

CacheNode::CacheNode(CacheNodeOptions options, std::string dir)
    : TestDaemon(options.node_id, CacheNodeBinary(), std::move(dir), "cachenode"),
      options_(std::move(options)) {}

CacheNode::~CacheNode() = default;

std::string CacheNode::address() const { return host_ + ":" + std::to_string(port_); }

void CacheNode::ChoosePorts() {
  port_ = FreeTcpPort();
  do {
    metrics_port_ = FreeTcpPort();
  } while (metrics_port_ == port_);
}

std::string CacheNode::ConfigYaml() {
  if (port_ == 0) ChoosePorts();
  const CacheNodeOptions& o = options_;
  std::ostringstream y;
  y << "node_id: " << o.node_id << "\n"
    << "pool: " << o.pool << "\n"
    << "listen: " << address() << "\n"
    << "advertise: " << address() << "\n"
    << "data_dir: " << o.data_dir << "\n"
    << "capacity: " << o.capacity_bytes << "\n"
    << "metadata_store: " << o.metadata_store << "\n"
    << "source_concurrency: " << o.source_concurrency << "\n"
    << "worker_threads: " << o.worker_threads << "\n"
    << "service_threads: " << o.service_threads << "\n"
    << "max_connections: " << o.max_connections << "\n"
    << "metrics_listen: " << metrics_address() << "\n"
    << "heartbeat_interval: " << o.heartbeat_interval << "\n"
    << "heartbeat_ttl: " << o.heartbeat_ttl << "\n"
    << "drain_timeout: " << o.drain_timeout << "\n"
    << "log_level: " << o.log_level << "\n"
    << o.extra_yaml;
  const auto sets = [&](const char* key) {
    return o.extra_yaml.find(std::string(key) + ":") != std::string::npos;
  };
  if (o.opt_out_of_authentication && !sets("cluster_key_file") && !sets("kubernetes_auth") &&
      !sets("serve_without_authentication")) {
    y << "serve_without_authentication: true\n";
    if (!IsLoopbackHost(host_)) {  // a host's address in a network namespace
      y << "unsafe_serve_without_authentication_beyond_loopback: true\n";
    }
  }
  return y.str();
}

std::vector<std::string> CacheNode::ChunkFiles() const {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(options_.data_dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file() && it->path().extension() == ".chunk") {
      files.push_back(it->path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

Result<PeerClient> CacheNode::Connect(milliseconds call_timeout) const {
  PeerClientOptions o;
  o.client_name = "integration-test";
  o.connect_timeout = 5s;
  o.call_timeout = call_timeout;
  return PeerClient::Connect(address(), o);
}

// ---- datasets -------------------------------------------------------------------

std::vector<SampleId> TestDataset::AllIds() const {
  std::vector<SampleId> ids(contents.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<SampleId>(i);
  return ids;
}

Result<Placement> PlacementOf(MetadataStore& store, const std::string& pool,
                              std::map<std::string, std::string>* addresses) {
  GRANARY_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, store.ListNodes(pool));
  return PlacementOf(nodes, addresses);
}

Result<Placement> PlacementOf(const std::vector<NodeRecord>& nodes,
                              std::map<std::string, std::string>* addresses) {
  std::vector<PlacementNode> pnodes;
  for (const NodeRecord& n : nodes) {
    pnodes.push_back({n.id, static_cast<double>(n.capacity_bytes)});
    if (addresses != nullptr) (*addresses)[n.id] = n.address;
  }
  return Placement::Create(std::move(pnodes));
}

// ---- reading as a sidecar does ----------------------------------------------------

DatasetReader::DatasetReader(MetadataStore* store, const TestDataset& dataset,
                             milliseconds call_timeout)
    : store_(store), dataset_(&dataset), call_timeout_(call_timeout) {}

Status DatasetReader::Refresh() {
  auto nodes = store_->ListNodes(dataset_->pool);
  if (!nodes.ok()) return nodes.status().WithContext("list the nodes of the pool");
  std::map<std::string, std::string> addresses;
  auto placement = PlacementOf(*nodes, &addresses);
  if (!placement.ok()) return placement.status().WithContext("place on the nodes of the pool");
  placement_ = std::move(*placement);
  addresses_ = std::move(addresses);
  tls_addresses_.clear();
  for (const NodeRecord& n : *nodes) {
    auto label = n.labels.find(std::string(kNodeLabelTls));
    if (label != n.labels.end() && label->second == "true") tls_addresses_.insert(n.address);
  }
  refreshed_ = true;
  return Status::Ok();
}

Result<std::string> DatasetReader::OwnerOf(SampleId id) const {
  const ChunkId chunk = dataset_->manifest->ChunkOf(id);
  const uint32_t owner = placement_.Primary(dataset_->manifest_id, chunk);
  if (owner == Placement::kNoOwner) {
    return Status::NotFound("sample " + std::to_string(id) + ": no live node owns chunk " +
                            std::to_string(chunk));
  }
  return placement_.nodes()[owner].id;
}

Result<PeerClient*> DatasetReader::ClientFor(const std::string& node_id) {
  auto at = addresses_.find(node_id);
  if (at == addresses_.end()) {
    return Status::NotFound("node " + Quoted(node_id) + " is not in the store's node list");
  }
  auto it = clients_.find(at->second);
  if (it != clients_.end()) return &it->second;
  PeerClientOptions o;
  o.client_name = "integration-reader";
  o.connect_timeout = 3s;
  o.call_timeout = call_timeout_;
  o.credentials = credentials_;
  if (tls_addresses_.count(at->second) != 0) {
    if (tls_ == nullptr) {
      auto tls = TlsContext::ForClient("");
      if (!tls.ok()) return tls.status();
      tls_ = std::move(*tls);
    }
    o.tls = tls_;
  }
  auto client = PeerClient::Connect(at->second, o);
  if (!client.ok()) return client.status().WithContext("connect to " + node_id);
  return &clients_.emplace(at->second, std::move(*client)).first->second;
}

std::vector<DatasetReader::Outcome> DatasetReader::ReadFrom(const std::string& node_id,
                                                            const std::vector<SampleId>& ids) {
  std::vector<Outcome> out(ids.size());
  for (Outcome& o : out) o.node = node_id;
  auto client = ClientFor(node_id);
  if (!client.ok()) {
    for (Outcome& o : out) o.status = client.status();
    return out;
  }
  const Manifest& m = *dataset_->manifest;
  const ProtocolLimits& limits = (*client)->limits();
  const size_t max_items = std::min<size_t>(limits.max_items, 512);
  const uint64_t max_bytes = std::min<uint64_t>(limits.max_read_bytes, 8u << 20);
  size_t i = 0;
  while (i < ids.size()) {
    ReadRequest request;
    request.dataset = dataset_->name;
    request.manifest_id = dataset_->manifest_id;
    std::vector<size_t> slots;
    uint64_t bytes = 0;
    for (; i < ids.size() && slots.size() < max_items; ++i) {
      const SampleId id = ids[i];
      if (id >= m.sample_count()) {
        out[i].status = Status::OutOfRange("sample " + std::to_string(id) + " is past the end");
        continue;
      }
      const uint64_t size = m.SizeOf(id);
      if (size == 0) continue;  // nothing to ask for: OK, empty
      if (!slots.empty() && bytes + size > max_bytes) break;
      request.items.push_back({ReadKind::kSample, id, 0, static_cast<uint32_t>(size)});
      slots.push_back(i);
      bytes += size;
    }
    if (slots.empty()) continue;
    auto reply = (*client)->Read(request);
    for (size_t k = 0; k < slots.size(); ++k) {
      Outcome& o = out[slots[k]];
      if (!reply.ok()) {
        o.status = reply.status();
      } else if (!reply->status(k).ok()) {
        o.status = reply->status(k);
      } else {
        o.bytes = std::string(reply->bytes(k));
      }
    }
  }
  return out;
}

std::vector<DatasetReader::Outcome> DatasetReader::Read(const std::vector<SampleId>& ids) {
  std::vector<Outcome> out(ids.size());
  if (!refreshed_) {
    if (Status s = Refresh(); !s.ok()) {
      for (Outcome& o : out) o.status = s;
      return out;
    }
  }
  std::map<std::string, std::vector<size_t>> by_node;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= dataset_->manifest->sample_count()) {
      out[i].status = Status::OutOfRange("sample " + std::to_string(ids[i]) + " is past the end");
      continue;
    }
    auto owner = OwnerOf(ids[i]);
    if (!owner.ok()) {
      out[i].status = owner.status();
      continue;
    }
    by_node[*owner].push_back(i);
  }
  for (const auto& [node, slots] : by_node) {
    std::vector<SampleId> node_ids;
    for (size_t s : slots) node_ids.push_back(ids[s]);
    std::vector<Outcome> got = ReadFrom(node, node_ids);
    for (size_t k = 0; k < slots.size(); ++k) out[slots[k]] = std::move(got[k]);
  }
  return out;
}

Status DatasetReader::ReadAllCorrect(const std::vector<SampleId>& ids, milliseconds timeout,
                                     std::vector<std::string>* wrong) {
  const auto deadline = steady_clock::now() + timeout;
  std::vector<SampleId> pending = ids;
  std::map<SampleId, Status> last_error;
  while (true) {
    std::vector<Outcome> got = Read(pending);
    std::vector<SampleId> still;
    for (size_t i = 0; i < pending.size(); ++i) {
      const SampleId id = pending[i];
      if (!got[i].status.ok()) {
        still.push_back(id);
        last_error[id] = got[i].status;
        continue;
      }
      if (got[i].bytes != dataset_->contents[id]) {
        wrong->push_back("sample " + std::to_string(id) + " (" + dataset_->manifest->PathOf(id) +
                         ") from " + got[i].node + ": " + std::to_string(got[i].bytes.size()) +
                         " bytes that differ from the source's " +
                         std::to_string(dataset_->contents[id].size()));
      }
    }
    pending = std::move(still);
    if (pending.empty()) return Status::Ok();
    if (steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(50ms);
    (void)Refresh();
  }
  std::string message = std::to_string(pending.size()) + " of " + std::to_string(ids.size()) +
                        " samples still failed after " + std::to_string(timeout.count()) +
                        " ms; the first:";
  for (size_t i = 0; i < std::min<size_t>(pending.size(), 5); ++i) {
    message +=
        "\n  sample " + std::to_string(pending[i]) + ": " + last_error[pending[i]].ToString();
  }
  return Status::DeadlineExceeded(message);
}

// ---- the cluster ----------------------------------------------------------------

Result<std::unique_ptr<CacheCluster>> CacheCluster::Create() { return Create({}); }

Result<std::unique_ptr<CacheCluster>> CacheCluster::Create(std::vector<std::string> redis_args) {
  std::unique_ptr<CacheCluster> cluster(new CacheCluster());
  GRANARY_ASSIGN_OR_RETURN(cluster->redis_, RedisServer::Start(std::move(redis_args)));
  MetadataStoreOptions o;
  o.retry_budget = 10s;
  GRANARY_ASSIGN_OR_RETURN(cluster->store_, OpenMetadataStore(cluster->redis_->url(), o));
  return cluster;
}

Result<std::unique_ptr<CacheCluster>> CacheCluster::CreateOnStore(std::string store_url) {
  std::unique_ptr<CacheCluster> cluster(new CacheCluster());
  cluster->store_url_ = std::move(store_url);
  MetadataStoreOptions o;
  o.retry_budget = 10s;
  GRANARY_ASSIGN_OR_RETURN(cluster->store_, OpenMetadataStore(cluster->store_url_, o));
  return cluster;
}

CacheCluster::~CacheCluster() {
  // Kill the nodes first: their logs are printed while the files still exist.
  nodes_.clear();
}

CacheNode& CacheCluster::AddNode(CacheNodeOptions options) {
  if (options.node_id.empty()) options.node_id = "node-" + std::to_string(next_node_++);
  const std::string dir = dir_.Join(options.node_id);
  if (options.data_dir.empty()) options.data_dir = dir + "/data";
  if (options.metadata_store.empty()) options.metadata_store = store_url();
  nodes_.push_back(std::make_unique<CacheNode>(std::move(options), dir));
  return *nodes_.back();
}

Status CacheCluster::StartNodes(size_t n, const CacheNodeOptions& base) {
  std::vector<CacheNode*> started;
  for (size_t i = 0; i < n; ++i) {
    CacheNodeOptions o = base;
    o.node_id.clear();
    CacheNode& node = AddNode(o);
    GRANARY_RETURN_IF_ERROR(node.Start());
    started.push_back(&node);
  }
  for (CacheNode* node : started) {
    Status ready = node->WaitReady();
    if (!ready.ok() && !node->Running() && node->Log().find("in use") != std::string::npos) {
      ready = node->StartAndWaitReady();  // a port was taken: fresh ports
    }
    GRANARY_RETURN_IF_ERROR(ready);
  }
  return Status::Ok();
}

CacheNode* CacheCluster::FindNode(std::string_view id) {
  for (auto& n : nodes_) {
    if (n->id() == id) return n.get();
  }
  return nullptr;
}

Result<TestDataset> CacheCluster::CreateDataset(const DatasetOptions& options) {
  if (options.min_size == 0 || options.max_size < options.min_size) {
    return Status::InvalidArgument("create a test dataset: sizes must satisfy 1 <= min <= max");
  }
  TestDataset ds;
  ds.name = options.name;
  ds.pool = options.pool;
  ds.root = dir_.Join("src-" + options.name);
  std::map<std::string, std::string> by_path;
  const size_t per_dir = std::max<size_t>(1, options.files_per_directory);
  for (size_t i = 0; i < options.files; ++i) {
    char rel[64];
    std::snprintf(rel, sizeof(rel), "d%03zu/f%06zu.bin", i / per_dir, i);
    const size_t span = options.max_size - options.min_size + 1;
    const size_t size = options.min_size + static_cast<size_t>(Mix(i) % span);
    std::string data = Bytes(options.name + "/" + rel, size);
    GRANARY_RETURN_IF_ERROR(WriteSourceFile(ds.root + "/" + rel, data));
    by_path.emplace(rel, std::move(data));
  }
  if (options.before_snapshot) options.before_snapshot(ds.root);

  ManifestBuildOptions build;
  build.source_root = ds.root;
  build.source_uri = "file://" + ds.root;
  build.chunk_size = options.chunk_size;
  build.threads = 4;
  auto manifest = BuildManifest(build);
  if (!manifest.ok()) return manifest.status().WithContext("snapshot test dataset " + ds.root);
  if (manifest->sample_count() != options.files) {
    return Status::Internal("snapshot of " + ds.root + " found " +
                            std::to_string(manifest->sample_count()) + " files, wrote " +
                            std::to_string(options.files));
  }
  ds.manifest_id = manifest->id();
  ds.contents.resize(manifest->sample_count());
  for (SampleId id = 0; id < manifest->sample_count(); ++id) {
    ds.contents[id] = std::move(by_path.at(manifest->PathOf(id)));
    ds.total_bytes += ds.contents[id].size();
  }
  GRANARY_RETURN_IF_ERROR(store_->PutManifest(ds.manifest_id.ToHex(), manifest->Encode()));
  ds.manifest = std::make_shared<Manifest>(std::move(*manifest));

  DatasetRecord record;
  record.name = options.name;
  record.spec.source_uri = build.source_uri;
  record.spec.chunk_size = options.chunk_size;
  record.spec.pool = options.pool;
  record.spec.replication = options.replication;
  record.spec.nodes = options.nodes;
  record.spec.kubernetes_namespace = options.kubernetes_namespace;
  record.owner = options.owner.value_or(DatasetOwner{::getuid(), ::getgid()});
  record.state.phase = DatasetPhase::kStaging;
  record.state.message = "created by the integration test";
  record.manifest_id = ds.manifest_id.ToHex();
  auto created = store_->CreateDataset(record);
  if (!created.ok()) return created.status().WithContext("create dataset " + options.name);
  return ds;
}

Result<std::shared_ptr<const Manifest>> CacheCluster::RegisterTree(const std::string& name,
                                                                   const std::string& root,
                                                                   uint64_t chunk_size) {
  ManifestBuildOptions build;
  build.source_root = root;
  build.source_uri = "file://" + root;
  build.chunk_size = chunk_size;
  auto manifest = BuildManifest(build);
  if (!manifest.ok()) return manifest.status().WithContext("snapshot test tree " + root);
  auto shared = std::make_shared<const Manifest>(std::move(*manifest));
  GRANARY_RETURN_IF_ERROR(RegisterManifest(name, *shared));
  return shared;
}

Status CacheCluster::RegisterManifest(const std::string& name, const Manifest& manifest) {
  GRANARY_RETURN_IF_ERROR(store_->PutManifest(manifest.id().ToHex(), manifest.Encode()));
  DatasetRecord record;
  record.name = name;
  record.spec.source_uri = manifest.header().source_uri;
  record.spec.chunk_size = manifest.chunk_size();
  record.spec.pool = "default";
  record.spec.replication = 1;
  record.owner = DatasetOwner{::getuid(), ::getgid()};
  record.state.phase = DatasetPhase::kStaging;
  record.state.message = "created by the integration test";
  record.manifest_id = manifest.id().ToHex();
  auto created = store_->CreateDataset(record);
  if (!created.ok()) return created.status().WithContext("create dataset " + name);
  return Status::Ok();
}

Result<DatasetRecord> CacheCluster::WaitForPhase(const std::string& dataset, DatasetPhase phase,
                                                 milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  while (true) {
    auto record = store_->GetDataset(dataset);
    if (record.ok() && record->state.phase == phase) return record;
    if (steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(50ms);
  }
  return Status::DeadlineExceeded("dataset " + Quoted(dataset) + " did not reach phase " +
                                  std::string(DatasetPhaseName(phase)) + " within " +
                                  std::to_string(timeout.count()) + " ms; " + Describe(dataset));
}

std::string CacheCluster::Describe(const std::string& dataset) {
  std::ostringstream out;
  auto record = store_->GetDataset(dataset);
  if (record.ok()) {
    out << "dataset " << dataset << ": phase " << DatasetPhaseName(record->state.phase)
        << ", message " << Quoted(record->state.message) << ", revision " << record->revision;
  } else {
    out << "dataset " << dataset << ": " << record.status().ToString();
  }
  if (auto progress = store_->ListProgress(dataset); progress.ok()) {
    for (const auto& [node, p] : *progress) {
      out << "\n  progress " << node << ": chunks " << p.chunks_staged << "/" << p.chunks_total
          << ", bytes " << p.bytes_staged << "/" << p.bytes_total << ", samples_failed "
          << p.samples_failed;
    }
  }
  const std::string pool = record.ok() ? record->spec.pool : "";
  if (auto nodes = store_->ListNodes(pool); nodes.ok()) {
    out << "\n  live nodes:";
    for (const NodeRecord& n : *nodes) out << " " << n.id << "@" << n.address;
  }
  return out.str();
}

double CacheCluster::SumMetric(std::string_view name,
                               const std::map<std::string, std::string>& labels) {
  double sum = 0;
  for (auto& node : nodes_) {
    if (!node->Running()) continue;
    auto v = node->MetricValue(name, labels);
    if (v.ok()) sum += *v;
  }
  return sum;
}

}  // namespace granary::testing
