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
double seconds_since(clock::time_point t);

std::string shape_string(std::span<const std::int64_t> shape);

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
  void advance(std::uint64_t bytes);

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
void require_same_tensors(std::span<const canonical_tensor> expected,
                                 std::string_view expected_what,
                                 const safetensors_header& actual, std::string_view actual_what);

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
  explicit checkpoint_differ(diff_options options = {});
  checkpoint_differ(const checkpoint_differ&) = delete;
  checkpoint_differ& operator=(const checkpoint_differ&) = delete;
  /// Joins the worker thread (the stage is the last member, so it goes first).
  ~checkpoint_differ() = default;

  [[nodiscard]] const diff_options& options() const noexcept { return options_; }

  /// Writes the delta from `old_file` to `new_file` at `delta_path` (atomically). Both must
  /// hold the same tensor names, dtypes and shapes (require_same_tensors).
  diff_report diff(const safetensors_file& old_file, const safetensors_file& new_file,
                   const std::filesystem::path& delta_path);

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
                           std::span<tensor_digests> digests = {});

 private:
  // diff_tensors; `prefault`: the worker maps in the tensors' pages ahead of the scan.
  diff_report scan_and_encode(const tensor_registry& registry,
                              std::span<const tensor_pair> tensors,
                              const std::function<void(std::span<const std::byte>)>& on_payload,
                              std::span<tensor_digests> digests, bool prefault);

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
                  std::size_t word_bytes);

  void close_item(slot& s, diff_report& report);

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
  void submit();

  // Waits until the worker has encoded every submitted slot; rethrows its error.
  void wait_idle();

  // After a call, normal or not: the worker drops what is queued and the prefetch, finishes
  // what it is doing and forgets any error, so the differ can be used again and the call's
  // arguments are no longer touched.
  void settle_worker() noexcept { stage_.discard(); }

  // Gives the worker the pages of every tensor to map in, as the stage's idle work. The state
  // below is written here before wake_idle() and read only by the stage's thread until the
  // next discard(), which waits for the idle step in progress.
  void start_prefault(std::span<const tensor_pair> tensors);

  // One step of the background mapping (stage thread, between payloads): the next
  // prefault_step_bytes of the current tensor in both checkpoints. Returns whether there is more.
  bool prefault_step() noexcept;

  // Turns each item's gathered words into values in its chosen encoding (encode_gathered_item),
  // encodes the payload and hands it to on_payload_.
  void encode_slot(slot& s);

  static codec_options codec_with_level(int level);

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
diff_report diff_checkpoints(const std::filesystem::path& old_path,
                             const std::filesystem::path& new_path,
                             const std::filesystem::path& delta_path,
                             const diff_options& options = {});

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
std::uint64_t changed_bytes(const delta_file& d, bool undo);

// Applies one decoded item to the bytes of its tensor (little-endian words).
void apply_item(std::span<std::byte> tensor, const item& it, std::string_view where);

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

tensor_ranges ranges_in(const delta_file& d, const safetensors_header& h);

// tensors_digest of the registry's tensors in `file` (laid out as `ranges` says), counting
// each tensor's bytes on `meter`.
digest128 tensors_digest_in(std::span<const std::byte> file, const tensor_ranges& ranges,
                                   progress_meter* meter = nullptr);

// Whether the tensors in `file` are the delta's base (or result).
bool tensors_are(const delta_file& d, std::span<const std::byte> file,
                        const tensor_ranges& ranges, bool result,
                        progress_meter* meter = nullptr);

std::string digest_mismatch_message(const delta_file& d, std::span<const std::byte> file,
                                           const tensor_ranges& ranges,
                                           std::string_view file_what, bool result);

// d.bind_base(base), its errors attributed: other tensors or another header content than the
// delta's base are a wrong base, a target header that does not decode a damaged delta.
void bind_delta_base(delta_file& d, const safetensors_file& base,
                            const std::string& base_what);

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
std::uint64_t apply_work(const delta_file& d);

