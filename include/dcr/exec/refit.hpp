// dcr/exec/refit.hpp: the owner's detect stage and the receiver's apply stage over an execution
// policy, as the hooks dcr::detect_backend (dcr/refit/detect_backend.hpp) and
// dcr::apply_backend (dcr/apply/apply_backend.hpp) that dcr::owner and dcr::receiver call.
//
// Written once over the policy with the exec algorithms (dcr/exec/algorithms.hpp) and the
// policy's memory primitives (make_buffer, upload, download, synchronize), so the same code runs
//   * on the CPU policy (host memory: the tests check it against the owner's and the
//     receiver's own CPU paths, bit for bit), and
//   * on the CUDA policy (kernels/dcr/kernels/exec.cuh, included before this header in a
//     translation unit built with nvcc: `dcr simulate --device cuda`, tools/dcr/simulate_cuda.cu).
//
// policy_detect_backend<P>: the trackers of an owner's affine tasks in the policy's memory (one
// arena), each candidate shard copied into a second arena per detect (a trainer whose shards
// live in device memory would hand them over instead: the dcr::owner API takes host spans);
// detect_compact there, the projection of the changed indices to canonical coordinates there,
// and only the compact results (local indices, canonical indices, parts) copied back. The
// owner reads old and new words from its own host trackers and candidates. After a commit the
// tracker update runs there too (update_tracker over the changed indices and their new words).
//
// policy_apply_backend<P>: a copy of the engine's storage in the policy's memory (`regions`:
// the host buffers the loader's views point into), the plan's placement records with their
// dst pointers moved into that copy, and per item the sorted indices and values copied over
// and apply_item_records run there. upload_storage() / download_storage() move the whole
// storage between the host buffers and the copy (after a dense load through the loader;
// before comparing with a dense refit).
//
// Memory (policy space): detect needs 2 x the shards' bytes (trackers + candidates), the
// outputs of the largest task at a 100% change rate (20 bytes a word: local index, canonical
// index, part) and detect_compact's workspace; apply needs the storage's bytes, the plan's
// records and staging for the largest item seen (grown on demand, the one allocation outside
// prepare).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dcr/apply/apply_backend.hpp"
#include "dcr/apply/placement.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/exec/algorithms.hpp"
#include "dcr/exec/policy.hpp"
#include "dcr/mapping.hpp"
#include "dcr/refit/detect_backend.hpp"
#include "dcr/refit/task.hpp"

namespace dcr::exec {

namespace detail {

inline constexpr std::size_t arena_align = 256;

constexpr std::size_t arena_round(std::size_t x) noexcept {
  return (x + arena_align - 1) / arena_align * arena_align;
}

/// The owning buffer type of policy P for T.
template <class P, class T>
using buffer_of = decltype(make_buffer<T>(std::declval<const P&>(), std::size_t{0}));

/// A buffer of `count` T from the policy (heap-held: device buffers do not move).
template <class T, class P>
std::unique_ptr<buffer_of<P, T>> new_buffer(const P& policy, std::size_t count) {
  return std::unique_ptr<buffer_of<P, T>>(new buffer_of<P, T>(make_buffer<T>(policy, count)));
}

}  // namespace detail

/// An owner's detect stage (detect + compact, projection, tracker update) on policy P. See the
/// file comment; `device` names where P runs, for reports.
template <execution_policy P>
class policy_detect_backend final : public mirrored_detect_backend {
 public:
  explicit policy_detect_backend(P policy, std::string device = "cpu")
      : policy_(std::move(policy)), device_(std::move(device)) {}

  [[nodiscard]] std::string device() const override { return device_; }

