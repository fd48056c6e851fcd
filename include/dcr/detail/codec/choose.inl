// dcr/detail/codec/choose.inl: the bodies of dcr/codec/choose.hpp (included at its end).
#pragma once

namespace dcr {

namespace detail {

template <class F>
void for_each_sampled(std::size_t n, std::size_t limit, F&& f) {
  if (n <= limit) {
    for (std::size_t i = 0; i < n; ++i) f(i);
    return;
  }
  const std::size_t step = n / limit, rest = n % limit;
  std::size_t pos = 0, acc = 0;
  for (std::size_t i = 0; i < limit; ++i) {
    f(pos);
    pos += step;
    acc += rest;
    if (acc >= limit) {
      acc -= limit;
      ++pos;
    }
  }
}

template <storage_word W>
template <class Word>
void value_stats<W>::measure(std::size_t n, Word&& word, std::size_t limit, bool all_widths,
                             unsigned what) noexcept {
  reset(what);
  count = n;
  W or_plain = 0, or_zig = 0;
  std::uint64_t sampled = 0;
  for_each_sampled(n, limit, [&](std::size_t i) {
    const W w = word(i);
    const W z = zigzag_encode<W>(w);
    if (what & plain_planes)
      for (std::size_t k = 0; k < sizeof(W); ++k)
        ++planes[k][static_cast<std::uint8_t>(w >> (8 * k))];
    if (what & zig_planes_kind)
      for (std::size_t k = 0; k < sizeof(W); ++k)
        ++zig_planes[k][static_cast<std::uint8_t>(z >> (8 * k))];
    if (what & plain_buckets) plain.add(w);
    if (what & zig_buckets) zig.add(z);
    or_plain |= w;
    or_zig |= z;
    ++sampled;
  });
  samples = sampled;
  // The widths decide which M can carry the words; for 1- and 2-byte words every M up to
  // bucket_max_mantissa can, so only wider words need the pass over all of them.
  if constexpr (sizeof(W) <= 2) {
    or_plain = or_zig = static_cast<W>(~W{0});
  } else if (all_widths && n > limit) {
    for (std::size_t i = 0; i < n; ++i) {
      const W w = word(i);
      or_plain |= w;
      or_zig |= zigzag_encode<W>(w);
    }
  }
  plain_width = static_cast<unsigned>(std::bit_width(or_plain));
  zig_width = static_cast<unsigned>(std::bit_width(or_zig));
}

template <storage_word W>
void value_stats<W>::reset(unsigned what) noexcept {
  if (what & plain_planes)
    for (auto& p : planes) p.fill(0);
  if (what & zig_planes_kind)
    for (auto& p : zig_planes) p.fill(0);
  if (what & plain_buckets) plain.clear();
  if (what & zig_buckets) zig.clear();
  kinds = what;
  count = 0;
  plain_width = zig_width = 0;
}

template <storage_word W>
double value_stats<W>::planes_cost(bool zigzag) const noexcept {
  double c = 0;
  for (std::size_t k = 0; k < sizeof(W); ++k)
    c += literal_cost(zigzag ? zig_planes[k] : planes[k], samples, count);
  return c;
}

template <storage_word W>
std::size_t value_stats<W>::candidates(std::span<coding_candidate, 16> out, bool all_m,
                                       bool with_raw) const {
  std::size_t n = 0;
  const auto add = [&](value_coding c, unsigned m, double e) {
    out[n++] = {static_cast<std::uint8_t>(c), m, e};
  };
  if (kinds & plain_planes) add(value_coding::byte_planes, 0, planes_cost(false));
  if (kinds & zig_planes_kind) add(value_coding::zigzag_planes, 0, planes_cost(true));
  for (const bool z : {false, true}) {
    if (!(kinds & (z ? zig_buckets : plain_buckets))) continue;
    const magnitude_histogram& h = z ? zig : plain;
    const unsigned width = z ? zig_width : plain_width;
    const value_coding c = z ? value_coding::zigzag_buckets : value_coding::buckets;
    const auto [m, e] = h.best_bucket(width, count);
    add(c, m, e);
    if (all_m)
      for (unsigned k = 0; k <= bucket_max_mantissa && bucket_max_width(k) >= width; ++k)
        if (k != m) add(c, k, h.bucket_cost(k, count));
  }
  if (with_raw) add(value_coding::raw, 0, static_cast<double>(count * sizeof(W)) + 16);
  return n;
}

}  // namespace detail

#if DCR_HEADER_BODIES_OF(DCR_PART_PROTOCOL)

namespace detail {

DCR_INLINE std::size_t magnitude_histogram::bins_used() const noexcept {
  const auto len = static_cast<unsigned>(std::bit_width(largest));
  return len <= 5 ? 32 : 32 + (len - 5) * 16;
}

DCR_INLINE void magnitude_histogram::clear() noexcept {
  std::fill(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(bins_used()),
            std::uint64_t{0});
  samples = 0;
  largest = 0;
}

DCR_INLINE double magnitude_histogram::bucket_cost(unsigned m, std::uint64_t total) const noexcept {
  if (total == 0) return 1;
  if (samples == 0) return static_cast<double>(total);
  std::array<std::uint64_t, 256> symbols{};
  std::uint64_t extra = 0;
  const std::size_t used = bins_used();
  for (std::size_t k = 0; k < used; ++k) {
    const std::uint64_t c = counts[k];
    if (c == 0) continue;
    if (k < 32) {
      const bucket_code b = bucket_of(k, m);
      symbols[b.symbol] += c;
      extra += c * b.extra_bits;
    } else {
      const unsigned len = 6 + static_cast<unsigned>((k - 32) >> 4);
      const auto top4 = static_cast<unsigned>((k - 32) & 15);
      const unsigned symbol = (2u << m) + ((len - m - 2) << m) + (top4 >> (4 - m));
      symbols[std::min(symbol, 255u)] += c;
      extra += c * (len - 1 - m);
    }
  }
  const double scale = static_cast<double>(total) / static_cast<double>(samples);
  const double extra_bytes = static_cast<double>(extra) * scale / 8;
  return 1 + literal_cost(symbols, samples, total) + extra_bytes +
         3 * (extra_bytes / (128u << 10) + 1);
}

DCR_INLINE std::pair<unsigned, double> magnitude_histogram::best_bucket(
    unsigned width, std::uint64_t total) const noexcept {
  unsigned best_m = 0;
  double best = bucket_cost(0, total);
  for (unsigned m = 1; m <= bucket_max_mantissa; ++m) {
    if (bucket_max_width(m) < width) break;
    const double c = bucket_cost(m, total);
    if (c < best) {
      best = c;
      best_m = m;
    }
  }
  return {best_m, best};
}

}  // namespace detail

DCR_INLINE std::size_t coding_planner::location_frame_bound(std::uint64_t count) {
  return detail::zstd_sections_bound(static_cast<std::size_t>(detail::location_raw_bound(count)),
                                     detail::raw_stream::max_breaks);
}

DCR_INLINE std::size_t coding_planner::value_frame_bound(std::uint64_t count,
                                                         std::size_t word_bytes) {
  return detail::zstd_sections_bound(
      static_cast<std::size_t>(detail::value_raw_bound(count, word_bytes)),
      detail::raw_stream::max_breaks);
}

DCR_INLINE stream_choice coding_planner::plan_locations(std::span<const std::uint64_t> indices,
                                                        std::size_t runs) {
  using detail::coding_candidate;
  const std::size_t n = indices.size();
  if (!options_.adaptive || n == 0)
    return write_location(location_coding::skip_varint, 0, indices, 0);

  const auto width = static_cast<unsigned>(std::bit_width(indices.back()));
  std::array<coding_candidate, 16> c{};
  std::size_t k = 0;
  const bool exact = options_.exact_choice;
  const bool small = n + 16 <= detail::exact_stream_bytes;
  const auto forced = options_.location;
  const bool bitmap_ok = detail::bitmap_eligible(indices);
  const bool runs_ok = detail::runs_eligible(n, runs);
  const auto allowed = [&](location_coding x) {
    if (!forced || *forced == x) return true;
    // A forced coding the item does not suit falls back to the usual choice.
    return (*forced == location_coding::bitmap && !bitmap_ok) ||
           (*forced == location_coding::runs && !runs_ok);
  };
  const auto code = [](location_coding x) { return static_cast<std::uint8_t>(x); };

  if (allowed(location_coding::skip_buckets)) {
    detail::magnitude_histogram& h = locations_;
    h.clear();
    detail::for_each_sampled(n, detail::estimate_sample, [&](std::size_t j) {
      h.add(j == 0 ? indices[0] : indices[j] - indices[j - 1] - 1);
    });
    const auto [m, e] = h.best_bucket(width, n);
    c[k++] = {code(location_coding::skip_buckets), m, e};
    if (exact)
      for (unsigned x = 0; x <= detail::bucket_max_mantissa && detail::bucket_max_width(x) >= width;
           ++x)
        if (x != m) c[k++] = {code(location_coding::skip_buckets), x, h.bucket_cost(x, n)};
  }
  if (bitmap_ok && allowed(location_coding::bitmap)) {
    detail::write_locations(raw_, scratch_, run_scratch_, indices, location_coding::bitmap, 0, 0);
    std::array<std::uint64_t, 256> hist{};
    for (const std::byte b : raw_.bytes()) ++hist[std::to_integer<std::uint8_t>(b)];
    c[k++] = {code(location_coding::bitmap), 0, detail::literal_cost(hist, raw_.size, raw_.size)};
  }
  if (runs_ok && allowed(location_coding::runs)) {
    detail::magnitude_histogram& h = locations_;
    h.clear();
    std::uint64_t next = 0;
    for (std::size_t j = 0; j < n;) {
      std::size_t e = j + 1;
      while (e < n && indices[e] == indices[e - 1] + 1) ++e;
      h.add(indices[j] - next);
      h.add(e - j - 1);
      next = indices[e - 1] + 1;
      j = e;
    }
    const auto [m, e] = h.best_bucket(width, 2 * runs);
    c[k++] = {code(location_coding::runs), m, e + static_cast<double>(detail::varint_size(runs))};
  }
  // skip_varint has no estimate: it is compressed where candidates are compared exactly (or
  // when forced), and never chosen by estimate.
  const bool varint = (exact || small || forced == location_coding::skip_varint) &&
                      allowed(location_coding::skip_varint);
  detail::rank(std::span<coding_candidate>(c.data(), k));
  if (!exact) detail::prefer_runs(std::span<coding_candidate>(c.data(), k));
  std::size_t tries = exact ? k : exact_count(c, k, n + 16);
  if (varint) c[tries++] = {code(location_coding::skip_varint), 0, 0};

  return best_of(std::span<const coding_candidate>(c.data(), tries), location_frame_bound(n),
                 [&](const coding_candidate& x) {
                   return write_location(static_cast<location_coding>(x.coding), x.m, indices,
                                         runs);
                 });
}

DCR_INLINE std::size_t coding_planner::compress(std::span<const std::byte> raw,
                                                std::span<const std::size_t> sections,
                                                std::span<std::byte> dst) {
  std::array<std::size_t, detail::raw_stream::max_breaks> kept{};
  const std::size_t nk = options_.adaptive ? detail::select_breaks(sections, raw.size(), kept) : 0;
  return zstd_.compress(raw, std::span<const std::size_t>(kept.data(), nk), dst);
}

DCR_INLINE stream_result coding_planner::emit(const stream_choice& c, std::span<std::byte> dst) {
  if (c.compressed) {
    std::memcpy(dst.data(), frame_.data(), frame_size_);
    return {c.coding, c.raw_size, frame_size_};
  }
  return {c.coding, c.raw_size, compress(raw_.bytes(), raw_.sections(), dst)};
}

DCR_INLINE std::size_t coding_planner::exact_count(
    const std::array<detail::coding_candidate, 16>& c, std::size_t k,
    std::size_t raw_bytes) noexcept {
  if (k <= 1) return k;
  if (raw_bytes <= detail::exact_stream_bytes) return std::min<std::size_t>(k, 2);
  if (raw_bytes <= detail::exact_tie_bytes &&
      c[1].estimate <= c[0].estimate * (1 + detail::estimate_tie))
    return 2;
  return 1;
}

DCR_INLINE stream_choice coding_planner::write_location(location_coding coding, unsigned m,
                                                        std::span<const std::uint64_t> indices,
                                                        std::size_t runs) {
  detail::write_locations(raw_, scratch_, run_scratch_, indices, coding, m, runs);
  return {static_cast<std::uint8_t>(coding), raw_.size, false};
}

namespace detail {

DCR_INLINE void rank(std::span<coding_candidate> c) noexcept {
  for (std::size_t i = 1; i < c.size(); ++i)  // insertion sort: a dozen at most, no allocation
    for (std::size_t j = i; j > 0 && c[j].estimate < c[j - 1].estimate; --j)
      std::swap(c[j], c[j - 1]);
}

DCR_INLINE void prefer_cheap_values(std::span<coding_candidate> c) noexcept {
  if (c.size() < 2) return;
  const auto cost = [](std::uint8_t coding) {
    switch (static_cast<value_coding>(coding)) {
      case value_coding::byte_planes:
        return 0;
      case value_coding::zigzag_planes:
        return 1;
      case value_coding::raw:
        return 2;
      default:
        return 3;
    }
  };
  std::size_t pick = 0;
  for (std::size_t i = 1; i < c.size() && c[i].estimate <= c[0].estimate * (1 + prefer_cheaper);
       ++i)
    if (cost(c[i].coding) < cost(c[pick].coding)) pick = i;
  for (; pick > 0; --pick) std::swap(c[pick], c[pick - 1]);
}

DCR_INLINE void prefer_runs(std::span<coding_candidate> c) noexcept {
  for (std::size_t i = 1; i < c.size(); ++i) {
    if (c[i].coding != static_cast<std::uint8_t>(location_coding::runs)) continue;
    if (c[i].estimate <= std::max(c[0].estimate * (1 + prefer_cheaper), c[0].estimate + 16))
      for (std::size_t j = i; j > 0; --j) std::swap(c[j], c[j - 1]);
    return;
  }
}

DCR_INLINE std::size_t select_breaks(
    std::span<const std::size_t> sections, std::size_t size,
    std::array<std::size_t, raw_stream::max_breaks>& kept) noexcept {
  std::size_t n = 0, from = 0;
  for (std::size_t k = 0; k < sections.size(); ++k) {
    const std::size_t next = k + 1 < sections.size() ? sections[k + 1] : size;
    if (sections[k] - from >= min_section_bytes && next - sections[k] >= min_section_bytes) {
      kept[n++] = sections[k];
      from = sections[k];
    }
  }
  return n;
}

DCR_INLINE coding_planner& thread_planner(const codec_options& options) {
  thread_local coding_planner planner(options);
  const codec_options& o = planner.options();
  if (o.zstd_level != options.zstd_level || o.zstd_hash_log != options.zstd_hash_log ||
      o.adaptive != options.adaptive || o.exact_choice != options.exact_choice ||
      o.byte_planes != options.byte_planes || o.location != options.location ||
      o.value != options.value)
    planner = coding_planner(options);
  return planner;
}

}  // namespace detail

#endif  // DCR_HEADER_BODIES

template <storage_word W>
stream_choice coding_planner::plan_values(const std::byte* words, std::size_t n) {
  using detail::coding_candidate;
  if (!options_.adaptive) {
    const auto coding = options_.byte_planes ? value_coding::byte_planes : value_coding::raw;
    detail::write_values<W>(raw_, scratch_, words, n, coding, 0, 0);
    raw_.break_count = 0;  // one zstd call per stream, as the first release did
    return {static_cast<std::uint8_t>(coding), raw_.size, false};
  }
  const auto word = [&](std::size_t i) {
    W w;
    std::memcpy(&w, words + i * sizeof(W), sizeof(W));
    return w;
  };
  detail::value_stats<W>& st = stats<W>();
  st.measure(n, word, detail::estimate_sample, true);
  const bool exact = options_.exact_choice;
  const std::size_t raw_bytes = n * sizeof(W);
  std::array<coding_candidate, 16> all{};
  std::size_t k = st.candidates(all, exact, exact);
  if (options_.value) {  // keep only the forced coding's candidates
    std::size_t kept = 0;
    for (std::size_t i = 0; i < k; ++i)
      if (all[i].coding == static_cast<std::uint8_t>(*options_.value)) all[kept++] = all[i];
    if (kept == 0) all[kept++] = {static_cast<std::uint8_t>(*options_.value), 0, 0};
    k = kept;
  }
  detail::rank(std::span<coding_candidate>(all.data(), k));
  if (!exact) detail::prefer_cheap_values(std::span<coding_candidate>(all.data(), k));
  const unsigned plain_width = st.plain_width, zig_width = st.zig_width;
  return best_of(
      std::span<const coding_candidate>(all.data(), exact ? k : exact_count(all, k, raw_bytes)),
      value_frame_bound(n, sizeof(W)), [&](const coding_candidate& x) {
        const auto coding = static_cast<value_coding>(x.coding);
        detail::write_values<W>(raw_, scratch_, words, n, coding, x.m,
                                detail::is_zigzag_coding(coding) ? zig_width : plain_width);
        return stream_choice{x.coding, raw_.size, false};
      });
}

template <storage_word W, class Word>
double coding_planner::value_stream_size(std::size_t n, Word&& word, unsigned kinds) {
  if (options_.exact_choice) {
    if (words_.size() < n * sizeof(W)) words_.resize(n * sizeof(W));
    for (std::size_t i = 0; i < n; ++i) {
      const W w = word(i);
      std::memcpy(words_.data() + i * sizeof(W), &w, sizeof(W));
    }
    const stream_choice c = plan_values<W>(words_.data(), n);
    if (c.compressed) return static_cast<double>(frame_size_);
    grow(frame_, value_frame_bound(n, sizeof(W)));
    frame_size_ = compress(raw_.bytes(), raw_.sections(), frame_);
    return static_cast<double>(frame_size_);
  }
  detail::value_stats<W>& st = stats<W>();
  st.measure(n, word, detail::encoding_sample, false, kinds);
  std::array<detail::coding_candidate, 16> all{};
  const std::size_t k = st.candidates(all, false, false);
  double best = all[0].estimate;
  for (std::size_t i = 1; i < k; ++i) best = std::min(best, all[i].estimate);
  return best;
}

template <class Write>
stream_choice coding_planner::best_of(std::span<const detail::coding_candidate> c,
                                      std::size_t bound, Write&& write) {
  if (c.size() == 1) return write(c[0]);
  grow(frame_, bound);
  grow(spare_, bound);
  stream_choice best{};
  for (std::size_t i = 0; i < c.size(); ++i) {
    stream_choice r = write(c[i]);
    const std::size_t size = compress(raw_.bytes(), raw_.sections(), spare_);
    if (i == 0 || size < frame_size_) {
      frame_.swap(spare_);
      frame_size_ = size;
      best = r;
    }
  }
  best.compressed = true;
  return best;
}

template <storage_word W>
encoding choose_encoding(encoding_policy policy, bool delta_permitted, std::span<const W> old_bits,
                         std::span<const W> new_bits, const codec_options& options) {
  DCR_EXPECTS(old_bits.size() == new_bits.size(), errc::invalid_argument,
              "choose_encoding: " + std::to_string(old_bits.size()) + " old and " +
                  std::to_string(new_bits.size()) + " new words");
  if (policy == encoding_policy::overwrite_only || !delta_permitted) return encoding::overwrite;
  if (policy == encoding_policy::xor_only) return encoding::xor_mask;
  if (policy == encoding_policy::ulp_only) return encoding::ulp;
  if (old_bits.empty()) return encoding::overwrite;
  coding_planner& planner = detail::thread_planner(options);
  encoding best = encoding::overwrite;
  double best_size = 0;
  bool first = true;
  // Each encoding is estimated with the codings that suit its values: new bits as byte planes
  // (float bits have no small magnitude), xor masks as byte planes or unsigned buckets, ulp
  // deltas zigzag-mapped.
  using stats = detail::value_stats<W>;
  for (const encoding e : {encoding::overwrite, encoding::ulp, encoding::xor_mask}) {
    const unsigned kinds = e == encoding::overwrite ? stats::plain_planes
                           : e == encoding::ulp     ? stats::zig_planes_kind | stats::zig_buckets
                                                    : stats::plain_planes | stats::plain_buckets;
    const double size = visit_encoding(e, [&](auto enc) {
      using E = decltype(enc);
      return planner.value_stream_size<W>(
          old_bits.size(), [&](std::size_t i) { return E::encode(old_bits[i], new_bits[i]); },
          kinds);
    });
    if (first || size < best_size) {
      best = e;
      best_size = size;
      first = false;
    }
  }
  return best;
}

}  // namespace dcr
