// dcr/sim/deployment.hpp: a whole refit deployment in one process: the synthetic MoE trainer
// (tp x dp ranks; affine shards owned by dcr::assign_owners, residual tasks by their name-hash
// owner, dcr::assign_residual_owners), serving ranks running the synthetic engine's native loader
// (compiled apply path by default), and the protocol's agents composed in one process
// (dcr::in_process_refit: memory control plane and payload store). `dcr simulate`, the
// property tests and the benchmarks all drive refits through it, and it can check every receiver
// against a dense refit of the same candidate weights through the same loader.
//
// Defaults: Megatron trainer layout (fused QKV through a residual task, fused gate/up as a
// two-part affine task) and the serving engine layout (padded vocab-parallel embeddings, tied
// storage, cast norm copies, transposed router); trainer_layout::plain / engine_layout::plain
// select the plain layouts. Receivers may use different engine layouts
// (deployment_options::receiver_layouts); the coordinator tells owners the union of the tensors
// any receiver takes only as overwrites.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcr/protocol/in_process.hpp"
#include "dcr/sim/moe_engine.hpp"
#include "dcr/sim/moe_model.hpp"
#include "dcr/testing/faults.hpp"

namespace dcr::sim {

/// A dense refit of `rx`: every canonical tensor of `registry` loaded through the receiver's
/// native loader from `canonical[id]` (its canonical bytes, row-major).
template <class Receiver>
void dense_load_all(Receiver& rx, const tensor_registry& registry,
                    const std::vector<std::vector<std::byte>>& canonical) {
  for (std::size_t id = 0; id < registry.size(); ++id) {
    const auto& t = registry.at(static_cast<tensor_id>(id));
    visit_word(dtype_size(t.type), [&](auto w) {
      using W = decltype(w);
      rx.template dense_load<W>(static_cast<tensor_id>(id),
                                tensor_view<const W>::contiguous(
                                    reinterpret_cast<const W*>(canonical[id].data()), t.shape));
    });
  }
}

struct deployment_options {
  moe_config model;
  int trainer_tp = 2;
  int trainer_dp = 2;
  int receiver_tp = 4;
  std::uint64_t seed = 1;
  trainer_layout trainer = trainer_layout::megatron;
  engine_layout engine = engine_layout::serving;
  /// Per receiver rank (size receiver_tp) when not empty; otherwise every receiver uses `engine`.
  std::vector<engine_layout> receiver_layouts;
  /// The receivers' apply path (switchable later with in_process_deployment::set_apply_path).
  apply_path path = apply_path::compiled;
};

class in_process_deployment {
 public:
  using engine_receiver = receiver<moe_engine_loader>;

  /// Builds the trainer with synthetic version-0 weights. Call start() (after any edits to the
  /// trainer's words through trainer()) to initialize trackers and residual baselines, load
  /// receivers densely and create the commit record at version 0. Throws invalid_argument for
  /// receiver_layouts of the wrong size.
  explicit in_process_deployment(const deployment_options& options)
      : options_(options), registry_(options.model.canonical_tensors()),
        trainer_(options.model, registry_, options.trainer_tp, options.trainer_dp, options.seed,
                 options.trainer) {
    DCR_EXPECTS(options.receiver_layouts.empty() ||
                    options.receiver_layouts.size() == static_cast<std::size_t>(options.receiver_tp),
                errc::invalid_argument,
                "deployment: receiver_layouts must be empty or name one layout per receiver");
    DCR_EXPECTS(options.receiver_tp >= 1, errc::invalid_argument,
                "deployment: receiver_tp must be >= 1");
    canonical_.resize(registry_.size());
    for (std::size_t id = 0; id < registry_.size(); ++id) {
      canonical_[id].resize(static_cast<std::size_t>(registry_.at(static_cast<tensor_id>(id)).bytes()));
      canonical_spans_.emplace_back(canonical_[id]);
    }
  }
  in_process_deployment(const in_process_deployment&) = delete;
  in_process_deployment& operator=(const in_process_deployment&) = delete;

