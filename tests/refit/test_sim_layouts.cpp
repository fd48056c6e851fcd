// The simulated deployment's real engine layouts, end to end: a Megatron-style trainer (fused QKV
// converted by a residual task, fused gate/up as a two-part affine task, DP replicas) refit to
// serving ranks laid out vLLM-style (padded vocab-parallel embeddings, tied embedding storage,
// cast norm copies, transposed router, fused qkv/gate_up, expert parallel), on both apply paths.
// Every receiver must end byte for byte equal to a dense refit through its own loader (special bit
// patterns included), padding rows must never be written, and exactly the tensors the layouts
// make overwrite-only must be. DCR_TEST_SEEDS sets the number of randomized deployments.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "dcr/sim/deployment.hpp"
#include "../random_deployment.hpp"

namespace {

using dcr::sim::embedding_tie;
using dcr::sim::engine_layout;
using dcr::sim::in_process_deployment;
using dcr::sim::trainer_layout;

int seeds_from_env(int fallback) {
  const char* s = std::getenv("DCR_TEST_SEEDS");
  return s ? std::max(1, std::atoi(s)) : fallback;
}

std::set<std::string> names_of(const dcr::tensor_registry& reg, std::span<const dcr::tensor_id> ids) {
  std::set<std::string> s;
  for (auto id : ids) s.insert(reg.at(id).name);
  return s;
}

/// The tensors the receivers of `d` must take as overwrite only: every norm when some receiver
/// keeps cast norm copies (serving layout), and both embeddings when the checkpoint stores the
/// tied pair and a serving receiver holding vocabulary rows loads both into one storage.
std::set<std::string> expected_overwrite_only(in_process_deployment& d) {
  const auto& o = d.options();
  bool serving = false, tied_storage = false;
  for (std::size_t r = 0; r < d.receiver_count(); ++r) {
    if (d.receiver_layout(r) != engine_layout::serving) continue;
    serving = true;
    const auto rows = dcr::balanced_split(o.model.vocab, o.receiver_tp, static_cast<int>(r));
    if (o.model.tie_embeddings == embedding_tie::store_both && rows.size() > 0) tied_storage = true;
  }
  std::set<std::string> s;
  if (serving) {
    s.insert("model.norm.weight");
    for (std::int64_t l = 0; l < o.model.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      s.insert(p + "input_layernorm.weight");
      s.insert(p + "post_attention_layernorm.weight");
    }
  }
  if (tied_storage) {
    s.insert("model.embed_tokens.weight");
    s.insert("lm_head.weight");
  }
  return s;
}

/// Words that float equality and float casts mishandle: zeros of both signs, NaNs with payloads,
/// infinities, subnormals.
template <class W>
std::vector<W> special_words(dcr::dtype t) {
  if constexpr (sizeof(W) == 2) {
    if (t == dcr::dtype::bf16) return {0x0000, 0x8000, 0x7fc0, 0x7fc1, 0xffc3, 0x7f81, 0x7f80, 0x0001};
    return {0x0000, 0x8000, 0x7e00, 0x7e01, 0xfe03, 0x7c01, 0x7c00, 0x0001};
  } else {
    return {0x00000000u, 0x80000000u, 0x7fc00000u, 0x7fc00001u, 0xffc12345u, 0x7f800001u,
            0x7f800000u, 0x00000001u};
  }
}

/// Overwrites `count` random words of the trainer's buffers (affine shards, tied shards included,
/// and residual inputs) with special patterns.
void inject_specials(dcr::sim::synthetic_trainer& t, dcr::sim::rng& g, int count) {
  const auto type = t.config().type;
  for (int k = 0; k < count; ++k) {
    std::span<std::byte> words;
    if (!t.residual().empty() && g.next() % 3 == 0) {
      const std::size_t r = g.next() % t.residual().size();
      words = t.mutable_residual_words(r, g.next() % t.residual()[r].task.inputs.size());
    } else {
      words = t.mutable_words(g.next() % t.shards().size());
    }
    if (words.empty()) continue;
    dcr::visit_word(dcr::dtype_size(type), [&](auto w) {
      using W = decltype(w);
      if constexpr (sizeof(W) == 2 || sizeof(W) == 4) {
        const auto specials = special_words<W>(type);
        auto* p = reinterpret_cast<W*>(words.data());
        p[g.next() % (words.size() / sizeof(W))] = specials[g.next() % specials.size()];
      }
    });
  }
}

/// Canonical tensors of the trainer's current words, by id.
std::vector<std::vector<std::byte>> canonical_of(in_process_deployment& d) {
  const auto& reg = d.registry();
  std::vector<std::vector<std::byte>> c(reg.size());
  std::vector<std::span<std::byte>> spans;
  for (std::size_t id = 0; id < reg.size(); ++id) {
    c[id].resize(static_cast<std::size_t>(reg.at(static_cast<dcr::tensor_id>(id)).bytes()));
    spans.emplace_back(c[id]);
  }
  d.trainer().assemble_canonical(spans);
  return c;
}

template <class W>
W word_at(const std::vector<std::byte>& bytes, std::size_t i) {
  W w;
  std::memcpy(&w, bytes.data() + i * sizeof(W), sizeof(W));
  return w;
}

}  // namespace

