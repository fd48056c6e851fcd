// dcr/io/delta.hpp: the delta file, a record of how one safetensors checkpoint becomes another,
// made to be applied to the checkpoint it was made from (normative layout: docs/tool.md, "Delta
// file format"). It holds only what the base does not already hold and verification needs:
//
//   Header         136 bytes: magic "DCRDELTA", version 2, sizes, counts, the registry
//                  fingerprint and four XXH3-128 digests: the base's and the result's JSON
//                  header content (without trailing spaces), the base's and the result's tensors
//   Base header    (journals only) the base file's JSON header, verbatim
//   Target header  the result's JSON header as one zstd frame coded against the base's header
//                  content (a raw-content dictionary): a few dozen bytes when they are equal
//   Payloads       zero or more dcr payloads (docs/format.md) whose registry is the base's tensors
//   Trailer        XXH3-64 of everything before the payloads, XXH3-64 of the payloads
//
// The registry (names, dtypes, shapes; ids in name order) is the base's: a delta names no tensor.
// The same container, with magic "DCRJOURN", is the journal of an in-place apply: it also holds
// the base file's JSON header, and its payloads are overwrite items, each payload either redo
// (new bits; transition 0 -> 1) or undo (old bits; transition 1 -> 0).
//
// `delta_file` maps and validates a container before anything reads it: framing, both
// checksums, the header's fields, the target header's frame, and the payload boundaries.
// `bind_base` then checks a base against it (registry fingerprint, header content digest) and
// decodes the target header; a journal binds itself to the base header it holds. The base's and
// the result's tensor digests are checked by whoever reads the tensors (dcr/io/checkpoint.hpp).
// `delta_payloads` decodes the payloads in order with every check applying needs, the rule that
// each element appears at most once among them included. `delta_writer` streams payloads to a
// temporary file and publishes the container atomically.
#pragma once

#include <xxhash.h>
#include <zstd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/detail/varint.hpp"
#include "dcr/detail/zstd.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/io/file.hpp"
#include "dcr/io/safetensors.hpp"
#include "dcr/shape.hpp"

namespace dcr::io {

/// An XXH3-128 digest in xxHash's canonical form: 16 bytes, most significant first (what
/// `xxh128sum` prints).
struct digest128 {
  std::array<std::uint8_t, 16> bytes{};
  friend bool operator==(const digest128&, const digest128&) = default;

  /// 32 lowercase hex digits.
  [[nodiscard]] std::string hex() const {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s;
    s.reserve(32);
    for (auto b : bytes) {
      s += digits[b >> 4];
      s += digits[b & 15];
    }
    return s;
  }
  static digest128 from_hash(XXH128_hash_t h) noexcept {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    digest128 d;
    std::memcpy(d.bytes.data(), c.digest, 16);
    return d;
  }
};

static_assert(sizeof(digest128) == 16, "digest128 is its 16 bytes, for tensors_digest");

/// XXH3-128 (seed 0) of `bytes`.
[[nodiscard]] inline digest128 digest_of(std::span<const std::byte> bytes) noexcept {
  return digest128::from_hash(XXH3_128bits(bytes.data(), bytes.size()));
}

/// A streaming XXH3-128, for digests computed chunk by chunk. Owns its state.
class digest_stream {
 public:
  digest_stream();
  digest_stream(digest_stream&& o) noexcept : state_(std::exchange(o.state_, nullptr)) {}
  digest_stream& operator=(digest_stream&& o) noexcept {
    std::swap(state_, o.state_);
    return *this;
  }
  digest_stream(const digest_stream&) = delete;
  digest_stream& operator=(const digest_stream&) = delete;
  ~digest_stream() { XXH3_freeState(state_); }

  void reset() noexcept { XXH3_128bits_reset(state_); }
  void update(std::span<const std::byte> bytes) noexcept;
  [[nodiscard]] digest128 digest() const noexcept;