  void start() {
    DCR_EXPECTS(!started_, errc::not_ready, "deployment: start() called twice");
    const auto shards = trainer_.shards();
    const auto residual = trainer_.residual();
    const auto owner_of = trainer_.owners();
    const auto residual_owner_of = trainer_.residual_owners();
    std::map<std::uint32_t, std::pair<std::vector<std::size_t>, std::vector<std::size_t>>> owned;
    for (std::size_t i = 0; i < shards.size(); ++i) owned[owner_of[i]].first.push_back(i);
    for (std::size_t r = 0; r < residual.size(); ++r)
      owned[residual_owner_of[r]].second.push_back(r);
    for (const auto& [rank, lists] : owned) {
      std::vector<affine_task> tasks;
      std::vector<residual_task> residual_tasks;
      owner_binding binding{nullptr, {}, {}};
      for (auto i : lists.first) {
        tasks.push_back(shards[i].task);
        binding.candidates.push_back(trainer_.words(i));  // the trainer's live shards
      }
      for (auto r : lists.second) {
        residual_tasks.push_back(residual[r].task);
        for (std::size_t k = 0; k < residual[r].task.inputs.size(); ++k)
          binding.residual_inputs.push_back(trainer_.residual_words(r, k));
      }
      owners_.push_back(
          std::make_unique<owner>(registry_, rank, std::move(tasks), std::move(residual_tasks)));
      owners_.back()->initialize(binding.candidates, binding.residual_inputs);
      binding.owner_ptr = owners_.back().get();
      bindings_.push_back(std::move(binding));
    }
    trainer_.assemble_canonical(canonical_spans_);
    for (int r = 0; r < options_.receiver_tp; ++r) {
      receivers_.push_back(std::make_unique<rank_state>(options_.model, options_.receiver_tp, r,
                                                        receiver_layout(static_cast<std::size_t>(r)),
                                                        registry_, options_.path, true));
      dense_load_all(receivers_.back()->rx);
      endpoints_.push_back(&receivers_.back()->rx);
    }
    driver_ = std::make_unique<in_process_refit>(registry_, std::span<owner_binding>(bindings_),
                                                 std::span<receiver_endpoint* const>(endpoints_), 0);
    started_ = true;
  }

  [[nodiscard]] const deployment_options& options() const noexcept { return options_; }
  [[nodiscard]] const tensor_registry& registry() const noexcept { return registry_; }
  [[nodiscard]] synthetic_trainer& trainer() noexcept { return trainer_; }
  /// The payload store and control plane of the in-process agents (after start()).
  [[nodiscard]] memory_payload_store& store() { return driver_->store(); }
  [[nodiscard]] memory_control_plane& plane() { return driver_->plane(); }
  [[nodiscard]] std::size_t owner_count() const noexcept { return owners_.size(); }
  [[nodiscard]] const owner& owner_at(std::size_t k) const { return *owners_.at(k); }
  /// Owner k, e.g. to install a detect backend after start() (owner::set_detect_backend).
  [[nodiscard]] owner& owner_at(std::size_t k) { return *owners_.at(k); }
  [[nodiscard]] std::size_t receiver_count() const noexcept { return receivers_.size(); }
  [[nodiscard]] engine_receiver& receiver_at(std::size_t r) { return receivers_.at(r)->rx; }
  [[nodiscard]] moe_engine_storage& storage_at(std::size_t r) { return receivers_.at(r)->storage; }
  /// The engine layout of receiver `r`.
  [[nodiscard]] engine_layout receiver_layout(std::size_t r) const {
    return options_.receiver_layouts.empty() ? options_.engine : options_.receiver_layouts.at(r);
  }
  /// The committed version (the commit record's).
  [[nodiscard]] std::uint64_t version() const { return driver_->version(); }
  /// Checkpoint bytes covered by the trainer's affine vs residual tasks.
  [[nodiscard]] const task_coverage& coverage() const noexcept { return trainer_.coverage(); }

