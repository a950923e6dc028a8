#include "granary/core/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iomanip>
#include <iterator>
#include <limits>
#include <sstream>

#include "granary/core/file.h"

namespace granary {
namespace {

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

// Splits "16 MiB" into the number and the unit; false if the number is malformed.
bool SplitNumber(std::string_view text, double* number, std::string* unit) {
  std::string t = Trim(text);
  size_t end = 0;
  while (end < t.size() && (std::isdigit(static_cast<unsigned char>(t[end])) || t[end] == '.')) {
    ++end;
  }
  if (end == 0) return false;
  std::string num = t.substr(0, end);
  if (std::count(num.begin(), num.end(), '.') > 1) return false;
  try {
    *number = std::stod(num);
  } catch (...) {
    return false;
  }
  *unit = Trim(std::string_view(t).substr(end));
  return true;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] =
          std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  std::ostringstream s;
  if (unit == 0) {
    s << bytes << " B";
  } else {
    s << std::fixed << std::setprecision(value < 10 ? 2 : 1) << value << " " << kUnits[unit];
  }
  return s.str();
}

Result<ByteSize> ParseByteSize(std::string_view text) {
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1},
      {"B", 1},
      {"K", 1024.0},
      {"KiB", 1024.0},
      {"k", 1024.0},
      {"M", 1048576.0},
      {"MiB", 1048576.0},
      {"G", 1073741824.0},
      {"GiB", 1073741824.0},
      {"T", 1099511627776.0},
      {"TiB", 1099511627776.0},
      {"KB", 1e3},
      {"kB", 1e3},
      {"MB", 1e6},
      {"GB", 1e9},
      {"TB", 1e12},
  };
  auto bad = [&] {
    return Status::InvalidArgument("'" + std::string(text) +
                                   "' is not a byte size; write a number with an optional unit "
                                   "(B, KiB, MiB, GiB, TiB or KB, MB, GB, TB), e.g. 16MiB");
  };
  double number = 0;
  std::string unit;
  if (!SplitNumber(text, &number, &unit)) return bad();
  for (const auto& [name, factor] : kUnits) {
    if (unit == name) {
      double bytes = std::round(number * factor);
      if (bytes >= 18446744073709549568.0) return bad();
      return ByteSize{static_cast<uint64_t>(bytes)};
    }
  }
  return bad();
}

Result<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1000.0}, {"ms", 1.0}, {"s", 1000.0}, {"m", 60000.0}, {"h", 3600000.0}};
  auto bad = [&] {
    return Status::InvalidArgument("'" + std::string(text) +
                                   "' is not a duration; write a number with a unit (ms, s, m, "
                                   "h), e.g. 500ms or 5s");
  };
  double number = 0;
  std::string unit;
  if (!SplitNumber(text, &number, &unit)) return bad();
  for (const auto& [name, factor] : kUnits) {
    if (unit == name) {
      double ms = std::round(number * factor);
      if (ms > 1e15) return bad();
      return std::chrono::milliseconds(static_cast<int64_t>(ms));
    }
  }
  return bad();
}

struct ConfigMap::Rep {
  YAML::Node node;
  std::string source;  // file name for messages
  std::string path;    // key path of this map, "" at the top
  mutable std::set<std::string, std::less<>> seen;

  std::string KeyPath(std::string_view key) const {
    return path.empty() ? std::string(key) : path + "." + std::string(key);
  }
  std::string WhereNode(const YAML::Node& n) const {
    int line = n.Mark().line;
    return source + (line >= 0 ? ":" + std::to_string(line + 1) : std::string());
  }
};

ConfigMap::ConfigMap(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}
ConfigMap::ConfigMap(ConfigMap&&) noexcept = default;
ConfigMap& ConfigMap::operator=(ConfigMap&&) noexcept = default;
ConfigMap::~ConfigMap() = default;

