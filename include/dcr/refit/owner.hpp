// dcr/refit/owner.hpp: the owner side of a transition: detect, project or convert, encode, pack.
//
// An owner is the one data-parallel replica that compares a set of source shards with its
// trackers, the committed version-v words of those shards. Its affine tasks (refit/task.hpp)
// have their changed words projected straight to canonical coordinates; its residual tasks
// (refit/residual.hpp) have the canonical tensors that depend on a changed input rebuilt and
// compared with the residual baseline, the committed canonical tensors. For each attempt the
// owner turns both kinds of change into items (one per canonical tensor it touches, indices
// sorted, in tensor id order), packs them into payloads, and after the joint commit updates its
// trackers and residual baseline in place. Candidate weights stay fixed for the whole
// transition, so a retry rebuilds exactly the same changed set (with overwrite records).
//
// Shards are passed as byte spans: `candidates[i]` (or `committed[i]`) for tasks()[i], and the
// residual inputs flattened in task order, `residual_inputs` = the inputs of residual_tasks()[0],
// then those of residual_tasks()[1], and so on (residual_input_count() spans in all).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <unordered_map>
#include <vector>

#include <xxhash.h>

#include <iterator>
#include <map>

#include "dcr/codec/encode_item.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/detect/detect.hpp"
#include "dcr/refit/detect_backend.hpp"
#include "dcr/refit/residual.hpp"
#include "dcr/refit/task.hpp"

namespace dcr {

/// What an owner sends for an attempt.
enum class build_mode : std::uint8_t {
  /// The changed set: the words that differ from the trackers (and the rebuilt residual
  /// elements that differ from the residual baseline), united with every element an earlier
  /// attempt of the same transition sent, so that a retry built from changed candidates still
  /// overwrites whatever a failed attempt wrote.
  changes,
  /// Every element of every canonical tensor the owner produces, as overwrites of the given
  /// words (a dense restore of the committed version when the trackers are passed as the
  /// candidates, or a dense refit when the history of the transition is unknown).
  dense,
};

/// Timings and counts of one build_items() or build_chunk() call (summed over the chunks of an
/// attempt until the next chunk 0).
struct owner_stats {
  // Affine tasks.
  std::uint64_t compared_bytes = 0;    ///< candidate bytes of affine shards compared with trackers
  std::uint64_t changed_elements = 0;  ///< source elements of affine shards whose words changed
  double detect_seconds = 0;           ///< comparison of affine shards
  double project_seconds = 0;          ///< projection to canonical coordinates and sorting
  // Residual tasks.
  std::uint64_t residual_compared_bytes = 0;   ///< input bytes compared with committed copies
  std::uint64_t residual_changed_inputs = 0;   ///< inputs flagged changed
  std::uint64_t residual_conversions = 0;      ///< outputs rebuilt (selected by the flags)
  std::uint64_t residual_converted_bytes = 0;  ///< canonical bytes rebuilt and compared
  std::uint64_t residual_changed_elements = 0; ///< rebuilt elements that differ from the baseline
  double residual_detect_seconds = 0;          ///< input comparison (change flags)
  double convert_seconds = 0;                  ///< the conversion callables
  double residual_compare_seconds = 0;         ///< rebuilt outputs vs the residual baseline
  // Both.
  std::uint64_t items = 0;            ///< items emitted (canonical tensors touched)
  std::uint64_t residual_items = 0;   ///< of which built by residual tasks
  std::uint64_t forced_overwrite_items = 0;  ///< affine items sent as overwrite because a
                                             ///< receiver takes the tensor only that way
  double encode_seconds = 0;          ///< choosing encodings and encoding values
};

class owner {
 public:
  /// An owner with id `id` (unique among all owners of the model) holding affine `tasks` and
  /// `residual` tasks. Validates the set (validate_task_set): every task against the registry,
  /// and every residual output produced by this owner's one residual task only.
  owner(const tensor_registry& registry, std::uint32_t id, std::vector<affine_task> tasks,
        std::vector<residual_task> residual = {})
      : registry_(&registry), id_(id), tasks_(std::move(tasks)), residual_(std::move(residual)) {
    validate_task_set(registry, tasks_, residual_);
    trackers_.resize(tasks_.size());
    changed_.resize(tasks_.size());
    projected_.resize(tasks_.size());
    transition_changed_.resize(tasks_.size());
    gathered_old_.resize(tasks_.size());
    gathered_new_.resize(tasks_.size());
    gathered_.assign(tasks_.size(), 0);

    for (const auto& t : tasks_)
      for (auto target : t.targets) add_slot(target, false);
    residual_state_.resize(residual_.size());
    std::size_t max_output = 0;
    for (std::size_t r = 0; r < residual_.size(); ++r) {
      const auto& task = residual_[r];
      auto& st = residual_state_[r];
      st.first_input = residual_input_count_;
      residual_input_count_ += task.inputs.size();
      st.input_copies.resize(task.inputs.size());
      st.changed_inputs.resize(task.inputs.size());
      st.baseline.resize(task.outputs.size());
      st.selected.assign(task.outputs.size(), 0);
      st.union_indices.resize(task.outputs.size());
      st.union_selected.assign(task.outputs.size(), 0);
      for (const auto& out : task.outputs) {
        st.output_slot.push_back(add_slot(out.tensor, true));
        max_output = std::max(max_output,
                              static_cast<std::size_t>(registry.at(out.tensor).bytes()));
      }
    }
    scratch_.resize(max_output);
    records_.resize(targets_.size());
    overwrite_only_.assign(targets_.size(), 0);
    slot_order_.resize(targets_.size());
    std::iota(slot_order_.begin(), slot_order_.end(), 0u);
    std::sort(slot_order_.begin(), slot_order_.end(),
              [&](auto a, auto b) { return targets_[a] < targets_[b]; });
    set_chunk_bytes(std::size_t{64} << 20);
  }