  void initialize(std::span<const affine_task> tasks,
                  std::span<const std::span<const std::byte>> committed) override {
    DCR_EXPECTS(tasks.size() == committed.size(), errc::invalid_argument,
                "policy_detect_backend: " + std::to_string(tasks.size()) + " tasks but " +
                    std::to_string(committed.size()) + " trackers");
    tasks_.assign(tasks.begin(), tasks.end());
    offset_.assign(tasks.size(), 0);
    std::size_t total = 0, max_words = 0, ws = 0;
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      DCR_EXPECTS(committed[i].size() == tasks[i].bytes(), errc::shape_mismatch,
                  "policy_detect_backend: tracker of '" + tasks[i].shard_name + "' has " +
                      std::to_string(committed[i].size()) + " bytes, expected " +
                      std::to_string(tasks[i].bytes()));
      offset_[i] = total;
      total += detail::arena_round(committed[i].size());
      const std::size_t n = words_of(i);
      max_words = std::max(max_words, n);
      visit_word(dtype_size(tasks[i].type), [&](auto w) {
        ws = std::max(ws, detect_compact_workspace_bytes<decltype(w)>(policy_, n));
      });
    }
    trackers_ = detail::new_buffer<std::byte>(policy_, std::max<std::size_t>(total, 1));
    candidates_ = detail::new_buffer<std::byte>(policy_, std::max<std::size_t>(total, 1));
    local_ = detail::new_buffer<std::uint64_t>(policy_, std::max<std::size_t>(max_words, 1));
    index_ = detail::new_buffer<std::uint64_t>(policy_, std::max<std::size_t>(max_words, 1));
    part_ = detail::new_buffer<std::uint32_t>(policy_, std::max<std::size_t>(max_words, 1));
    new_words_ = detail::new_buffer<std::uint64_t>(policy_, std::max<std::size_t>(max_words, 1));
    workspace_ = detail::new_buffer<unsigned char>(policy_, std::max<std::size_t>(ws, 1));
    for (std::size_t i = 0; i < tasks.size(); ++i)
      upload(policy_, trackers_->data() + offset_[i], committed[i].data(), committed[i].size());
    synchronize(policy_);
  }

  void detect(std::size_t i, std::span<const std::byte> candidate,
              std::vector<std::uint64_t>& changed, projected_changes& projected) override {
    check_task(i, candidate, "detect");
    const affine_task& task = tasks_[i];
    const std::size_t n = words_of(i);
    std::byte* const cand = candidates_->data() + offset_[i];
    upload(policy_, cand, candidate.data(), candidate.size());
    std::size_t count = 0;
    visit_word(dtype_size(task.type), [&](auto w) {
      using W = decltype(w);
      count = detect_compact<W>(policy_, reinterpret_cast<const W*>(trackers_->data() + offset_[i]),
                                reinterpret_cast<const W*>(cand), n,
                                changed_words<W>{local_->data(), nullptr, nullptr},
                                workspace_->as_workspace(), 0);
    });
    const bool multi = task.targets.size() > 1;
    std::visit(
        [&](const auto& m) {
          project(policy_, m, local_->data(), count, index_->data(),
                  multi ? part_->data() : nullptr);
        },
        task.mapping);
    changed.resize(count);
    projected.index.resize(count);
    projected.part.resize(multi ? count : 0);
    download(policy_, changed.data(), local_->data(), count);
    download(policy_, projected.index.data(), index_->data(), count);
    if (multi) download(policy_, projected.part.data(), part_->data(), count);
    projected.valid = true;
  }

  void commit(std::size_t i, std::span<const std::byte> candidate,
              std::span<const std::uint64_t> changed, bool dense) override {
    check_task(i, candidate, "commit");
    std::byte* const tracker = trackers_->data() + offset_[i];
    if (dense) {  // every word: the candidate is the tracker
      upload(policy_, tracker, candidate.data(), candidate.size());
      synchronize(policy_);
      return;
    }
    // The changed indices and their new words, gathered here from the commit's own candidate
    // (so the update does not depend on which candidate the last detect saw), then scattered
    // into the tracker there.
    const std::size_t m = changed.size();
    DCR_EXPECTS(m <= words_of(i), errc::out_of_range,
                "policy_detect_backend::commit: more changes than words in '" +
                    tasks_[i].shard_name + "'");
    visit_word(dtype_size(tasks_[i].type), [&](auto w) {
      using W = decltype(w);
      const W* const src = reinterpret_cast<const W*>(candidate.data());
      staging_.resize(m * sizeof(W));
      W* const words = reinterpret_cast<W*>(staging_.data());
      for (std::size_t k = 0; k < m; ++k) words[k] = src[changed[k]];
      W* const d_words = reinterpret_cast<W*>(new_words_->data());
      upload(policy_, local_->data(), changed.data(), m);
      upload(policy_, d_words, words, m);
      update_tracker(policy_, reinterpret_cast<W*>(tracker), local_->data(), d_words, m);
    });
    synchronize(policy_);  // staging_ and `changed` may change after this returns
  }

