// dcr/sim/moe_engine.hpp: a serving engine's storage and native loader for the synthetic MoE
// model, written the way an inference engine (vLLM-style) lays out weights for tensor parallel
// rank `rank` of `world`:
//   qkv_proj      [ (q + k + v rows) / world, hidden ]  fused q/k/v, column parallel
//   o_proj        [ hidden, hidden / world ]            row parallel (canonical columns split)
//   gate_up_proj  [ 2 * ffn / world, hidden ]           fused gate/up (layer 0)
//   down_proj     [ hidden, ffn / world ]               row parallel (layer 0)
//   w13           [ E_local, 2 * expert_ffn, hidden ]   this rank's experts, gate and up fused
//   w2            [ E_local, hidden, expert_ffn ]       this rank's experts (others skipped)
//   embed/lm_head [ vocab / world, hidden ]             vocab parallel
//   norms, router                                       replicated
// The loader knows nothing of dcr's deltas: it receives one canonical tensor, slices it with
// views and hands every final storage copy to the sink, exactly as for a dense load.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/apply/loader.hpp"
#include "dcr/canonical.hpp"
#include "dcr/mapping/concept.hpp"
#include "dcr/sim/moe_model.hpp"
#include "dcr/tensor_view.hpp"

namespace dcr::sim {

/// One engine parameter: shape and bytes.
struct engine_param {
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};

/// The rank-local storage of one serving rank.
class moe_engine_storage {
 public:
  moe_engine_storage(const moe_config& c, int world, int rank) : config_(c), world_(world), rank_(rank) {
    DCR_EXPECTS(world >= 1 && rank >= 0 && rank < world, errc::invalid_argument,
                "moe_engine_storage: rank outside [0, world)");
    auto rows = [&](std::int64_t n) { return balanced_split(n, world, rank).size(); };
    add("embed", {rows(c.vocab), c.hidden});
    add("lm_head", {rows(c.vocab), c.hidden});
    add("norm", {c.hidden});
    for (std::int64_t l = 0; l < c.layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      add(p + "input_norm", {c.hidden});
      add(p + "post_norm", {c.hidden});
      add(p + "qkv_proj", {rows(c.hidden) + 2 * rows(c.kv_dim), c.hidden});
      add(p + "o_proj", {c.hidden, rows(c.hidden)});
      if (l == 0) {
        add(p + "gate_up_proj", {2 * rows(c.dense_ffn), c.hidden});
        add(p + "down_proj", {c.hidden, rows(c.dense_ffn)});
        continue;
      }
      add(p + "router", {c.experts, c.hidden});
      const auto local = rows(c.experts);
      add(p + "w13", {local, 2 * c.expert_ffn, c.hidden});
      add(p + "w2", {local, c.hidden, c.expert_ffn});
    }
  }

  [[nodiscard]] const moe_config& config() const noexcept { return config_; }
  [[nodiscard]] int world() const noexcept { return world_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] const std::map<std::string, engine_param>& params() const noexcept { return params_; }

  /// A mutable view of a parameter's words.
  template <storage_word W>
  tensor_view<W> view(const std::string& name) {
    auto it = params_.find(name);
    DCR_EXPECTS(it != params_.end(), errc::unknown_tensor, "engine: no parameter '" + name + "'");
    return tensor_view<W>::contiguous(reinterpret_cast<W*>(it->second.bytes.data()),
                                      it->second.shape);
  }

  /// Sets every stored word to zero (fresh storage for a dense reference load).
  void zero() {
    for (auto& [name, p] : params_) std::fill(p.bytes.begin(), p.bytes.end(), std::byte{0});
  }

  /// Total bytes of rank-local storage.
  [[nodiscard]] std::uint64_t bytes() const {
    std::uint64_t b = 0;
    for (const auto& [n, p] : params_) b += p.bytes.size();
    return b;
  }

  /// Name of the first parameter whose bytes differ from `other`'s, or "" when all are equal.
  [[nodiscard]] std::string first_difference(const moe_engine_storage& other) const {
    for (const auto& [name, p] : params_) {
      auto it = other.params_.find(name);
      if (it == other.params_.end() || it->second.bytes != p.bytes) return name;
    }
    return other.params_.size() == params_.size() ? "" : "<parameter set>";
  }

 private:
  void add(const std::string& name, std::vector<std::int64_t> shape) {
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    engine_param p;
    p.shape = std::move(shape);
    p.bytes.assign(static_cast<std::size_t>(n) * dtype_size(config_.type), std::byte{0});
    params_.emplace(name, std::move(p));
  }

