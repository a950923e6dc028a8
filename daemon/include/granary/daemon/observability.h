#pragma once

// The daemons' observability endpoint, and how a component declares the
// metrics it serves there.
//
// ObservabilityServer is a small HTTP server on its own threads that answers
//   GET /metrics  200, the Prometheus text exposition (format 0.0.4) of a
//                 prometheus-cpp Registry, serialized by prometheus-cpp;
//   GET /healthz  200 "ok" while the process runs (liveness);
//   GET /readyz   200 "ok" when the component's ReadinessCheck returns OK, else
//                 503 with the Status message as the body (readiness);
// HEAD on the same paths; 404 for any other path and 405 for any other method.
// It listens only on the address it is given ("127.0.0.1:9464"; port 0 picks a
// free port, readable with port()). Bad addresses and bind failures come back
// from Start as a Status naming the address and what to do.
//
// MetricRegistrar is how a component declares its metrics in one place, under
// DESIGN.md's rules (granary_<component>_<what>_<unit>, counters end in _total,
// base units, low-cardinality labels), with prometheus-cpp's exceptions turned
// into Status. LatencyBucketsSeconds and ExponentialBuckets give histogram
// buckets. docs/observability.md has the endpoints, the rules and an example.
//
// Who calls it: granary-cachenode and granary-sidecar start one
// ObservabilityServer from their config's metrics listen address and keep it
// for the life of the process; each component's metrics struct is filled by a
// MetricRegistrar at start-up; tests/daemon/observability_test.cc.
//
// Thread safety: Start, Stop and the destructor are called by the owning
// thread; Stop is idempotent and the destructor calls it. port() and address()
// may be read from any thread. The ReadinessCheck and the Registry are used on
// the server's worker threads, concurrently with the component updating its
// metrics (prometheus-cpp metrics and registries are thread-safe). A
// MetricRegistrar is used by one thread; the metric pointers it hands out may be
// updated from any thread, and MetricFamily::WithLabels may be called from any
// thread.

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/net_address.h"
#include "granary/core/status.h"

namespace granary {

// ---- listen addresses ----

// Listen addresses are NetAddress (granary/core/net_address.h). The host is
// always explicit: a daemon listens on all interfaces only when its config says
// 0.0.0.0 (or [::]).

// The host a daemon's metrics endpoint uses unless its config says otherwise.
inline constexpr std::string_view kDefaultObservabilityHost = "127.0.0.1";

// ---- the endpoint ----

// Whether the component can do its job now (store reachable, chunk store
// scanned, ...). OK: ready; otherwise the message says why not and becomes the
// /readyz body. Called on a server worker thread for every /readyz request: it
// must be quick and must not block (read state the component keeps, do not
// probe the store from here).
using ReadinessCheck = std::function<Status()>;

struct ObservabilityOptions {
  // Threads answering requests; a worker gets a connection only once its
  // request has arrived whole, and answers it within io_timeout.
  int worker_threads = 2;
  // Complete requests waiting for a worker. When full they wait, still
  // unserved, with the connections being read.
  size_t max_queued_connections = 64;
  // Connections whose request is still arriving, read all at once by one
  // thread (poll) without holding a worker. When full, the oldest is closed
  // to make room: a flood of half-sent requests cannot keep /healthz out.
  size_t max_reading_connections = 1024;
  // The whole request must arrive within this of the connection's accept,
  // and the whole reply be taken within it; otherwise the connection is
  // answered 408 (request) or dropped (reply). Also bounds how long Stop()
  // waits for a worker.
  std::chrono::seconds io_timeout{5};
  // How long a new connection may stay silent before its request starts
  // (then 408 and closed). Each connection carries one request (the reply
  // says "Connection: close").
  std::chrono::seconds idle_timeout{2};
};

class ObservabilityServer {
 public:
  // Binds `listen` ("host:port", see ParseNetAddress) and serves until
  // Stop(). `registry` must not be null. A null `readiness` means ready
  // whenever the server runs. Errors: kInvalidArgument (bad address, options
  // or registry), kUnavailable (address in use or not on this host, name does
  // not resolve), kPermissionDenied (a privileged port), kResourceExhausted (no
  // threads). The port is listening when this returns.
  static Result<std::unique_ptr<ObservabilityServer>> Start(
      std::string_view listen, std::shared_ptr<prometheus::Registry> registry,
      ReadinessCheck readiness, const ObservabilityOptions& options = {});

  ~ObservabilityServer();  // Stop()
  ObservabilityServer(const ObservabilityServer&) = delete;
  ObservabilityServer& operator=(const ObservabilityServer&) = delete;

  // The bound address; its port is the one chosen when port 0 was asked for.
  const NetAddress& address() const;
  uint16_t port() const { return address().port; }

  // Closes the listening socket, lets the workers finish (bounded by the
  // options' timeouts) and joins every thread the server started. Idempotent.
  void Stop();

