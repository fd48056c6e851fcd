// dcr/sim/moe_engine.hpp: a serving engine's storage and native loader for the synthetic MoE
// model, written the way an inference engine (vLLM-style) lays out weights for tensor parallel
// rank `rank` of `world`. The loader knows nothing of dcr's deltas: it receives one canonical
// tensor, slices it with views and hands every final storage copy to the sink, exactly as for a
// dense load.
//
// engine_layout::serving (the default):
//   embed, lm_head   [ pad64(vocab / world), hidden ]  vocab parallel; each rank's rows padded up
//                                                      to a multiple of 64 (padding rows are
//                                                      never written by the loader)
//                    tied embeddings: embedding_tie::omit_lm_head -> lm_head storage loaded from
//                    model.embed_tokens.weight (one canonical tensor, two destinations);
//                    embedding_tie::store_both -> ONE storage for both, and the loader writes
//                    both tensors into it (dcr makes them overwrite-only at prewarm)
//   norm, *_norm     [ hidden ]                         replicated, plus a copy `*.cast` in
//                                                      another float dtype through
//                                                      element_transform::cast: fp32 for bf16/f16
//                                                      models, bf16 for f32 models
//                                                      (overwrite-only tensors)
//   qkv_proj         [ (q + k + v rows) / world, hidden ] fused q/k/v, column parallel
//   o_proj           [ hidden, hidden / world ]         row parallel (canonical columns split)
//   gate_up_proj     [ 2 * ffn / world, hidden ]        fused gate/up (layer 0)
//   down_proj        [ hidden, ffn / world ]            row parallel (layer 0)
//   router_t         [ hidden, experts ]                the router stored transposed
//   w13              [ E_local, 2 * expert_ffn, hidden ] this rank's experts, gate and up fused
//   w2               [ E_local, hidden, expert_ffn ]    this rank's experts (others skipped)
// engine_layout::plain: the same without padding, cast copies or the transposed router; lm_head
//   gets its own storage when the checkpoint has one, and a tied model without lm_head keeps
//   only the embedding (the engine reuses it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/apply/loader.hpp"
#include "dcr/apply/transform.hpp"
#include "dcr/canonical.hpp"
#include "dcr/mapping/concept.hpp"
#include "dcr/sim/moe_model.hpp"
#include "dcr/tensor_view.hpp"

namespace dcr::sim {

/// A serving rank's storage layout (see the file comment).
enum class engine_layout : std::uint8_t {
  serving,  ///< padded vocab, tied storage, fp32/bf16 norm copies, transposed router (default)
  plain,    ///< every canonical element stored once, bit for bit, no padding
};

/// "serving" or "plain".
inline const char* layout_name(engine_layout l) noexcept {
  return l == engine_layout::serving ? "serving" : "plain";
}

/// The dtype of the serving layout's cast copy of a norm of the model's dtype.
inline dtype norm_copy_type(dtype model) noexcept {
  return model == dtype::f32 ? dtype::bf16 : dtype::f32;
}

/// Rows of vocab-parallel storage for `rows` vocabulary rows: rounded up to a multiple of 64.
inline std::int64_t padded_vocab_rows(std::int64_t rows) noexcept { return (rows + 63) / 64 * 64; }

/// One engine parameter: shape, word dtype, bytes, and which leading rows are padding.
struct engine_param {
  std::vector<std::int64_t> shape;
  dtype type = dtype::bf16;
  std::vector<std::byte> bytes;
  std::int64_t valid_rows = 0;  ///< rows [valid_rows, shape[0]) are padding (none: shape[0])
};

/// The rank-local storage of one serving rank. Fresh storage holds `sentinel` in every byte (an
/// engine allocates uninitialized memory; a fixed pattern makes unwritten bytes comparable).
class moe_engine_storage {
 public:
  static constexpr std::byte sentinel{0xA5};

