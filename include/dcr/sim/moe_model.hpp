// dcr/sim/moe_model.hpp: a synthetic mixture-of-experts model, its Megatron-style training
// layout, and the paper's stress protocol for updates. Used by `dcr simulate`, the property
// tests and the benchmarks; also a worked example of describing a trainer to dcr.
//
// Canonical tensors follow Hugging Face Qwen3-MoE naming: embeddings, per-layer attention
// q/k/v/o projections and norms, a dense MLP in layer 0, routed experts (router `mlp.gate` plus
// per-expert gate/up/down projections) in the other layers, final norm and lm_head.
//
// Training layout (tensor parallel degree tp, data parallel degree dp; rank = dp_rank*tp + tp_rank):
//   embed_tokens, lm_head, q/k/v, gate/up  -> row_split over tp  (vocab / column parallel)
//   o_proj, down_proj                      -> column_split over tp (row parallel)
//   experts                                -> stacked [E_local, ...] per tp rank (expert parallel)
//   norms, router                          -> replicated on every rank
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/mapping.hpp"
#include "dcr/refit/ownership.hpp"
#include "dcr/refit/task.hpp"
#include "dcr/sim/random.hpp"

namespace dcr::sim {

/// Shapes of the synthetic model.
struct moe_config {
  std::int64_t hidden = 64;
  std::int64_t kv_dim = 16;      ///< rows of k_proj and v_proj (grouped-query attention)
  std::int64_t dense_ffn = 176;  ///< layer 0 MLP width
  std::int64_t expert_ffn = 32;  ///< per-expert MLP width
  std::int64_t experts = 8;
  std::int64_t layers = 2;
  std::int64_t vocab = 512;
  dtype type = dtype::bf16;

  /// A model of about `bytes` bytes: hidden size the largest of 1024..64 that still allows two
  /// layers, then as many layers as fit.
  static moe_config for_bytes(std::uint64_t bytes, dtype type = dtype::bf16) {
    moe_config best;
    for (std::int64_t h : {1024, 512, 256, 128, 64}) {
      moe_config c;
      c.type = type;
      c.hidden = h;
      c.kv_dim = h / 4;
      c.dense_ffn = h * 11 / 4;
      c.expert_ffn = h * 3 / 8;
      c.experts = 16;
      c.vocab = 32 * h;
      c.layers = 1;
      const std::uint64_t base = c.total_bytes();
      c.layers = 2;
      const std::uint64_t per_layer = c.total_bytes() - base;
      best = c;
      if (bytes >= c.total_bytes() || h == 64) {
        const std::uint64_t fixed = base - per_layer;  // layers = 0
        best.layers = bytes > fixed ? std::max<std::int64_t>(2, (bytes - fixed) / per_layer) : 2;
        break;
      }
    }
    return best;
  }

  /// Every canonical tensor of the model.
  [[nodiscard]] std::vector<canonical_tensor> canonical_tensors() const {
    std::vector<canonical_tensor> t;
    auto add = [&](std::string name, std::vector<std::int64_t> shape) {
      t.push_back({std::move(name), type, std::move(shape)});
    };
    add("model.embed_tokens.weight", {vocab, hidden});
    add("lm_head.weight", {vocab, hidden});
    add("model.norm.weight", {hidden});
    for (std::int64_t l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {hidden});
      add(p + "post_attention_layernorm.weight", {hidden});
      add(p + "self_attn.q_proj.weight", {hidden, hidden});
      add(p + "self_attn.k_proj.weight", {kv_dim, hidden});
      add(p + "self_attn.v_proj.weight", {kv_dim, hidden});
      add(p + "self_attn.o_proj.weight", {hidden, hidden});
      if (l == 0) {
        add(p + "mlp.gate_proj.weight", {dense_ffn, hidden});
        add(p + "mlp.up_proj.weight", {dense_ffn, hidden});
        add(p + "mlp.down_proj.weight", {hidden, dense_ffn});
      } else {
        add(p + "mlp.gate.weight", {experts, hidden});
        for (std::int64_t e = 0; e < experts; ++e) {
          const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
          add(q + "gate_proj.weight", {expert_ffn, hidden});
          add(q + "up_proj.weight", {expert_ffn, hidden});
          add(q + "down_proj.weight", {hidden, expert_ffn});
        }
      }
    }
    return t;
  }

  [[nodiscard]] std::uint64_t total_bytes() const {
    std::uint64_t b = 0;
    for (const auto& t : canonical_tensors()) b += static_cast<std::uint64_t>(t.bytes());
    return b;
  }
};

