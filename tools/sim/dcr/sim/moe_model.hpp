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
//
// Synthetic values (synthetic_trainer): every source buffer's words are a pure function of the
// seed, the buffer's name, the step and the stress parameters of steps 1..step, never of other
// buffers. So separate processes can each hold only their part (trainer_selection: an owner its
// own shards), jump to a committed step (advance_to: a restarted owner), or compute one buffer or
// one canonical tensor at any step alone (shard_words_at, canonical_at: a receiver checking its
// storage against a dense refit), and all agree bit for bit with one trainer stepped in order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
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

/// The stress protocol's parameters of steps 1, 2, ...: per step a change rate (the probability
/// that an element is chosen) and an amplitude (a chosen element is multiplied by
/// 1 + amplitude * z, z ~ N(0,1)). Each is either one value for every step or one value per step
/// (index k - 1 for step k). A non-owning view: the spans (or vector) it was built from must
/// outlive it, so build it in the argument list or from storage that stays put.
class stress_schedule {
 public:
  static constexpr double default_amplitude = 0.01;

  /// `rate` and `amplitude` at every step (implicit, so a plain rate can be passed).
  stress_schedule(double rate, double amplitude = default_amplitude) noexcept  // NOLINT
      : rate_(rate), amplitude_(amplitude) {}
  /// rates[k - 1] at step k (only steps 1..rates.size() are covered), `amplitude` at every step.
  stress_schedule(std::span<const double> rates, double amplitude = default_amplitude) noexcept
      : rates_(rates), per_step_rate_(true), amplitude_(amplitude) {}
  /// As the span constructor; `rates` must outlive the schedule.
  stress_schedule(const std::vector<double>& rates, double amplitude = default_amplitude) noexcept
      : stress_schedule(std::span<const double>(rates), amplitude) {}
  /// rates[k - 1] and amplitudes[k - 1] at step k; the spans must have the same size.
  stress_schedule(std::span<const double> rates, std::span<const double> amplitudes)
      : rates_(rates), amplitudes_(amplitudes), per_step_rate_(true), per_step_amplitude_(true) {
    DCR_EXPECTS(rates.size() == amplitudes.size(), errc::invalid_argument,
                "stress_schedule: one amplitude per rate expected");
  }

  /// Whether every step 1..step has parameters (always true for step 0, the initial weights).
  [[nodiscard]] bool covers(std::uint64_t step) const noexcept {
    return (!per_step_rate_ || step <= rates_.size()) &&
           (!per_step_amplitude_ || step <= amplitudes_.size());
  }
  /// Change rate of step `step` (>= 1); throws errc::out_of_range for a step not covered.
  [[nodiscard]] double rate(std::uint64_t step) const {
    check(step);
    return per_step_rate_ ? rates_[step - 1] : rate_;
  }
  /// Amplitude of step `step` (>= 1); throws errc::out_of_range for a step not covered.
  [[nodiscard]] double amplitude(std::uint64_t step) const {
    check(step);
    return per_step_amplitude_ ? amplitudes_[step - 1] : amplitude_;
  }

 private:
  void check(std::uint64_t step) const {
    DCR_EXPECTS(step >= 1 && covers(step), errc::out_of_range,
                "stress_schedule: no parameters for step " + std::to_string(step));
  }
  std::span<const double> rates_, amplitudes_;
  bool per_step_rate_ = false, per_step_amplitude_ = false;
  double rate_ = 0, amplitude_ = default_amplitude;
};

/// Which source buffers a synthetic_trainer allocates and generates (partial materialization:
/// an owner process holds only what it owns). A null predicate selects everything of its kind.
/// Selecting a tied shard (trainer_shard::tied_to) materializes the buffer it reads, so words()
/// of its source shard then works as well.
struct trainer_selection {
  /// Whether affine shard `shard` is materialized; `owner` is owners()[shard].
  std::function<bool(std::size_t shard, std::uint32_t owner)> shard;
  /// Whether the inputs of residual task `task` are materialized (all of them or none);
  /// `owner` is residual_owners()[task].
  std::function<bool(std::size_t task, std::uint32_t owner)> residual_task;

