// dcr/detail/apply/dedupe.inl: the bodies of dcr/apply/dedupe.hpp (included at its end).
#pragma once

namespace dcr {

#if DCR_HEADER_BODIES_OF(DCR_PART_REFIT)

DCR_INLINE void payload_ledger::reset_for(std::uint64_t base_version,
                                          std::uint64_t target_version) {
  applied_.clear();
  base_ = base_version;
  target_ = target_version;
}

DCR_INLINE void payload_ledger::mark(const payload_id& id) {
  DCR_EXPECTS(applied_.insert(id).second, errc::duplicate_payload,
              "payload_ledger: payload " + to_string(id) + " was already applied");
}

#endif  // DCR_HEADER_BODIES

}  // namespace dcr
