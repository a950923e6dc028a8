// Checksum64 is XXH3-64 at every size: the inline path (short inputs) and the
// library's run-time dispatched one (AVX2/AVX-512, long inputs) must agree
// with the values every stored chunk file and wire item already carries.

#include "granary/core/hash.h"

#include <gtest/gtest.h>

#include <string>

namespace granary {
namespace {

std::string Pattern(size_t n) {
  std::string b(n, '\0');
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<char>(i * 131 + 7);
  return b;
}

TEST(HashTest, Checksum64IsXxh3OnBothSidesOfTheDispatchThreshold) {
  // XXH3_64bits of Pattern(n), from xxHash's reference (inline, scalar) code.
  const std::pair<size_t, uint64_t> pinned[] = {
      {0, 0x2d06800538d394c2ull},      {1, 0x4c5cca45d0f4811full},    {240, 0xb6cfaf343fab81e6ull},
      {1024, 0x70bd377d9574f4bbull},   {1025, 0x66c4487c41e127a7ull}, {4096, 0x9ddd66c14af0daffull},
      {112640, 0x3b1f91cae91c3245ull},
  };
  for (const auto& [n, want] : pinned) {
    const std::string b = Pattern(n);
    EXPECT_EQ(Checksum64(b.data(), b.size()), want) << n << " bytes";
  }
}

TEST(HashTest, Checksum64OfUnalignedLongInputs) {
  // The vector paths load unaligned data: every start offset gives the value
  // of the same bytes copied to an aligned buffer.
  const std::string big = Pattern(70'000);
  for (size_t offset = 0; offset < 64; ++offset) {
    const std::string copy = big.substr(offset, 65'000);
    EXPECT_EQ(Checksum64(big.data() + offset, 65'000), Checksum64(copy.data(), copy.size()))
        << offset;
  }
}

}  // namespace
}  // namespace granary
