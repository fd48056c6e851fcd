// dcr/detail/detect/detect.inl: the bodies of dcr/detect/detect.hpp (included at its end).
#pragma once

namespace dcr {

namespace detail {

template <storage_word W, class Emit>
void for_each_detected_chunk(const W* a, const W* b, std::size_t n, Emit&& emit) {
  constexpr std::size_t per_block = 64 / sizeof(W);
  constexpr std::size_t chunk = detect_chunk_words;
  static_assert(chunk % per_block == 0);
  const auto loop = best_detect_loop<W>();
  std::uint16_t offsets[chunk + detect_out_slack];
  const std::size_t whole = n / per_block * per_block;
  for (std::size_t j = 0; j < whole; j += chunk) {
    const std::size_t len = std::min(chunk, whole - j);
    const std::size_t k = loop(a + j, b + j, len, offsets);
    if (k != 0) emit(k, std::uint64_t{j}, static_cast<const std::uint16_t*>(offsets));
  }
  std::size_t t = 0;
  for (std::size_t j = whole; j < n; ++j)
    if (bits_differ{}(a[j], b[j])) offsets[t++] = static_cast<std::uint16_t>(j - whole);
  if (t != 0) emit(t, std::uint64_t{whole}, static_cast<const std::uint16_t*>(offsets));
}

}  // namespace detail

template <storage_word W>
std::size_t detect_changes(std::span<const W> tracker, std::span<const W> candidate,
                           std::vector<std::uint64_t>& changed, std::uint64_t first_index) {
  DCR_EXPECTS(tracker.size() == candidate.size(), errc::shape_mismatch,
              "detect_changes: tracker and candidate differ in length");
  const std::size_t before = changed.size();
  detail::for_each_detected_chunk<W>(
      tracker.data(), candidate.data(), tracker.size(),
      [&](std::size_t k, std::uint64_t base, const std::uint16_t* offsets) {
        const std::size_t at = changed.size();
        changed.resize(at + k);
        std::uint64_t* out = changed.data() + at;
        base += first_index;
        for (std::size_t q = 0; q < k; ++q) out[q] = base + offsets[q];
      });
  return changed.size() - before;
}

namespace detail {

template <storage_word W, class Emit>
void for_each_changed_chunk(const W* a, const W* b, std::size_t n, Emit&& emit) {
  constexpr std::size_t per_block = 64 / sizeof(W);
  // Words per loop call: the staging buffers below stay within about 50 KiB of stack.
  constexpr std::size_t chunk = sizeof(W) <= 2 ? detect_chunk_words : 16384 / sizeof(W);
  static_assert(chunk % per_block == 0 && chunk <= detect_chunk_words);
  const auto loop = best_gather_loop<W>();
  std::uint16_t offsets[chunk + detect_out_slack];
  W old_stage[chunk + gather_out_slack];
  W new_stage[chunk + gather_out_slack];
  const std::size_t whole = n / per_block * per_block;
  for (std::size_t j = 0; j < whole; j += chunk) {
    const std::size_t len = std::min(chunk, whole - j);
    const std::size_t k = loop(a + j, b + j, len, offsets, old_stage, new_stage);
    if (k != 0) emit(k, std::uint64_t{j}, offsets, old_stage, new_stage);
  }
  if (whole < n) {
    std::size_t t = 0;
    for (std::size_t j = whole; j < n; ++j)
      if (bits_differ{}(a[j], b[j])) {
        offsets[t] = static_cast<std::uint16_t>(j - whole);
        old_stage[t] = a[j];
        new_stage[t] = b[j];
        ++t;
      }
    if (t != 0) emit(t, std::uint64_t{whole}, offsets, old_stage, new_stage);
  }
}

template <storage_word W, class OldWords, class NewWords>
std::size_t detect_and_gather_into(std::span<const W> tracker, std::span<const W> candidate,
                                   std::vector<std::uint64_t>& changed, OldWords& old_words,
                                   NewWords& new_words, std::uint64_t first_index) {
  DCR_EXPECTS(tracker.size() == candidate.size(), errc::shape_mismatch,
              "detect_and_gather: tracker and candidate differ in length");
  const std::size_t before = changed.size();
  for_each_changed_chunk<W>(tracker.data(), candidate.data(), tracker.size(),
                            [&](std::size_t k, std::uint64_t base, const std::uint16_t* offsets,
                                const W* old_stage, const W* new_stage) {
                              const std::size_t at = changed.size();
                              changed.resize(at + k);
                              std::uint64_t* out = changed.data() + at;
                              base += first_index;
                              for (std::size_t q = 0; q < k; ++q) out[q] = base + offsets[q];
                              std::memcpy(append_words<W>(old_words, k), old_stage, k * sizeof(W));
                              std::memcpy(append_words<W>(new_words, k), new_stage, k * sizeof(W));
                            });
  return changed.size() - before;
}

template <storage_word W>
std::size_t detect_and_gather_to(const W* tracker, const W* candidate, std::size_t n,
                                 std::uint64_t* index, W* old_words, W* new_words,
                                 std::uint64_t first_index) noexcept {
  std::size_t count = 0;
  for_each_detected_chunk<W>(tracker, candidate, n,
                             [&](std::size_t k, std::uint64_t base, const std::uint16_t* offsets) {
                               std::uint64_t* const out = index + count;
                               const W* const a = tracker + base;
                               const W* const b = candidate + base;
                               const std::uint64_t at = first_index + base;
                               for (std::size_t q = 0; q < k; ++q) out[q] = at + offsets[q];
                               if (old_words != nullptr)
                                 for (std::size_t q = 0; q < k; ++q)
                                   old_words[count + q] = a[offsets[q]];
                               if (new_words != nullptr)
                                 for (std::size_t q = 0; q < k; ++q)
                                   new_words[count + q] = b[offsets[q]];
                               count += k;
                             });
  return count;
}

}  // namespace detail

}  // namespace dcr
