// tests/apply/test_models.hpp: model versions, items and payloads for the apply tests, built the
// way owners build them (values in each item's encoding, xor/ulp only for tensors no receiver
// takes as overwrite-only), and the dense refit every apply is compared with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "../error_capture.hpp"
#include "dcr/apply/apply.hpp"
#include "dcr/codec/values.hpp"
#include "test_engine.hpp"

namespace dcr_test {

using dcr::encoding;
using dcr::item;
using dcr::tensor_id;
using dcr::tensor_registry;

/// Old and new words of every canonical tensor (widened to 64 bits), by tensor id.
struct model_versions {
  std::vector<std::vector<std::uint64_t>> old_words, new_words;
};

template <dcr::storage_word W>
std::vector<W> narrow(const std::vector<std::uint64_t>& v) {
  std::vector<W> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<W>(v[i]);
  return out;
}

/// Random old weights (specials mixed in) and new weights with each element changed with
/// probability `rate` (every element when rate == 1). With tied embeddings written twice, the
/// checkpoint keeps lm_head.weight bit-equal to model.embed_tokens.weight, as a tied model does.
inline model_versions random_versions(std::mt19937_64& rng, const tensor_registry& reg,
                                      double rate, const model_config* c = nullptr) {
  model_versions m;
  std::bernoulli_distribution changes(rate);
  for (const auto& t : reg.tensors()) {
    auto& o = m.old_words.emplace_back(static_cast<std::size_t>(t.numel()));
    auto& n = m.new_words.emplace_back();
    dcr::visit_word(dcr::dtype_size(t.type), [&](auto w) {
      using W = decltype(w);
      for (auto& x : o) x = random_word<W>(rng, t.type);
      n = o;
      for (auto& x : n)
        if (rate >= 1.0 || changes(rng)) x = changed_word<W>(rng, t.type, static_cast<W>(x));
    });
  }
  if (c != nullptr && c->tie == model_config::tie_mode::write_both) {
    const auto e = reg.id("model.embed_tokens.weight"), l = reg.id("lm_head.weight");
    m.old_words[l] = m.old_words[e];
    m.new_words[l] = m.new_words[e];
  }
  return m;
}

/// An item built by hand, its values made by the encoding's own policy type.
inline item hand_item(tensor_id id, const dcr::canonical_tensor& t, encoding enc,
                      const std::vector<std::uint64_t>& indices, const model_versions& m) {
  item it;
  it.tensor = id;
  it.type = t.type;
  it.enc = enc;
  it.indices = indices;
  it.values.resize(indices.size() * dcr::dtype_size(t.type));
  dcr::visit_word(dcr::dtype_size(t.type), [&](auto w) {
    using W = decltype(w);
    auto out = it.words<W>();
    dcr::visit_encoding(enc, [&](auto e) {
      for (std::size_t k = 0; k < indices.size(); ++k)
        out[k] = decltype(e)::encode(static_cast<W>(m.old_words[id][indices[k]]),
                                     static_cast<W>(m.new_words[id][indices[k]]));
    });
  });
  return it;
}

/// The encodings this build applies.
inline std::vector<encoding> supported_encodings() {
  std::vector<encoding> out;
  for (auto e : {encoding::overwrite, encoding::xor_mask, encoding::ulp})
    if (dcr::is_supported_encoding(e)) out.push_back(e);
  return out;
}

/// Each tensor's changed elements split among 1-3 owners (disjoint items, encodings drawn from
/// `encodings`, overwrite for tensors in `overwrite_only`), plus some items without records;
/// shuffled and cut into payloads of 1-5 items.
inline std::vector<std::vector<item>> random_payloads(std::mt19937_64& rng,
                                                      const tensor_registry& reg,
                                                      const model_versions& m,
                                                      const std::set<tensor_id>& overwrite_only = {},
                                                      std::vector<encoding> encodings = {}) {
  if (encodings.empty()) encodings = supported_encodings();
  std::vector<item> items;
  for (tensor_id id = 0; id < reg.size(); ++id) {
    const auto& t = reg.at(id);
    const int owners = 1 + static_cast<int>(rng() % 3);
    std::vector<std::vector<std::uint64_t>> parts(static_cast<std::size_t>(owners));
    for (std::uint64_t i = 0; i < m.old_words[id].size(); ++i)
      if (m.old_words[id][i] != m.new_words[id][i]) parts[rng() % parts.size()].push_back(i);
    for (const auto& p : parts) {
      if (p.empty() && rng() % 4 != 0) continue;
      const encoding enc =
          overwrite_only.count(id) ? encoding::overwrite : encodings[rng() % encodings.size()];
      items.push_back(hand_item(id, t, enc, p, m));
    }
  }
  std::shuffle(items.begin(), items.end(), rng);
  std::vector<std::vector<item>> payloads;
  for (std::size_t at = 0; at < items.size();) {
    const std::size_t n = std::min<std::size_t>(1 + rng() % 5, items.size() - at);
    payloads.emplace_back(std::make_move_iterator(items.begin() + static_cast<std::ptrdiff_t>(at)),
                          std::make_move_iterator(items.begin() + static_cast<std::ptrdiff_t>(at + n)));
    at += n;
  }
  return payloads;
}

/// Dense refit of every tensor through the loader.
template <class Applier>
void dense_load_all(Applier& ap, const tensor_registry& reg,
                    const std::vector<std::vector<std::uint64_t>>& words) {
  for (tensor_id id = 0; id < reg.size(); ++id) {
    const auto& t = reg.at(id);
    dcr::visit_word(dcr::dtype_size(t.type), [&](auto w) {
      using W = decltype(w);
      const auto v = narrow<W>(words[id]);
      ap.template dense_load<W>(id, dcr::tensor_view<const W>::contiguous(v.data(), t.shape));
    });
  }
}

/// A small random model of matrices `type`; norms either fp32 or `type`; random tie mode.
inline model_config random_config(std::mt19937_64& rng, dtype type) {
  auto r = [&](std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  model_config c;
  c.hidden = r(1, 40);
  c.heads = r(1, 6);
  c.kv_heads = r(1, c.heads);
  c.head_dim = r(1, 6);
  c.inter = r(1, 30);
  c.vocab = r(1, 60);
  c.experts = r(0, 5);
  c.expert_inter = r(1, 8);
  c.conv_channels = r(1, 9);
  c.conv_kernel = r(1, 4);
  c.layers = static_cast<int>(r(1, 2));
  c.type = type;
  c.norm_type = rng() % 2 ? dtype::f32 : type;
  c.tie = static_cast<model_config::tie_mode>(rng() % 3);
  c.cast_copies = rng() % 4 != 0;
  return c;
}

// code_of and message_of: tests/error_capture.hpp (namespace dcr_test).

}  // namespace dcr_test
