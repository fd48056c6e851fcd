// dcr/io/checkpoint.hpp: the codec on whole safetensors checkpoints: diff two checkpoints into a
// delta file, apply a delta to a base checkpoint (to a new file, or in place with crash
// recovery), and recover an interrupted in-place apply. The `dcr diff|apply|recover` commands
// are thin wrappers over these functions (docs/tool.md).
//
// Whole checkpoints use the codec with a single owner and the identity mapping: the canonical
// tensors are the file's tensors, the registry is built from their names, dtypes and shapes, and
// every changed element becomes a record of an item of its tensor.
//
// Guarantees:
//   - diff reads each file once, tensor by tensor in cache-sized chunks (digest, compare and
//     gather in one pass), and keeps at most about two payloads' records in raw form (one
//     being filled by the scan, one being encoded by the worker thread; see checkpoint_differ).
//     The delta's bytes depend on the options (policy, level, payload_records), not on the
//     worker thread or on how the checkpoints are held.
//   - apply refuses a base that is not the delta's base (other names, dtypes or shapes, another
//     JSON header content, or another XXH3-128 tensors digest) before creating anything, and
//     publishes the output only after the result's tensors digest matched (temporary file,
//     fsync, rename, fsync dir).
//   - apply_in_place never leaves a partly applied file at the base path: the base path holds the
//     old file, the new file, or (between the steps of in_place_step) nothing, while a journal
//     beside it lets recover_in_place (or the next in-place apply) roll forward.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dcr/apply/record.hpp"
#include "dcr/canonical.hpp"
#include "dcr/codec/encode_item.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/detect/detect.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"
#include "dcr/error_text.hpp"
#include "dcr/io/delta.hpp"
#include "dcr/io/file.hpp"
#include "dcr/io/safetensors.hpp"
#include "dcr/pipeline.hpp"

namespace dcr::io {

// ------------------------------------------------------------------------------------------------
// Shared checks

namespace detail {

using clock = std::chrono::steady_clock;
inline double seconds_since(clock::time_point t) {
  return std::chrono::duration<double>(clock::now() - t).count();
}

inline std::string shape_string(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace detail

/// Which input of a checkpoint operation an error is about: what a tool needs to tell a user
/// which file to look at (`dcr` maps each to its own exit status, docs/tool.md).
enum class input_fault : std::uint8_t {
  delta,       ///< the delta file (or sharded delta) is damaged or malformed
  checkpoint,  ///< a checkpoint (OLD, NEW, BASE, a shard, an index) is malformed, or OLD and
               ///< NEW do not match each other
  wrong_base,  ///< BASE is well formed but is not the delta's base
};

/// A dcr::error about one input (input_fault); code and text are the original error's.
class input_error : public error {
 public:
  input_error(input_fault fault, errc code, const std::string& text)
      : error(code, text), fault_(fault) {}
  [[nodiscard]] input_fault fault() const noexcept { return fault_; }

 private:
  input_fault fault_;
};

/// Runs `f`, turning a dcr::error it throws into an input_error of `fault` (io_error, not_ready
/// and errors already attributed pass unchanged: a file that cannot be read is not malformed).
template <class F>
decltype(auto) blame(input_fault fault, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const input_error&) {
    throw;
  } catch (const error& e) {
    if (e.dcr_code() == errc::io_error || e.dcr_code() == errc::not_ready) throw;
    throw input_error(fault, e.dcr_code(), error_text(e));
  }
}

/// Receives, for a progress display, the bytes an operation has processed so far and the bytes
/// it processes in all. `total` is fixed when the operation starts (an in-place apply that first
/// finishes an interrupted one reports the recovery, then the apply, each from 0); `done` grows
/// to it. Called on the calling thread between steps; it changes nothing the operation does.
using progress_callback = std::function<void(std::uint64_t done, std::uint64_t total)>;

namespace detail {

// Counts the bytes an apply or recovery processed against the total it planned at its start,
// and reports them to its progress_callback (none: does nothing). What counts: each pass over a
// file's tensors (digest, copy) the tensor bytes; each pass applying payloads (or building a
// journal from them) the bytes of the elements they write, records times word size
// (changed_bytes). Work found unnecessary on the way is counted as done when skipped, so that
// `done` reaches `total`, and never passes it, on every successful path (tests/io check it).
class progress_meter {
 public:
  progress_meter(const progress_callback& callback, std::uint64_t total)
      : callback_(callback ? &callback : nullptr), total_(total) {}
  progress_meter(const progress_meter&) = delete;
  progress_meter& operator=(const progress_meter&) = delete;

  /// Whether anyone listens (planning the total costs a look at the payloads' item tables).
  [[nodiscard]] bool enabled() const noexcept { return callback_ != nullptr; }
  /// `bytes` more are processed (or skipped).
  void advance(std::uint64_t bytes) {
    if (callback_ == nullptr) return;
    done_ += bytes;
    (*callback_)(done_, total_);
  }

 private:
  const progress_callback* callback_ = nullptr;
  std::uint64_t total_ = 0;
  std::uint64_t done_ = 0;
};

}  // namespace detail

/// Throws unless `actual` holds exactly the tensors `expected` lists, with the same dtypes and
/// shapes. The message names both files and lists the first differences (at most five) with
/// their total; the code is that of the first difference: unknown_tensor (a tensor in only one
/// of them), dtype_mismatch or shape_mismatch.
inline void require_same_tensors(std::span<const canonical_tensor> expected,
                                 std::string_view expected_what,
                                 const safetensors_header& actual, std::string_view actual_what) {
  std::vector<std::string> differences;
  errc first = errc::ok;
  const auto note = [&](errc code, std::string what) {
    if (first == errc::ok) first = code;
    if (differences.size() < 5) differences.push_back(std::move(what));
    else differences.emplace_back();
  };
  std::unordered_map<std::string_view, const canonical_tensor*> by_name;
  by_name.reserve(expected.size());
  for (const auto& t : expected) by_name.emplace(t.name, &t);
  std::vector<const canonical_tensor*> sorted;
  for (const auto& t : expected) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto a, auto b) { return a->name < b->name; });
  for (const auto* t : sorted) {
    const auto* a = actual.find(t->name);
    if (a == nullptr) {
      note(errc::unknown_tensor, "'" + t->name + "' only in " + std::string(expected_what));
    } else if (a->type != t->type) {
      note(errc::dtype_mismatch, "'" + t->name + "' is " + std::string(dtype_name(t->type)) +
                                     " in " + std::string(expected_what) + ", " +
                                     std::string(dtype_name(a->type)) + " in " +
                                     std::string(actual_what));
    } else if (a->shape != t->shape) {
      note(errc::shape_mismatch, "'" + t->name + "' has shape " + detail::shape_string(t->shape) +
                                     " in " + std::string(expected_what) + ", " +
                                     detail::shape_string(a->shape) + " in " +
                                     std::string(actual_what));
    }
  }
  std::vector<const safetensors_entry*> extra;
  for (const auto& a : actual.tensors())
    if (by_name.find(a.name) == by_name.end()) extra.push_back(&a);
  std::sort(extra.begin(), extra.end(), [](auto a, auto b) { return a->name < b->name; });
  for (const auto* a : extra)
    note(errc::unknown_tensor, "'" + a->name + "' only in " + std::string(actual_what));
  if (differences.empty()) return;
  std::string msg = std::string(expected_what) + " and " + std::string(actual_what) +
                    " differ in their tensors (" + std::to_string(differences.size()) +
                    " difference" + (differences.size() == 1 ? "" : "s") +
                    "; both must hold the same names, dtypes and shapes): ";
  for (std::size_t i = 0; i < std::min<std::size_t>(differences.size(), 5); ++i)
    msg += (i ? "; " : "") + differences[i];
  if (differences.size() > 5) msg += "; ...";
  throw error(first, msg);
}

// ------------------------------------------------------------------------------------------------
// diff

