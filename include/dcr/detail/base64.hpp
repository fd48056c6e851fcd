// dcr/detail/base64.hpp: base64 (RFC 4648 section 4, the standard alphabet with '=' padding),
// the coding of protobuf `bytes` fields in JSON, which etcd's gateway uses for every key and
// value (implementation only).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dcr::detail {

/// `bytes` as base64 with padding: 4 characters per 3 bytes, rounded up.
inline std::string base64_encode(std::string_view bytes) {
  static constexpr char alphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t v = std::uint32_t(std::uint8_t(bytes[i])) << 16 |
                            std::uint32_t(std::uint8_t(bytes[i + 1])) << 8 |
                            std::uint32_t(std::uint8_t(bytes[i + 2]));
    out += alphabet[v >> 18];
    out += alphabet[(v >> 12) & 63];
    out += alphabet[(v >> 6) & 63];
    out += alphabet[v & 63];
  }
  if (const std::size_t rest = bytes.size() - i; rest != 0) {
    std::uint32_t v = std::uint32_t(std::uint8_t(bytes[i])) << 16;
    if (rest == 2) v |= std::uint32_t(std::uint8_t(bytes[i + 1])) << 8;
    out += alphabet[v >> 18];
    out += alphabet[(v >> 12) & 63];
    out += rest == 2 ? alphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

/// The bytes `text` encodes, or nullopt if it is not base64. Accepts the standard and the
/// URL-safe alphabet ('-', '_'; protobuf's JSON mapping allows either), with or without
/// padding; rejects any other character, misplaced padding, a length of 1 mod 4 and non-zero
/// bits after the last byte (so every byte string has exactly one accepted padded encoding per
/// alphabet).
inline std::optional<std::string> base64_decode(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  if (text.size() % 4 == 0 && !text.empty()) {  // strip the padding (at most two '=')
    std::size_t pad = 0;
    while (pad < 2 && text[text.size() - 1 - pad] == '=') ++pad;
    text.remove_suffix(pad);
  }
  if (text.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3 + 2);
  std::uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    const int v = value(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | std::uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  if ((acc & ((1u << bits) - 1)) != 0) return std::nullopt;  // stray low bits
  return out;
}

}  // namespace dcr::detail