  /// Every buffer (the default).
  static trainer_selection all() { return {}; }
  /// No buffer: a trainer used only for its layout and the random-access functions
  /// (synthetic_trainer::shard_words_at, canonical_at), e.g. in a receiver process.
  static trainer_selection none() {
    return {[](std::size_t, std::uint32_t) { return false; },
            [](std::size_t, std::uint32_t) { return false; }};
  }
  /// The buffers an owner process of rank `rank` needs: the affine shards whose owner is `rank`
  /// and the inputs of the residual tasks whose owner is `rank`.
  static trainer_selection owned_by(std::uint32_t rank) {
    return {[rank](std::size_t, std::uint32_t owner) { return owner == rank; },
            [rank](std::size_t, std::uint32_t owner) { return owner == rank; }};
  }
  /// Exactly the listed affine shards and residual tasks (indices into shards() / residual()).
  static trainer_selection only(std::vector<std::size_t> shards,
                                std::vector<std::size_t> residual_tasks) {
    auto has = [](const std::vector<std::size_t>& v, std::size_t i) {
      return std::find(v.begin(), v.end(), i) != v.end();
    };
    return {[has, v = std::move(shards)](std::size_t i, std::uint32_t) { return has(v, i); },
            [has, v = std::move(residual_tasks)](std::size_t i, std::uint32_t) {
              return has(v, i);
            }};
  }
};

/// The trainer's weights: one copy of every unique source shard (data-parallel replicas are
/// bitwise identical, so they share it; a tied lm_head task reads the embedding's words), with
/// synthetic initial values and stress-protocol updates.
///
/// Every buffer's words are a pure function of (seed, buffer name, step, the rates and amplitudes
/// of steps 1..step), so any process can compute any part of the model alone: a buffer (an affine
/// shard with words of its own, or one residual input) has the key name_key(its shard or input
/// name), and its words are cut into blocks of block_words words. Block b of the initial weights
/// is drawn from rng(derive_seed(seed, {key, 0, b})): word j = round(0.02 * fast_normal()). Step
/// s >= 1 walks block b with rng(derive_seed(seed, {key, s, b})): the chosen elements (each with
/// probability rate(s), by geometric gaps from the block start) are multiplied by
/// (1 + amplitude(s) * normal()) and rounded to the dtype (ties to even). Words written through
/// mutable_words() take part in later steps like any others, but the random-access functions
/// (shard_words_at, residual_words_at, canonical_at) know nothing of them. Those const functions
/// touch no state, so threads may call them concurrently.
class synthetic_trainer {
 public:
  /// Words per generation block (part of the definition of the synthetic values above).
  static constexpr std::uint64_t block_words = 4096;

  /// The model `config` laid out by make_trainer_tasks(config, registry, tp, dp, layout) at step
  /// 0, with the buffers `selection` picks allocated and holding their initial words. `registry`
  /// must outlive the trainer. Throws errc::invalid_argument for a dtype other than bf16, f16
  /// and f32.
  synthetic_trainer(const moe_config& config, const tensor_registry& registry, int tp, int dp,
                    std::uint64_t seed, trainer_layout layout = trainer_layout::megatron,
                    const trainer_selection& selection = trainer_selection::all())
      : config_(config), registry_(&registry), tp_(tp), dp_(dp), layout_(layout), seed_(seed) {
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

    // Which buffers this trainer holds.
    shard_present_.assign(shards_.size(), selection.shard == nullptr);
    residual_present_.assign(residual_.size(), selection.residual_task == nullptr);
    if (selection.shard) {
      const auto owner = owners();
      for (std::size_t i = 0; i < shards_.size(); ++i)
        if (selection.shard(i, owner[i])) shard_present_[buffer_of(i)] = true;
    }
    if (selection.residual_task) {
      const auto owner = residual_owners();
      for (std::size_t r = 0; r < residual_.size(); ++r)
        residual_present_[r] = selection.residual_task(r, owner[r]);
    }

    shard_keys_.resize(shards_.size());
    words_.resize(shards_.size());
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      shard_keys_[i] = name_key(shards_[i].task.shard_name);
      if (shards_[i].tied_to != trainer_shard::no_alias) continue;
      if (!shard_present_[i]) continue;
      words_[i].resize(shards_[i].task.bytes());
      generate(shard_keys_[i], 0, words_[i], 0, stress_schedule(0.0));
    }
    input_keys_.resize(residual_.size());
    residual_words_.resize(residual_.size());
    for (std::size_t r = 0; r < residual_.size(); ++r)
      for (const auto& in : residual_[r].task.inputs) {
        input_keys_[r].push_back(name_key(in.name));
        residual_words_[r].emplace_back();
        if (!residual_present_[r]) continue;
        residual_words_[r].back().resize(in.bytes());
        generate(input_keys_[r].back(), 0, residual_words_[r].back(), 0, stress_schedule(0.0));
      }