  /// Groups the tasks into chunks of whole canonical tensors of about `bytes` source bytes
  /// each (affine tasks that share a target tensor always share a chunk; each residual task is
  /// a chunk of its own), in tensor id order. Chunks are the unit of pipelining: build_chunk(k)
  /// emits the items of chunk k only, so that chunk k can be packed and sent while k + 1 is
  /// built.
  void set_chunk_bytes(std::size_t bytes) {
    // Affine tasks connected through shared targets form groups (union-find over slots).
    std::vector<std::uint32_t> parent(targets_.size());
    std::iota(parent.begin(), parent.end(), 0u);
    auto find = [&](std::uint32_t x) {
      while (parent[x] != x) x = parent[x] = parent[parent[x]];
      return x;
    };
    for (const auto& t : tasks_)
      for (std::size_t p = 1; p < t.targets.size(); ++p)
        parent[find(slot_of_.at(t.targets[p]))] = find(slot_of_.at(t.targets[0]));
    std::map<tensor_id, std::vector<std::size_t>> groups;  // keyed by smallest target
    std::map<std::uint32_t, tensor_id> group_key;
    for (auto slot : slot_order_)
      if (!slot_residual_[slot]) group_key.try_emplace(find(slot), targets_[slot]);
    for (std::size_t i = 0; i < tasks_.size(); ++i)
      groups[group_key.at(find(slot_of_.at(tasks_[i].targets[0])))].push_back(i);
    chunks_.clear();
    chunk current;
    std::size_t current_bytes = 0;
    for (auto& [key, group] : groups) {
      std::size_t b = 0;
      for (auto i : group) b += tasks_[i].bytes();
      if (!current.tasks.empty() && current_bytes + b > bytes) {
        chunks_.push_back(std::move(current));
        current = {};
        current_bytes = 0;
      }
      current.tasks.insert(current.tasks.end(), group.begin(), group.end());
      current_bytes += b;
    }
    if (!current.tasks.empty()) chunks_.push_back(std::move(current));
    for (std::size_t r = 0; r < residual_.size(); ++r) chunks_.push_back(chunk{{}, {r}, {}});
    for (auto& c : chunks_) {
      for (auto i : c.tasks)
        for (auto t : tasks_[i].targets) c.slots.push_back(slot_of_.at(t));
      for (auto r : c.residual)
        for (auto sl : residual_state_[r].output_slot) c.slots.push_back(sl);
      std::sort(c.slots.begin(), c.slots.end(),
                [&](auto a, auto b) { return targets_[a] < targets_[b]; });
      c.slots.erase(std::unique(c.slots.begin(), c.slots.end()), c.slots.end());
    }
    chunk_built_.assign(chunks_.size(), 0);
  }

  /// Number of chunks (see set_chunk_bytes); at least 1 unless the owner has no task.
  [[nodiscard]] std::size_t chunk_count() const noexcept { return chunks_.size(); }

  [[nodiscard]] std::uint32_t id() const noexcept { return id_; }
  [[nodiscard]] std::span<const affine_task> tasks() const noexcept { return tasks_; }
  [[nodiscard]] std::span<const residual_task> residual_tasks() const noexcept {
    return residual_;
  }
  /// Number of residual input spans build_items(), initialize() and commit() expect.
  [[nodiscard]] std::size_t residual_input_count() const noexcept { return residual_input_count_; }

  /// Bytes of tracker memory: one copy of every owned shard, affine shards and residual inputs.
  [[nodiscard]] std::uint64_t tracker_bytes() const noexcept {
    std::uint64_t b = 0;
    for (const auto& t : trackers_) b += t.size();
    for (const auto& st : residual_state_)
      for (const auto& c : st.input_copies) b += c.size();
    return b;
  }
  /// Bytes of the residual baseline: the committed canonical tensors of the residual tasks.
  [[nodiscard]] std::uint64_t residual_baseline_bytes() const noexcept {
    std::uint64_t b = 0;
    for (const auto& st : residual_state_)
      for (const auto& o : st.baseline) b += o.size();
    return b;
  }

  /// Runs the detect stage of the affine tasks, and the projection of what it finds, through
  /// `backend` from now on (dcr/refit/detect_backend.hpp; e.g. on a GPU); nullptr returns to
  /// the owner's own CPU loop (the default). Everything else stays here, and the items are bit
  /// for bit the same. On an initialized owner the backend is initialized with the trackers at
  /// once. The backend must outlive its use.
  void set_detect_backend(detect_backend* backend) {
    if (backend != nullptr && initialized_) {  // may throw: keep the old one
      std::vector<std::span<const std::byte>> committed(trackers_.begin(), trackers_.end());
      backend->initialize(tasks_, committed);
    }
    detector_ = backend;
    for (auto& p : projected_) p.valid = false;
  }

