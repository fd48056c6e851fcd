// dcr/detail/apply/placement.inl: the bodies of dcr/apply/placement.hpp (included at its end).
//
// compile_placement() runs the loader (a template over the loader type, compiled where it is
// instantiated); everything after the probes is loader-independent and compiled once in
// separate compilation (DCR_HEADER_BODIES, dcr/config.hpp).
#pragma once

namespace dcr {
namespace detail {

/// The sink compile_placement() runs the loader with: validates each copy like delta_sink and
/// records one placement per non-empty copy.
template <storage_word W>
class placement_probe {
 public:
  using sink_concept = sink_tag;
  using word_type = W;

  void begin(const canonical_tensor& t, tensor_id id, const W* scratch,
             std::vector<placement>* out) {
    current_ = load_record{t.name, 0, 0, false};
    type_ = t.type;
    id_ = id;
    base_ = scratch;
    numel_ = t.numel();
    out_ = out;
  }

  void copy(tensor_view<W> dst, tensor_view<const W> src) {
    copy(dst, src, element_transform::identity());
  }

  template <storage_word D>
  void copy(tensor_view<D> dst, tensor_view<const W> src, element_transform transform);

  void skip(const canonical_tensor& t) {
    check_skip_target(current_, t);
    current_.skipped = true;
  }

  load_record finish() {
    check_copy_or_skip(current_);
    return current_;
  }

 private:
  load_record current_;
  dtype type_ = dtype::u8;
  tensor_id id_ = 0;
  const W* base_ = nullptr;
  std::int64_t numel_ = 0;
  std::vector<placement>* out_ = nullptr;
};

static_assert(sink_for<placement_probe<std::uint16_t>, std::uint16_t>);

template <storage_word W>
template <storage_word D>
void placement_probe<W>::copy(tensor_view<D> dst, tensor_view<const W> src,
                             element_transform transform) {
  check_copy_after_skip(current_);
  check_copy_shapes(current_, dst, src);
  check_transform<W, D>(transform, type_, copy_where(current_));
  if (src.size() != 0) {
    const auto c = locate_copy(current_, base_, numel_, dst, src);
    out_->push_back(record_of_copy(c, reinterpret_cast<std::byte*>(dst.data()), transform,
                                   sizeof(D), id_, /*finalized=*/false));
    current_.elements += static_cast<std::uint64_t>(src.size());
  }
  ++current_.copies;
}

#if defined(DCR_SEPARATE_COMPILATION)
#define DCR_PROBE_COPY(W, D)                                                                  \
  DCR_EXPLICIT_INSTANTIATION void placement_probe<W>::copy<D>(tensor_view<D>,                 \
                                                              tensor_view<const W>, element_transform);
DCR_FOR_EACH_WORD_PAIR(DCR_PROBE_COPY)
#undef DCR_PROBE_COPY
#endif

/// compile_placement()'s loader-independent steps, in call order: begin_tensor, (first load)
/// end_first_load, (second load) end_tensor, for every tensor; then finish.
class placement_compiler {
 public:
  placement_compiler(const tensor_registry& registry, std::byte* scratch,
                     std::size_t scratch_bytes);
  /// Starts tensor `id` and returns it.
  const canonical_tensor& begin_tensor(std::size_t id);
  /// Where the probe of the first and of the second load records.
  [[nodiscard]] std::vector<placement>* first_records() noexcept { return &plan_.placements_; }
  [[nodiscard]] std::vector<placement>* second_records() noexcept { return &again_; }
  /// After the first load: the loader left its src untouched.
  void end_first_load();
  /// After the second load: src untouched and the same copies as the first (determinism);
  /// merges runs of records and fills the tensor's report.
  void end_tensor(const load_record& first, const load_record& second);
  /// The write analysis over every tensor with the loader's declared `ties`; the plan.
  placement_plan finish(const std::vector<tensor_tie>& ties);

 private:
  void check_src_untouched(std::span<const placement> records) const;

