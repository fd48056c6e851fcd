// dcr/io/delta.hpp: the delta file, a self-contained record of how one safetensors checkpoint
// becomes another (normative layout: docs/tool.md, "Delta file format").
//
//   Header     64 bytes: magic "DCRDELTA", version, sizes, registry fingerprint, counts
//   Manifest   per tensor (in registry order, i.e. by name): name, dtype, shape, XXH3-128 of
//              its bytes in the base checkpoint and in the result
//   Target     the result file's JSON header, verbatim (layout and "__metadata__")
//   Payloads   zero or more dcr payloads (docs/format.md) whose registry is the manifest
//   Trailer    XXH3-64 of everything before the payloads, XXH3-64 of the payloads
//
// The same container, with magic "DCRJOURN", is the journal of an in-place apply: it also holds
// the base file's JSON header, and its payloads are overwrite items, each payload either redo
// (new bits; transition 0 -> 1) or undo (old bits; transition 1 -> 0).
//
// `delta_file` maps and validates a container before anything reads it: framing, both
// checksums, the manifest (names strictly increasing, known dtypes, sizes that fit), the target
// header (a valid safetensors header naming exactly the manifest's tensors), and the payload
// boundaries. Each payload's contents are validated by dcr::payload_decoder against the manifest
// when it is decoded. `delta_writer` streams payloads to a temporary file and publishes the
// container atomically.
#pragma once

#include <xxhash.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/detail/varint.hpp"
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

/// Which kind of container a file is.
enum class container_kind : std::uint8_t {
  delta = 0,    ///< magic "DCRDELTA": written by diff, read by apply and inspect
  journal = 1,  ///< magic "DCRJOURN": the redo/undo journal of an in-place apply
};

/// Constants of delta file format version 1 (docs/tool.md).
namespace delta_format {
inline constexpr std::array<char, 8> delta_magic = {'D', 'C', 'R', 'D', 'E', 'L', 'T', 'A'};
inline constexpr std::array<char, 8> journal_magic = {'D', 'C', 'R', 'J', 'O', 'U', 'R', 'N'};
inline constexpr std::uint16_t version = 1;
inline constexpr std::size_t header_size = 64;
inline constexpr std::size_t trailer_size = 16;
inline constexpr std::size_t max_name_length = 65535;
inline constexpr std::size_t max_rank = 255;
/// Payload ids: delta and redo payloads are transition 0 -> 1, undo payloads 1 -> 0, attempt
/// 0, owner 0, sequence = position among payloads of their direction.
inline constexpr attempt_key forward{0, 1, 0};
inline constexpr attempt_key backward{1, 0, 0};
}  // namespace delta_format

/// One manifest entry: a tensor of the checkpoint and the digests of its bytes before and after.
struct manifest_entry {
  canonical_tensor tensor;
  digest128 base_digest;
  digest128 result_digest;
};

namespace detail {

inline std::span<const char> magic_of(container_kind kind) {
  return kind == container_kind::delta ? std::span<const char>(delta_format::delta_magic)
                                       : std::span<const char>(delta_format::journal_magic);
}
inline const char* kind_name(container_kind kind) {
  return kind == container_kind::delta ? "delta file" : "journal";
}

/// Bytes of one manifest entry.
inline std::size_t manifest_entry_size(const canonical_tensor& t) {
  return 2 + t.name.size() + 2 + 8 * t.shape.size() + 32;
}

inline void put_manifest(std::byte*& p, const manifest_entry& e) {
  using dcr::detail::store_le;
  store_le<std::uint16_t>(p, static_cast<std::uint16_t>(e.tensor.name.size()));
  p += 2;
  std::memcpy(p, e.tensor.name.data(), e.tensor.name.size());
  p += e.tensor.name.size();
  store_le<std::uint8_t>(p++, static_cast<std::uint8_t>(e.tensor.type));
  store_le<std::uint8_t>(p++, static_cast<std::uint8_t>(e.tensor.shape.size()));
  for (auto x : e.tensor.shape) {
    store_le<std::uint64_t>(p, static_cast<std::uint64_t>(x));
    p += 8;
  }
  std::memcpy(p, e.base_digest.bytes.data(), 16);
  std::memcpy(p + 16, e.result_digest.bytes.data(), 16);
  p += 32;
}

}  // namespace detail

