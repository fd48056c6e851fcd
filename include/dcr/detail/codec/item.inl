// dcr/detail/codec/item.inl: the bodies of dcr/codec/item.hpp (included at its end).
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_PROTOCOL)

namespace dcr {

DCR_INLINE std::string to_string(const attempt_key& k) {
  std::string text = "t";  // appended, never "t" + ...: g++ 12 warns falsely (-Wrestrict) there
  text += std::to_string(k.base_version);
  text += '-';
  text += std::to_string(k.target_version);
  text += "-a";
  text += std::to_string(k.number);
  return text;
}

DCR_INLINE std::string to_string(const payload_id& id) {
  std::string text = to_string(id.attempt);
  text += "-o";
  text += std::to_string(id.owner);
  text += "-p";
  text += std::to_string(id.sequence);
  return text;
}

}  // namespace dcr

namespace dcr::detail {

DCR_INLINE std::optional<std::uint64_t> take_number(std::string_view& text, std::string_view tag,
                                                    std::uint64_t limit) {
  if (!text.starts_with(tag)) return std::nullopt;
  const auto digits = text.substr(tag.size());
  std::size_t n = 0;
  while (n < digits.size() && digits[n] >= '0' && digits[n] <= '9') ++n;
  if (n == 0 || (n > 1 && digits[0] == '0')) return std::nullopt;
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + n, v);
  if (ec != std::errc{} || end != digits.data() + n || v > limit) return std::nullopt;
  text.remove_prefix(tag.size() + n);
  return v;
}

DCR_INLINE std::optional<std::uint64_t> parse_number(std::string_view text, std::string_view tag,
                                                     std::uint64_t limit) {
  const auto v = take_number(text, tag, limit);
  if (!v || !text.empty()) return std::nullopt;
  return v;
}

DCR_INLINE std::optional<attempt_key> take_attempt_key(std::string_view& text) {
  std::string_view rest = text;
  const auto base = take_number(rest, "t", UINT64_MAX);
  const auto target = base ? take_number(rest, "-", UINT64_MAX) : std::nullopt;
  const auto number = target ? take_number(rest, "-a", UINT32_MAX) : std::nullopt;
  if (!number) return std::nullopt;
  text = rest;
  return attempt_key{*base, *target, static_cast<std::uint32_t>(*number)};
}

}  // namespace dcr::detail

namespace dcr {

DCR_INLINE std::optional<attempt_key> parse_attempt_key(std::string_view text) {
  auto k = detail::take_attempt_key(text);
  return k && text.empty() ? k : std::nullopt;
}

DCR_INLINE std::optional<payload_id> parse_payload_id(std::string_view text) {
  const auto k = detail::take_attempt_key(text);
  const auto owner = k ? detail::take_number(text, "-o", UINT32_MAX) : std::nullopt;
  const auto sequence = owner ? detail::take_number(text, "-p", UINT32_MAX) : std::nullopt;
  if (!sequence || !text.empty()) return std::nullopt;
  return payload_id{*k, static_cast<std::uint32_t>(*owner), static_cast<std::uint32_t>(*sequence)};
}

DCR_INLINE std::uint64_t payload_id_digest(const payload_id& id) noexcept {
  const std::uint64_t words[4] = {id.attempt.base_version, id.attempt.target_version,
                                  (std::uint64_t{id.attempt.number} << 32) | id.owner, id.sequence};
  return XXH64(words, sizeof words, 0x64637270);  // "dcrp"
}

}  // namespace dcr

#endif  // DCR_HEADER_BODIES
