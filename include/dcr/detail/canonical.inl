// dcr/detail/canonical.inl: the bodies of dcr/canonical.hpp (included at its end).
#pragma once

namespace dcr {

#if DCR_HEADER_BODIES_OF(DCR_PART_REFIT)

DCR_INLINE tensor_registry::tensor_registry(std::vector<canonical_tensor> tensors)
    : tensors_(std::move(tensors)) {
  std::sort(tensors_.begin(), tensors_.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::uint64_t fp = detail::fnv1a64("dcr-registry-v1");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    DCR_EXPECTS(!t.name.empty(), errc::invalid_argument, "tensor_registry: empty tensor name");
    DCR_EXPECTS(i == 0 || tensors_[i - 1].name != t.name, errc::invalid_argument,
                "tensor_registry: duplicate tensor name '" + t.name + "'");
    const std::int64_t bytes = expect_numel(t.shape, dtype_size(t.type),
                                            "tensor_registry: tensor '" + t.name + "' (" +
                                                std::string(dtype_name(t.type)) + ")") *
                               static_cast<std::int64_t>(dtype_size(t.type));
    DCR_EXPECTS(total <= std::numeric_limits<std::int64_t>::max() - bytes, errc::overflow,
                "tensor_registry: the tensors up to '" + t.name +
                    "' hold more bytes than a signed 64-bit count holds");
    total += bytes;
    by_name_.emplace(t.name, static_cast<tensor_id>(i));
    fp = detail::fnv1a64(t.name, fp);
    fp = detail::fnv1a64_u64(static_cast<std::uint64_t>(t.type), fp);
    fp = detail::fnv1a64_u64(t.shape.size(), fp);
    for (auto e : t.shape) fp = detail::fnv1a64_u64(static_cast<std::uint64_t>(e), fp);
  }
  fingerprint_ = fp;
}

DCR_INLINE const canonical_tensor& tensor_registry::at(tensor_id id) const {
  DCR_EXPECTS(id < tensors_.size(), errc::unknown_tensor,
              "tensor_registry: no tensor with id " + std::to_string(id));
  return tensors_[id];
}

DCR_INLINE std::optional<tensor_id> tensor_registry::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

DCR_INLINE tensor_id tensor_registry::id(std::string_view name) const {
  auto found = find(name);
  DCR_EXPECTS(found.has_value(), errc::unknown_tensor,
              "tensor_registry: no tensor named '" + std::string(name) + "'");
  return *found;
}

DCR_INLINE std::int64_t tensor_registry::total_bytes() const noexcept {
  std::int64_t b = 0;
  for (const auto& t : tensors_) b += t.bytes();
  return b;
}

DCR_INLINE std::int64_t tensor_registry::max_tensor_bytes() const noexcept {
  std::int64_t b = 0;
  for (const auto& t : tensors_) b = std::max(b, t.bytes());
  return b;
}

#endif  // DCR_HEADER_BODIES

}  // namespace dcr
