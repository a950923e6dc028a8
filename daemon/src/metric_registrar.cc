// Declaring metrics: DESIGN.md's naming rules (CheckMetricName,
// CheckLabelNames), MetricRegistrar and MetricFamily over prometheus-cpp with
// its exceptions turned into Status, and histogram buckets. The HTTP side
// (ObservabilityServer) is in observability.cc.

#include <algorithm>
#include <cmath>
#include <exception>
#include <set>
#include <string>
#include <type_traits>
#include <utility>

#include "granary/core/names.h"
#include "granary/daemon/observability.h"

namespace granary {
namespace {

bool IsAsciiLower(char c) { return c >= 'a' && c <= 'z'; }
bool IsAsciiDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

// ---- naming rules ----

namespace {

// Words that are not base units, and the base unit to use instead.
struct NonBaseUnit {
  std::string_view word;
  std::string_view use;
};
constexpr NonBaseUnit kNonBaseUnits[] = {
    {"ms", "seconds"},         {"msec", "seconds"},
    {"millis", "seconds"},     {"milliseconds", "seconds"},
    {"us", "seconds"},         {"usec", "seconds"},
    {"micros", "seconds"},     {"microseconds", "seconds"},
    {"ns", "seconds"},         {"nsec", "seconds"},
    {"nanos", "seconds"},      {"nanoseconds", "seconds"},
    {"sec", "seconds"},        {"secs", "seconds"},
    {"minutes", "seconds"},    {"mins", "seconds"},
    {"hours", "seconds"},      {"days", "seconds"},
    {"kb", "bytes"},           {"kib", "bytes"},
    {"kilobytes", "bytes"},    {"mb", "bytes"},
    {"mib", "bytes"},          {"megabytes", "bytes"},
    {"gb", "bytes"},           {"gib", "bytes"},
    {"gigabytes", "bytes"},    {"tb", "bytes"},
    {"tib", "bytes"},          {"percent", "ratio (0 to 1)"},
    {"pct", "ratio (0 to 1)"},
};

// Label names that would give one time series per sample, file, chunk, pod or
// request (DESIGN.md: never sample ids, paths or pod names).
constexpr std::string_view kHighCardinalityLabels[] = {
    "sample",   "sample_id", "samples",  "path",   "file",       "file_name", "filename", "pod",
    "pod_name", "chunk",     "chunk_id", "offset", "request_id", "trace_id",  "uid",
};

// The words the exposition appends to histogram series.
constexpr std::string_view kReservedSuffixes[] = {"count", "sum", "bucket"};

bool IsSnakeCase(std::string_view s) {
  return !s.empty() && IsAsciiLower(s.front()) && std::all_of(s.begin(), s.end(), [](char c) {
    return IsAsciiLower(c) || IsAsciiDigit(c) || c == '_';
  });
}

std::vector<std::string_view> Words(std::string_view s) {
  std::vector<std::string_view> words;
  size_t start = 0;
  while (true) {
    const size_t end = s.find('_', start);
    words.push_back(s.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return words;
    start = end + 1;
  }
}

std::string_view KindName(MetricKind kind) {
  switch (kind) {
    case MetricKind::kCounter:
      return "counter";
    case MetricKind::kGauge:
      return "gauge";
    case MetricKind::kHistogram:
      return "histogram";
  }
  return "metric";
}

}  // namespace

Status CheckMetricName(std::string_view name, std::string_view component, MetricKind kind) {
  if (component.empty() || !IsAsciiLower(component.front()) ||
      !std::all_of(component.begin(), component.end(),
                   [](char c) { return IsAsciiLower(c) || IsAsciiDigit(c); })) {
    return Status::InvalidArgument("metric component " + Quoted(component) +
                                   " is not [a-z][a-z0-9]* (e.g. 'cachenode', 'sidecar')");
  }
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(std::string(KindName(kind)) + " name " + Quoted(name) + " " +
                                   why +
                                   " (rule: granary_<component>_<what>_<unit>, see "
                                   "docs/observability.md)");
  };
  const std::string prefix = "granary_" + std::string(component) + "_";
  if (name.substr(0, prefix.size()) != prefix) {
    return bad("does not start with '" + prefix + "'");
  }
  if (!IsSnakeCase(name)) return bad("is not lowercase snake_case ([a-z0-9_])");
  const std::string_view rest = name.substr(prefix.size());
  if (rest.empty()) return bad("names nothing after '" + prefix + "'");
  if (!IsAsciiLower(rest.front()))
    return bad("has a part after the prefix that starts with '_' or a digit");
  if (rest.find("__") != std::string_view::npos || rest.back() == '_') {
    return bad("has an empty word ('__' or a trailing '_')");
  }
  std::vector<std::string_view> words = Words(rest);
  for (std::string_view w : words) {
    for (const NonBaseUnit& u : kNonBaseUnits) {
      if (w == u.word) {
        return bad("uses '" + std::string(w) + "', not a base unit; use _" + std::string(u.use) +
                   " and convert the value");
      }
    }
  }
  const bool ends_total = words.back() == "total";
  if (kind == MetricKind::kCounter) {
    if (!ends_total) return bad("does not end in _total, as every counter must");
    words.pop_back();
    if (words.empty()) return bad("has nothing before _total");
  } else if (ends_total) {
    return bad("ends in _total, which only counters may");
  }
  for (std::string_view reserved : kReservedSuffixes) {
    if (words.back() == reserved) {
      return bad("ends in _" + std::string(reserved) +
                 ", a suffix the exposition generates for histograms; name what is measured");
    }
  }
  return Status::Ok();
}

Status CheckLabelNames(const std::vector<std::string>& label_names) {
  if (label_names.size() > kMaxMetricLabels) {
    return Status::InvalidArgument(
        std::to_string(label_names.size()) + " labels on one metric; at most " +
        std::to_string(kMaxMetricLabels) + " (each label multiplies the time series)");
  }
  std::set<std::string_view> seen;
  for (const std::string& l : label_names) {
    if (!IsSnakeCase(l)) {
      return Status::InvalidArgument("label name " + Quoted(l) +
                                     " is not snake_case starting with a letter ([a-z][a-z0-9_]*)");
    }
    if (l == "le" || l == "quantile") {
      return Status::InvalidArgument("label name " + Quoted(l) +
                                     " is reserved by the exposition format; choose another");
    }
    for (std::string_view high : kHighCardinalityLabels) {
      if (l == high) {
        return Status::InvalidArgument(
            "label " + Quoted(l) +
            " would make one time series per value (sample ids, paths, chunk ids and pod names "
            "are unbounded); count them in an unlabelled metric or by dataset instead");
      }
    }
    if (!seen.insert(l).second) {
      return Status::InvalidArgument("label name " + Quoted(l) + " is given twice");
    }
  }
  return Status::Ok();
}

// ---- MetricFamily, MetricRegistrar ----

template <typename T>
Result<T*> MetricFamily<T>::WithLabels(const std::vector<std::string>& label_values) const {
  if (family_ == nullptr) {
    return Status::FailedPrecondition(
        "a metric family was used before it was declared; declare it with MetricRegistrar");
  }
  const std::string what = "metric " + Quoted(family_->GetName());
  if (label_values.size() != label_names_.size()) {
    return Status::InvalidArgument(what + ": " + std::to_string(label_values.size()) +
                                   " label values for " + std::to_string(label_names_.size()) +
                                   " labels; give one value per label, in declaration order");
  }
  prometheus::Labels labels;
  for (size_t i = 0; i < label_values.size(); ++i) {
    const std::string& v = label_values[i];
    if (v.empty() || v.size() > kMaxLabelValueBytes) {
      return Status::InvalidArgument(what + ": value " + Quoted(v) + " of label " +
                                     Quoted(label_names_[i]) + " must be 1.." +
                                     std::to_string(kMaxLabelValueBytes) + " bytes");
    }
    labels.emplace(label_names_[i], v);
  }
  try {
    if constexpr (std::is_same_v<T, prometheus::Histogram>) {
      return &family_->Add(labels, buckets_);
    } else {
      return &family_->Add(labels);
    }
  } catch (const std::exception& e) {
    return Status::InvalidArgument(what + ": add the metric for these labels: " + e.what());
  }
}

template class MetricFamily<prometheus::Counter>;
template class MetricFamily<prometheus::Gauge>;
template class MetricFamily<prometheus::Histogram>;

namespace {

template <typename T>
MetricKind KindOf() {
  if constexpr (std::is_same_v<T, prometheus::Counter>) {
    return MetricKind::kCounter;
  } else if constexpr (std::is_same_v<T, prometheus::Gauge>) {
    return MetricKind::kGauge;
  } else {
    return MetricKind::kHistogram;
  }
}

// Checks the name, help and labels, then registers the family. prometheus-cpp
// throws on a name it rejects or one held by another type: caught here.
template <typename T>
Result<prometheus::Family<T>*> Declare(prometheus::Registry& registry, std::string_view component,
                                       std::string_view name, std::string_view help,
                                       const std::vector<std::string>& label_names) {
  GRANARY_RETURN_IF_ERROR(CheckMetricName(name, component, KindOf<T>()));
  const std::string what = "declare " + std::string(KindName(KindOf<T>())) + " " + Quoted(name);
  if (help.empty()) {
    return Status::InvalidArgument(what + ": no help text; say what it counts or measures");
  }
  GRANARY_RETURN_IF_ERROR(CheckLabelNames(label_names).WithContext(what));
  try {
    const std::string n(name);
    const std::string h(help);
    if constexpr (std::is_same_v<T, prometheus::Counter>) {
      return &prometheus::BuildCounter().Name(n).Help(h).Register(registry);
    } else if constexpr (std::is_same_v<T, prometheus::Gauge>) {
      return &prometheus::BuildGauge().Name(n).Help(h).Register(registry);
    } else {
      return &prometheus::BuildHistogram().Name(n).Help(h).Register(registry);
    }
  } catch (const std::exception& e) {
    return Status::AlreadyExists(what + ": " + e.what() +
                                 "; a name has one type in a registry: rename one of them");
  }
}

template <typename T>
Result<T*> Single(Result<prometheus::Family<T>*> family,
                  const prometheus::Histogram::BucketBoundaries& buckets = {}) {
  if (!family.ok()) return family.status();
  try {
    if constexpr (std::is_same_v<T, prometheus::Histogram>) {
      return &(*family)->Add({}, buckets);
    } else {
      return &(*family)->Add({});
    }
  } catch (const std::exception& e) {
    return Status::Internal("metric " + Quoted((*family)->GetName()) + ": " + e.what());
  }
}

Status CheckHistogramBuckets(std::string_view name,
                             const prometheus::Histogram::BucketBoundaries& buckets) {
  return CheckBuckets(buckets).WithContext("declare histogram " + Quoted(name));
}

}  // namespace

Result<prometheus::Counter*> MetricRegistrar::AddCounter(std::string_view name,
                                                         std::string_view help) {
  return Single(Declare<prometheus::Counter>(registry_, component_, name, help, {}));
}

Result<prometheus::Gauge*> MetricRegistrar::AddGauge(std::string_view name, std::string_view help) {
  return Single(Declare<prometheus::Gauge>(registry_, component_, name, help, {}));
}

Result<prometheus::Histogram*> MetricRegistrar::AddHistogram(
    std::string_view name, std::string_view help, prometheus::Histogram::BucketBoundaries buckets) {
  GRANARY_RETURN_IF_ERROR(CheckHistogramBuckets(name, buckets));
  return Single(Declare<prometheus::Histogram>(registry_, component_, name, help, {}), buckets);
}

Result<MetricFamily<prometheus::Counter>> MetricRegistrar::AddCounterFamily(
    std::string_view name, std::string_view help, std::vector<std::string> label_names) {
  GRANARY_ASSIGN_OR_RETURN(
      prometheus::Family<prometheus::Counter> * family,
      Declare<prometheus::Counter>(registry_, component_, name, help, label_names));
  return MetricFamily<prometheus::Counter>(family, std::move(label_names), {});
}

Result<MetricFamily<prometheus::Gauge>> MetricRegistrar::AddGaugeFamily(
    std::string_view name, std::string_view help, std::vector<std::string> label_names) {
  GRANARY_ASSIGN_OR_RETURN(
      prometheus::Family<prometheus::Gauge> * family,
      Declare<prometheus::Gauge>(registry_, component_, name, help, label_names));
  return MetricFamily<prometheus::Gauge>(family, std::move(label_names), {});
}

Result<MetricFamily<prometheus::Histogram>> MetricRegistrar::AddHistogramFamily(
    std::string_view name, std::string_view help, std::vector<std::string> label_names,
    prometheus::Histogram::BucketBoundaries buckets) {
  GRANARY_RETURN_IF_ERROR(CheckHistogramBuckets(name, buckets));
  GRANARY_ASSIGN_OR_RETURN(
      prometheus::Family<prometheus::Histogram> * family,
      Declare<prometheus::Histogram>(registry_, component_, name, help, label_names));
  return MetricFamily<prometheus::Histogram>(family, std::move(label_names), std::move(buckets));
}

// ---- buckets ----

prometheus::Histogram::BucketBoundaries LatencyBucketsSeconds() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};
}

