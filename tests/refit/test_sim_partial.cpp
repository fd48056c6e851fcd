// The synthetic trainer as separate processes see it: every buffer's words are a pure function of
// (seed, buffer, step, rates), so an owner process that materializes only its own shards, a
// restarted owner moved straight to step s, and a receiver computing canonical tensors one at a
// time must all agree bit for bit with one full trainer stepped in order.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "dcr/sim/moe_model.hpp"

namespace {

using dcr::sim::embedding_tie;
using dcr::sim::synthetic_trainer;
using dcr::sim::trainer_layout;
using dcr::sim::trainer_selection;

using bytes = std::vector<std::byte>;

/// One trainer shape to check.
struct setup {
  trainer_layout layout;
  dcr::dtype type;
  embedding_tie tie;
  int tp, dp;
};

std::string describe(const setup& s) {
  return std::string(dcr::sim::layout_name(s.layout)) + " " +
         std::string(dcr::dtype_name(s.type)) + " tie=" + dcr::sim::tie_name(s.tie) +
         " tp=" + std::to_string(s.tp) + " dp=" + std::to_string(s.dp);
}

/// Shapes that do not divide by 3 (uneven TP splits, KV groups, experts), with shards long
/// enough to span several generation blocks.
dcr::sim::moe_config model_for(const setup& s) {
  dcr::sim::moe_config c;
  c.type = s.type;
  c.hidden = 40;
  c.kv_dim = 10;
  c.kv_groups = 5;
  c.dense_ffn = 130;
  c.expert_ffn = 14;
  c.experts = 5;
  c.layers = 3;
  c.vocab = 700;  // 28000 words: several blocks per vocab-parallel shard
  c.tie_embeddings = s.tie;
  return c;
}

std::vector<setup> setups() {
  std::vector<setup> v;
  for (auto layout : {trainer_layout::megatron, trainer_layout::plain})
    for (auto type : {dcr::dtype::bf16, dcr::dtype::f32})
      for (auto tie : {embedding_tie::none, embedding_tie::store_both, embedding_tie::omit_lm_head})
        v.push_back({layout, type, tie, 3, 3});
  v.push_back({trainer_layout::megatron, dcr::dtype::f16, embedding_tie::none, 2, 1});
  v.push_back({trainer_layout::megatron, dcr::dtype::bf16, embedding_tie::store_both, 1, 2});
  return v;
}

bytes copy_of(std::span<const std::byte> s) { return {s.begin(), s.end()}; }

bytes shard_at(const synthetic_trainer& t, std::size_t i, std::uint64_t step,
               const dcr::sim::stress_schedule& schedule) {
  bytes out(t.shards()[i].task.bytes());
  t.shard_words_at(i, step, schedule, out);
  return out;
}

bytes input_at(const synthetic_trainer& t, std::size_t r, std::size_t k, std::uint64_t step,
               const dcr::sim::stress_schedule& schedule) {
  bytes out(t.residual()[r].task.inputs[k].bytes());
  t.residual_words_at(r, k, step, schedule, out);
  return out;
}

std::vector<bytes> assemble(const synthetic_trainer& t, const dcr::tensor_registry& reg) {
  std::vector<bytes> c(reg.size());
  std::vector<std::span<std::byte>> spans;
  for (std::size_t id = 0; id < reg.size(); ++id) {
    c[id].resize(static_cast<std::size_t>(reg.at(static_cast<dcr::tensor_id>(id)).bytes()));
    spans.emplace_back(c[id]);
  }
  t.assemble_canonical(spans);
  return c;
}

dcr::errc code_of(auto&& f) {
  try {
    f();
  } catch (const dcr::error& e) {
    return e.dcr_code();
  }
  return dcr::errc::ok;
}

const double rates[] = {0.05, 0.0, 1.0, 0.01};

}  // namespace

