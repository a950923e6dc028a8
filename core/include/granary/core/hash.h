#pragma once

// Hashes used by Granary's formats and placement, all from xxHash (XXH3).
// They are part of the formats: never change what a function computes.
//
// Thread safety: pure functions.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "granary/core/status.h"

namespace granary {

// XXH3 64-bit, seed 0: per-sample and per-chunk checksums.
uint64_t Checksum64(const void* data, size_t size);
inline uint64_t Checksum64(std::string_view bytes) {
  return Checksum64(bytes.data(), bytes.size());
}

// XXH3 64-bit with a seed: placement scores, hash tables.
uint64_t Hash64(const void* data, size_t size, uint64_t seed);
inline uint64_t Hash64(std::string_view bytes, uint64_t seed = 0) {
  return Hash64(bytes.data(), bytes.size(), seed);
}

// A 128-bit content identifier (XXH3-128), e.g. a manifest id. Printed as 32
// lowercase hex digits, high half first.
struct ContentId {
  uint64_t high = 0;
  uint64_t low = 0;

  static ContentId Of(std::string_view bytes);
  static Result<ContentId> Parse(std::string_view hex);
  std::string ToHex() const;
  // The 16 bytes as stored in formats: low half then high half, each little-endian.
  std::array<uint8_t, 16> ToBytes() const;
  static ContentId FromBytes(const uint8_t* bytes16);

  bool IsZero() const { return high == 0 && low == 0; }
  friend bool operator==(const ContentId&, const ContentId&) = default;
};

// Incremental XXH3-128 over several pieces, equal to ContentId::Of(concatenation).
class ContentHasher {
 public:
  ContentHasher();
  ~ContentHasher();
  ContentHasher(const ContentHasher&) = delete;
  ContentHasher& operator=(const ContentHasher&) = delete;

  void Update(std::string_view bytes);
  ContentId Finish() const;

 private:
  void* state_;  // XXH3_state_t, kept out of this header
};

}  // namespace granary
