// compile_placement: runs of copies merge into one record, every destination element written
// twice is found byte-exactly (same element: overwrite-only; tied tensors: overwrite-only;
// different elements or partially overlapping words: an error naming both tensors), and the
// placement report says what each tensor does on this rank.
#include <doctest/doctest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dcr/apply/apply.hpp"
#include "dcr/apply/placement.hpp"
#include "test_engine.hpp"
#include "test_models.hpp"

namespace {

using dcr::apply_options;
using dcr::apply_path;
using dcr::dtype;
using dcr::encoding;
using dcr::errc;
using dcr::item;
using dcr::item_applier;
using dcr::tensor_registry;
using dcr::tensor_view;
using dcr_test::code_of;
using dcr_test::message_of;

static_assert(std::is_trivially_copyable_v<dcr::placement>);
static_assert(std::is_trivially_copyable_v<dcr::view_inverse>);

/// Small loaders that place tensors "a", "b" (f32 [8]) and "c" (bf16 [4]) into one shared
/// buffer in the ways the write analysis must tell apart.
struct scenario_loader {
  using loader_concept = dcr::loader_tag;
  enum class kind {
    interleaved,     ///< a and b into alternate columns of one buffer: disjoint, strided
    repeat_split,    ///< a whole, then a again in two halves: the same element twice
    tie_split,       ///< a whole, b in two halves onto the same words: a tie
    reversed_other,  ///< a whole, b reversed onto the same words: different elements
    partial_width,   ///< a's f32 words partly overwritten by c's bf16 words
    dst_broadcast,   ///< a's four first elements all into one word
  } k;
  std::vector<std::uint32_t> buf = std::vector<std::uint32_t>(32, 0);
  std::vector<dcr::tensor_tie> ties{};  ///< what tied_tensors() declares

  std::vector<dcr::tensor_tie> tied_tensors() const { return ties; }

  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor& t, tensor_view<const W> src, Sink& sink) {
    auto* words = reinterpret_cast<W*>(buf.data());
    auto flat = tensor_view<W>::contiguous(words, {8});
    switch (k) {
      case kind::interleaved: {
        auto cols = tensor_view<W>::contiguous(words, {8, 2});
        if (t.name == "c") return sink.skip(t);
        return sink.copy(cols.select(1, t.name == "a" ? 0 : 1), src);
      }
      case kind::repeat_split:
      case kind::tie_split:
        if (t.name == "c" || (k == kind::repeat_split && t.name == "b")) return sink.skip(t);
        if (t.name == "a") sink.copy(flat, src);
        if (t.name == "b" || k == kind::repeat_split) {
          sink.copy(flat.slice(0, 0, 4), src.slice(0, 0, 4));
          sink.copy(flat.slice(0, 4, 4), src.slice(0, 4, 4));
        }
        return;
      case kind::reversed_other:
        if (t.name == "c") return sink.skip(t);
        if (t.name == "a") return sink.copy(flat, src);
        return sink.copy(flat, tensor_view<const W>(src.data() + 7, 1, {8}, {-1}));
      case kind::partial_width:
        if (t.name == "b") return sink.skip(t);
        if (t.name == "a") return sink.copy(flat, src);
        return sink.copy(tensor_view<W>::contiguous(words + 3, {4}), src);  // bytes 6..14
      case kind::dst_broadcast:
        if (t.name != "a") return sink.skip(t);
        return sink.copy(tensor_view<W>(words, 1, {4}, {0}), src.slice(0, 0, 4));
    }
  }
};

tensor_registry scenario_registry() {
  return tensor_registry({{"a", dtype::f32, {8}}, {"b", dtype::f32, {8}}, {"c", dtype::bf16, {4}}});
}

/// Address space for storage whose parts lie far apart: `bytes` reserved without memory
/// (PROT_NONE), of which only the pages an engine writes are made accessible.
class reserved_span {
 public:
  explicit reserved_span(std::size_t bytes) : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  ~reserved_span() {
    if (base_ != nullptr) ::munmap(base_, bytes_);
  }
  reserved_span(const reserved_span&) = delete;
  reserved_span& operator=(const reserved_span&) = delete;
  [[nodiscard]] std::byte* base() const noexcept { return base_; }
  /// Makes the page at `offset` readable and writable (zero-filled) and returns its address.
  std::byte* page_at(std::size_t offset) {
    std::byte* p = base_ + offset;
    REQUIRE(::mprotect(p, 4096, PROT_READ | PROT_WRITE) == 0);
    return p;
  }

 private:
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
};