 private:
  class Impl;
  explicit ObservabilityServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- declaring metrics ----

enum class MetricKind { kCounter, kGauge, kHistogram };

// Checks a full metric name against DESIGN.md for `component`:
// granary_<component>_<what>[_<unit>], lowercase snake_case; counters end in
// _total and nothing else does; no _count/_sum/_bucket suffix (the exposition
// makes those for histograms); base units only (_seconds, _bytes: never ms,
// minutes, KiB, percent...). kInvalidArgument saying what to write instead.
Status CheckMetricName(std::string_view name, std::string_view component, MetricKind kind);

// At most this many variable labels per family.
inline constexpr size_t kMaxMetricLabels = 4;

// Checks a family's variable label names: snake_case, unique, not reserved
// ("le", "quantile", "__*"), at most kMaxMetricLabels, and none that name
// a high-cardinality thing (sample, path, file, pod, chunk ids...; see
// docs/observability.md). "dataset" is allowed.
Status CheckLabelNames(const std::vector<std::string>& label_names);

// A declared family with variable labels. A value: copy it into the
// component's metrics struct; it refers to the family in the registry, which
// must outlive it.
template <typename T>
class MetricFamily {
 public:
  // Not declared yet (so that metrics structs can be default-constructed):
  // WithLabels says kFailedPrecondition.
  MetricFamily() = default;

  // The metric for these label values (one per label name, in declaration
  // order), created on first use; the pointer stays valid for the registry's
  // life. Look it up once per dataset (or other label value), not per request.
  // kInvalidArgument if the count is wrong or a value is empty or longer than
  // kMaxLabelValueBytes.
  Result<T*> WithLabels(const std::vector<std::string>& label_values) const;

  const std::vector<std::string>& label_names() const { return label_names_; }
  // The prometheus-cpp family; null until declared.
  prometheus::Family<T>* family() const { return family_; }

  static constexpr size_t kMaxLabelValueBytes = 128;

 private:
  friend class MetricRegistrar;
  MetricFamily(prometheus::Family<T>* family, std::vector<std::string> label_names,
               prometheus::Histogram::BucketBoundaries buckets)
      : family_(family), label_names_(std::move(label_names)), buckets_(std::move(buckets)) {}

  prometheus::Family<T>* family_ = nullptr;
  std::vector<std::string> label_names_;
  prometheus::Histogram::BucketBoundaries buckets_;  // histograms only
};

extern template class MetricFamily<prometheus::Counter>;
extern template class MetricFamily<prometheus::Gauge>;
extern template class MetricFamily<prometheus::Histogram>;

// Declares a component's metrics in a registry, checking each against the
// naming rules above. One place per component, e.g.
//
//   struct CacheNodeMetrics {
//     prometheus::Counter* source_opens;
//     MetricFamily<prometheus::Counter> staged_bytes;     // by dataset
//     prometheus::Histogram* request_latency;
//     static Result<CacheNodeMetrics> Declare(prometheus::Registry& registry);
//   };
//   Result<CacheNodeMetrics> CacheNodeMetrics::Declare(prometheus::Registry& r) {
//     MetricRegistrar reg(r, "cachenode");
//     GRANARY_ASSIGN_OR_RETURN(auto opens, reg.AddCounter(
//         "granary_cachenode_source_opens_total", "Files opened on the source."));
//     ...
//   }
//
// Every Add* returns kInvalidArgument for a name, help or label set that breaks
// the rules, and kAlreadyExists when the registry holds the name with another
// type. Declaring the same name and type twice returns the same family.
class MetricRegistrar {
 public:
  // `component`: the <component> part of every name, [a-z][a-z0-9]* (e.g.
  // "cachenode", "sidecar"). The registry must outlive the metrics.
  MetricRegistrar(prometheus::Registry& registry, std::string component)
      : registry_(registry), component_(std::move(component)) {}

  // Families without variable labels: the one metric.
  Result<prometheus::Counter*> AddCounter(std::string_view name, std::string_view help);
  Result<prometheus::Gauge*> AddGauge(std::string_view name, std::string_view help);
  Result<prometheus::Histogram*> AddHistogram(std::string_view name, std::string_view help,
                                              prometheus::Histogram::BucketBoundaries buckets);

  // Families with variable labels (see CheckLabelNames).
  Result<MetricFamily<prometheus::Counter>> AddCounterFamily(std::string_view name,
                                                             std::string_view help,
                                                             std::vector<std::string> label_names);
  Result<MetricFamily<prometheus::Gauge>> AddGaugeFamily(std::string_view name,
                                                         std::string_view help,
                                                         std::vector<std::string> label_names);
  Result<MetricFamily<prometheus::Histogram>> AddHistogramFamily(
      std::string_view name, std::string_view help, std::vector<std::string> label_names,
      prometheus::Histogram::BucketBoundaries buckets);

 private:
  prometheus::Registry& registry_;
  std::string component_;
};

// ---- histogram buckets ----

// Request latency in seconds, 100 µs to 10 s in 1-2.5-5 steps (16 bounds; the
// exposition adds +Inf): from a page-cache hit on loopback to a cold read from
// a slow shared file system.
prometheus::Histogram::BucketBoundaries LatencyBucketsSeconds();

// start, start*factor, ..., `count` bounds. kInvalidArgument unless start > 0,
// factor > 1, 1 <= count <= 64 and every bound is finite.
Result<prometheus::Histogram::BucketBoundaries> ExponentialBuckets(double start, double factor,
                                                                   size_t count);

// OK if `buckets` is non-empty, finite and strictly increasing (what a
// histogram needs); kInvalidArgument otherwise.
Status CheckBuckets(const prometheus::Histogram::BucketBoundaries& buckets);

}  // namespace granary