/// Settings of diff_checkpoints and checkpoint_differ.
struct diff_options {
  /// Which encodings items may use: mixed (smallest per item), xor_only, ulp_only,
  /// overwrite_only. Whole checkpoints always permit deltas, so xor_only and ulp_only use their
  /// encoding for every item.
  encoding_policy policy = encoding_policy::mixed;
  int zstd_level = 1;  ///< zstd level of every stream
  /// Soft bound of the records one payload holds: a payload is closed once it reaches this many.
  /// The records of at most two payloads (one with worker_thread false) are held in raw form,
  /// about 12 bytes each.
  std::size_t payload_records = std::size_t{1} << 21;
  /// Encode, compress and hand over each payload on a second thread while the calling thread
  /// scans on (digest, compare, gather): close to twice the speed where two cores are free. The
  /// payloads' bytes do not depend on it; false keeps all the work on the calling thread.
  bool worker_thread = true;
  /// Called on the calling thread after each tensor is scanned with the tensor bytes scanned so
  /// far and in all (of this diff; for sharded checkpoints, of all shards): for progress
  /// displays. Does not change the delta.
  progress_callback progress = {};
};

/// What a diff did.
struct diff_report {
  std::uint64_t tensors = 0;
  std::uint64_t changed_tensors = 0;
  std::uint64_t elements = 0;          ///< elements of all tensors
  std::uint64_t changed_elements = 0;  ///< elements whose stored bits differ
  std::uint64_t checkpoint_bytes = 0;  ///< size of the NEW file (diff of files only)
  std::uint64_t tensor_bytes = 0;      ///< bytes of all tensors
  std::uint64_t delta_bytes = 0;       ///< size of the delta file written (diff of files only)
  std::uint64_t payloads = 0;
  std::uint64_t items = 0;
  std::array<std::uint64_t, 3> items_by_encoding{};    ///< indexed by dcr::encoding value
  std::array<std::uint64_t, 3> records_by_encoding{};  ///< indexed by dcr::encoding value
  double seconds = 0;  ///< wall time of the whole diff (opening the files included)
  /// Calling thread: opening, digest, compare and gather (seconds less the calling thread's
  /// share of encode, write and wait).
  double scan_seconds = 0;
  /// Encoding choice, values and compression, on whichever thread did them (with the worker
  /// thread this overlaps scan_seconds).
  double encode_seconds = 0;
  /// Handing payloads over (writing them to the delta file) and, for files, the final write,
  /// fsync and rename.
  double write_seconds = 0;
  /// Calling thread waiting for the worker thread: both payload slots busy, or the last payload.
  double wait_seconds = 0;
};

/// The bytes of one tensor in the old and in the new checkpoint (little-endian words).
struct tensor_pair {
  std::span<const std::byte> old_bytes;
  std::span<const std::byte> new_bytes;
};

/// XXH3-128 digests of one tensor's bytes in the old and the new checkpoint.
struct tensor_digests {
  digest128 old_digest;
  digest128 new_digest;
};

/// Diffs checkpoints into payloads, and files into delta files. Owns the scratch, the codec
/// contexts, two pools of items (payload slots) and, with options().worker_thread, one
/// dcr::pipeline_stage of depth 1 (dcr/pipeline.hpp) whose thread starts with the first payload
/// or prefetch and is joined by the destructor: a reused differ allocates nothing once warm.
/// Not copyable or movable; one diff at a time.
///
/// The calling thread scans tensor by tensor in 128 KiB chunks of each checkpoint: digests the
/// chunks (when asked), then compares and gathers them (detect_and_gather) while they are in
/// cache, filling a payload slot; a full slot (payload_records) goes to the worker, which
/// chooses each item's encoding, turns the gathered words into values in place, encodes and
/// compresses the payload and hands it to the caller's sink, while the scan fills the other
/// slot. Between payloads the worker of a diff of files maps the files' pages in ahead of the
/// scan (the stage's idle work). Without a worker the calling thread does it all, in the same
/// order. An error on the worker (encoder, `on_payload`) is rethrown, as thrown, on the calling
/// thread by the next hand-over or the end of the diff.
class checkpoint_differ {
 public:
  explicit checkpoint_differ(diff_options options = {})
      : options_(options),
        codec_(codec_with_level(options.zstd_level)),
        encoder_(codec_),
        // Depth 1 with two slots: the worker holds at most one slot (queued or being encoded)
        // while the scan fills the other, so raw records stay within two payloads.
        stage_(1, [this](std::size_t& slot_index) { encode_slot(slots_[slot_index]); },
               [this] { return prefault_step(); }) {
    DCR_EXPECTS(options.payload_records > 0, errc::invalid_argument,
                "diff: payload_records must be positive");
  }
  checkpoint_differ(const checkpoint_differ&) = delete;
  checkpoint_differ& operator=(const checkpoint_differ&) = delete;
  /// Joins the worker thread (the stage is the last member, so it goes first).
  ~checkpoint_differ() = default;

  [[nodiscard]] const diff_options& options() const noexcept { return options_; }

  /// Writes the delta from `old_file` to `new_file` at `delta_path` (atomically). Both must
  /// hold the same tensor names, dtypes and shapes (require_same_tensors).
  diff_report diff(const safetensors_file& old_file, const safetensors_file& new_file,
                   const std::filesystem::path& delta_path) {
    const auto start = detail::clock::now();
    const std::string old_what = "OLD '" + old_file.path().string() + "'";
    const std::string new_what = "NEW '" + new_file.path().string() + "'";
    const auto tensors = old_file.header().canonical_tensors();
    blame(input_fault::checkpoint,
          [&] { require_same_tensors(tensors, old_what, new_file.header(), new_what); });
    file_registry_ = tensor_registry(tensors);
    pairs_.resize(file_registry_.size());
    digests_.resize(file_registry_.size());
    for (tensor_id id = 0; id < file_registry_.size(); ++id) {
      const std::string& name = file_registry_.tensors()[id].name;
      pairs_[id] = {old_file.data(*old_file.find(name)), new_file.data(*new_file.find(name))};
    }

    delta_writer writer(delta_path, container_kind::delta, file_registry_,
                        new_file.header_json(), old_file.header_json());
    // The worker maps the files' pages in ahead of the scan between payloads (when the files
    // were opened without populating them, see diff_checkpoints).
    diff_report report = scan_and_encode(
        file_registry_, pairs_,
        [&writer](std::span<const std::byte> payload) { writer.append_payload(payload); },
        digests_, options_.worker_thread);
    const double call = report.seconds;
    {
      std::vector<digest128> old_digests, new_digests;
      for (const auto& d : digests_) {
        old_digests.push_back(d.old_digest);
        new_digests.push_back(d.new_digest);
      }
      writer.set_digests(tensors_digest(old_digests), tensors_digest(new_digests));
    }
    const auto t0 = detail::clock::now();
    report.delta_bytes = writer.commit();
    const double commit = detail::seconds_since(t0);
    report.write_seconds += commit;
    report.checkpoint_bytes = new_file.bytes().size();
    report.seconds = detail::seconds_since(start);
    // Checking the tensors and opening the writer count as scanning.
    report.scan_seconds += std::max(0.0, report.seconds - call - commit);
    return report;
  }

  /// Diffs checkpoints held in memory: tensors[id] holds the bytes of registry tensor `id` in
  /// the old and the new checkpoint (each exactly its numel * dtype size bytes; any alignment).
  /// Calls `on_payload` with each payload, in sequence order (owner 0, sequence 0, 1, ...;
  /// transition delta_format::forward), from the worker thread when there is one (one call at a
  /// time; the bytes are valid during the call). When `digests` is not empty it must hold
  /// registry.size() entries and receives each tensor's XXH3-128 digests. Throws
  /// shape_mismatch (a tensor of the wrong size) or invalid_argument (counts) before scanning,
  /// and rethrows what the encoder or `on_payload` throws (after the worker has stopped using
  /// the arguments). The report's file fields (checkpoint_bytes, delta_bytes) are zero.
  diff_report diff_tensors(const tensor_registry& registry, std::span<const tensor_pair> tensors,
                           const std::function<void(std::span<const std::byte>)>& on_payload,
                           std::span<tensor_digests> digests = {}) {
    return scan_and_encode(registry, tensors, on_payload, digests, false);
  }