/// An engine that keeps each row of "a" (bf16 [8, 4]) in its own allocation, the allocations
/// `gap` bytes apart (one record of constant storage stride after merging), and "b" (bf16 [4])
/// in the gap between the first two, or (onto_row_3) onto a's row 3.
struct far_apart_loader {
  using loader_concept = dcr::loader_tag;
  static constexpr std::size_t gap = std::size_t{1} << 37;  // 128 GiB
  std::vector<std::byte*> rows;
  std::byte* b_storage = nullptr;
  bool onto_row_3 = false;

  explicit far_apart_loader(reserved_span& span) {
    for (std::size_t r = 0; r < 8; ++r) rows.push_back(span.page_at(r * gap));
    b_storage = span.page_at(gap / 2);
  }
  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor& t, tensor_view<const W> src, Sink& sink) {
    if (t.name == "b") {
      auto* dst = reinterpret_cast<W*>(onto_row_3 ? rows[3] : b_storage);
      return sink.copy(tensor_view<W>::contiguous(dst, {4}), src);
    }
    for (std::int64_t r = 0; r < 8; ++r)
      sink.copy(tensor_view<W>::contiguous(reinterpret_cast<W*>(rows[static_cast<std::size_t>(r)]), {4}),
                src.select(0, r));
  }
};

}  // namespace

TEST_CASE("a row-by-row loader compiles to one strided record per tensor") {
  dcr_test::model_config c;  // lm_head copied one vocab row at a time into transposed storage
  const tensor_registry reg(dcr_test::canonical_tensors(c));
  dcr_test::test_engine_loader loader(c, 2, 0);
  item_applier<dcr_test::test_engine_loader> ap(reg, loader);
  ap.prewarm();
  const auto& lm = ap.plan().at(reg.id("lm_head.weight"));
  CHECK(lm.copies == static_cast<std::uint64_t>(dcr::balanced_split(c.vocab, 2, 0).size()));
  CHECK(lm.placements == 1);
  CHECK(lm.elements == lm.copies * static_cast<std::uint64_t>(c.hidden));
  CHECK_FALSE(lm.overwrite_only);
  CHECK(lm.reason.empty());
  const auto records = ap.plan().placements_of(reg.id("lm_head.weight"));
  REQUIRE(records.size() == 1);
  CHECK(records[0].copies == lm.copies);
  CHECK(records[0].inv.dims == 2);
  // Every tensor has a report entry, in id order, naming it.
  REQUIRE(ap.plan().report().size() == reg.size());
  for (dcr::tensor_id id = 0; id < reg.size(); ++id) {
    CHECK(ap.plan().report()[id].tensor == id);
    CHECK(ap.plan().report()[id].name == reg.at(id).name);
  }
  // Experts of the other rank: skipped, no records.
  const auto& e3 = ap.plan().at(reg.id("model.layers.0.mlp.experts.3.gate_proj.weight"));
  CHECK(e3.skipped);
  CHECK(e3.copies == 0);
  CHECK(e3.placements == 0);
}

