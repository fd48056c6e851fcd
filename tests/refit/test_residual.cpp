// Residual conversion end to end: fused QKV, stacked experts, tied weights, shared scale factors
// and padding removal, each refit over several transitions through the in-process agents and compared
// byte for byte with a dense refit through the same engine loader; change flags rebuild only
// the outputs whose inputs changed; the residual baseline moves only at the joint commit; owners
// mix affine and residual tasks; receivers' overwrite-only tensors are honoured; bad task sets
// and bad shards are refused with clear errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dcr/protocol/in_process.hpp"
#include "dcr/testing/faults.hpp"
#include "dcr/refit/ownership.hpp"
#include "dcr/refit/residual.hpp"

namespace {

using dcr::tensor_id;
using byte_spans = std::span<const std::span<const std::byte>>;

// ---- Receiver side: a small engine whose native loader splits every tensor by rows over its
// tensor-parallel ranks, optionally storing 2-d blocks transposed.

class split_loader {
 public:
  using loader_concept = dcr::loader_tag;
  static constexpr std::byte sentinel{0xA5};

  split_loader(const dcr::tensor_registry& registry, int world, int rank, bool transposed)
      : world_(world), rank_(rank), transposed_(transposed) {
    for (const auto& t : registry.tensors()) {
      const auto rows = dcr::balanced_split(t.shape[0], world, rank);
      const auto bytes = static_cast<std::size_t>(rows.size() * (t.bytes() / t.shape[0]));
      storage_[t.name].assign(bytes, sentinel);
    }
  }

  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor& t, dcr::tensor_view<const W> src, Sink& sink) {
    const auto rows = dcr::balanced_split(t.shape[0], world_, rank_);
    if (rows.size() == 0) return sink.skip(t);
    W* words = reinterpret_cast<W*>(storage_.at(t.name).data());
    const auto block = src.slice(0, rows.begin, rows.size());
    if (transposed_ && t.shape.size() == 2) {
      auto stored = dcr::tensor_view<W>::contiguous(words, {t.shape[1], rows.size()});
      sink.copy(stored.transpose(0, 1), block);
    } else {
      std::vector<std::int64_t> shape(t.shape);
      shape[0] = rows.size();
      sink.copy(dcr::tensor_view<W>::contiguous(words, std::span<const std::int64_t>(shape)),
                block);
    }
  }

  [[nodiscard]] const std::map<std::string, std::vector<std::byte>>& storage() const {
    return storage_;
  }

 private:
  int world_, rank_;
  bool transposed_;
  std::map<std::string, std::vector<std::byte>> storage_;
};

struct receiver_spec {
  int world = 1;
  int rank = 0;
  bool transposed = false;
  std::vector<std::string> overwrite_only;  // tensors this receiver takes only as overwrites
};

struct serving_rank {
  serving_rank(const dcr::tensor_registry& registry, const receiver_spec& s)
      : loader(registry, s.world, s.rank, s.transposed), rx(registry, loader) {
    rx.prewarm();
  }
  split_loader loader;
  dcr::receiver<split_loader> rx;
};

// A receiver that declares some tensors overwrite-only (as one whose loader path does not
// preserve bits would) and otherwise forwards to the real receiver.
class overwrite_only_endpoint final : public dcr::receiver_endpoint {
 public:
  overwrite_only_endpoint(dcr::receiver_endpoint& inner, std::vector<tensor_id> only)
      : inner_(&inner), only_(std::move(only)) {
    std::sort(only_.begin(), only_.end());
  }
  void begin_attempt(const dcr::attempt_key& key) override { inner_->begin_attempt(key); }
  dcr::apply_outcome apply_payload(std::span<const std::byte> bytes) override {
    return inner_->apply_payload(bytes);
  }
  void end_transition(std::uint64_t version) override { inner_->end_transition(version); }
  [[nodiscard]] std::uint64_t committed_version() const noexcept override {
    return inner_->committed_version();
  }
  [[nodiscard]] const dcr::receiver_stats& stats() const override { return inner_->stats(); }
  [[nodiscard]] std::span<const tensor_id> overwrite_only_tensors() const override { return only_; }

 private:
  dcr::receiver_endpoint* inner_;
  std::vector<tensor_id> only_;
};

// ---- Trainer side: named source shards, affine and residual tasks over them, owners.

struct source_shard {
  std::string name;
  dcr::dtype type;
  std::vector<std::byte> bytes;
  template <dcr::storage_word W>
  std::span<W> words() {
    return dcr::words_of<W>(std::span<std::byte>(bytes));
  }
};

class rig {
 public:
  explicit rig(std::vector<dcr::canonical_tensor> tensors, std::uint64_t seed = 1)
      : registry(std::move(tensors)), rng(seed), rebuilt(registry.size(), 0) {}

  dcr::tensor_registry registry;
  std::mt19937_64 rng;
  std::vector<source_shard> sources;
  std::vector<int> rebuilt;  // per tensor: conversions run by owners since reset_counts()

  /// A source shard of `elements` words of `type`, filled with random finite values.
  std::size_t add_source(std::string name, dcr::dtype type, std::uint64_t elements) {
    source_shard s{std::move(name), type, std::vector<std::byte>(elements * dcr::dtype_size(type))};
    std::normal_distribution<float> z;
    for (std::uint64_t j = 0; j < elements; ++j) {
      const float v = z(rng);
      if (type == dcr::dtype::f32)
        s.words<std::uint32_t>()[j] = dcr::bit_cast<std::uint32_t>(v);
      else
        s.words<std::uint16_t>()[j] = dcr::float_to_bf16(v);
    }
    sources.push_back(std::move(s));
    return sources.size() - 1;
  }

  void add_affine(dcr::affine_task task, std::size_t source) {
    affine_.push_back(std::move(task));
    affine_source_.push_back(source);
  }

  /// Adds a residual task reading `inputs` (source indices, declared in this order). Owners run
  /// a counting wrapper of its conversion; the dense reference runs the conversion itself.
  void add_residual(dcr::residual_task task, std::vector<std::size_t> inputs) {
    reference_convert_.push_back(task.convert);
    std::vector<tensor_id> outs;
    for (const auto& o : task.outputs) outs.push_back(o.tensor);
    task.convert = [inner = task.convert, outs, this](std::size_t o, byte_spans in,
                                                      std::span<std::byte> dst) {
      ++rebuilt[outs.at(o)];
      inner(o, in, dst);
    };
    residual_.push_back(std::move(task));
    residual_sources_.push_back(std::move(inputs));
  }