  /// Where the detect stage runs: "cpu" (the owner's own loop) or the backend's device().
  [[nodiscard]] std::string detect_device() const {
    return detector_ != nullptr ? detector_->device() : std::string("cpu");
  }

  /// Sets every tracker to the committed words of its task (committed[i] for tasks()[i]) and
  /// every residual input copy to `residual_committed` (flattened, see the file comment), then
  /// builds the residual baseline by converting every residual output from those inputs.
  void initialize(std::span<const std::span<const std::byte>> committed,
                  std::span<const std::span<const std::byte>> residual_committed = {}) {
    check_inputs(committed, "initialize");
    check_residual_inputs(residual_committed, "initialize");
    initialized_ = false;
    built_ = false;
    for (std::size_t i = 0; i < tasks_.size(); ++i)
      trackers_[i].assign(committed[i].begin(), committed[i].end());
    if (detector_ != nullptr) detector_->initialize(tasks_, committed);
    for (std::size_t r = 0; r < residual_.size(); ++r) {
      const auto& task = residual_[r];
      auto& st = residual_state_[r];
      const auto inputs = residual_committed.subspan(st.first_input, task.inputs.size());
      for (std::size_t k = 0; k < inputs.size(); ++k)
        st.input_copies[k].assign(inputs[k].begin(), inputs[k].end());
      for (std::size_t o = 0; o < task.outputs.size(); ++o) {
        const auto bytes = registry_->at(task.outputs[o].tensor).bytes();
        st.baseline[o].resize(static_cast<std::size_t>(bytes));
        task.convert(o, inputs, st.baseline[o]);
      }
    }
    initialized_ = true;
    transition_open_ = false;
  }

  /// Receivers that can take tensors only as overwrite records (the union of
  /// receiver_endpoint::overwrite_only_tensors() over the receivers of a transition; any order).
  /// Replaces the previous set; tensors this owner does not produce are ignored. Throws
  /// unknown_tensor for an id outside the registry.
  void set_overwrite_only(std::span<const tensor_id> tensors) {
    for (auto id : tensors)
      DCR_EXPECTS(id < registry_->size(), errc::unknown_tensor,
                  "owner::set_overwrite_only: tensor id " + std::to_string(id) +
                      " is not in the registry (" + std::to_string(registry_->size()) +
                      " tensors)");
    std::fill(overwrite_only_.begin(), overwrite_only_.end(), std::uint8_t{0});
    for (auto id : tensors)
      if (auto it = slot_of_.find(id); it != slot_of_.end()) overwrite_only_[it->second] = 1;
  }

  /// Compares candidates[i] with the tracker of tasks()[i], rebuilds the residual outputs whose
  /// inputs changed and compares them with the residual baseline, and emits one item per
  /// canonical tensor touched, in tensor id order, with sorted indices (all chunks at once; see
  /// build_chunk for the contract of `mode`). Encodings (see dcr::encode_gathered_item): residual
  /// items, dense items and affine items of overwrite-only tensors are overwrites; other affine
  /// items are deltas only where `policy` permits and every contributing task is
  /// delta_encodable, the encoding chosen per item (`codec` tunes the estimate). Remembers the
  /// changed set for commit(). Throws on mismatched shards (nothing committed changes) and
  /// propagates a conversion's exception.
  const std::vector<item>& build_items(
      std::span<const std::span<const std::byte>> candidates, encoding_policy policy,
      std::span<const std::span<const std::byte>> residual_inputs = {},
      const codec_options& codec = {}, build_mode mode = build_mode::changes) {
    all_items_.clear();
    for (std::size_t k = 0; k < chunks_.size(); ++k) {
      const auto& items = build_chunk(k, candidates, policy, residual_inputs, codec, mode);
      all_items_.insert(all_items_.end(), items.begin(), items.end());
    }
    if (chunks_.empty()) {
      check_inputs(candidates, "build_items");
      stats_ = {};
    }
    std::stable_sort(all_items_.begin(), all_items_.end(),
                     [](const item& a, const item& b) { return a.tensor < b.tensor; });
    return all_items_;
  }

