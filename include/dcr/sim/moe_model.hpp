// dcr/sim/moe_model.hpp: a synthetic mixture-of-experts model, its training layout, and the
// paper's stress protocol for updates. Used by `dcr simulate`, the property tests and the
// benchmarks; also a worked example of describing a trainer to dcr with affine and residual
// tasks.
//
// Canonical tensors follow Hugging Face Qwen3-MoE naming: embeddings, per-layer attention
// q/k/v/o projections and norms, a dense MLP in layer 0, routed experts (router `mlp.gate` plus
// per-expert gate/up/down projections) in the other layers, final norm and lm_head. With tied
// embeddings (moe_config::tie_embeddings) the checkpoint either has no lm_head.weight or stores
// it bit-equal to model.embed_tokens.weight.
//
// Training layouts (tensor parallel degree tp, data parallel degree dp; rank = dp_rank*tp + tp_rank;
// every shard of TP rank r is held by its dp replicas, replicated ones by every rank):
//   trainer_layout::megatron (default), as Megatron-LM keeps its parameters:
//     embed_tokens, lm_head  -> row_split over tp (vocab parallel); with embedding_tie::store_both
//                               the lm_head tasks read the embedding shards' words (one tied
//                               parameter exported twice)
//     linear_qkv             -> one fused block per TP rank holding, for each of its KV groups, the
//                               group's q rows, then its k rows, then its v rows; converted to
//                               canonical q/k/v by one RESIDUAL task per layer, owned by the
//                               name-hash owner (dcr::residual_owner)
//     o_proj, down_proj      -> column_split over tp (row parallel)
//     linear_fc1 (layer 0)   -> gate and up rows of the TP rank fused [2 * ffn/tp, hidden]: an
//                               affine `stacked` mapping with two parts (gate, up)
//     experts                -> stacked [E_local, ...] per tp rank (expert parallel)
//     norms, router          -> replicated on every rank
//   trainer_layout::plain: every tensor its own affine shard (q/k/v and gate/up row-split
//     separately), no residual task.
// KV groups: the model has qkv_groups() groups; group g holds balanced_split(hidden, G, g) rows of
// q and balanced_split(kv_dim, G, g) rows of k and of v, and TP rank r holds the groups
// balanced_split(G, tp, r). For shapes that divide evenly (every real model) this is exactly
// Megatron's interleaved QKV; the balanced splits let the property tests use any shape and TP.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcr/canonical.hpp"
#include "dcr/mapping.hpp"
#include "dcr/refit/ownership.hpp"
#include "dcr/refit/residual.hpp"
#include "dcr/refit/task.hpp"
#include "dcr/sim/random.hpp"

namespace dcr::sim {

/// How the model ties its input embedding and output projection.
enum class embedding_tie : std::uint8_t {
  none,          ///< separate model.embed_tokens.weight and lm_head.weight
  omit_lm_head,  ///< tied; the checkpoint has no lm_head.weight (engines reuse the embedding)
  store_both,    ///< tied; the checkpoint stores lm_head.weight bit-equal to embed_tokens
};

/// "none", "omit-lm-head", "store-both".
inline const char* tie_name(embedding_tie t) noexcept {
  switch (t) {
    case embedding_tie::none: return "none";
    case embedding_tie::omit_lm_head: return "omit-lm-head";
    case embedding_tie::store_both: return "store-both";
  }
  return "?";
}

/// Shapes of the synthetic model.
struct moe_config {
  std::int64_t hidden = 64;
  std::int64_t kv_dim = 16;      ///< rows of k_proj and v_proj (grouped-query attention)
  std::int64_t kv_groups = 2;    ///< KV heads (query groups); see qkv_groups()
  std::int64_t dense_ffn = 176;  ///< layer 0 MLP width
  std::int64_t expert_ffn = 32;  ///< per-expert MLP width
  std::int64_t experts = 8;
  std::int64_t layers = 2;
  std::int64_t vocab = 512;
  dtype type = dtype::bf16;
  embedding_tie tie_embeddings = embedding_tie::none;

  /// KV groups actually used: kv_groups clamped to [1, min(hidden, kv_dim)], so every group has
  /// at least one q row and one k/v row whatever the shapes.
  [[nodiscard]] std::int64_t qkv_groups() const noexcept {
    return std::clamp<std::int64_t>(kv_groups, 1, std::max<std::int64_t>(1, std::min(hidden, kv_dim)));
  }

