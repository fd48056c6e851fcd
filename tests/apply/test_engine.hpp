// tests/apply/test_engine.hpp: a small inference "engine" for the apply tests: its storage layout
// and its native loader, written the way an engine writes one (dcr knows none of these rules).
//
// Canonical model (Hugging Face names), per layer l:
//   model.embed_tokens.weight [vocab, hidden]    vocab-parallel (split dim 0), stored flat and
//                                                padded to a multiple of 4 rows (padding untouched)
//   lm_head.weight [vocab, hidden]               vocab-parallel, stored transposed [hidden, v_local],
//                                                copied one row at a time (many small copies);
//                                                with tied embeddings (model_config::tie) either
//                                                skipped (the engine uses embed for both) or
//                                                written into the embed storage as well
//   model.norm.weight [hidden]                   replicated into two buffers (norm, norm_copy)
//   model.layers.l.input_layernorm.weight        replicated into `ln`, plus (cast_copies) a copy
//                                                in another float dtype through a dtype cast:
//                                                an fp32 copy of a bf16/f16 norm, or a copy of an
//                                                fp32 norm in the matrices' bf16/f16
//   model.layers.l.self_attn.{q,k,v}_proj.weight column-parallel by heads, fused into one qkv
//   model.layers.l.self_attn.o_proj.weight       row-parallel (split the last dim)
//   model.layers.l.mlp.{gate,up}_proj.weight     column-parallel, fused gate_up
//   model.layers.l.mlp.down_proj.weight          row-parallel, stored transposed [i_local, hidden]
//   model.layers.l.mlp.experts.e.{gate,down}_proj.weight
//                                                expert-parallel: stacked [E_local, ...] on the
//                                                rank that holds expert e, skipped elsewhere
//   model.layers.l.conv.weight [C, 1, K]         split dim 0, stored as [K, C_local] (a view with
//                                                an extent-1 dim and an arbitrary stride)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/apply/loader.hpp"
#include "dcr/canonical.hpp"
#include "dcr/dtype.hpp"
#include "dcr/mapping/concept.hpp"
#include "dcr/tensor_view.hpp"

namespace dcr_test {

using dcr::canonical_tensor;
using dcr::dtype;
using dcr::storage_word;
using dcr::tensor_view;

struct model_config {
  std::int64_t hidden = 8;
  std::int64_t heads = 4;
  std::int64_t kv_heads = 2;
  std::int64_t head_dim = 2;
  std::int64_t inter = 12;
  std::int64_t vocab = 20;
  std::int64_t experts = 4;
  std::int64_t expert_inter = 4;
  std::int64_t conv_channels = 6;
  std::int64_t conv_kernel = 3;
  int layers = 1;
  dtype type = dtype::bf16;       // matrices
  dtype norm_type = dtype::f32;   // norms (engines often keep them in fp32)
  /// Tied embeddings: the engine keeps one storage for embed and lm_head.
  enum class tie_mode { none, skip_lm_head, write_both } tie = tie_mode::none;
  bool cast_copies = true;        // keep a dtype-cast copy of each input_layernorm
};

/// The storage dtype of the cast copy of a norm of dtype `norm`, or nullopt when the engine
/// keeps none (cast_copies off, or no float pair to cast between).
inline std::optional<dtype> cast_copy_type(const model_config& c) {
  if (!c.cast_copies) return std::nullopt;
  if (c.norm_type == dtype::bf16 || c.norm_type == dtype::f16) return dtype::f32;
  if (c.norm_type == dtype::f32 && (c.type == dtype::bf16 || c.type == dtype::f16)) return c.type;
  return std::nullopt;
}

inline std::string layer_prefix(int l) { return "model.layers." + std::to_string(l) + "."; }

inline std::vector<canonical_tensor> canonical_tensors(const model_config& c) {
  std::vector<canonical_tensor> ts;
  auto add = [&](std::string name, dtype t, std::vector<std::int64_t> shape) {
    ts.push_back(canonical_tensor{std::move(name), t, std::move(shape)});
  };
  const std::int64_t q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim;
  add("model.embed_tokens.weight", c.type, {c.vocab, c.hidden});
  add("lm_head.weight", c.type, {c.vocab, c.hidden});
  add("model.norm.weight", c.norm_type, {c.hidden});
  for (int l = 0; l < c.layers; ++l) {
    const auto p = layer_prefix(l);
    add(p + "input_layernorm.weight", c.norm_type, {c.hidden});
    add(p + "self_attn.q_proj.weight", c.type, {q, c.hidden});
    add(p + "self_attn.k_proj.weight", c.type, {kv, c.hidden});
    add(p + "self_attn.v_proj.weight", c.type, {kv, c.hidden});
    add(p + "self_attn.o_proj.weight", c.type, {c.hidden, q});
    add(p + "mlp.gate_proj.weight", c.type, {c.inter, c.hidden});
    add(p + "mlp.up_proj.weight", c.type, {c.inter, c.hidden});
    add(p + "mlp.down_proj.weight", c.type, {c.hidden, c.inter});
    for (std::int64_t e = 0; e < c.experts; ++e) {
      const auto pe = p + "mlp.experts." + std::to_string(e) + ".";
      add(pe + "gate_proj.weight", c.type, {c.expert_inter, c.hidden});
      add(pe + "down_proj.weight", c.type, {c.hidden, c.expert_inter});
    }
    add(p + "conv.weight", c.type, {c.conv_channels, 1, c.conv_kernel});
  }
  return ts;
}

/// Named storage buffers of one rank, initialized to a sentinel byte so that elements no load
/// writes (padding) are checked too. Compared byte for byte.
class engine_storage {
 public:
  static constexpr std::byte sentinel{0xA5};

