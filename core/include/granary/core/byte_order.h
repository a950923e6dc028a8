#pragma once

// Little-endian encoding of fixed-width integers for Granary's on-disk and wire
// formats. Every format is little-endian byte by byte (docs/formats.md), whatever
// the host; these helpers are the only place that knows how.
//
// Thread safety: pure functions.

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace granary {

namespace detail {
template <typename U>
inline U ByteSwap(U u) {
  if constexpr (sizeof(U) == 1)
    return u;
  else if constexpr (sizeof(U) == 2)
    return __builtin_bswap16(u);
  else if constexpr (sizeof(U) == 4)
    return __builtin_bswap32(u);
  else
    return __builtin_bswap64(u);
}
}  // namespace detail

template <typename T>
requires std::is_integral_v<T>
inline void StoreLe(void* dst, T v) {
  using U = std::make_unsigned_t<T>;
  U u = static_cast<U>(v);
  if constexpr (std::endian::native == std::endian::big) u = detail::ByteSwap(u);
  std::memcpy(dst, &u, sizeof(U));
}

template <typename T>
requires std::is_integral_v<T>
inline T LoadLe(const void* src) {
  using U = std::make_unsigned_t<T>;
  U u;
  std::memcpy(&u, src, sizeof(U));
  if constexpr (std::endian::native == std::endian::big) u = detail::ByteSwap(u);
  return static_cast<T>(u);
}

// Appends fixed-width little-endian values and raw bytes to a string buffer.
class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}

  template <typename T>
  requires std::is_integral_v<T>
  void Put(T v) {
    char buf[sizeof(T)];
    StoreLe(buf, v);
    out_->append(buf, sizeof(T));
  }
  void PutBytes(std::string_view bytes) { out_->append(bytes); }
  size_t size() const { return out_->size(); }

 private:
  std::string* out_;
};

// Reads fixed-width little-endian values from a byte range. Every read is
// bounds-checked: past the end, it returns false and the reader stays failed,
// so a parser can read a whole record and check ok() once.
class ByteReader {
 public:
  explicit ByteReader(std::string_view data) : data_(data) {}

  template <typename T>
  requires std::is_integral_v<T>
  bool Get(T* v) {
    if (!ok_ || data_.size() - pos_ < sizeof(T)) return Fail();
    *v = LoadLe<T>(data_.data() + pos_);
    pos_ += sizeof(T);
    return true;
  }
  bool GetBytes(size_t n, std::string_view* bytes) {
    if (!ok_ || data_.size() - pos_ < n) return Fail();
    *bytes = data_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool Skip(size_t n) {
    if (!ok_ || data_.size() - pos_ < n) return Fail();
    pos_ += n;
    return true;
  }

  bool ok() const { return ok_; }
  size_t position() const { return pos_; }
  size_t remaining() const { return data_.size() - pos_; }

 private:
  bool Fail() {
    ok_ = false;
    return false;
  }
  std::string_view data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Appends `bytes` to a frame buffer `s` that will end up `final_size` bytes
// (the length a header announced, itself within the receiver's limits),
// growing at most geometrically and never past final_size: a header that
// announces a large body costs nothing until the bytes actually arrive.
inline void AppendWithin(std::string* s, std::string_view bytes, size_t final_size) {
  const size_t needed = s->size() + bytes.size();
  if (needed > s->capacity()) {
    std::string grown;
    grown.reserve(std::min(final_size, std::max(needed, 2 * s->capacity())));
    grown.append(*s);
    s->swap(grown);
  }
  s->append(bytes);
}

}  // namespace granary