/// A validated, read-only view of a delta file or journal (see the top of this file). open()
/// maps the file and keeps the mapping; parse() views bytes the caller keeps alive.
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

  [[nodiscard]] container_kind kind() const noexcept { return kind_; }
  [[nodiscard]] const std::string& where() const noexcept { return where_; }
  /// The whole container.
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return bytes_; }
  /// The manifest as a registry: tensor ids index tensors().
  [[nodiscard]] const tensor_registry& registry() const noexcept { return registry_; }
  /// Manifest entries in tensor id order.
  [[nodiscard]] std::span<const manifest_entry> tensors() const noexcept { return manifest_; }
  /// The result's JSON header bytes (verbatim, padding included) and their parse.
  [[nodiscard]] std::string_view target_header_json() const noexcept { return target_json_; }
  [[nodiscard]] const safetensors_header& target_header() const noexcept { return target_; }
  /// The base's JSON header bytes (journals only; empty in a delta file).
  [[nodiscard]] std::string_view base_header_json() const noexcept { return base_json_; }
  /// Number of payloads, and the i-th (framing checked; contents checked by the decoder).
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
  /// Sum of the manifest's tensor sizes in bytes.
  [[nodiscard]] std::uint64_t tensor_bytes() const noexcept { return tensor_bytes_; }

 private:
  void validate(std::span<const std::byte> bytes, std::string where, container_kind kind) {
    using dcr::detail::load_le;
    where_ = std::move(where);
    bytes_ = bytes;
    kind_ = kind;
    const std::string& w = where_;
    const char* what = detail::kind_name(kind);
    const auto magic = detail::magic_of(kind);
    DCR_EXPECTS(bytes.size() >= 8 && std::memcmp(bytes.data(), magic.data(), 8) == 0,
                errc::corrupt_payload,
                w + ": not a dcr " + what + " (magic '" + std::string(magic.data(), 8) +
                    "' missing)");
    DCR_EXPECTS(bytes.size() >= delta_format::header_size + delta_format::trailer_size,
                errc::truncated_payload,
                w + ": " + std::to_string(bytes.size()) + " bytes, shorter than an empty " + what);
    const std::byte* p = bytes.data();
    const auto version = load_le<std::uint16_t>(p + 8);
    DCR_EXPECTS(version == delta_format::version, errc::unsupported_version,
                w + ": " + what + " format version " + std::to_string(version) +
                    ", this build reads " + std::to_string(delta_format::version));
    DCR_EXPECTS(load_le<std::uint16_t>(p + 10) == delta_format::header_size,
                errc::corrupt_payload, w + ": header size differs from version 1's 64 bytes");
    DCR_EXPECTS(load_le<std::uint32_t>(p + 12) == 0, errc::reserved_bits_set,
                w + ": header flags (bytes 12-15) not zero");
    const auto total = load_le<std::uint64_t>(p + 16);
    DCR_EXPECTS(total <= bytes.size(), errc::truncated_payload,
                w + ": " + std::to_string(bytes.size()) + " bytes, header declares " +
                    std::to_string(total));
    DCR_EXPECTS(total == bytes.size(), errc::corrupt_payload,
                w + ": " + std::to_string(bytes.size() - total) +
                    " bytes after the declared end at byte " + std::to_string(total));
    const auto fingerprint = load_le<std::uint64_t>(p + 24);
    const auto tensor_count = load_le<std::uint32_t>(p + 32);
    const auto payload_count = load_le<std::uint32_t>(p + 36);
    const auto manifest_size = load_le<std::uint64_t>(p + 40);
    const auto target_size = load_le<std::uint64_t>(p + 48);
    const auto base_size = load_le<std::uint32_t>(p + 56);
    const auto undo_count = load_le<std::uint32_t>(p + 60);
    if (kind == container_kind::delta)
      DCR_EXPECTS(base_size == 0 && undo_count == 0, errc::reserved_bits_set,
                  w + ": base header size and undo count (bytes 56-63) not zero in a delta file");
    DCR_EXPECTS(undo_count <= payload_count, errc::corrupt_payload,
                w + ": " + std::to_string(undo_count) + " undo payloads of " +
                    std::to_string(payload_count));
    // Sections, checked by subtraction so hostile sizes cannot overflow.
    std::uint64_t left = total - delta_format::header_size - delta_format::trailer_size;
    DCR_EXPECTS(manifest_size <= left && target_size <= left - manifest_size &&
                    base_size <= left - manifest_size - target_size,
                errc::corrupt_payload,
                w + ": sections of " + std::to_string(manifest_size) + " + " +
                    std::to_string(target_size) + " + " + std::to_string(base_size) +
                    " bytes overrun the " + std::to_string(total) + "-byte file");
    const std::uint64_t head_end = delta_format::header_size + manifest_size + target_size +
                                   base_size;
    const std::uint64_t body_end = total - delta_format::trailer_size;
    const auto head_sum = load_le<std::uint64_t>(p + body_end);
    const auto body_sum = load_le<std::uint64_t>(p + body_end + 8);
    DCR_EXPECTS(head_sum == XXH3_64bits(p, head_end), errc::corrupt_payload,
                w + ": checksum of the header, manifest and JSON headers (bytes 0.." +
                    std::to_string(head_end) + ") mismatch");
    DCR_EXPECTS(body_sum == XXH3_64bits(p + head_end, body_end - head_end), errc::corrupt_payload,
                w + ": checksum of the payloads (bytes " + std::to_string(head_end) + ".." +
                    std::to_string(body_end) + ") mismatch");

    parse_manifest(bytes.subspan(delta_format::header_size, manifest_size), tensor_count);
    DCR_EXPECTS(registry_.fingerprint() == fingerprint, errc::registry_mismatch,
                w + ": the manifest's registry fingerprint differs from the header's");

    const std::size_t target_at = delta_format::header_size + manifest_size;
    target_json_ = std::string_view(reinterpret_cast<const char*>(p + target_at), target_size);
    base_json_ = std::string_view(reinterpret_cast<const char*>(p + target_at + target_size),
                                  base_size);
    target_ = parse_safetensors_header(target_json_, tensor_bytes_, w + " (target header)");
    DCR_EXPECTS(target_.tensors().size() == manifest_.size(), errc::corrupt_payload,
                w + ": the target header has " + std::to_string(target_.tensors().size()) +
                    " tensors, the manifest " + std::to_string(manifest_.size()));
    for (const auto& m : manifest_) {
      const auto* t = target_.find(m.tensor.name);
      DCR_EXPECTS(t != nullptr && t->type == m.tensor.type && t->shape == m.tensor.shape,
                  errc::corrupt_payload,
                  w + ": tensor '" + m.tensor.name +
                      "' of the manifest is not in the target header as the same dtype and shape");
    }
    if (kind == container_kind::journal) {
      DCR_EXPECTS(base_size == target_size, errc::corrupt_payload,
                  w + ": base header of " + std::to_string(base_size) +
                      " bytes, target header of " + std::to_string(target_size));
      (void)parse_safetensors_header(base_json_, tensor_bytes_, w + " (base header)");
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
      const auto id = payload_decoder::peek_header(rest.first(size)).id;
      const bool undo = id.base_version == 1 && id.target_version == 0;
      DCR_EXPECTS(kind == container_kind::journal || !undo, errc::stale_payload,
                  here + ": an undo payload in a delta file");
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

  void parse_manifest(std::span<const std::byte> m, std::uint32_t count) {
    using dcr::detail::load_le;
    const std::string& w = where_;
    manifest_.clear();
    tensor_bytes_ = 0;
    std::size_t at = 0;
    const auto need = [&](std::size_t n, std::uint32_t i) {
      DCR_EXPECTS(n <= m.size() - at, errc::corrupt_payload,
                  w + ": manifest entry " + std::to_string(i) + " overruns the manifest");
    };
    for (std::uint32_t i = 0; i < count; ++i) {
      manifest_entry e;
      need(2, i);
      const auto len = load_le<std::uint16_t>(m.data() + at);
      at += 2;
      need(len, i);
      e.tensor.name.assign(reinterpret_cast<const char*>(m.data() + at), len);
      at += len;
      const std::string here = w + ": manifest entry " + std::to_string(i) + " ('" +
                               e.tensor.name + "')";
      DCR_EXPECTS(len > 0, errc::corrupt_payload, here + ": empty name");
      DCR_EXPECTS(manifest_.empty() || manifest_.back().tensor.name < e.tensor.name,
                  errc::corrupt_payload, here + ": names not strictly increasing");
      need(2, i);
      const auto type = dtype_from_code(load_le<std::uint8_t>(m.data() + at));
      DCR_EXPECTS(type.has_value(), errc::unsupported_version,
                  here + ": unknown dtype code " +
                      std::to_string(load_le<std::uint8_t>(m.data() + at)));
      e.tensor.type = *type;
      const auto rank = load_le<std::uint8_t>(m.data() + at + 1);
      at += 2;
      need(8 * std::size_t{rank} + 32, i);
      bool overflow = false;
      for (std::size_t k = 0; k < rank; ++k) {
        const auto x = load_le<std::uint64_t>(m.data() + at + 8 * k);
        overflow = overflow || x > static_cast<std::uint64_t>(
                                       std::numeric_limits<std::int64_t>::max());
        e.tensor.shape.push_back(static_cast<std::int64_t>(x));
      }
      const auto word = static_cast<std::int64_t>(dtype_size(e.tensor.type));
      const auto numel =
          overflow ? std::nullopt
                   : checked_numel(e.tensor.shape, std::numeric_limits<std::int64_t>::max() / word);
      DCR_EXPECTS(numel.has_value() &&
                      static_cast<std::uint64_t>(*numel * word) <=
                          (std::numeric_limits<std::uint64_t>::max() >> 2) - tensor_bytes_,
                  errc::overflow, here + ": shape too large");
      tensor_bytes_ += static_cast<std::uint64_t>(*numel * word);
      at += 8 * std::size_t{rank};
      std::memcpy(e.base_digest.bytes.data(), m.data() + at, 16);
      std::memcpy(e.result_digest.bytes.data(), m.data() + at + 16, 16);
      at += 32;
      manifest_.push_back(std::move(e));
    }
    DCR_EXPECTS(at == m.size(), errc::corrupt_payload,
                w + ": " + std::to_string(m.size() - at) + " bytes left over in the manifest");
    std::vector<canonical_tensor> tensors;
    tensors.reserve(manifest_.size());
    for (const auto& e : manifest_) tensors.push_back(e.tensor);
    registry_ = tensor_registry(std::move(tensors));
  }

  mapped_file file_;
  std::span<const std::byte> bytes_;
  std::string where_;
  container_kind kind_ = container_kind::delta;
  std::vector<manifest_entry> manifest_;
  tensor_registry registry_;
  std::uint64_t tensor_bytes_ = 0;
  std::string_view target_json_;
  std::string_view base_json_;
  safetensors_header target_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> payloads_;
  std::vector<bool> undo_;
  std::vector<std::uint32_t> sequence_;
  std::size_t undo_count_ = 0;
};

/// Writes a delta file or journal: the manifest and JSON headers are sized up front, payloads
/// are streamed to a temporary file beside the target as they come, digests may be set until
/// finish(), and commit() publishes the file atomically. Destroying it uncommitted removes the
/// temporary file.
class delta_writer {
 public:
  /// A writer for `target`. `registry` is the manifest (ids = positions); `target_header_json`
  /// the result file's N header bytes; `base_header_json` the base's (journals only, same
  /// length as the target's). Throws invalid_argument for names over 65535 bytes, ranks over
  /// 255 or a base header in a delta file.
  delta_writer(const std::filesystem::path& target, container_kind kind,
               const tensor_registry& registry, std::string_view target_header_json,
               std::string_view base_header_json = {})
      : kind_(kind), fingerprint_(registry.fingerprint()), target_json_(target_header_json),
        base_json_(base_header_json), out_(target) {
    DCR_EXPECTS(kind == container_kind::journal || base_json_.empty(), errc::invalid_argument,
                "delta_writer: a delta file carries no base header");
    DCR_EXPECTS(kind == container_kind::delta || base_json_.size() == target_json_.size(),
                errc::invalid_argument,
                "delta_writer: a journal's base and target headers differ in length");
    DCR_EXPECTS(base_json_.size() <= std::numeric_limits<std::uint32_t>::max(), errc::overflow,
                "delta_writer: base header too large");
    DCR_EXPECTS(registry.size() <= std::numeric_limits<std::uint32_t>::max(), errc::overflow,
                "delta_writer: too many tensors");
    manifest_.reserve(registry.size());
    std::size_t manifest_size = 0;
    for (const auto& t : registry.tensors()) {
      DCR_EXPECTS(t.name.size() <= delta_format::max_name_length, errc::invalid_argument,
                  "delta_writer: tensor name longer than 65535 bytes: '" + t.name.substr(0, 64) +
                      "...'");
      DCR_EXPECTS(t.shape.size() <= delta_format::max_rank, errc::invalid_argument,
                  "delta_writer: tensor '" + t.name + "' has more than 255 dimensions");
      manifest_.push_back({t, {}, {}});
      manifest_size += detail::manifest_entry_size(t);
    }
    manifest_size_ = manifest_size;
    head_end_ = delta_format::header_size + manifest_size + target_json_.size() + base_json_.size();
    at_ = head_end_;
    body_hash_ = XXH3_createState();
    if (body_hash_ == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(body_hash_);
  }
  delta_writer(const delta_writer&) = delete;
  delta_writer& operator=(const delta_writer&) = delete;
  ~delta_writer() { XXH3_freeState(body_hash_); }

  /// Records the digests of tensor `id`.
  void set_digests(tensor_id id, const digest128& base, const digest128& result) {
    DCR_EXPECTS(id < manifest_.size(), errc::unknown_tensor,
                "delta_writer: no tensor with id " + std::to_string(id));
    manifest_[id].base_digest = base;
    manifest_[id].result_digest = result;
  }

  /// Appends one encoded payload (its header's transition says redo/delta or undo).
  void append_payload(std::span<const std::byte> payload) {
    DCR_EXPECTS(!finished_, errc::not_ready, "delta_writer: payload appended after finish()");
    const auto id = payload_decoder::peek_header(payload).id;
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

  /// Writes header, manifest, JSON headers and trailer, and fsyncs the temporary file. The
  /// target path is not touched yet.
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
    store_le<std::uint32_t>(p + 32, static_cast<std::uint32_t>(manifest_.size()));
    store_le<std::uint32_t>(p + 36, payloads_);
    store_le<std::uint64_t>(p + 40, manifest_size_);
    store_le<std::uint64_t>(p + 48, target_json_.size());
    store_le<std::uint32_t>(p + 56, static_cast<std::uint32_t>(base_json_.size()));
    store_le<std::uint32_t>(p + 60, undo_payloads_);
    std::byte* q = p + delta_format::header_size;
    for (const auto& e : manifest_) detail::put_manifest(q, e);
    std::memcpy(q, target_json_.data(), target_json_.size());
    q += target_json_.size();
    if (!base_json_.empty()) std::memcpy(q, base_json_.data(), base_json_.size());
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
  std::string target_json_;
  std::string base_json_;
  atomic_file out_;
  std::vector<manifest_entry> manifest_;
  std::size_t manifest_size_ = 0;
  std::uint64_t head_end_ = 0;
  std::uint64_t at_ = 0;
  XXH3_state_t* body_hash_ = nullptr;
  std::uint32_t payloads_ = 0;
  std::uint32_t undo_payloads_ = 0;
  bool finished_ = false;
};

}  // namespace dcr::io