  /// The union of every receiver's overwrite_only_tensors(), sorted (after start()).
  [[nodiscard]] std::vector<tensor_id> overwrite_only_tensors() const {
    std::vector<tensor_id> all;
    for (const auto& s : receivers_) {
      const auto only = s->rx.overwrite_only_tensors();
      all.insert(all.end(), only.begin(), only.end());
    }
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    return all;
  }

  /// Switches every receiver to apply path `path` from the next payload on.
  void set_apply_path(apply_path path) {
    options_.path = path;
    for (auto& s : receivers_) {
      auto o = s->rx.options();
      o.path = path;
      s->rx.set_options(o);
    }
  }

  /// Refits the trainer's current weights: runs the transition version() -> version() + 1
  /// through the agents; `faults` (tests) decorates the receivers' payload sources. Payloads of
  /// a committed transition are erased; a failed one keeps them for inspection.
  transition_report refit(const refit_options& options = {},
                          const testing::receiver_fault_plan& faults = {}) {
    DCR_EXPECTS(started_, errc::not_ready, "deployment: refit() before start()");
    return driver_->run(options, testing::decorate_with(faults));
  }

  /// Dense refit of the trainer's current weights (affine shards scattered, residual outputs
  /// converted) through each receiver's own loader into fresh storage, compared byte for byte
  /// with the receiver's storage (padding included). Returns "" when every receiver matches,
  /// else "receiver R parameter P".
  std::string verify_against_dense_refit() {
    trainer_.assemble_canonical(canonical_spans_);
    for (std::size_t r = 0; r < receivers_.size(); ++r) {
      auto& state = *receivers_[r];
      if (!state.reference)
        state.reference = std::make_unique<rank_state>(options_.model, options_.receiver_tp,
                                                       static_cast<int>(r), receiver_layout(r),
                                                       registry_, options_.path, false);
      state.reference->storage.reset();
      dense_load_all(state.reference->rx);
      const auto diff = state.storage.first_difference(state.reference->storage);
      if (!diff.empty()) return "receiver " + std::to_string(r) + " parameter " + diff;
    }
    return "";
  }

  /// "" when no receiver's padding rows were ever written, else "receiver R parameter P".
  [[nodiscard]] std::string first_written_padding() const {
    for (std::size_t r = 0; r < receivers_.size(); ++r) {
      const auto p = receivers_[r]->storage.first_written_padding();
      if (!p.empty()) return "receiver " + std::to_string(r) + " parameter " + p;
    }
    return "";
  }

 private:
  struct rank_state {
    rank_state(const moe_config& c, int world, int rank, engine_layout layout,
               const tensor_registry& registry, apply_path path, bool prewarm)
        : storage(c, world, rank, layout), loader(storage),
          rx(registry, loader, apply_options{path, false}) {
      if (prewarm) rx.prewarm();  // the dense-refit reference only loads densely
    }
    moe_engine_storage storage;
    moe_engine_loader loader;
    engine_receiver rx;
    std::unique_ptr<rank_state> reference;  // dense-refit reference, made on first verify
  };

  void dense_load_all(engine_receiver& rx) { sim::dense_load_all(rx, registry_, canonical_); }

  deployment_options options_;
  tensor_registry registry_;
  synthetic_trainer trainer_;
  std::vector<std::vector<std::byte>> canonical_;
  std::vector<std::span<std::byte>> canonical_spans_;
  std::vector<std::unique_ptr<owner>> owners_;
  std::vector<owner_binding> bindings_;
  std::vector<std::unique_ptr<rank_state>> receivers_;
  std::vector<receiver_endpoint*> endpoints_;
  std::unique_ptr<in_process_refit> driver_;
  bool started_ = false;
};

}  // namespace dcr::sim