  /// Builds the items of chunk `k` only (in tensor id order), like build_items. An attempt
  /// builds chunks 0 .. chunk_count() - 1 in order, all with the same arguments; stats() then
  /// sums them. In mode `changes`, the changed set of a task is united with what earlier
  /// attempts of the same transition (builds since initialize() or the last commit()) sent;
  /// in mode `dense`, every element is sent as an overwrite of `candidates` (pass the trackers,
  /// see tracker(), for a restore of the committed version). commit() needs every chunk built
  /// in the last attempt.
  const std::vector<item>& build_chunk(
      std::size_t k, std::span<const std::span<const std::byte>> candidates,
      encoding_policy policy, std::span<const std::span<const std::byte>> residual_inputs = {},
      const codec_options& codec = {}, build_mode mode = build_mode::changes) {
    DCR_EXPECTS(initialized_, errc::not_ready, "owner::build_chunk before initialize");
    DCR_EXPECTS(k < chunks_.size(), errc::out_of_range,
                "owner::build_chunk: chunk " + std::to_string(k) + " of " +
                    std::to_string(chunks_.size()));
    check_inputs(candidates, "build_items");
    check_residual_inputs(residual_inputs, "build_items");
    if (k == 0) {
      stats_ = {};
      std::fill(chunk_built_.begin(), chunk_built_.end(), std::uint8_t{0});
      if (!transition_open_) {
        for (auto& c : transition_changed_) c.clear();
        for (auto& st : residual_state_) {
          for (auto& u : st.union_indices) u.clear();
          std::fill(st.union_selected.begin(), st.union_selected.end(), std::uint8_t{0});
        }
      }
      transition_open_ = true;
      last_mode_ = mode;
    }
    built_ = false;
    const chunk& c = chunks_[k];
    for (auto slot : c.slots) records_[slot].clear();
    items_.clear();

    auto t0 = clock::now();
    for (auto i : c.tasks) {
      changed_[i].clear();
      gathered_old_[i].clear();
      gathered_new_[i].clear();
      gathered_[i] = 0;
      projected_[i].valid = false;
      if (mode == build_mode::dense) {
        changed_[i].resize(tasks_[i].bytes() / dtype_size(tasks_[i].type));
        std::iota(changed_[i].begin(), changed_[i].end(), std::uint64_t{0});
      } else {
        if (detector_ != nullptr) {
          detector_->detect(i, candidates[i], changed_[i], projected_[i]);
          check_projected(i);
        } else {
          // One pass: the changed indices and their old and new words.
          visit_word(dtype_size(tasks_[i].type), [&](auto w) {
            using W = decltype(w);
            detect_and_gather<W>(words_of<W>(std::span<const std::byte>(trackers_[i])),
                                 words_of<W>(candidates[i]), changed_[i], gathered_old_[i],
                                 gathered_new_[i]);
          });
          gathered_[i] = 1;
        }
        stats_.changed_elements += changed_[i].size();
        unite(transition_changed_[i], changed_[i]);
        if (transition_changed_[i].size() != changed_[i].size()) {
          // An earlier attempt sent more: the union is projected and gathered here.
          changed_[i] = transition_changed_[i];
          gathered_[i] = 0;
          projected_[i].valid = false;
        }
      }
      stats_.compared_bytes += candidates[i].size();
    }
    auto t1 = clock::now();
    for (auto i : c.tasks) project(i, candidates[i], gathered_[i] != 0);
    for (auto slot : c.slots) records_[slot].sort_by_index();
    auto t2 = clock::now();
    stats_.detect_seconds += seconds(t1 - t0);
    stats_.project_seconds += seconds(t2 - t1);

    for (auto r : c.residual) build_residual(r, residual_inputs, mode);

    auto t3 = clock::now();
    if (k == 0) change_digest_ = 0;
    for (auto slot : c.slots) {
      const auto& r = records_[slot];
      if (r.indices.empty()) continue;
      const auto& t = registry_->at(targets_[slot]);
      const tensor_id target = targets_[slot];
      change_digest_ = XXH64(&target, sizeof target, change_digest_);
      change_digest_ = XXH64(r.indices.data(), r.indices.size() * sizeof(std::uint64_t), change_digest_);
      change_digest_ = XXH64(r.new_bytes.data(), r.new_bytes.size(), change_digest_);
      const bool residual = slot_residual_[slot] != 0;
      const bool forced = !residual && overwrite_only_[slot] != 0;
      const bool delta_permitted =
          !residual && !forced && r.delta_encodable && mode == build_mode::changes;
      item it;
      it.tensor = target;
      it.type = t.type;
      it.indices = r.indices;
      it.values = r.old_bytes;  // the gathered old words, turned into values in place
      visit_word(dtype_size(t.type), [&](auto w) {
        using W = decltype(w);
        encode_gathered_item<W>(it, r.new_words<W>(), policy, delta_permitted, codec);
      });
      items_.push_back(std::move(it));
      stats_.residual_items += residual ? 1 : 0;
      stats_.forced_overwrite_items += forced && r.delta_encodable ? 1 : 0;
    }
    stats_.items += items_.size();
    stats_.encode_seconds += seconds(clock::now() - t3);
    chunk_built_[k] = 1;
    built_ = std::all_of(chunk_built_.begin(), chunk_built_.end(), [](auto b) { return b != 0; });
    return items_;
  }

  /// Digest of the last attempt's changed set (indices and new words of every item, in chunk
  /// order): equal digests over the same trackers mean equal candidates, so a restarted owner
  /// can tell whether its candidates are the ones an earlier attempt was built from.
  [[nodiscard]] std::uint64_t change_digest() const noexcept { return change_digest_; }

  /// Statistics of the last build_items().
  [[nodiscard]] const owner_stats& stats() const noexcept { return stats_; }