  /// Owners: affine shards balanced by dcr::assign_owners, residual tasks by residual_owner over
  /// every rank (in one process every owner sees every shard). Then trackers, baselines, dense
  /// loads of the receivers and the commit record at version 0.
  void start(std::uint32_t owner_ranks, std::vector<receiver_spec> specs) {
    std::vector<dcr::shard_holding> holdings;
    std::vector<std::uint32_t> all(owner_ranks);
    for (std::uint32_t r = 0; r < owner_ranks; ++r) all[r] = r;
    for (const auto& t : affine_) holdings.push_back({t.shard_name, t.bytes(), all});
    const auto affine_owner = dcr::assign_owners(holdings);
    for (std::uint32_t rank = 0; rank < owner_ranks; ++rank) {
      std::vector<dcr::affine_task> mine;
      std::vector<dcr::residual_task> mine_residual;
      dcr::owner_binding binding{nullptr, {}};
      std::vector<std::span<const std::byte>> committed, committed_residual;
      for (std::size_t i = 0; i < affine_.size(); ++i) {
        if (affine_owner[i] != rank) continue;
        mine.push_back(affine_[i]);
        binding.candidates.emplace_back(sources[affine_source_[i]].bytes);
      }
      for (std::size_t r = 0; r < residual_.size(); ++r) {
        if (dcr::residual_owner(residual_[r].name, all) != rank) continue;
        mine_residual.push_back(residual_[r]);
        for (auto s : residual_sources_[r]) binding.residual_inputs.emplace_back(sources[s].bytes);
      }
      if (mine.empty() && mine_residual.empty()) continue;
      owners.push_back(
          std::make_unique<dcr::owner>(registry, rank, std::move(mine), std::move(mine_residual)));
      owners.back()->initialize(binding.candidates, binding.residual_inputs);
      binding.owner_ptr = owners.back().get();
      bindings.push_back(std::move(binding));
    }
    specs_ = std::move(specs);
    const auto canonical = assemble();
    for (const auto& s : specs_) {
      ranks.push_back(std::make_unique<serving_rank>(registry, s));
      dense_load(ranks.back()->rx, canonical);
      if (s.overwrite_only.empty()) {
        endpoints.push_back(&ranks.back()->rx);
      } else {
        std::vector<tensor_id> ids;
        for (const auto& name : s.overwrite_only) ids.push_back(registry.id(name));
        wrappers.push_back(std::make_unique<overwrite_only_endpoint>(ranks.back()->rx, ids));
        endpoints.push_back(wrappers.back().get());
      }
    }
    driver = std::make_unique<dcr::in_process_refit>(
        registry, std::span<dcr::owner_binding>(bindings),
        std::span<dcr::receiver_endpoint* const>(endpoints), 0);
  }

  void reset_counts() { std::fill(rebuilt.begin(), rebuilt.end(), 0); }
  /// Names of the tensors owners rebuilt since reset_counts(), sorted.
  std::set<std::string> rebuilt_names() const {
    std::set<std::string> s;
    for (std::size_t id = 0; id < rebuilt.size(); ++id)
      if (rebuilt[id] > 0) s.insert(registry.at(static_cast<tensor_id>(id)).name);
    return s;
  }

  std::uint64_t version() const { return driver->version(); }

  dcr::transition_report refit(const dcr::refit_options& options = {},
                               const dcr::testing::receiver_fault_plan& faults = {}) {
    reset_counts();
    return driver->run(options, dcr::testing::decorate_with(faults));
  }

  /// The canonical checkpoint of the current source shards: affine shards scattered through
  /// their mappings, residual outputs converted (by the conversions themselves, uncounted).
  std::vector<std::vector<std::byte>> assemble() {
    std::vector<std::vector<std::byte>> c(registry.size());
    for (std::size_t id = 0; id < c.size(); ++id)
      c[id].assign(static_cast<std::size_t>(registry.at(static_cast<tensor_id>(id)).bytes()),
                   std::byte{0});
    for (std::size_t i = 0; i < affine_.size(); ++i) {
      const auto& task = affine_[i];
      const std::size_t wb = dcr::dtype_size(task.type);
      const auto& src = sources[affine_source_[i]].bytes;
      std::visit(
          [&](const auto& m) {
            for (std::uint64_t j = 0; j < m.local_size(); ++j) {
              const auto d = m(j);
              std::memcpy(c[task.targets[d.part]].data() + d.index * wb, src.data() + j * wb, wb);
            }
          },
          task.mapping);
    }
    for (std::size_t r = 0; r < residual_.size(); ++r) {
      std::vector<std::span<const std::byte>> in;
      for (auto s : residual_sources_[r]) in.emplace_back(sources[s].bytes);
      for (std::size_t o = 0; o < residual_[r].outputs.size(); ++o)
        reference_convert_[r](o, in, c[residual_[r].outputs[o].tensor]);
    }
    return c;
  }

  /// Dense refit of the current sources through each receiver's own loader into fresh storage,
  /// compared byte for byte with the receiver's storage; "" when all match. Also checks that
  /// every owner's residual baseline holds the committed canonical tensors when `committed`.
  std::string verify(bool committed = true) {
    const auto canonical = assemble();
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      serving_rank reference(registry, specs_[r]);
      dense_load(reference.rx, canonical);
      for (const auto& [name, bytes] : ranks[r]->loader.storage())
        if (reference.loader.storage().at(name) != bytes)
          return "receiver " + std::to_string(r) + " tensor " + name;
    }
    if (committed)
      for (const auto& o : owners)
        for (std::size_t t = 0; t < o->residual_tasks().size(); ++t)
          for (std::size_t k = 0; k < o->residual_tasks()[t].outputs.size(); ++k) {
            const auto base = o->residual_baseline(t, k);
            const auto& want = canonical[o->residual_tasks()[t].outputs[k].tensor];
            if (!std::equal(base.begin(), base.end(), want.begin(), want.end()))
              return "baseline of " + registry.at(o->residual_tasks()[t].outputs[k].tensor).name;
          }
    return "";
  }

  /// Changes about `rate` of the words of source `s` (at least one) by flipping low mantissa
  /// bits, which keeps values finite and near their old ones.
  void perturb(std::size_t s, double rate) {
    auto& src = sources[s];
    const std::size_t wb = dcr::dtype_size(src.type);
    const std::size_t n = src.bytes.size() / wb;
    const auto changes =
        std::clamp<std::size_t>(static_cast<std::size_t>(rate * static_cast<double>(n)), 1, n);
    std::set<std::size_t> at;  // distinct words, so no flip undoes another
    while (at.size() < changes) at.insert(rng() % n);
    for (auto j : at) perturb_word(s, j);
  }
  void perturb_word(std::size_t s, std::size_t j) {
    auto& src = sources[s];
    const auto flip = 1 + rng() % 7;
    if (dcr::dtype_size(src.type) == 4)
      src.words<std::uint32_t>()[j] ^= static_cast<std::uint32_t>(flip << 4);
    else
      src.words<std::uint16_t>()[j] ^= static_cast<std::uint16_t>(flip);
  }

  std::vector<std::unique_ptr<dcr::owner>> owners;
  std::vector<dcr::owner_binding> bindings;
  std::vector<std::unique_ptr<serving_rank>> ranks;
  std::vector<std::unique_ptr<overwrite_only_endpoint>> wrappers;
  std::vector<dcr::receiver_endpoint*> endpoints;
  std::unique_ptr<dcr::in_process_refit> driver;

 private:
  void dense_load(dcr::receiver<split_loader>& rx, const std::vector<std::vector<std::byte>>& c) {
    for (std::size_t id = 0; id < c.size(); ++id) {
      const auto& t = registry.at(static_cast<tensor_id>(id));
      dcr::visit_word(dcr::dtype_size(t.type), [&](auto w) {
        using W = decltype(w);
        rx.template dense_load<W>(static_cast<tensor_id>(id),
                                  dcr::tensor_view<const W>::contiguous(
                                      reinterpret_cast<const W*>(c[id].data()), t.shape));
      });
    }
  }

  std::vector<dcr::affine_task> affine_;
  std::vector<std::size_t> affine_source_;
  std::vector<dcr::residual_task> residual_;
  std::vector<std::vector<std::size_t>> residual_sources_;
  std::vector<dcr::residual_conversion> reference_convert_;
  std::vector<receiver_spec> specs_;
};