  moe_engine_storage(const moe_config& c, int world, int rank,
                     engine_layout layout = engine_layout::serving)
      : config_(c), world_(world), rank_(rank), layout_(layout) {
    DCR_EXPECTS(world >= 1 && rank >= 0 && rank < world, errc::invalid_argument,
                "moe_engine_storage: rank outside [0, world)");
    const bool serving = layout == engine_layout::serving;
    auto rows = [&](std::int64_t n) { return balanced_split(n, world, rank).size(); };
    const std::int64_t vocab_rows = rows(c.vocab);
    const std::int64_t vocab_storage = serving ? padded_vocab_rows(vocab_rows) : vocab_rows;
    add("embed", {vocab_storage, c.hidden}, c.type, vocab_rows);
    if (has_own_lm_head_storage()) add("lm_head", {vocab_storage, c.hidden}, c.type, vocab_rows);
    auto add_norm = [&](const std::string& name) {
      add(name, {c.hidden}, c.type);
      if (serving) add(name + ".cast", {c.hidden}, norm_copy_type(c.type));
    };
    add_norm("norm");
    for (std::int64_t l = 0; l < c.layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      add_norm(p + "input_norm");
      add_norm(p + "post_norm");
      add(p + "qkv_proj", {rows(c.hidden) + 2 * rows(c.kv_dim), c.hidden}, c.type);
      add(p + "o_proj", {c.hidden, rows(c.hidden)}, c.type);
      if (l == 0) {
        add(p + "gate_up_proj", {2 * rows(c.dense_ffn), c.hidden}, c.type);
        add(p + "down_proj", {c.hidden, rows(c.dense_ffn)}, c.type);
        continue;
      }
      if (serving)
        add(p + "router_t", {c.hidden, c.experts}, c.type);
      else
        add(p + "router", {c.experts, c.hidden}, c.type);
      const auto local = rows(c.experts);
      add(p + "w13", {local, 2 * c.expert_ffn, c.hidden}, c.type);
      add(p + "w2", {local, c.hidden, c.expert_ffn}, c.type);
    }
  }

  [[nodiscard]] const moe_config& config() const noexcept { return config_; }
  [[nodiscard]] int world() const noexcept { return world_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] engine_layout layout() const noexcept { return layout_; }
  [[nodiscard]] const std::map<std::string, engine_param>& params() const noexcept { return params_; }

  /// Whether lm_head has storage of its own: untied models, and the plain layout of a checkpoint
  /// that stores both tied tensors. (Serving + store_both shares the embedding's storage;
  /// plain + omit_lm_head reuses the embedding.)
  [[nodiscard]] bool has_own_lm_head_storage() const noexcept {
    switch (config_.tie_embeddings) {
      case embedding_tie::none: return true;
      case embedding_tie::omit_lm_head: return layout_ == engine_layout::serving;
      case embedding_tie::store_both: return layout_ == engine_layout::plain;
    }
    return true;
  }

  /// A mutable view of a parameter's words. Throws unknown_tensor for a missing parameter and
  /// dtype_mismatch when W is not the parameter's word width.
  template <storage_word W>
  tensor_view<W> view(const std::string& name) {
    auto it = params_.find(name);
    DCR_EXPECTS(it != params_.end(), errc::unknown_tensor, "engine: no parameter '" + name + "'");
    DCR_EXPECTS(dtype_size(it->second.type) == sizeof(W), errc::dtype_mismatch,
                "engine: parameter '" + name + "' holds " +
                    std::string(dtype_name(it->second.type)) + " words, not " +
                    std::to_string(sizeof(W)) + "-byte ones");
    return tensor_view<W>::contiguous(reinterpret_cast<W*>(it->second.bytes.data()),
                                      it->second.shape);
  }

  /// Every parameter's bytes (the buffers the loader's views point into; what a device copy of
  /// this rank's storage mirrors, dcr::exec::policy_apply_backend).
  [[nodiscard]] std::vector<std::span<std::byte>> buffers() {
    std::vector<std::span<std::byte>> out;
    for (auto& [name, p] : params_) out.emplace_back(p.bytes);
    return out;
  }