  /// After the joint commit: writes the changed words of the candidates (the same ones the last
  /// build_items() saw) into the trackers and residual input copies, and the changed elements of
  /// the rebuilt residual outputs into the residual baseline, in place. Only changed words are
  /// touched.
  void commit(std::span<const std::span<const std::byte>> candidates,
              std::span<const std::span<const std::byte>> residual_inputs = {}) {
    DCR_EXPECTS(built_, errc::not_ready, "owner::commit without a built changed set");
    check_inputs(candidates, "commit");
    check_residual_inputs(residual_inputs, "commit");
    for (std::size_t i = 0; i < tasks_.size(); ++i) {
      if (last_mode_ == build_mode::dense)
        std::memcpy(trackers_[i].data(), candidates[i].data(), candidates[i].size());
      else
        copy_words(trackers_[i], candidates[i], transition_changed_[i], dtype_size(tasks_[i].type));
      if (detector_ != nullptr)
        detector_->commit(i, candidates[i], transition_changed_[i],
                          last_mode_ == build_mode::dense);
    }
    for (std::size_t r = 0; r < residual_.size(); ++r) {
      const auto& task = residual_[r];
      auto& st = residual_state_[r];
      for (std::size_t k = 0; k < task.inputs.size(); ++k) {
        const auto in = residual_inputs[st.first_input + k];
        if (!st.input_copies[k].empty()) std::memcpy(st.input_copies[k].data(), in.data(), in.size());
      }
      for (std::size_t o = 0; o < task.outputs.size(); ++o) {
        if (!st.selected[o]) continue;
        const record_buffer& rec = records_[st.output_slot[o]];
        const std::size_t wb = rec.word_bytes;
        std::byte* dst = st.baseline[o].data();
        for (std::size_t k = 0; k < rec.indices.size(); ++k)
          std::memcpy(dst + rec.indices[k] * wb, rec.new_bytes.data() + k * wb, wb);
      }
    }
    built_ = false;
    transition_open_ = false;
  }

  /// The committed words of task i (the tracker).
  [[nodiscard]] std::span<const std::byte> tracker(std::size_t i) const { return trackers_.at(i); }
  /// The committed words of input `input` of residual task `task`.
  [[nodiscard]] std::span<const std::byte> residual_input_copy(std::size_t task,
                                                               std::size_t input) const {
    return residual_state_.at(task).input_copies.at(input);
  }
  /// The residual baseline of output `output` of residual task `task`: the committed canonical
  /// tensor.
  [[nodiscard]] std::span<const std::byte> residual_baseline(std::size_t task,
                                                             std::size_t output) const {
    return residual_state_.at(task).baseline.at(output);
  }

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

  /// Records of one canonical tensor, gathered from every task that targets it.
  struct record_buffer {
    std::vector<std::uint64_t> indices;
    std::vector<std::byte> old_bytes, new_bytes;
    std::size_t word_bytes = 0;
    bool delta_encodable = true;
    std::vector<std::uint32_t> perm;
    std::vector<std::uint64_t> tmp_indices;
    std::vector<std::byte> tmp_bytes;

    void clear() {
      indices.clear();
      old_bytes.clear();
      new_bytes.clear();
      delta_encodable = true;
    }
    template <storage_word W> std::span<const W> new_words() const {
      return {reinterpret_cast<const W*>(new_bytes.data()), indices.size()};
    }
    // Tasks of one tensor arrive one after another, each already in increasing order for the
    // monotone mappings (row/column splits, boxes without permutation), so usually no sort.
    void sort_by_index() {
      if (std::is_sorted(indices.begin(), indices.end())) return;
      perm.resize(indices.size());
      std::iota(perm.begin(), perm.end(), 0u);
      std::sort(perm.begin(), perm.end(), [&](auto a, auto b) { return indices[a] < indices[b]; });
      tmp_indices.resize(indices.size());
      for (std::size_t k = 0; k < perm.size(); ++k) tmp_indices[k] = indices[perm[k]];
      indices.swap(tmp_indices);
      for (auto* bytes : {&old_bytes, &new_bytes}) {
        tmp_bytes.resize(bytes->size());
        for (std::size_t k = 0; k < perm.size(); ++k)
          std::memcpy(tmp_bytes.data() + k * word_bytes, bytes->data() + perm[k] * word_bytes,
                      word_bytes);
        bytes->swap(tmp_bytes);
      }
    }
  };

  /// A residual task's committed state and the change flags of the current build.
  struct residual_state {
    std::size_t first_input = 0;                             // in the flattened input list
    std::vector<std::vector<std::byte>> input_copies;        // committed input words
    std::vector<std::vector<std::uint64_t>> changed_inputs;  // per input: changed word indices
    std::vector<std::vector<std::byte>> baseline;            // per output: committed tensor
    std::vector<std::uint32_t> output_slot;                  // per output: record slot
    std::vector<std::uint8_t> selected;                      // per output: rebuilt this build
    std::vector<std::vector<std::uint64_t>> union_indices;   // per output: sent this transition
    std::vector<std::uint8_t> union_selected;                // per output: rebuilt this transition
  };

  /// A unit of pipelining: affine tasks, residual tasks and the record slots they fill.
  struct chunk {
    std::vector<std::size_t> tasks;
    std::vector<std::size_t> residual;
    std::vector<std::uint32_t> slots;  // in tensor id order
  };