Result<ConfigMap> ConfigMap::FromText(std::string_view yaml, std::string source_name) {
  auto rep = std::make_unique<Rep>();
  rep->source = std::move(source_name);
  try {
    rep->node = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(rep->source + ":" + std::to_string(e.mark.line + 1) +
                                   ": not valid YAML: " + e.msg);
  }
  if (rep->node.IsNull()) rep->node = YAML::Node(YAML::NodeType::Map);  // empty file
  if (!rep->node.IsMap()) {
    return Status::InvalidArgument(rep->source +
                                   ": the top level must be a mapping of keys "
                                   "to values");
  }
  return ConfigMap(std::move(rep));
}

Result<ConfigMap> ConfigMap::FromFile(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return text.status().WithContext("read config");
  return FromText(*text, path);
}

bool ConfigMap::Has(std::string_view key) const {
  const YAML::Node& map = rep_->node;
  return map[std::string(key)].IsDefined();
}

std::string ConfigMap::Where(std::string_view key) const {
  const YAML::Node& map = rep_->node;
  YAML::Node n = map[std::string(key)];
  return (n.IsDefined() ? rep_->WhereNode(n) : rep_->WhereNode(rep_->node)) + ": key '" +
         rep_->KeyPath(key) + "'";
}

Status ConfigMap::Read(std::string_view key, bool required,
                       const std::function<Status(const YAML::Node&)>& read) {
  rep_->seen.emplace(key);
  const YAML::Node& map = rep_->node;
  YAML::Node n = map[std::string(key)];
  if (!n.IsDefined() || n.IsNull()) {
    if (!required) return Status::Ok();
    return Status::InvalidArgument(rep_->WhereNode(rep_->node) + ": missing required key '" +
                                   rep_->KeyPath(key) + "'");
  }
  Status s;
  try {
    s = read(n);
  } catch (const YAML::Exception& e) {
    s = Status::InvalidArgument(e.msg);
  }
  if (!s.ok()) return Status(s.code(), Where(key) + ": " + s.message());
  return Status::Ok();
}

namespace {

Status ScalarText(const YAML::Node& n, std::string* out) {
  if (!n.IsScalar()) return Status::InvalidArgument("expected a single value, not a list or map");
  *out = n.Scalar();
  return Status::Ok();
}

template <typename Int>
Status ReadInt(const YAML::Node& n, Int* out) {
  std::string text;
  GRANARY_RETURN_IF_ERROR(ScalarText(n, &text));
  Int v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range) {
    return Status::InvalidArgument("'" + text + "' is out of range (" +
                                   std::to_string(std::numeric_limits<Int>::min()) + " to " +
                                   std::to_string(std::numeric_limits<Int>::max()) + ")");
  }
  if (ec != std::errc() || end != text.data() + text.size()) {
    return Status::InvalidArgument("'" + text + "' is not a whole number");
  }
  *out = v;
  return Status::Ok();
}

Status ReadValue(const YAML::Node& n, std::string* out) { return ScalarText(n, out); }
Status ReadValue(const YAML::Node& n, int* out) { return ReadInt(n, out); }
Status ReadValue(const YAML::Node& n, int64_t* out) { return ReadInt(n, out); }
Status ReadValue(const YAML::Node& n, uint32_t* out) { return ReadInt(n, out); }
Status ReadValue(const YAML::Node& n, uint64_t* out) { return ReadInt(n, out); }

Status ReadValue(const YAML::Node& n, bool* out) {
  std::string text;
  GRANARY_RETURN_IF_ERROR(ScalarText(n, &text));
  if (text == "true" || text == "yes" || text == "on") {
    *out = true;
  } else if (text == "false" || text == "no" || text == "off") {
    *out = false;
  } else {
    return Status::InvalidArgument("'" + text + "' is not a boolean; use true or false");
  }
  return Status::Ok();
}

Status ReadValue(const YAML::Node& n, double* out) {
  std::string text;
  GRANARY_RETURN_IF_ERROR(ScalarText(n, &text));
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v)) {
    return Status::InvalidArgument("'" + text + "' is not a number");
  }
  *out = v;
  return Status::Ok();
}