 private:
  // diff_tensors; `prefault`: the worker maps in the tensors' pages ahead of the scan.
  diff_report scan_and_encode(const tensor_registry& registry,
                              std::span<const tensor_pair> tensors,
                              const std::function<void(std::span<const std::byte>)>& on_payload,
                              std::span<tensor_digests> digests, bool prefault) {
    const auto start = detail::clock::now();
    DCR_EXPECTS(tensors.size() == registry.size(), errc::invalid_argument,
                "diff: " + std::to_string(tensors.size()) + " tensor pairs for a registry of " +
                    std::to_string(registry.size()) + " tensors");
    DCR_EXPECTS(digests.empty() || digests.size() == registry.size(), errc::invalid_argument,
                "diff: room for " + std::to_string(digests.size()) +
                    " digests for a registry of " + std::to_string(registry.size()) +
                    " tensors");
    for (tensor_id id = 0; id < registry.size(); ++id) {
      const canonical_tensor& t = registry.tensors()[id];
      const auto bytes = static_cast<std::uint64_t>(t.bytes());
      DCR_EXPECTS(tensors[id].old_bytes.size() == bytes && tensors[id].new_bytes.size() == bytes,
                  errc::shape_mismatch,
                  "diff: tensor '" + t.name + "' has " + std::to_string(bytes) + " bytes, given " +
                      std::to_string(tensors[id].old_bytes.size()) + " old and " +
                      std::to_string(tensors[id].new_bytes.size()) + " new");
    }

    diff_report report;
    report.tensors = registry.size();
    registry_ = &registry;
    on_payload_ = &on_payload;
    worker_stats_ = {};
    sequence_ = 0;
    wait_seconds_ = 0;
    caller_work_seconds_ = 0;
    for (auto& b : slots_) {
      b.used = 0;
      b.records = 0;
    }
    filling_ = 0;
    {
      // Whatever happens, the worker is done with this call's arguments before it returns.
      struct settle {
        checkpoint_differ& self;
        ~settle() { self.settle_worker(); }
      } guard{*this};
      // The digests stay on this thread: each chunk is digested while in cache for the compare,
      // where digesting it again from memory on the worker would cost more than it saves.
      const bool digest = !digests.empty();
      if (options_.worker_thread && prefault) start_prefault(tensors);
      std::uint64_t total_bytes = 0;
      for (tensor_id id = 0; id < registry.size(); ++id)
        total_bytes += static_cast<std::uint64_t>(registry.tensors()[id].bytes());
      for (tensor_id id = 0; id < registry.size(); ++id) {
        const canonical_tensor& t = registry.tensors()[id];
        if (digest) {
          old_digest_.reset();
          new_digest_.reset();
        }
        const std::uint64_t before = report.changed_elements;
        visit_word(dtype_size(t.type), [&]<class W>(W) {
          scan_tensor<W>(id, t.type, tensors[id], digest, report);
        });
        if (digest) digests[id] = {old_digest_.digest(), new_digest_.digest()};
        report.elements += static_cast<std::uint64_t>(t.numel());
        report.tensor_bytes += static_cast<std::uint64_t>(t.bytes());
        report.changed_tensors += report.changed_elements != before ? 1 : 0;
        if (options_.progress) options_.progress(report.tensor_bytes, total_bytes);
      }
      if (slots_[filling_].used != 0) submit();
      wait_idle();
    }
    registry_ = nullptr;
    on_payload_ = nullptr;
    report.payloads = worker_stats_.payloads;
    report.items = worker_stats_.items;
    report.items_by_encoding = worker_stats_.items_by_encoding;
    report.records_by_encoding = worker_stats_.records_by_encoding;
    report.encode_seconds = worker_stats_.encode_seconds;
    report.write_seconds = worker_stats_.write_seconds;
    report.wait_seconds = wait_seconds_;
    report.seconds = detail::seconds_since(start);
    report.scan_seconds = std::max(0.0, report.seconds - wait_seconds_ - caller_work_seconds_);
    return report;
  }

  // Bytes of each checkpoint compared per step: both chunks stay in L2 between digest and
  // compare. Payload boundaries fall on these chunks, so it is part of what the bytes depend on.
  static constexpr std::size_t scan_chunk_bytes = 128 * 1024;
  // Bytes of each checkpoint the worker maps in between looks at the payload queue.
  static constexpr std::size_t prefault_step_bytes = 4 * 1024 * 1024;

  // One payload's items: items[0, used) are closed; items[used] is the item being filled.
  // Each item holds its indices and, in `values`, the gathered old words (turned into values in
  // place by the encoder); new_words[i] holds the new words of items[i].
  struct slot {
    std::vector<item> items;
    std::vector<std::vector<std::byte>> new_words;
    std::size_t used = 0;
    std::size_t records = 0;  // of the closed items
    std::uint32_t sequence = 0;
  };

  struct worker_stats {
    std::uint64_t payloads = 0, items = 0;
    std::array<std::uint64_t, 3> items_by_encoding{}, records_by_encoding{};
    double encode_seconds = 0, write_seconds = 0;
  };

  // The item of `s` being filled, for tensor `id`, emptied, with room for what it can gather
  // before the payload fills (at most the rest of the tensor).
  item& open_item(slot& s, tensor_id id, dtype type, std::size_t words_left,
                  std::size_t word_bytes) {
    if (s.used == s.items.size()) {
      s.items.emplace_back();
      s.new_words.emplace_back();
    }
    item& it = s.items[s.used];
    it.tensor = id;
    it.type = type;
    it.enc = encoding::overwrite;
    it.indices.clear();
    it.values.clear();
    s.new_words[s.used].clear();
    const std::size_t room =
        std::min(words_left, options_.payload_records - std::min(options_.payload_records,
                                                                 s.records) +
                                 scan_chunk_bytes / word_bytes);
    it.indices.reserve(room);
    it.values.reserve(room * word_bytes);
    s.new_words[s.used].reserve(room * word_bytes);
    return it;
  }

  void close_item(slot& s, diff_report& report) {
    const std::size_t count = s.items[s.used].count();
    if (count == 0) return;
    s.records += count;
    ++s.used;
    report.changed_elements += count;
  }

  template <storage_word W>
  void scan_tensor(tensor_id id, dtype type, const tensor_pair& pair, bool digest,
                   diff_report& report) {
    constexpr std::size_t chunk_words = scan_chunk_bytes / sizeof(W);
    const std::size_t n = pair.old_bytes.size() / sizeof(W);
    const bool aligned = (reinterpret_cast<std::uintptr_t>(pair.old_bytes.data()) |
                          reinterpret_cast<std::uintptr_t>(pair.new_bytes.data())) %
                             alignof(W) == 0;
    if (!aligned) {
      bounce_old_.resize(scan_chunk_bytes / sizeof(std::uint64_t));
      bounce_new_.resize(scan_chunk_bytes / sizeof(std::uint64_t));
    }
    slot* s = &slots_[filling_];
    item* it = &open_item(*s, id, type, n, sizeof(W));
    for (std::size_t start = 0; start < n; start += chunk_words) {
      const std::size_t len = std::min(chunk_words, n - start);
      const auto ob = pair.old_bytes.subspan(start * sizeof(W), len * sizeof(W));
      const auto nb = pair.new_bytes.subspan(start * sizeof(W), len * sizeof(W));
      if (digest) {
        old_digest_.update(ob);
        new_digest_.update(nb);
      }
      const W* a = reinterpret_cast<const W*>(ob.data());
      const W* b = reinterpret_cast<const W*>(nb.data());
      if (!aligned) {  // safetensors does not align tensors; compare from aligned copies
        std::memcpy(bounce_old_.data(), ob.data(), ob.size());
        std::memcpy(bounce_new_.data(), nb.data(), nb.size());
        a = reinterpret_cast<const W*>(bounce_old_.data());
        b = reinterpret_cast<const W*>(bounce_new_.data());
      }
      detect_and_gather<W>({a, len}, {b, len}, it->indices, it->values, s->new_words[s->used],
                           start);
      if (s->records + it->count() >= options_.payload_records) {
        close_item(*s, report);
        submit();
        s = &slots_[filling_];
        it = &open_item(*s, id, type, n - start - len, sizeof(W));
      }
    }
    close_item(*s, report);
  }

  // Hands the slot being filled to the worker (or encodes it here) and makes the other slot
  // the one being filled. The stage's depth of 1 makes submit wait until the worker is done
  // with the other slot (the previous payload), so it is free once this returns; a pending
  // error of the worker is rethrown instead.
  void submit() {
    slot& s = slots_[filling_];
    s.sequence = sequence_++;
    const auto t0 = detail::clock::now();
    if (!options_.worker_thread) {
      encode_slot(s);
      caller_work_seconds_ += detail::seconds_since(t0);
      return;
    }
    stage_.submit(filling_);
    filling_ ^= 1;
    wait_seconds_ += detail::seconds_since(t0);
  }

