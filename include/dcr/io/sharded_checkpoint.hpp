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
[[nodiscard]] inline std::filesystem::path find_safetensors_index(
    const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    constexpr std::string_view suffix = ".safetensors.index.json";
    if (name.size() > suffix.size() && name[0] != '.' &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      found.push_back(e.path());
  }
  if (ec) throw_io_error("cannot list the directory", dir, ec.value());
  DCR_EXPECTS(!found.empty(), errc::invalid_argument,
              "the directory '" + dir.string() +
                  "' holds no safetensors index (*.safetensors.index.json): not a sharded "
                  "checkpoint");
  std::sort(found.begin(), found.end());
  DCR_EXPECTS(found.size() == 1, errc::invalid_argument,
              "the directory '" + dir.string() + "' holds more than one safetensors index ('" +
                  found[0].filename().string() + "', '" + found[1].filename().string() + "')");
  return found[0];
}

/// Reads and checks the index of the sharded checkpoint in `dir` (find_safetensors_index): a
/// JSON object with a "weight_map" object of strings, each a plain file name. corrupt_payload
/// naming the index file otherwise. The shards themselves are not opened.
[[nodiscard]] inline sharded_checkpoint open_sharded_checkpoint(const std::filesystem::path& dir) {
  sharded_checkpoint c;
  c.dir = detail::without_trailing_separator(dir);
  c.index_path = find_safetensors_index(c.dir);
  c.index_name = c.index_path.filename().string();
  c.index_json = detail::read_whole_file(c.index_path);
  const std::string where = "the index '" + c.index_path.string() + "'";
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(c.index_json);
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::corrupt_payload, where + " is not valid JSON (" + e.what() + ")");
  }
  DCR_EXPECTS(doc.is_object() && doc.contains("weight_map") && doc["weight_map"].is_object(),
              errc::corrupt_payload, where + " has no \"weight_map\" object");
  std::set<std::string> shards;
  for (const auto& [tensor, file] : doc["weight_map"].items()) {
    DCR_EXPECTS(file.is_string(), errc::corrupt_payload,
                where + ": the weight_map entry of '" + tensor + "' is not a file name string");
    const auto name = file.get<std::string>();
    detail::require_plain_file_name(name, where);
    c.weight_map.emplace(tensor, name);
    shards.insert(name);
  }
  DCR_EXPECTS(!shards.empty(), errc::corrupt_payload, where + " has an empty weight_map");
  c.shards.assign(shards.begin(), shards.end());
  return c;
}

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
inline diff_report diff_sharded_checkpoints(const std::filesystem::path& old_dir,
                                            const std::filesystem::path& new_dir,
                                            const std::filesystem::path& delta_path,
                                            const diff_options& options = {}) {
  const auto start = detail::clock::now();
  const auto old_c = blame(input_fault::checkpoint, [&] { return open_sharded_checkpoint(old_dir); });
  const auto new_c = blame(input_fault::checkpoint, [&] { return open_sharded_checkpoint(new_dir); });
  blame(input_fault::checkpoint, [&] {
  DCR_EXPECTS(old_c.index_name == new_c.index_name, errc::invalid_argument,
              "OLD's index is '" + old_c.index_path.string() + "', NEW's '" +
                  new_c.index_path.string() + "': the index files must have the same name");
  for (const auto& [tensor, file] : old_c.weight_map) {
    const auto it = new_c.weight_map.find(tensor);
    DCR_EXPECTS(it != new_c.weight_map.end(), errc::unknown_tensor,
                "tensor '" + tensor + "' is in OLD's index '" + old_c.index_path.string() +
                    "' but not in NEW's '" + new_c.index_path.string() +
                    "' (added or removed tensors are not supported)");
    DCR_EXPECTS(it->second == file, errc::invalid_argument,
                "tensor '" + tensor + "' is in '" + file + "' in OLD and in '" + it->second +
                    "' in NEW: re-sharded checkpoints are not supported (diff the shards' "
                    "contents with the same sharding)");
  }
  for (const auto& [tensor, file] : new_c.weight_map)
    DCR_EXPECTS(old_c.weight_map.count(tensor) != 0, errc::unknown_tensor,
                "tensor '" + tensor + "' is in NEW's index '" + new_c.index_path.string() +
                    "' but not in OLD's '" + old_c.index_path.string() +
                    "' (added or removed tensors are not supported)");
  });
  for (const auto& shard : old_c.shards)
    DCR_EXPECTS(!same_file(delta_path, old_c.shard_path(shard)) &&
                    !same_file(delta_path, new_c.shard_path(shard)),
                errc::invalid_argument,
                "the delta '" + delta_path.string() + "' would replace a shard of OLD or NEW");

  // Each shard's delta goes to a hidden temporary file beside the output, removed at the end.
  struct temporaries {
    std::vector<std::filesystem::path> paths;
    ~temporaries() {
      for (const auto& p : paths) ::unlink(p.c_str());
    }
  } temps;
  diff_report report;
  // Progress over all shards: the shards' tensor bytes, from their headers.
  std::uint64_t all_bytes = 0;
  for (const auto& shard : old_c.shards) {
    const auto f = blame(input_fault::checkpoint,
                         [&] { return safetensors_file::open(old_c.shard_path(shard)); });
    all_bytes += f.header().buffer_size();
  }
  auto shard_options = options;
  if (options.progress)
    shard_options.progress = [&](std::uint64_t done, std::uint64_t) {
      options.progress(report.tensor_bytes + done, all_bytes);
    };
  checkpoint_differ differ(shard_options);
  std::vector<std::uint64_t> sizes;
  for (std::size_t i = 0; i < old_c.shards.size(); ++i) {
    const auto& shard = old_c.shards[i];
    const auto old_file = blame(input_fault::checkpoint, [&] {
      return safetensors_file::open(old_c.shard_path(shard), !options.worker_thread);
    });
    const auto new_file = blame(input_fault::checkpoint, [&] {
      return safetensors_file::open(new_c.shard_path(shard), !options.worker_thread);
    });
    blame(input_fault::checkpoint, [&] {
      require_index_matches_shard(old_c, shard, old_file.header());
      require_index_matches_shard(new_c, shard, new_file.header());
    });
    temps.paths.push_back(hidden_sibling(
        delta_path, ".shard-" + std::to_string(i) + ".tmp-" + std::to_string(::getpid())));
    const auto r = differ.diff(old_file, new_file, temps.paths.back());
    report.tensors += r.tensors;
    report.changed_tensors += r.changed_tensors;
    report.elements += r.elements;
    report.changed_elements += r.changed_elements;
    report.checkpoint_bytes += r.checkpoint_bytes;
    report.tensor_bytes += r.tensor_bytes;
    report.payloads += r.payloads;
    report.items += r.items;
    for (std::size_t e = 0; e < 3; ++e) {
      report.items_by_encoding[e] += r.items_by_encoding[e];
      report.records_by_encoding[e] += r.records_by_encoding[e];
    }
    report.scan_seconds += r.scan_seconds;
    report.encode_seconds += r.encode_seconds;
    report.write_seconds += r.write_seconds;
    report.wait_seconds += r.wait_seconds;
    sizes.push_back(r.delta_bytes);
  }

  const auto t0 = detail::clock::now();
  nlohmann::ordered_json manifest;
  manifest["version"] = sharded_delta_format::version;
  manifest["index"] = new_c.index_name;
  manifest["result_index"] = new_c.index_json;
  // The offsets depend on the manifest's length, which depends on the offsets' digits: settle
  // it by iterating (two rounds at most, since offsets only grow).
  std::string text;
  std::uint64_t manifest_size = 0;
  for (int round = 0; round < 4; ++round) {
    auto shards = nlohmann::ordered_json::array();
    std::uint64_t offset = sharded_delta_format::prefix_size + manifest_size;
    for (std::size_t i = 0; i < old_c.shards.size(); ++i) {
      shards.push_back({{"file", old_c.shards[i]}, {"offset", offset}, {"bytes", sizes[i]}});
      offset += sizes[i];
    }
    manifest["shards"] = shards;
    text = manifest.dump();
    if (text.size() == manifest_size) break;
    manifest_size = text.size();
  }
  DCR_EXPECTS(text.size() == manifest_size, errc::overflow,
              "sharded delta: the manifest's length did not settle");

  atomic_file out(delta_path);
  digest_stream digest;
  std::uint64_t at = 0;
  const auto put = [&](std::span<const std::byte> bytes) {
    out.write_at(bytes, at);
    digest.update(bytes);
    at += bytes.size();
  };
  std::array<std::byte, sharded_delta_format::prefix_size> prefix{};
  std::memcpy(prefix.data(), sharded_delta_format::magic.data(), 8);
  dcr::detail::store_le<std::uint64_t>(prefix.data() + 8, text.size());
  put(prefix);
  put(std::as_bytes(std::span<const char>(text.data(), text.size())));
  for (const auto& p : temps.paths) {
    const auto f = mapped_file::open_read(p);
    put(f.bytes());
  }
  const auto d = digest.digest();
  put(std::as_bytes(std::span<const std::uint8_t>(d.bytes.data(), d.bytes.size())));
  out.commit();
  report.delta_bytes = at;
  report.write_seconds += detail::seconds_since(t0);
  report.seconds = detail::seconds_since(start);
  return report;
}

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
inline apply_report apply_sharded_delta(const std::filesystem::path& delta_path,
                                        const std::filesystem::path& base_dir,
                                        const std::filesystem::path& out_dir_arg,
                                        const apply_options& options = {}) {
  const auto start = detail::clock::now();
  const auto out_dir = detail::without_trailing_separator(out_dir_arg);
  auto d = blame(input_fault::delta, [&] { return sharded_delta_file::open(delta_path); });
  const auto base =
      blame(input_fault::checkpoint, [&] { return open_sharded_checkpoint(base_dir); });
  blame(input_fault::wrong_base, [&] { detail::require_sharded_base(d, base); });
  {
    std::error_code ec;
    const bool exists = std::filesystem::exists(out_dir, ec);
    DCR_EXPECTS(!exists || (std::filesystem::is_directory(out_dir, ec) &&
                            std::filesystem::is_empty(out_dir, ec)),
                errc::invalid_argument,
                "OUT '" + out_dir.string() + "' exists and is not an empty directory");
    DCR_EXPECTS(!same_file(out_dir, base.dir), errc::invalid_argument,
                "OUT '" + out_dir.string() + "' is BASE itself; use the in-place apply");
  }
  detail::directory_remover temp;
  {
    std::random_device rd;
    for (int attempt = 0; temp.dir.empty(); ++attempt) {
      const auto p = hidden_sibling(out_dir, ".tmp-" + std::to_string(::getpid()) + "-" +
                                                 std::to_string(rd() % 1000000007u));
      if (::mkdir(p.c_str(), 0755) == 0) temp.dir = p;
      else if (errno != EEXIST || attempt > 16) throw_io_error("cannot create", p, errno);
    }
  }
  std::uint64_t work = 0;
  if (options.progress)
    for (const auto& s : d.shards()) work += detail::apply_work(s.delta);
  detail::progress_meter meter(options.progress, work);
  apply_report report;
  for (auto& s : d.shards()) {
    const auto r =
        detail::apply_delta_metered(s.delta, base.shard_path(s.file), temp.dir / s.file, meter);
    report.tensors += r.tensors;
    report.payloads += r.payloads;
    report.records += r.records;
    report.output_bytes += r.output_bytes;
  }
  detail::write_file_atomically(temp.dir / d.index_name(), d.result_index(),
                                permission_bits(base.index_path));
  sync_directory(temp.dir);
  if (::rename(temp.dir.c_str(), out_dir.c_str()) != 0)
    throw_io_error("cannot rename to '" + out_dir.string() + "' the directory", temp.dir, errno);
  temp.dir.clear();
  sync_directory(parent_directory(out_dir));
  report.seconds = detail::seconds_since(start);
  return report;
}

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
inline apply_report apply_sharded_delta_in_place(const std::filesystem::path& delta_path,
                                                 const std::filesystem::path& dir_arg,
                                                 const in_place_options& options = {}) {
  const auto start = detail::clock::now();
  const auto dir = detail::without_trailing_separator(dir_arg);
  const auto lock = in_place_lock(dir, options);
  apply_report report;
  report.recovered = detail::recover_sharded_locked(dir, options).journal_found;
  auto d = blame(input_fault::delta, [&] { return sharded_delta_file::open(delta_path); });
  const auto base = blame(input_fault::checkpoint, [&] { return open_sharded_checkpoint(dir); });
  blame(input_fault::wrong_base, [&] { detail::require_sharded_base(d, base); });
  for (const auto& s : d.shards())
    require_single_regular_file(base.shard_path(s.file), "in-place apply: shard");

  detail::directory_remover temp;
  {
    std::random_device rd;
    for (int attempt = 0; temp.dir.empty(); ++attempt) {
      const auto p = sharded_journal_temporary(
          dir, std::to_string(::getpid()) + "-" + std::to_string(rd() % 1000000007u));
      if (::mkdir(p.c_str(), 0755) == 0) temp.dir = p;
      else if (errno != EEXIST || attempt > 16) throw_io_error("cannot create", p, errno);
    }
  }
  // The work of each shard: prepare_work, then finish_work with the shard in place (its journal
  // writes one word per changed element of its delta).
  const auto finish_work = [](const delta_file& shard) {
    return 2 * shard.tensor_bytes() + detail::changed_bytes(shard, false);
  };
  std::uint64_t work = 0;
  if (options.progress)
    for (const auto& s : d.shards()) work += detail::prepare_work(s.delta) + finish_work(s.delta);
  detail::progress_meter meter(options.progress, work);
  std::vector<std::string> applied_already;  // shards holding their result (not their base)
  std::vector<std::string> to_apply;         // shards holding their base (and not their result)
  nlohmann::ordered_json listing;
  listing["index"] = d.index_name();
  listing["shards"] = nlohmann::ordered_json::array();
  for (auto& s : d.shards()) {
    apply_report r;
    const bool journaled = detail::prepare_in_place(s.delta, base.shard_path(s.file),
                                                    detail::shard_journal_in(temp.dir, s.file),
                                                    options, false, r, meter);
    // A shard whose delta changes neither its tensors nor its header holds its base and its
    // result at once: prepare_in_place finds it "applied already"; it needs no journal.
    const bool unchanged = s.delta.base_digest() == s.delta.result_digest() &&
                           s.delta.base_header_digest() == s.delta.target_header_digest();
    if (!journaled) {
      if (meter.enabled()) meter.advance(finish_work(s.delta));  // nothing to finish
      if (!unchanged) applied_already.push_back(s.file);
      report.tensors += r.tensors;
      report.output_bytes += r.output_bytes;
      continue;
    }
    to_apply.push_back(s.file);
    listing["shards"].push_back(s.file);
    report.tensors += r.tensors;
    report.payloads += r.payloads;
    report.records += r.records;
    report.output_bytes += r.output_bytes;
  }
  if (!applied_already.empty() && !to_apply.empty())
    throw input_error(input_fault::wrong_base, errc::verification_failed,
                      "wrong base: BASE '" + dir.string() + "' is partly the delta's result: "
                      "shard '" + applied_already.front() + "' holds its result, shard '" +
                          to_apply.front() + "' its base (changed outside dcr?); nothing was "
                          "changed");
  if (to_apply.empty() && base.index_json == d.result_index()) {
    report.already_applied = true;
    report.seconds = detail::seconds_since(start);
    return report;
  }
  detail::write_file_atomically(temp.dir / std::string(detail::sharded_journal_index),
                                d.result_index(), 0644);
  detail::write_file_atomically(temp.dir / std::string(detail::sharded_journal_manifest),
                                listing.dump(), 0644);
  sync_directory(temp.dir);
  detail::crash_point(options, in_place_step::journal_written);
  const auto journal = sharded_journal_path(dir);
  if (::rename(temp.dir.c_str(), journal.c_str()) != 0)
    throw_io_error("cannot rename to '" + journal.string() + "' the directory", temp.dir, errno);
  temp.dir.clear();
  sync_directory(dir);
  detail::crash_point(options, in_place_step::journal_committed);
  recover_report r;
  detail::finish_sharded_journal(dir, options, r, &meter);
  report.seconds = detail::seconds_since(start);
  return report;
}

}  // namespace dcr::io

#include "dcr/detail/io/sharded_checkpoint.inl"