  engine_storage() = default;
  engine_storage(const engine_storage& o) { *this = o; }
  engine_storage& operator=(const engine_storage& o) {
    if (this == &o) return *this;
    buffers_.clear();
    for (const auto& [name, b] : o.buffers_) {
      auto& mine = buffers_[name];
      mine.size = b.size;
      mine.word = b.word;
      mine.bytes.reset(new std::byte[b.size]);
      std::memcpy(mine.bytes.get(), b.bytes.get(), b.size);
    }
    return *this;
  }
  engine_storage(engine_storage&&) noexcept = default;
  engine_storage& operator=(engine_storage&&) noexcept = default;

  void add(const std::string& name, std::int64_t elements, std::size_t word_bytes) {
    auto& b = buffers_[name];
    b.size = static_cast<std::size_t>(elements) * word_bytes;
    b.word = word_bytes;
    b.bytes.reset(new std::byte[b.size == 0 ? 1 : b.size]);
    std::memset(b.bytes.get(), static_cast<int>(sentinel), b.size);
  }
  template <storage_word W>
  W* words(const std::string& name) {
    auto it = buffers_.find(name);
    if (it == buffers_.end()) throw std::logic_error("test engine: no buffer " + name);
    return reinterpret_cast<W*>(it->second.bytes.get());
  }
  std::span<const std::byte> bytes(const std::string& name) const {
    const auto& b = buffers_.at(name);
    return {b.bytes.get(), b.size};
  }
  std::size_t total_bytes() const {
    std::size_t n = 0;
    for (const auto& [name, b] : buffers_) n += b.size;
    return n;
  }
  /// Byte-for-byte equality of every buffer.
  friend bool operator==(const engine_storage& a, const engine_storage& b) {
    if (a.buffers_.size() != b.buffers_.size()) return false;
    for (const auto& [name, ba] : a.buffers_) {
      auto it = b.buffers_.find(name);
      if (it == b.buffers_.end() || it->second.size != ba.size) return false;
      if (std::memcmp(ba.bytes.get(), it->second.bytes.get(), ba.size) != 0) return false;
    }
    return true;
  }
  /// Number of stored words that differ between two storages of the same layout.
  static std::size_t differing_words(const engine_storage& a, const engine_storage& b) {
    std::size_t n = 0;
    for (const auto& [name, ba] : a.buffers_) {
      const auto& bb = b.buffers_.at(name);
      for (std::size_t at = 0; at < ba.size; at += ba.word)
        n += std::memcmp(ba.bytes.get() + at, bb.bytes.get() + at, ba.word) != 0 ? 1 : 0;
    }
    return n;
  }
  /// Name of the first buffer that differs (for failure messages), or "".
  static std::string first_difference(const engine_storage& a, const engine_storage& b) {
    for (const auto& [name, ba] : a.buffers_) {
      auto it = b.buffers_.find(name);
      if (it == b.buffers_.end() || it->second.size != ba.size ||
          std::memcmp(ba.bytes.get(), it->second.bytes.get(), ba.size) != 0)
        return name;
    }
    return "";
  }