  /// Whether the checkpoint has lm_head.weight.
  [[nodiscard]] bool has_lm_head() const noexcept {
    return tie_embeddings != embedding_tie::omit_lm_head;
  }

  /// A model of about `bytes` bytes: hidden size the largest of 1024..64 that still allows two
  /// layers, then as many layers as fit. Heads of 64 (fewer for small hidden sizes), four query
  /// heads per KV group.
  static moe_config for_bytes(std::uint64_t bytes, dtype type = dtype::bf16) {
    moe_config best;
    for (std::int64_t h : {1024, 512, 256, 128, 64}) {
      moe_config c;
      c.type = type;
      c.hidden = h;
      c.kv_dim = h / 4;
      c.kv_groups = c.kv_dim / std::min<std::int64_t>(64, c.kv_dim / 2);
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
    if (has_lm_head()) add("lm_head.weight", {vocab, hidden});
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

/// Which training layout the synthetic trainer uses (see the file comment).
enum class trainer_layout : std::uint8_t {
  megatron,  ///< fused QKV (residual) and fused gate/up (affine, two parts); the default
  plain,     ///< every canonical tensor split on its own; affine tasks only
};

/// "megatron" or "plain".
inline const char* layout_name(trainer_layout l) noexcept {
  return l == trainer_layout::megatron ? "megatron" : "plain";
}

/// One unique affine source shard of the trainer and the ranks holding it.
struct trainer_shard {
  affine_task task;
  std::vector<std::uint32_t> holders;
  /// Index of the shard whose words this one reads (a tied parameter exported as two canonical
  /// tensors), or no_alias when the shard has words of its own.
  std::size_t tied_to = no_alias;
  static constexpr std::size_t no_alias = std::numeric_limits<std::size_t>::max();
};

/// One residual task of the trainer and the ranks holding each of its inputs.
struct trainer_residual {
  residual_task task;
  std::vector<std::vector<std::uint32_t>> input_holders;  ///< per input of task.inputs
};

/// Every task of a training layout.
struct trainer_tasks {
  std::vector<trainer_shard> shards;
  std::vector<trainer_residual> residual;
};

namespace detail {

/// One run of rows copied by the fused-QKV conversion: `rows` rows from row `src_row` of input
/// `input` to row `dst_row` of the output.
struct row_block {
  std::uint32_t input;
  std::int64_t src_row, dst_row, rows;
};

/// The residual task converting Megatron's per-TP-rank fused QKV blocks of layer prefix `p`
/// ("model.layers.<l>.") into canonical q/k/v. Ranks holding no KV group contribute no input.
inline trainer_residual fused_qkv_task(const moe_config& c, const tensor_registry& registry,
                                       const std::string& p, int tp,
                                       const std::vector<std::vector<std::uint32_t>>& holders_of_tp_rank) {
  const std::int64_t groups = c.qkv_groups();
  trainer_residual r;
  r.task.name = p + "self_attn.linear_qkv";
  // blocks[o]: how output o (q, k, v) is assembled from the inputs.
  auto blocks = std::make_shared<std::vector<std::vector<row_block>>>(3);
  for (int rank = 0; rank < tp; ++rank) {
    const auto mine = balanced_split(groups, tp, rank);
    if (mine.size() == 0) continue;
    const auto input = static_cast<std::uint32_t>(r.task.inputs.size());
    std::int64_t row = 0;  // next row of this rank's fused block
    for (auto g = mine.begin; g < mine.end; ++g) {
      const auto q = balanced_split(c.hidden, static_cast<int>(groups), static_cast<int>(g));
      const auto kv = balanced_split(c.kv_dim, static_cast<int>(groups), static_cast<int>(g));
      (*blocks)[0].push_back({input, row, q.begin, q.size()});
      row += q.size();
      (*blocks)[1].push_back({input, row, kv.begin, kv.size()});
      row += kv.size();
      (*blocks)[2].push_back({input, row, kv.begin, kv.size()});
      row += kv.size();
    }
    r.task.inputs.push_back({"tp" + std::to_string(rank) + "/" + p + "self_attn.linear_qkv.weight",
                             c.type, static_cast<std::uint64_t>(row * c.hidden)});
    r.input_holders.push_back(holders_of_tp_rank[static_cast<std::size_t>(rank)]);
  }
  for (const char* proj : {"q_proj", "k_proj", "v_proj"})
    r.task.outputs.push_back({registry.id(p + "self_attn." + proj + ".weight"), {}});
  const std::size_t row_bytes = static_cast<std::size_t>(c.hidden) * dtype_size(c.type);
  const std::int64_t out_rows[3] = {c.hidden, c.kv_dim, c.kv_dim};
  r.task.convert = [blocks, row_bytes, out_rows](std::size_t output,
                                                 std::span<const std::span<const std::byte>> inputs,
                                                 std::span<std::byte> destination) {
    DCR_EXPECTS(output < 3 && destination.size() ==
                                  static_cast<std::size_t>(out_rows[output]) * row_bytes,
                errc::shape_mismatch, "fused QKV conversion: destination has the wrong size");
    for (const row_block& b : (*blocks)[output]) {
      const auto bytes = static_cast<std::size_t>(b.rows) * row_bytes;
      DCR_EXPECTS(static_cast<std::size_t>(b.src_row) * row_bytes + bytes <= inputs[b.input].size(),
                  errc::shape_mismatch, "fused QKV conversion: input block too small");
      std::memcpy(destination.data() + static_cast<std::size_t>(b.dst_row) * row_bytes,
                  inputs[b.input].data() + static_cast<std::size_t>(b.src_row) * row_bytes, bytes);
    }
  };
  return r;
}

}  // namespace detail

/// The tasks of `layout` for `config` (see the file comment).
inline trainer_tasks make_trainer_tasks(const moe_config& config, const tensor_registry& registry,
                                        int tp, int dp,
                                        trainer_layout layout = trainer_layout::megatron) {
  DCR_EXPECTS(tp >= 1 && dp >= 1, errc::invalid_argument, "trainer layout: tp and dp must be >= 1");
  trainer_tasks out;
  auto& shards = out.shards;
  std::vector<std::vector<std::uint32_t>> holders_of_tp_rank(static_cast<std::size_t>(tp));
  for (int r = 0; r < tp; ++r)
    for (int d = 0; d < dp; ++d)
      holders_of_tp_rank[static_cast<std::size_t>(r)].push_back(static_cast<std::uint32_t>(d * tp + r));
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
          holders_of_tp_rank[static_cast<std::size_t>(r)]);
  };
  auto split_columns = [&](const std::string& name) {
    const auto shape = shape_of(name);
    for (int r = 0; r < tp; ++r)
      add("tp" + std::to_string(r) + "/" + name, column_split(shape, tp, r), {registry.id(name)},
          holders_of_tp_rank[static_cast<std::size_t>(r)]);
  };
  const bool megatron = layout == trainer_layout::megatron;

  const std::size_t first_embed = shards.size();
  split_rows("model.embed_tokens.weight");
  if (config.tie_embeddings == embedding_tie::none) {
    split_rows("lm_head.weight");
  } else if (config.tie_embeddings == embedding_tie::store_both) {
    // One tied parameter, exported as both tensors: the lm_head tasks read the embedding words.
    const auto shape = shape_of("lm_head.weight");
    for (int r = 0; r < tp; ++r) {
      add("tp" + std::to_string(r) + "/lm_head.weight(tied)", row_split(shape, tp, r),
          {registry.id("lm_head.weight")}, holders_of_tp_rank[static_cast<std::size_t>(r)]);
      shards.back().tied_to = first_embed + static_cast<std::size_t>(r);
    }
  }
  replicate("model.norm.weight");
  for (std::int64_t l = 0; l < config.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    replicate(p + "input_layernorm.weight");
    replicate(p + "post_attention_layernorm.weight");
    if (megatron) {
      out.residual.push_back(detail::fused_qkv_task(config, registry, p, tp, holders_of_tp_rank));
    } else {
      split_rows(p + "self_attn.q_proj.weight");
      split_rows(p + "self_attn.k_proj.weight");
      split_rows(p + "self_attn.v_proj.weight");
    }
    split_columns(p + "self_attn.o_proj.weight");
    if (l == 0) {
      if (megatron) {
        // linear_fc1: this rank's gate rows, then its up rows, in one [2 * f, hidden] block.
        const auto shape = shape_of(p + "mlp.gate_proj.weight");
        for (int r = 0; r < tp; ++r) {
          const auto f = balanced_split(shape[0], tp, r);
          if (f.size() == 0) continue;
          const std::vector<std::int64_t> offsets{f.begin, 0}, extents{f.size(), shape[1]};
          add("tp" + std::to_string(r) + "/" + p + "mlp.linear_fc1.weight",
              stacked(2, box(shape, offsets, extents)),
              {registry.id(p + "mlp.gate_proj.weight"), registry.id(p + "mlp.up_proj.weight")},
              holders_of_tp_rank[static_cast<std::size_t>(r)]);
        }
      } else {
        split_rows(p + "mlp.gate_proj.weight");
        split_rows(p + "mlp.up_proj.weight");
      }
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
            std::move(targets), holders_of_tp_rank[static_cast<std::size_t>(r)]);
      }
    }
  }
  return out;
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

/// The trainer's weights: one copy of every unique source shard (data-parallel replicas are
/// bitwise identical, so they share it; a tied lm_head task reads the embedding's words), with
/// synthetic initial values and stress-protocol updates.
class synthetic_trainer {
 public:
  synthetic_trainer(const moe_config& config, const tensor_registry& registry, int tp, int dp,
                    std::uint64_t seed, trainer_layout layout = trainer_layout::megatron)
      : config_(config), registry_(&registry), tp_(tp), dp_(dp), layout_(layout), rng_(seed) {
    DCR_EXPECTS(config.type == dtype::bf16 || config.type == dtype::f16 ||
                    config.type == dtype::f32,
                errc::invalid_argument, "synthetic_trainer: dtype must be bf16, f16 or f32");
    auto tasks = make_trainer_tasks(config, registry, tp, dp, layout);
    shards_ = std::move(tasks.shards);
    residual_ = std::move(tasks.residual);
    std::vector<affine_task> affine;
    for (const auto& s : shards_) affine.push_back(s.task);
    std::vector<residual_task> residual;
    for (const auto& r : residual_) residual.push_back(r.task);
    coverage_ = measure_coverage(registry, affine, residual);  // also validates the layout
    words_.resize(shards_.size());
    for (std::size_t i = 0; i < shards_.size(); ++i)
      if (shards_[i].tied_to == trainer_shard::no_alias) {
        words_[i].resize(shards_[i].task.bytes());
        fill_initial(words_[i]);
      }
    residual_words_.resize(residual_.size());
    for (std::size_t r = 0; r < residual_.size(); ++r)
      for (const auto& in : residual_[r].task.inputs) {
        residual_words_[r].emplace_back(in.bytes());
        fill_initial(residual_words_[r].back());
      }
  }

