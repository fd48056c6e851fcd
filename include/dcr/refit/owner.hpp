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

#include "dcr/refit/owner_stats.hpp"

#include <iterator>
#include <map>

#include "dcr/codec/encode_item.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/detail/parallel.hpp"
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

/// What one owner::build_payloads call measured beside owner::stats().
struct build_payloads_summary {
  double build_seconds = 0;   ///< wall-clock, calling thread: until every chunk was built
  std::uint64_t records = 0;  ///< item::count() summed over every item packed
};

class owner {
 public:
  /// An owner with id `id` (unique among all owners of the model) holding affine `tasks` and
  /// `residual` tasks. Validates the set (validate_task_set): every task against the registry,
  /// and every residual output produced by this owner's one residual task only.
  owner(const tensor_registry& registry, std::uint32_t id, std::vector<affine_task> tasks,
        std::vector<residual_task> residual = {});
  ~owner();

  /// Groups the tasks into chunks of whole canonical tensors of about `bytes` source bytes
  /// each (affine tasks that share a target tensor always share a chunk; each residual task is
  /// a chunk of its own), in tensor id order. Chunks are the unit of pipelining: build_chunk(k)
  /// emits the items of chunk k only, so that chunk k can be packed and sent while k + 1 is
  /// built.
  void set_chunk_bytes(std::size_t bytes);

  /// Number of chunks (see set_chunk_bytes); at least 1 unless the owner has no task.
  [[nodiscard]] std::size_t chunk_count() const noexcept { return chunks_.size(); }

  [[nodiscard]] std::uint32_t id() const noexcept { return id_; }
  [[nodiscard]] std::span<const affine_task> tasks() const noexcept { return tasks_; }
  [[nodiscard]] std::span<const residual_task> residual_tasks() const noexcept;
  /// Number of residual input spans build_items(), initialize() and commit() expect.
  [[nodiscard]] std::size_t residual_input_count() const noexcept { return residual_input_count_; }

  /// Bytes of tracker memory: one copy of every owned shard, affine shards and residual inputs.
  [[nodiscard]] std::uint64_t tracker_bytes() const noexcept;
  /// Bytes of the residual baseline: the committed canonical tensors of the residual tasks.
  [[nodiscard]] std::uint64_t residual_baseline_bytes() const noexcept;

  /// Runs the detect stage of the affine tasks, and the projection of what it finds, through
  /// `backend` from now on (dcr/refit/detect_backend.hpp; e.g. on a GPU); nullptr returns to
  /// the owner's own CPU loop (the default). Everything else stays here, and the items are bit
  /// for bit the same. On an initialized owner the backend is initialized with the trackers at
  /// once. The backend must outlive its use.
  void set_detect_backend(detect_backend* backend);

  /// Where the detect stage runs: "cpu" (the owner's own loop) or the backend's device().
  [[nodiscard]] std::string detect_device() const;

  /// The threads build_payloads shares its work among when given `encoders` encoders: 1 with a
  /// detect backend (it is driven from one thread), else `encoders`.
  [[nodiscard]] std::size_t payload_threads(std::size_t encoders) const noexcept {
    return detector_ != nullptr ? 1 : encoders;
  }

  /// Sets every tracker to the committed words of its task (committed[i] for tasks()[i]) and
  /// every residual input copy to `residual_committed` (flattened, see the file comment), then
  /// builds the residual baseline by converting every residual output from those inputs.
  void initialize(std::span<const std::span<const std::byte>> committed,
                  std::span<const std::span<const std::byte>> residual_committed = {});

