// dcr/codec/item.hpp: records, items and payload identity: the vocabulary shared by the owner
// side (detect, project, encode) and the receiver side (decode, validate, apply).
//
// A record is (destination, new bits) for one changed canonical element. An item is one owner's
// records for one canonical tensor, with the values already expressed in the item's encoding:
// xor masks (old ^ new), ulp deltas, or the new bits themselves (overwrite). A payload packs
// items of one owner for one attempt of one transition.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <xxhash.h>

#include "dcr/canonical.hpp"
#include "dcr/dtype.hpp"

namespace dcr {

/// How an item's values turn resident bits into new bits. The numeric values are part of the
/// payload format.
enum class encoding : std::uint8_t {
  overwrite = 0,  ///< value = new bits. Idempotent; always allowed; the only one retries use.
  xor_mask = 1,   ///< value = old ^ new. Needs resident == committed bits, bit-preserving path.
  ulp = 2,        ///< value = key(new) - key(old) mod 2^w. Same preconditions as xor.
};

/// Which encodings an attempt may use.
enum class encoding_policy : std::uint8_t {
  mixed = 0,           ///< the smallest permitted encoding per item (default)
  overwrite_only = 1,  ///< retries and dense restores
  xor_only = 2,        ///< xor wherever permitted, overwrite elsewhere
  ulp_only = 3,        ///< ulp wherever permitted, overwrite elsewhere
};

/// One owner's changes to one canonical tensor.
struct item {
  tensor_id tensor = 0;
  dtype type = dtype::bf16;
  encoding enc = encoding::overwrite;
  /// Sorted, strictly increasing canonical flat indices.
  std::vector<std::uint64_t> indices;
  /// indices.size() words of dtype_size(type) bytes each, in host byte order, in the item's
  /// encoding (masks, deltas or new bits).
  std::vector<std::byte> values;

  [[nodiscard]] std::size_t count() const noexcept { return indices.size(); }
  [[nodiscard]] std::size_t word_bytes() const noexcept { return dtype_size(type); }

  /// Typed view of the values; W must have the width of `type`.
  template <storage_word W>
  [[nodiscard]] std::span<const W> words() const noexcept {
    return {reinterpret_cast<const W*>(values.data()), indices.size()};
  }
  template <storage_word W>
  [[nodiscard]] std::span<W> words() noexcept {
    return {reinterpret_cast<W*>(values.data()), indices.size()};
  }
};

/// One attempt of one transition: the unit an attempt record fences and a manifest describes.
/// A restore of version v (a dense overwrite for receivers that join) is the "transition"
/// v -> v with its own attempt numbers. to_string spells it as text, parse_attempt_key reads
/// that back.
struct attempt_key {
  std::uint64_t base_version = 0;
  std::uint64_t target_version = 0;
  /// Attempts of one base version are numbered together from 0, restores and refits alike.
  std::uint32_t number = 0;
  friend constexpr bool operator==(const attempt_key&, const attempt_key&) = default;
  friend constexpr auto operator<=>(const attempt_key&, const attempt_key&) = default;
};

/// Identifies one payload; receivers apply each id at most once per transition. Ordered by
/// attempt, then owner, then sequence, so that one attempt's ids are contiguous in a sorted
/// set. to_string spells it as text, parse_payload_id reads that back.
struct payload_id {
  attempt_key attempt;          ///< the attempt that built it
  std::uint32_t owner = 0;      ///< the owner that built it
  std::uint32_t sequence = 0;   ///< its place among that owner's payloads of the attempt
  friend constexpr bool operator==(const payload_id&, const payload_id&) = default;
  friend constexpr auto operator<=>(const payload_id&, const payload_id&) = default;
};

/// "t<base>-<target>-a<number>", e.g. "t3-4-a1": the one text spelling of an attempt, in
/// control-plane keys, store object and file names, and messages.
std::string to_string(const attempt_key& k);

/// "t<base>-<target>-a<number>-o<owner>-p<sequence>", e.g. "t3-4-a1-o2-p5": the one text
/// spelling of a payload id.
std::string to_string(const payload_id& id);

namespace detail {

/// Takes "<tag><decimal>" off the front of `text`: the decimal as std::to_string writes it (no
/// sign, no leading zero), at most `limit`. Leaves `text` alone and returns nullopt otherwise.
std::optional<std::uint64_t> take_number(std::string_view& text, std::string_view tag,
                                                std::uint64_t limit);

/// `text` is "<tag><decimal>" and nothing else (the decimal as take_number reads it); nullopt
/// otherwise. The one reader of the numbers in dcr's own names and manifests.
std::optional<std::uint64_t> parse_number(std::string_view text, std::string_view tag,
                                          std::uint64_t limit);

/// Takes what to_string(const attempt_key&) writes off the front of `text`.
std::optional<attempt_key> take_attempt_key(std::string_view& text);

}  // namespace detail

/// The attempt key `text` spells, exactly as to_string wrote it; nullopt for any other text.
std::optional<attempt_key> parse_attempt_key(std::string_view text);

/// The payload id `text` spells, exactly as to_string wrote it; nullopt for any other text.
std::optional<payload_id> parse_payload_id(std::string_view text);

/// The digest of one payload id in an order-independent set digest: a set's digest is the sum
/// (mod 2^64) of its ids' digests. Owners report it over their manifest, receivers over what
/// they applied of an attempt, and the coordinator commits only when the two agree. Hashes the
/// fields, never the struct's padding.
std::uint64_t payload_id_digest(const payload_id& id) noexcept;

/// The header fields a payload carries besides its items.
struct payload_header {
  payload_id id;
  /// tensor_registry::fingerprint() of the model the items address.
  std::uint64_t registry_fingerprint = 0;
};

}  // namespace dcr

#include "dcr/detail/codec/item.inl"