  // a := a united with b (both sorted, distinct).
  static void unite(std::vector<std::uint64_t>& a, const std::vector<std::uint64_t>& b) {
    if (a.empty()) {
      a = b;
      return;
    }
    if (b.empty()) return;
    std::vector<std::uint64_t> out;
    out.reserve(a.size() + b.size());
    std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
    a.swap(out);
  }

  std::uint32_t add_slot(tensor_id target, bool residual) {
    if (auto it = slot_of_.find(target); it != slot_of_.end()) return it->second;
    const auto slot = static_cast<std::uint32_t>(targets_.size());
    slot_of_.emplace(target, slot);
    targets_.push_back(target);
    slot_residual_.push_back(residual ? 1 : 0);
    return slot;
  }

  static void copy_words(std::vector<std::byte>& dst, std::span<const std::byte> src,
                         std::span<const std::uint64_t> changed, std::size_t word_bytes) {
    std::byte* d = dst.data();
    const std::byte* s = src.data();
    for (auto j : changed) std::memcpy(d + j * word_bytes, s + j * word_bytes, word_bytes);
  }

  // Residual task r: change flags from its inputs, then every selected output rebuilt into
  // scratch and compared with its baseline; the differing elements become the records of the
  // output's slot (indices sorted by construction, overwrite only).
  void build_residual(std::size_t r, std::span<const std::span<const std::byte>> residual_inputs,
                      build_mode mode) {
    const auto& task = residual_[r];
    auto& st = residual_state_[r];
    const auto inputs = residual_inputs.subspan(st.first_input, task.inputs.size());

    const auto f0 = clock::now();
    for (std::size_t k = 0; k < task.inputs.size(); ++k) {
      st.changed_inputs[k].clear();
      visit_word(dtype_size(task.inputs[k].type), [&](auto w) {
        using W = decltype(w);
        detect_changes<W>(words_of<W>(std::span<const std::byte>(st.input_copies[k])),
                          words_of<W>(inputs[k]), st.changed_inputs[k]);
      });
      stats_.residual_compared_bytes += inputs[k].size();
      stats_.residual_changed_inputs += st.changed_inputs[k].empty() ? 0 : 1;
    }
    for (std::size_t o = 0; o < task.outputs.size(); ++o) {
      bool selected = mode == build_mode::dense || st.union_selected[o] != 0;
      for (std::size_t k = 0; k < task.inputs.size() && !selected; ++k)
        selected = !st.changed_inputs[k].empty() && task.depends(o, k);
      st.selected[o] = selected ? 1 : 0;
      if (mode == build_mode::changes) st.union_selected[o] |= st.selected[o];
    }
    stats_.residual_detect_seconds += seconds(clock::now() - f0);

    for (std::size_t o = 0; o < task.outputs.size(); ++o) {
      if (!st.selected[o]) continue;
      const auto& t = registry_->at(task.outputs[o].tensor);
      const std::span<std::byte> out(scratch_.data(), static_cast<std::size_t>(t.bytes()));
      const auto c0 = clock::now();
      task.convert(o, inputs, out);
      const auto c1 = clock::now();
      record_buffer& rec = records_[st.output_slot[o]];
      const std::size_t wb = dtype_size(t.type);
      rec.word_bytes = wb;
      rec.delta_encodable = false;
      visit_word(wb, [&](auto w) {
        using W = decltype(w);
        const auto committed = words_of<W>(std::span<const std::byte>(st.baseline[o]));
        const auto rebuilt = words_of<W>(std::span<const std::byte>(out));
        if (mode == build_mode::dense) {
          rec.indices.resize(rebuilt.size());
          std::iota(rec.indices.begin(), rec.indices.end(), std::uint64_t{0});
        } else {
          detect_changes<W>(committed, rebuilt, rec.indices);
          unite(st.union_indices[o], rec.indices);
          if (st.union_indices[o].size() != rec.indices.size()) rec.indices = st.union_indices[o];
        }
        const std::size_t n = rec.indices.size();
        rec.old_bytes.resize(n * wb);
        rec.new_bytes.resize(n * wb);
        W* old_words = reinterpret_cast<W*>(rec.old_bytes.data());
        W* new_words = reinterpret_cast<W*>(rec.new_bytes.data());
        for (std::size_t k = 0; k < n; ++k) {
          old_words[k] = committed[rec.indices[k]];
          new_words[k] = rebuilt[rec.indices[k]];
        }
      });
      stats_.residual_conversions += 1;
      stats_.residual_converted_bytes += out.size();
      stats_.residual_changed_elements += rec.indices.size();
      stats_.convert_seconds += seconds(c1 - c0);
      stats_.residual_compare_seconds += seconds(clock::now() - c1);
    }
  }

