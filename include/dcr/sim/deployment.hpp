// dcr/sim/deployment.hpp: a whole refit deployment in one process: the synthetic MoE trainer
// (tp x dp ranks, owners chosen by dcr::assign_owners), serving ranks running the synthetic
// engine's native loader, an in-memory transport and commit store. `dcr simulate`, the property
// tests and the benchmarks all drive refits through it, and it can check every receiver against
// a dense refit of the same candidate weights through the same loader.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcr/commit/memory.hpp"
#include "dcr/refit/coordinator.hpp"
#include "dcr/sim/moe_engine.hpp"
#include "dcr/sim/moe_model.hpp"
#include "dcr/transport/memory.hpp"

namespace dcr::sim {

struct deployment_options {
  moe_config model;
  int trainer_tp = 2;
  int trainer_dp = 2;
  int receiver_tp = 4;
  std::uint64_t seed = 1;
};

class in_process_deployment {
 public:
  using engine_receiver = receiver<moe_engine_loader>;

  /// Builds the trainer with synthetic version-0 weights. Call start() (after any edits to the
  /// trainer's words through trainer()) to initialize trackers, load receivers densely and
  /// create the commit record at version 0.
  explicit in_process_deployment(const deployment_options& options)
      : options_(options), registry_(options.model.canonical_tensors()),
        trainer_(options.model, registry_, options.trainer_tp, options.trainer_dp, options.seed) {
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
    const auto owner_of = trainer_.owners();
    std::map<std::uint32_t, std::vector<std::size_t>> shards_of_owner;
    for (std::size_t i = 0; i < shards.size(); ++i) shards_of_owner[owner_of[i]].push_back(i);
    for (const auto& [rank, list] : shards_of_owner) {
      std::vector<affine_task> tasks;
      std::vector<std::span<const std::byte>> words;
      for (auto i : list) {
        tasks.push_back(shards[i].task);
        words.push_back(trainer_.words(i));
      }
      owners_.push_back(std::make_unique<owner>(registry_, rank, std::move(tasks)));
      owners_.back()->initialize(words);
      bindings_.push_back({owners_.back().get(), std::move(words)});  // the trainer's live shards
    }
    trainer_.assemble_canonical(canonical_spans_);
    for (int r = 0; r < options_.receiver_tp; ++r) {
      receivers_.push_back(std::make_unique<rank_state>(options_.model, options_.receiver_tp, r, registry_));
      dense_load_all(receivers_.back()->rx);
      endpoints_.push_back(&receivers_.back()->rx);
    }
    initialize_commit_record(commits_, 0, registry_.fingerprint());
    started_ = true;
  }

  [[nodiscard]] const tensor_registry& registry() const noexcept { return registry_; }
  [[nodiscard]] synthetic_trainer& trainer() noexcept { return trainer_; }
  [[nodiscard]] memory_transport& transport() noexcept { return transport_; }
  [[nodiscard]] memory_commit_store& commits() noexcept { return commits_; }
  [[nodiscard]] std::size_t owner_count() const noexcept { return owners_.size(); }
  [[nodiscard]] std::size_t receiver_count() const noexcept { return receivers_.size(); }
  [[nodiscard]] engine_receiver& receiver_at(std::size_t r) { return receivers_.at(r)->rx; }
  [[nodiscard]] moe_engine_storage& storage_at(std::size_t r) { return receivers_.at(r)->storage; }
  /// The committed version (the commit record's).
  [[nodiscard]] std::uint64_t version() const { return commits_.read()->version; }

  /// Refits the trainer's current weights: runs the transition version() -> version() + 1.
  transition_report refit(const refit_options& options = {}, const fault_plan& faults = {}) {
    DCR_EXPECTS(started_, errc::not_ready, "deployment: refit() before start()");
    const std::uint64_t base = version();
    auto report = run_transition(registry_, std::span<owner_binding>(bindings_),
                                 std::span<receiver_endpoint* const>(endpoints_), transport_,
                                 commits_, base, options, faults);
    // Payloads of a committed transition are garbage; a failed one keeps them for inspection.
    if (report.committed) transport_.erase_before(base + 1);
    return report;
  }

  /// Dense refit of the trainer's current weights through each receiver's own loader into
  /// fresh (zeroed) storage, compared byte for byte with the receiver's storage. Returns "" when
  /// every receiver matches, else "receiver R parameter P".
  std::string verify_against_dense_refit() {
    trainer_.assemble_canonical(canonical_spans_);
    for (std::size_t r = 0; r < receivers_.size(); ++r) {
      auto& state = *receivers_[r];
      if (!state.reference) state.reference = std::make_unique<rank_state>(options_.model, options_.receiver_tp, static_cast<int>(r), registry_);
      state.reference->storage.zero();
      dense_load_all(state.reference->rx);
      const auto diff = state.storage.first_difference(state.reference->storage);
      if (!diff.empty()) return "receiver " + std::to_string(r) + " parameter " + diff;
    }
    return "";
  }

 private:
  struct rank_state {
    rank_state(const moe_config& c, int world, int rank, const tensor_registry& registry)
        : storage(c, world, rank), loader(storage), rx(registry, loader) {
      rx.prewarm();
    }
    moe_engine_storage storage;
    moe_engine_loader loader;
    engine_receiver rx;
    std::unique_ptr<rank_state> reference;  // dense-refit reference, made on first verify
  };

  void dense_load_all(engine_receiver& rx) {
    for (std::size_t id = 0; id < registry_.size(); ++id) {
      const auto& t = registry_.at(static_cast<tensor_id>(id));
      visit_word(dtype_size(t.type), [&](auto w) {
        using W = decltype(w);
        rx.template dense_load<W>(static_cast<tensor_id>(id),
                                  tensor_view<const W>::contiguous(
                                      reinterpret_cast<const W*>(canonical_[id].data()), t.shape));
      });
    }
  }

  deployment_options options_;
  tensor_registry registry_;
  synthetic_trainer trainer_;
  std::vector<std::vector<std::byte>> canonical_;
  std::vector<std::span<std::byte>> canonical_spans_;
  std::vector<std::unique_ptr<owner>> owners_;
  std::vector<owner_binding> bindings_;
  std::vector<std::unique_ptr<rank_state>> receivers_;
  std::vector<receiver_endpoint*> endpoints_;
  memory_transport transport_;
  memory_commit_store commits_;
  bool started_ = false;
};

}  // namespace dcr::sim