// apply_delta, counting its work (apply_work) on `meter`.
apply_report apply_delta_metered(delta_file& d, const std::filesystem::path& base_path,
                                        const std::filesystem::path& out_path,
                                        progress_meter& meter);

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
[[nodiscard]] in_place_options in_place_options_from_environment();

/// Takes the in-place lock of directory `dir` (an exclusive flock(2) on the directory itself,
/// released when the result is destroyed): every in-place apply and recovery of a file or shard
/// in `dir` holds it, so two of them never interleave (one could otherwise remove the other's
/// journal temporaries, or roll forward a journal being written). If another process holds it,
/// waits (calling options.on_lock_wait first) or, with options.wait_for_lock false, throws
/// not_ready naming the directory.
[[nodiscard]] directory_lock in_place_lock(const std::filesystem::path& dir,
                                           const in_place_options& options);

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

void crash_point(const in_place_options& o, in_place_step s);

// Removes `.<journal name>.tmp-*` files: journals a crash left unpublished.
std::size_t remove_journal_temporaries(const std::filesystem::path& base);

// Writes the journal's header bytes and every word of its payloads of one direction into the
// mapped working file, counting the words' bytes on `meter`.
std::uint64_t write_journal_words(const delta_file& j, std::span<std::byte> file,
                                         bool undo, const in_place_options& options,
                                         progress_meter* meter = nullptr);

bool header_is(std::span<const std::byte> file, std::string_view json);

// The bytes finish_from_journal counts: BASE's tensors digested if BASE exists, the journal's
// new words written, the result's tensors digested.
std::uint64_t finish_work(const delta_file& j, const std::filesystem::path& base);

// Finishes the in-place apply that the journal `j` at `journal` describes (the journal is
// published; BASE or its working file exists): roll forward, verify, publish BASE, and with
// `remove_journal` remove the journal (a directory apply keeps it until every shard is done).
// Counts finish_work(j, base) on `meter`.
void finish_from_journal(const delta_file& j, const std::filesystem::path& journal,
                                const std::filesystem::path& base,
                                const in_place_options& options, recover_report& report,
                                bool remove_journal, progress_meter& meter);

// Undoes a finished in-place apply of BASE that the journal `j` at `journal` describes: BASE (or,
// after a crash during an earlier undo, its working file) is hidden, the undo words and the base
// header written, the base digests verified and BASE renamed back. Used when another shard of a
// directory apply does not verify. Nothing to do if BASE already holds the base.
void roll_back_from_journal(const delta_file& j, const std::filesystem::path& journal,
                                   const std::filesystem::path& base,
                                   const in_place_options& options);

}  // namespace detail

namespace detail {

// recover_in_place with the directory's in-place lock held.
recover_report recover_in_place_locked(const std::filesystem::path& base,
                                              const in_place_options& options);

// The bytes prepare_in_place counts: BASE's tensors digested, the changed elements journaled.
std::uint64_t prepare_work(const delta_file& d);

// Steps 0 (the checks) to 2 of an in-place apply of `d` to BASE: checks BASE like apply_delta
// does (binding `d` to it), plus its layout and header fit; if BASE already holds the result
// returns false (report.already_applied, tensors and output_bytes set; `d` is then left
// unbound); otherwise writes the journal and publishes it at `journal_file` (crash points
// journal_written and journal_committed when `crash_points`), adds its tensors, payloads,
// records and output_bytes to `report`, and returns true. BASE is not changed. Counts
// prepare_work(d) on `meter`.
bool prepare_in_place(delta_file& d, const std::filesystem::path& base_path,
                             const std::filesystem::path& journal_file,
                             const in_place_options& options, bool crash_points,
                             apply_report& report, progress_meter& meter);

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
apply_report apply_delta_in_place(const std::filesystem::path& delta_path,
                                  const std::filesystem::path& base_path,
                                  const in_place_options& options = {});

}  // namespace dcr::io

#include "dcr/detail/io/checkpoint.inl"