  // Projects task i's changed local indices to canonical coordinates and appends (index, old,
  // new) records to the buffers of the target tensors. Sized once per part (a counting pass for
  // multi-part mappings), then filled with typed word copies: no per-record allocation.
  // Calls f(k0, k1, d, j0) for each maximal group changed[k0 .. k1) of local indices that lie
  // in one run of the mapping (see run_length): changed[k] lands at {d.part, d.index +
  // changed[k] - j0}. One mapping evaluation per run instead of one per element (the mapping's
  // divisions cost more than the rest of the projection). `changed` is sorted.
  template <class Mapping, class F>
  static void for_each_mapped_run(const Mapping& m, std::span<const std::uint64_t> changed, F&& f) {
    const std::size_t n = changed.size();
    for (std::size_t k = 0; k < n;) {
      const std::uint64_t j0 = changed[k];
      const mapped_index d = m(j0);
      const std::uint64_t end = j0 + m.run_length(j0);
      std::size_t k1 = k + 1;
      while (k1 < n && changed[k1] < end) ++k1;
      f(k, k1, d, j0);
      k = k1;
    }
  }

  // Appends the records of task i's changed words to the record buffers of its targets. With
  // `gathered`, the old and new words are the ones detect_and_gather picked up in the detection
  // pass (in the order of changed_[i]); otherwise they are read from the tracker and candidate.
  void project(std::size_t i, std::span<const std::byte> candidate, bool gathered) {
    const auto& task = tasks_[i];
    const std::span<const std::uint64_t> changed = changed_[i];
    if (changed.empty()) return;
    const std::size_t wb = dtype_size(task.type);
    std::visit(
        [&](const auto& m) {
          part_records_.assign(task.targets.size(), nullptr);
          part_fill_.assign(task.targets.size(), 0);
          for (std::size_t p = 0; p < task.targets.size(); ++p) {
            auto* r = &records_[slot_of_.at(task.targets[p])];
            r->word_bytes = wb;
            r->delta_encodable = r->delta_encodable && task.delta_encodable;
            part_records_[p] = r;
          }
          // Coordinates the detect backend projected (check_projected vetted them), or m(j).
          // Groups of changed[k0 .. k1) landing at d.index + changed[k] - j0 in part d.part: one
          // element each from the backend, whole mapping runs otherwise.
          const projected_changes* const pc = projected_[i].valid ? &projected_[i] : nullptr;
          const auto for_each_group = [&](auto&& f) {
            if (pc == nullptr) return for_each_mapped_run(m, changed, f);
            for (std::size_t k = 0; k < changed.size(); ++k)
              f(k, k + 1, mapped_index{pc->part.empty() ? 0u : pc->part[k], pc->index[k]},
                changed[k]);
          };
          if (task.targets.size() == 1) {
            part_fill_[0] = changed.size();
          } else {
            for_each_group([&](std::size_t k0, std::size_t k1, mapped_index d, std::uint64_t) {
              part_fill_[d.part] += k1 - k0;
            });
          }
          for (std::size_t p = 0; p < task.targets.size(); ++p) {
            record_buffer& r = *part_records_[p];
            const std::size_t at = r.indices.size();
            r.indices.resize(at + part_fill_[p]);
            r.old_bytes.resize((at + part_fill_[p]) * wb);
            r.new_bytes.resize((at + part_fill_[p]) * wb);
            part_fill_[p] = at;  // now the next free slot
          }
          visit_word(wb, [&](auto w) {
            using W = decltype(w);
            const W* tracker_words = reinterpret_cast<const W*>(trackers_[i].data());
            const W* candidate_words = reinterpret_cast<const W*>(candidate.data());
            const W* gathered_old = reinterpret_cast<const W*>(gathered_old_[i].data());
            const W* gathered_new = reinterpret_cast<const W*>(gathered_new_[i].data());
            for_each_group([&](std::size_t k0, std::size_t k1, mapped_index d, std::uint64_t j0) {
              record_buffer& r = *part_records_[d.part];
              const std::size_t at = part_fill_[d.part];
              part_fill_[d.part] += k1 - k0;
              std::uint64_t* index = r.indices.data() + at;
              const std::uint64_t shift = d.index - j0;  // modular: d.index + (j - j0)
              for (std::size_t k = k0; k < k1; ++k) index[k - k0] = changed[k] + shift;
              W* old_out = reinterpret_cast<W*>(r.old_bytes.data()) + at;
              W* new_out = reinterpret_cast<W*>(r.new_bytes.data()) + at;
              if (gathered) {
                std::memcpy(old_out, gathered_old + k0, (k1 - k0) * sizeof(W));
                std::memcpy(new_out, gathered_new + k0, (k1 - k0) * sizeof(W));
              } else {
                for (std::size_t k = k0; k < k1; ++k) {
                  old_out[k - k0] = tracker_words[changed[k]];
                  new_out[k - k0] = candidate_words[changed[k]];
                }
              }
            });
          });
        },
        task.mapping);
  }

  // A detect backend's answer for task i must have the shape the owner relies on: one canonical
  // index (and, for a multi-part task, one part below the part count) per changed index.
  void check_projected(std::size_t i) const {
    const projected_changes& p = projected_[i];
    if (!p.valid) return;
    const std::size_t n = changed_[i].size(), parts = tasks_[i].targets.size();
    bool ok = p.index.size() == n && (p.part.size() == n || (parts == 1 && p.part.empty()));
    for (std::size_t k = 0; ok && k < p.part.size(); ++k) ok = p.part[k] < parts;
    DCR_EXPECTS(ok, errc::invalid_argument,
                "owner: detect backend '" + detector_->device() + "' projected task '" +
                    tasks_[i].shard_name + "' inconsistently (" + std::to_string(p.index.size()) +
                    " indices, " + std::to_string(p.part.size()) + " parts for " +
                    std::to_string(n) + " changes)");
  }