TEST_CASE("partial trainers, advance_to and random access agree with a full trainer") {
  for (const auto& s : setups()) {
    CAPTURE(describe(s));
    const auto c = model_for(s);
    const dcr::tensor_registry reg(c.canonical_tensors());
    synthetic_trainer full(c, reg, s.tp, s.dp, /*seed=*/11, s.layout);
    for (int k = 0; k < 3; ++k) full.stress_step(rates[k]);
    REQUIRE(full.step() == 3);
    REQUIRE(full.rates().size() == 3);
    const auto schedule = full.schedule();
    const auto owners = full.owners();
    const auto residual_owners = full.residual_owners();

    // Owner processes: each rank materializes what it owns, moved straight to step 3.
    std::vector<int> held(full.shards().size(), 0), held_residual(full.residual().size(), 0);
    for (int rank = 0; rank < s.tp * s.dp; ++rank) {
      CAPTURE(rank);
      synthetic_trainer owner(c, reg, s.tp, s.dp, 11, s.layout,
                              trainer_selection::owned_by(static_cast<std::uint32_t>(rank)));
      owner.advance_to(3, schedule);
      CHECK(owner.step() == 3);
      for (std::size_t i = 0; i < full.shards().size(); ++i) {
        const bool own = owners[i] == static_cast<std::uint32_t>(rank);
        if (own) {
          REQUIRE(owner.materialized(i));
          ++held[i];
        }
        if (owner.materialized(i)) {
          CHECK(copy_of(owner.words(i)) == copy_of(full.words(i)));
        } else {
          CHECK(code_of([&] { (void)owner.words(i); }) == dcr::errc::not_ready);
          CHECK(code_of([&] { (void)owner.mutable_words(i); }) == dcr::errc::not_ready);
        }
      }
      for (std::size_t r = 0; r < full.residual().size(); ++r) {
        const bool own = residual_owners[r] == static_cast<std::uint32_t>(rank);
        REQUIRE(owner.residual_materialized(r) == own);
        if (!own) {
          CHECK(code_of([&] { (void)owner.residual_words(r, 0); }) == dcr::errc::not_ready);
          continue;
        }
        ++held_residual[r];
        for (std::size_t k = 0; k < full.residual()[r].task.inputs.size(); ++k)
          CHECK(copy_of(owner.residual_words(r, k)) == copy_of(full.residual_words(r, k)));
      }
    }
    for (int h : held) CHECK(h == 1);  // every shard has exactly one owner
    for (int h : held_residual) CHECK(h == 1);

    // A partial trainer of a few shards stepped in order with the same rates.
    std::vector<std::size_t> some;
    for (std::size_t i = 0; i < full.shards().size(); i += 3) some.push_back(i);
    std::vector<std::size_t> last_task;
    if (!full.residual().empty()) last_task.push_back(full.residual().size() - 1);
    synthetic_trainer partial(c, reg, s.tp, s.dp, 11, s.layout,
                              trainer_selection::only(some, last_task));
    for (int k = 0; k < 3; ++k) partial.stress_step(rates[k]);
    for (std::size_t i : some) CHECK(copy_of(partial.words(i)) == copy_of(full.words(i)));
    if (!full.residual().empty())
      for (std::size_t k = 0; k < full.residual().back().task.inputs.size(); ++k)
        CHECK(copy_of(partial.residual_words(full.residual().size() - 1, k)) ==
              copy_of(full.residual_words(full.residual().size() - 1, k)));

    // Random access, from a trainer that holds nothing (a receiver process).
    synthetic_trainer none(c, reg, s.tp, s.dp, 11, s.layout, trainer_selection::none());
    const std::size_t wb = dcr::dtype_size(c.type);
    for (std::size_t i = 0; i < full.shards().size(); ++i) {
      CHECK_FALSE(none.materialized(i));
      const auto expect = copy_of(full.words(i));
      CHECK(shard_at(none, i, 3, schedule) == expect);
      // A range starting inside one block and ending inside a later one.
      const std::uint64_t n = expect.size() / wb;
      if (n > synthetic_trainer::block_words + 20) {
        const std::uint64_t first = synthetic_trainer::block_words - 7;
        bytes part(std::min(synthetic_trainer::block_words + 11, n - first) * wb);
        none.shard_words_at(i, 3, schedule, part, first);
        CHECK(std::memcmp(part.data(), expect.data() + first * wb, part.size()) == 0);
      }
    }
    for (std::size_t r = 0; r < full.residual().size(); ++r)
      for (std::size_t k = 0; k < full.residual()[r].task.inputs.size(); ++k)
        CHECK(input_at(none, r, k, 3, schedule) == copy_of(full.residual_words(r, k)));
  }
}

