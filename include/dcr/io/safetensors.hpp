// dcr/io/safetensors.hpp: reading and writing safetensors files, exactly as the public format
// defines them (https://github.com/huggingface/safetensors, "Format"):
//
//   8 bytes      N, the header length, unsigned little-endian
//   N bytes      the header: a UTF-8 JSON object starting with '{', possibly padded with trailing
//                spaces. Each key is a tensor name mapping to
//                {"dtype": "BF16", "shape": [d0, d1, ...], "data_offsets": [begin, end]};
//                the optional key "__metadata__" maps to an object of string values.
//   rest         the byte buffer. Offsets are relative to its start; the tensors, taken in
//                offset order, cover it exactly (no holes, no overlaps, nothing after the last).
//
// Tensors may be listed in any order in the header; their data is little-endian, row-major.
// The reader validates everything the reference implementation does, and says which file and
// which tensor is wrong:
//   - file of at least 8 bytes, N <= safetensors_max_header_size and N <= file size - 8, and the
//     header starting with '{' (otherwise "X is not a safetensors file: ...");
//   - header well-formed JSON (UTF-8), an object, no duplicate keys, nothing after the object
//     but spaces (no NUL byte anywhere: NUL is not padding);
//   - each tensor an object with exactly "dtype", "shape" and "data_offsets"; a known dtype;
//     a shape of non-negative integers whose element count times the dtype size fits 64 bits;
//     data_offsets two integers begin <= end with end - begin == numel * dtype size;
//   - the buffer covered exactly, in offset order, by the tensors (a buffer shorter than the
//     tensors' offsets need: "X is truncated: ...");
//   - "__metadata__", if present, an object of strings.
// Errors are dcr::error: truncated_payload (file shorter than it declares: header or data),
// overflow (header length or element count too large), corrupt_payload (not safetensors at all,
// malformed JSON or layout), unsupported_version (unknown dtype), shape_mismatch (size disagrees
// with shape and dtype), io_error (the file cannot be read).
//
// The writer produces what the reference writer produces: compact JSON with "__metadata__"
// first, the header padded with spaces to a multiple of 8 bytes, tensors laid out back to back
// in the order given.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/detail/varint.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/io/file.hpp"
#include "dcr/shape.hpp"

namespace dcr::io {

/// The largest header the reader accepts (the reference implementation's limit).
inline constexpr std::uint64_t safetensors_max_header_size = 100'000'000;

/// The "__metadata__" map: free-form string keys and values.
using safetensors_metadata = std::map<std::string, std::string>;

/// One tensor as a safetensors header describes it.
struct safetensors_entry {
  std::string name;
  dtype type = dtype::bf16;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  ///< first byte, relative to the start of the data buffer
  std::uint64_t end = 0;    ///< one past the last byte

  [[nodiscard]] std::uint64_t numel() const noexcept {
    std::uint64_t n = 1;
    for (auto e : shape) n *= static_cast<std::uint64_t>(e);
    return n;
  }
  [[nodiscard]] std::uint64_t size() const noexcept { return end - begin; }
  [[nodiscard]] canonical_tensor canonical() const { return {name, type, shape}; }
};

/// A parsed, validated header (parse_safetensors / parse_safetensors_header make them).
class safetensors_header {
 public:
  safetensors_header() = default;
  /// Takes the parts as they are (the parser validated them); indexes the names.
  safetensors_header(std::uint64_t header_size, std::uint64_t buffer_size,
                     std::vector<safetensors_entry> tensors_in_offset_order,
                     std::optional<safetensors_metadata> metadata);

  /// N: bytes of JSON (padding included) after the 8-byte length.
  [[nodiscard]] std::uint64_t header_size() const noexcept { return header_size_; }
  /// Bytes of the data buffer.
  [[nodiscard]] std::uint64_t buffer_size() const noexcept { return buffer_size_; }
  /// File offset of the data buffer: 8 + N.
  [[nodiscard]] std::uint64_t data_offset() const noexcept { return 8 + header_size_; }
  /// Total file size: 8 + N + buffer size.
  [[nodiscard]] std::uint64_t file_size() const noexcept { return data_offset() + buffer_size_; }
  /// The tensors in offset order (as laid out in the buffer).
  [[nodiscard]] std::span<const safetensors_entry> tensors() const noexcept { return tensors_; }
  /// "__metadata__", if the header has one.
  [[nodiscard]] const std::optional<safetensors_metadata>& metadata() const noexcept;
  /// The tensor named `name`, or nullptr.
  [[nodiscard]] const safetensors_entry* find(std::string_view name) const;
  /// The tensors as canonical tensors (name, dtype, shape), in offset order.
  [[nodiscard]] std::vector<canonical_tensor> canonical_tensors() const;

