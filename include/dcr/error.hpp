// dcr/error.hpp: the one exception type dcr throws at its API boundary, and its stable codes.
//
// Every failure a user can cause (bad payload, wrong base version, hostile index, missing file,
// unsupported loader path) surfaces as `dcr::error`, a std::system_error whose code is in
// `dcr::error_category()`. Codes are stable across releases: match on them, not on messages.
// Messages say what failed and where (tensor, item, byte offset, file).
#pragma once

#include <string>
#include <system_error>
#include <type_traits>

namespace dcr {

/// Stable error codes. Values never change once released; new codes are appended.
enum class errc : int {
  ok = 0,
  invalid_argument = 1,        ///< a caller passed an argument outside the contract
  shape_mismatch = 2,          ///< tensor extents or element counts disagree
  dtype_mismatch = 3,          ///< element type differs from the one declared
  out_of_range = 4,            ///< an index or offset lies outside its tensor or buffer
  corrupt_payload = 5,         ///< checksum, framing or decompression failure
  truncated_payload = 6,       ///< payload shorter than its header declares
  unsupported_version = 7,     ///< format version or feature not understood
  reserved_bits_set = 8,       ///< a reserved field is not zero
  stale_payload = 9,           ///< payload belongs to another transition or attempt
  duplicate_payload = 10,      ///< payload id was already applied
  unknown_tensor = 11,         ///< tensor id or name not in the registry
  unsupported_loader_path = 12,///< loader path breaks a condition of the requested encoding
  commit_conflict = 13,        ///< compare-and-set on the commit record lost
  transport_failure = 14,      ///< a transport could not deliver or fetch
  io_error = 15,               ///< a file could not be read, written or renamed
  verification_failed = 16,    ///< a result digest or post-apply check disagreed
  fenced_attempt = 17,         ///< a write from an attempt that was fenced off
  not_ready = 18,              ///< an operation was called out of protocol order
  overflow = 19,               ///< a size or count does not fit its field
  device_error = 20,           ///< a CUDA runtime call failed
  registry_mismatch = 21,      ///< payload or record built for another model (fingerprint)
  control_plane_unavailable = 22,  ///< the control plane (file store, etcd) could not be reached
  deadline_exceeded = 23,      ///< a protocol wait ran past its deadline
};

/// The category of `dcr::errc`; name "dcr".
const std::error_category& error_category() noexcept;

inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// The exception dcr throws. `code()` is a `dcr::errc` in `dcr::error_category()`.
class error : public std::system_error {
 public:
  error(errc code, const std::string& what) : std::system_error(make_error_code(code), what) {}
  /// The dcr code, without going through std::error_code.
  [[nodiscard]] errc dcr_code() const noexcept { return static_cast<errc>(code().value()); }
};

namespace detail {
class error_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "dcr"; }
  std::string message(int c) const override {
    switch (static_cast<errc>(c)) {
      case errc::ok: return "ok";
      case errc::invalid_argument: return "invalid argument";
      case errc::shape_mismatch: return "shape mismatch";
      case errc::dtype_mismatch: return "dtype mismatch";
      case errc::out_of_range: return "index out of range";
      case errc::corrupt_payload: return "corrupt payload";
      case errc::truncated_payload: return "truncated payload";
      case errc::unsupported_version: return "unsupported format version";
      case errc::reserved_bits_set: return "reserved bits set";
      case errc::stale_payload: return "stale payload";
      case errc::duplicate_payload: return "duplicate payload";
      case errc::unknown_tensor: return "unknown tensor";
      case errc::unsupported_loader_path: return "unsupported loader path";
      case errc::commit_conflict: return "commit conflict";
      case errc::transport_failure: return "transport failure";
      case errc::io_error: return "I/O error";
      case errc::verification_failed: return "verification failed";
      case errc::fenced_attempt: return "fenced attempt";
      case errc::not_ready: return "called out of protocol order";
      case errc::overflow: return "size overflow";
      case errc::device_error: return "device error";
      case errc::registry_mismatch: return "registry mismatch";
      case errc::control_plane_unavailable: return "control plane unavailable";
      case errc::deadline_exceeded: return "deadline exceeded";
    }
    return "unknown dcr error";
  }
};
}  // namespace detail

inline const std::error_category& error_category() noexcept {
  static const detail::error_category_impl category;
  return category;
}

/// Throws dcr::error(code, message) unless `condition` holds. For API-boundary checks only;
/// device code never throws.
#define DCR_EXPECTS(condition, code, message)                 \
  do {                                                        \
    if (!(condition)) [[unlikely]] {                          \
      throw ::dcr::error((code), (message));                  \
    }                                                         \
  } while (0)

}  // namespace dcr

template <>
struct std::is_error_code_enum<dcr::errc> : std::true_type {};