  // Waits until the worker has encoded every submitted slot; rethrows its error.
  void wait_idle() {
    if (!options_.worker_thread) return;
    const auto t0 = detail::clock::now();
    stage_.drain();
    wait_seconds_ += detail::seconds_since(t0);
  }

  // After a call, normal or not: the worker drops what is queued and the prefetch, finishes
  // what it is doing and forgets any error, so the differ can be used again and the call's
  // arguments are no longer touched.
  void settle_worker() noexcept { stage_.discard(); }

  // Gives the worker the pages of every tensor to map in, as the stage's idle work. The state
  // below is written here before wake_idle() and read only by the stage's thread until the
  // next discard(), which waits for the idle step in progress.
  void start_prefault(std::span<const tensor_pair> tensors) {
    prefault_tensors_ = tensors;
    prefault_id_ = 0;
    prefault_at_ = 0;
    if (!tensors.empty()) stage_.wake_idle();
  }

  // One step of the background mapping (stage thread, between payloads): the next
  // prefault_step_bytes of the current tensor in both checkpoints. Returns whether there is more.
  bool prefault_step() noexcept {
    if (prefault_id_ >= prefault_tensors_.size()) return false;
    const tensor_pair& p = prefault_tensors_[prefault_id_];
    const std::size_t len = std::min(prefault_step_bytes, p.old_bytes.size() - prefault_at_);
    prefault(p.old_bytes.subspan(prefault_at_, len));
    prefault(p.new_bytes.subspan(prefault_at_, len));
    prefault_at_ += len;
    if (prefault_at_ < p.old_bytes.size()) return true;
    prefault_at_ = 0;
    return ++prefault_id_ < prefault_tensors_.size();
  }

  // Turns each item's gathered words into values in its chosen encoding (encode_gathered_item),
  // encodes the payload and hands it to on_payload_.
  void encode_slot(slot& s) {
    const auto t0 = detail::clock::now();
    for (std::size_t i = 0; i < s.used; ++i) {
      item& it = s.items[i];
      const std::size_t count = it.count();
      visit_word(it.word_bytes(), [&]<class W>(W) {
        encode_gathered_item<W>(
            it, {reinterpret_cast<const W*>(s.new_words[i].data()), count}, options_.policy,
            true, codec_);
      });
      ++worker_stats_.items;
      const auto e = static_cast<std::size_t>(it.enc);
      if (e < worker_stats_.items_by_encoding.size()) {
        ++worker_stats_.items_by_encoding[e];
        worker_stats_.records_by_encoding[e] += count;
      }
    }
    payload_header header;
    header.id = {delta_format::forward, 0, s.sequence};
    header.registry_fingerprint = registry_->fingerprint();
    encoder_.encode(header, std::span<const item>(s.items.data(), s.used), *registry_, payload_);
    const auto t1 = detail::clock::now();
    worker_stats_.encode_seconds += std::chrono::duration<double>(t1 - t0).count();
    (*on_payload_)(payload_);
    ++worker_stats_.payloads;
    worker_stats_.write_seconds += detail::seconds_since(t1);
    // Keep a slot's memory near one payload's worth: after an unusual payload, let it go.
    std::size_t held = 0;
    for (std::size_t i = 0; i < s.items.size(); ++i)
      held += s.items[i].indices.capacity() * 8 + s.items[i].values.capacity() +
              s.new_words[i].capacity();
    if (held > 4 * options_.payload_records * 16) {
      s.items.clear();
      s.new_words.clear();
    }
    s.used = 0;
    s.records = 0;
  }

  static codec_options codec_with_level(int level) {
    codec_options o;
    o.zstd_level = level;
    return o;
  }

  diff_options options_;
  codec_options codec_;
  payload_encoder encoder_;  // used by the thread that encodes
  std::vector<std::byte> payload_;
  worker_stats worker_stats_;  // written by the thread that encodes

  // Scan state (calling thread).
  const tensor_registry* registry_ = nullptr;
  const std::function<void(std::span<const std::byte>)>* on_payload_ = nullptr;
  tensor_registry file_registry_;
  std::vector<tensor_pair> pairs_;
  std::vector<tensor_digests> digests_;
  digest_stream old_digest_;
  digest_stream new_digest_;
  std::vector<std::uint64_t> bounce_old_;
  std::vector<std::uint64_t> bounce_new_;
  std::array<slot, 2> slots_;
  std::size_t filling_ = 0;
  std::uint32_t sequence_ = 0;
  double wait_seconds_ = 0;
  double caller_work_seconds_ = 0;  // encode and write done on the calling thread

  // Background work of the stage: mapping in the pages of the tensors of a diff of files.
  std::span<const tensor_pair> prefault_tensors_;
  std::size_t prefault_id_ = 0;
  std::size_t prefault_at_ = 0;

  // The worker: encodes the slot it is handed (slot contents pass with the stage's hand-over)
  // and prefetches between payloads. Declared last: destroyed, and its thread joined, first.
  pipeline_stage<std::size_t> stage_;
};

/// Diffs OLD and NEW (safetensors files with the same tensor names, dtypes and shapes) into a
/// delta file at `delta_path`, published atomically. Errors: those of the safetensors reader,
/// require_same_tensors, the payload encoder, and io_error.
inline diff_report diff_checkpoints(const std::filesystem::path& old_path,
                                    const std::filesystem::path& new_path,
                                    const std::filesystem::path& delta_path,
                                    const diff_options& options = {}) {
  const auto start = detail::clock::now();
  DCR_EXPECTS(!same_file(delta_path, old_path) && !same_file(delta_path, new_path),
              errc::invalid_argument,
              "the delta '" + delta_path.string() + "' would replace OLD or NEW");
  // With a worker thread, it maps the pages in ahead of the scan; without, the mappings are
  // populated up front (cheaper than a fault per page).
  const auto old_file = blame(input_fault::checkpoint,
                              [&] { return safetensors_file::open(old_path, !options.worker_thread); });
  const auto new_file = blame(input_fault::checkpoint,
                              [&] { return safetensors_file::open(new_path, !options.worker_thread); });
  checkpoint_differ differ(options);
  auto report = differ.diff(old_file, new_file, delta_path);
  const double opening = detail::seconds_since(start) - report.seconds;
  report.seconds += opening;
  report.scan_seconds += opening;
  return report;
}

// ------------------------------------------------------------------------------------------------
// apply

/// What an apply did.
struct apply_report {
  std::uint64_t tensors = 0;
  std::uint64_t payloads = 0;      ///< delta payloads decoded
  std::uint64_t records = 0;       ///< changed elements written
  std::uint64_t output_bytes = 0;  ///< size of the result file
  bool already_applied = false;    ///< in place: BASE already held the result; nothing written
  bool recovered = false;          ///< in place: an interrupted apply was rolled forward first
  double seconds = 0;
};

/// Settings of apply_delta and apply_sharded_delta.
struct apply_options {
  /// Progress: reports the bytes processed (progress_meter's count: BASE's tensors digested and
  /// copied, the changed elements written, the result's tensors digested; of every shard for a
  /// sharded delta) against their total.
  progress_callback progress = {};
};

namespace detail {

// Bytes of the elements the payloads of one direction of `d` write (records times word size),
// from their item tables: the progress_meter's measure of a pass over them.
inline std::uint64_t changed_bytes(const delta_file& d, bool undo) {
  std::vector<item_entry> entries;
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < d.payload_count(); ++i) {
    if (d.is_undo(i) != undo) continue;
    blame(input_fault::delta, [&] { payload_decoder::read_table(d.payload(i), entries); });
    for (const auto& e : entries) {
      const auto type = dtype_from_code(e.dtype_code);
      // (a hostile count only distorts the display; decoding refuses it)
      if (type) bytes += std::min(e.count, dcr::detail::max_entry_count) * dtype_size(*type);
    }
  }
  return bytes;
}

