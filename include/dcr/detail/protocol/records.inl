// dcr/detail/protocol/records.inl: the bodies of dcr/protocol/records.hpp (included at its end).
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_PROTOCOL)

namespace dcr {

DCR_INLINE std::string protocol_keys::history(std::uint64_t v) const {
  return prefix + "/history/" + std::to_string(v);
}

DCR_INLINE std::string protocol_keys::reports(const attempt_key& k) const {
  return prefix + "/reports/" + to_string(k) + "/";
}

DCR_INLINE std::string protocol_keys::report(const attempt_key& k, std::uint32_t owner) const {
  return reports(k) + std::to_string(owner);
}

DCR_INLINE std::string protocol_keys::acks(const attempt_key& k) const {
  return prefix + "/acks/" + to_string(k) + "/";
}

DCR_INLINE std::string protocol_keys::ack(const attempt_key& k, const std::string& name) const {
  return acks(k) + name;
}

}  // namespace dcr

#endif  // DCR_HEADER_BODIES
