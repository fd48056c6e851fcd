// dcr/detail/bitpack.hpp: packed bit fields of the payload format (implementation only).
//
// Fields are packed least significant bit first: the first field occupies the low bits of the
// first byte, each field's bits go in order of significance, and a field may span bytes. The last
// byte's unused high bits are padding and must be zero. Writers and readers work through a 64-bit
// accumulator, so a field of up to 64 bits costs a few integer operations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dcr/config.hpp"
#include "dcr/detail/varint.hpp"

namespace dcr::detail {

/// Bytes that `bits` packed bits occupy.
[[nodiscard]] constexpr std::uint64_t packed_bytes(std::uint64_t bits) noexcept {
  return bits / 8 + (bits % 8 != 0 ? 1 : 0);
}

/// Appends fields to a buffer the caller sized to packed_bytes(total bits) + 8 bytes: it writes
/// 8 bytes at a time, so up to 8 bytes past the packed end are scratch; finish() returns the
/// packed end. Branch-free for fields of up to 56 bits.
class bit_writer {
 public:
  /// Slack a buffer needs beyond the packed bytes.
  static constexpr std::size_t slack = 8;

  explicit bit_writer(std::byte* out) noexcept : p_(out) {}

  /// Appends the low `k` bits of `v` (0 <= k <= 64; bits of `v` above k must be zero).
  DCR_FORCE_INLINE void put(std::uint64_t v, unsigned k) noexcept {
    if (k > 56) [[unlikely]] {
      put_short(v & 0xffffffffu, 32);
      v >>= 32;
      k -= 32;
    }
    put_short(v, k);
  }

  /// Writes the remaining bits, padding the last byte with zeros; returns the packed end.
  std::byte* finish() noexcept {
    store_le<std::uint64_t>(p_, acc_);
    return p_ + (n_ + 7) / 8;
  }

 private:
  DCR_FORCE_INLINE void put_short(std::uint64_t v, unsigned k) noexcept {  // k <= 56, n_ <= 7
    acc_ |= v << n_;
    n_ += k;
    store_le<std::uint64_t>(p_, acc_);
    p_ += n_ >> 3;
    acc_ >>= n_ & ~7u;
    n_ &= 7;
  }

  std::byte* p_;
  std::uint64_t acc_ = 0;
  unsigned n_ = 0;  // bits held in acc_ (< 8 between calls)
};

/// Reads fields from [begin, end). The caller knows how many bits the fields take and has checked
/// that the bytes hold them; reading past `end` yields zero bits, never a read out of bounds.
class bit_reader {
 public:
  bit_reader(const std::byte* begin, const std::byte* end) noexcept : p_(begin), end_(end) {}

  /// The next `k` bits (0 <= k <= 64) as an integer.
  [[nodiscard]] DCR_FORCE_INLINE std::uint64_t get(unsigned k) noexcept {
    if (k <= 56) return get_short(k);
    const std::uint64_t low = get_short(32);
    return low | get_short(k - 32) << 32;
  }

 private:
  DCR_FORCE_INLINE std::uint64_t get_short(unsigned k) noexcept {  // k <= 56
    if (n_ < k) refill();
    const std::uint64_t v = acc_ & ((std::uint64_t{1} << k) - 1);
    acc_ >>= k;
    n_ -= k;
    return v;
  }
  void refill() noexcept {  // leaves at least 57 bits, or every byte left
    if (end_ - p_ >= 8) {
      acc_ |= load_le<std::uint64_t>(p_) << n_;
      p_ += (63 - n_) >> 3;
      n_ |= 56;
    } else {
      while (n_ <= 56 && p_ != end_) {
        acc_ |= std::uint64_t{std::to_integer<std::uint8_t>(*p_++)} << n_;
        n_ += 8;
      }
      if (n_ < 57) n_ = 64;  // past the end: zeros
    }
  }

  const std::byte* p_;
  const std::byte* end_;
  std::uint64_t acc_ = 0;
  unsigned n_ = 0;
};

}  // namespace dcr::detail