    // What contributes to each canonical tensor: local ranges of affine shards (one per target
    // tensor of a shard, spanning the parts that land in it) and residual outputs.
    contributions_.resize(registry.size());
    residual_sources_.resize(registry.size());
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      const auto& task = shards_[i].task;
      std::vector<std::uint64_t> lo(task.targets.size(), ~std::uint64_t{0});
      std::vector<std::uint64_t> hi(task.targets.size(), 0);
      std::visit(
          [&](const auto& m) {
            const std::uint64_t n = m.local_size();
            for (std::uint64_t j = 0; j < n;) {
              const std::uint64_t run = m.run_length(j);
              const auto t = static_cast<std::size_t>(
                  std::find(task.targets.begin(), task.targets.end(), task.targets[m(j).part]) -
                  task.targets.begin());  // the first part of the same tensor
              lo[t] = std::min(lo[t], j);
              hi[t] = std::max(hi[t], j + run);
              j += run;
            }
          },
          task.mapping);
      for (std::size_t t = 0; t < task.targets.size(); ++t)
        if (lo[t] < hi[t]) contributions_[task.targets[t]].push_back({i, lo[t], hi[t]});
    }
    for (std::size_t r = 0; r < residual_.size(); ++r)
      for (std::size_t o = 0; o < residual_[r].task.outputs.size(); ++o)
        residual_sources_[residual_[r].task.outputs[o].tensor].push_back({r, o});
  }

  [[nodiscard]] const moe_config& config() const noexcept { return config_; }
  [[nodiscard]] int tp() const noexcept { return tp_; }
  [[nodiscard]] int dp() const noexcept { return dp_; }
  [[nodiscard]] trainer_layout layout() const noexcept { return layout_; }
  /// The seed every buffer's words derive from (see the class comment).
  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }
  /// The affine shards.
  [[nodiscard]] std::span<const trainer_shard> shards() const noexcept { return shards_; }
  /// The residual tasks.
  [[nodiscard]] std::span<const trainer_residual> residual() const noexcept { return residual_; }
  /// Checkpoint bytes covered by affine vs residual tasks (dcr::measure_coverage).
  [[nodiscard]] const task_coverage& coverage() const noexcept { return coverage_; }

  /// Whether this trainer holds the words of affine shard `shard` (its source's, for a tied one).
  [[nodiscard]] bool materialized(std::size_t shard) const {
    return shard_present_[buffer_of(shard)];
  }
  /// Whether this trainer holds the inputs of residual task `task`.
  [[nodiscard]] bool residual_materialized(std::size_t task) const {
    return residual_present_.at(task);
  }

  /// Words of affine shard `shard` at step() (a tied shard's are its source's). Throws
  /// errc::not_ready, naming the shard, when the trainer does not hold them (trainer_selection).
  [[nodiscard]] std::span<const std::byte> words(std::size_t shard) const {
    return words_[present_buffer(shard)];
  }
  [[nodiscard]] std::span<std::byte> mutable_words(std::size_t shard) {
    return words_[present_buffer(shard)];
  }
  /// Words of input `input` of residual task `task` at step(). Throws errc::not_ready, naming
  /// the task, when the trainer does not hold them.
  [[nodiscard]] std::span<const std::byte> residual_words(std::size_t task,
                                                          std::size_t input) const {
    return residual_words_[present_task(task)].at(input);
  }
  [[nodiscard]] std::span<std::byte> mutable_residual_words(std::size_t task, std::size_t input) {
    return residual_words_[present_task(task)].at(input);
  }

  /// The step the held words are at: 0 after construction, +1 per stress_step.
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  /// The change rate and amplitude of every step so far (index k - 1 for step k).
  [[nodiscard]] std::span<const double> rates() const noexcept { return rates_; }
  [[nodiscard]] std::span<const double> amplitudes() const noexcept { return amplitudes_; }
  /// The schedule of steps 1..step() so far; a view of rates() and amplitudes(), valid until the
  /// next stress_step or advance_to.
  [[nodiscard]] stress_schedule schedule() const { return {rates_, amplitudes_}; }

  /// Step step() + 1 of the paper's stress protocol over every held source buffer (affine shards
  /// and residual inputs): each element is chosen with probability `rate`, multiplied by
  /// (1 + amplitude z) with z ~ N(0,1), and rounded to the dtype (ties to even); see the class
  /// comment for which random numbers. Records the rate and amplitude (schedule()). Returns how
  /// many held words changed (a product can round back to the old word).
  std::uint64_t stress_step(double rate, double amplitude = stress_schedule::default_amplitude) {
    const std::uint64_t step = step_ + 1;
    std::uint64_t changed = 0;
    for (std::size_t i = 0; i < shards_.size(); ++i)  // a tied shard has no buffer of its own
      if (shards_[i].tied_to == trainer_shard::no_alias && shard_present_[i])
        changed += apply_changes(shard_keys_[i], step, rate, amplitude, 0, words_[i]);
    for (std::size_t r = 0; r < residual_.size(); ++r)
      if (residual_present_[r])
        for (std::size_t k = 0; k < residual_words_[r].size(); ++k)
          changed +=
              apply_changes(input_keys_[r][k], step, rate, amplitude, 0, residual_words_[r][k]);
    step_ = step;
    rates_.push_back(rate);
    amplitudes_.push_back(amplitude);
    return changed;
  }

  /// Regenerates every held buffer at step `step` of `schedule` (earlier or later than step():
  /// the words are recomputed from the initial ones, discarding any mutable_words() edits), in
  /// place (spans from words() stay valid); then step() == step and schedule() has the
  /// schedule's parameters of steps 1..step. For an owner process restarted at committed version
  /// `step`. Throws errc::out_of_range, changing nothing, when `schedule` does not cover `step`.
  void advance_to(std::uint64_t step, const stress_schedule& schedule) {
    DCR_EXPECTS(schedule.covers(step), errc::out_of_range,
                "synthetic_trainer::advance_to: the schedule has no parameters for step " +
                    std::to_string(step));
    std::vector<double> rates, amplitudes;
    for (std::uint64_t k = 1; k <= step; ++k) {
      rates.push_back(schedule.rate(k));
      amplitudes.push_back(schedule.amplitude(k));
    }
    for (std::size_t i = 0; i < shards_.size(); ++i)
      if (shards_[i].tied_to == trainer_shard::no_alias && shard_present_[i])
        generate(shard_keys_[i], 0, words_[i], step, schedule);
    for (std::size_t r = 0; r < residual_.size(); ++r)
      if (residual_present_[r])
        for (std::size_t k = 0; k < residual_words_[r].size(); ++k)
          generate(input_keys_[r][k], 0, residual_words_[r][k], step, schedule);
    step_ = step;
    rates_ = std::move(rates);
    amplitudes_ = std::move(amplitudes);
  }

  /// Writes words [first_word, first_word + out.size() / word size) of affine shard `shard` (a
  /// tied shard's: its source's) at step `step` of `schedule` into `out`: what a full trainer
  /// stepped with those parameters holds, whatever this trainer holds (a pure function; no
  /// alignment needed). Throws errc::out_of_range when the range is outside the shard or
  /// `schedule` does not cover `step`, errc::invalid_argument when out.size() is not a multiple
  /// of the word size.
  void shard_words_at(std::size_t shard, std::uint64_t step, const stress_schedule& schedule,
                      std::span<std::byte> out, std::uint64_t first_word = 0) const {
    const std::size_t b = buffer_of(shard);
    check_range(shards_[b].task.bytes(), first_word, out, shards_[shard].task.shard_name);
    check_schedule(step, schedule);
    generate(shard_keys_[b], first_word, out, step, schedule);
  }

  /// Like shard_words_at, for input `input` of residual task `task`.
  void residual_words_at(std::size_t task, std::size_t input, std::uint64_t step,
                         const stress_schedule& schedule, std::span<std::byte> out,
                         std::uint64_t first_word = 0) const {
    const auto& in = residual_.at(task).task.inputs.at(input);
    check_range(in.bytes(), first_word, out, in.name);
    check_schedule(step, schedule);
    generate(input_keys_[task][input], first_word, out, step, schedule);
  }

  /// Scratch bytes canonical_at(id, ...) needs: one block of words when affine shards target
  /// the tensor, and the inputs of a residual output that builds it (the inputs it depends on),
  /// whichever is larger.
  [[nodiscard]] std::uint64_t canonical_scratch_bytes(tensor_id id) const {
    const std::uint64_t wb = dtype_size(config_.type);
    std::uint64_t bytes = 0;
    for (const auto& c : contributions_.at(id))
      bytes = std::max(bytes, std::min(block_words, c.hi - c.lo) * wb);
    for (const auto& [r, o] : residual_sources_.at(id)) {
      const auto& task = residual_[r].task;
      std::uint64_t sum = 0;
      for (std::size_t k = 0; k < task.inputs.size(); ++k)
        if (task.depends(o, k)) sum += task.inputs[k].bytes();
      bytes = std::max(bytes, sum);
    }
    return bytes;
  }

  /// Writes canonical tensor `id` at step `step` of `schedule` into `out` (registry.at(id).bytes()
  /// bytes): the words of the affine shards targeting it, scattered through their mappings as
  /// assemble_canonical does, then the residual outputs building it, converted from their inputs
  /// at that step; bit-equal to assemble_canonical of a full trainer at that step without
  /// mutable_words() edits. Works whatever this trainer holds (a pure function). `scratch` must
  /// have at least canonical_scratch_bytes(id) bytes; no allocation besides the residual input
  /// list. Throws errc::out_of_range for an unknown id or a step `schedule` does not cover,
  /// errc::shape_mismatch for a wrong `out` size, errc::invalid_argument for too little scratch.
  void canonical_at(tensor_id id, std::uint64_t step, const stress_schedule& schedule,
                    std::span<std::byte> out, std::span<std::byte> scratch) const {
    DCR_EXPECTS(id < registry_->size(), errc::out_of_range,
                "synthetic_trainer::canonical_at: unknown tensor id " + std::to_string(id));
    const auto& tensor = registry_->at(id);
    DCR_EXPECTS(out.size() == static_cast<std::size_t>(tensor.bytes()), errc::shape_mismatch,
                "synthetic_trainer::canonical_at: output for '" + tensor.name +
                    "' has the wrong size");
    DCR_EXPECTS(scratch.size() >= canonical_scratch_bytes(id), errc::invalid_argument,
                "synthetic_trainer::canonical_at: scratch for '" + tensor.name +
                    "' is smaller than canonical_scratch_bytes");
    check_schedule(step, schedule);
    const std::size_t wb = dtype_size(config_.type);
    for (const auto& c : contributions_[id]) {
      const auto& task = shards_[c.shard].task;
      const std::uint64_t key = shard_keys_[buffer_of(c.shard)];
      std::visit(
          [&](const auto& m) {
            for (std::uint64_t c0 = c.lo, c1; c0 < c.hi; c0 = c1) {  // one block at a time
              c1 = std::min(c.hi, (c0 / block_words + 1) * block_words);
              const auto chunk = scratch.first(static_cast<std::size_t>(c1 - c0) * wb);
              generate(key, c0, chunk, step, schedule);
              for (std::uint64_t j = c0; j < c1;) {
                const mapped_index d = m(j);
                const std::uint64_t run = std::min(m.run_length(j), c1 - j);
                if (task.targets[d.part] == id)
                  std::memcpy(out.data() + d.index * wb, chunk.data() + (j - c0) * wb, run * wb);
                j += run;
              }
            }
          },
          task.mapping);
    }
    std::vector<std::span<const std::byte>> inputs;
    for (const auto& [r, o] : residual_sources_[id]) {
      const auto& task = residual_[r].task;
      inputs.assign(task.inputs.size(), {});
      std::size_t offset = 0;
      for (std::size_t k = 0; k < task.inputs.size(); ++k) {
        if (!task.depends(o, k)) continue;  // the conversion must not read it
        const auto in = scratch.subspan(offset, static_cast<std::size_t>(task.inputs[k].bytes()));
        generate(input_keys_[r][k], 0, in, step, schedule);
        inputs[k] = in;
        offset += in.size();
      }
      task.convert(o, inputs, out);
    }
  }

  /// canonical_at with scratch it allocates.
  void canonical_at(tensor_id id, std::uint64_t step, const stress_schedule& schedule,
                    std::span<std::byte> out) const {
    std::vector<std::byte> scratch(static_cast<std::size_t>(canonical_scratch_bytes(id)));
    canonical_at(id, step, schedule, out, scratch);
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

  /// Writes the dense canonical tensors (the dense refit's input) from the held words: every
  /// affine shard scattered through its mapping, every residual output built by its task's
  /// conversion. out[id] must have registry.at(id).bytes() bytes. Needs every buffer (throws
  /// errc::not_ready otherwise); a partial trainer uses canonical_at tensor by tensor.
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
      present_task(r);
      inputs.assign(residual_words_[r].begin(), residual_words_[r].end());
      for (std::size_t o = 0; o < residual_[r].task.outputs.size(); ++o)
        residual_[r].task.convert(o, inputs, out[residual_[r].task.outputs[o].tensor]);
    }
  }

 private:
  /// A local range [lo, hi) of affine shard `shard` whose parts land in one canonical tensor.
  struct contribution {
    std::size_t shard;
    std::uint64_t lo, hi;
  };
  struct residual_source {
    std::size_t task, output;
  };

  std::size_t buffer_of(std::size_t shard) const {
    const std::size_t alias = shards_.at(shard).tied_to;
    return alias == trainer_shard::no_alias ? shard : alias;
  }
  std::size_t present_buffer(std::size_t shard) const {
    const std::size_t b = buffer_of(shard);
    DCR_EXPECTS(shard_present_[b], errc::not_ready,
                "synthetic_trainer: shard '" + shards_[shard].task.shard_name +
                    "' is not materialized in this trainer (trainer_selection)");
    return b;
  }
  std::size_t present_task(std::size_t task) const {
    DCR_EXPECTS(residual_present_.at(task), errc::not_ready,
                "synthetic_trainer: the inputs of residual task '" + residual_[task].task.name +
                    "' are not materialized in this trainer (trainer_selection)");
    return task;
  }
  void check_range(std::uint64_t buffer_bytes, std::uint64_t first_word,
                   std::span<const std::byte> out, const std::string& name) const {
    const std::uint64_t wb = dtype_size(config_.type);
    DCR_EXPECTS(out.size() % wb == 0, errc::invalid_argument,
                "synthetic_trainer: output for '" + name + "' is not a whole number of words");
    const std::uint64_t n = buffer_bytes / wb;
    DCR_EXPECTS(first_word <= n && out.size() / wb <= n - first_word, errc::out_of_range,
                "synthetic_trainer: words [" + std::to_string(first_word) + ", " +
                    std::to_string(first_word + out.size() / wb) + ") are outside '" + name +
                    "' (" + std::to_string(n) + " words)");
  }
  static void check_schedule(std::uint64_t step, const stress_schedule& schedule) {
    DCR_EXPECTS(schedule.covers(step), errc::out_of_range,
                "synthetic_trainer: the schedule has no parameters for step " +
                    std::to_string(step));
  }

  template <class F>
  void with_word(F&& f) const {
    visit_word(dtype_size(config_.type), [&](auto w) {
      using W = decltype(w);
      if constexpr (sizeof(W) == 2 || sizeof(W) == 4) f(w);
    });
  }

  /// Words [first, first + out.size() / word) of the buffer keyed `key` at step `step`.
  void generate(std::uint64_t key, std::uint64_t first, std::span<std::byte> out,
                std::uint64_t step, const stress_schedule& schedule) const {
    initial_words(key, first, out);
    for (std::uint64_t k = 1; k <= step; ++k)
      apply_changes(key, k, schedule.rate(k), schedule.amplitude(k), first, out);
  }

  /// Initial words [first, ...) of the buffer keyed `key` (see the class comment).
  void initial_words(std::uint64_t key, std::uint64_t first, std::span<std::byte> out) const {
    with_word([&](auto w) {
      using W = decltype(w);
      const std::uint64_t end = first + out.size() / sizeof(W);
      for (std::uint64_t j = first; j < end;) {
        const std::uint64_t b = j / block_words;
        const std::uint64_t stop = std::min(end, (b + 1) * block_words);
        rng g(derive_seed(seed_, {key, 0, b}));
        for (std::uint64_t k = b * block_words; k < j; ++k) g.next();  // one draw per word
        for (; j < stop; ++j) {
          const W v = double_to_word<W>(config_.type, 0.02 * g.fast_normal());
          std::memcpy(out.data() + (j - first) * sizeof(W), &v, sizeof(W));
        }
      }
    });
  }

  /// Applies step `step` (rate, amplitude) to words [first, ...) of the buffer keyed `key`
  /// (see the class comment); returns how many words changed.
  std::uint64_t apply_changes(std::uint64_t key, std::uint64_t step, double rate,
                              double amplitude, std::uint64_t first,
                              std::span<std::byte> out) const {
    if (!(rate > 0)) return 0;
    const double log1m = rate >= 1 ? -INFINITY : std::log1p(-rate);
    std::uint64_t changed = 0;
    with_word([&](auto w) {
      using W = decltype(w);
      const std::uint64_t end = first + out.size() / sizeof(W);
      for (std::uint64_t b = first / block_words; b * block_words < end; ++b) {
        rng g(derive_seed(seed_, {key, step, b}));
        const std::uint64_t stop = std::min(end, (b + 1) * block_words);
        for (std::uint64_t j = b * block_words;; ++j) {  // j: first element not yet decided
          const std::uint64_t gap = g.geometric_gap(log1m);
          if (gap - 1 >= stop - j) break;
          j += gap - 1;  // the chosen element
          const double z = g.normal();
          if (j < first) continue;
          std::byte* p = out.data() + (j - first) * sizeof(W);
          W old;
          std::memcpy(&old, p, sizeof(W));
          const double v = word_to_double<W>(config_.type, old);
          const W next = double_to_word<W>(config_.type, v * (1.0 + amplitude * z));
          changed += next != old;
          std::memcpy(p, &next, sizeof(W));
        }
      }
    });
    return changed;
  }

  moe_config config_;
  const tensor_registry* registry_;
  int tp_, dp_;
  trainer_layout layout_;
  std::uint64_t seed_;
  std::vector<trainer_shard> shards_;
  std::vector<trainer_residual> residual_;
  task_coverage coverage_;
  std::vector<bool> shard_present_;     // by affine shard: its buffer is held (untied ones)
  std::vector<bool> residual_present_;  // by residual task
  std::vector<std::uint64_t> shard_keys_;               // name_key of each shard name
  std::vector<std::vector<std::uint64_t>> input_keys_;  // [task][input]
  std::vector<std::vector<std::byte>> words_;  // by affine shard; empty for a tied or absent one
  std::vector<std::vector<std::vector<std::byte>>> residual_words_;  // [task][input]
  std::uint64_t step_ = 0;
  std::vector<double> rates_, amplitudes_;  // of steps 1..step_
  std::vector<std::vector<contribution>> contributions_;  // by canonical tensor id
  std::vector<std::vector<residual_source>> residual_sources_;  // by canonical tensor id
};

}  // namespace dcr::sim
