// dcr/io/sharded_checkpoint.hpp: the codec on sharded safetensors checkpoints, the way Hugging
// Face stores every large model: a directory holding an index `<name>.safetensors.index.json`
// (an object whose "weight_map" maps each tensor name to the shard file holding it) and the
// shard files it names. Diff two such directories into one *sharded delta* file, apply it to a
// base directory (into a new directory, or in place across all shards with crash recovery of
// the directory as a whole), and recover an interrupted in-place apply. `dcr diff|apply|recover`
// choose these functions when given directories (docs/tool.md, "Sharded checkpoints").
//
// A sharded delta holds one single-file delta (checkpoint.hpp, delta.hpp) per shard, named by
// its shard file, and NEW's index verbatim:
//
//   0    8 bytes   magic "DCRSHARD"
//   8    u64       M, the manifest's length
//   16   M bytes   the manifest: a JSON object {"version": 1, "index": index file name,
//                  "result_index": NEW's index file (a string, verbatim),
//                  "shards": [{"file": shard file name, "offset": u64, "bytes": u64}, ...]}
//                  (shards in name order; offsets from the start of the file)
//   ...            the shards' delta files, back to back
//   end-16         XXH3-128 of every byte before it (digest128's canonical form)
//
// Guarantees:
//   - diff requires OLD and NEW to hold the same shard files and to place every tensor in the
//     same shard (re-sharding is refused, naming the tensor), and each index to agree with its
//     shards' headers (naming the index and the shard).
//   - apply refuses, before creating anything, a base directory whose index places a tensor in
//     another shard than the delta's base, lacks a shard or has another one, or whose shards are
//     not the delta's bases (naming the file and the tensor).
//   - apply into OUT_DIR builds the whole result (index and shards) in a hidden sibling
//     directory and renames it to OUT_DIR, which must not exist or be an empty directory: OUT_DIR
//     is absent (or empty) or the verified result.
//   - apply in place changes the shards and the index so that, whatever step a crash ends it
//     at, recover_sharded_in_place (or the next in-place apply) leaves every shard and the index
//     all old or all new: every shard's journal is written into a hidden directory, and renaming
//     that directory to `.dcr-journal` is the single commit point (before it: all old; after it:
//     roll forward to all new). A shard that does not verify undoes every shard.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/error.hpp"
#include "dcr/io/checkpoint.hpp"
#include "dcr/io/delta.hpp"
#include "dcr/io/file.hpp"
#include "dcr/io/safetensors.hpp"

namespace dcr::io {

/// Constants of the sharded delta container (version 1).
namespace sharded_delta_format {
inline constexpr std::array<char, 8> magic = {'D', 'C', 'R', 'S', 'H', 'A', 'R', 'D'};
inline constexpr std::uint64_t version = 1;
inline constexpr std::size_t prefix_size = 16;
inline constexpr std::size_t trailer_size = 16;
/// The largest manifest a reader accepts.
inline constexpr std::uint64_t max_manifest_size = 1'000'000'000;
}  // namespace sharded_delta_format

/// The directory journal of an in-place apply of the sharded checkpoint in `dir`, and the name
/// of its uncommitted (or retired) temporaries `.dcr-journal.tmp-<tag>`.
[[nodiscard]] inline std::filesystem::path sharded_journal_path(const std::filesystem::path& dir) {
  return dir / ".dcr-journal";
}
[[nodiscard]] inline std::filesystem::path sharded_journal_temporary(
    const std::filesystem::path& dir, std::string_view tag) {
  return dir / (".dcr-journal.tmp-" + std::string(tag));
}

namespace detail {

// `p` without a trailing separator ("a/b/" -> "a/b"), so that its filename is the directory's.
std::filesystem::path without_trailing_separator(std::filesystem::path p);

// Throws corrupt_payload unless `name` is a plain file name (no directory part, not "." or
// ".."), as shard names in an index or a delta must be.
void require_plain_file_name(const std::string& name, std::string_view where);

std::string read_whole_file(const std::filesystem::path& path);

void write_file_atomically(const std::filesystem::path& path, std::string_view text,
                                  mode_t mode);

}  // namespace detail

/// A sharded checkpoint's directory, index and weight map, as read and checked by
/// open_sharded_checkpoint.
struct sharded_checkpoint {
  std::filesystem::path dir;
  std::filesystem::path index_path;  ///< dir / index_name
  std::string index_name;            ///< e.g. "model.safetensors.index.json"
  std::string index_json;            ///< the index file, verbatim
  std::map<std::string, std::string> weight_map;  ///< tensor name -> shard file name
  std::vector<std::string> shards;                ///< the shard file names, sorted, unique