  void check_inputs(std::span<const std::span<const std::byte>> shards, const char* what) const {
    DCR_EXPECTS(shards.size() == tasks_.size(), errc::invalid_argument,
                std::string("owner::") + what + ": expected " + std::to_string(tasks_.size()) +
                    " shards, got " + std::to_string(shards.size()));
    for (std::size_t i = 0; i < tasks_.size(); ++i)
      DCR_EXPECTS(shards[i].size() == tasks_[i].bytes(), errc::shape_mismatch,
                  std::string("owner::") + what + ": shard '" + tasks_[i].shard_name + "' has " +
                      std::to_string(shards[i].size()) + " bytes, expected " +
                      std::to_string(tasks_[i].bytes()));
  }

  void check_residual_inputs(std::span<const std::span<const std::byte>> inputs,
                             const char* what) const {
    DCR_EXPECTS(inputs.size() == residual_input_count_, errc::invalid_argument,
                std::string("owner::") + what + ": expected " +
                    std::to_string(residual_input_count_) + " residual inputs, got " +
                    std::to_string(inputs.size()));
    for (std::size_t r = 0; r < residual_.size(); ++r) {
      const auto& task = residual_[r];
      for (std::size_t k = 0; k < task.inputs.size(); ++k) {
        const auto bytes = inputs[residual_state_[r].first_input + k].size();
        DCR_EXPECTS(bytes == task.inputs[k].bytes(), errc::shape_mismatch,
                    std::string("owner::") + what + ": residual task '" + task.name +
                        "' input '" + task.inputs[k].name + "' has " + std::to_string(bytes) +
                        " bytes, expected " + std::to_string(task.inputs[k].bytes()));
      }
    }
  }

  const tensor_registry* registry_;
  std::uint32_t id_;
  std::vector<affine_task> tasks_;
  std::vector<residual_task> residual_;
  std::vector<std::vector<std::byte>> trackers_;
  std::vector<std::vector<std::uint64_t>> changed_;  // per task: local indices of this build
  std::vector<projected_changes> projected_;  // per task: changed_'s coordinates from detector_
  detect_backend* detector_ = nullptr;        // null: detect_changes on this thread
  std::vector<std::vector<std::uint64_t>> transition_changed_;  // per task: union, this transition
  std::vector<std::vector<std::byte>> gathered_old_, gathered_new_;  // per task: words of changed_
  std::vector<std::uint8_t> gathered_;  // per task: gathered_old_/new_ hold changed_'s words
  std::vector<chunk> chunks_;
  std::vector<std::uint8_t> chunk_built_;
  std::vector<item> all_items_;  // build_items(): every chunk's items
  std::uint64_t change_digest_ = 0;
  build_mode last_mode_ = build_mode::changes;
  bool transition_open_ = false;  // a build happened since initialize() / commit()
  std::vector<residual_state> residual_state_;
  std::size_t residual_input_count_ = 0;
  std::vector<std::byte> scratch_;                    // one rebuilt residual output at a time
  std::vector<tensor_id> targets_;                    // distinct targets, first-seen order
  std::vector<std::uint8_t> slot_residual_;           // per slot: built by a residual task
  std::vector<std::uint8_t> overwrite_only_;          // per slot: a receiver takes overwrites only
  std::vector<std::uint32_t> slot_order_;             // slots in tensor id order
  std::unordered_map<tensor_id, std::uint32_t> slot_of_;
  std::vector<record_buffer> records_;
  std::vector<record_buffer*> part_records_;  // project(): part -> record buffer
  std::vector<std::size_t> part_fill_;        // project(): part -> records / next slot
  std::vector<item> items_;
  owner_stats stats_;
  bool initialized_ = false;
  bool built_ = false;
};

/// Packs items into payloads of at most about `bucket_bytes` of raw record bytes (an item is
/// never split across payloads, so one large item makes one large payload). Sequence numbers
/// count from header_template.id.sequence in item order. Each payload is encoded with `encoder` into `out[k]`.
inline void pack_payloads(const tensor_registry& registry, const payload_header& header_template,
                          std::span<const item> items, std::size_t bucket_bytes,
                          payload_encoder& encoder,
                          std::vector<std::vector<std::byte>>& out) {
  out.clear();
  std::size_t begin = 0;
  std::uint32_t sequence = header_template.id.sequence;
  while (begin < items.size()) {
    std::size_t end = begin;
    std::size_t bytes = 0;
    do {
      bytes += items[end].count() * (8 + items[end].word_bytes());
      ++end;
    } while (end < items.size() &&
             bytes + items[end].count() * (8 + items[end].word_bytes()) <= bucket_bytes);
    payload_header h = header_template;
    h.id.sequence = sequence++;
    out.emplace_back();
    encoder.encode(h, items.subspan(begin, end - begin), registry, out.back());
    begin = end;
  }
}

}  // namespace dcr