  /// The tracker of task i as the policy holds it, copied to the host (tests, checks).
  [[nodiscard]] std::vector<std::byte> tracker(std::size_t i) override {
    DCR_EXPECTS(i < tasks_.size(), errc::out_of_range, "policy_detect_backend: no task " + std::to_string(i));
    std::vector<std::byte> out(static_cast<std::size_t>(tasks_[i].bytes()));
    download(policy_, out.data(), trackers_->data() + offset_[i], out.size());
    return out;
  }

 private:
  [[nodiscard]] std::size_t words_of(std::size_t i) const {
    return static_cast<std::size_t>(tasks_[i].local_size());
  }

  void check_task(std::size_t i, std::span<const std::byte> candidate, const char* what) const {
    DCR_EXPECTS(trackers_ != nullptr && i < tasks_.size(), errc::not_ready,
                std::string("policy_detect_backend::") + what + ": task " + std::to_string(i) +
                    " unknown (initialize first)");
    DCR_EXPECTS(candidate.size() == tasks_[i].bytes(), errc::shape_mismatch,
                std::string("policy_detect_backend::") + what + ": shard '" +
                    tasks_[i].shard_name + "' has " + std::to_string(candidate.size()) +
                    " bytes, expected " + std::to_string(tasks_[i].bytes()));
  }

  P policy_;
  std::string device_;
  std::vector<affine_task> tasks_;
  std::vector<std::size_t> offset_;  // per task: byte offset in both arenas
  std::unique_ptr<detail::buffer_of<P, std::byte>> trackers_, candidates_;
  std::unique_ptr<detail::buffer_of<P, std::uint64_t>> local_, index_, new_words_;
  std::unique_ptr<detail::buffer_of<P, std::uint32_t>> part_;
  std::unique_ptr<detail::buffer_of<P, unsigned char>> workspace_;
  std::vector<std::byte> staging_;  // host: new words of a commit
};

/// One host buffer of engine storage that a policy_apply_backend mirrors.
struct storage_region {
  std::byte* host = nullptr;
  std::size_t bytes = 0;
};

/// The regions of a storage's host buffers, one per buffer.
inline std::vector<storage_region> storage_regions(std::span<const std::span<std::byte>> buffers) {
  std::vector<storage_region> out;
  out.reserve(buffers.size());
  for (const auto& b : buffers) out.push_back({b.data(), b.size()});
  return out;
}

/// A receiver's compiled-path apply on policy P, into the policy's copy of the engine storage.
/// See the file comment; `device` names where P runs, for reports.
template <execution_policy P>
class policy_apply_backend final : public mirrored_apply_backend {
 public:
  /// Mirrors `regions` (distinct, non-overlapping host buffers holding every element the plan's
  /// records reach) in the policy's memory; call upload_storage() before the first apply.
  policy_apply_backend(P policy, std::span<const storage_region> regions,
                       std::string device = "cpu")
      : policy_(std::move(policy)), device_(std::move(device)), regions_(regions.begin(), regions.end()) {
    std::sort(regions_.begin(), regions_.end(),
              [](const region& a, const region& b) { return a.host < b.host; });
    std::size_t total = 0;
    for (auto& r : regions_) {
      r.offset = total;
      total += detail::arena_round(r.bytes);
    }
    for (std::size_t k = 1; k < regions_.size(); ++k)
      DCR_EXPECTS(regions_[k - 1].host + regions_[k - 1].bytes <= regions_[k].host,
                  errc::invalid_argument, "policy_apply_backend: storage regions overlap");
    storage_ = detail::new_buffer<std::byte>(policy_, std::max<std::size_t>(total, 1));
    counter_ = detail::new_buffer<unsigned char>(
        policy_, std::max<std::size_t>(apply_workspace_bytes(policy_), 1));
  }

  [[nodiscard]] std::string device() const override { return device_; }

  /// Host storage -> the policy's copy (after the loader wrote the host storage).
  void upload_storage() override {
    for (const auto& r : regions_) upload(policy_, storage_->data() + r.offset, r.host, r.bytes);
    synchronize(policy_);
  }

  /// The policy's copy -> host storage (to compare it, or to serve from the host).
  void download_storage() override {
    for (const auto& r : regions_) download(policy_, r.host, storage_->data() + r.offset, r.bytes);
  }