  [[nodiscard]] const moe_config& config() const noexcept { return config_; }
  [[nodiscard]] int tp() const noexcept { return tp_; }
  [[nodiscard]] int dp() const noexcept { return dp_; }
  [[nodiscard]] trainer_layout layout() const noexcept { return layout_; }
  /// The affine shards.
  [[nodiscard]] std::span<const trainer_shard> shards() const noexcept { return shards_; }
  /// The residual tasks.
  [[nodiscard]] std::span<const trainer_residual> residual() const noexcept { return residual_; }
  /// Checkpoint bytes covered by affine vs residual tasks (dcr::measure_coverage).
  [[nodiscard]] const task_coverage& coverage() const noexcept { return coverage_; }

  /// Words of affine shard `shard` (a tied shard's are its source's).
  [[nodiscard]] std::span<const std::byte> words(std::size_t shard) const {
    return words_.at(buffer_of(shard));
  }
  [[nodiscard]] std::span<std::byte> mutable_words(std::size_t shard) {
    return words_.at(buffer_of(shard));
  }
  /// Words of input `input` of residual task `task`.
  [[nodiscard]] std::span<const std::byte> residual_words(std::size_t task, std::size_t input) const {
    return residual_words_.at(task).at(input);
  }
  [[nodiscard]] std::span<std::byte> mutable_residual_words(std::size_t task, std::size_t input) {
    return residual_words_.at(task).at(input);
  }