const std::vector<receiver_spec> default_receivers = {
    {1, 0, false, {}}, {2, 0, true, {}}, {2, 1, false, {}}, {3, 2, true, {}}};

void require_committed_once(const dcr::transition_report& report) {
  REQUIRE(report.committed);
  REQUIRE(report.attempts.size() == 1);
}

/// The message of the dcr::error `f` throws, or "" when it throws nothing.
template <class F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const dcr::error& e) {
    return e.what();
  }
  return "";
}
bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::set<std::string> names(std::initializer_list<const char*> list) {
  return std::set<std::string>(list.begin(), list.end());
}

// Copies rows [from, from + rows) of a row-major [*, width] word array to row `to` of another.
template <class W>
void copy_rows(std::span<const W> src, std::int64_t from, std::span<W> dst, std::int64_t to,
               std::int64_t rows, std::int64_t width) {
  std::memcpy(dst.data() + to * width, src.data() + from * width,
              static_cast<std::size_t>(rows * width) * sizeof(W));
}

// ---- Model pieces.

/// Megatron-style fused QKV: per TP rank a [(q_per_group + 2) * head_dim * groups / tp, hidden]
/// block holding, for each of its KV groups, the group's q rows, then its k rows, then its v
/// rows. Canonical q [groups * q_per_group * head_dim, hidden], k and v [groups * head_dim,
/// hidden].
struct qkv_shape {
  std::int64_t hidden = 16, head_dim = 4, groups = 4, q_per_group = 2;
  int tp = 2;
};

dcr::residual_task fused_qkv_task(const dcr::tensor_registry& reg, const std::string& layer,
                                  const qkv_shape& s) {
  dcr::residual_task task;
  task.name = layer + "self_attn.qkv";
  const std::int64_t local_groups = s.groups / s.tp;
  const std::int64_t group_rows = (s.q_per_group + 2) * s.head_dim;
  for (int r = 0; r < s.tp; ++r)
    task.inputs.push_back({layer + "linear_qkv.tp" + std::to_string(r), dcr::dtype::bf16,
                           static_cast<std::uint64_t>(local_groups * group_rows * s.hidden)});
  for (const char* p : {"q_proj", "k_proj", "v_proj"})
    task.outputs.push_back({reg.id(layer + "self_attn." + p + ".weight"), {}});
  task.convert = [s, local_groups, group_rows](std::size_t o, byte_spans inputs,
                                               std::span<std::byte> dst) {
    auto out = dcr::words_of<std::uint16_t>(dst);
    const std::int64_t qd = s.q_per_group * s.head_dim, d = s.head_dim;
    for (int r = 0; r < s.tp; ++r) {
      const auto in = dcr::words_of<std::uint16_t>(inputs[r]);
      for (std::int64_t g = 0; g < local_groups; ++g) {
        const std::int64_t global = r * local_groups + g, base = g * group_rows;
        if (o == 0) copy_rows(in, base, out, global * qd, qd, s.hidden);
        if (o == 1) copy_rows(in, base + qd, out, global * d, d, s.hidden);
        if (o == 2) copy_rows(in, base + qd + d, out, global * d, d, s.hidden);
      }
    }
  };
  return task;
}

/// Canonical bf16(w_fp32 * lambda) for every w sharing one fp32 lambda (a quantization-style
/// scale); output i depends on input i and on lambda (the last input).
dcr::residual_task scaled_task(const dcr::tensor_registry& reg,
                               const std::vector<std::string>& outs) {
  dcr::residual_task task;
  task.name = "scaled";
  for (const auto& name : outs) {
    const auto id = reg.id(name);
    task.inputs.push_back(
        {name + ".fp32", dcr::dtype::f32, static_cast<std::uint64_t>(reg.at(id).numel())});
  }
  const auto lambda = static_cast<std::uint32_t>(outs.size());
  task.inputs.push_back({"scale.lambda", dcr::dtype::f32, 1});
  for (std::uint32_t i = 0; i < outs.size(); ++i)
    task.outputs.push_back({reg.id(outs[i]), {i, lambda}});
  task.convert = [lambda](std::size_t o, byte_spans inputs, std::span<std::byte> dst) {
    const auto w = dcr::words_of<std::uint32_t>(inputs[o]);
    const float l = dcr::bit_cast<float>(dcr::words_of<std::uint32_t>(inputs[lambda])[0]);
    auto out = dcr::words_of<std::uint16_t>(dst);
    for (std::size_t j = 0; j < out.size(); ++j)
      out[j] = dcr::float_to_bf16(dcr::bit_cast<float>(w[j]) * l);
  };
  return task;
}

}  // namespace

