#include "granary/core/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "granary/core/byte_order.h"

// GRANARY_XXH3_BASELINE_ONLY (the Python module, which links no libxxhash):
// the inline XXH3 for every size; the same hash, without the vector paths.
#if defined(__x86_64__) && !defined(GRANARY_XXH3_BASELINE_ONLY)
// From Debian's libxxhash, built with xxh_x86dispatch.c; declared here
// because its header does not mix with XXH_INLINE_ALL.
extern "C" uint64_t XXH3_64bits_dispatch(const void* input, size_t length);
#endif

namespace granary {

// XXH3 over inputs longer than this takes its vectorised path: there the
// library's copy, which picks AVX2 or AVX-512 at run time (xxh_x86dispatch),
// beats the inline one, compiled for the x86-64 baseline (SSE2). Shorter
// inputs stay inline (no call, and no vector code to choose). Both compute
// the same XXH3, so stored checksums do not change.
constexpr size_t kDispatchAbove = 1024;

uint64_t Checksum64(const void* data, size_t size) {
#if defined(__x86_64__) && !defined(GRANARY_XXH3_BASELINE_ONLY)
  if (size > kDispatchAbove) return XXH3_64bits_dispatch(data, size);
#endif
  return XXH3_64bits(data, size);
}

uint64_t Hash64(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}

ContentId ContentId::Of(std::string_view bytes) {
  XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return ContentId{h.high64, h.low64};
}

std::string ContentId::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[static_cast<size_t>(15 - i)] = kDigits[(high >> (4 * i)) & 0xf];
    s[static_cast<size_t>(31 - i)] = kDigits[(low >> (4 * i)) & 0xf];
  }
  return s;
}

Result<ContentId> ContentId::Parse(std::string_view hex) {
  if (hex.size() != 32) {
    return Status::InvalidArgument("content id '" + std::string(hex) +
                                   "' must be 32 hex digits, got " + std::to_string(hex.size()));
  }
  ContentId id;
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    uint64_t d;
    if (c >= '0' && c <= '9') {
      d = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      d = static_cast<uint64_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      d = static_cast<uint64_t>(c - 'A' + 10);
    } else {
      return Status::InvalidArgument("content id '" + std::string(hex) +
                                     "' has a non-hex character at position " + std::to_string(i));
    }
    uint64_t& half = i < 16 ? id.high : id.low;
    half = (half << 4) | d;
  }
  return id;
}

std::array<uint8_t, 16> ContentId::ToBytes() const {
  std::array<uint8_t, 16> b{};
  StoreLe(b.data(), low);
  StoreLe(b.data() + 8, high);
  return b;
}

ContentId ContentId::FromBytes(const uint8_t* bytes16) {
  return ContentId{LoadLe<uint64_t>(bytes16 + 8), LoadLe<uint64_t>(bytes16)};
}

ContentHasher::ContentHasher() : state_(XXH3_createState()) {
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}

ContentHasher::~ContentHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void ContentHasher::Update(std::string_view bytes) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), bytes.data(), bytes.size());
}

ContentId ContentHasher::Finish() const {
  XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  return ContentId{h.high64, h.low64};
}

}  // namespace granary