TEST_CASE("delta refit equals dense refit over randomized trainer and engine layouts") {
  const int seeds = seeds_from_env(60);
  const double rates[] = {0.01, 0.0, 1.0, 0.01, 1.0, 0.0, 0.01};
  for (int seed = 1; seed <= seeds; ++seed) {
    dcr::sim::rng g(static_cast<std::uint64_t>(seed) * 104729);
    dcr::sim::deployment_options o;
    o.model = dcr_test::random_model(g);
    o.trainer_tp = static_cast<int>(dcr_test::pick(g, 1, 8));
    o.trainer_dp = static_cast<int>(dcr_test::pick(g, 1, 3));
    o.receiver_tp = static_cast<int>(dcr_test::pick(g, 1, 8));
    o.seed = static_cast<std::uint64_t>(seed);
    o.trainer = g.next() % 4 == 0 ? trainer_layout::plain : trainer_layout::megatron;
    switch (g.next() % 4) {
      case 0: o.engine = engine_layout::plain; break;
      case 1:  // receivers of both layouts: owners must honour the union of overwrite-only sets
        for (int r = 0; r < o.receiver_tp; ++r)
          o.receiver_layouts.push_back(g.next() % 2 ? engine_layout::serving : engine_layout::plain);
        break;
      default: o.engine = engine_layout::serving;
    }
    o.path = g.next() % 2 ? dcr::apply_path::general : dcr::apply_path::compiled;
    CAPTURE(seed);
    CAPTURE(o.trainer_tp);
    CAPTURE(o.trainer_dp);
    CAPTURE(o.receiver_tp);
    CAPTURE(std::string(dcr::dtype_name(o.model.type)));
    CAPTURE(std::string(dcr::sim::tie_name(o.model.tie_embeddings)));
    CAPTURE(std::string(dcr::sim::layout_name(o.trainer)));
    CAPTURE(o.model.hidden);
    CAPTURE(o.model.kv_dim);
    CAPTURE(o.model.vocab);

    in_process_deployment d(o);
    inject_specials(d.trainer(), g, 10);
    d.start();
    REQUIRE(d.verify_against_dense_refit() == "");  // the initial dense load itself
    REQUIRE(d.first_written_padding() == "");
    const auto expected = expected_overwrite_only(d);
    CHECK(names_of(d.registry(), d.overwrite_only_tensors()) == expected);
    CHECK(d.registry().find("lm_head.weight").has_value() ==
          (o.model.tie_embeddings != embedding_tie::omit_lm_head));
    const bool megatron = o.trainer == trainer_layout::megatron;
    CHECK(d.trainer().residual().size() == (megatron ? static_cast<std::size_t>(o.model.layers) : 0u));
    CHECK((d.coverage().affine_share() < 1.0) == megatron);

    for (double rate : rates) {
      CAPTURE(rate);
      d.trainer().stress_step(rate);
      if (rate > 0) inject_specials(d.trainer(), g, 5);
      // Either path may serve any transition; the result must not depend on it.
      d.set_apply_path(g.next() % 2 ? dcr::apply_path::general : dcr::apply_path::compiled);
      dcr::refit_options ro;
      const auto policy = g.next() % 4;
      ro.policy = policy == 0   ? dcr::encoding_policy::overwrite_only
                  : policy == 1 ? dcr::encoding_policy::xor_only
                                : dcr::encoding_policy::mixed;
      ro.bucket_bytes = 1 + g.next() % 8192;  // many small payloads as well as single ones
      const auto report = d.refit(ro);
      REQUIRE(report.committed);
      // One attempt: no receiver refused an xor/ulp item, so owners sent every overwrite-only
      // tensor as overwrite.
      REQUIRE(report.attempts.size() == 1);
      CHECK(names_of(d.registry(), report.overwrite_only_tensors) == expected);
      const auto& a = report.attempts[0];
      if (rate == 0.0) CHECK(a.records == 0);
      if (rate == 1.0 && megatron) {
        CHECK(a.owners.residual_conversions == 3 * static_cast<std::uint64_t>(o.model.layers));
        CHECK(a.owners.residual_items > 0);
      }
      if (rate == 1.0 && !expected.empty() && ro.policy != dcr::encoding_policy::overwrite_only)
        CHECK(a.owners.forced_overwrite_items > 0);
      REQUIRE(d.verify_against_dense_refit() == "");
      REQUIRE(d.first_written_padding() == "");
    }
    CHECK(d.version() == std::size(rates));
  }
}