TEST_CASE("fused QKV source converted to canonical q/k/v, mixed with affine tasks") {
  const qkv_shape s;
  const std::int64_t q_rows = s.groups * s.q_per_group * s.head_dim,
                     kv_rows = s.groups * s.head_dim;
  const std::string layer = "model.layers.0.";
  rig g({{layer + "self_attn.q_proj.weight", dcr::dtype::bf16, {q_rows, s.hidden}},
         {layer + "self_attn.k_proj.weight", dcr::dtype::bf16, {kv_rows, s.hidden}},
         {layer + "self_attn.v_proj.weight", dcr::dtype::bf16, {kv_rows, s.hidden}},
         {layer + "self_attn.o_proj.weight", dcr::dtype::bf16, {s.hidden, q_rows}},
         {layer + "input_layernorm.weight", dcr::dtype::f32, {s.hidden}}});
  const auto task = fused_qkv_task(g.registry, layer, s);
  std::vector<std::size_t> fused;
  for (const auto& in : task.inputs) fused.push_back(g.add_source(in.name, in.type, in.elements));
  g.add_residual(task, fused);
  std::vector<std::size_t> o_proj;
  const auto o_id = g.registry.id(layer + "self_attn.o_proj.weight");
  for (int r = 0; r < s.tp; ++r) {
    dcr::affine_task t;
    t.shard_name = layer + "o_proj.tp" + std::to_string(r);
    t.mapping = dcr::column_split(g.registry.at(o_id).shape, s.tp, r);
    t.targets = {o_id};
    o_proj.push_back(g.add_source(t.shard_name, t.type, t.local_size()));
    g.add_affine(t, o_proj.back());
  }
  dcr::affine_task norm;
  norm.shard_name = layer + "input_layernorm";
  norm.type = dcr::dtype::f32;
  norm.mapping = dcr::replicated(static_cast<std::uint64_t>(s.hidden));
  norm.targets = {g.registry.id(layer + "input_layernorm.weight")};
  const auto norm_src =
      g.add_source(norm.shard_name, norm.type, static_cast<std::uint64_t>(s.hidden));
  g.add_affine(norm, norm_src);
  g.start(2, default_receivers);
  REQUIRE(g.verify() == "");
  {
    // The split itself: KV group 2 lives on rank 1 (local group 0), whose block holds the
    // group's q rows, then its k rows, then its v rows.
    const auto canonical = g.assemble();
    const std::int64_t qd = s.q_per_group * s.head_dim, row = s.hidden * 2;
    const auto* block = g.sources[fused[1]].bytes.data();
    const auto& q = canonical[g.registry.id(layer + "self_attn.q_proj.weight")];
    const auto& k = canonical[g.registry.id(layer + "self_attn.k_proj.weight")];
    const auto& v = canonical[g.registry.id(layer + "self_attn.v_proj.weight")];
    CHECK(std::memcmp(q.data() + 2 * qd * row, block, static_cast<std::size_t>(qd * row)) == 0);
    CHECK(std::memcmp(k.data() + 2 * s.head_dim * row, block + qd * row,
                      static_cast<std::size_t>(s.head_dim * row)) == 0);
    CHECK(std::memcmp(v.data() + 2 * s.head_dim * row, block + (qd + s.head_dim) * row,
                      static_cast<std::size_t>(s.head_dim * row)) == 0);
  }
  const auto qkv =
      names({"model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.0.self_attn.v_proj.weight"});

  // Only TP rank 0's fused block changed: q, k and v all depend on it.
  g.perturb(fused[0], 0.05);
  g.perturb(o_proj[1], 0.02);
  auto report = g.refit();
  require_committed_once(report);
  CHECK(g.rebuilt_names() == qkv);
  CHECK(report.attempts[0].owners.residual_conversions == 3);
  CHECK(report.attempts[0].owners.residual_changed_inputs == 1);
  CHECK(report.attempts[0].owners.residual_changed_elements > 0);
  CHECK(g.verify() == "");

  // Only affine shards changed: no conversion runs.
  g.perturb(norm_src, 0.5);
  report = g.refit();
  require_committed_once(report);
  CHECK(g.rebuilt_names().empty());
  CHECK(report.attempts[0].owners.residual_conversions == 0);
  CHECK(report.attempts[0].owners.residual_items == 0);
  CHECK(report.attempts[0].records > 0);
  CHECK(g.verify() == "");

  // One word of rank 1's k rows of its first group: three rebuilds, one changed element.
  const std::int64_t k_row = s.q_per_group * s.head_dim;
  g.perturb_word(fused[1], static_cast<std::size_t>(k_row * s.hidden + 3));
  report = g.refit();
  require_committed_once(report);
  CHECK(g.rebuilt_names() == qkv);
  CHECK(report.attempts[0].owners.residual_changed_elements == 1);
  CHECK(report.attempts[0].owners.residual_items == 1);
  CHECK(g.verify() == "");

  // Everything at once, several times, then nothing.
  for (int step = 0; step < 3; ++step) {
    for (auto f : fused) g.perturb(f, 0.01 * (step + 1));
    for (auto f : o_proj) g.perturb(f, 0.01);
    require_committed_once(g.refit());
    CHECK(g.verify() == "");
  }
  report = g.refit();
  require_committed_once(report);
  CHECK(report.attempts[0].records == 0);
  CHECK(report.attempts[0].owners.residual_conversions == 0);
  CHECK(g.version() == 7);
}

TEST_CASE("stacked experts [E, out, in] per EP rank converted to per-expert tensors") {
  const std::int64_t experts = 6, ep = 2, local = experts / ep, out = 8, in = 12;
  std::vector<dcr::canonical_tensor> tensors;
  auto expert_name = [](std::int64_t e) {
    return "model.layers.0.mlp.experts." + std::to_string(e) + ".down_proj.weight";
  };
  for (std::int64_t e = 0; e < experts; ++e)
    tensors.push_back({expert_name(e), dcr::dtype::bf16, {out, in}});
  rig g(tensors, 2);
  dcr::residual_task task;
  task.name = "model.layers.0.mlp.experts.down_proj";
  std::vector<std::size_t> stacks;
  for (std::int64_t r = 0; r < ep; ++r) {
    task.inputs.push_back({"experts.ep" + std::to_string(r), dcr::dtype::bf16,
                           static_cast<std::uint64_t>(local * out * in)});
    stacks.push_back(
        g.add_source(task.inputs.back().name, dcr::dtype::bf16, task.inputs.back().elements));
  }
  for (std::int64_t e = 0; e < experts; ++e)
    task.outputs.push_back(
        {g.registry.id(expert_name(e)), {static_cast<std::uint32_t>(e / local)}});
  task.convert = [local, out, in](std::size_t o, byte_spans inputs, std::span<std::byte> dst) {
    const auto e = static_cast<std::int64_t>(o);
    const auto stack = dcr::words_of<std::uint16_t>(inputs[static_cast<std::size_t>(e / local)]);
    copy_rows(stack, (e % local) * out, dcr::words_of<std::uint16_t>(dst), 0, out, in);
  };
  g.add_residual(task, stacks);
  g.start(3, default_receivers);
  REQUIRE(g.verify() == "");

  // A change in EP rank 1's stack rebuilds only its experts; only expert 4 differs.
  g.perturb_word(stacks[1], static_cast<std::size_t>(1 * out * in + 5));
  auto report = g.refit();
  require_committed_once(report);
  CHECK(g.rebuilt_names() == std::set<std::string>{expert_name(3), expert_name(4), expert_name(5)});
  CHECK(report.attempts[0].owners.residual_items == 1);
  CHECK(report.attempts[0].records == 1);
  CHECK(g.verify() == "");

  g.perturb(stacks[0], 0.03);
  report = g.refit();
  require_committed_once(report);
  CHECK(g.rebuilt_names() == std::set<std::string>{expert_name(0), expert_name(1), expert_name(2)});
  CHECK(g.verify() == "");

  for (int step = 0; step < 3; ++step) {
    for (auto s : stacks) g.perturb(s, 0.02);
    report = g.refit();
    require_committed_once(report);
    CHECK(report.attempts[0].owners.residual_conversions == static_cast<std::uint64_t>(experts));
    CHECK(g.verify() == "");
  }
}

