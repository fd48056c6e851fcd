// tests/codec/golden_corpus.hpp: what the golden generator (make_golden.cpp) and the golden test
// (test_golden.cpp) agree on: the sidecar vocabulary (names of dtypes, encodings, codings and
// error codes), words as hex strings, the registry as JSON, the base contents of the storage the
// test applies to, and a compact JSON layout for the sidecars. tests/golden/README.md describes
// the sidecar fields.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/options.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"

namespace dcr_golden {

using json = nlohmann::ordered_json;
using bytes_t = std::vector<std::byte>;

/// Subdirectories of the corpus root (tests/).
inline constexpr std::string_view golden_dir = "golden";
inline constexpr std::string_view errors_dir = "golden-errors";
inline constexpr std::string_view payload_ext = ".dcrp";
inline constexpr std::string_view sidecar_ext = ".json";

// ---- Names used in sidecars. Each table is the one spelling both programs read and write.

inline constexpr std::array<std::pair<dcr::encoding, std::string_view>, 3> encoding_names{{
    {dcr::encoding::overwrite, "overwrite"},
    {dcr::encoding::xor_mask, "xor_mask"},
    {dcr::encoding::ulp, "ulp"},
}};

inline constexpr std::array<std::pair<dcr::location_coding, std::string_view>, 4> location_names{{
    {dcr::location_coding::skip_varint, "skip_varint"},
    {dcr::location_coding::skip_buckets, "skip_buckets"},
    {dcr::location_coding::bitmap, "bitmap"},
    {dcr::location_coding::runs, "runs"},
}};

inline constexpr std::array<std::pair<dcr::value_coding, std::string_view>, 5> value_names{{
    {dcr::value_coding::raw, "raw"},
    {dcr::value_coding::byte_planes, "byte_planes"},
    {dcr::value_coding::zigzag_planes, "zigzag_planes"},
    {dcr::value_coding::buckets, "buckets"},
    {dcr::value_coding::zigzag_buckets, "zigzag_buckets"},
}};

inline constexpr std::array<std::pair<dcr::errc, std::string_view>, 22> errc_names{{
    {dcr::errc::ok, "ok"},
    {dcr::errc::invalid_argument, "invalid_argument"},
    {dcr::errc::shape_mismatch, "shape_mismatch"},
    {dcr::errc::dtype_mismatch, "dtype_mismatch"},
    {dcr::errc::out_of_range, "out_of_range"},
    {dcr::errc::corrupt_payload, "corrupt_payload"},
    {dcr::errc::truncated_payload, "truncated_payload"},
    {dcr::errc::unsupported_version, "unsupported_version"},
    {dcr::errc::reserved_bits_set, "reserved_bits_set"},
    {dcr::errc::stale_payload, "stale_payload"},
    {dcr::errc::duplicate_payload, "duplicate_payload"},
    {dcr::errc::unknown_tensor, "unknown_tensor"},
    {dcr::errc::unsupported_loader_path, "unsupported_loader_path"},
    {dcr::errc::commit_conflict, "commit_conflict"},
    {dcr::errc::transport_failure, "transport_failure"},
    {dcr::errc::io_error, "io_error"},
    {dcr::errc::verification_failed, "verification_failed"},
    {dcr::errc::fenced_attempt, "fenced_attempt"},
    {dcr::errc::not_ready, "not_ready"},
    {dcr::errc::overflow, "overflow"},
    {dcr::errc::device_error, "device_error"},
    {dcr::errc::registry_mismatch, "registry_mismatch"},
}};

/// The name of `v` in `table`; throws std::invalid_argument if it has none.
template <class T, std::size_t N>
std::string name_of(const std::array<std::pair<T, std::string_view>, N>& table, T v) {
  for (const auto& [value, name] : table)
    if (value == v) return std::string(name);
  throw std::invalid_argument("golden corpus: value " + std::to_string(static_cast<int>(v)) +
                              " has no sidecar name");
}

/// The value named `name` in `table`; throws std::invalid_argument naming `what` if none.
template <class T, std::size_t N>
T parse_name(const std::array<std::pair<T, std::string_view>, N>& table, std::string_view name,
             std::string_view what) {
  for (const auto& [value, n] : table)
    if (n == name) return value;
  throw std::invalid_argument("golden corpus: unknown " + std::string(what) + " '" +
                              std::string(name) + "'");
}

inline dcr::dtype parse_dtype_name(std::string_view name) {
  const auto t = dcr::parse_dtype(name);
  if (!t) throw std::invalid_argument("golden corpus: unknown dtype '" + std::string(name) + "'");
  return *t;
}

// ---- Words as hex strings: "0x" and exactly two digits per byte, so the width is visible.

inline std::string hex_word(std::uint64_t v, std::size_t word_bytes) {
  std::string s = "0x";
  for (std::size_t k = word_bytes; k-- > 0;) {
    char buf[3];
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned>((v >> (8 * k)) & 0xffu));
    s += buf;
  }
  return s;
}

