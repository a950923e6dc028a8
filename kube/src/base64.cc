#include "granary/kube/base64.h"

#include <openssl/evp.h>

#include <cctype>

namespace granary::kube {

std::string Base64Encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()),
                                static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Result<std::string> Base64Decode(std::string_view text, const std::string& what) {
  std::string clean;
  clean.reserve(text.size());
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c)) == 0) clean.push_back(c);
  }
  if (clean.size() % 4 != 0) {
    return Status::InvalidArgument(what + " is not base64 (its length is not a multiple of 4)");
  }
  std::string out(clean.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(clean.data()),
                                static_cast<int>(clean.size()));
  if (n < 0) return Status::InvalidArgument(what + " is not base64");
  // EVP_DecodeBlock counts padding bytes as output: drop them.
  size_t size = static_cast<size_t>(n);
  if (!clean.empty() && clean.back() == '=') --size;
  if (clean.size() >= 2 && clean[clean.size() - 2] == '=') --size;
  out.resize(size);
  return out;
}

}  // namespace granary::kube
