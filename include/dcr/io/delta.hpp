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
  digest_stream() : state_(XXH3_createState()) {
    if (state_ == nullptr) throw std::bad_alloc();
    reset();
  }
  digest_stream(digest_stream&& o) noexcept : state_(std::exchange(o.state_, nullptr)) {}
  digest_stream& operator=(digest_stream&& o) noexcept {
    std::swap(state_, o.state_);
    return *this;
  }
  digest_stream(const digest_stream&) = delete;
  digest_stream& operator=(const digest_stream&) = delete;
  ~digest_stream() { XXH3_freeState(state_); }

  void reset() noexcept { XXH3_128bits_reset(state_); }
  void update(std::span<const std::byte> bytes) noexcept {
    XXH3_128bits_update(state_, bytes.data(), bytes.size());
  }
  [[nodiscard]] digest128 digest() const noexcept {
    return digest128::from_hash(XXH3_128bits_digest(state_));
  }

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

inline std::span<const char> magic_of(container_kind kind) {
  return kind == container_kind::delta ? std::span<const char>(delta_format::delta_magic)
                                       : std::span<const char>(delta_format::journal_magic);
}
inline const char* kind_name(container_kind kind) {
  return kind == container_kind::delta ? "delta file" : "journal";
}
inline digest128 load_digest(const std::byte* p) noexcept {
  digest128 d;
  std::memcpy(d.bytes.data(), p, 16);
  return d;
}

struct zstd_cctx_deleter {
  void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
};
struct zstd_dctx_deleter {
  void operator()(ZSTD_DCtx* c) const noexcept { ZSTD_freeDCtx(c); }
};