  moe_config config_;
  int world_, rank_;
  std::map<std::string, engine_param> params_;
};

/// The engine's native loader for one rank: canonical tensor in, final storage copies out.
class moe_engine_loader {
 public:
  using loader_concept = dcr::loader_tag;

  explicit moe_engine_loader(moe_engine_storage& storage) : storage_(&storage) {}

  template <storage_word W, class Sink>
  void load(const canonical_tensor& t, tensor_view<const W> src, Sink& sink) {
    const auto& c = storage_->config();
    const int world = storage_->world();
    const int rank = storage_->rank();
    auto rows = [&](std::int64_t n) { return balanced_split(n, world, rank); };
    const std::string_view name = t.name;
    auto view = [&](const std::string& p) { return storage_->template view<W>(p); };

    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      const auto r = rows(c.vocab);
      sink.copy(view(name == "lm_head.weight" ? "lm_head" : "embed"), src.slice(0, r.begin, r.size()));
      return;
    }
    if (name == "model.norm.weight") {
      sink.copy(view("norm"), src);
      return;
    }
    // "model.layers.<l>.<rest>"
    constexpr std::string_view prefix = "model.layers.";
    DCR_EXPECTS(name.starts_with(prefix), errc::unknown_tensor,
                "moe_engine_loader: unexpected tensor '" + t.name + "'");
    const auto dot = name.find('.', prefix.size());
    const std::string layer(name.substr(prefix.size(), dot - prefix.size()));
    const std::string_view rest = name.substr(dot + 1);
    const std::string p = "layers." + layer + ".";

    if (rest == "input_layernorm.weight") return sink.copy(view(p + "input_norm"), src);
    if (rest == "post_attention_layernorm.weight") return sink.copy(view(p + "post_norm"), src);
    if (rest == "mlp.gate.weight") return sink.copy(view(p + "router"), src);
    if (rest == "self_attn.q_proj.weight" || rest == "self_attn.k_proj.weight" ||
        rest == "self_attn.v_proj.weight") {
      const auto q = rows(c.hidden), kv = rows(c.kv_dim);
      std::int64_t offset = 0, count = q.size(), first = q.begin;
      if (rest != "self_attn.q_proj.weight") {
        offset = q.size() + (rest == "self_attn.v_proj.weight" ? kv.size() : 0);
        count = kv.size();
        first = kv.begin;
      }
      return sink.copy(view(p + "qkv_proj").slice(0, offset, count), src.slice(0, first, count));
    }
    if (rest == "self_attn.o_proj.weight") {
      const auto cols = rows(c.hidden);
      return sink.copy(view(p + "o_proj"), src.slice(1, cols.begin, cols.size()));
    }
    if (rest == "mlp.gate_proj.weight" || rest == "mlp.up_proj.weight") {
      const auto f = rows(c.dense_ffn);
      const std::int64_t offset = rest == "mlp.up_proj.weight" ? f.size() : 0;
      return sink.copy(view(p + "gate_up_proj").slice(0, offset, f.size()),
                       src.slice(0, f.begin, f.size()));
    }
    if (rest == "mlp.down_proj.weight") {
      const auto f = rows(c.dense_ffn);
      return sink.copy(view(p + "down_proj"), src.slice(1, f.begin, f.size()));
    }
    constexpr std::string_view experts = "mlp.experts.";
    if (rest.starts_with(experts)) {
      const auto edot = rest.find('.', experts.size());
      const std::int64_t e = std::stoll(std::string(rest.substr(experts.size(), edot - experts.size())));
      const std::string_view proj = rest.substr(edot + 1);
      const auto mine = rows(c.experts);
      if (e < mine.begin || e >= mine.end) return sink.skip(t);  // another rank's expert
      const std::int64_t local = e - mine.begin;
      if (proj == "down_proj.weight") return sink.copy(view(p + "w2").select(0, local), src);
      const std::int64_t offset = proj == "up_proj.weight" ? c.expert_ffn : 0;
      return sink.copy(view(p + "w13").select(0, local).slice(0, offset, c.expert_ffn), src);
    }
    throw error(errc::unknown_tensor, "moe_engine_loader: unexpected tensor '" + t.name + "'");
  }

 private:
  moe_engine_storage* storage_;
};

}  // namespace dcr::sim