 private:
  struct buffer {
    std::unique_ptr<std::byte[]> bytes;
    std::size_t size = 0;
    std::size_t word = 1;
  };
  std::map<std::string, buffer> buffers_;
};

/// Misbehaviours the error tests switch on.
enum class fault {
  none,
  temporary_src,   ///< copies `fault_tensor` through a temporary buffer
  duplicate_norm,  ///< writes model.norm.weight twice into the same buffer
  forget_skip,     ///< neither copies nor skips experts it does not hold
  alternate,       ///< every other load of `fault_tensor` copies only its first half
  broadcast_src,   ///< copies `fault_tensor`'s first row broadcast over all its rows
  reversed_norm,   ///< also writes model.norm.weight reversed into `norm` (two elements per word)
  modify_src,      ///< sets a bit of `fault_tensor`'s src before copying (writes its input)
  wrong_cast,      ///< casts input_layernorm as if it were f16 (a transform of the wrong dtype)
};

/// The engine's native loader for one tensor-parallel rank of `world`.
class test_engine_loader {
 public:
  using loader_concept = dcr::loader_tag;

  test_engine_loader(const model_config& c, int world, int rank) : c_(c), world_(world), rank_(rank) {
    const auto wb = dcr::dtype_size(c.type), nb = dcr::dtype_size(c.norm_type);
    const auto vs = split(c.vocab);
    storage_.add("embed", (vs.size() + 3) / 4 * 4 * c.hidden, wb);
    if (c.tie == model_config::tie_mode::none) storage_.add("lm_head_t", c.hidden * vs.size(), wb);
    storage_.add("norm", c.hidden, nb);
    storage_.add("norm_copy", c.hidden, nb);
    for (int l = 0; l < c.layers; ++l) {
      const auto b = buffer_prefix(std::to_string(l));
      const auto hs = split(c.heads), ks = split(c.kv_heads), is = split(c.inter);
      const auto es = split(c.experts), cs = split(c.conv_channels);
      storage_.add(b + "ln", c.hidden, nb);
      if (const auto ct = cast_copy_type(c)) storage_.add(b + "ln_cast", c.hidden, dcr::dtype_size(*ct));
      storage_.add(b + "qkv", (hs.size() + 2 * ks.size()) * c.head_dim * c.hidden, wb);
      storage_.add(b + "o", c.hidden * hs.size() * c.head_dim, wb);
      storage_.add(b + "gate_up", 2 * is.size() * c.hidden, wb);
      storage_.add(b + "down_t", is.size() * c.hidden, wb);
      storage_.add(b + "experts_gate", es.size() * c.expert_inter * c.hidden, wb);
      storage_.add(b + "experts_down", es.size() * c.hidden * c.expert_inter, wb);
      storage_.add(b + "conv_t", c.conv_kernel * cs.size(), wb);
    }
  }

  engine_storage& storage() noexcept { return storage_; }
  const engine_storage& storage() const noexcept { return storage_; }

  fault inject = fault::none;
  std::string fault_tensor;
  int loads = 0;  ///< load() calls so far
  /// Whether tied_tensors() declares the tie of tie_mode::write_both (off: the trap of a loader
  /// that writes lm_head into the embedding's storage without saying the model ties them).
  bool declare_tie = true;

  /// The tie of tie_mode::write_both: embed and lm_head loaded into one storage.
  std::vector<dcr::tensor_tie> tied_tensors() const {
    if (c_.tie != model_config::tie_mode::write_both || !declare_tie) return {};
    return {{"model.embed_tokens.weight", "lm_head.weight"}};
  }