TEST_CASE("serving layout: padded vocab rows, cast norm copies, transposed router, tied storage") {
  for (auto tie : {embedding_tie::none, embedding_tie::omit_lm_head, embedding_tie::store_both}) {
    CAPTURE(std::string(dcr::sim::tie_name(tie)));
    dcr::sim::deployment_options o;  // defaults: Megatron trainer, serving engine, compiled path
    REQUIRE(o.trainer == trainer_layout::megatron);
    REQUIRE(o.engine == engine_layout::serving);
    REQUIRE(o.path == dcr::apply_path::compiled);
    o.model.vocab = 300;  // 75 rows per rank of 4: 128 stored, 53 padding rows
    o.model.tie_embeddings = tie;
    in_process_deployment d(o);
    d.start();
    const auto& reg = d.registry();
    auto& storage = d.storage_at(1);
    const auto& params = storage.params();

    // Vocab-parallel storage padded to a multiple of 64 rows; the loader writes only valid rows.
    const auto& embed = params.at("embed");
    CHECK(embed.shape[0] == 128);
    CHECK(embed.valid_rows == 75);
    CHECK(params.count("lm_head") == (tie == embedding_tie::store_both ? 0u : 1u));
    CHECK(storage.padding_bytes() > 0);

    // Overwrite-only tensors and why.
    const auto& rx = d.receiver_at(1);
    const auto report = rx.placement_report();
    const auto norm = reg.id("model.norm.weight");
    CHECK(report[norm].overwrite_only);
    CHECK(report[norm].reason.find("cast") != std::string::npos);
    const auto embed_id = reg.id("model.embed_tokens.weight");
    if (tie == embedding_tie::store_both) {
      CHECK(report[embed_id].overwrite_only);
      CHECK(report[embed_id].reason.find("tied") != std::string::npos);
      CHECK(report[reg.id("lm_head.weight")].overwrite_only);
    } else {
      CHECK_FALSE(report[embed_id].overwrite_only);  // two destinations of one tensor: xor-able
      CHECK(report[embed_id].copies == (tie == embedding_tie::omit_lm_head ? 2u : 1u));
    }
    CHECK_FALSE(report[reg.id("model.layers.1.mlp.gate.weight")].overwrite_only);

    for (double rate : {1.0, 0.01}) {
      d.trainer().stress_step(rate);
      const auto r = d.refit();
      REQUIRE(r.committed);
      REQUIRE(r.attempts.size() == 1);
      REQUIRE(d.verify_against_dense_refit() == "");
      CHECK(d.first_written_padding() == "");
    }

    // What the engine holds, read back through its own layout.
    const auto canonical = canonical_of(d);
    const auto rows = dcr::balanced_split(o.model.vocab, o.receiver_tp, 1);
    const std::size_t row_bytes = static_cast<std::size_t>(o.model.hidden) * 2;
    const auto& embed_words = canonical[embed_id];
    CHECK(std::memcmp(embed.bytes.data(), embed_words.data() + rows.begin * row_bytes,
                      rows.size() * row_bytes) == 0);
    if (tie == embedding_tie::omit_lm_head)
      CHECK(params.at("lm_head").bytes == embed.bytes);  // loaded from the embedding
    // fp32 copy of the bf16 norm: exact widening.
    const auto& norm_words = canonical[norm];
    const auto& norm_cast = params.at("norm.cast");
    CHECK(norm_cast.type == dcr::dtype::f32);
    for (std::int64_t i = 0; i < o.model.hidden; ++i)
      CHECK(word_at<std::uint32_t>(norm_cast.bytes, static_cast<std::size_t>(i)) ==
            (static_cast<std::uint32_t>(word_at<std::uint16_t>(norm_words, static_cast<std::size_t>(i)))
             << 16));
    // Router stored transposed: router_t[h][e] = gate[e][h].
    const auto& router_t = params.at("layers.1.router_t");
    const auto& gate = canonical[reg.id("model.layers.1.mlp.gate.weight")];
    REQUIRE(router_t.shape == std::vector<std::int64_t>{o.model.hidden, o.model.experts});
    for (std::int64_t e = 0; e < o.model.experts; ++e)
      for (std::int64_t h = 0; h < o.model.hidden; ++h)
        CHECK(word_at<std::uint16_t>(router_t.bytes, static_cast<std::size_t>(h * o.model.experts + e)) ==
              word_at<std::uint16_t>(gate, static_cast<std::size_t>(e * o.model.hidden + h)));
  }
}