  /// The paper's stress protocol over every source buffer (affine shards and residual inputs):
  /// each element is chosen with probability `rate`, multiplied by (1 + 0.01 z) with z ~ N(0,1),
  /// and rounded to the dtype (ties to even). Returns how many stored words changed (a product
  /// can round back to the old word).
  std::uint64_t stress_step(double rate, double amplitude = 0.01) {
    if (rate <= 0) return 0;
    const double log1m = rate >= 1 ? -INFINITY : std::log1p(-rate);
    std::uint64_t changed = 0;
    auto step = [&](std::vector<std::byte>& buffer) {
      visit_word(dtype_size(config_.type), [&](auto w) {
        using W = decltype(w);
        if constexpr (sizeof(W) == 2 || sizeof(W) == 4) {
          auto* p = reinterpret_cast<W*>(buffer.data());
          const std::uint64_t n = buffer.size() / sizeof(W);
          for (std::uint64_t j = rng_.geometric_gap(log1m) - 1; j < n;
               j += rng_.geometric_gap(log1m)) {
            const double v = word_to_double<W>(config_.type, p[j]);
            const W next = double_to_word<W>(config_.type, v * (1.0 + amplitude * rng_.normal()));
            changed += next != p[j];
            p[j] = next;
          }
        }
      });
    };
    for (auto& b : words_) step(b);  // a tied shard has no buffer of its own
    for (auto& task : residual_words_)
      for (auto& b : task) step(b);
    return changed;
  }