Result<prometheus::Histogram::BucketBoundaries> ExponentialBuckets(double start, double factor,
                                                                   size_t count) {
  const std::string what = "exponential buckets (start " + std::to_string(start) + ", factor " +
                           std::to_string(factor) + ", count " + std::to_string(count) + ")";
  if (!(std::isfinite(start) && start > 0)) {
    return Status::InvalidArgument(what + ": start must be a finite number above 0");
  }
  if (!(std::isfinite(factor) && factor > 1)) {
    return Status::InvalidArgument(what + ": factor must be a finite number above 1");
  }
  if (count < 1 || count > 64) return Status::InvalidArgument(what + ": count must be 1..64");
  prometheus::Histogram::BucketBoundaries b;
  b.reserve(count);
  double bound = start;
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(bound)) {
      return Status::InvalidArgument(what + ": bound " + std::to_string(i) +
                                     " overflows; use fewer buckets or a smaller factor");
    }
    b.push_back(bound);
    bound *= factor;
  }
  return b;
}

Status CheckBuckets(const prometheus::Histogram::BucketBoundaries& buckets) {
  if (buckets.empty()) {
    return Status::InvalidArgument(
        "no bucket bounds; use LatencyBucketsSeconds() or "
        "ExponentialBuckets()");
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (!std::isfinite(buckets[i])) {
      return Status::InvalidArgument("bucket bound " + std::to_string(i) +
                                     " is not finite (+Inf is added by the exposition)");
    }
    if (i > 0 && !(buckets[i] > buckets[i - 1])) {
      return Status::InvalidArgument("bucket bounds are not strictly increasing at " +
                                     std::to_string(i) + " (" + std::to_string(buckets[i - 1]) +
                                     " then " + std::to_string(buckets[i]) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace granary
