// dcr/refit/owner_stats.hpp: the figures an owner measures while it builds an attempt, listed
// once (DCR_OWNER_STATS_FIELDS) for everything that carries them: dcr::owner::stats(), the
// owner agent's report (dcr/protocol/records.hpp, and its JSON), the in-process driver's
// attempt_report (dcr/protocol/in_process.hpp, the sum over owners), the Python binding and the
// benchmarks.
#pragma once

#include <cstdint>

namespace dcr {

/// The owner's figures, each listed once: X(type, name) per figure, its meaning beside it.
/// owner_stats has one member of each; owner_report (dcr/protocol/records.hpp) carries them as
/// is, with JSON generated from this list, and attempt_report (dcr/protocol/in_process.hpp)
/// sums them. A new figure is one line here.
#define DCR_OWNER_STATS_FIELDS(X)                                                              \
  /* Affine tasks. */                                                                          \
  X(std::uint64_t, compared_bytes)   /* candidate bytes of affine shards compared with trackers */ \
  X(std::uint64_t, changed_elements) /* source elements of affine shards whose words changed */ \
  X(double, detect_seconds)          /* comparison of affine shards */                         \
  X(double, project_seconds)         /* projection to canonical coordinates and sorting */     \
  /* Residual tasks. */                                                                        \
  X(std::uint64_t, residual_compared_bytes)   /* input bytes compared with committed copies */ \
  X(std::uint64_t, residual_changed_inputs)   /* inputs flagged changed */                     \
  X(std::uint64_t, residual_conversions)      /* outputs rebuilt (selected by the flags) */    \
  X(std::uint64_t, residual_converted_bytes)  /* canonical bytes rebuilt and compared */       \
  X(std::uint64_t, residual_changed_elements) /* rebuilt elements that differ from baseline */ \
  X(double, residual_detect_seconds)          /* input comparison (change flags) */            \
  X(double, convert_seconds)                  /* the conversion callables */                   \
  X(double, residual_compare_seconds)         /* rebuilt outputs vs the residual baseline */   \
  /* Both. */                                                                                  \
  X(std::uint64_t, items)            /* items emitted (canonical tensors touched) */           \
  X(std::uint64_t, residual_items)   /* of which built by residual tasks */                    \
  X(std::uint64_t, forced_overwrite_items) /* affine items sent as overwrite because a */      \
                                           /* receiver takes the tensor only that way */       \
  X(double, encode_seconds)          /* choosing encodings and encoding values */

/// Timings and counts of one build_items() or build_chunk() call (summed over the chunks of an
/// attempt until the next chunk 0): one member per DCR_OWNER_STATS_FIELDS entry, all zero at
/// first.
struct owner_stats {
#define DCR_OWNER_STATS_MEMBER(type, name) type name = 0;
  DCR_OWNER_STATS_FIELDS(DCR_OWNER_STATS_MEMBER)
#undef DCR_OWNER_STATS_MEMBER

  /// Adds every figure of `other` to this one (sums over chunks, owners or attempts).
  constexpr owner_stats& operator+=(const owner_stats& other) noexcept {
#define DCR_OWNER_STATS_ADD(type, name) name += other.name;
    DCR_OWNER_STATS_FIELDS(DCR_OWNER_STATS_ADD)
#undef DCR_OWNER_STATS_ADD
    return *this;
  }
  friend constexpr bool operator==(const owner_stats&, const owner_stats&) = default;
};

}  // namespace dcr