 private:
  std::uint64_t header_size_ = 0;
  std::uint64_t buffer_size_ = 0;
  std::vector<safetensors_entry> tensors_;
  std::optional<safetensors_metadata> metadata_;
  std::unordered_map<std::string, std::size_t> by_name_;
};

namespace detail {

std::string quoted(std::string_view s);

// `bytes` as a quoted string, non-printable bytes as \xNN (for naming what a file starts with).
std::string printable(std::span<const std::byte> bytes);

std::uint64_t json_u64(const nlohmann::json& v, bool& ok);

}  // namespace detail

/// Parses and validates a safetensors JSON header. `json` is the N header bytes (padding
/// included), `buffer_size` the bytes of data after it, `where` names the file in errors.
/// Validation as described at the top of this file.
[[nodiscard]] safetensors_header parse_safetensors_header(std::string_view json,
                                                          std::uint64_t buffer_size,
                                                          std::string_view where);

/// Parses and validates a whole safetensors file held in `file_bytes`; `where` names it in
/// errors.
[[nodiscard]] safetensors_header parse_safetensors(std::span<const std::byte> file_bytes,
                                                   std::string_view where);

/// A safetensors file mapped read-only and validated. Tensor data is read in place.
class safetensors_file {
 public:
  safetensors_file() = default;

  /// Maps and validates `path`. `populate` pre-faults the whole file (for whole-file passes).
  static safetensors_file open(const std::filesystem::path& path, bool populate = false);

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return file_.path(); }
  [[nodiscard]] const safetensors_header& header() const noexcept { return header_; }
  [[nodiscard]] std::span<const safetensors_entry> tensors() const noexcept;
  [[nodiscard]] const std::optional<safetensors_metadata>& metadata() const noexcept;
  [[nodiscard]] const safetensors_entry* find(std::string_view name) const;
  /// The whole file.
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return file_.bytes(); }
  /// The N header bytes (JSON and padding).
  [[nodiscard]] std::string_view header_json() const noexcept;
  /// The bytes of tensor `t` (an entry of this file).
  [[nodiscard]] std::span<const std::byte> data(const safetensors_entry& t) const noexcept;

 private:
  mapped_file file_;
  safetensors_header header_;
};

/// A tensor to write: name, dtype, shape and its little-endian row-major bytes.
struct safetensors_tensor {
  std::string name;
  dtype type = dtype::bf16;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> data;
};

/// The N header bytes the reference writer would produce for `tensors` laid out back to back
/// in the given order: compact JSON, "__metadata__" first when `metadata` is given, padded with
/// spaces to a multiple of 8 bytes. Throws invalid_argument for an empty, duplicate or
/// "__metadata__" tensor name or a name or metadata string that is not UTF-8, shape_mismatch
/// when data.size() != numel * dtype size, and for a negative extent.
[[nodiscard]] std::string make_safetensors_header(
    std::span<const safetensors_tensor> tensors,
    const std::optional<safetensors_metadata>& metadata = std::nullopt);

/// A whole safetensors file in memory (make_safetensors_header's layout and checks).
[[nodiscard]] std::vector<std::byte> serialize_safetensors(
    std::span<const safetensors_tensor> tensors,
    const std::optional<safetensors_metadata>& metadata = std::nullopt);

/// Writes a safetensors file at `path` atomically (temporary file beside it, fsync, rename,
/// fsync of the directory): `path` holds either its old content or the whole new file.
void write_safetensors(const std::filesystem::path& path,
                              std::span<const safetensors_tensor> tensors,
                              const std::optional<safetensors_metadata>& metadata = std::nullopt);

}  // namespace dcr::io

#include "dcr/detail/io/safetensors.inl"