 private:
  XXH3_state_t* state_;
};

/// The digest of a checkpoint's tensors that a delta records: XXH3-128 of the concatenated
/// 16-byte digests (digest_of) of each tensor's bytes, in tensor id (name) order.
[[nodiscard]] inline digest128 tensors_digest(std::span<const digest128> per_tensor) noexcept {
  return digest_of(std::as_bytes(per_tensor));
}

/// A JSON header's content: its bytes less the trailing spaces that pad it. Two files whose
/// headers differ only in padding have the same content (an in-place apply pads the result's
/// header to the base's length).
[[nodiscard]] inline std::string_view header_content(std::string_view json) noexcept {
  const auto last = json.find_last_not_of(' ');
  return json.substr(0, last == std::string_view::npos ? 0 : last + 1);
}

/// XXH3-128 of header_content(json): what a delta records of the base's and the result's header.
[[nodiscard]] inline digest128 header_content_digest(std::string_view json) noexcept {
  return digest_of(std::as_bytes(std::span<const char>(header_content(json))));
}

/// Which kind of container a file is.
enum class container_kind : std::uint8_t {
  delta = 0,    ///< magic "DCRDELTA": written by diff, read by apply and inspect
  journal = 1,  ///< magic "DCRJOURN": the redo/undo journal of an in-place apply
};

/// Constants of delta file format version 2 (docs/tool.md).
namespace delta_format {
inline constexpr std::array<char, 8> delta_magic = {'D', 'C', 'R', 'D', 'E', 'L', 'T', 'A'};
inline constexpr std::array<char, 8> journal_magic = {'D', 'C', 'R', 'J', 'O', 'U', 'R', 'N'};
inline constexpr std::uint16_t version = 2;
inline constexpr std::size_t header_size = 136;
inline constexpr std::size_t trailer_size = 16;
/// zstd level of the target header's frame (the reader does not depend on it). A header close
/// to its base's codes to one long match at any level; a low one keeps coding a large header
/// (thousands of tensors, megabytes of JSON, as large a dictionary) in milliseconds.
inline constexpr int target_header_level = 3;
/// Payload ids: delta and redo payloads are transition 0 -> 1, undo payloads 1 -> 0, attempt
/// 0, owner 0, sequence = position among payloads of their direction.
inline constexpr attempt_key forward{0, 1, 0};
inline constexpr attempt_key backward{1, 0, 0};
}  // namespace delta_format

namespace detail {

std::span<const char> magic_of(container_kind kind);
const char* kind_name(container_kind kind);
digest128 load_digest(const std::byte* p) noexcept;

struct zstd_cctx_deleter {
  void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
};
struct zstd_dctx_deleter {
  void operator()(ZSTD_DCtx* c) const noexcept { ZSTD_freeDCtx(c); }
};

// `target` as one zstd frame (content size recorded, no checksum) coded with `dictionary` as
// raw content.
std::vector<std::byte> code_target_header(std::string_view target,
                                                 std::string_view dictionary);

}  // namespace detail

/// A validated, read-only view of a delta file or journal (see the top of this file). open()
/// maps the file and keeps the mapping; parse() views bytes the caller keeps alive. The
/// registry and the target header are known once a base is bound (bind_base; a journal binds
/// the base header it holds when it is opened).
class delta_file {
 public:
  delta_file() = default;
  delta_file(delta_file&&) noexcept = default;
  delta_file& operator=(delta_file&&) noexcept = default;

  /// Maps and validates `path` as a container of `kind`.
  static delta_file open(const std::filesystem::path& path,
                         container_kind kind = container_kind::delta);
  /// Validates `bytes` (which must outlive the result) as a container of `kind`; `where` names
  /// it in errors.
  static delta_file parse(std::span<const std::byte> bytes, std::string where,
                          container_kind kind = container_kind::delta);

  /// Binds the base the delta is applied to: `base` is its parsed header, `base_json` its N
  /// header bytes, `base_what` names it in errors. Throws registry_mismatch when the base holds
  /// other tensors (names, dtypes, shapes) than the delta's base, and verification_failed when
  /// its header content differs from the delta's base header (the target header is coded
  /// against it: a base re-saved with another tensor order, offsets or metadata cannot be
  /// used); corrupt_payload when the target header does not decode to a valid header of the
  /// same tensors with the recorded digest. The base's tensor bytes are not read here.
  void bind_base(const safetensors_header& base, std::string_view base_json,
                 std::string_view base_what);