  /// Owner rank of every affine shard (dcr::assign_owners over its holders).
  [[nodiscard]] std::vector<std::uint32_t> owners() const {
    std::vector<shard_holding> h;
    for (const auto& s : shards_) h.push_back({s.task.shard_name, s.task.bytes(), s.holders});
    return assign_owners(h);
  }

  /// Owner rank of every residual task: dcr::assign_residual_owners, eligible ranks being every
  /// rank that holds one of its inputs (they gather the inputs to the owner).
  [[nodiscard]] std::vector<std::uint32_t> residual_owners() const {
    std::vector<residual_holding> h;
    for (const auto& r : residual_) {
      residual_holding rh{r.task.name, {}};
      for (const auto& holders : r.input_holders)
        rh.eligible.insert(rh.eligible.end(), holders.begin(), holders.end());
      h.push_back(std::move(rh));
    }
    return assign_residual_owners(h);
  }

  /// Writes the dense canonical tensors (the dense refit's input): every affine shard scattered
  /// through its mapping, every residual output built by its task's conversion from the
  /// trainer's words. out[id] must have registry.at(id).bytes() bytes.
  void assemble_canonical(std::span<const std::span<std::byte>> out) const {
    DCR_EXPECTS(out.size() == registry_->size(), errc::invalid_argument,
                "assemble_canonical: one output per canonical tensor expected");
    for (std::size_t id = 0; id < out.size(); ++id)
      DCR_EXPECTS(out[id].size() == static_cast<std::size_t>(
                                        registry_->at(static_cast<tensor_id>(id)).bytes()),
                  errc::shape_mismatch,
                  "assemble_canonical: output for '" + registry_->at(static_cast<tensor_id>(id)).name +
                      "' has the wrong size");
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      const auto& task = shards_[i].task;
      const std::size_t wb = dtype_size(task.type);
      const auto src = words(i);
      std::visit(
          [&](const auto& m) {
            const std::uint64_t n = m.local_size();
            for (std::uint64_t j = 0; j < n;) {
              const mapped_index d = m(j);
              const std::uint64_t run = m.run_length(j);
              std::memcpy(out[task.targets[d.part]].data() + d.index * wb, src.data() + j * wb,
                          run * wb);
              j += run;
            }
          },
          task.mapping);
    }
    std::vector<std::span<const std::byte>> inputs;
    for (std::size_t r = 0; r < residual_.size(); ++r) {
      inputs.assign(residual_words_[r].begin(), residual_words_[r].end());
      for (std::size_t o = 0; o < residual_[r].task.outputs.size(); ++o)
        residual_[r].task.convert(o, inputs, out[residual_[r].task.outputs[o].tensor]);
    }
  }

 private:
  std::size_t buffer_of(std::size_t shard) const {
    const std::size_t alias = shards_.at(shard).tied_to;
    return alias == trainer_shard::no_alias ? shard : alias;
  }

  void fill_initial(std::vector<std::byte>& buffer) {
    visit_word(dtype_size(config_.type), [&](auto w) {
      using W = decltype(w);
      if constexpr (sizeof(W) == 2 || sizeof(W) == 4) {
        auto* p = reinterpret_cast<W*>(buffer.data());
        const std::size_t n = buffer.size() / sizeof(W);
        for (std::size_t j = 0; j < n; ++j)
          p[j] = double_to_word<W>(config_.type, 0.02 * rng_.fast_normal());
      }
    });
  }

  moe_config config_;
  const tensor_registry* registry_;
  int tp_, dp_;
  trainer_layout layout_;
  rng rng_;
  std::vector<trainer_shard> shards_;
  std::vector<trainer_residual> residual_;
  task_coverage coverage_;
  std::vector<std::vector<std::byte>> words_;  // by affine shard; empty for a tied shard
  std::vector<std::vector<std::vector<std::byte>>> residual_words_;  // [task][input]
};

}  // namespace dcr::sim