TEST_CASE("plain layouts: no residual task, no overwrite-only tensor, no padding") {
  dcr::sim::deployment_options o;
  o.trainer = trainer_layout::plain;
  o.engine = engine_layout::plain;
  o.model.tie_embeddings = embedding_tie::store_both;  // both tensors, separate storages
  in_process_deployment d(o);
  d.start();
  CHECK(d.trainer().residual().empty());
  CHECK(d.coverage().affine_share() == 1.0);
  CHECK(d.overwrite_only_tensors().empty());
  for (std::size_t r = 0; r < d.receiver_count(); ++r) CHECK(d.storage_at(r).padding_bytes() == 0);
  d.trainer().stress_step(0.05);
  const auto report = d.refit();
  REQUIRE(report.committed);
  CHECK(report.attempts[0].owners.forced_overwrite_items == 0);
  CHECK(d.verify_against_dense_refit() == "");
}

TEST_CASE("Megatron fused QKV: per KV group q rows, then k, then v; a residual task owned by name hash") {
  dcr::sim::moe_config c;
  c.hidden = 32;
  c.kv_dim = 8;
  c.kv_groups = 4;  // q: 8 rows per group, k and v: 2 rows per group
  c.layers = 2;
  const dcr::tensor_registry reg(c.canonical_tensors());
  dcr::sim::synthetic_trainer t(c, reg, /*tp=*/2, /*dp=*/3, /*seed=*/5);
  REQUIRE(t.residual().size() == 2);
  const auto& task = t.residual()[0].task;
  CHECK(task.name == "model.layers.0.self_attn.linear_qkv");
  REQUIRE(task.inputs.size() == 2);  // one fused block per TP rank: 2 groups x (8 + 2 + 2) rows
  CHECK(task.inputs[0].elements == static_cast<std::uint64_t>(2 * 12 * c.hidden));
  CHECK(t.residual()[0].input_holders[1] == std::vector<std::uint32_t>{1, 3, 5});

  // Tag each fused row with (tp rank, row) and check where the conversion puts it.
  for (std::size_t k = 0; k < 2; ++k) {
    auto w = t.mutable_residual_words(0, k);
    auto* p = reinterpret_cast<std::uint16_t*>(w.data());
    for (std::int64_t row = 0; row < 24; ++row)
      for (std::int64_t col = 0; col < c.hidden; ++col)
        p[row * c.hidden + col] = static_cast<std::uint16_t>(k * 1000 + static_cast<std::size_t>(row));
  }
  std::vector<std::vector<std::byte>> canonical(reg.size());
  std::vector<std::span<std::byte>> spans;
  for (std::size_t id = 0; id < reg.size(); ++id) {
    canonical[id].resize(static_cast<std::size_t>(reg.at(static_cast<dcr::tensor_id>(id)).bytes()));
    spans.emplace_back(canonical[id]);
  }
  t.assemble_canonical(spans);
  auto row_tag = [&](const char* name, std::int64_t row) {
    return word_at<std::uint16_t>(canonical[reg.id(std::string("model.layers.0.self_attn.") + name)],
                                  static_cast<std::size_t>(row * c.hidden));
  };
  // Group g (rank g / 2, local group g % 2) starts at fused row 12 * (g % 2).
  for (std::int64_t g = 0; g < 4; ++g) {
    const auto base = static_cast<std::uint16_t>((g / 2) * 1000 + 12 * (g % 2));
    for (std::int64_t r = 0; r < 8; ++r) CHECK(row_tag("q_proj.weight", g * 8 + r) == base + r);
    for (std::int64_t r = 0; r < 2; ++r) {
      CHECK(row_tag("k_proj.weight", g * 2 + r) == base + 8 + r);
      CHECK(row_tag("v_proj.weight", g * 2 + r) == base + 10 + r);
    }
  }

  // The residual owner is the name-hash owner among the ranks holding its inputs.
  const auto owners = t.residual_owners();
  const std::vector<std::uint32_t> all{0, 1, 2, 3, 4, 5};
  CHECK(owners[0] == dcr::residual_owner(task.name, all));

  // Layer 0's gate/up stay affine: one two-part task per TP rank.
  int fused_fc1 = 0;
  for (const auto& s : t.shards())
    if (s.task.shard_name.find("linear_fc1") != std::string::npos) {
      ++fused_fc1;
      CHECK(s.task.targets.size() == 2);
      CHECK(s.task.delta_encodable);
      CHECK(s.holders.size() == 3);
    }
  CHECK(fused_fc1 == 2);
  const auto cov = t.coverage();
  const auto qkv_bytes = static_cast<std::uint64_t>(2 * (c.hidden + 2 * c.kv_dim) * c.hidden * 2);
  CHECK(cov.residual_bytes == qkv_bytes);
  CHECK(cov.uncovered_bytes == 0);
  CHECK(cov.affine_bytes + cov.residual_bytes == static_cast<std::uint64_t>(reg.total_bytes()));
}

TEST_CASE("a deployment's owners hold each residual task once, at its name-hash owner") {
  dcr::sim::deployment_options o;
  o.trainer_tp = 3;
  o.trainer_dp = 2;
  in_process_deployment d(o);
  d.start();
  const auto expected = d.trainer().residual_owners();
  std::vector<int> held(d.trainer().residual().size(), 0);
  for (std::size_t k = 0; k < d.owner_count(); ++k) {
    const auto& own = d.owner_at(k);
    for (const auto& task : own.residual_tasks())
      for (std::size_t r = 0; r < held.size(); ++r)
        if (d.trainer().residual()[r].task.name == task.name) {
          ++held[r];
          CHECK(own.id() == expected[r]);
        }
  }
  for (int h : held) CHECK(h == 1);
}