  [[nodiscard]] container_kind kind() const noexcept { return kind_; }
  [[nodiscard]] const std::string& where() const noexcept { return where_; }
  /// The whole container.
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return bytes_; }
  /// Whether a base is bound (registry() and the target header are known).
  [[nodiscard]] bool bound() const noexcept { return bound_; }
  /// The base's tensors as a registry (ids in name order); bound only.
  [[nodiscard]] const tensor_registry& registry() const;
  /// tensor_registry::fingerprint() of the base's tensors, and their number.
  [[nodiscard]] std::uint64_t registry_fingerprint() const noexcept { return fingerprint_; }
  [[nodiscard]] std::uint32_t tensor_count() const noexcept { return tensor_count_; }
  /// Sum of the tensors' sizes in bytes.
  [[nodiscard]] std::uint64_t tensor_bytes() const noexcept { return tensor_bytes_; }
  /// tensors_digest of the base's and of the result's tensors.
  [[nodiscard]] const digest128& base_digest() const noexcept { return base_digest_; }
  [[nodiscard]] const digest128& result_digest() const noexcept { return result_digest_; }
  /// header_content_digest of the base's and of the result's JSON header.
  [[nodiscard]] const digest128& base_header_digest() const noexcept;
  [[nodiscard]] const digest128& target_header_digest() const noexcept;
  /// N of the result file, and its size (8 + N + tensor_bytes()).
  [[nodiscard]] std::uint64_t target_header_size() const noexcept { return target_size_; }
  [[nodiscard]] std::uint64_t target_file_size() const noexcept;
  /// The coded target header (one zstd frame).
  [[nodiscard]] std::span<const std::byte> target_header_code() const noexcept;
  /// The result's JSON header bytes (verbatim, padding included) and their parse; bound only.
  [[nodiscard]] std::string_view target_header_json() const;
  [[nodiscard]] const safetensors_header& target_header() const;
  /// The base's JSON header bytes (journals only; empty in a delta file).
  [[nodiscard]] std::string_view base_header_json() const noexcept { return base_json_; }
  /// Number of payloads, and the i-th (framing checked; contents checked by delta_payloads).
  [[nodiscard]] std::size_t payload_count() const noexcept { return payloads_.size(); }
  [[nodiscard]] std::span<const std::byte> payload(std::size_t i) const;
  /// Byte offset of payload i in the container.
  [[nodiscard]] std::uint64_t payload_offset(std::size_t i) const { return payloads_.at(i).first; }
  /// Whether payload i is an undo payload (journals; never in a delta file).
  [[nodiscard]] bool is_undo(std::size_t i) const { return undo_.at(i); }
  /// Number of undo payloads.
  [[nodiscard]] std::size_t undo_count() const noexcept { return undo_count_; }
  /// The transition payload i must carry, and its sequence number.
  [[nodiscard]] attempt_key expected_transition(std::size_t i) const;
  [[nodiscard]] std::uint32_t expected_sequence(std::size_t i) const { return sequence_.at(i); }

 private:
  void require_bound() const;

  void validate(std::span<const std::byte> bytes, std::string where, container_kind kind);

  void bind(const safetensors_header& base, std::string_view base_json,
            std::string_view base_what);

  static std::string hex64(std::uint64_t v);

  mapped_file file_;
  std::span<const std::byte> bytes_;
  std::string where_;
  container_kind kind_ = container_kind::delta;
  std::uint64_t fingerprint_ = 0;
  std::uint32_t tensor_count_ = 0;
  std::uint64_t tensor_bytes_ = 0;
  std::uint64_t target_size_ = 0;
  std::uint64_t code_at_ = 0;
  std::uint64_t code_size_ = 0;
  digest128 base_header_digest_;
  digest128 target_header_digest_;
  digest128 base_digest_;
  digest128 result_digest_;
  std::string_view base_json_;
  bool bound_ = false;
  tensor_registry registry_;
  std::string target_json_;
  safetensors_header target_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> payloads_;
  std::vector<bool> undo_;
  std::vector<std::uint32_t> sequence_;
  std::size_t undo_count_ = 0;
};