// `target` as one zstd frame (content size recorded, no checksum) coded with `dictionary` as
// raw content.
inline std::vector<std::byte> code_target_header(std::string_view target,
                                                 std::string_view dictionary) {
  std::unique_ptr<ZSTD_CCtx, zstd_cctx_deleter> ctx(ZSTD_createCCtx());
  if (!ctx) throw std::bad_alloc();
  std::vector<std::byte> out(ZSTD_compressBound(target.size()));
  const std::size_t n =
      ZSTD_compress_usingDict(ctx.get(), out.data(), out.size(), target.data(), target.size(),
                              dictionary.data(), dictionary.size(),
                              delta_format::target_header_level);
  DCR_EXPECTS(!ZSTD_isError(n), errc::invalid_argument,
              std::string("delta_writer: coding the target header: ") + ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

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
                         container_kind kind = container_kind::delta) {
    delta_file f;
    f.file_ = mapped_file::open_read(path);
    f.validate(f.file_.bytes(), path.string(), kind);
    return f;
  }
  /// Validates `bytes` (which must outlive the result) as a container of `kind`; `where` names
  /// it in errors.
  static delta_file parse(std::span<const std::byte> bytes, std::string where,
                          container_kind kind = container_kind::delta) {
    delta_file f;
    f.validate(bytes, std::move(where), kind);
    return f;
  }

  /// Binds the base the delta is applied to: `base` is its parsed header, `base_json` its N
  /// header bytes, `base_what` names it in errors. Throws registry_mismatch when the base holds
  /// other tensors (names, dtypes, shapes) than the delta's base, and verification_failed when
  /// its header content differs from the delta's base header (the target header is coded
  /// against it: a base re-saved with another tensor order, offsets or metadata cannot be
  /// used); corrupt_payload when the target header does not decode to a valid header of the
  /// same tensors with the recorded digest. The base's tensor bytes are not read here.
  void bind_base(const safetensors_header& base, std::string_view base_json,
                 std::string_view base_what) {
    DCR_EXPECTS(kind_ == container_kind::delta, errc::invalid_argument,
                where_ + ": a journal is bound to the base header it holds");
    bind(base, base_json, base_what);
  }

  [[nodiscard]] container_kind kind() const noexcept { return kind_; }
  [[nodiscard]] const std::string& where() const noexcept { return where_; }
  /// The whole container.
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return bytes_; }
  /// Whether a base is bound (registry() and the target header are known).
  [[nodiscard]] bool bound() const noexcept { return bound_; }
  /// The base's tensors as a registry (ids in name order); bound only.
  [[nodiscard]] const tensor_registry& registry() const {
    require_bound();
    return registry_;
  }
  /// tensor_registry::fingerprint() of the base's tensors, and their number.
  [[nodiscard]] std::uint64_t registry_fingerprint() const noexcept { return fingerprint_; }
  [[nodiscard]] std::uint32_t tensor_count() const noexcept { return tensor_count_; }
  /// Sum of the tensors' sizes in bytes.
  [[nodiscard]] std::uint64_t tensor_bytes() const noexcept { return tensor_bytes_; }
  /// tensors_digest of the base's and of the result's tensors.
  [[nodiscard]] const digest128& base_digest() const noexcept { return base_digest_; }
  [[nodiscard]] const digest128& result_digest() const noexcept { return result_digest_; }
  /// header_content_digest of the base's and of the result's JSON header.
  [[nodiscard]] const digest128& base_header_digest() const noexcept {
    return base_header_digest_;
  }
  [[nodiscard]] const digest128& target_header_digest() const noexcept {
    return target_header_digest_;
  }
  /// N of the result file, and its size (8 + N + tensor_bytes()).
  [[nodiscard]] std::uint64_t target_header_size() const noexcept { return target_size_; }
  [[nodiscard]] std::uint64_t target_file_size() const noexcept {
    return 8 + target_size_ + tensor_bytes_;
  }
  /// The coded target header (one zstd frame).
  [[nodiscard]] std::span<const std::byte> target_header_code() const noexcept {
    return bytes_.subspan(code_at_, code_size_);
  }
  /// The result's JSON header bytes (verbatim, padding included) and their parse; bound only.
  [[nodiscard]] std::string_view target_header_json() const {
    require_bound();
    return target_json_;  // a std::string: a view of it stays valid when the delta_file moves
  }
  [[nodiscard]] const safetensors_header& target_header() const {
    require_bound();
    return target_;
  }
  /// The base's JSON header bytes (journals only; empty in a delta file).
  [[nodiscard]] std::string_view base_header_json() const noexcept { return base_json_; }
  /// Number of payloads, and the i-th (framing checked; contents checked by delta_payloads).
  [[nodiscard]] std::size_t payload_count() const noexcept { return payloads_.size(); }
  [[nodiscard]] std::span<const std::byte> payload(std::size_t i) const {
    DCR_EXPECTS(i < payloads_.size(), errc::out_of_range,
                where_ + ": no payload " + std::to_string(i));
    return bytes_.subspan(payloads_[i].first, payloads_[i].second);
  }
  /// Byte offset of payload i in the container.
  [[nodiscard]] std::uint64_t payload_offset(std::size_t i) const { return payloads_.at(i).first; }
  /// Whether payload i is an undo payload (journals; never in a delta file).
  [[nodiscard]] bool is_undo(std::size_t i) const { return undo_.at(i); }
  /// Number of undo payloads.
  [[nodiscard]] std::size_t undo_count() const noexcept { return undo_count_; }
  /// The transition payload i must carry, and its sequence number.
  [[nodiscard]] attempt_key expected_transition(std::size_t i) const {
    return is_undo(i) ? delta_format::backward : delta_format::forward;
  }
  [[nodiscard]] std::uint32_t expected_sequence(std::size_t i) const { return sequence_.at(i); }

 private:
  void require_bound() const {
    DCR_EXPECTS(bound_, errc::not_ready,
                where_ + ": no base bound (the delta's registry and target header come from "
                         "its base: delta_file::bind_base)");
  }

  void validate(std::span<const std::byte> bytes, std::string where, container_kind kind) {
    using dcr::detail::load_le;
    where_ = std::move(where);
    bytes_ = bytes;
    kind_ = kind;
    bound_ = false;
    const std::string& w = where_;
    const char* what = detail::kind_name(kind);
    const auto magic = detail::magic_of(kind);
    DCR_EXPECTS(bytes.size() >= 8 && std::memcmp(bytes.data(), magic.data(), 8) == 0,
                errc::corrupt_payload,
                w + ": not a dcr " + what + " (magic '" + std::string(magic.data(), 8) +
                    "' missing)");
    DCR_EXPECTS(bytes.size() >= 12, errc::truncated_payload,
                w + ": " + std::to_string(bytes.size()) + " bytes, shorter than a " + what +
                    " header");
    const std::byte* p = bytes.data();
    const auto version = load_le<std::uint16_t>(p + 8);
    DCR_EXPECTS(version == delta_format::version, errc::unsupported_version,
                w + ": " + what + " format version " + std::to_string(version) +
                    (version < delta_format::version
                         ? " (written by an older dcr; make the delta again with this dcr)"
                         : " (written by a newer dcr)") +
                    ", this dcr reads version " + std::to_string(delta_format::version) +
                    " only");
    DCR_EXPECTS(bytes.size() >= delta_format::header_size + delta_format::trailer_size,
                errc::truncated_payload,
                w + ": " + std::to_string(bytes.size()) + " bytes, shorter than an empty " + what);
    DCR_EXPECTS(load_le<std::uint16_t>(p + 10) == delta_format::header_size,
                errc::corrupt_payload,
                w + ": header size differs from version 2's " +
                    std::to_string(delta_format::header_size) + " bytes");
    DCR_EXPECTS(load_le<std::uint32_t>(p + 12) == 0, errc::reserved_bits_set,
                w + ": header flags (bytes 12-15) not zero");
    const auto total = load_le<std::uint64_t>(p + 16);
    DCR_EXPECTS(total <= bytes.size(), errc::truncated_payload,
                w + ": " + std::to_string(bytes.size()) + " bytes, header declares " +
                    std::to_string(total));
    DCR_EXPECTS(total == bytes.size(), errc::corrupt_payload,
                w + ": " + std::to_string(bytes.size() - total) +
                    " bytes after the declared end at byte " + std::to_string(total));
    fingerprint_ = load_le<std::uint64_t>(p + 24);
    tensor_count_ = load_le<std::uint32_t>(p + 32);
    const auto payload_count = load_le<std::uint32_t>(p + 36);
    const auto undo_count = load_le<std::uint32_t>(p + 40);
    const auto base_size = load_le<std::uint32_t>(p + 44);
    tensor_bytes_ = load_le<std::uint64_t>(p + 48);
    target_size_ = load_le<std::uint64_t>(p + 56);
    const auto code_size = load_le<std::uint64_t>(p + 64);
    base_header_digest_ = detail::load_digest(p + 72);
    target_header_digest_ = detail::load_digest(p + 88);
    base_digest_ = detail::load_digest(p + 104);
    result_digest_ = detail::load_digest(p + 120);
    if (kind == container_kind::delta)
      DCR_EXPECTS(base_size == 0 && undo_count == 0, errc::reserved_bits_set,
                  w + ": undo count and base header size (bytes 40-47) not zero in a delta file");
    DCR_EXPECTS(undo_count <= payload_count, errc::corrupt_payload,
                w + ": " + std::to_string(undo_count) + " undo payloads of " +
                    std::to_string(payload_count));
    DCR_EXPECTS(tensor_bytes_ <= (std::numeric_limits<std::uint64_t>::max() >> 2) &&
                    target_size_ <= safetensors_max_header_size,
                errc::overflow,
                w + ": tensor bytes " + std::to_string(tensor_bytes_) + " or target header size " +
                    std::to_string(target_size_) + " too large");
    // Sections, checked by subtraction so hostile sizes cannot overflow.
    const std::uint64_t left = total - delta_format::header_size - delta_format::trailer_size;
    DCR_EXPECTS(base_size <= left && code_size <= left - base_size, errc::corrupt_payload,
                w + ": sections of " + std::to_string(base_size) + " + " +
                    std::to_string(code_size) + " bytes overrun the " + std::to_string(total) +
                    "-byte file");
    const std::uint64_t base_at = delta_format::header_size;
    code_at_ = base_at + base_size;
    code_size_ = code_size;
    const std::uint64_t head_end = code_at_ + code_size;
    const std::uint64_t body_end = total - delta_format::trailer_size;
    const auto head_sum = load_le<std::uint64_t>(p + body_end);
    const auto body_sum = load_le<std::uint64_t>(p + body_end + 8);
    DCR_EXPECTS(head_sum == XXH3_64bits(p, head_end), errc::corrupt_payload,
                w + ": checksum of the header and JSON headers (bytes 0.." +
                    std::to_string(head_end) + ") mismatch");
    DCR_EXPECTS(body_sum == XXH3_64bits(p + head_end, body_end - head_end), errc::corrupt_payload,
                w + ": checksum of the payloads (bytes " + std::to_string(head_end) + ".." +
                    std::to_string(body_end) + ") mismatch");

    // The target header's frame: exactly one zstd frame recording N as its content size.
    const auto code = target_header_code();
    const std::size_t frame = ZSTD_findFrameCompressedSize(code.data(), code.size());
    DCR_EXPECTS(!ZSTD_isError(frame) && frame == code.size(), errc::corrupt_payload,
                w + ": the target header (bytes " + std::to_string(code_at_) + ".." +
                    std::to_string(head_end) + ") is not one zstd frame");
    DCR_EXPECTS(ZSTD_getFrameContentSize(code.data(), code.size()) == target_size_,
                errc::corrupt_payload,
                w + ": the target header's zstd frame does not record its " +
                    std::to_string(target_size_) + "-byte size");
    // No byte of a zstd frame decodes to more than zstd_max_expansion bytes: a frame claiming
    // more is refused before bind_base allocates the header.
    DCR_EXPECTS(target_size_ / dcr::detail::zstd_max_expansion <= code.size(),
                errc::corrupt_payload,
                w + ": a " + std::to_string(code.size()) + "-byte zstd frame cannot hold the " +
                    std::to_string(target_size_) + "-byte target header it claims");

    base_json_ = std::string_view(reinterpret_cast<const char*>(p + base_at), base_size);
    if (kind == container_kind::journal) {
      const auto base = parse_safetensors_header(base_json_, tensor_bytes_, w + " (base header)");
      bind(base, base_json_, w + " (base header)");
    }

    // Payload boundaries: each payload's own header gives its size; together they fill the area.
    payloads_.clear();
    undo_.clear();
    sequence_.clear();
    undo_count_ = 0;
    std::uint64_t at = head_end;
    std::uint32_t forward = 0;
    std::uint32_t backward = 0;
    for (std::uint32_t i = 0; i < payload_count; ++i) {
      const auto rest = bytes.subspan(at, body_end - at);
      const std::string here = w + ": payload " + std::to_string(i) + " at byte " +
                               std::to_string(at);
      std::uint64_t size = 0;
      try {
        size = payload_decoder::peek_size(rest);
      } catch (const error& e) {
        throw error(e.dcr_code(), here + ": " + e.what());
      }
      DCR_EXPECTS(size <= rest.size(), errc::truncated_payload,
                  here + ": declares " + std::to_string(size) + " bytes, " +
                      std::to_string(rest.size()) + " remain");
      const auto header = payload_decoder::peek_header(rest.first(size));
      const auto& id = header.id.attempt;
      const bool undo = id.base_version == 1 && id.target_version == 0;
      DCR_EXPECTS(kind == container_kind::journal || !undo, errc::stale_payload,
                  here + ": an undo payload in a delta file");
      DCR_EXPECTS(header.registry_fingerprint == fingerprint_, errc::registry_mismatch,
                  here + ": registry fingerprint differs from the header's");
      payloads_.emplace_back(at, size);
      undo_.push_back(undo);
      sequence_.push_back(undo ? backward++ : forward++);
      at += size;
    }
    undo_count_ = backward;
    DCR_EXPECTS(at == body_end, errc::corrupt_payload,
                w + ": payloads end at byte " + std::to_string(at) + ", the trailer is at byte " +
                    std::to_string(body_end));
    DCR_EXPECTS(undo_count_ == undo_count, errc::corrupt_payload,
                w + ": " + std::to_string(undo_count_) + " undo payloads, header declares " +
                    std::to_string(undo_count));
  }

  void bind(const safetensors_header& base, std::string_view base_json,
            std::string_view base_what) {
    const std::string what(base_what);
    registry_ = tensor_registry(base.canonical_tensors());
    DCR_EXPECTS(registry_.fingerprint() == fingerprint_ && registry_.size() == tensor_count_,
                errc::registry_mismatch,
                what + " holds other tensors than the base of " + where_ + " (" +
                    std::to_string(registry_.size()) + " tensors, registry fingerprint " +
                    hex64(registry_.fingerprint()) + "; the delta's base: " +
                    std::to_string(tensor_count_) + " tensors, " + hex64(fingerprint_) +
                    "): names, dtypes or shapes differ");
    const auto content = header_content(base_json);
    const auto base_digest = header_content_digest(base_json);
    DCR_EXPECTS(base_digest == base_header_digest_, errc::verification_failed,
                "wrong base: " + what + ": its JSON header has digest " + base_digest.hex() +
                    ", the base header of " + where_ + " " + base_header_digest_.hex() +
                    " (same tensors, but another tensor order, offsets or metadata: the "
                    "delta's target header is coded against its base's header, so only that "
                    "base can be used)");
    std::string target(static_cast<std::size_t>(target_size_), '\0');
    std::unique_ptr<ZSTD_DCtx, detail::zstd_dctx_deleter> ctx(ZSTD_createDCtx());
    if (!ctx) throw std::bad_alloc();
    const auto code = target_header_code();
    const std::size_t n = ZSTD_decompress_usingDict(ctx.get(), target.data(), target.size(),
                                                    code.data(), code.size(), content.data(),
                                                    content.size());
    DCR_EXPECTS(!ZSTD_isError(n) && n == target.size(), errc::corrupt_payload,
                where_ + ": the target header does not decode against " + what + "'s header" +
                    (ZSTD_isError(n) ? std::string(": ") + ZSTD_getErrorName(n) : std::string()));
    DCR_EXPECTS(header_content_digest(target) == target_header_digest_, errc::corrupt_payload,
                where_ + ": the decoded target header has digest " +
                    header_content_digest(target).hex() + ", the recorded " +
                    target_header_digest_.hex());
    auto parsed = parse_safetensors_header(target, tensor_bytes_, where_ + " (target header)");
    DCR_EXPECTS(parsed.tensors().size() == registry_.size(), errc::corrupt_payload,
                where_ + ": the target header has " + std::to_string(parsed.tensors().size()) +
                    " tensors, the base " + std::to_string(registry_.size()));
    for (const auto& t : registry_.tensors()) {
      const auto* e = parsed.find(t.name);
      DCR_EXPECTS(e != nullptr && e->type == t.type && e->shape == t.shape, errc::corrupt_payload,
                  where_ + ": tensor '" + t.name +
                      "' of the base is not in the target header as the same dtype and shape");
    }
    target_json_ = std::move(target);
    target_ = std::move(parsed);
    bound_ = true;
  }

  static std::string hex64(std::uint64_t v) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(16, '0');
    for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 15];
    return s;
  }

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
  void decode(std::size_t i, std::vector<item>& items) {
    const auto expect = d_.expected_transition(i);
    const bool undo = d_.is_undo(i);
    const std::string where = d_.where() + ": payload " + std::to_string(i) + " at byte " +
                              std::to_string(d_.payload_offset(i));
    auto& next = next_[undo ? 1 : 0];
    DCR_EXPECTS(i >= next, errc::invalid_argument,
                where + ": decoded out of order (payload " + std::to_string(next) +
                    " or later expected)");
    next = i + 1;
    payload_header h;
    try {
      h = decoder_.decode(d_.payload(i), d_.registry(), items, &expect);
    } catch (const error& e) {
      throw error(e.dcr_code(), where + ": " + e.what());
    }
    DCR_EXPECTS(h.id.owner == 0 && h.id.sequence == d_.expected_sequence(i),
                errc::duplicate_payload,
                where + ": owner " + std::to_string(h.id.owner) + " sequence " +
                    std::to_string(h.id.sequence) + ", expected owner 0 sequence " +
                    std::to_string(d_.expected_sequence(i)) +
                    " (payloads reordered or duplicated)");
    auto& last = last_[undo ? 1 : 0];
    auto& seen = seen_[undo ? 1 : 0];
    for (const auto& it : items) {
      DCR_EXPECTS(d_.kind() != container_kind::journal || it.enc == encoding::overwrite,
                  errc::corrupt_payload,
                  where + ": journal item of tensor id " + std::to_string(it.tensor) +
                      " is not an overwrite item");
      if (it.indices.empty()) continue;
      DCR_EXPECTS(!seen[it.tensor] || it.indices.front() > last[it.tensor], errc::corrupt_payload,
                  where + ": tensor '" + d_.registry().tensors()[it.tensor].name +
                      "' element " + std::to_string(it.indices.front()) +
                      " comes after element " + std::to_string(last[it.tensor]) +
                      " of an earlier payload (each element may be listed once, in increasing "
                      "order across payloads)");
      seen[it.tensor] = true;
      last[it.tensor] = it.indices.back();
    }
  }

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
               std::string_view base_header_json)
      : kind_(kind), fingerprint_(registry.fingerprint()),
        tensor_count_(static_cast<std::uint32_t>(registry.size())),
        target_size_(target_header_json.size()),
        base_header_digest_(header_content_digest(base_header_json)),
        target_header_digest_(header_content_digest(target_header_json)), out_(target) {
    DCR_EXPECTS(registry.size() <= std::numeric_limits<std::uint32_t>::max(), errc::overflow,
                "delta_writer: too many tensors");
    DCR_EXPECTS(target_header_json.size() <= safetensors_max_header_size &&
                    base_header_json.size() <= safetensors_max_header_size,
                errc::overflow, "delta_writer: JSON header too large");
    for (const auto& t : registry.tensors()) tensor_bytes_ += static_cast<std::uint64_t>(t.bytes());
    if (kind == container_kind::journal) base_json_ = base_header_json;
    code_ = detail::code_target_header(target_header_json, header_content(base_header_json));
    head_end_ = delta_format::header_size + base_json_.size() + code_.size();
    at_ = head_end_;
    body_hash_ = XXH3_createState();
    if (body_hash_ == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(body_hash_);
  }
  delta_writer(const delta_writer&) = delete;
  delta_writer& operator=(const delta_writer&) = delete;
  ~delta_writer() { XXH3_freeState(body_hash_); }

  /// Records tensors_digest of the base's and of the result's tensors.
  void set_digests(const digest128& base, const digest128& result) {
    base_digest_ = base;
    result_digest_ = result;
  }

  /// Appends one encoded payload (its header's transition says redo/delta or undo).
  void append_payload(std::span<const std::byte> payload) {
    DCR_EXPECTS(!finished_, errc::not_ready, "delta_writer: payload appended after finish()");
    const auto id = payload_decoder::peek_header(payload).id.attempt;
    const bool undo = id.base_version == 1 && id.target_version == 0;
    DCR_EXPECTS(!undo || kind_ == container_kind::journal, errc::invalid_argument,
                "delta_writer: undo payload in a delta file");
    DCR_EXPECTS(payloads_ < std::numeric_limits<std::uint32_t>::max(), errc::overflow,
                "delta_writer: too many payloads");
    out_.write_at(payload, at_);
    XXH3_64bits_update(body_hash_, payload.data(), payload.size());
    at_ += payload.size();
    ++payloads_;
    undo_payloads_ += undo ? 1 : 0;
  }

  /// Bytes written so far (the final size once the trailer is added by finish()).
  [[nodiscard]] std::uint64_t size() const noexcept {
    return at_ + (finished_ ? 0 : delta_format::trailer_size);
  }
  [[nodiscard]] std::uint32_t payload_count() const noexcept { return payloads_; }
  [[nodiscard]] const std::filesystem::path& temp_path() const noexcept {
    return out_.temp_path();
  }

  /// Writes header, headers and trailer, and fsyncs the temporary file. The target path is not
  /// touched yet.
  void finish() {
    if (finished_) return;
    std::vector<std::byte> head(head_end_);
    std::byte* p = head.data();
    using dcr::detail::store_le;
    const auto magic = detail::magic_of(kind_);
    std::memcpy(p, magic.data(), 8);
    store_le<std::uint16_t>(p + 8, delta_format::version);
    store_le<std::uint16_t>(p + 10, delta_format::header_size);
    store_le<std::uint32_t>(p + 12, 0);
    const std::uint64_t total = at_ + delta_format::trailer_size;
    store_le<std::uint64_t>(p + 16, total);
    store_le<std::uint64_t>(p + 24, fingerprint_);
    store_le<std::uint32_t>(p + 32, tensor_count_);
    store_le<std::uint32_t>(p + 36, payloads_);
    store_le<std::uint32_t>(p + 40, undo_payloads_);
    store_le<std::uint32_t>(p + 44, static_cast<std::uint32_t>(base_json_.size()));
    store_le<std::uint64_t>(p + 48, tensor_bytes_);
    store_le<std::uint64_t>(p + 56, target_size_);
    store_le<std::uint64_t>(p + 64, code_.size());
    std::memcpy(p + 72, base_header_digest_.bytes.data(), 16);
    std::memcpy(p + 88, target_header_digest_.bytes.data(), 16);
    std::memcpy(p + 104, base_digest_.bytes.data(), 16);
    std::memcpy(p + 120, result_digest_.bytes.data(), 16);
    std::byte* q = p + delta_format::header_size;
    if (!base_json_.empty()) std::memcpy(q, base_json_.data(), base_json_.size());
    q += base_json_.size();
    std::memcpy(q, code_.data(), code_.size());
    std::byte trailer[delta_format::trailer_size];
    store_le<std::uint64_t>(trailer, XXH3_64bits(head.data(), head.size()));
    store_le<std::uint64_t>(trailer + 8, XXH3_64bits_digest(body_hash_));
    out_.write_at(head, 0);
    out_.write_at(trailer, at_);
    at_ += delta_format::trailer_size;
    out_.sync();
    finished_ = true;
  }

  /// finish(), then rename over the target and fsync its directory. Returns the file size.
  std::uint64_t commit() {
    finish();
    out_.commit();
    return at_;
  }

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
