#pragma once

// Philox4x32-10 and what plans build on it: a stream of 32-bit draws, unbiased
// bounded integers and a Fisher–Yates shuffle, all defined bit for bit so that
// every platform, compiler and language binding computes the same permutations.
// The sample order of a training epoch is a function of these and nothing else
// (no std::shuffle, std::uniform_int_distribution or std::mt19937, whose output
// differs between standard libraries).
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): a counter-based generator; output = bijection(counter) keyed by key.
// Ten rounds over a 4×32-bit counter with a 2×32-bit key; round i (0..9) is
//   (hi0, lo0) = 0xD2511F53 · c0,  (hi1, lo1) = 0xCD9E8D57 · c2   (32×32→64)
//   c = (hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0)
// and the key is bumped by (0x9E3779B9, 0xBB67AE85) before rounds 1..9. This is
// Random123's philox4x32 with R = 10, checked against its known-answer vectors.
//
// PhiloxStream: draws from counter (c0, c1, c2, c3) = (block, sub, epoch, stream)
// and key (k0, k1) = (seed & 0xffffffff, seed >> 32); block 0, 1, 2, ... each give
// four draws, used in order x0, x1, x2, x3. `stream` names the use (plan.h) and
// `sub` separates independent sequences of one use. A sequence has 2^34 draws
// before `block` wraps; a shuffle of n < 2^32 items needs about n, at most
// ~1.5·2^32 on average, so no plan comes near it.
//
// UniformBelow(s), s >= 1: Lemire's multiply-and-reject ("Fast random integer
// generation in an interval", 2019) with 32-bit draws:
//   m = x · s (64-bit); l = m mod 2^32
//   if l < s: t = (2^32 − s) mod s; while l < t: draw a new x, m = x · s, l = m mod 2^32
//   return m >> 32
// Exactly uniform; draws one value except with probability < s / 2^32.
//
// Shuffle(a): Fisher–Yates from the back: for i = n−1 down to 1,
// j = UniformBelow(i + 1), swap(a[i], a[j]). n < 2^32.
//
// Thread safety: Philox4x32 is a pure function; a PhiloxStream is a value with
// state, to be used by one thread at a time (make one per thread).

#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace granary {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

constexpr PhiloxCounter Philox4x32(PhiloxCounter counter, PhiloxKey key) {
  constexpr uint64_t kM0 = 0xD2511F53;
  constexpr uint64_t kM1 = 0xCD9E8D57;
  constexpr uint32_t kW0 = 0x9E3779B9;
  constexpr uint32_t kW1 = 0xBB67AE85;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kW0;
      key[1] += kW1;
    }
    const uint64_t p0 = kM0 * counter[0];
    const uint64_t p1 = kM1 * counter[2];
    counter = {static_cast<uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<uint32_t>(p1),
               static_cast<uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<uint32_t>(p0)};
  }
  return counter;
}

class PhiloxStream {
 public:
  PhiloxStream(uint64_t seed, uint32_t stream, uint32_t epoch, uint32_t sub)
      : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
        sub_(sub),
        epoch_(epoch),
        stream_(stream) {}

  uint32_t Next32() {
    if (used_ == 4) {
      block_words_ = Philox4x32({block_, sub_, epoch_, stream_}, key_);
      ++block_;
      used_ = 0;
    }
    return block_words_[used_++];
  }

  // Uniform in [0, bound); bound >= 1.
  uint32_t UniformBelow(uint32_t bound) {
    assert(bound >= 1);
    uint64_t m = uint64_t{Next32()} * bound;
    uint32_t low = static_cast<uint32_t>(m);
    if (low < bound) {
      const uint32_t threshold = (0u - bound) % bound;  // 2^32 mod bound
      while (low < threshold) {
        m = uint64_t{Next32()} * bound;
        low = static_cast<uint32_t>(m);
      }
    }
    return static_cast<uint32_t>(m >> 32);
  }

  // Draws used so far (for tests and the design note's worked example).
  uint64_t draws() const { return uint64_t{block_} * 4 - 4 + static_cast<uint64_t>(used_); }

 private:
  PhiloxKey key_;
  uint32_t sub_;
  uint32_t epoch_;
  uint32_t stream_;
  uint32_t block_ = 0;
  PhiloxCounter block_words_{};
  size_t used_ = 4;
};

// Fisher–Yates as specified above; items.size() < 2^32.
template <typename T>
void Shuffle(std::span<T> items, PhiloxStream* rng) {
  assert(items.size() < (uint64_t{1} << 32));
  for (size_t i = items.size(); i > 1; --i) {
    const uint32_t j = rng->UniformBelow(static_cast<uint32_t>(i));
    std::swap(items[i - 1], items[j]);
  }
}

}  // namespace granary