  void prepare(const placement_plan& plan) override {
    std::vector<placement> moved(plan.placements().begin(), plan.placements().end());
    for (placement& p : moved) p.dst = to_space(p);
    records_ = detail::new_buffer<placement>(policy_, std::max<std::size_t>(moved.size(), 1));
    upload(policy_, records_->data(), moved.data(), moved.size());
    synchronize(policy_);
    first_.assign(plan.size(), 0);
    count_.assign(plan.size(), 0);
    for (std::size_t id = 0; id < plan.size(); ++id) {
      const auto& t = plan.at(static_cast<tensor_id>(id));
      first_[id] = t.first_placement;
      count_[id] = static_cast<std::size_t>(t.placements);
    }
  }

  std::uint64_t apply(const item& it) override {
    DCR_EXPECTS(records_ != nullptr && it.tensor < count_.size(), errc::not_ready,
                "policy_apply_backend::apply: tensor " + std::to_string(it.tensor) +
                    " has no prepared placement (prepare first)");
    const std::size_t r = count_[it.tensor], m = it.count();
    if (r == 0 || m == 0) return 0;
    reserve(m, m * it.word_bytes());
    upload(policy_, active_->data(), it.indices.data(), m);
    upload(policy_, values_->data(), it.values.data(), m * it.word_bytes());
    const placement* const records = records_->data() + first_[it.tensor];
    return visit_word(it.word_bytes(), [&](auto w) -> std::uint64_t {
      using W = decltype(w);
      return apply_item_records<W>(policy_, records, r, it.enc, active_->data(), m,
                                   reinterpret_cast<const W*>(values_->data()),
                                   counter_->as_workspace());
    });
  }

 private:
  struct region {
    std::byte* host = nullptr;
    std::size_t bytes = 0;
    std::size_t offset = 0;  // in storage_
    explicit region(const storage_region& s) : host(s.host), bytes(s.bytes) {}
  };

  // Record p's dst moved into the policy's copy; every element the record reaches must lie in
  // one mirrored region.
  std::byte* to_space(const placement& p) const {
    std::int64_t lo = p.inv.dst_origin, hi = p.inv.dst_origin;
    for (int d = 0; d < p.inv.dims; ++d) {
      const std::int64_t reach = (p.inv.extent[static_cast<std::size_t>(d)] - 1) *
                                 p.inv.dst_step[static_cast<std::size_t>(d)];
      (reach < 0 ? lo : hi) += reach;
    }
    const std::byte* const first = p.dst + lo * static_cast<std::int64_t>(p.dst_bytes);
    const std::byte* const end = p.dst + (hi + 1) * static_cast<std::int64_t>(p.dst_bytes);
    auto it = std::upper_bound(regions_.begin(), regions_.end(), first,
                               [](const std::byte* a, const region& r) { return a < r.host; });
    DCR_EXPECTS(it != regions_.begin(), errc::invalid_argument,
                "policy_apply_backend: a placement record of tensor " + std::to_string(p.tensor) +
                    " writes outside the mirrored storage");
    const region& r = *std::prev(it);
    DCR_EXPECTS(end <= r.host + r.bytes, errc::invalid_argument,
                "policy_apply_backend: a placement record of tensor " + std::to_string(p.tensor) +
                    " writes outside the mirrored storage");
    return storage_->data() + r.offset + (p.dst - r.host);
  }

  // Staging for an item of m records and `value_bytes` of values (grows, never shrinks).
  void reserve(std::size_t m, std::size_t value_bytes) {
    if (active_ == nullptr || capacity_ < m || value_capacity_ < value_bytes) {
      capacity_ = std::max(m, 2 * capacity_);
      value_capacity_ = std::max(value_bytes, 2 * value_capacity_);
      active_ = detail::new_buffer<std::uint64_t>(policy_, capacity_);
      values_ = detail::new_buffer<std::byte>(policy_, value_capacity_);
    }
  }

  P policy_;
  std::string device_;
  std::vector<region> regions_;  // by host address
  std::unique_ptr<detail::buffer_of<P, std::byte>> storage_;
  std::unique_ptr<detail::buffer_of<P, placement>> records_;
  std::unique_ptr<detail::buffer_of<P, unsigned char>> counter_;
  std::unique_ptr<detail::buffer_of<P, std::uint64_t>> active_;
  std::unique_ptr<detail::buffer_of<P, std::byte>> values_;
  std::size_t capacity_ = 0, value_capacity_ = 0;
  std::vector<std::size_t> first_, count_;  // per tensor: its records in records_
};

}  // namespace dcr::exec
