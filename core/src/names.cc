#include "granary/core/names.h"

#include <algorithm>

namespace granary {
namespace {

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

}  // namespace

bool IsDnsLabel(std::string_view name) {
  if (name.empty() || name.size() > kMaxDnsLabelLength) return false;
  if (!IsLowerAlnum(name.front()) || !IsLowerAlnum(name.back())) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return IsLowerAlnum(c) || c == '-'; });
}

std::string Quoted(std::string_view s) {
  constexpr size_t kMaxShown = 80;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  size_t shown = std::min(s.size(), kMaxShown);
  for (size_t i = 0; i < shown; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  if (s.size() > kMaxShown) out += "...(" + std::to_string(s.size()) + " bytes)";
  out += "'";
  return out;
}

Status ValidateSamplePath(std::string_view path) {
  const auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("sample path " + Quoted(path) + " " + std::string(why) +
                                   "; name a file relative to the dataset root, e.g. "
                                   "'train/cat/1.jpg'");
  };
  if (path.empty()) return bad("is empty");
  if (path.size() > kMaxSamplePathLength) {
    return bad("is longer than " + std::to_string(kMaxSamplePathLength) + " bytes");
  }
  if (path.front() == '/') return bad("is absolute");
  if (path.find('\0') != std::string_view::npos) return bad("holds a NUL byte");
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find('/', begin);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(begin, end - begin);
    if (part.empty()) return bad("has an empty component ('//' or a trailing '/')");
    if (part == ".") return bad("has a '.' component");
    if (part == "..") return bad("has a '..' component (paths never leave the dataset root)");
    begin = end + 1;
  }
  return Status::Ok();
}

namespace {

Status ValidateDnsLabel(std::string_view value, std::string_view what) {
  if (IsDnsLabel(value)) return Status::Ok();
  return Status::InvalidArgument(std::string(what) + " " + Quoted(value) +
                                 " is not a DNS-1123 label: use 1 to 63 lowercase letters, "
                                 "digits or '-', starting and ending with a letter or digit "
                                 "(e.g. 'imagenet-train')");
}

// [A-Za-z0-9._-], starting with an alphanumeric, 1..max_len.
Status ValidateToken(std::string_view value, size_t max_len, std::string_view what) {
  bool ok = !value.empty() && value.size() <= max_len && IsAsciiAlnum(value.front());
  for (char c : value) ok = ok && (IsAsciiAlnum(c) || c == '.' || c == '_' || c == '-');
  if (ok) return Status::Ok();
  return Status::InvalidArgument(std::string(what) + " " + Quoted(value) +
                                 " is invalid: use 1 to " + std::to_string(max_len) +
                                 " letters, digits, '.', '_' or '-', starting with a letter or "
                                 "digit");
}

}  // namespace

Status ValidateDatasetName(std::string_view name) { return ValidateDnsLabel(name, "dataset name"); }

Status ValidatePoolName(std::string_view pool) { return ValidateDnsLabel(pool, "pool name"); }

Status ValidateNodeId(std::string_view id) { return ValidateToken(id, 253, "node id"); }

Status ValidatePlanId(std::string_view id) { return ValidateToken(id, 128, "plan id"); }

Status ValidateManifestId(std::string_view id) {
  bool ok = !id.empty() && id.size() <= 128;
  for (char c : id) ok = ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
  if (ok) return Status::Ok();
  return Status::InvalidArgument("manifest id " + Quoted(id) +
                                 " is invalid: use the manifest's content id, 1 to 128 lowercase "
                                 "hex digits");
}

}  // namespace granary