TEST_CASE("tied weights: one source shard produces embed and lm_head") {
  const std::int64_t vocab = 40, hidden = 16;
  rig g({{"model.embed_tokens.weight", dcr::dtype::bf16, {vocab, hidden}},
         {"lm_head.weight", dcr::dtype::bf16, {vocab, hidden}}},
        3);
  dcr::residual_task task;
  task.name = "tied_embedding";
  task.inputs.push_back(
      {"embedding", dcr::dtype::bf16, static_cast<std::uint64_t>(vocab * hidden)});
  task.outputs = {{g.registry.id("model.embed_tokens.weight"), {}},
                  {g.registry.id("lm_head.weight"), {}}};
  task.convert = [](std::size_t, byte_spans inputs, std::span<std::byte> dst) {
    std::memcpy(dst.data(), inputs[0].data(), dst.size());
  };
  const auto src =
      g.add_source("embedding", dcr::dtype::bf16, static_cast<std::uint64_t>(vocab * hidden));
  g.add_residual(task, {src});
  g.start(2, default_receivers);
  for (int step = 0; step < 4; ++step) {
    g.perturb(src, 0.02 * step + 0.001);
    const auto report = g.refit();
    require_committed_once(report);
    CHECK(g.rebuilt_names() == names({"lm_head.weight", "model.embed_tokens.weight"}));
    CHECK(report.attempts[0].owners.residual_items == 2);
    // Both tensors carry the same changed elements.
    CHECK(report.attempts[0].owners.residual_changed_elements % 2 == 0);
    CHECK(report.attempts[0].records == report.attempts[0].owners.residual_changed_elements);
    CHECK(g.verify() == "");
  }
}

TEST_CASE("a changed shared scale factor rebuilds, compares and sends every tensor it scales") {
  const std::vector<std::string> outs = {"model.layers.0.mlp.down_proj.weight",
                                         "model.layers.0.mlp.gate_proj.weight",
                                         "model.layers.0.mlp.up_proj.weight"};
  rig g({{outs[0], dcr::dtype::bf16, {12, 10}},
         {outs[1], dcr::dtype::bf16, {10, 12}},
         {outs[2], dcr::dtype::bf16, {7, 12}}},
        4);
  const auto task = scaled_task(g.registry, outs);
  std::vector<std::size_t> inputs;
  for (const auto& in : task.inputs) inputs.push_back(g.add_source(in.name, in.type, in.elements));
  const std::size_t lambda = inputs.back();
  g.sources[lambda].words<std::uint32_t>()[0] = dcr::bit_cast<std::uint32_t>(0.75f);
  g.add_residual(task, inputs);
  g.start(2, default_receivers);
  REQUIRE(g.verify() == "");
  auto set_lambda = [&](float v) {
    g.sources[lambda].words<std::uint32_t>()[0] = dcr::bit_cast<std::uint32_t>(v);
  };

  // Only lambda changes: every scaled tensor is rebuilt, and each one changed.
  set_lambda(0.8125f);
  auto report = g.refit();
  require_committed_once(report);
  CHECK(g.rebuilt_names() == std::set<std::string>(outs.begin(), outs.end()));
  CHECK(report.attempts[0].owners.residual_changed_inputs == 1);
  CHECK(report.attempts[0].owners.residual_items == 3);
  CHECK(g.verify() == "");

  // Only the second weight changes: only its tensor is rebuilt.
  g.perturb(inputs[1], 0.1);
  report = g.refit();
  require_committed_once(report);
  CHECK(g.rebuilt_names() == std::set<std::string>{outs[1]});
  CHECK(g.verify() == "");

  // A +0 weight turned -0: equal as floats, different bits, so a real change of the canonical
  // bf16(-0 * lambda) = -0.
  g.sources[inputs[2]].words<std::uint32_t>()[4] = 0x00000000u;
  require_committed_once(g.refit());
  g.sources[inputs[2]].words<std::uint32_t>()[4] = 0x80000000u;
  report = g.refit();
  require_committed_once(report);
  CHECK(g.rebuilt_names() == std::set<std::string>{outs[2]});
  CHECK(report.attempts[0].owners.residual_changed_elements == 1);
  CHECK(g.verify() == "");

  // lambda moves by one fp32 ulp: every tensor is rebuilt and compared, but bf16 rounding hides
  // nearly every change; whatever differs is sent.
  set_lambda(std::nextafter(0.8125f, 1.0f));
  report = g.refit();
  require_committed_once(report);
  CHECK(report.attempts[0].owners.residual_conversions == 3);
  CHECK(report.attempts[0].records == report.attempts[0].owners.residual_changed_elements);
  CHECK(g.verify() == "");

  // Nothing changed: nothing rebuilt.
  report = g.refit();
  require_committed_once(report);
  CHECK(g.rebuilt_names().empty());
  CHECK(report.attempts[0].records == 0);
}

TEST_CASE("padding removal: vocab rows padded to a multiple of 64 per TP rank source") {
  const std::int64_t vocab = 100, padded = 128, hidden = 8;
  const int tp = 2;
  const std::int64_t local_rows = padded / tp;
  rig g({{"lm_head.weight", dcr::dtype::bf16, {vocab, hidden}}}, 5);
  dcr::residual_task task;
  task.name = "lm_head.unpad";
  std::vector<std::size_t> shards;
  for (int r = 0; r < tp; ++r) {
    task.inputs.push_back({"output_layer.tp" + std::to_string(r), dcr::dtype::bf16,
                           static_cast<std::uint64_t>(local_rows * hidden)});
    shards.push_back(
        g.add_source(task.inputs.back().name, dcr::dtype::bf16, task.inputs.back().elements));
  }
  task.outputs = {{g.registry.id("lm_head.weight"), {}}};
  task.convert = [=](std::size_t, byte_spans inputs, std::span<std::byte> dst) {
    auto out = dcr::words_of<std::uint16_t>(dst);
    for (int r = 0; r < tp; ++r) {
      const std::int64_t first = r * local_rows;
      const std::int64_t rows = std::clamp<std::int64_t>(vocab - first, 0, local_rows);
      copy_rows(dcr::words_of<std::uint16_t>(inputs[r]), 0, out, first, rows, hidden);
    }
  };
  g.add_residual(task, shards);
  g.start(1, default_receivers);

  // Only padding rows (global rows 100..127 live on rank 1 rows 36..63) change: the output is
  // rebuilt and compared, and nothing is sent.
  for (std::int64_t row = vocab - local_rows; row < local_rows; ++row)
    g.perturb_word(shards[1], static_cast<std::size_t>(row * hidden + row % hidden));
  auto report = g.refit();
  require_committed_once(report);
  CHECK(report.attempts[0].owners.residual_conversions == 1);
  CHECK(report.attempts[0].owners.residual_changed_elements == 0);
  CHECK(report.attempts[0].records == 0);
  CHECK(report.attempts[0].payloads == 0);
  CHECK(g.verify() == "");

  for (int step = 0; step < 3; ++step) {
    g.perturb(shards[0], 0.05);
    g.perturb(shards[1], 0.05);
    report = g.refit();
    require_committed_once(report);
    CHECK(report.attempts[0].owners.residual_changed_elements > 0);
    CHECK(g.verify() == "");
  }
}