  const tensor_registry* registry_;
  std::byte* scratch_;
  placement_plan plan_;
  std::vector<placement> again_;
  const canonical_tensor* tensor_ = nullptr;  // the tensor begin_tensor() started
  std::size_t id_ = 0;                         // its id
  std::size_t begin_ = 0;                      // its first record in plan_.placements_
};

}  // namespace detail

template <class Loader>
  requires loader<Loader>
placement_plan compile_placement(const tensor_registry& registry, Loader& loader,
                                 std::byte* scratch, std::size_t scratch_bytes) {
  detail::placement_compiler compiler(registry, scratch, scratch_bytes);
  for (std::size_t id = 0; id < registry.tensors().size(); ++id) {
    const canonical_tensor& t = compiler.begin_tensor(id);
    visit_word(dtype_size(t.type), [&](auto w) {
      using W = decltype(w);
      const W* base = reinterpret_cast<const W*>(scratch);
      const auto view = tensor_view<const W>::contiguous(base, t.shape);
      detail::placement_probe<W> probe;
      probe.begin(t, static_cast<tensor_id>(id), base, compiler.first_records());
      loader.load(t, view, probe);
      const load_record first = probe.finish();
      compiler.end_first_load();
      probe.begin(t, static_cast<tensor_id>(id), base, compiler.second_records());
      loader.load(t, view, probe);
      compiler.end_tensor(first, probe.finish());
    });
  }
  if constexpr (declares_ties<Loader>)
    return compiler.finish(std::as_const(loader).tied_tensors());
  else
    return compiler.finish({});
}

#if DCR_HEADER_BODIES_OF(DCR_PART_REFIT)

// ---- placement_plan

DCR_INLINE std::span<const placement> placement_plan::placements_of(tensor_id id) const {
  const auto& t = at(id);
  return std::span<const placement>(placements_).subspan(t.first_placement,
                                                        static_cast<std::size_t>(t.placements));
}

DCR_INLINE const tensor_placement& placement_plan::at(tensor_id id) const {
  DCR_EXPECTS(id < tensors_.size(), errc::unknown_tensor,
              "placement_plan: no tensor with id " + std::to_string(id));
  return tensors_[id];
}

// ---- the write analysis

namespace detail {


/// Whether `n` bytes at `p` are all zero (8 bytes at a time, OR-reduced per block).
DCR_INLINE bool all_zero(const std::byte* p, std::size_t n) noexcept {
  std::size_t i = 0;
  while (i + 8 <= n) {
    std::uint64_t acc = 0;
    const std::size_t block_end = std::min(n - n % 8, i + 4096);
    for (; i < block_end; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      acc |= w;
    }
    if (acc != 0) return false;
  }
  for (; i < n; ++i)
    if (p[i] != std::byte{0}) return false;
  return true;
}

/// Equal copy geometry: the same inverse (strides, extents, dst steps, origin, span).
constexpr bool same_geometry(const view_inverse& a, const view_inverse& b) noexcept {
  if (a.dims != b.dims || a.dst_origin != b.dst_origin || a.span != b.span) return false;
  for (int i = 0; i < a.dims; ++i)
    if (a.src_stride[i] != b.src_stride[i] || a.extent[i] != b.extent[i] ||
        a.dst_step[i] != b.dst_step[i])
      return false;
  return true;
}

DCR_INLINE bool same_record(const placement& a, const placement& b) noexcept {
  return a.first == b.first && a.dst == b.dst && a.dst_bytes == b.dst_bytes &&
         a.transform == b.transform && same_geometry(a.inv, b.inv);
}



/// Merges runs of consecutive records (same geometry, width and transform) whose canonical
/// first index and storage base advance by constant steps S and T, with S beyond the record's
/// span, into one record with an extra outermost dimension. Returns the new end.
DCR_INLINE std::size_t merge_runs(std::vector<placement>& ps, std::size_t begin, std::size_t end) {
  std::size_t out = begin;
  std::size_t i = begin;
  while (i < end) {
    placement head = ps[i];
    std::size_t n = 1;
    std::int64_t step_src = 0, step_dst = 0;  // S (canonical) and T (dst words)
    const auto db = static_cast<std::int64_t>(head.dst_bytes);
    while (i + n < end && head.inv.dims < max_rank) {
      const placement& q = ps[i + n];
      if (q.dst_bytes != head.dst_bytes || q.transform != head.transform ||
          !same_geometry(q.inv, head.inv))
        break;
      const std::int64_t byte_step = static_cast<std::int64_t>(
          reinterpret_cast<std::uintptr_t>(q.dst) - reinterpret_cast<std::uintptr_t>(head.dst));
      if (n == 1) {
        if (byte_step % db != 0 || q.first - head.first <= head.inv.span) break;
        step_src = q.first - head.first;
        step_dst = byte_step / db;
      } else if (q.first != head.first + static_cast<std::int64_t>(n) * step_src ||
                 byte_step != static_cast<std::int64_t>(n) * step_dst * db) {
        break;
      }
      ++n;
    }
    if (n > 1) {
      view_inverse& inv = head.inv;
      for (int d = inv.dims; d > 0; --d) {
        inv.src_stride[d] = inv.src_stride[d - 1];
        inv.extent[d] = inv.extent[d - 1];
        inv.dst_step[d] = inv.dst_step[d - 1];
      }
      inv.src_stride[0] = step_src;
      inv.extent[0] = static_cast<std::int64_t>(n);
      inv.dst_step[0] = step_dst;
      ++inv.dims;
      inv.span += (static_cast<std::int64_t>(n) - 1) * step_src;
      inv.update_identity();
      head.last = head.first + inv.span;
      head.copies = static_cast<std::uint32_t>(n);
    }
    ps[out++] = head;
    i += n;
  }
  return out;
}

/// Lowest and one-past-highest storage byte a record writes.
DCR_INLINE void byte_window(const placement& p, std::uintptr_t& lo, std::uintptr_t& hi) noexcept {
  std::int64_t min_off = p.inv.dst_origin, max_off = p.inv.dst_origin;
  for (int i = 0; i < p.inv.dims; ++i) {
    const std::int64_t reach = p.inv.dst_step[i] * (p.inv.extent[i] - 1);
    (reach < 0 ? min_off : max_off) += reach;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(p.dst);
  const auto db = static_cast<std::int64_t>(p.dst_bytes);
  lo = base + static_cast<std::uintptr_t>(min_off * db);
  hi = base + static_cast<std::uintptr_t>((max_off + 1) * db);
}

/// Whether a record's destination elements are pairwise distinct (provably, by strides).
DCR_INLINE bool dst_non_overlapping(const placement& p) noexcept {
  return is_non_overlapping_layout(p.inv.extent.data(), p.inv.dst_step.data(), p.inv.dims);
}

/// The ties a loader declares (dcr::declares_ties), as ordered pairs of tensor ids.
class tie_set {
 public:
  tie_set() = default;
  /// Checks and records `ties`: names in the registry (errc::unknown_tensor), two different
  /// tensors of one dtype and shape (errc::invalid_argument).
  tie_set(const tensor_registry& reg, const std::vector<tensor_tie>& ties) {
    for (const tensor_tie& t : ties) {
      const auto a = reg.find(t.first), b = reg.find(t.second);
      const std::string pair = "'" + t.first + "' and '" + t.second + "'";
      DCR_EXPECTS(a.has_value() && b.has_value(), errc::unknown_tensor,
                  "dcr loader: tied_tensors() declares " + pair + ", but '" +
                      (a.has_value() ? t.second : t.first) + "' is not in the registry");
      const canonical_tensor& ta = reg.at(*a);
      const canonical_tensor& tb = reg.at(*b);
      DCR_EXPECTS(*a != *b && ta.type == tb.type && ta.shape == tb.shape, errc::invalid_argument,
                  "dcr loader: tied_tensors() declares " + pair +
                      ", which are not two tensors of one dtype and shape");
      pairs_.emplace_back(std::min(*a, *b), std::max(*a, *b));
    }
    std::sort(pairs_.begin(), pairs_.end());
  }
  /// Whether tensors `a` and `b` are declared tied.
  [[nodiscard]] bool contains(tensor_id a, tensor_id b) const noexcept {
    return std::binary_search(pairs_.begin(), pairs_.end(),
                              std::pair<tensor_id, tensor_id>(std::min(a, b), std::max(a, b)));
  }

 private:
  std::vector<std::pair<tensor_id, tensor_id>> pairs_;
};

/// "0x7f12345000".
DCR_INLINE std::string hex_address(std::uintptr_t a) {
  char buf[2 + 2 * sizeof(std::uintptr_t)] = {'0', 'x'};
  const auto r = std::to_chars(buf + 2, buf + sizeof(buf), a, 16);
  return std::string(buf, r.ptr);
}

/// Two writes of one destination byte range that no delta can reproduce: the first found, and
/// the destination bytes over which the same two tensors conflict.
struct write_conflict {
  tensor_id a = 0, b = 0;
  std::int64_t ia = 0, ib = 0;    ///< canonical indices of the first conflicting pair
  bool same_element = false;      ///< element i of both, same dtype and transform: a tie
  std::uintptr_t lo = 0, hi = 0;  ///< overlapping destination bytes [lo, hi)
};

/// Per-tensor overwrite-only marks collected by the write analysis, and the first conflict.
struct overlap_marks {
  std::vector<std::string> reason;  // by tensor id, first reason found
  std::optional<write_conflict> conflict;
  void mark(tensor_id id, std::string why) {
    if (reason[id].empty()) reason[id] = std::move(why);
  }
};

/// Two writes of the overlapping destination bytes [lo, hi): the same canonical element again,
/// or the same element of a declared tie (marks), else a conflict (the first is kept, its byte
/// range grown by later conflicts of the same two tensors). `a`, `b`: the records; `ia`, `ib`:
/// canonical indices.
DCR_INLINE void classify_repeat(const tensor_registry& reg, const tie_set& ties, overlap_marks& marks,
                            const placement& a, std::int64_t ia, const placement& b,
                            std::int64_t ib, bool same_element_bytes, std::uintptr_t lo,
                            std::uintptr_t hi) {
  const canonical_tensor& ta = reg.at(a.tensor);
  const canonical_tensor& tb = reg.at(b.tensor);
  const bool same_value = same_element_bytes && ia == ib && a.transform == b.transform &&
                          ta.type == tb.type;
  if (same_value && a.tensor == b.tensor) {
    marks.mark(a.tensor, "writes destination elements more than once (an xor would cancel)");
    return;
  }
  if (same_value && ties.contains(a.tensor, b.tensor)) {
    marks.mark(a.tensor, "shares destination storage with '" + tb.name + "' (tied)");
    marks.mark(b.tensor, "shares destination storage with '" + ta.name + "' (tied)");
    return;
  }
  auto& c = marks.conflict;
  if (!c) {
    c = write_conflict{a.tensor, b.tensor, ia, ib, same_value, lo, hi};
  } else if (std::minmax(c->a, c->b) == std::minmax(a.tensor, b.tensor)) {
    c->lo = std::min(c->lo, lo);
    c->hi = std::max(c->hi, hi);
  }
}

/// Throws errc::unsupported_loader_path for the conflict the analysis found, if any.
DCR_INLINE void refuse_conflict(const tensor_registry& reg, const overlap_marks& marks) {
  if (!marks.conflict) return;
  const write_conflict& c = *marks.conflict;
  const std::string& na = reg.at(c.a).name;
  const std::string& nb = reg.at(c.b).name;
  const std::string range = "destination bytes [" + hex_address(c.lo) + ", " + hex_address(c.hi) +
                            ") (" + std::to_string(c.hi - c.lo) + " bytes)";
  if (c.same_element)
    throw error(errc::unsupported_loader_path,
                "dcr loader: tensors '" + na + "' and '" + nb +
                    "' are written into the same storage, element for element, at " + range +
                    ", and the loader does not declare them tied. If the model ties them, "
                    "declare the pair in the loader: std::vector<dcr::tensor_tie> tied_tensors() "
                    "const { return {{\"" + na + "\", \"" + nb + "\"}}; } (Python: "
                    "dcr.Receiver(..., tied=[(\"" + na + "\", \"" + nb + "\")])); both then become "
                    "overwrite-only. Otherwise the loader writes one tensor into the other's "
                    "storage, which no delta can reproduce");
  const std::string what = c.a == c.b
                               ? "tensor '" + na + "' writes elements " + std::to_string(c.ia) +
                                     " and " + std::to_string(c.ib)
                               : "tensor '" + na + "' element " + std::to_string(c.ia) +
                                     " and tensor '" + nb + "' element " + std::to_string(c.ib);
  throw error(errc::unsupported_loader_path,
              "dcr loader: " + what + " into overlapping " + range +
                  "; each destination element must come from one canonical element (only the "
                  "same element, or the same element of a declared tie, may be written twice)");
}

/// Bit slots for the destination units of one cluster, in memory proportional to the units its
/// records write, however far apart they lie: one bit per unit of the cluster's whole window when
/// the writes fill at least 1/8 of it, else one bit per unit of only the 64-unit blocks they touch
/// (sorted block numbers, found by binary search from the last block hit). A loader may copy one
/// tensor's parts into allocations far apart with another tensor in the gap; their cluster's
/// window then spans the gap, which a bitmap over the window would have to cover.
class unit_slots {
 public:
  /// Slots for every unit of a window of `units` units.
  void cover_window(std::uint64_t units) {
    window_ = true;
    blocks_.clear();
    words_ = static_cast<std::size_t>((units + 63) / 64);
  }
  /// Slots for the units of the 64-unit blocks in `blocks` (sorted, unique) only.
  void cover_blocks(std::vector<std::uint64_t>&& blocks) {
    window_ = false;
    blocks_ = std::move(blocks);
    words_ = blocks_.size();
    last_ = 0;
  }
  /// Number of 64-bit words a bitmap over the slots needs.
  [[nodiscard]] std::size_t words() const noexcept { return words_; }
  /// The bitmap word that holds unit `u` (a unit of a covered block).
  [[nodiscard]] std::size_t word_of(std::uint64_t u) noexcept {
    const std::uint64_t b = u / 64;
    if (window_) return static_cast<std::size_t>(b);
    if (blocks_[last_] != b)
      last_ = static_cast<std::size_t>(std::lower_bound(blocks_.begin(), blocks_.end(), b) -
                                       blocks_.begin());
    return last_;
  }

 private:
  bool window_ = true;
  std::vector<std::uint64_t> blocks_;
  std::size_t words_ = 0;
  std::size_t last_ = 0;
};

/// Byte-exact analysis of the records of one address-window cluster that may overlap. Memory:
/// O(units written), never O(window) (see unit_slots).
DCR_INLINE void analyze_cluster(const tensor_registry& reg, const tie_set& ties, overlap_marks& marks,
                            std::span<const placement* const> cluster, std::uintptr_t lo,
                            std::uintptr_t hi, std::vector<std::uint64_t>& seen,
                            std::vector<std::uint64_t>& multi) {
  // Unit: the gcd of every word width and base offset, so each element covers whole units.
  std::uint64_t g = 0;
  for (const placement* p : cluster) {
    std::uintptr_t p_lo = 0, p_hi = 0;
    byte_window(*p, p_lo, p_hi);
    g = std::gcd(g, static_cast<std::uint64_t>(p->dst_bytes));
    g = std::gcd(g, static_cast<std::uint64_t>(p_lo - lo));
  }
  // Calls f(record, rel, first unit, units) for every element written, units relative to lo.
  const auto for_each_element = [&](auto&& f) {
    for (const placement* p : cluster) {
      const auto base = reinterpret_cast<std::uintptr_t>(p->dst) - lo;
      const std::uint64_t per = p->dst_bytes / g;
      p->inv.for_each([&](std::int64_t rel, std::int64_t off) {
        const std::uint64_t rel_addr =
            base + static_cast<std::uint64_t>(off * static_cast<std::int64_t>(p->dst_bytes));
        f(*p, rel, rel_addr / g, per);
      });
    }
  };
  const std::uint64_t window_units = (hi - lo) / g;
  std::uint64_t written_units = 0;
  for (const placement* p : cluster)
    written_units += static_cast<std::uint64_t>(p->inv.size()) * (p->dst_bytes / g);
  unit_slots slots;
  if (window_units / 8 <= written_units) {
    slots.cover_window(window_units);
  } else {
    std::vector<std::uint64_t> blocks;
    for_each_element([&](const placement&, std::int64_t, std::uint64_t u0, std::uint64_t per) {
      for (std::uint64_t b = u0 / 64; b <= (u0 + per - 1) / 64; ++b)
        if (blocks.empty() || blocks.back() != b) blocks.push_back(b);
    });
    std::sort(blocks.begin(), blocks.end());
    blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
    slots.cover_blocks(std::move(blocks));
  }
  seen.assign(slots.words(), 0);
  multi.assign(slots.words(), 0);
  bool any = false;
  for_each_element([&](const placement&, std::int64_t, std::uint64_t u0, std::uint64_t per) {
    for (std::uint64_t u = u0; u < u0 + per; ++u) {
      const std::size_t w = slots.word_of(u);
      const std::uint64_t bit = std::uint64_t{1} << (u % 64);
      if (seen[w] & bit) {
        multi[w] |= bit;
        any = true;
      } else {
        seen[w] |= bit;
      }
    }
  });
  if (!any) return;
  // Second pass over the elements that touch a repeatedly written unit only.
  struct entry {
    std::uintptr_t addr;
    const placement* p;
    std::int64_t index;
  };
  std::vector<entry> entries;
  for_each_element([&](const placement& p, std::int64_t rel, std::uint64_t u0, std::uint64_t per) {
    for (std::uint64_t u = u0; u < u0 + per; ++u)
      if (multi[slots.word_of(u)] & (std::uint64_t{1} << (u % 64))) {
        entries.push_back({lo + u0 * g, &p, p.first + rel});
        break;
      }
  });
  std::sort(entries.begin(), entries.end(),
            [](const entry& a, const entry& b) { return a.addr < b.addr; });
  std::size_t head = 0;  // first entry of the current group of overlapping writes
  std::uintptr_t group_end = 0;
  for (std::size_t k = 0; k < entries.size(); ++k) {
    const entry& e = entries[k];
    if (k > 0 && e.addr < group_end) {
      const entry& h = entries[head];
      classify_repeat(reg, ties, marks, *h.p, h.index, *e.p, e.index,
                      e.addr == h.addr && e.p->dst_bytes == h.p->dst_bytes, e.addr,
                      std::min<std::uintptr_t>(group_end, e.addr + e.p->dst_bytes));
      group_end = std::max<std::uintptr_t>(group_end, e.addr + e.p->dst_bytes);
    } else {
      head = k;
      group_end = e.addr + e.p->dst_bytes;
    }
  }
}

/// Finds every destination element written more than once across the whole plan and marks or
/// rejects it (see the file comment).
DCR_INLINE void analyze_writes(const tensor_registry& reg, const tie_set& ties,
                           std::span<const placement> all, overlap_marks& marks) {
  // 1. Structurally repeated records (same first, geometry, dst, width, transform): the same
  //    canonical index lands on the same element; resolved without touching elements.
  std::vector<const placement*> order;
  order.reserve(all.size());
  for (const placement& p : all) order.push_back(&p);
  const auto key_less = [](const placement* a, const placement* b) {
    if (a->dst != b->dst) return std::less<>{}(a->dst, b->dst);
    if (a->first != b->first) return a->first < b->first;
    if (a->inv.span != b->inv.span) return a->inv.span < b->inv.span;
    return a->tensor < b->tensor;
  };
  std::sort(order.begin(), order.end(), key_less);
  std::vector<const placement*> unique;
  unique.reserve(order.size());
  for (const placement* p : order) {
    bool repeated = false;
    for (auto it = unique.rbegin(); it != unique.rend() && (*it)->dst == p->dst; ++it)
      if (same_record(**it, *p)) {
        std::uintptr_t lo = 0, hi = 0;
        byte_window(*p, lo, hi);
        classify_repeat(reg, ties, marks, **it, (*it)->first, *p, p->first, true, lo, hi);
        repeated = true;
        break;
      }
    if (!repeated) unique.push_back(p);
  }
  // 2. Clusters of records whose byte windows intersect; only those (and records whose own
  //    destination may overlap itself) need the byte-exact check.
  struct window {
    std::uintptr_t lo, hi;
    const placement* p;
  };
  std::vector<window> windows;
  windows.reserve(unique.size());
  for (const placement* p : unique) {
    window w{0, 0, p};
    byte_window(*p, w.lo, w.hi);
    windows.push_back(w);
  }
  std::sort(windows.begin(), windows.end(),
            [](const window& a, const window& b) { return a.lo < b.lo; });
  std::vector<const placement*> cluster;
  std::vector<std::uint64_t> seen, multi;
  for (std::size_t i = 0; i < windows.size();) {
    std::uintptr_t hi = windows[i].hi;
    std::size_t j = i + 1;
    while (j < windows.size() && windows[j].lo < hi) hi = std::max(hi, windows[j++].hi);
    if (j - i > 1 || !dst_non_overlapping(*windows[i].p)) {
      cluster.clear();
      for (std::size_t k = i; k < j; ++k) cluster.push_back(windows[k].p);
      analyze_cluster(reg, ties, marks, cluster, windows[i].lo, hi, seen, multi);
    }
    i = j;
  }
}


// ---- placement_compiler

DCR_INLINE placement_compiler::placement_compiler(const tensor_registry& registry,
                                                  std::byte* scratch, std::size_t scratch_bytes)
    : registry_(&registry), scratch_(scratch) {
  DCR_EXPECTS(scratch_bytes >= static_cast<std::size_t>(registry.max_tensor_bytes()),
              errc::invalid_argument, "compile_placement: scratch smaller than the largest tensor");
  plan_.tensors_.resize(registry.tensors().size());
}

DCR_INLINE const canonical_tensor& placement_compiler::begin_tensor(std::size_t id) {
  tensor_ = &registry_->tensors()[id];
  id_ = id;
  tensor_placement& rep = plan_.tensors_[id];
  rep.tensor = static_cast<tensor_id>(id);
  rep.name = tensor_->name;
  begin_ = plan_.placements_.size();
  again_.clear();
  return *tensor_;
}

// The loader must not write into its src: after each load, what its copies read is zero.
DCR_INLINE void placement_compiler::check_src_untouched(std::span<const placement> records) const {
  const canonical_tensor& t = *tensor_;
  std::int64_t lo = t.numel(), hi = 0;
  for (const placement& p : records) {
    lo = std::min(lo, p.first);
    hi = std::max(hi, p.last + 1);
  }
  const auto word = static_cast<std::int64_t>(dtype_size(t.type));
  DCR_EXPECTS(lo >= hi || all_zero(scratch_ + lo * word, static_cast<std::size_t>((hi - lo) * word)),
              errc::unsupported_loader_path,
              "dcr loader: load() of tensor '" + t.name +
                  "' modified its src (the loader must only read the canonical tensor)");
}

DCR_INLINE void placement_compiler::end_first_load() {
  check_src_untouched(std::span<const placement>(plan_.placements_).subspan(begin_));
}

DCR_INLINE void placement_compiler::end_tensor(const load_record& first, const load_record& second) {
  const canonical_tensor& t = *tensor_;
  check_src_untouched(again_);
  bool same = first.copies == second.copies && first.skipped == second.skipped &&
              again_.size() == plan_.placements_.size() - begin_;
  for (std::size_t k = 0; same && k < again_.size(); ++k)
    same = same_record(again_[k], plan_.placements_[begin_ + k]);
  DCR_EXPECTS(same, errc::unsupported_loader_path,
              "dcr loader: two loads of tensor '" + t.name +
                  "' issued different copies (loaders must be deterministic)");
  tensor_placement& rep = plan_.tensors_[id_];
  rep.skipped = first.skipped;
  rep.copies = first.copies;
  rep.elements = first.elements;
  const std::size_t end = merge_runs(plan_.placements_, begin_, plan_.placements_.size());
  plan_.placements_.resize(end);
  for (std::size_t k = begin_; k < end; ++k) plan_.placements_[k].finalize();
  rep.first_placement = static_cast<std::uint32_t>(begin_);
  rep.placements = end - begin_;
}

DCR_INLINE placement_plan placement_compiler::finish(const std::vector<tensor_tie>& tie_list) {
  const auto tensors = registry_->tensors();
  overlap_marks marks;
  marks.reason.resize(tensors.size());
  for (const placement& p : plan_.placements_)
    if (!p.transform.preserves_bits())
      marks.mark(p.tensor, "copies through " + transform_name(p.transform) +
                               ", which does not preserve bits");
  const tie_set ties(*registry_, tie_list);
  analyze_writes(*registry_, ties, plan_.placements_, marks);
  refuse_conflict(*registry_, marks);
  for (std::size_t id = 0; id < tensors.size(); ++id) {
    tensor_placement& rep = plan_.tensors_[id];
    rep.overwrite_only = !marks.reason[id].empty();
    rep.reason = std::move(marks.reason[id]);
    if (rep.overwrite_only) plan_.overwrite_only_.push_back(rep.tensor);
  }
  return std::move(plan_);
}

}  // namespace detail

#endif  // DCR_HEADER_BODIES

}  // namespace dcr