/// Parses a word written by hex_word; throws std::invalid_argument unless it has exactly
/// 2 * word_bytes hex digits.
inline std::uint64_t parse_hex_word(std::string_view s, std::size_t word_bytes) {
  if (s.size() != 2 + 2 * word_bytes || s.substr(0, 2) != "0x")
    throw std::invalid_argument("golden corpus: '" + std::string(s) + "' is not a " +
                                std::to_string(word_bytes) + "-byte hex word");
  std::uint64_t v = 0;
  for (const char c : s.substr(2)) {
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : -1;
    if (d < 0) throw std::invalid_argument("golden corpus: bad hex digit in '" + std::string(s) + "'");
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  return v;
}

/// Word `i` of a little-endian-host value buffer of `word_bytes`-byte words.
inline std::uint64_t load_word(const std::byte* words, std::size_t i, std::size_t word_bytes) {
  std::uint64_t v = 0;
  for (std::size_t k = 0; k < word_bytes; ++k)
    v |= std::to_integer<std::uint64_t>(words[i * word_bytes + k]) << (8 * k);
  return v;
}
inline void store_word(std::byte* words, std::size_t i, std::size_t word_bytes, std::uint64_t v) {
  for (std::size_t k = 0; k < word_bytes; ++k)
    words[i * word_bytes + k] = static_cast<std::byte>(v >> (8 * k));
}

// ---- The registry as JSON: tensors in name order, so a tensor's id is its position.

inline json registry_json(const dcr::tensor_registry& r) {
  json a = json::array();
  for (const auto& t : r.tensors())
    a.push_back({{"name", t.name}, {"dtype", std::string(dcr::dtype_name(t.type))}, {"shape", t.shape}});
  return a;
}

inline dcr::tensor_registry registry_from_json(const json& a) {
  std::vector<dcr::canonical_tensor> ts;
  for (const auto& t : a)
    ts.push_back({t.at("name").get<std::string>(), parse_dtype_name(t.at("dtype").get<std::string>()),
                  t.at("shape").get<std::vector<std::int64_t>>()});
  return dcr::tensor_registry(std::move(ts));
}

inline json header_json(const dcr::payload_header& h) {
  return {{"base_version", h.id.attempt.base_version}, {"target_version", h.id.attempt.target_version},
          {"attempt", h.id.attempt.number},            {"owner", h.id.owner},
          {"sequence", h.id.sequence}};
}

inline dcr::payload_id payload_id_from_json(const json& j) {
  dcr::payload_id id;
  id.attempt.base_version = j.at("base_version").get<std::uint64_t>();
  id.attempt.target_version = j.at("target_version").get<std::uint64_t>();
  id.attempt.number = j.at("attempt").get<std::uint32_t>();
  if (j.contains("owner")) id.owner = j.at("owner").get<std::uint32_t>();
  if (j.contains("sequence")) id.sequence = j.at("sequence").get<std::uint32_t>();
  return id;
}

// ---- The storage a golden payload is applied to. Before the apply, element i of the tensor with
// id t holds base_word(t, i, word size): the low 8 * word size bits of splitmix64's output for
// the state (t << 32) + i. xor_mask and ulp values are made from these old bits.

inline std::uint64_t base_word(dcr::tensor_id t, std::uint64_t i, std::size_t word_bytes) {
  std::uint64_t z = (std::uint64_t{t} << 32) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return word_bytes == 8 ? z : z & ((std::uint64_t{1} << (8 * word_bytes)) - 1);
}

// ---- Files.

inline bytes_t read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("golden corpus: cannot read " + path);
  const std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  bytes_t b(c.size());
  for (std::size_t i = 0; i < c.size(); ++i) b[i] = static_cast<std::byte>(c[i]);
  return b;
}

inline json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("golden corpus: cannot read " + path);
  return json::parse(f);
}

// ---- Sidecar layout: nlohmann's dump() puts every array element on its own line, which makes a
// 200-record item several thousand lines. Here a value that fits on one line of 100 columns is
// written inline, arrays of plain values are wrapped at 100 columns, and objects nest as usual.

namespace detail {
inline std::string inline_form(const json& j) {
  if (j.is_object()) {
    std::string s = "{";
    bool first = true;
    for (const auto& [k, v] : j.items()) {
      s += (first ? "" : ", ") + json(k).dump() + ": " + inline_form(v);
      first = false;
    }
    return s + "}";
  }
  if (j.is_array()) {
    std::string s = "[";
    for (std::size_t i = 0; i < j.size(); ++i) s += (i == 0 ? "" : ", ") + inline_form(j[i]);
    return s + "]";
  }
  return j.dump();
}

inline void layout(std::string& out, const json& j, std::size_t indent, std::size_t column) {
  constexpr std::size_t width = 100;
  const std::string flat = inline_form(j);
  if (column + flat.size() <= width) {
    out += flat;
    return;
  }
  const std::string pad(indent + 2, ' ');
  if (j.is_object()) {
    out += "{\n";
    std::size_t n = 0;
    for (const auto& [k, v] : j.items()) {
      const std::string key = json(k).dump() + ": ";
      out += pad + key;
      layout(out, v, indent + 2, pad.size() + key.size());
      out += ++n < j.size() ? ",\n" : "\n";
    }
    out += std::string(indent, ' ') + "}";
    return;
  }
  if (j.is_array()) {
    bool plain = true;
    for (const auto& e : j) plain = plain && !e.is_structured();
    out += "[\n" + pad;
    std::size_t col = pad.size();
    for (std::size_t i = 0; i < j.size(); ++i) {
      const bool last = i + 1 == j.size();
      if (plain) {
        const std::string e = inline_form(j[i]);
        if (i > 0) {
          if (col + 1 + e.size() > width) {
            out += "\n" + pad;
            col = pad.size();
          } else {
            out += " ";
            ++col;
          }
        }
        out += e;
        col += e.size();
      } else {
        if (i > 0) out += pad;
        layout(out, j[i], indent + 2, pad.size());
      }
      if (!last) {
        out += ",";
        ++col;
        if (!plain) out += "\n";
      }
    }
    out += "\n" + std::string(indent, ' ') + "]";
    return;
  }
  out += flat;
}
}  // namespace detail

/// `j` laid out for reading and diffing, with a final newline.
inline std::string sidecar_text(const json& j) {
  std::string out;
  detail::layout(out, j, 0, 0);
  return out + "\n";
}

}  // namespace dcr_golden