  /// The shard's path.
  [[nodiscard]] std::filesystem::path shard_path(const std::string& shard) const;
  /// The names of the tensors the index places in `shard`, sorted.
  [[nodiscard]] std::vector<std::string> tensors_of(const std::string& shard) const;
};

/// The index file of the sharded checkpoint in `dir`: its only file named
/// `*.safetensors.index.json`. invalid_argument if there is none or more than one.
[[nodiscard]] std::filesystem::path find_safetensors_index(
    const std::filesystem::path& dir);

/// Reads and checks the index of the sharded checkpoint in `dir` (find_safetensors_index): a
/// JSON object with a "weight_map" object of strings, each a plain file name. corrupt_payload
/// naming the index file otherwise. The shards themselves are not opened.
[[nodiscard]] sharded_checkpoint open_sharded_checkpoint(const std::filesystem::path& dir);

/// Throws corrupt_payload unless the shard file `shard` of `c` holds exactly the tensors the index
/// places in it (names only; `header` is the shard's).
void require_index_matches_shard(const sharded_checkpoint& c, const std::string& shard,
                                        const safetensors_header& header);

/// Whether `path` is a sharded delta file (its first 8 bytes are the magic). False for a file
/// that cannot be read or is shorter.
[[nodiscard]] inline bool is_sharded_delta(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char m[8] = {};
  const bool ok = ::pread(fd, m, 8, 0) == 8 &&
                  std::memcmp(m, sharded_delta_format::magic.data(), 8) == 0;
  ::close(fd);
  return ok;
}

/// A validated, read-only sharded delta file: maps it, checks its digest, its manifest, and
/// every shard's delta (delta_file::parse, so corrupt_payload and the like name the shard).
class sharded_delta_file {
 public:
  /// One shard: its file name and its delta.
  struct shard {
    std::string file;
    delta_file delta;
  };

  static sharded_delta_file open(const std::filesystem::path& path);

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// The index file's name, and NEW's index verbatim.
  [[nodiscard]] const std::string& index_name() const noexcept { return index_name_; }
  [[nodiscard]] const std::string& result_index() const noexcept { return result_index_; }
  /// The shards, in file name order.
  [[nodiscard]] const std::vector<shard>& shards() const noexcept { return shards_; }
  /// The same, to bind each shard's delta to its base shard (delta_file::bind_base).
  [[nodiscard]] std::vector<shard>& shards() noexcept { return shards_; }
  /// How the shard is named in errors: "shard 'x' of the sharded delta 'd'".
  [[nodiscard]] std::string shard_what(const shard& s) const;

  /// Throws unless every shard file of `base` the delta names holds the tensors (names, dtypes,
  /// shapes) of that shard's delta base (registry_mismatch, "wrong base", naming the shard file;
  /// a shard that cannot be read is an io_error naming it), and the index of `base` places every
  /// tensor in the shard whose delta holds it and names exactly the delta's shards:
  /// verification_failed ("wrong base") naming the index file and the first tensor or shard that
  /// differs. A version-2 delta names no tensor, so the names are the base shards' (the delta's
  /// registry fingerprint vouches for them). The shards' contents (header content, tensor bytes)
  /// are checked by the apply of each shard, which binds its delta to the shard.
  void require_base_index(const sharded_checkpoint& base) const;