/// One unique source shard of the trainer and the ranks holding it.
struct trainer_shard {
  affine_task task;
  std::vector<std::uint32_t> holders;
};

/// The Megatron-style training layout of `config` (see the header comment).
inline std::vector<trainer_shard> make_trainer_shards(const moe_config& config,
                                                      const tensor_registry& registry, int tp,
                                                      int dp) {
  DCR_EXPECTS(tp >= 1 && dp >= 1, errc::invalid_argument, "trainer layout: tp and dp must be >= 1");
  std::vector<trainer_shard> shards;
  auto holders_of_tp_rank = [&](int r) {
    std::vector<std::uint32_t> h;
    for (int d = 0; d < dp; ++d) h.push_back(static_cast<std::uint32_t>(d * tp + r));
    return h;
  };
  std::vector<std::uint32_t> everyone;
  for (int k = 0; k < tp * dp; ++k) everyone.push_back(static_cast<std::uint32_t>(k));

  auto add = [&](std::string shard_name, any_mapping mapping, std::vector<tensor_id> targets,
                 std::vector<std::uint32_t> holders) {
    trainer_shard s;
    s.task.shard_name = std::move(shard_name);
    s.task.type = config.type;
    s.task.mapping = mapping;
    s.task.targets = std::move(targets);
    s.holders = std::move(holders);
    shards.push_back(std::move(s));
  };
  auto shape_of = [&](const std::string& name) { return registry.at(registry.id(name)).shape; };
  auto replicate = [&](const std::string& name) {
    const auto id = registry.id(name);
    add(name, replicated(static_cast<std::uint64_t>(registry.at(id).numel())), {id}, everyone);
  };
  auto split_rows = [&](const std::string& name) {
    const auto shape = shape_of(name);
    for (int r = 0; r < tp; ++r)
      add("tp" + std::to_string(r) + "/" + name, row_split(shape, tp, r), {registry.id(name)},
          holders_of_tp_rank(r));
  };
  auto split_columns = [&](const std::string& name) {
    const auto shape = shape_of(name);
    for (int r = 0; r < tp; ++r)
      add("tp" + std::to_string(r) + "/" + name, column_split(shape, tp, r), {registry.id(name)},
          holders_of_tp_rank(r));
  };

  split_rows("model.embed_tokens.weight");
  split_rows("lm_head.weight");
  replicate("model.norm.weight");
  for (std::int64_t l = 0; l < config.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    replicate(p + "input_layernorm.weight");
    replicate(p + "post_attention_layernorm.weight");
    split_rows(p + "self_attn.q_proj.weight");
    split_rows(p + "self_attn.k_proj.weight");
    split_rows(p + "self_attn.v_proj.weight");
    split_columns(p + "self_attn.o_proj.weight");
    if (l == 0) {
      split_rows(p + "mlp.gate_proj.weight");
      split_rows(p + "mlp.up_proj.weight");
      split_columns(p + "mlp.down_proj.weight");
      continue;
    }
    replicate(p + "mlp.gate.weight");
    for (int r = 0; r < tp; ++r) {
      const auto mine = balanced_split(config.experts, tp, r);
      if (mine.size() == 0) continue;
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        std::vector<tensor_id> targets;
        for (auto e = mine.begin; e < mine.end; ++e)
          targets.push_back(registry.id(p + "mlp.experts." + std::to_string(e) + "." + proj +
                                        ".weight"));
        const auto& shape = registry.at(targets[0]).shape;
        std::vector<std::int64_t> zeros(shape.size(), 0);
        add("tp" + std::to_string(r) + "/" + p + "mlp.experts." + proj + ".stacked",
            stacked(static_cast<std::uint32_t>(mine.size()), box(shape, zeros, shape)),
            std::move(targets), holders_of_tp_rank(r));
      }
    }
  }
  return shards;
}

/// Reads a word of `type` as a double (bf16, f16, f32 only).
template <storage_word W>
inline double word_to_double(dtype type, W w) {
  if constexpr (sizeof(W) == 2) return type == dtype::bf16 ? bf16_to_float(w) : f16_to_float(w);
  else if constexpr (sizeof(W) == 4) return static_cast<double>(bit_cast<float>(w));
  else return 0.0;
}
/// Rounds a double to the nearest word of `type` (bf16, f16, f32), ties to even.
template <storage_word W>
inline W double_to_word(dtype type, double v) {
  if constexpr (sizeof(W) == 2)
    return type == dtype::bf16 ? float_to_bf16(static_cast<float>(v)) : float_to_f16(static_cast<float>(v));
  else if constexpr (sizeof(W) == 4) return bit_cast<std::uint32_t>(static_cast<float>(v));
  else return W{};
}

