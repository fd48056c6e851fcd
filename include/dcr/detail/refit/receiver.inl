// dcr/detail/refit/receiver.inl: the bodies of dcr/refit/receiver.hpp (included at its end).
// receiver_base is loader-independent: compiled once in separate compilation
// (DCR_HEADER_BODIES, dcr/config.hpp).
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_REFIT)

namespace dcr {

DCR_INLINE receiver_base::~receiver_base() = default;

DCR_INLINE void receiver_base::begin_attempt(const attempt_key& key) {
  if (!has_attempt_ || key.base_version != current_.base_version ||
      key.target_version != current_.target_version) {
    ledger_.reset_for(key.base_version, key.target_version);
    stats_ = {};
  } else if (key != current_) {
    stats_.attempt_payloads = 0;
    stats_.attempt_payload_digest = 0;
  }
  if (!has_attempt_ || key != current_) written_failure_.reset();  // the same attempt again keeps it
  current_ = key;
  has_attempt_ = true;
}

DCR_INLINE apply_outcome receiver_base::apply_payload(std::span<const std::byte> bytes,
                                                      const apply_options& options) {
  DCR_EXPECTS(has_attempt_, errc::not_ready, "receiver: payload before begin_attempt");
  if (written_failure_) throw error(written_failure_->first, written_failure_->second);
  const auto t0 = clock::now();
  // Validate everything (checksum included) before trusting the id: a header damaged into a
  // seen id must be reported as corrupt, not silently dropped as a duplicate.
  const payload_header header = decoder_.decode(bytes, *registry_, items_, &current_);
  if (ledger_.seen(header.id)) {
    ++stats_.duplicates_dropped;
    return apply_outcome::duplicate;
  }
  const auto t1 = clock::now();
  apply_stats s;
  try {
    s = applier_->apply(items_, options);
  } catch (const error& e) {
    if (!refused_before_writes(e.dcr_code()))
      written_failure_.emplace(e.dcr_code(), "receiver: attempt " + to_string(current_) +
                                                 " is refused from here on: a payload of it failed after "
                                                 "its writes had begun (" + std::string(e.what()) + ")");
    throw;
  }
  ledger_.mark(header.id);
  const auto t2 = clock::now();
  ++stats_.payloads_applied;
  ++stats_.attempt_payloads;
  stats_.attempt_payload_digest += payload_id_digest(header.id);
  stats_.payload_bytes += bytes.size();
  stats_.records += s.records;
  stats_.writes += s.writes;
  stats_.verified += s.verified;
  stats_.decode_seconds += seconds(t1 - t0);
  stats_.apply_seconds += seconds(t2 - t1);
  return apply_outcome::applied;
}

DCR_INLINE void receiver_base::end_transition(std::uint64_t version) {
  committed_version_ = version;
  has_attempt_ = false;
}

DCR_INLINE std::span<const tensor_id> receiver_base::overwrite_only_tensors() const {
  if (!applier_->prewarmed()) return {};
  return applier_->overwrite_only_tensors();
}

DCR_INLINE bool receiver_base::refused_before_writes(errc code) {
  switch (code) {
    case errc::not_ready:
    case errc::unknown_tensor:
    case errc::dtype_mismatch:
    case errc::invalid_argument:
    case errc::out_of_range:
    case errc::unsupported_version:
    case errc::unsupported_loader_path:
      return true;
    default:
      return false;
  }
}

}  // namespace dcr

#endif  // DCR_HEADER_BODIES