  template <storage_word W, class Sink>
  void load(const canonical_tensor& t, tensor_view<const W> src, Sink& sink) {
    ++loads;
    const std::string_view name = t.name;
    const auto& c = c_;
    using tie = model_config::tie_mode;
    if (name == "model.embed_tokens.weight" ||
        (name == "lm_head.weight" && c.tie == tie::write_both)) {
      const auto vs = split(c.vocab);
      auto dst = tensor_view<W>::contiguous(storage_.words<W>("embed"), {vs.size() * c.hidden});
      emit(sink, t, dst, src.slice(0, vs.begin, vs.size()).reshape({vs.size() * c.hidden}));
      return;
    }
    if (name == "lm_head.weight") {
      if (c.tie == tie::skip_lm_head) return sink.skip(t);
      const auto vs = split(c.vocab);
      if (vs.size() == 0) return sink.skip(t);
      auto stored = tensor_view<W>::contiguous(storage_.words<W>("lm_head_t"), {c.hidden, vs.size()});
      for (std::int64_t v = 0; v < vs.size(); ++v)
        emit(sink, t, stored.select(1, v), src.select(0, vs.begin + v));
      return;
    }
    if (name == "model.norm.weight") {
      emit(sink, t, tensor_view<W>::contiguous(storage_.words<W>("norm"), {c.hidden}), src);
      emit(sink, t, tensor_view<W>::contiguous(storage_.words<W>("norm_copy"), {c.hidden}), src);
      if (inject == fault::duplicate_norm)
        emit(sink, t, tensor_view<W>::contiguous(storage_.words<W>("norm"), {c.hidden}), src);
      if (inject == fault::reversed_norm && c.hidden > 1) {
        auto n = tensor_view<W>::contiguous(storage_.words<W>("norm"), {c.hidden});
        tensor_view<const W> rev(src.data() + (c.hidden - 1), 1, {c.hidden}, {-1});
        sink.copy(n, rev);
      }
      return;
    }
    // model.layers.<l>.<rest>
    constexpr std::string_view layers = "model.layers.";
    if (name.substr(0, layers.size()) != layers) throw std::logic_error("unknown tensor");
    auto rest = name.substr(layers.size());
    const auto dot = rest.find('.');
    const auto b = buffer_prefix(rest.substr(0, dot));
    rest = rest.substr(dot + 1);
    const auto hd = c.head_dim;
    if (rest == "input_layernorm.weight") {
      emit(sink, t, tensor_view<W>::contiguous(storage_.words<W>(b + "ln"), {c.hidden}), src);
      if (const auto ct = cast_copy_type(c)) {
        const auto tr = dcr::element_transform::cast(inject == fault::wrong_cast ? dtype::f16 : t.type, *ct);
        dcr::visit_word(dcr::dtype_size(*ct), [&](auto d) {
          using D = decltype(d);
          sink.copy(tensor_view<D>::contiguous(storage_.words<D>(b + "ln_cast"), {c.hidden}), src, tr);
        });
      }
    } else if (rest == "self_attn.q_proj.weight" || rest == "self_attn.k_proj.weight" ||
               rest == "self_attn.v_proj.weight") {
      const auto hs = split(c.heads), ks = split(c.kv_heads);
      const std::int64_t rows = (hs.size() + 2 * ks.size()) * hd;
      auto qkv = tensor_view<W>::contiguous(storage_.words<W>(b + "qkv"), {rows, c.hidden});
      const char which = rest[10];  // q, k or v
      const auto s = which == 'q' ? hs : ks;
      const std::int64_t at = which == 'q' ? 0
                              : which == 'k' ? hs.size() * hd
                                             : (hs.size() + ks.size()) * hd;
      emit_maybe_half(sink, t, qkv.slice(0, at, s.size() * hd), src.slice(0, s.begin * hd, s.size() * hd));
    } else if (rest == "self_attn.o_proj.weight") {
      const auto hs = split(c.heads);
      auto o = tensor_view<W>::contiguous(storage_.words<W>(b + "o"), {c.hidden, hs.size() * hd});
      emit(sink, t, o, src.slice(1, hs.begin * hd, hs.size() * hd));
    } else if (rest == "mlp.gate_proj.weight" || rest == "mlp.up_proj.weight") {
      const auto is = split(c.inter);
      auto gu = tensor_view<W>::contiguous(storage_.words<W>(b + "gate_up"), {2 * is.size(), c.hidden});
      const std::int64_t at = rest[4] == 'g' ? 0 : is.size();
      emit(sink, t, gu.slice(0, at, is.size()), src.slice(0, is.begin, is.size()));
    } else if (rest == "mlp.down_proj.weight") {
      const auto is = split(c.inter);
      auto stored = tensor_view<W>::contiguous(storage_.words<W>(b + "down_t"), {is.size(), c.hidden});
      emit(sink, t, stored.transpose(0, 1), src.slice(1, is.begin, is.size()));
    } else if (rest.substr(0, 12) == "mlp.experts.") {
      auto er = rest.substr(12);
      const std::int64_t e = std::stoll(std::string(er.substr(0, er.find('.'))));
      const auto kind = er.substr(er.find('.') + 1);
      const auto es = split(c.experts);
      if (e < es.begin || e >= es.end) {
        if (inject != fault::forget_skip) sink.skip(t);
        return;
      }
      if (kind == "gate_proj.weight") {
        auto st = tensor_view<W>::contiguous(storage_.words<W>(b + "experts_gate"),
                                             {es.size(), c.expert_inter, c.hidden});
        emit(sink, t, st.select(0, e - es.begin), src);
      } else {
        auto st = tensor_view<W>::contiguous(storage_.words<W>(b + "experts_down"),
                                             {es.size(), c.hidden, c.expert_inter});
        emit(sink, t, st.select(0, e - es.begin), src);
      }
    } else if (rest == "conv.weight") {
      const auto cs = split(c.conv_channels);
      // Stored [K, C_local]; seen as [C_local, 1, K] with an arbitrary stride on the unit dim.
      tensor_view<W> dst(storage_.words<W>(b + "conv_t"), 3, {cs.size(), 1, c.conv_kernel},
                         {1, 7919, cs.size()});
      emit(sink, t, dst, src.slice(0, cs.begin, cs.size()));
    } else {
      throw std::logic_error("unknown tensor");
    }
  }