TEST_CASE("the residual baseline moves only at the joint commit; a failed attempt is repaired") {
  const std::vector<std::string> outs = {"a.weight", "b.weight"};
  rig g({{outs[0], dcr::dtype::bf16, {16, 16}},
         {outs[1], dcr::dtype::bf16, {8, 32}},
         {"c.weight", dcr::dtype::bf16, {24, 8}}},
        6);
  const auto task = scaled_task(g.registry, outs);
  std::vector<std::size_t> inputs;
  for (const auto& in : task.inputs) inputs.push_back(g.add_source(in.name, in.type, in.elements));
  g.sources[inputs.back()].words<std::uint32_t>()[0] = dcr::bit_cast<std::uint32_t>(1.5f);
  g.add_residual(task, inputs);
  dcr::affine_task c;
  c.shard_name = "c";
  c.mapping = dcr::replicated(24 * 8);
  c.targets = {g.registry.id("c.weight")};
  const auto c_src = g.add_source("c", dcr::dtype::bf16, 24 * 8);
  g.add_affine(c, c_src);
  g.start(1, default_receivers);
  auto& o = *g.owners.at(0);
  REQUIRE(o.residual_tasks().size() == 1);
  REQUIRE(o.tasks().size() == 1);

  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    std::vector<std::vector<std::byte>> baseline_before, inputs_before;
    for (std::size_t k = 0; k < outs.size(); ++k) {
      const auto b = o.residual_baseline(0, k);
      baseline_before.emplace_back(b.begin(), b.end());
    }
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      const auto b = o.residual_input_copy(0, k);
      inputs_before.emplace_back(b.begin(), b.end());
    }
    g.perturb(inputs[0], 0.1);
    g.sources[inputs.back()].words<std::uint32_t>()[0] ^= 0x10000u;  // lambda too
    g.perturb(c_src, 0.05);
    dcr::refit_options ro;
    ro.bucket_bytes = 64;  // several payloads, so a receiver can fail halfway through
    bool checked_mid_transition = false;
    const auto report = g.refit(ro, [&](std::uint32_t attempt, std::size_t r, std::size_t k) {
      if (attempt == 1 && !checked_mid_transition) {
        // Attempt 0 built and sent its records but did not commit: the owner's baseline and
        // input copies still hold version v.
        checked_mid_transition = true;
        for (std::size_t q = 0; q < outs.size(); ++q) {
          const auto b = o.residual_baseline(0, q);
          CHECK(
              std::equal(b.begin(), b.end(), baseline_before[q].begin(), baseline_before[q].end()));
        }
        for (std::size_t q = 0; q < inputs.size(); ++q) {
          const auto b = o.residual_input_copy(0, q);
          CHECK(std::equal(b.begin(), b.end(), inputs_before[q].begin(), inputs_before[q].end()));
        }
      }
      return attempt == 0 && r == (round % 2 == 0 ? 1u : 3u) && k == 1
                 ? dcr::testing::delivery_fault::drop
                 : dcr::testing::delivery_fault::none;
    });
    REQUIRE(report.committed);
    REQUIRE(report.attempts.size() == 2);
    CHECK(checked_mid_transition);
    CHECK_FALSE(report.attempts[0].succeeded);
    CHECK(report.attempts[1].policy == dcr::encoding_policy::overwrite_only);
    // The retry rebuilds exactly the same changed set.
    CHECK(report.attempts[1].records == report.attempts[0].records);
    CHECK(report.attempts[1].owners.residual_conversions == 2);
    CHECK(g.verify() == "");
  }

  // A transition that fails for good leaves the baseline at the committed version; the next
  // call continues it with an overwrite attempt (receivers may hold partial writes) and
  // converges.
  std::vector<std::vector<std::byte>> committed_baseline;
  for (std::size_t k = 0; k < outs.size(); ++k) {
    const auto b = o.residual_baseline(0, k);
    committed_baseline.emplace_back(b.begin(), b.end());
  }
  g.perturb(inputs[1], 0.2);
  g.sources[inputs.back()].words<std::uint32_t>()[0] ^= 0x20000u;
  dcr::refit_options once;
  once.max_attempts = 1;
  once.bucket_bytes = 64;
  const auto failed = g.refit(once, [](std::uint32_t, std::size_t r, std::size_t k) {
    return r == 0 && k == 1 ? dcr::testing::delivery_fault::drop : dcr::testing::delivery_fault::none;
  });
  REQUIRE_FALSE(failed.committed);
  CHECK(g.verify(false) != "");  // receiver 0 stopped halfway
  for (std::size_t k = 0; k < outs.size(); ++k) {
    const auto b = o.residual_baseline(0, k);
    CHECK(
        std::equal(b.begin(), b.end(), committed_baseline[k].begin(), committed_baseline[k].end()));
  }
  const auto retried = g.refit();
  REQUIRE(retried.committed);
  REQUIRE(retried.attempts.size() == 1);
  CHECK(retried.attempts[0].attempt == 1);
  CHECK(retried.attempts[0].policy == dcr::encoding_policy::overwrite_only);
  CHECK(g.verify() == "");
  g.perturb(inputs[0], 0.1);
  require_committed_once(g.refit());
  CHECK(g.verify() == "");
}

TEST_CASE("one owner mixes affine and residual tasks: items merge in tensor id order") {
  // Names chosen so residual and affine tensors interleave in id order.
  rig g({{"a.affine", dcr::dtype::bf16, {8, 8}},
         {"b.residual", dcr::dtype::bf16, {8, 8}},
         {"c.affine", dcr::dtype::f32, {4, 8}},
         {"d.residual", dcr::dtype::bf16, {8, 8}}},
        7);
  for (const char* name : {"a.affine", "c.affine"}) {
    const auto id = g.registry.id(name);
    for (int r = 0; r < 2; ++r) {
      dcr::affine_task t;
      t.shard_name = std::string(name) + ".tp" + std::to_string(r);
      t.type = g.registry.at(id).type;
      t.mapping = dcr::row_split(g.registry.at(id).shape, 2, r);
      t.targets = {id};
      g.add_affine(t, g.add_source(t.shard_name, t.type, t.local_size()));
    }
  }
  dcr::residual_task tied;
  tied.name = "tied";
  tied.inputs = {{"shared", dcr::dtype::bf16, 64}};
  tied.outputs = {{g.registry.id("d.residual"), {}}, {g.registry.id("b.residual"), {}}};
  tied.convert = [](std::size_t, byte_spans in, std::span<std::byte> dst) {
    std::memcpy(dst.data(), in[0].data(), dst.size());
  };
  const auto shared = g.add_source("shared", dcr::dtype::bf16, 64);
  g.add_residual(tied, {shared});
  g.start(1, default_receivers);
  REQUIRE(g.owners.size() == 1);
  auto& o = *g.owners[0];
  CHECK(o.tasks().size() == 4);
  CHECK(o.residual_input_count() == 1);
  CHECK(o.tracker_bytes() == 64 * 2 + 32 * 4 + 64 * 2);
  CHECK(o.residual_baseline_bytes() == 2 * 64 * 2);

  for (std::size_t s = 0; s < g.sources.size(); ++s) g.perturb(s, 0.2);
  // Build directly to look at the items, then let the coordinator run the real transition
  // (which rebuilds from the same candidates).
  const auto& items = o.build_items(g.bindings[0].candidates, dcr::encoding_policy::xor_only,
                                    g.bindings[0].residual_inputs);
  REQUIRE(items.size() == 4);
  for (std::size_t k = 0; k < items.size(); ++k) CHECK(items[k].tensor == k);
  CHECK(items[0].enc == dcr::encoding::xor_mask);
  CHECK(items[1].enc == dcr::encoding::overwrite);  // residual
  CHECK(items[2].enc == dcr::encoding::xor_mask);
  CHECK(items[3].enc == dcr::encoding::overwrite);  // residual
  CHECK(items[1].indices == items[3].indices);      // tied: the same elements changed
  CHECK(o.stats().residual_items == 2);
  CHECK(o.stats().residual_conversions == 2);
  auto report = g.refit();
  require_committed_once(report);
  CHECK(g.verify() == "");
  for (int step = 0; step < 3; ++step) {
    for (std::size_t s = 0; s < g.sources.size(); ++s)
      if ((s + static_cast<std::size_t>(step)) % 2 == 0) g.perturb(s, 0.05);
    require_committed_once(g.refit());
    CHECK(g.verify() == "");
  }
}

