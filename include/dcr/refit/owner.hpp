// dcr/refit/owner.hpp: the owner side of a transition: detect, project, encode, pack.
//
// An owner is the one data-parallel replica that compares a set of source shards (its affine
// tasks) with its trackers, the committed version-v words of those shards. For each attempt it
// turns the changed words of the candidate shards into items (one per canonical tensor it
// touches, indices sorted), packs them into payloads, and after the joint commit updates its
// trackers in place. Candidate weights stay fixed for the whole transition, so a retry rebuilds
// exactly the same changed set (with overwrite records).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <unordered_map>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/detect/detect.hpp"
#include "dcr/refit/task.hpp"

namespace dcr {

/// Timings and counts of one build_items() call.
struct owner_stats {
  std::uint64_t compared_bytes = 0;    ///< candidate bytes compared with trackers
  std::uint64_t changed_elements = 0;  ///< source elements whose stored words changed
  std::uint64_t items = 0;             ///< items emitted (canonical tensors touched)
  double detect_seconds = 0;           ///< comparison
  double project_seconds = 0;          ///< projection to canonical coordinates and sorting
  double encode_seconds = 0;           ///< values in the item encoding
};

class owner {
 public:
  /// An owner with id `id` (unique among all owners of the model) holding `tasks`.
  owner(const tensor_registry& registry, std::uint32_t id, std::vector<affine_task> tasks)
      : registry_(&registry), id_(id), tasks_(std::move(tasks)) {
    trackers_.resize(tasks_.size());
    changed_.resize(tasks_.size());
    for (const auto& t : tasks_) {
      validate_task(t, registry);
      for (auto target : t.targets)
        if (!slot_of_.contains(target)) {
          slot_of_.emplace(target, static_cast<std::uint32_t>(targets_.size()));
          targets_.push_back(target);
        }
    }
    records_.resize(targets_.size());
  }

  [[nodiscard]] std::uint32_t id() const noexcept { return id_; }
  [[nodiscard]] std::span<const affine_task> tasks() const noexcept { return tasks_; }
  /// Bytes of tracker memory (one copy of every owned shard).
  [[nodiscard]] std::uint64_t tracker_bytes() const noexcept {
    std::uint64_t b = 0;
    for (const auto& t : trackers_) b += t.size();
    return b;
  }

  /// Sets every tracker to the committed words of its task (committed[i] for tasks()[i]).
  void initialize(std::span<const std::span<const std::byte>> committed) {
    check_inputs(committed, "initialize");
    for (std::size_t i = 0; i < tasks_.size(); ++i)
      trackers_[i].assign(committed[i].begin(), committed[i].end());
    initialized_ = true;
  }

  /// Compares candidates[i] with the tracker of tasks()[i] and emits one item per canonical
  /// tensor touched, in tensor id order, with sorted indices, encoded as `policy` permits:
  /// overwrite_only -> overwrite; otherwise xor (ulp for ulp_only) where the task is
  /// delta_encodable, overwrite elsewhere. Remembers the changed set for commit().
  const std::vector<item>& build_items(std::span<const std::span<const std::byte>> candidates,
                                       encoding_policy policy) {
    DCR_EXPECTS(initialized_, errc::not_ready, "owner::build_items before initialize");
    check_inputs(candidates, "build_items");
    stats_ = {};
    for (auto& r : records_) r.clear();
    items_.clear();

    auto t0 = clock::now();
    for (std::size_t i = 0; i < tasks_.size(); ++i) {
      changed_[i].clear();
      visit_word(dtype_size(tasks_[i].type), [&](auto w) {
        using W = decltype(w);
        detect_changes<W>(words_of<W>(trackers_[i]), words_of<W>(candidates[i]), changed_[i]);
      });
      stats_.compared_bytes += candidates[i].size();
      stats_.changed_elements += changed_[i].size();
    }
    auto t1 = clock::now();
    for (std::size_t i = 0; i < tasks_.size(); ++i) project(i, candidates[i]);
    for (auto& r : records_) r.sort_by_index();
    auto t2 = clock::now();

    std::vector<std::uint32_t> order(targets_.size());
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(),
              [&](auto a, auto b) { return targets_[a] < targets_[b]; });
    for (auto slot : order) {
      const auto& r = records_[slot];
      if (r.indices.empty()) continue;
      const auto& t = registry_->at(targets_[slot]);
      const encoding enc = choose_encoding(policy, r.delta_encodable);
      visit_word(dtype_size(t.type), [&](auto w) {
        using W = decltype(w);
        items_.push_back(make_item<W>(targets_[slot], t.type, enc, r.indices, r.old_words<W>(),
                                      r.new_words<W>()));
      });
    }
    auto t3 = clock::now();
    stats_.items = items_.size();
    stats_.detect_seconds = seconds(t1 - t0);
    stats_.project_seconds = seconds(t2 - t1);
    stats_.encode_seconds = seconds(t3 - t2);
    built_ = true;
    return items_;
  }