 private:
  // Built by appends: GCC 12 warns falsely (-Wrestrict) on "L" + std::string temporaries.
  static std::string buffer_prefix(std::string_view layer) {
    std::string b = "L";
    b.append(layer);
    b.push_back('.');
    return b;
  }

  dcr::split_range split(std::int64_t n) const { return dcr::balanced_split(n, world_, rank_); }

  template <class Sink, class W>
  void emit(Sink& sink, const canonical_tensor& t, tensor_view<W> dst, tensor_view<const W> src) {
    if (inject == fault::broadcast_src && t.name == fault_tensor && src.rank() >= 1 && src.extent(0) > 1) {
      dcr::index_array str = src.strides();
      str[0] = 0;
      sink.copy(dst, tensor_view<const W>(src.data(), src.rank(), src.extents(), str));
      return;
    }
    if (inject == fault::modify_src && t.name == fault_tensor && src.size() > 0)
      const_cast<W*>(src.data())[0] |= W{1};
    if (inject == fault::temporary_src && t.name == fault_tensor) {
      // A loader that materializes its input first: fine for a dense load, but the delta sink
      // cannot tell which elements of the temporary are active.
      std::vector<W> tmp(static_cast<std::size_t>(src.size()));
      auto tv = tensor_view<W>::contiguous(
          tmp.data(), std::span<const std::int64_t>(src.extents().data(), static_cast<std::size_t>(src.rank())));
      dcr::copy_elements<W>(tv, src);
      sink.copy(dst, tensor_view<const W>(tv));
      return;
    }
    sink.copy(dst, src);
  }

  template <class Sink, class W>
  void emit_maybe_half(Sink& sink, const canonical_tensor& t, tensor_view<W> dst,
                       tensor_view<const W> src) {
    if (inject == fault::alternate && t.name == fault_tensor && (++alternations_ % 2) == 0) {
      const auto half = dst.extent(0) / 2;
      emit(sink, t, dst.slice(0, 0, half), src.slice(0, 0, half));
      return;
    }
    emit(sink, t, dst, src);
  }

  model_config c_;
  int world_;
  int rank_;
  int alternations_ = 0;
  engine_storage storage_;
};

static_assert(dcr::loader<test_engine_loader>);

// ---- Synthetic words -------------------------------------------------------------------------

/// Bit patterns float code must never disturb: +-0, +-inf, quiet and signalling NaNs with
/// payloads, subnormals, the smallest normal.
template <storage_word W>
std::vector<W> special_words(dtype t) {
  auto as_words = [](std::initializer_list<std::uint64_t> bits) {
    std::vector<W> out;
    for (auto b : bits) out.push_back(static_cast<W>(b));
    return out;
  };
  switch (t) {
    case dtype::bf16:
      return as_words({0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7fc1, 0xffa5, 0x7f81, 0x0001,
                       0x807f, 0x0080});
    case dtype::f16:
      return as_words({0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7e01, 0xfd55, 0x7c01, 0x0001,
                       0x83ff, 0x0400});
    case dtype::f32:
      return as_words({0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7fc00001,
                       0xffabcdef, 0x7f800001, 0x00000001, 0x807fffff, 0x00800000});
    default:
      return as_words({0, ~std::uint64_t{0}});
  }
}

template <storage_word W>
W random_word(std::mt19937_64& rng, dtype t) {
  if (rng() % 8 == 0) {
    const auto s = special_words<W>(t);
    return s[rng() % s.size()];
  }
  return static_cast<W>(rng());
}

/// A different word: a small update (low mantissa bits flip, as after an optimizer step) or an
/// arbitrary/special pattern.
template <storage_word W>
W changed_word(std::mt19937_64& rng, dtype t, W old) {
  for (;;) {
    W w = rng() % 2 ? static_cast<W>(old ^ static_cast<W>(rng() % 16)) : random_word<W>(rng, t);
    if (w != old) return w;
  }
}

}  // namespace dcr_test