Status ReadValue(const YAML::Node& n, ByteSize* out) {
  std::string text;
  GRANARY_RETURN_IF_ERROR(ScalarText(n, &text));
  GRANARY_ASSIGN_OR_RETURN(*out, ParseByteSize(text));
  return Status::Ok();
}

Status ReadValue(const YAML::Node& n, std::chrono::milliseconds* out) {
  std::string text;
  GRANARY_RETURN_IF_ERROR(ScalarText(n, &text));
  GRANARY_ASSIGN_OR_RETURN(*out, ParseDuration(text));
  return Status::Ok();
}

Status ReadValue(const YAML::Node& n, std::vector<std::string>* out) {
  if (!n.IsSequence()) return Status::InvalidArgument("expected a list, e.g. [a, b]");
  std::vector<std::string> v;
  for (const auto& item : n) {
    std::string s;
    GRANARY_RETURN_IF_ERROR(ScalarText(item, &s));
    v.push_back(std::move(s));
  }
  *out = std::move(v);
  return Status::Ok();
}

}  // namespace

template <typename T>
Status ConfigMap::Required(std::string_view key, T* out) {
  return Read(key, true, [out](const YAML::Node& n) { return ReadValue(n, out); });
}

template <typename T>
Status ConfigMap::Optional(std::string_view key, T* out) {
  return Read(key, false, [out](const YAML::Node& n) { return ReadValue(n, out); });
}

#define GRANARY_CONFIG_TYPE(T)                                  \
  template Status ConfigMap::Required<T>(std::string_view, T*); \
  template Status ConfigMap::Optional<T>(std::string_view, T*);
GRANARY_CONFIG_TYPE(std::string)
GRANARY_CONFIG_TYPE(bool)
GRANARY_CONFIG_TYPE(int)
GRANARY_CONFIG_TYPE(int64_t)
GRANARY_CONFIG_TYPE(uint32_t)
GRANARY_CONFIG_TYPE(uint64_t)
GRANARY_CONFIG_TYPE(double)
GRANARY_CONFIG_TYPE(ByteSize)
GRANARY_CONFIG_TYPE(std::chrono::milliseconds)
GRANARY_CONFIG_TYPE(std::vector<std::string>)
#undef GRANARY_CONFIG_TYPE

Status ConfigMap::Section(std::string_view key, const std::function<Status(ConfigMap&)>& parse,
                          bool required) {
  rep_->seen.emplace(key);
  const YAML::Node& map = rep_->node;
  YAML::Node n = map[std::string(key)];
  if (!n.IsDefined() || n.IsNull()) {
    if (!required) return Status::Ok();
    return Status::InvalidArgument(rep_->WhereNode(rep_->node) + ": missing required section '" +
                                   rep_->KeyPath(key) + "'");
  }
  if (!n.IsMap()) {
    return Status::InvalidArgument(Where(key) + ": expected a mapping of keys to values");
  }
  auto rep = std::make_unique<Rep>();
  rep->node = n;
  rep->source = rep_->source;
  rep->path = rep_->KeyPath(key);
  ConfigMap section(std::move(rep));
  // Errors from inside already say where they are.
  GRANARY_RETURN_IF_ERROR(parse(section));
  return section.Finish();
}

Status ConfigMap::Finish() const {
  for (const auto& kv : rep_->node) {
    std::string key = kv.first.Scalar();
    if (rep_->seen.count(key) != 0) continue;
    std::string msg = rep_->WhereNode(kv.first) + ": unknown key '" + key + "'";
    if (!rep_->path.empty()) msg += " in '" + rep_->path + "'";
    std::string best;
    size_t best_d = 3;  // suggest only close matches
    for (const auto& known : rep_->seen) {
      size_t d = EditDistance(key, known);
      if (d < best_d) {
        best_d = d;
        best = known;
      }
    }
    if (!best.empty()) {
      msg += " (did you mean '" + best + "'?)";
    } else {
      msg += "; known keys:";
      for (const auto& known : rep_->seen) msg += " " + known;
    }
    return Status::InvalidArgument(msg);
  }
  return Status::Ok();
}

}  // namespace granary