  /// Statistics of the last build_items().
  [[nodiscard]] const owner_stats& stats() const noexcept { return stats_; }

  /// After the joint commit: writes the changed words of the candidates (the same ones the last
  /// build_items() saw) into the trackers, in place. Only changed words are touched.
  void commit(std::span<const std::span<const std::byte>> candidates) {
    DCR_EXPECTS(built_, errc::not_ready, "owner::commit without a built changed set");
    check_inputs(candidates, "commit");
    for (std::size_t i = 0; i < tasks_.size(); ++i) {
      const std::size_t wb = dtype_size(tasks_[i].type);
      std::byte* dst = trackers_[i].data();
      const std::byte* src = candidates[i].data();
      for (auto j : changed_[i]) std::memcpy(dst + j * wb, src + j * wb, wb);
    }
    built_ = false;
  }

  /// The committed words of task i (the tracker).
  [[nodiscard]] std::span<const std::byte> tracker(std::size_t i) const { return trackers_.at(i); }

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
    template <storage_word W> std::span<const W> old_words() const {
      return {reinterpret_cast<const W*>(old_bytes.data()), indices.size()};
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

  static encoding choose_encoding(encoding_policy policy, bool delta_encodable) {
    if (policy == encoding_policy::overwrite_only || !delta_encodable) return encoding::overwrite;
    if (policy == encoding_policy::ulp_only) return encoding::ulp;
    return encoding::xor_mask;
  }

  template <storage_word W>
  static std::span<const W> words_of(std::span<const std::byte> bytes) {
    return {reinterpret_cast<const W*>(bytes.data()), bytes.size() / sizeof(W)};
  }

  // Projects task i's changed local indices to canonical coordinates and appends (index, old,
  // new) records to the buffers of the target tensors. Sized once per part (a counting pass for
  // multi-part mappings), then filled with typed word copies: no per-record allocation.
  void project(std::size_t i, std::span<const std::byte> candidate) {
    const auto& task = tasks_[i];
    const auto& changed = changed_[i];
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
          if (task.targets.size() == 1) {
            part_fill_[0] = changed.size();
          } else {
            for (auto j : changed) ++part_fill_[m(j).part];
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
            const W* old_words = reinterpret_cast<const W*>(trackers_[i].data());
            const W* new_words = reinterpret_cast<const W*>(candidate.data());
            for (auto j : changed) {
              const mapped_index d = m(j);
              record_buffer& r = *part_records_[d.part];
              const std::size_t at = part_fill_[d.part]++;
              r.indices[at] = d.index;
              reinterpret_cast<W*>(r.old_bytes.data())[at] = old_words[j];
              reinterpret_cast<W*>(r.new_bytes.data())[at] = new_words[j];
            }
          });
        },
        task.mapping);
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

  const tensor_registry* registry_;
  std::uint32_t id_;
  std::vector<affine_task> tasks_;
  std::vector<std::vector<std::byte>> trackers_;
  std::vector<std::vector<std::uint64_t>> changed_;  // per task: changed local indices
  std::vector<tensor_id> targets_;                    // distinct targets, first-seen order
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
/// count from 0 in item order. Each payload is encoded with `encoder` into `out[k]`.
inline void pack_payloads(const tensor_registry& registry, const payload_header& header_template,
                          std::span<const item> items, std::size_t bucket_bytes,
                          payload_encoder& encoder,
                          std::vector<std::vector<std::byte>>& out) {
  out.clear();
  std::size_t begin = 0;
  std::uint32_t sequence = 0;
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