TEST_CASE("write analysis: disjoint strided writes, repeats, ties, conflicts") {
  const tensor_registry reg = scenario_registry();
  auto plan_of = [&](scenario_loader::kind k, scenario_loader& l) {
    l.k = k;
    item_applier<scenario_loader> ap(reg, l);
    ap.prewarm();
    return ap.plan();
  };
  using kind = scenario_loader::kind;
  scenario_loader l{};
  {
    const auto plan = plan_of(kind::interleaved, l);
    CHECK(plan.overwrite_only_tensors().empty());
    CHECK(plan.at(reg.id("a")).placements == 1);
  }
  {
    const auto plan = plan_of(kind::repeat_split, l);
    CHECK(plan.overwrite_only(reg.id("a")));
    CHECK(plan.at(reg.id("a")).reason.find("more than once") != std::string::npos);
    CHECK(plan.at(reg.id("a")).copies == 3);
    CHECK(plan.at(reg.id("a")).placements == 2);  // the two halves merged
  }
  {
    // Undeclared, the same element of two tensors in one storage is refused, naming both
    // tensors, the destination bytes and how to declare the tie.
    l.k = kind::tie_split;
    item_applier<scenario_loader> ap(reg, l);
    const std::string what = message_of([&] { ap.prewarm(); });
    CAPTURE(what);
    CHECK(code_of([&] { ap.prewarm(); }) == errc::unsupported_loader_path);
    CHECK(what.find("'a' and 'b'") != std::string::npos);
    const std::string range = "[" + dcr::detail::hex_address(reinterpret_cast<std::uintptr_t>(l.buf.data())) +
                              ", " + dcr::detail::hex_address(reinterpret_cast<std::uintptr_t>(l.buf.data() + 8)) +
                              ") (32 bytes)";
    CHECK(what.find(range) != std::string::npos);
    CHECK(what.find("tied_tensors()") != std::string::npos);
    CHECK_FALSE(ap.prewarmed());
    // A declaration must name two registry tensors of one dtype and shape.
    l.ties = {{"a", "zz"}};
    CHECK(code_of([&] { ap.prewarm(); }) == errc::unknown_tensor);
    l.ties = {{"a", "c"}};
    CHECK(code_of([&] { ap.prewarm(); }) == errc::invalid_argument);
    // A declared tie of other tensors does not cover this one.
    l.ties = {{"b", "b"}};
    CHECK(code_of([&] { ap.prewarm(); }) == errc::invalid_argument);
  }
  {
    l.ties = {{"b", "a"}};  // declared (in either order): both overwrite-only
    const auto plan = plan_of(kind::tie_split, l);
    CHECK(plan.overwrite_only(reg.id("a")));
    CHECK(plan.overwrite_only(reg.id("b")));
    CHECK(plan.at(reg.id("a")).reason.find("'b' (tied)") != std::string::npos);
    CHECK_FALSE(plan.overwrite_only(reg.id("c")));
    const auto list = plan.overwrite_only_tensors();
    CHECK(std::vector<dcr::tensor_id>(list.begin(), list.end()) ==
          std::vector<dcr::tensor_id>{reg.id("a"), reg.id("b")});
    // A declared tie does not excuse different elements in one storage.
    l.k = kind::reversed_other;
    item_applier<scenario_loader> ap(reg, l);
    CHECK(code_of([&] { ap.prewarm(); }) == errc::unsupported_loader_path);
    l.ties.clear();
  }
  for (kind k : {kind::reversed_other, kind::partial_width, kind::dst_broadcast}) {
    l.k = k;
    item_applier<scenario_loader> ap(reg, l);
    const std::string what = message_of([&] { ap.prewarm(); });
    CAPTURE(what);
    CHECK(code_of([&] { ap.prewarm(); }) == errc::unsupported_loader_path);
    CHECK(what.find("'a'") != std::string::npos);
    if (k != kind::dst_broadcast)
      CHECK(what.find(k == kind::partial_width ? "'c'" : "'b'") != std::string::npos);
    CHECK_FALSE(ap.prewarmed());
  }
}

TEST_CASE("compiled and general paths agree on the shared-buffer scenarios") {
  const tensor_registry reg = scenario_registry();
  std::mt19937_64 rng(17);
  using kind = scenario_loader::kind;
  for (kind k : {kind::interleaved, kind::repeat_split, kind::tie_split})
    for (int round = 0; round < 20; ++round) {
      dcr_test::model_versions m = dcr_test::random_versions(rng, reg, 0.5);
      if (k == kind::tie_split) {
        m.old_words[reg.id("b")] = m.old_words[reg.id("a")];
        m.new_words[reg.id("b")] = m.new_words[reg.id("a")];
      }
      scenario_loader la{k}, lb{k}, ld{k};
      if (k == kind::tie_split)
        for (auto* x : {&la, &lb, &ld}) x->ties = {{"a", "b"}};
      item_applier<scenario_loader> a(reg, la), b(reg, lb), d(reg, ld);
      for (auto* ap : {&a, &b}) {
        dcr_test::dense_load_all(*ap, reg, m.old_words);
        ap->prewarm();
      }
      dcr_test::dense_load_all(d, reg, m.new_words);
      const auto ow = a.plan().overwrite_only_tensors();
      const auto payloads =
          dcr_test::random_payloads(rng, reg, m, std::set<dcr::tensor_id>(ow.begin(), ow.end()));
      for (const auto& p : payloads) {
        const auto x = a.apply(p, apply_options{apply_path::compiled, true});
        const auto y = b.apply(p, apply_options{apply_path::general, true});
        CHECK(x.writes == y.writes);
      }
      CHECK(la.buf == ld.buf);
      CHECK(lb.buf == ld.buf);
    }
}