TEST_CASE("tensors a receiver takes only as overwrites are encoded as overwrites by every owner") {
  rig g({{"a.weight", dcr::dtype::bf16, {16, 8}},
         {"b.weight", dcr::dtype::bf16, {16, 8}},
         {"c.weight", dcr::dtype::bf16, {16, 8}},
         {"tied.left", dcr::dtype::bf16, {4, 8}},
         {"tied.right", dcr::dtype::bf16, {4, 8}}},
        8);
  for (const char* name : {"a.weight", "b.weight", "c.weight"}) {
    const auto id = g.registry.id(name);
    for (int r = 0; r < 2; ++r) {
      dcr::affine_task t;
      t.shard_name = std::string(name) + ".tp" + std::to_string(r);
      t.mapping = dcr::row_split(g.registry.at(id).shape, 2, r);
      t.targets = {id};
      g.add_affine(t, g.add_source(t.shard_name, t.type, t.local_size()));
    }
  }
  dcr::residual_task tied;
  tied.name = "tied";
  tied.inputs = {{"shared", dcr::dtype::bf16, 32}};
  tied.outputs = {{g.registry.id("tied.left"), {}}, {g.registry.id("tied.right"), {}}};
  tied.convert = [](std::size_t, byte_spans in, std::span<std::byte> dst) {
    std::memcpy(dst.data(), in[0].data(), dst.size());
  };
  g.add_residual(tied, {g.add_source("shared", dcr::dtype::bf16, 32)});
  auto receivers = default_receivers;
  receivers[1].overwrite_only = {"c.weight"};
  receivers[3].overwrite_only = {"a.weight", "c.weight", "tied.left"};
  g.start(2, receivers);
  REQUIRE(g.owners.size() == 2);

  for (int step = 0; step < 3; ++step) {
    for (std::size_t s = 0; s < g.sources.size(); ++s) g.perturb(s, 0.1);
    dcr::refit_options ro;
    ro.policy = dcr::encoding_policy::xor_only;
    const auto base = g.version();
    ro.keep_payloads = true;  // inspected below
    const auto report = g.refit(ro);
    require_committed_once(report);
    CHECK(report.overwrite_only_tensors == std::vector<tensor_id>{g.registry.id("a.weight"),
                                                                  g.registry.id("c.weight"),
                                                                  g.registry.id("tied.left")});
    CHECK(report.attempts[0].owners.forced_overwrite_items >= 2);  // a and c, from each owner of a part
    CHECK(g.verify() == "");
    // What went over the wire, from every owner.
    dcr::payload_decoder decoder;
    std::vector<dcr::item> items;
    std::vector<std::byte> bytes;
    std::map<std::string, std::set<dcr::encoding>> seen;
    for (const auto& listing : g.driver->store().list({base, base + 1, 0}))
      for (const auto& id : listing.ids) {
      REQUIRE(g.driver->store().get(id, bytes) == dcr::get_status::found);
      decoder.decode(bytes, g.registry, items);
      for (const auto& it : items) seen[g.registry.at(it.tensor).name].insert(it.enc);
      }
    using enc_set = std::set<dcr::encoding>;
    REQUIRE(seen.size() == 5);
    CHECK(seen["a.weight"] == enc_set{dcr::encoding::overwrite});
    CHECK(seen["b.weight"] == enc_set{dcr::encoding::xor_mask});
    CHECK(seen["c.weight"] == enc_set{dcr::encoding::overwrite});
    CHECK(seen["tied.left"] == enc_set{dcr::encoding::overwrite});
    CHECK(seen["tied.right"] == enc_set{dcr::encoding::overwrite});
  }
}

TEST_CASE("residual owners are chosen by stable name hash among the eligible ranks") {
  const std::vector<std::uint32_t> ranks = {3, 1, 2, 0, 2};
  std::map<std::uint32_t, int> load;
  for (int k = 0; k < 200; ++k) {
    const std::string name = "model.layers." + std::to_string(k) + ".self_attn.qkv";
    const auto owner = dcr::residual_owner(name, ranks);
    const std::vector<std::uint32_t> reordered = {0, 1, 2, 3};
    CHECK(dcr::residual_owner(name, reordered) == owner);  // order and duplicates do not matter
    CHECK(owner == dcr::stable_name_hash(name) % 4);
    ++load[owner];
  }
  CHECK(load.size() == 4);
  for (const auto& [rank, n] : load) CHECK(n > 20);
  const std::vector<std::uint32_t> only = {7};
  CHECK(dcr::residual_owner("x", only) == 7);
  std::vector<dcr::residual_holding> holdings = {{"t1", {0, 1}}, {"t2", {5}}};
  const auto owners = dcr::assign_residual_owners(holdings);
  CHECK(owners[0] == dcr::residual_owner("t1", holdings[0].eligible));
  CHECK(owners[1] == 5);
  holdings.push_back({"t1", {2}});
  CHECK(contains(error_text([&] { (void)dcr::assign_residual_owners(holdings); }),
                 "duplicate residual task name 't1'"));
  CHECK(contains(error_text([] { (void)dcr::residual_owner("lonely", {}); }),
                 "residual task 'lonely' has no eligible owner"));
}

TEST_CASE("affine coverage reports checkpoint bytes by task kind") {
  const dcr::tensor_registry reg({{"w.affine", dcr::dtype::bf16, {100, 10}},
                                  {"w.residual", dcr::dtype::bf16, {4, 10}},
                                  {"norm", dcr::dtype::f32, {10}},
                                  {"untouched", dcr::dtype::bf16, {3}}});
  std::vector<dcr::affine_task> affine;
  for (int r = 0; r < 2; ++r) {
    dcr::affine_task t;
    t.shard_name = "w.tp" + std::to_string(r);
    t.mapping = dcr::row_split(reg.at(reg.id("w.affine")).shape, 2, r);
    t.targets = {reg.id("w.affine")};
    affine.push_back(t);
  }
  for (int r = 0; r < 2; ++r) {  // replicated on two ranks: counted once
    dcr::affine_task t;
    t.shard_name = "norm.tp" + std::to_string(r);
    t.type = dcr::dtype::f32;
    t.mapping = dcr::replicated(10);
    t.targets = {reg.id("norm")};
    affine.push_back(t);
  }
  dcr::residual_task res;
  res.name = "r";
  res.inputs = {{"src", dcr::dtype::bf16, 48}};
  res.outputs = {{reg.id("w.residual"), {}}};
  res.convert = [](std::size_t, byte_spans in, std::span<std::byte> dst) {
    std::memcpy(dst.data(), in[0].data(), dst.size());
  };
  const std::vector<dcr::residual_task> residual = {res};
  const auto c = dcr::measure_coverage(reg, affine, residual);
  CHECK(c.affine_bytes == 2000 + 40);
  CHECK(c.residual_bytes == 80);
  CHECK(c.uncovered_bytes == 6);
  CHECK(c.checkpoint_bytes == 2000 + 80 + 40 + 6);
  CHECK(c.affine_share() == doctest::Approx(2040.0 / 2120.0));
  CHECK(dcr::task_coverage{}.affine_share() == 1.0);
}