// Applies one decoded item to the bytes of its tensor (little-endian words).
inline void apply_item(std::span<std::byte> tensor, const item& it, std::string_view where) {
  if (!it.indices.empty() && it.indices.back() >= tensor.size() / it.word_bytes())
    throw input_error(input_fault::delta, errc::out_of_range,
                      std::string(where) + ": item index beyond its tensor");
  visit_word(it.word_bytes(), [&]<class W>(W) {
    // The tensor's bytes as one contiguous record, through the shared per-record step.
    const auto numel = static_cast<std::int64_t>(tensor.size() / sizeof(W));
    const placement whole = placement::contiguous(tensor.data(), numel, sizeof(W), it.tensor);
    apply_item_records<W, little_endian_words>(std::span<const placement>(&whole, 1), it.enc,
                                               it.indices, it.words<W>().data());
  });
}

// Byte ranges (file offsets) of the registry's tensors in a file, by tensor id.
struct tensor_ranges {
  std::vector<std::uint64_t> begin;
  std::vector<std::uint64_t> size;
  [[nodiscard]] std::span<const std::byte> of(std::span<const std::byte> file, tensor_id id) const {
    return file.subspan(static_cast<std::size_t>(begin[id]), static_cast<std::size_t>(size[id]));
  }
  [[nodiscard]] std::span<std::byte> of(std::span<std::byte> file, tensor_id id) const {
    return file.subspan(static_cast<std::size_t>(begin[id]), static_cast<std::size_t>(size[id]));
  }
};

inline tensor_ranges ranges_in(const delta_file& d, const safetensors_header& h) {
  tensor_ranges r;
  for (const auto& t : d.registry().tensors()) {
    const auto* e = h.find(t.name);
    r.begin.push_back(h.data_offset() + e->begin);
    r.size.push_back(e->size());
  }
  return r;
}

// tensors_digest of the registry's tensors in `file` (laid out as `ranges` says), counting
// each tensor's bytes on `meter`.
inline digest128 tensors_digest_in(std::span<const std::byte> file, const tensor_ranges& ranges,
                                   progress_meter* meter = nullptr) {
  std::vector<digest128> per_tensor;
  per_tensor.reserve(ranges.begin.size());
  for (tensor_id id = 0; id < ranges.begin.size(); ++id) {
    per_tensor.push_back(digest_of(ranges.of(file, id)));
    if (meter != nullptr) meter->advance(ranges.size[id]);
  }
  return tensors_digest(per_tensor);
}

// Whether the tensors in `file` are the delta's base (or result).
inline bool tensors_are(const delta_file& d, std::span<const std::byte> file,
                        const tensor_ranges& ranges, bool result,
                        progress_meter* meter = nullptr) {
  return tensors_digest_in(file, ranges, meter) == (result ? d.result_digest() : d.base_digest());
}

inline std::string digest_mismatch_message(const delta_file& d, std::span<const std::byte> file,
                                           const tensor_ranges& ranges,
                                           std::string_view file_what, bool result) {
  return std::string(file_what) + ": its tensors have digest " +
         tensors_digest_in(file, ranges).hex() + ", the " + (result ? "result" : "base") +
         " of " + d.where() + " has " + (result ? d.result_digest() : d.base_digest()).hex() +
         (result ? "" : " (same tensor names, dtypes, shapes and header, other bytes)");
}

// d.bind_base(base), its errors attributed: other tensors or another header content than the
// delta's base are a wrong base, a target header that does not decode a damaged delta.
inline void bind_delta_base(delta_file& d, const safetensors_file& base,
                            const std::string& base_what) {
  try {
    d.bind_base(base.header(), base.header_json(), base_what);
  } catch (const input_error&) {
    throw;
  } catch (const error& e) {
    const errc code = e.dcr_code();
    if (code == errc::io_error || code == errc::not_ready) throw;
    throw input_error(code == errc::registry_mismatch || code == errc::verification_failed
                          ? input_fault::wrong_base
                          : input_fault::delta,
                      code, error_text(e));
  }
}

}  // namespace detail

/// In-place apply's journal and working file: `.<base name>.dcr-journal` and
/// `.<base name>.dcr-working` beside BASE.
[[nodiscard]] inline std::filesystem::path journal_path(const std::filesystem::path& base) {
  return hidden_sibling(base, ".dcr-journal");
}
[[nodiscard]] inline std::filesystem::path working_path(const std::filesystem::path& base) {
  return hidden_sibling(base, ".dcr-working");
}

namespace detail {

// The bytes apply_delta_metered counts: BASE's tensors digested and copied, the changed
// elements written, the result's tensors digested.
inline std::uint64_t apply_work(const delta_file& d) {
  return 3 * d.tensor_bytes() + changed_bytes(d, false);
}

// apply_delta, counting its work (apply_work) on `meter`.
inline apply_report apply_delta_metered(delta_file& d, const std::filesystem::path& base_path,
                                        const std::filesystem::path& out_path,
                                        progress_meter& meter) {
  const auto start = clock::now();
  DCR_EXPECTS(!path_exists(journal_path(base_path)), errc::not_ready,
              "BASE '" + base_path.string() + "' has an unfinished in-place apply (journal '" +
                  journal_path(base_path).string() + "'); run `dcr recover " +
                  base_path.string() + "` first");
  const auto base =
      blame(input_fault::checkpoint, [&] { return safetensors_file::open(base_path, true); });
  const std::string base_what = "BASE '" + base_path.string() + "'";
  bind_delta_base(d, base, base_what);
  const auto base_ranges = ranges_in(d, base.header());
  if (!tensors_are(d, base.bytes(), base_ranges, false, &meter))
    throw input_error(
        input_fault::wrong_base, errc::verification_failed,
        "wrong base: " + digest_mismatch_message(d, base.bytes(), base_ranges, base_what, false));
  DCR_EXPECTS(!same_file(base_path, out_path), errc::invalid_argument,
              "OUT '" + out_path.string() + "' is BASE itself; use the in-place apply");

  const safetensors_header& target = d.target_header();
  const auto out_ranges = ranges_in(d, target);
  atomic_file out(out_path);
  out.set_permissions(permission_bits(base_path));
  out.resize(target.file_size());
  std::byte length[8];
  dcr::detail::store_le<std::uint64_t>(length, target.header_size());
  out.write_at(length, 0);
  out.write_at(std::as_bytes(std::span<const char>(d.target_header_json())), 8);
  for (tensor_id id = 0; id < d.registry().size(); ++id) {
    out.write_at(base_ranges.of(base.bytes(), id), out_ranges.begin[id]);
    meter.advance(base_ranges.size[id]);
  }

  apply_report report;
  report.tensors = d.registry().size();
  {
    auto map = mapped_file::open_write(out.temp_path(), true);
    const auto bytes = map.writable_bytes();
    delta_payloads payloads(d);
    std::vector<item> items;
    for (std::size_t i = 0; i < d.payload_count(); ++i) {
      blame(input_fault::delta, [&] { payloads.decode(i, items); });
      for (const auto& it : items) {
        apply_item(out_ranges.of(bytes, it.tensor), it, d.where());
        report.records += it.count();
        meter.advance(it.values.size());
      }
      ++report.payloads;
    }
    if (!tensors_are(d, map.bytes(), out_ranges, true, &meter))
      throw error(errc::verification_failed,
                  "the result does not verify: " +
                      digest_mismatch_message(d, map.bytes(), out_ranges,
                                              "OUT '" + out_path.string() + "'", true));
    map.sync();
  }
  out.commit();
  report.output_bytes = target.file_size();
  report.seconds = seconds_since(start);
  return report;
}

}  // namespace detail

/// Applies the delta at `delta_path` to the checkpoint at `base_path`, writing the result to
/// `out_path` atomically: the result has the target's header verbatim and every tensor's bytes at
/// the target's offsets, so it equals the NEW file diff read byte for byte. Refuses, before
/// creating anything: a base with other tensors (registry_mismatch), another header content or
/// other tensor bytes than the delta's base (verification_failed, "wrong base"), `out_path`
/// naming the base itself (invalid_argument; use apply_delta_in_place), a base with an
/// unfinished in-place apply (not_ready). The output appears only after the result's tensors
/// digest matched (else verification_failed and nothing is created). Errors of the delta file and
/// payload decoder (corrupt_payload and the rest) leave nothing behind either. Binds `d` to BASE
/// (delta_file::bind_base). Reports its progress to options.progress.
inline apply_report apply_delta(delta_file& d, const std::filesystem::path& base_path,
                                const std::filesystem::path& out_path,
                                const apply_options& options = {}) {
  detail::progress_meter meter(options.progress, options.progress ? detail::apply_work(d) : 0);
  return detail::apply_delta_metered(d, base_path, out_path, meter);
}