TEST_CASE("merge_runs keeps copies whose canonical steps overlap apart") {
  // Two copies of the same rows (step 0) and a descending run are not merged.
  const dcr::canonical_tensor t{"w", dtype::bf16, {4, 4}};
  std::vector<std::uint16_t> scratch(16, 0), out(64, 0);
  std::vector<dcr::placement> ps;
  dcr::detail::placement_probe<std::uint16_t> probe;
  probe.begin(t, 0, scratch.data(), &ps);
  auto src = tensor_view<const std::uint16_t>::contiguous(scratch.data(), {4, 4});
  auto dst = tensor_view<std::uint16_t>::contiguous(out.data(), {16, 4});
  probe.copy(dst.slice(0, 0, 1).select(0, 0), src.select(0, 0));
  probe.copy(dst.slice(0, 1, 1).select(0, 0), src.select(0, 0));  // same row again
  for (int r = 3; r >= 0; --r) probe.copy(dst.select(0, 4 + r), src.select(0, r));  // descending
  for (int r = 0; r < 4; ++r) probe.copy(dst.select(0, 8 + 2 * r), src.select(0, r));  // dst step 2
  probe.finish();
  REQUIRE(ps.size() == 10);
  const std::size_t end = dcr::detail::merge_runs(ps, 0, ps.size());
  // [row 0 -> 0], [row 0 -> 1, row 3 -> 7] (a constant step of 3 rows: merged), [2], [1], [0],
  // [rows 0..3 -> 8, 10, 12, 14]: the repeated row and the descending steps stay apart.
  CHECK(end == 6);
  CHECK(ps[1].copies == 2);
  CHECK(ps[end - 1].copies == 4);
  CHECK(ps[end - 1].inv.dst_step[0] == 8);  // two rows of 4 words per canonical row
}

TEST_CASE("invariant divisors divide exactly") {
  std::mt19937_64 rng(23);
  std::vector<std::uint64_t> divisors{1, 2, 3, 5, 7, 640, 2047, 2048, 2049, 4096, 1u << 31,
                                      (1ull << 32) + 1, (1ull << 62) - 1, 1ull << 62,
                                      (1ull << 63) - 1};
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + (rng() >> (1 + rng() % 63)));
  for (std::uint64_t d : divisors) {
    const auto v = dcr::invariant_divisor::of(d);
    std::vector<std::uint64_t> ns{0, 1, d - 1, d, d + 1, 2 * d - 1, (1ull << 63) - 1,
                                  ((1ull << 63) - 1) / d * d, ((1ull << 63) - 1) / d * d - 1};
    for (int k = 0; k < 200; ++k) ns.push_back(rng() >> (1 + rng() % 63));
    for (std::uint64_t n : ns) {
      if (n >= (1ull << 63)) continue;
      CAPTURE(d);
      CAPTURE(n);
      CHECK(v.divide(n) == n / d);
    }
  }
}

TEST_CASE("write analysis memory follows the elements placed, not the address span") {
  // a's rows 128 GiB apart merge into one record whose window spans 896 GiB, with b inside it:
  // a bitmap over that window would take 56 GiB per pass (std::bad_alloc); the analysis must
  // cover only the blocks the 36 elements touch, and still find overlaps byte-exactly.
  reserved_span span(8 * far_apart_loader::gap);
  REQUIRE(span.base() != nullptr);
  const tensor_registry reg({{"a", dtype::bf16, {8, 4}}, {"b", dtype::bf16, {4}}});
  far_apart_loader l(span);
  item_applier<far_apart_loader> ap(reg, l);
  ap.prewarm();
  const auto a = reg.id("a"), b = reg.id("b");
  CHECK(ap.plan().at(a).placements == 1);
  CHECK(ap.plan().at(a).copies == 8);
  CHECK(ap.plan().overwrite_only_tensors().empty());
  // The plan places elements where the loader put them (compiled path, checked after writing).
  std::vector<item> items(2);
  items[0] = {a, dtype::bf16, encoding::overwrite, {1, 13, 31}, {}};
  items[1] = {b, dtype::bf16, encoding::xor_mask, {0, 3}, {}};
  for (auto& it : items) {
    it.values.resize(it.indices.size() * 2);
    for (std::size_t k = 0; k < it.indices.size(); ++k)
      it.words<std::uint16_t>()[k] = static_cast<std::uint16_t>(0x3f00 + it.indices[k]);
  }
  const auto stats = ap.apply(items, apply_options{apply_path::compiled, true});
  CHECK(stats.writes == 5);
  const auto word = [](std::byte* p, int k) { return reinterpret_cast<std::uint16_t*>(p)[k]; };
  CHECK(word(l.rows[0], 1) == 0x3f01);
  CHECK(word(l.rows[3], 1) == 0x3f0d);
  CHECK(word(l.rows[7], 3) == 0x3f1f);
  CHECK(word(l.b_storage, 0) == 0x3f00);
  CHECK(word(l.b_storage, 3) == 0x3f03);
  // b written onto a's row 3 (a's elements 12..15 and b's 0..3): found across the gap.
  l.onto_row_3 = true;
  item_applier<far_apart_loader> bad(reg, l);
  const std::string what = message_of([&] { bad.prewarm(); });
  CAPTURE(what);
  CHECK(code_of([&] { bad.prewarm(); }) == errc::unsupported_loader_path);
  CHECK(what.find("'a' element 12") != std::string::npos);
  CHECK(what.find("'b' element 0") != std::string::npos);
}