/// Decodes the payloads of a bound delta file or journal, each fully validated before any of its
/// items is returned: the payload decoder's checks against the registry, the payload's id
/// (direction and sequence), overwrite items only in a journal, and each element at most once:
/// of one direction, a tensor's items taken in payload order hold strictly increasing indices
/// (the differ writes them so; an element listed twice, in two payloads, is refused). Every path
/// that applies a delta or journal decodes through it. Payloads of one direction must be
/// decoded in increasing order; the other direction's may be skipped.
class delta_payloads {
 public:
  explicit delta_payloads(const delta_file& d)
      : d_(d), last_(2, std::vector<std::uint64_t>(d.registry().size(), 0)),
        seen_(2, std::vector<bool>(d.registry().size(), false)) {}

  /// Decodes payload i into `items`. Throws what the payload decoder throws, duplicate_payload
  /// (id out of order), corrupt_payload (a non-overwrite journal item, an element listed again),
  /// invalid_argument (payloads of one direction decoded out of order), each naming the payload.
  void decode(std::size_t i, std::vector<item>& items);

 private:
  const delta_file& d_;
  payload_decoder decoder_;
  std::array<std::size_t, 2> next_{};
  std::vector<std::vector<std::uint64_t>> last_;
  std::vector<std::vector<bool>> seen_;
};

/// Writes a delta file or journal: the headers are coded up front, payloads are streamed to a
/// temporary file beside the target as they come, digests may be set until finish(), and
/// commit() publishes the file atomically. Destroying it uncommitted removes the temporary file.
class delta_writer {
 public:
  /// A writer for `target`. `registry` holds the base's tensors; `target_header_json` is the
  /// result file's N header bytes, `base_header_json` the base's (the target header is coded
  /// against its content; a journal also holds it verbatim). Throws overflow for more than
  /// 2^32 - 1 tensors or a header over safetensors_max_header_size.
  delta_writer(const std::filesystem::path& target, container_kind kind,
               const tensor_registry& registry, std::string_view target_header_json,
               std::string_view base_header_json);
  delta_writer(const delta_writer&) = delete;
  delta_writer& operator=(const delta_writer&) = delete;
  ~delta_writer() { XXH3_freeState(body_hash_); }

  /// Records tensors_digest of the base's and of the result's tensors.
  void set_digests(const digest128& base, const digest128& result);

  /// Appends one encoded payload (its header's transition says redo/delta or undo).
  void append_payload(std::span<const std::byte> payload);

  /// Bytes written so far (the final size once the trailer is added by finish()).
  [[nodiscard]] std::uint64_t size() const noexcept;
  [[nodiscard]] std::uint32_t payload_count() const noexcept { return payloads_; }
  [[nodiscard]] const std::filesystem::path& temp_path() const noexcept;

  /// Writes header, headers and trailer, and fsyncs the temporary file. The target path is not
  /// touched yet.
  void finish();

  /// finish(), then rename over the target and fsync its directory. Returns the file size.
  std::uint64_t commit();

 private:
  container_kind kind_;
  std::uint64_t fingerprint_;
  std::uint32_t tensor_count_;
  std::uint64_t tensor_bytes_ = 0;
  std::uint64_t target_size_;
  digest128 base_header_digest_;
  digest128 target_header_digest_;
  digest128 base_digest_;
  digest128 result_digest_;
  std::string base_json_;
  std::vector<std::byte> code_;
  atomic_file out_;
  std::uint64_t head_end_ = 0;
  std::uint64_t at_ = 0;
  XXH3_state_t* body_hash_ = nullptr;
  std::uint32_t payloads_ = 0;
  std::uint32_t undo_payloads_ = 0;
  bool finished_ = false;
};

}  // namespace dcr::io

#include "dcr/detail/io/delta.inl"