/// apply_delta(d, ...) of the delta file at `delta_path`, which OUT may not name either.
inline apply_report apply_delta(const std::filesystem::path& delta_path,
                                const std::filesystem::path& base_path,
                                const std::filesystem::path& out_path,
                                const apply_options& options = {}) {
  DCR_EXPECTS(!same_file(delta_path, out_path), errc::invalid_argument,
              "OUT '" + out_path.string() + "' is the delta file itself");
  auto d = blame(input_fault::delta, [&] { return delta_file::open(delta_path); });
  return apply_delta(d, base_path, out_path, options);
}

// ------------------------------------------------------------------------------------------------
// in place

/// The steps of an in-place apply after which a crash may be injected (test hook, see
/// in_place_options::crash_at). In order:
enum class in_place_step : std::uint8_t {
  journal_written,    ///< journal complete and fsynced in its temporary file, not yet published
  journal_committed,  ///< journal published beside BASE; BASE untouched
  base_hidden,        ///< BASE renamed to its hidden working name; nothing written yet
  half_written,       ///< about half of the new words written to the working file
  written,            ///< every new word and the header written and fsynced; not yet verified
  verified,           ///< the result's digest verified; working file not yet renamed back
  renamed_back,       ///< BASE holds the result; journal not yet removed
  /// Directory apply only (sharded_checkpoint.hpp): every shard holds its result and the new
  /// index is published; the directory's journal not yet removed.
  index_written,
};

inline constexpr std::array<std::string_view, 8> in_place_step_names = {
    "journal-written", "journal-committed", "base-hidden",  "half-written",
    "written",         "verified",          "renamed-back", "index-written"};

/// "journal-written", "journal-committed", ... (the DCR_CRASH_AT spellings).
[[nodiscard]] constexpr std::string_view in_place_step_name(in_place_step s) noexcept {
  return in_place_step_names[static_cast<std::size_t>(s)];
}
/// The step spelled `name`, or nullopt.
[[nodiscard]] constexpr std::optional<in_place_step> parse_in_place_step(std::string_view name) {
  for (std::size_t i = 0; i < in_place_step_names.size(); ++i)
    if (in_place_step_names[i] == name) return static_cast<in_place_step>(i);
  return std::nullopt;
}

/// The exit status of a process that a crash injection ended.
inline constexpr int crash_exit_status = 86;

/// Settings of the in-place apply and of recovery.
struct in_place_options {
  /// Test hook: end the process with std::_Exit(crash_exit_status) right after this step, as a
  /// crash would (no destructors, no cleanup). Never set it outside crash tests.
  std::optional<in_place_step> crash_at;
  /// Test hook of a directory apply: the per-shard steps (base_hidden .. renamed_back) crash only
  /// on the shard at this position of the delta's shard list (DCR_CRASH_SHARD).
  std::size_t crash_shard = 0;
  /// Whether an in-place apply or recovery waits for another one working in the same directory
  /// to finish (true), or refuses at once with not_ready (false).
  bool wait_for_lock = true;
  /// Called once, before waiting, when another process holds the lock (e.g. to say so).
  std::function<void(const std::filesystem::path& dir)> on_lock_wait;
  /// Progress of the apply or recovery: reports the bytes processed (progress_meter's count:
  /// BASE's tensors digested, the changed elements journaled and written, the result's tensors
  /// digested; of every shard of a directory) against their total. An interrupted apply that
  /// an in-place apply finishes first is reported as its own operation before it.
  progress_callback progress = {};
};

/// in_place_options whose crash_at comes from the environment variable DCR_CRASH_AT (a step
/// name; unset or empty means none). invalid_argument for an unknown name.
[[nodiscard]] inline in_place_options in_place_options_from_environment() {
  in_place_options o;
  const char* v = std::getenv("DCR_CRASH_AT");
  if (v == nullptr || *v == '\0') return o;
  o.crash_at = parse_in_place_step(v);
  if (const char* shard = std::getenv("DCR_CRASH_SHARD"); shard != nullptr && *shard != '\0')
    o.crash_shard = static_cast<std::size_t>(std::strtoull(shard, nullptr, 10));
  if (!o.crash_at) {
    std::string names;
    for (auto n : in_place_step_names) names += (names.empty() ? "" : ", ") + std::string(n);
    throw error(errc::invalid_argument,
                "DCR_CRASH_AT='" + std::string(v) + "' is not a step (" + names + ")");
  }
  return o;
}

/// Takes the in-place lock of directory `dir` (an exclusive flock(2) on the directory itself,
/// released when the result is destroyed): every in-place apply and recovery of a file or shard
/// in `dir` holds it, so two of them never interleave (one could otherwise remove the other's
/// journal temporaries, or roll forward a journal being written). If another process holds it,
/// waits (calling options.on_lock_wait first) or, with options.wait_for_lock false, throws
/// not_ready naming the directory.
[[nodiscard]] inline directory_lock in_place_lock(const std::filesystem::path& dir,
                                                  const in_place_options& options) {
  auto lock = directory_lock::try_acquire(dir);
  if (lock.held()) return lock;
  DCR_EXPECTS(options.wait_for_lock, errc::not_ready,
              "another in-place apply or recovery is working in the directory '" + dir.string() +
                  "' (it holds the directory's lock); wait for it to finish, or omit --no-wait "
                  "to wait for it");
  if (options.on_lock_wait) options.on_lock_wait(dir);
  return directory_lock::acquire(dir);
}

/// What recover_in_place found and did.
struct recover_report {
  bool journal_found = false;   ///< an interrupted in-place apply was found
  bool rolled_forward = false;  ///< its new words were (re)written to the file
  bool rolled_back = false;     ///< its result did not verify and BASE was restored instead
  std::uint64_t records = 0;    ///< words written while rolling forward
  std::size_t temporaries_removed = 0;  ///< unpublished journal files of crashed runs removed
  double seconds = 0;
};

namespace detail {

inline void crash_point(const in_place_options& o, in_place_step s) {
  if (o.crash_at == s) std::_Exit(crash_exit_status);
}

// Removes `.<journal name>.tmp-*` files: journals a crash left unpublished.
inline std::size_t remove_journal_temporaries(const std::filesystem::path& base) {
  const auto dir = parent_directory(base);
  const std::string prefix = hidden_sibling(journal_path(base), ".tmp-").filename().string();
  std::size_t removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && ::unlink(entry.path().c_str()) == 0) ++removed;
  }
  if (removed != 0) sync_directory(dir);
  return removed;
}

// Writes the journal's header bytes and every word of its payloads of one direction into the
// mapped working file, counting the words' bytes on `meter`.
inline std::uint64_t write_journal_words(const delta_file& j, std::span<std::byte> file,
                                         bool undo, const in_place_options& options,
                                         progress_meter* meter = nullptr) {
  const auto ranges = ranges_in(j, j.target_header());
  const std::string_view header = undo ? j.base_header_json() : j.target_header_json();
  std::memcpy(file.data() + 8, header.data(), header.size());
  delta_payloads payloads(j);
  std::vector<item> items;
  std::uint64_t total = 0;
  if (!undo && options.crash_at == in_place_step::half_written) {
    std::vector<item_entry> entries;
    for (std::size_t i = 0; i < j.payload_count(); ++i)
      if (!j.is_undo(i)) {
        payload_decoder::read_table(j.payload(i), entries);
        for (const auto& e : entries) total += e.count;
      }
  }
  const std::uint64_t crash_after = total / 2;
  std::uint64_t written = 0;
  for (std::size_t i = 0; i < j.payload_count(); ++i) {
    if (j.is_undo(i) != undo) continue;
    blame(input_fault::delta, [&] { payloads.decode(i, items); });
    for (auto& it : items) {
      if (!undo && options.crash_at == in_place_step::half_written &&
          written + it.count() > crash_after) {
        const std::size_t keep = static_cast<std::size_t>(crash_after - written);
        it.indices.resize(keep);
        it.values.resize(keep * it.word_bytes());
        apply_item(ranges.of(file, it.tensor), it, j.where());
        crash_point(options, in_place_step::half_written);
      }
      apply_item(ranges.of(file, it.tensor), it, j.where());
      written += it.count();
      if (meter != nullptr) meter->advance(it.values.size());
    }
  }
  if (!undo) crash_point(options, in_place_step::half_written);
  return written;
}