 private:
  std::filesystem::path path_;
  mapped_file map_;
  std::string index_name_;
  std::string result_index_;
  std::vector<shard> shards_;
};

// ------------------------------------------------------------------------------------------------
// diff

/// Diffs the sharded checkpoints in OLD_DIR and NEW_DIR into a sharded delta at `delta_path`,
/// published atomically. Both must hold the same shard files with every tensor in the same
/// shard (invalid_argument naming the tensor or shard otherwise), each index must agree with its
/// shards (require_index_matches_shard), and each pair of shards must hold the same tensors
/// (require_same_tensors). The report sums the shards' reports; checkpoint_bytes is the size of
/// NEW's shards, delta_bytes the sharded delta's size.
diff_report diff_sharded_checkpoints(const std::filesystem::path& old_dir,
                                     const std::filesystem::path& new_dir,
                                     const std::filesystem::path& delta_path,
                                     const diff_options& options = {});

// ------------------------------------------------------------------------------------------------
// apply into a new directory

namespace detail {

// Checks `base` against the sharded delta `d`: index (require_base_index) and no unfinished
// in-place apply of the directory (not_ready).
void require_sharded_base(const sharded_delta_file& d, const sharded_checkpoint& base);

// Removes a directory the caller created, with everything in it (best effort).
struct directory_remover {
  std::filesystem::path dir;
  ~directory_remover();
};

}  // namespace detail

/// Applies the sharded delta at `delta_path` to the sharded checkpoint in `base_dir`, writing the
/// result (NEW's index and every shard, each equal byte for byte to NEW's) into `out_dir`, which
/// must not exist or be an empty directory (invalid_argument). The result is built in a hidden
/// sibling directory of `out_dir` and renamed to it once every shard verified; on any error it is
/// removed and `out_dir` is not created. Shards and index keep the base files' permission bits.
/// Reports the progress of all shards together to options.progress.
apply_report apply_sharded_delta(const std::filesystem::path& delta_path,
                                 const std::filesystem::path& base_dir,
                                 const std::filesystem::path& out_dir_arg,
                                 const apply_options& options = {});

// ------------------------------------------------------------------------------------------------
// in place

namespace detail {

// The directory journal's listing: which index and shards it covers.
inline constexpr std::string_view sharded_journal_manifest = "manifest.json";
inline constexpr std::string_view sharded_journal_index = "index.json";

std::filesystem::path shard_journal_in(const std::filesystem::path& journal_dir,
                                              const std::string& shard);

// Options for shard number `i`: the per-shard crash points only on options.crash_shard.
in_place_options shard_options(const in_place_options& options, std::size_t i);

// Renames the committed journal directory to a temporary name (after which recovery only
// deletes it: every shard and the index hold the result) and removes it.
void retire_sharded_journal(const std::filesystem::path& dir);

// Removes `.dcr-journal.tmp-*` directories in `dir`: journals a crash left uncommitted (every
// shard and the index untouched) or retired ones (every shard and the index new).
std::size_t remove_sharded_journal_temporaries(const std::filesystem::path& dir);

// Rolls the committed directory journal of `dir` forward: every shard (finish_from_journal,
// keeping its journal), then the index, then retires the journal. If a shard does not verify
// (it was restored by finish_from_journal), undoes the shards before it and retires the journal,
// then rethrows: every shard and the index are old again. Counts every shard's finish_work on
// `meter`, or without one on a meter of options.progress of its own.
void finish_sharded_journal(const std::filesystem::path& dir,
                                   const in_place_options& options, recover_report& report,
                                   progress_meter* meter);

recover_report recover_sharded_locked(const std::filesystem::path& dir,
                                             const in_place_options& options);

}  // namespace detail

/// Finishes an in-place apply of the sharded checkpoint in `dir` that a crash interrupted, if
/// any: removes uncommitted or retired journal directories (`.dcr-journal.tmp-*`), and if the
/// journal `.dcr-journal` is committed, rolls every shard forward (as recover_in_place does for
/// one file), publishes the new index and removes the journal. If a shard does not verify, every
/// shard is restored and verification_failed is thrown. Without a journal it does nothing.
/// Holds the directory's in-place lock (in_place_lock) while it works.
inline recover_report recover_sharded_in_place(const std::filesystem::path& dir_arg,
                                               const in_place_options& options = {}) {
  const auto dir = detail::without_trailing_separator(dir_arg);
  const auto lock = in_place_lock(dir, options);
  return detail::recover_sharded_locked(dir, options);
}

/// Applies the sharded delta at `delta_path` to the sharded checkpoint in `dir` in place: every
/// shard and the index end all old or all new whatever step a crash ends it at (see the top of
/// this file and docs/tool.md, "Sharded checkpoints"). Takes the directory's in-place lock;
/// finishes an interrupted apply first (`recovered`); checks the index (require_base_index),
/// every shard as apply_delta_in_place does (regular files with one link: a symbolic link is
/// refused) and reports already_applied when every shard already holds its result. Steps:
/// journal of every shard into a hidden directory (journal_written), rename it to `.dcr-journal`
/// (journal_committed, the commit point), each shard rolled forward (base_hidden .. renamed_back,
/// crash-injected on the options.crash_shard-th shard the journal lists), the new index published (index_written), the
/// journal removed.
apply_report apply_sharded_delta_in_place(const std::filesystem::path& delta_path,
                                          const std::filesystem::path& dir_arg,
                                          const in_place_options& options = {});

}  // namespace dcr::io

#include "dcr/detail/io/sharded_checkpoint.inl"