  /// Receivers that can take tensors only as overwrite records (the union of
  /// receiver_endpoint::overwrite_only_tensors() over the receivers of a transition; any order).
  /// Replaces the previous set; tensors this owner does not produce are ignored. Throws
  /// unknown_tensor for an id outside the registry.
  void set_overwrite_only(std::span<const tensor_id> tensors);

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
      const codec_options& codec = {}, build_mode mode = build_mode::changes);

  /// Builds the items of chunk `k` only (in tensor id order), like build_items. An attempt
  /// builds chunks 0 .. chunk_count() - 1 in order, all with the same arguments; stats() then
  /// sums them. In mode `changes`, the changed set of a task is united with what earlier
  /// attempts of the same transition (builds since initialize() or the last commit()) sent;
  /// in mode `dense`, every element is sent as an overwrite of `candidates` (pass the trackers,
  /// see tracker(), for a restore of the committed version). commit() needs every chunk built
  /// in the last attempt. The returned items stay valid until the next build_chunk,
  /// build_items or build_payloads call.
  const std::vector<item>& build_chunk(
      std::size_t k, std::span<const std::span<const std::byte>> candidates,
      encoding_policy policy, std::span<const std::span<const std::byte>> residual_inputs = {},
      const codec_options& codec = {}, build_mode mode = build_mode::changes);

  /// Builds every chunk and packs it: byte for byte the payloads, ids and returned sequence of
  ///
  ///     for (k = 0; k < chunk_count(); ++k)
  ///       header.id.sequence = pack_payloads(registry, header,
  ///                                          build_chunk(k, candidates, policy, residual_inputs,
  ///                                                      codec, mode),
  ///                                          bucket_bytes, encoders[0], out_k, ids_k);
  ///
  /// with `out` (and `*ids`) the out_k (ids_k) one after another, and the same owner state after
  /// it (changed set, stats() summed over the chunks, change_digest(), what commit() writes).
  /// The work is shared by encoders.size() threads: the calling thread and encoders.size() - 1
  /// threads started for the call. First every chunk is built (chunks taken in order by whichever
  /// thread is free; distinct chunks touch distinct tasks, tensors and residual states), then
  /// the payloads are numbered in chunk order and compressed on the threads, encoders[t] on
  /// thread t (all encoders must have equal options for the bytes to match the loop's). Unlike
  /// the loop it holds every chunk's items at once, and the conversions of distinct residual
  /// tasks may run at the same time on distinct threads (each task's own conversions never do).
  /// It runs on payload_threads(encoders.size()) threads (the calling thread only with a detect
  /// backend or one encoder). `summary`, if given, receives the time of the build phase and the
  /// records packed. Throws what build_chunk and pack_payloads throw (the first error of any
  /// thread, after every thread has stopped); after an exception the attempt is not built
  /// (commit() refuses) and `out` is unspecified. invalid_argument for no encoder.
  std::uint32_t build_payloads(std::span<const std::span<const std::byte>> candidates,
                               encoding_policy policy,
                               std::span<const std::span<const std::byte>> residual_inputs,
                               const codec_options& codec, build_mode mode,
                               const payload_header& header, std::size_t bucket_bytes,
                               std::span<payload_encoder> encoders,
                               std::vector<std::vector<std::byte>>& out,
                               std::vector<payload_id>* ids = nullptr,
                               build_payloads_summary* summary = nullptr);

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
              std::span<const std::span<const std::byte>> residual_inputs = {});

  /// The committed words of task i (the tracker).
  [[nodiscard]] std::span<const std::byte> tracker(std::size_t i) const { return trackers_.at(i); }
  /// The committed words of input `input` of residual task `task`.
  [[nodiscard]] std::span<const std::byte> residual_input_copy(std::size_t task,
                                                               std::size_t input) const;
  /// The residual baseline of output `output` of residual task `task`: the committed canonical
  /// tensor.
  [[nodiscard]] std::span<const std::byte> residual_baseline(std::size_t task,
                                                             std::size_t output) const;

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

  /// Records of one canonical tensor, gathered from every task that targets it.
  struct record_buffer {
    std::vector<std::uint64_t> indices;
    std::vector<std::byte> old_bytes, new_bytes;
    std::size_t word_bytes = 0;
    bool delta_encodable = true;
    bool sorted = true;  // indices strictly increasing (project() checks where groups meet)
    std::vector<std::uint32_t> perm;
    std::vector<std::uint64_t> tmp_indices;
    std::vector<std::byte> tmp_bytes;

    void clear() {
      indices.clear();
      old_bytes.clear();
      new_bytes.clear();
      delta_encodable = true;
      sorted = true;
    }
    // Tasks of one tensor arrive one after another, each already in increasing order for the
    // monotone mappings (row/column splits, boxes without permutation), so usually no sort;
    // project() keeps `sorted` (a group's indices increase, so only where two groups meet is
    // compared), and no pass over the indices is needed to know.
    void sort_by_index() {
      if (sorted) return;
      sorted = true;
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

  /// What one thread needs to build a chunk besides the chunk's own tasks, slots and residual
  /// states: project()'s part tables and a residual output being rebuilt.
  struct build_scratch {
    std::vector<record_buffer*> part_records;  // project(): part -> record buffer
    std::vector<std::size_t> part_fill;        // project(): part -> records / next slot
    std::vector<std::byte> output;             // one rebuilt residual output at a time
  };

  // a := a united with b (both sorted, distinct).
  static void unite(std::vector<std::uint64_t>& a, const std::vector<std::uint64_t>& b);

  // The checks and the chunk-0 reset of build_chunk (stats, transition state, mode).
  void begin_chunk(std::size_t k, std::span<const std::span<const std::byte>> candidates,
                   std::span<const std::span<const std::byte>> residual_inputs, build_mode mode);

  // Chunk k's items into `items`, its figures added to `stats`: everything build_chunk does that
  // touches only chunk k's tasks, record slots and residual states (plus `scratch`), so distinct
  // chunks can be built at once on distinct threads with distinct scratch, items and stats.
  void build_chunk_items(std::size_t k, std::span<const std::span<const std::byte>> candidates,
                         encoding_policy policy,
                         std::span<const std::span<const std::byte>> residual_inputs,
                         const codec_options& codec, build_mode mode, build_scratch& scratch,
                         std::vector<item>& items, owner_stats& stats);

  // Gives the buffers build_chunk_items lent to `items` back to their record slots (the slots'
  // contents are spent by then: digested, and packed by the caller), so that the next build
  // writes into buffers of the right size, and empties `items`.
  void return_buffers(std::vector<item>& items);

  // Chains the records of a chunk's items (in tensor id order: the item's indices, the new words
  // its record slot kept) into change_digest_.
  void digest_chunk(std::span<const item> items);

  std::uint32_t add_slot(tensor_id target, bool residual);

  static void copy_words(std::vector<std::byte>& dst, std::span<const std::byte> src,
                         std::span<const std::uint64_t> changed, std::size_t word_bytes);

  // Residual task r: change flags from its inputs, then every selected output rebuilt into
  // scratch and compared with its baseline; the differing elements become the records of the
  // output's slot (indices sorted by construction, overwrite only).
  void build_residual(std::size_t r, std::span<const std::span<const std::byte>> residual_inputs,
                      build_mode mode, build_scratch& scratch, owner_stats& stats);

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
      // The group's end: galloping, then a binary search in the last step, so a run of one
      // element costs one comparison and a run of the whole task a logarithm of it.
      std::size_t lo = k + 1, step = 1;
      while (lo < n && changed[lo] < end) {
        const std::size_t next = std::min(n, lo + step);
        if (next == lo + step && changed[next - 1] < end) {
          lo = next;
          step *= 2;
          continue;
        }
        lo = static_cast<std::size_t>(
            std::lower_bound(changed.begin() + static_cast<std::ptrdiff_t>(lo),
                             changed.begin() + static_cast<std::ptrdiff_t>(next), end) -
            changed.begin());
        break;
      }
      f(k, lo, d, j0);
      k = lo;
    }
  }

  // Appends the records of task i's changed words to the record buffers of its targets. With
  // `gathered`, the old and new words are the ones detect_and_gather picked up in the detection
  // pass (in the order of changed_[i]); otherwise they are read from the tracker and candidate.
  void project(std::size_t i, std::span<const std::byte> candidate, bool gathered,
               build_scratch& scratch);

  // A detect backend's answer for task i must have the shape the owner relies on: one canonical
  // index (and, for a multi-part task, one part below the part count) per changed index.
  void check_projected(std::size_t i) const;

  void check_inputs(std::span<const std::span<const std::byte>> shards, const char* what) const;

  void check_residual_inputs(std::span<const std::span<const std::byte>> inputs,
                             const char* what) const;

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
  std::size_t max_output_bytes_ = 0;                  // largest residual output
  build_scratch scratch_;                             // build_chunk's (the calling thread's)
  std::vector<build_scratch> pool_scratch_;           // build_payloads: one per other thread
  std::vector<std::vector<item>> chunk_items_;        // build_payloads: per chunk
  std::vector<owner_stats> chunk_stats_;              // build_payloads: per chunk
  std::vector<tensor_id> targets_;                    // distinct targets, first-seen order
  std::vector<std::uint8_t> slot_residual_;           // per slot: built by a residual task
  std::vector<std::uint8_t> overwrite_only_;          // per slot: a receiver takes overwrites only
  std::vector<std::uint32_t> slot_order_;             // slots in tensor id order
  std::unordered_map<tensor_id, std::uint32_t> slot_of_;
  std::vector<record_buffer> records_;
  std::vector<item> items_;  // build_chunk's
  owner_stats stats_;
  bool initialized_ = false;
  bool built_ = false;
};

namespace detail {
/// How many of `items` (not empty) the next payload of pack_payloads takes: at least one, then
/// as many as keep the raw record bytes within `bucket_bytes`.
std::size_t bucket_item_count(std::span<const item> items, std::size_t bucket_bytes) noexcept;
}  // namespace detail

/// Packs items into payloads of at most about `bucket_bytes` of raw record bytes (an item is
/// never split across payloads, so one large item makes one large payload). Each payload is
/// encoded with `encoder` into `out[k]`; its id is header_template.id with the sequence number
/// header_template.id.sequence + k, written into its bytes and, where `ids` is given, into
/// (*ids)[k] too. Returns the sequence number after the last payload (where the next call of
/// the same attempt starts): the payload sequence is counted here and nowhere else.
std::uint32_t pack_payloads(const tensor_registry& registry,
                            const payload_header& header_template, std::span<const item> items,
                            std::size_t bucket_bytes, payload_encoder& encoder,
                            std::vector<std::vector<std::byte>>& out,
                            std::vector<payload_id>* ids = nullptr);

}  // namespace dcr

#include "dcr/detail/refit/owner.inl"