inline bool header_is(std::span<const std::byte> file, std::string_view json) {
  return file.size() >= 8 + json.size() &&
         dcr::detail::load_le<std::uint64_t>(file.data()) == json.size() &&
         std::memcmp(file.data() + 8, json.data(), json.size()) == 0;
}

// The bytes finish_from_journal counts: BASE's tensors digested if BASE exists, the journal's
// new words written, the result's tensors digested.
inline std::uint64_t finish_work(const delta_file& j, const std::filesystem::path& base) {
  return (path_exists(base) ? j.tensor_bytes() : 0) + changed_bytes(j, false) + j.tensor_bytes();
}

// Finishes the in-place apply that the journal `j` at `journal` describes (the journal is
// published; BASE or its working file exists): roll forward, verify, publish BASE, and with
// `remove_journal` remove the journal (a directory apply keeps it until every shard is done).
// Counts finish_work(j, base) on `meter`.
inline void finish_from_journal(const delta_file& j, const std::filesystem::path& journal,
                                const std::filesystem::path& base,
                                const in_place_options& options, recover_report& report,
                                bool remove_journal, progress_meter& meter) {
  const auto working = working_path(base);
  const std::string base_what = "BASE '" + base.string() + "'";
  const bool base_exists = path_exists(base);
  const bool working_exists = path_exists(working);
  DCR_EXPECTS(!(base_exists && working_exists), errc::not_ready,
              "both " + base_what + " and its working file '" + working.string() +
                  "' exist beside the journal '" + journal.string() +
                  "'; resolve by hand (the working file holds the interrupted apply)");
  DCR_EXPECTS(base_exists || working_exists, errc::io_error,
              "neither " + base_what + " nor its working file '" + working.string() +
                  "' exists, but the journal '" + journal.string() + "' does");
  const auto& target = j.target_header();
  const auto ranges = ranges_in(j, target);
  if (base_exists) {
    // The journal is published but BASE was not renamed yet, or was already renamed back.
    auto f = mapped_file::open_read(base, true);
    const bool sized = f.size() == target.file_size();
    std::optional<digest128> tensors;  // digested once, compared with the result and the base
    if (sized) tensors = tensors_digest_in(f.bytes(), ranges, &meter);
    if (sized && header_is(f.bytes(), j.target_header_json()) && *tensors == j.result_digest()) {
      if (remove_journal) remove_durably(journal);
      if (meter.enabled()) meter.advance(changed_bytes(j, false) + j.tensor_bytes());
      return;
    }
    DCR_EXPECTS(sized && header_is(f.bytes(), j.base_header_json()) &&
                    *tensors == j.base_digest(),
                errc::verification_failed,
                base_what + " matches neither the base nor the result of the journal '" +
                    journal.string() + "'; left as it is");
    f = mapped_file();
    rename_durably(base, working);
    crash_point(options, in_place_step::base_hidden);
  }
  auto map = mapped_file::open_write(working, true);
  DCR_EXPECTS(map.size() == target.file_size(), errc::verification_failed,
              "the working file '" + working.string() + "' has " + std::to_string(map.size()) +
                  " bytes, the journal's result " + std::to_string(target.file_size()));
  report.records = write_journal_words(j, map.writable_bytes(), false, options, &meter);
  report.rolled_forward = true;
  map.sync();
  crash_point(options, in_place_step::written);
  if (!tensors_are(j, map.bytes(), ranges, true, &meter) ||
      !header_is(map.bytes(), j.target_header_json())) {
    const std::string why =
        tensors_are(j, map.bytes(), ranges, true)
            ? "the working file's JSON header is not the journal's target header"
            : digest_mismatch_message(j, map.bytes(), ranges, "the working file", true);
    write_journal_words(j, map.writable_bytes(), true, options);
    map.sync();
    if (!tensors_are(j, map.bytes(), ranges, false))
      throw error(errc::verification_failed,
                  "in-place apply: the result does not verify (" + why +
                      ") and undoing it did not restore the base either; the working file '" +
                      working.string() + "' and the journal '" + journal.string() +
                      "' are left for inspection");
    map = mapped_file();
    rename_durably(working, base);
    if (remove_journal) remove_durably(journal);
    report.rolled_back = true;
    throw error(errc::verification_failed,
                "in-place apply: the result does not verify (" + why + "); " + base_what +
                    " was restored to its original content");
  }
  crash_point(options, in_place_step::verified);
  map = mapped_file();
  rename_durably(working, base);
  crash_point(options, in_place_step::renamed_back);
  if (remove_journal) remove_durably(journal);
}

// Undoes a finished in-place apply of BASE that the journal `j` at `journal` describes: BASE (or,
// after a crash during an earlier undo, its working file) is hidden, the undo words and the base
// header written, the base digests verified and BASE renamed back. Used when another shard of a
// directory apply does not verify. Nothing to do if BASE already holds the base.
inline void roll_back_from_journal(const delta_file& j, const std::filesystem::path& journal,
                                   const std::filesystem::path& base,
                                   const in_place_options& options) {
  const auto working = working_path(base);
  const auto ranges = ranges_in(j, j.target_header());
  if (path_exists(base)) {
    {
      auto f = mapped_file::open_read(base, true);
      if (f.size() == j.target_header().file_size() && header_is(f.bytes(), j.base_header_json()) &&
          tensors_are(j, f.bytes(), ranges, false))
        return;
    }
    rename_durably(base, working);
  }
  auto map = mapped_file::open_write(working, true);
  write_journal_words(j, map.writable_bytes(), true, options);
  map.sync();
  if (!tensors_are(j, map.bytes(), ranges, false))
    throw error(errc::verification_failed,
                "undoing the in-place apply of '" + base.string() + "' did not restore it (" +
                    digest_mismatch_message(j, map.bytes(), ranges, "the working file", false) +
                    "); the working file '" + working.string() + "' and the journal '" +
                    journal.string() + "' are left for inspection");
  map = mapped_file();
  rename_durably(working, base);
}

}  // namespace detail