  /// Sets every stored byte to `sentinel` (fresh storage for a dense reference load).
  void reset() {
    for (auto& [name, p] : params_) std::fill(p.bytes.begin(), p.bytes.end(), sentinel);
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

  /// Padding bytes (rows no canonical element maps to) in all parameters.
  [[nodiscard]] std::uint64_t padding_bytes() const {
    std::uint64_t b = 0;
    for (const auto& [name, p] : params_) b += p.bytes.size() - valid_bytes(p);
    return b;
  }

  /// Name of the first parameter whose padding rows hold anything but `sentinel` (someone wrote
  /// them), or "" when all padding is untouched.
  [[nodiscard]] std::string first_written_padding() const {
    for (const auto& [name, p] : params_) {
      const auto begin = p.bytes.begin() + static_cast<std::ptrdiff_t>(valid_bytes(p));
      if (std::any_of(begin, p.bytes.end(), [](std::byte b) { return b != sentinel; }))
        return name;
    }
    return "";
  }

 private:
  static std::size_t valid_bytes(const engine_param& p) {
    std::size_t row = dtype_size(p.type);
    for (std::size_t d = 1; d < p.shape.size(); ++d) row *= static_cast<std::size_t>(p.shape[d]);
    return static_cast<std::size_t>(p.valid_rows) * row;
  }

  void add(const std::string& name, std::vector<std::int64_t> shape, dtype type,
           std::int64_t valid_rows = -1) {
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    engine_param p;
    p.valid_rows = valid_rows < 0 ? (shape.empty() ? 1 : shape[0]) : valid_rows;
    p.shape = std::move(shape);
    p.type = type;
    p.bytes.assign(static_cast<std::size_t>(n) * dtype_size(type), sentinel);
    params_.emplace(name, std::move(p));
  }

  moe_config config_;
  int world_, rank_;
  engine_layout layout_;
  std::map<std::string, engine_param> params_;
};

/// The engine's native loader for one rank: canonical tensor in, final storage copies out.
class moe_engine_loader {
 public:
  using loader_concept = dcr::loader_tag;

  explicit moe_engine_loader(moe_engine_storage& storage) : storage_(&storage) {}

  /// embedding_tie::store_both on a layout without lm_head storage of its own: the loader
  /// writes model.embed_tokens.weight and lm_head.weight into one storage, a declared tie.
  std::vector<tensor_tie> tied_tensors() const {
    if (storage_->config().tie_embeddings != embedding_tie::store_both ||
        storage_->has_own_lm_head_storage())
      return {};
    return {{"model.embed_tokens.weight", "lm_head.weight"}};
  }

  template <storage_word W, class Sink>
  void load(const canonical_tensor& t, tensor_view<const W> src, Sink& sink) {
    const auto& c = storage_->config();
    const int world = storage_->world();
    const int rank = storage_->rank();
    const bool serving = storage_->layout() == engine_layout::serving;
    auto rows = [&](std::int64_t n) { return balanced_split(n, world, rank); };
    const std::string_view name = t.name;
    auto view = [&](const std::string& p) { return storage_->template view<W>(p); };
    // A norm: its own copy, and on the serving layout a cast copy in another float dtype.
    auto norm = [&](const std::string& p) {
      sink.copy(view(p), src);
      if (!serving) return;
      const dtype to = norm_copy_type(t.type);
      visit_word(dtype_size(to), [&](auto d) {
        using D = decltype(d);
        sink.copy(storage_->template view<D>(p + ".cast"), src, element_transform::cast(t.type, to));
      });
    };
    // This rank's vocabulary rows into the valid (unpadded) rows of a vocab-parallel storage.
    auto vocab_rows = [&](const std::string& p) {
      const auto r = rows(c.vocab);
      sink.copy(view(p).slice(0, 0, r.size()), src.slice(0, r.begin, r.size()));
    };

    if (name == "model.embed_tokens.weight") {
      vocab_rows("embed");
      // A tied model without lm_head.weight: the serving engine fills its lm_head from the
      // embedding (one canonical tensor, two destinations).
      if (c.tie_embeddings == embedding_tie::omit_lm_head && storage_->has_own_lm_head_storage())
        vocab_rows("lm_head");
      return;
    }
    if (name == "lm_head.weight") {
      // Tied, both tensors in the checkpoint, one shared storage: the engine loads both into it.
      return vocab_rows(storage_->has_own_lm_head_storage() ? "lm_head" : "embed");
    }
    if (name == "model.norm.weight") return norm("norm");
    // "model.layers.<l>.<rest>"
    constexpr std::string_view prefix = "model.layers.";
    DCR_EXPECTS(name.starts_with(prefix), errc::unknown_tensor,
                "moe_engine_loader: unexpected tensor '" + t.name + "'");
    const auto dot = name.find('.', prefix.size());
    const std::string layer(name.substr(prefix.size(), dot - prefix.size()));
    const std::string_view rest = name.substr(dot + 1);
    const std::string p = "layers." + layer + ".";

    if (rest == "input_layernorm.weight") return norm(p + "input_norm");
    if (rest == "post_attention_layernorm.weight") return norm(p + "post_norm");
    if (rest == "mlp.gate.weight") {
      if (serving) return sink.copy(view(p + "router_t").transpose(0, 1), src);
      return sink.copy(view(p + "router"), src);
    }
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

static_assert(dcr::loader<moe_engine_loader>);

}  // namespace dcr::sim