TEST_CASE("bad residual tasks and shards are refused with clear errors") {
  const dcr::tensor_registry reg(
      {{"x", dcr::dtype::bf16, {4, 4}}, {"y", dcr::dtype::bf16, {4, 4}}});
  auto copy_task = [&](std::string name, std::vector<tensor_id> outs) {
    dcr::residual_task t;
    t.name = std::move(name);
    t.inputs = {{"src", dcr::dtype::bf16, 16}};
    for (auto id : outs) t.outputs.push_back({id, {}});
    t.convert = [](std::size_t, byte_spans in, std::span<std::byte> dst) {
      std::memcpy(dst.data(), in[0].data(), dst.size());
    };
    return t;
  };
  auto expect = [&](std::vector<dcr::affine_task> affine, std::vector<dcr::residual_task> residual,
                    dcr::errc code, const char* text) {
    CAPTURE(text);
    try {
      dcr::owner o(reg, 0, std::move(affine), std::move(residual));
      FAIL("accepted a bad task set");
    } catch (const dcr::error& e) {
      CHECK(e.dcr_code() == code);
      CHECK(std::string(e.what()).find(text) != std::string::npos);
    }
  };
  const auto x = reg.id("x"), y = reg.id("y");

  SUBCASE("an output claimed by two residual tasks") {
    expect({}, {copy_task("first", {x}), copy_task("second", {y, x})}, dcr::errc::invalid_argument,
           "canonical tensor 'x' is produced by two residual tasks, 'first' and 'second'");
  }
  SUBCASE("an output also targeted by an affine task") {
    dcr::affine_task a;
    a.shard_name = "x.shard";
    a.mapping = dcr::replicated(16);
    a.targets = {x};
    expect({a}, {copy_task("conv", {x})}, dcr::errc::invalid_argument,
           "'x' is produced by residual task 'conv' and by affine task 'x.shard'");
  }
  SUBCASE("an unknown tensor") {
    expect({}, {copy_task("conv", {9})}, dcr::errc::unknown_tensor,
           "residual task 'conv': output 0 names tensor id 9");
  }
  SUBCASE("an output listed twice, a bad dependency, no conversion, no inputs, a reused name") {
    expect({}, {copy_task("twice", {x, x})}, dcr::errc::invalid_argument,
           "output 'x' listed twice");
    auto bad_dep = copy_task("dep", {x});
    bad_dep.outputs[0].depends_on = {1};
    expect({}, {bad_dep}, dcr::errc::invalid_argument,
           "'x' depends on input 1, the task has 1 inputs");
    auto no_conv = copy_task("noconv", {x});
    no_conv.convert = nullptr;
    expect({}, {no_conv}, dcr::errc::invalid_argument, "residual task 'noconv': no conversion");
    auto no_inputs = copy_task("noin", {x});
    no_inputs.inputs.clear();
    expect({}, {no_inputs}, dcr::errc::invalid_argument, "residual task 'noin': no inputs");
    expect({}, {copy_task("same", {x}), copy_task("same", {y})}, dcr::errc::invalid_argument,
           "residual task name 'same' used by two tasks");
  }
  SUBCASE("shards of the wrong size or count change nothing") {
    dcr::owner o(reg, 0, {}, {copy_task("conv", {x, y})});
    std::vector<std::uint16_t> committed(16, 0x3f80), candidate(16, 0x4000), small(15, 0);
    const std::vector<std::span<const std::byte>> none;
    std::vector<std::span<const std::byte>> good = {std::as_bytes(std::span(committed))};
    CHECK(contains(error_text([&] { o.build_items(none, dcr::encoding_policy::mixed, good); }),
                   "before initialize"));
    o.initialize(none, good);
    std::vector<std::span<const std::byte>> wrong = {std::as_bytes(std::span(small))};
    try {
      (void)o.build_items(none, dcr::encoding_policy::mixed, wrong);
      FAIL("accepted a short input");
    } catch (const dcr::error& e) {
      CHECK(e.dcr_code() == dcr::errc::shape_mismatch);
      CHECK(std::string(e.what()).find(
                "residual task 'conv' input 'src' has 30 bytes, expected 32") != std::string::npos);
    }
    CHECK(contains(error_text([&] { o.build_items(none, dcr::encoding_policy::mixed, none); }),
                   "expected 1 residual inputs, got 0"));
    CHECK(contains(error_text([&] { o.commit(none, good); }), "without a built changed set"));
    const std::vector<tensor_id> unknown = {5};
    CHECK(contains(error_text([&] { o.set_overwrite_only(unknown); }), "tensor id 5"));
    // Nothing moved: the baseline is still the committed tensor.
    const auto b = o.residual_baseline(0, 0);
    CHECK(std::memcmp(b.data(), committed.data(), b.size()) == 0);
    // And a good build still works from there.
    std::vector<std::span<const std::byte>> next = {std::as_bytes(std::span(candidate))};
    const auto& items = o.build_items(none, dcr::encoding_policy::mixed, next);
    REQUIRE(items.size() == 2);
    CHECK(items[0].count() == 16);
    o.commit(none, next);
    CHECK(std::memcmp(o.residual_baseline(0, 1).data(), candidate.data(), 32) == 0);
    CHECK(std::memcmp(o.residual_input_copy(0, 0).data(), candidate.data(), 32) == 0);
  }
  SUBCASE("a conversion that throws propagates and commits nothing") {
    auto t = copy_task("flaky", {x});
    bool fail = false;
    t.convert = [&fail](std::size_t, byte_spans in, std::span<std::byte> dst) {
      if (fail) throw dcr::error(dcr::errc::invalid_argument, "flaky conversion");
      std::memcpy(dst.data(), in[0].data(), dst.size());
    };
    dcr::owner o(reg, 0, {}, {t});
    std::vector<std::uint16_t> committed(16, 0x3f80), candidate(16, 0x4000);
    const std::vector<std::span<const std::byte>> none;
    o.initialize(none,
                 std::vector<std::span<const std::byte>>{std::as_bytes(std::span(committed))});
    std::vector<std::span<const std::byte>> next = {std::as_bytes(std::span(candidate))};
    (void)o.build_items(none, dcr::encoding_policy::mixed, next);
    fail = true;
    CHECK(contains(error_text([&] { o.build_items(none, dcr::encoding_policy::mixed, next); }),
                   "flaky conversion"));
    CHECK(contains(error_text([&] { o.commit(none, next); }), "without a built changed set"));
    CHECK(std::memcmp(o.residual_baseline(0, 0).data(), committed.data(), 32) == 0);
  }
}