namespace detail {

// recover_in_place with the directory's in-place lock held.
inline recover_report recover_in_place_locked(const std::filesystem::path& base,
                                              const in_place_options& options) {
  const auto start = clock::now();
  recover_report report;
  report.temporaries_removed = remove_journal_temporaries(base);
  const auto journal = journal_path(base);
  if (!path_exists(journal)) {
    DCR_EXPECTS(!path_exists(working_path(base)), errc::not_ready,
                "the working file '" + working_path(base).string() + "' of BASE '" +
                    base.string() + "' exists without a journal; resolve by hand");
    report.seconds = seconds_since(start);
    return report;
  }
  report.journal_found = true;
  const auto j = delta_file::open(journal, container_kind::journal);
  progress_meter meter(options.progress, options.progress ? finish_work(j, base) : 0);
  finish_from_journal(j, journal, base, options, report, true, meter);
  report.seconds = seconds_since(start);
  return report;
}

// The bytes prepare_in_place counts: BASE's tensors digested, the changed elements journaled.
inline std::uint64_t prepare_work(const delta_file& d) {
  return d.tensor_bytes() + changed_bytes(d, false);
}

// Steps 0 (the checks) to 2 of an in-place apply of `d` to BASE: checks BASE like apply_delta
// does (binding `d` to it), plus its layout and header fit; if BASE already holds the result
// returns false (report.already_applied, tensors and output_bytes set; `d` is then left
// unbound); otherwise writes the journal and publishes it at `journal_file` (crash points
// journal_written and journal_committed when `crash_points`), adds its tensors, payloads,
// records and output_bytes to `report`, and returns true. BASE is not changed. Counts
// prepare_work(d) on `meter`.
inline bool prepare_in_place(delta_file& d, const std::filesystem::path& base_path,
                             const std::filesystem::path& journal_file,
                             const in_place_options& options, bool crash_points,
                             apply_report& report, progress_meter& meter) {
  auto base =
      blame(input_fault::checkpoint, [&] { return safetensors_file::open(base_path, true); });
  const std::string base_what = "BASE '" + base_path.string() + "'";
  // BASE may already hold the result (an in-place apply repeated): its header content is the
  // target's and its tensors the result's. Checked before binding, which wants the base header;
  // the tensors are digested once for this and for the base check below.
  std::optional<digest128> base_tensors;
  {
    const tensor_registry registry(base.header().canonical_tensors());
    if (registry.fingerprint() == d.registry_fingerprint()) {
      tensor_ranges r;
      for (const auto& t : registry.tensors()) {
        const auto* e = base.find(t.name);
        r.begin.push_back(base.header().data_offset() + e->begin);
        r.size.push_back(e->size());
      }
      base_tensors = tensors_digest_in(base.bytes(), r, &meter);
      if (*base_tensors == d.result_digest() &&
          header_content_digest(base.header_json()) == d.target_header_digest()) {
        report.already_applied = true;
        report.tensors += registry.size();
        report.output_bytes += base.bytes().size();
        if (meter.enabled()) meter.advance(changed_bytes(d, false));
        return false;
      }
    }
  }
  bind_delta_base(d, base, base_what);
  const safetensors_header& target = d.target_header();
  for (const auto& m : d.registry().tensors()) {
    const auto* b = base.find(m.name);
    const auto* t = target.find(m.name);
    DCR_EXPECTS(b->begin == t->begin && b->end == t->end, errc::invalid_argument,
                "in-place apply needs " + base_what +
                    " to lay its tensors out as the delta's target does, but tensor '" +
                    m.name + "' is at buffer bytes " + std::to_string(b->begin) + ".." +
                    std::to_string(b->end) + " in BASE and " + std::to_string(t->begin) + ".." +
                    std::to_string(t->end) + " in the target; apply to a new file (-o) instead");
  }
  // The header to write: the target's, or the same JSON padded with spaces to BASE's length.
  std::string header(d.target_header_json());
  const std::uint64_t base_n = base.header().header_size();
  if (header.size() != base_n) {
    header.erase(header.find_last_not_of(' ') + 1);
    DCR_EXPECTS(header.size() <= base_n, errc::invalid_argument,
                "in-place apply: the target's JSON header (" + std::to_string(header.size()) +
                    " bytes) does not fit in " + base_what + "'s (" + std::to_string(base_n) +
                    " bytes); apply to a new file (-o) instead");
    header.append(static_cast<std::size_t>(base_n) - header.size(), ' ');
  }
  const auto ranges = ranges_in(d, base.header());
  if (*base_tensors != d.base_digest())  // bind_base checked the fingerprint
    throw input_error(input_fault::wrong_base, errc::verification_failed,
                      "wrong base: " +
                          digest_mismatch_message(d, base.bytes(), ranges, base_what, false));
  report.tensors += d.registry().size();
  report.output_bytes += base.bytes().size();

  // The journal: per delta payload, one redo payload (new words) and one undo payload (old).
  {
    delta_writer journal(journal_file, container_kind::journal, d.registry(), header,
                         base.header_json());
    journal.set_digests(d.base_digest(), d.result_digest());
    delta_payloads payloads(d);
    payload_encoder encoder;
    std::vector<item> items;
    std::vector<item> undo;
    std::vector<std::byte> bytes;
    for (std::size_t i = 0; i < d.payload_count(); ++i) {
      blame(input_fault::delta, [&] { payloads.decode(i, items); });
      undo.resize(items.size());
      for (std::size_t k = 0; k < items.size(); ++k) {
        item& it = items[k];
        item& u = undo[k];
        u.tensor = it.tensor;
        u.type = it.type;
        u.enc = encoding::overwrite;
        u.indices = it.indices;
        u.values.resize(it.values.size());
        const auto tensor = ranges.of(base.bytes(), it.tensor);
        if (!it.indices.empty() && it.indices.back() >= tensor.size() / it.word_bytes())
          throw input_error(input_fault::delta, errc::out_of_range,
                            d.where() + ": item index beyond its tensor");
        visit_word(it.word_bytes(), [&]<class W>(W) {
          visit_encoding(it.enc, [&](auto e) {
            using E = decltype(e);
            auto values = it.words<W>();
            auto old_words = u.words<W>();
            for (std::size_t r = 0; r < values.size(); ++r) {
              const W old = dcr::detail::load_le<W>(tensor.data() + it.indices[r] * sizeof(W));
              old_words[r] = old;
              values[r] = E::apply(old, values[r]);
            }
          });
        });
        it.enc = encoding::overwrite;
        report.records += it.count();
        meter.advance(it.values.size());
      }
      payload_header h;
      h.registry_fingerprint = d.registry().fingerprint();
      h.id = {delta_format::forward, 0, static_cast<std::uint32_t>(i)};
      encoder.encode(h, items, d.registry(), bytes);
      journal.append_payload(bytes);
      h.id = {delta_format::backward, 0, static_cast<std::uint32_t>(i)};
      encoder.encode(h, undo, d.registry(), bytes);
      journal.append_payload(bytes);
      ++report.payloads;
    }
    journal.finish();
    if (crash_points) crash_point(options, in_place_step::journal_written);
    journal.commit();
    if (crash_points) crash_point(options, in_place_step::journal_committed);
  }
  return true;
}

}  // namespace detail

/// Finishes an in-place apply of BASE that a crash interrupted, if any: removes unpublished
/// journal files, and if a journal is published, rolls it forward (rewrites every new word,
/// idempotently), verifies the result's tensors digest and the header, renames the file back to BASE and
/// removes the journal. If the result does not verify, the journal's undo words restore the base
/// and verification_failed is thrown. Throws corrupt_payload (and the like) for a damaged
/// journal and not_ready for a working file without a journal or beside an existing BASE, in
/// both cases changing nothing. Without a journal it does nothing. Holds the in-place lock of
/// BASE's directory (in_place_lock) while it works.
inline recover_report recover_in_place(const std::filesystem::path& base,
                                       const in_place_options& options = {}) {
  const auto lock = in_place_lock(parent_directory(base), options);
  return detail::recover_in_place_locked(base, options);
}

/// Applies the delta to BASE in place, without copying it and without ever leaving a partly
/// applied file at BASE's path (docs/tool.md, "In-place apply"): takes the in-place lock of
/// BASE's directory (waiting for, or with wait_for_lock false refusing, another in-place apply
/// or recovery there: not_ready); first finishes any interrupted in-place apply
/// (recover_in_place); checks BASE like apply_delta, and also that it lays its tensors out as the
/// delta's target does and that the target's header fits in BASE's (invalid_argument otherwise:
/// apply to a new file instead); if BASE already holds the result, reports already_applied and
/// writes nothing; otherwise writes a journal of old and new words, renames BASE to a hidden
/// working name, writes the new words, verifies the result's digest, renames it back and removes
/// the journal. BASE must be a regular file with one link (a symbolic link is refused with what
/// to do instead).
inline apply_report apply_delta_in_place(const std::filesystem::path& delta_path,
                                         const std::filesystem::path& base_path,
                                         const in_place_options& options = {}) {
  const auto start = detail::clock::now();
  const auto lock = in_place_lock(parent_directory(base_path), options);
  apply_report report;
  report.recovered = detail::recover_in_place_locked(base_path, options).journal_found;
  require_single_regular_file(base_path, "in-place apply: BASE");
  auto d = blame(input_fault::delta, [&] { return delta_file::open(delta_path); });
  // The work: prepare_work, then finish_work with BASE hidden (its journal writes one word per
  // changed element of the delta).
  detail::progress_meter meter(
      options.progress,
      options.progress ? detail::prepare_work(d) + detail::changed_bytes(d, false) + d.tensor_bytes()
                       : 0);
  if (!detail::prepare_in_place(d, base_path, journal_path(base_path), options, true, report,
                                meter)) {
    if (meter.enabled()) meter.advance(detail::changed_bytes(d, false) + d.tensor_bytes());
    report.seconds = detail::seconds_since(start);
    return report;
  }
  rename_durably(base_path, working_path(base_path));
  detail::crash_point(options, in_place_step::base_hidden);
  const auto journal = journal_path(base_path);
  const auto j = delta_file::open(journal, container_kind::journal);
  recover_report r;
  detail::finish_from_journal(j, journal, base_path, options, r, true, meter);
  report.seconds = detail::seconds_since(start);
  return report;
}

}  // namespace dcr::io
