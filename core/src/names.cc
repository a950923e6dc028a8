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

}  // namespace granary