TEST_CASE("canonical tensors one at a time equal assemble_canonical at every step") {
  for (const auto& s : setups()) {
    CAPTURE(describe(s));
    const auto c = model_for(s);
    const dcr::tensor_registry reg(c.canonical_tensors());
    synthetic_trainer full(c, reg, s.tp, s.dp, /*seed=*/23, s.layout);
    synthetic_trainer receiver(c, reg, s.tp, s.dp, 23, s.layout, trainer_selection::none());
    for (std::uint64_t step = 0; step <= 3; ++step) {
      CAPTURE(step);
      if (step > 0) full.stress_step(rates[step]);
      const auto expect = assemble(full, reg);
      for (std::size_t id = 0; id < reg.size(); ++id) {
        const auto tid = static_cast<dcr::tensor_id>(id);
        CAPTURE(reg.at(tid).name);
        bytes out(expect[id].size(), std::byte{0x5a});
        bytes scratch(static_cast<std::size_t>(receiver.canonical_scratch_bytes(tid)));
        receiver.canonical_at(tid, step, full.schedule(), out, scratch);
        CHECK(out == expect[id]);
        if (step == 3) {  // bounded scratch: a block, or one residual task's inputs
          std::uint64_t bound = synthetic_trainer::block_words * dcr::dtype_size(c.type);
          for (const auto& r : full.residual()) bound = std::max(bound, r.task.input_bytes());
          CHECK(scratch.size() <= bound);
          if (!scratch.empty())
            CHECK(code_of([&] {
                    receiver.canonical_at(tid, step, full.schedule(), out,
                                          std::span(scratch).first(scratch.size() - 1));
                  }) == dcr::errc::invalid_argument);
        }
      }
    }
    if (s.tie == embedding_tie::store_both) {
      bytes embed(static_cast<std::size_t>(reg.at(reg.id("model.embed_tokens.weight")).bytes()));
      bytes head(embed.size());
      receiver.canonical_at(reg.id("model.embed_tokens.weight"), 3, full.schedule(), embed);
      receiver.canonical_at(reg.id("lm_head.weight"), 3, full.schedule(), head);
      CHECK(embed == head);
    }
    CHECK(reg.find("lm_head.weight").has_value() == (s.tie != embedding_tie::omit_lm_head));
    // A step the schedule does not cover.
    bytes norm(static_cast<std::size_t>(reg.at(reg.id("model.norm.weight")).bytes()));
    CHECK(code_of([&] {
            receiver.canonical_at(reg.id("model.norm.weight"), 4, full.schedule(), norm);
          }) == dcr::errc::out_of_range);
  }
}

TEST_CASE("advance_to regenerates any step in place, and rejects steps it has no rates for") {
  dcr::sim::moe_config c;
  const dcr::tensor_registry reg(c.canonical_tensors());
  synthetic_trainer t(c, reg, 2, 2, 3);
  const std::vector<double> schedule_rates{0.2, 0.1, 0.3, 0.05};
  const auto* data = t.words(0).data();
  t.advance_to(4, schedule_rates);
  CHECK(t.step() == 4);
  CHECK(t.words(0).data() == data);  // spans held by a binding stay valid
  CHECK(copy_of(t.words(0)) == shard_at(t, 0, 4, schedule_rates));
  t.stress_step(0.4);  // step 5 continues from the regenerated words
  const std::vector<double> five{0.2, 0.1, 0.3, 0.05, 0.4};
  CHECK(std::vector<double>(t.rates().begin(), t.rates().end()) == five);
  CHECK(copy_of(t.words(1)) == shard_at(t, 1, 5, five));
  t.mutable_words(0)[0] = std::byte{0xff};
  t.advance_to(1, t.schedule());  // backwards, discarding the edit
  CHECK(t.step() == 1);
  CHECK(copy_of(t.words(0)) == shard_at(t, 0, 1, 0.2));
  CHECK(copy_of(t.words(0)) != shard_at(t, 0, 0, 0.2));
  CHECK(code_of([&] { t.advance_to(2, t.schedule()); }) == dcr::errc::out_of_range);
  CHECK(t.step() == 1);
  // A constant rate covers every step.
  t.advance_to(7, 0.01);
  CHECK(t.rates().size() == 7);
  CHECK(copy_of(t.words(2)) == shard_at(t, 2, 7, 0.01));
}