/// The trainer's weights: one copy of every unique shard (data-parallel replicas are bitwise
/// identical, so they share it), with synthetic initial values and stress-protocol updates.
class synthetic_trainer {
 public:
  synthetic_trainer(const moe_config& config, const tensor_registry& registry, int tp, int dp,
                    std::uint64_t seed)
      : config_(config), registry_(&registry), tp_(tp), dp_(dp), rng_(seed),
        shards_(make_trainer_shards(config, registry, tp, dp)) {
    DCR_EXPECTS(config.type == dtype::bf16 || config.type == dtype::f16 ||
                    config.type == dtype::f32,
                errc::invalid_argument, "synthetic_trainer: dtype must be bf16, f16 or f32");
    words_.resize(shards_.size());
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      words_[i].resize(shards_[i].task.bytes());
      visit_word(dtype_size(config.type), [&](auto w) {
        using W = decltype(w);
        if constexpr (sizeof(W) == 2 || sizeof(W) == 4) {
          auto* p = reinterpret_cast<W*>(words_[i].data());
          const std::size_t n = words_[i].size() / sizeof(W);
          for (std::size_t j = 0; j < n; ++j)
            p[j] = double_to_word<W>(config_.type, 0.02 * rng_.fast_normal());
        }
      });
    }
  }

  [[nodiscard]] const moe_config& config() const noexcept { return config_; }
  [[nodiscard]] int tp() const noexcept { return tp_; }
  [[nodiscard]] int dp() const noexcept { return dp_; }
  [[nodiscard]] std::span<const trainer_shard> shards() const noexcept { return shards_; }
  [[nodiscard]] std::span<const std::byte> words(std::size_t shard) const { return words_.at(shard); }
  [[nodiscard]] std::span<std::byte> mutable_words(std::size_t shard) { return words_.at(shard); }

  /// The paper's stress protocol: each element is chosen with probability `rate`, multiplied
  /// by (1 + 0.01 z) with z ~ N(0,1), and rounded to the dtype (ties to even). Returns how many
  /// stored words changed (a product can round back to the old word).
  std::uint64_t stress_step(double rate, double amplitude = 0.01) {
    if (rate <= 0) return 0;
    const double log1m = rate >= 1 ? -INFINITY : std::log1p(-rate);
    std::uint64_t changed = 0;
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      visit_word(dtype_size(config_.type), [&](auto w) {
        using W = decltype(w);
        if constexpr (sizeof(W) == 2 || sizeof(W) == 4) {
          auto* p = reinterpret_cast<W*>(words_[i].data());
          const std::uint64_t n = words_[i].size() / sizeof(W);
          for (std::uint64_t j = rng_.geometric_gap(log1m) - 1; j < n;
               j += rng_.geometric_gap(log1m)) {
            const double v = word_to_double<W>(config_.type, p[j]);
            const W next = double_to_word<W>(config_.type, v * (1.0 + amplitude * rng_.normal()));
            changed += next != p[j];
            p[j] = next;
          }
        }
      });
    }
    return changed;
  }

  /// Owner rank of every shard (see assign_owners).
  [[nodiscard]] std::vector<std::uint32_t> owners() const {
    std::vector<shard_holding> h;
    for (const auto& s : shards_) h.push_back({s.task.shard_name, s.task.bytes(), s.holders});
    return assign_owners(h);
  }

  /// Writes the dense canonical tensors (the dense refit's input) by scattering every shard
  /// through its mapping; out[id] must have registry.at(id).bytes() bytes.
  void assemble_canonical(std::span<const std::span<std::byte>> out) const {
    DCR_EXPECTS(out.size() == registry_->size(), errc::invalid_argument,
                "assemble_canonical: one output per canonical tensor expected");
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      const auto& task = shards_[i].task;
      const std::size_t wb = dtype_size(task.type);
      std::visit(
          [&](const auto& m) {
            const std::uint64_t n = m.local_size();
            for (std::uint64_t j = 0; j < n;) {
              const mapped_index d = m(j);
              const std::uint64_t run = m.run_length(j);
              std::memcpy(out[task.targets[d.part]].data() + d.index * wb,
                          words_[i].data() + j * wb, run * wb);
              j += run;
            }
          },
          task.mapping);
    }
  }

 private:
  moe_config config_;
  const tensor_registry* registry_;
  int tp_, dp_;
  rng rng_;
  std::vector<trainer_shard> shards_;
  std::vector<std::vector<std::byte>> words_;
};

}  // namespace dcr::sim