TEST_CASE("the seed and the buffer name decide the words") {
  dcr::sim::moe_config c;
  c.type = dcr::dtype::f32;
  const dcr::tensor_registry reg(c.canonical_tensors());
  synthetic_trainer a(c, reg, 2, 1, 1), a_again(c, reg, 2, 1, 1), b(c, reg, 2, 1, 2);
  a.stress_step(0.1);
  a_again.stress_step(0.1);
  b.stress_step(0.1);
  for (std::size_t i = 0; i < a.shards().size(); ++i) {
    CAPTURE(a.shards()[i].task.shard_name);
    CHECK(copy_of(a.words(i)) == copy_of(a_again.words(i)));
    CHECK(copy_of(a.words(i)) != copy_of(b.words(i)));
  }
  // Two shards of one size (TP rank 1's stacked up and down projections) get different words.
  CHECK(copy_of(a.words(a.shards().size() - 1)) != copy_of(a.words(a.shards().size() - 2)));
  for (std::size_t k = 0; k < a.residual()[0].task.inputs.size(); ++k)
    CHECK(copy_of(a.residual_words(0, k)) != copy_of(b.residual_words(0, k)));
  // The changes of a step depend on the seed as well: other positions are chosen.
  auto changed_positions = [](const synthetic_trainer& t) {
    bytes before(t.shards()[0].task.bytes()), after(before.size());
    t.shard_words_at(0, 0, 0.5, before);
    t.shard_words_at(0, 1, 0.5, after);
    std::vector<bool> changed(before.size() / 4);
    for (std::size_t j = 0; j < changed.size(); ++j)
      changed[j] = std::memcmp(before.data() + 4 * j, after.data() + 4 * j, 4) != 0;
    return changed;
  };
  CHECK(changed_positions(a) != changed_positions(b));
}

TEST_CASE("stress steps change the share of words their rate asks for") {
  for (auto type : {dcr::dtype::f32, dcr::dtype::bf16}) {
    CAPTURE(std::string(dcr::dtype_name(type)));
    dcr::sim::moe_config c;
    c.type = type;
    c.vocab = 8192;  // about 1.2M words in all
    const dcr::tensor_registry reg(c.canonical_tensors());
    synthetic_trainer t(c, reg, 2, 2, 7);
    std::uint64_t words = 0;
    for (std::size_t i = 0; i < t.shards().size(); ++i)
      if (t.shards()[i].tied_to == dcr::sim::trainer_shard::no_alias)
        words += t.words(i).size() / dcr::dtype_size(type);
    for (std::size_t r = 0; r < t.residual().size(); ++r)
      for (std::size_t k = 0; k < t.residual()[r].task.inputs.size(); ++k)
        words += t.residual()[r].task.inputs[k].elements;
    REQUIRE(words > 1'000'000);
    for (int step = 1; step <= 3; ++step) {
      CAPTURE(step);
      const double share = static_cast<double>(t.stress_step(0.01)) / static_cast<double>(words);
      // f32 almost never rounds a 1% change back; bf16 (8 significant bits) does for |z| small
      // enough, about a fifth to a third of the chosen words.
      if (type == dcr::dtype::f32) {
        CHECK(share > 0.0095);
        CHECK(share < 0.0105);
      } else {
        CHECK(share > 0.0060);
        CHECK(share < 0.0090);
      }
    }
    CHECK(t.stress_step(0.0) == 0);
    if (type == dcr::dtype::f32) CHECK(static_cast<double>(t.stress_step(1.0)) > 0.99 * words);

    // The words a step changes, seen through random access, are those stress_step counted.
    synthetic_trainer full(c, reg, 2, 2, 7);
    std::uint64_t counted = 0;
    for (int step = 1; step <= 2; ++step) counted = full.stress_step(0.01);
    std::uint64_t differing = 0;
    for (std::size_t i = 0; i < full.shards().size(); ++i) {
      if (full.shards()[i].tied_to != dcr::sim::trainer_shard::no_alias) continue;
      const auto before = shard_at(full, i, 1, 0.01);
      const auto after = copy_of(full.words(i));
      for (std::size_t j = 0; j < after.size(); j += dcr::dtype_size(type))
        differing += std::memcmp(before.data() + j, after.data() + j, dcr::dtype_size(type)) != 0;
    }
    for (std::size_t r = 0; r < full.residual().size(); ++r)
      for (std::size_t k = 0; k < full.residual()[r].task.inputs.size(); ++k) {
        const auto before = input_at(full, r, k, 1, 0.01);
        const auto after = copy_of(full.residual_words(r, k));
        for (std::size_t j = 0; j < after.size(); j += dcr::dtype_size(type))
          differing += std::memcmp(before.data() + j, after.data() + j, dcr::dtype_size(type)) != 0;
      }
    CHECK(differing == counted);
  }
}
