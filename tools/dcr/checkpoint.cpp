// tools/dcr/checkpoint.cpp: `dcr diff`, `dcr apply`, `dcr inspect`, `dcr recover`.
#include "checkpoint.hpp"

#include <fmt/core.h>
#include <zstd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>

#include "args.hpp"
#include "progress.hpp"
#include "dcr/io/checkpoint.hpp"
#include "dcr/io/report_json.hpp"
#include "dcr/io/sharded_checkpoint.hpp"

namespace dcr_tool {
namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* diff_usage = R"(usage: dcr diff OLD.safetensors NEW.safetensors -o DELTA [options]
       dcr diff OLD_DIR NEW_DIR -o DELTA [options]

Writes a delta file holding every element whose stored bits differ between OLD and NEW (both
with the same tensor names, dtypes and shapes), with digests of both so that `dcr apply` can
refuse the wrong base and verify its result. OLD_DIR and NEW_DIR are sharded checkpoints (a
*.safetensors.index.json and the shards its weight_map names, sharded the same way): the delta
then holds one part per shard, named by its shard file, and NEW's index.

options:
  -o, --output DELTA      the delta file to write (atomically)
  --encoding E            mixed | xor | ulp | overwrite (default mixed: smallest per item)
  --level N               zstd level of every stream (default 1). Levels above 1 rarely
                          shrink a delta: measured on real checkpoint pairs, level 3 was larger
                          on every pair and level 19 0-4% smaller at 10x the time
  --payload-records N     records per payload, the bound on raw records in memory
                          (default 2097152)
  --json                  print the report as JSON
  -q, --quiet             no progress line (shown on stderr only when it is a terminal)
  -h, --help              this text
)";

constexpr const char* apply_usage = R"(usage: dcr apply DELTA BASE.safetensors (-o OUT.safetensors | --in-place) [options]
       dcr apply DELTA BASE_DIR (-o OUT_DIR | --in-place) [options]

Applies a delta file to BASE. Refuses a BASE that is not the delta's base (its tensors, its
header and the digest of its tensors' bytes) and verifies the digest of the result's tensors
before the result becomes visible. A delta of sharded checkpoints applies to a directory: OUT_DIR
(which must not exist or be empty) receives the index and every shard; in place, every shard and
the index end all old or all new.

options:
  -o, --output OUT        write the result to OUT (atomically); BASE is not changed
  --in-place              update BASE itself, crash-safe (a journal beside BASE lets
                          `dcr recover BASE` or the next in-place apply finish the job)
  --no-wait               in place: refuse at once (status 8) instead of waiting while another
                          in-place apply or recover works in the same directory
  --json                  print the report as JSON
  -q, --quiet             no progress line (shown on stderr only when it is a terminal)
  -h, --help              this text
)";

constexpr const char* inspect_usage = R"(usage: dcr inspect DELTA [BASE.safetensors | BASE_DIR] [--json]

Validates a delta file (or an in-place journal) and prints its header (sizes, registry
fingerprint, the digests of the base's and the result's headers and tensors) and every
payload's items with their codings and stream sizes. A delta names no tensor: its tensors are
its base's. Given BASE (the checkpoint the delta applies to), it is checked against the delta
(tensors and header, not the tensor bytes) and the tensors are listed by name, with the
result's metadata; a journal holds its base's header and is always listed so. A sharded delta
is listed shard by shard, each as a delta file; its BASE is the base directory (BASE_DIR),
whose index and shards are checked the same way.

options:
  --json                  print as JSON
  -h, --help              this text
)";

constexpr const char* recover_usage = R"(usage: dcr recover BASE.safetensors [options]
       dcr recover BASE_DIR [options]

Finishes an in-place apply of BASE (or of the sharded checkpoint in BASE_DIR) that a crash
interrupted: rolls its journal forward, verifies the result and removes the journal. Does
nothing if there is no journal.

options:
  --no-wait               refuse at once (status 8) instead of waiting while another in-place
                          apply or recover works in the same directory
  --json                  print the report as JSON
  -q, --quiet             no progress line (shown on stderr only when it is a terminal)
  -h, --help              this text
)";

void expect_positionals(const std::vector<std::string>& p, std::size_t want, const char* names) {
  if (p.size() != want)
    throw usage_error(fmt::format("expected {} ({} file argument(s) given)", names, p.size()));
}

void print_json(const ojson& j) { fmt::print("{}\n", j.dump(2)); }

using dcr::io::apply_report;

// DCR_CRASH_AT and DCR_CRASH_SHARD, --no-wait, a note on stderr before waiting for the lock, and
// the progress line.
dcr::io::in_place_options in_place_options_for(bool no_wait, progress_line& progress) {
  auto o = dcr::io::in_place_options_from_environment();
  o.wait_for_lock = !no_wait;
  o.progress = progress.callback();
  o.on_lock_wait = [](const std::filesystem::path& dir) {
    fmt::print(stderr,
               "dcr: another in-place apply or recover is working in '{}'; waiting for it to "
               "finish\n",
               dir.string());
  };
  return o;
}

}  // namespace

int diff_main(const std::vector<std::string>& argv) {
  arg_parser args(argv);
  if (args.flag("-h") || args.flag("--help")) {
    fmt::print("{}", diff_usage);
    return 0;
  }
  std::string out = args.value("-o", "");
  if (out.empty()) out = args.value("--output", "");
  const auto encoding_text = args.value("--encoding", "mixed");
  const auto level = args.integer("--level", 1);
  const auto per_payload = args.integer("--payload-records", std::int64_t{1} << 21);
  const bool json = args.flag("--json");
  const bool quiet = args.flag("--quiet") || args.flag("-q");
  const auto files = args.positionals();
  args.finish();
  expect_positionals(files, 2, "OLD and NEW");
  if (out.empty()) throw usage_error("-o DELTA is required");
  dcr::io::diff_options options;
  if (encoding_text == "mixed") options.policy = dcr::encoding_policy::mixed;
  else if (encoding_text == "xor") options.policy = dcr::encoding_policy::xor_only;
  else if (encoding_text == "ulp") options.policy = dcr::encoding_policy::ulp_only;
  else if (encoding_text == "overwrite") options.policy = dcr::encoding_policy::overwrite_only;
  else throw usage_error("--encoding must be mixed, xor, ulp or overwrite");
  if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel())
    throw usage_error(fmt::format("--level must be in [{}, {}]", ZSTD_minCLevel(), ZSTD_maxCLevel()));
  if (per_payload < 1) throw usage_error("--payload-records must be >= 1");
  options.zstd_level = static_cast<int>(level);
  options.payload_records = static_cast<std::size_t>(per_payload);
  progress_line progress("dcr diff: scanned", progress_wanted(quiet));
  options.progress = progress.callback();

  const bool old_dir = std::filesystem::is_directory(files[0]);
  if (old_dir != std::filesystem::is_directory(files[1]))
    throw usage_error("OLD and NEW must both be safetensors files or both be directories");
  const auto r = old_dir ? dcr::io::diff_sharded_checkpoints(files[0], files[1], out, options)
                         : dcr::io::diff_checkpoints(files[0], files[1], out, options);
  progress.finish();
  const double per_changed =
      r.changed_elements ? static_cast<double>(r.delta_bytes) / r.changed_elements : 0.0;
  const double read_rate = r.seconds > 0 ? 2.0 * r.tensor_bytes / r.seconds / 1e9 : 0.0;
  if (json) {
    ojson j;
    j["old"] = files[0];
    j["new"] = files[1];
    j["delta"] = out;
    j["encoding"] = encoding_text;
    j["level"] = options.zstd_level;
    const auto fields = dcr::io::report_json(r);
    for (const auto& f : fields.items()) j[f.key()] = f.value();
    print_json(j);
  } else {
    fmt::print("dcr diff: {} of {} elements changed ({:.4f}%) in {} of {} tensors\n",
               r.changed_elements, r.elements,
               r.elements ? 100.0 * r.changed_elements / r.elements : 0.0, r.changed_tensors,
               r.tensors);
    fmt::print("  delta {} bytes ({:.3f} B/changed, {:.1f}x smaller than the {}-byte checkpoint), "
               "{} payloads, {} items (overwrite {}, xor {}, ulp {})\n",
               r.delta_bytes, per_changed,
               r.delta_bytes ? static_cast<double>(r.checkpoint_bytes) / r.delta_bytes : 0.0,
               r.checkpoint_bytes, r.payloads, r.items, r.items_by_encoding[0],
               r.items_by_encoding[1], r.items_by_encoding[2]);
    fmt::print("  {:.3f} s (scan {:.3f} s, encode {:.3f} s, write {:.3f} s; {:.2f} GB/s read)  -> {}\n",
               r.seconds, r.scan_seconds, r.encode_seconds, r.write_seconds, read_rate, out);
  }
  return 0;
}

int apply_main(const std::vector<std::string>& argv) {
  arg_parser args(argv);
  if (args.flag("-h") || args.flag("--help")) {
    fmt::print("{}", apply_usage);
    return 0;
  }
  std::string out = args.value("-o", "");
  if (out.empty()) out = args.value("--output", "");
  const bool in_place = args.flag("--in-place");
  const bool no_wait = args.flag("--no-wait");
  const bool json = args.flag("--json");
  const bool quiet = args.flag("--quiet") || args.flag("-q");
  const auto files = args.positionals();
  args.finish();
  expect_positionals(files, 2, "DELTA and BASE");
  if (in_place == !out.empty()) throw usage_error("give exactly one of -o OUT and --in-place");

  const bool sharded = std::filesystem::is_directory(files[1]);
  if (sharded != dcr::io::is_sharded_delta(files[0]) && std::filesystem::is_regular_file(files[0]))
    throw dcr::io::input_error(
        dcr::io::input_fault::wrong_base, dcr::errc::invalid_argument,
        sharded ? "BASE '" + files[1] + "' is a directory but '" + files[0] +
                      "' is a delta of single safetensors files (give the shard file, or diff the "
                      "directories)"
                : "'" + files[0] + "' is a delta of sharded checkpoints (directories) but BASE '" +
                      files[1] + "' is not a directory");
  progress_line progress("dcr apply: processed", progress_wanted(quiet));
  const auto options =
      in_place ? in_place_options_for(no_wait, progress) : dcr::io::in_place_options{};
  const dcr::io::apply_options to_new{.progress = progress.callback()};
  apply_report r;
  if (sharded)
    r = in_place ? dcr::io::apply_sharded_delta_in_place(files[0], files[1], options)
                 : dcr::io::apply_sharded_delta(files[0], files[1], out, to_new);
  else
    r = in_place ? dcr::io::apply_delta_in_place(files[0], files[1], options)
                 : dcr::io::apply_delta(files[0], files[1], out, to_new);
  progress.finish();
  const std::string result = in_place ? files[1] : out;
  if (json) {
    ojson j;
    j["delta"] = files[0];
    j["base"] = files[1];
    j["output"] = result;
    j["in_place"] = in_place;
    const auto fields = dcr::io::report_json(r);
    for (const auto& f : fields.items()) j[f.key()] = f.value();
    print_json(j);
  } else {
    if (r.recovered)
      fmt::print("dcr apply: finished an interrupted in-place apply of {} first\n", files[1]);
    if (r.already_applied)
      fmt::print("dcr apply: {} already holds the delta's result; nothing to do\n", files[1]);
    else
      fmt::print("dcr apply: {} changed elements in {} tensors, result verified, "
                 "{:.3f} s -> {}\n",
                 r.records, r.tensors, r.seconds, result);
  }
  return 0;
}

int recover_main(const std::vector<std::string>& argv) {
  arg_parser args(argv);
  if (args.flag("-h") || args.flag("--help")) {
    fmt::print("{}", recover_usage);
    return 0;
  }
  const bool no_wait = args.flag("--no-wait");
  const bool json = args.flag("--json");
  const bool quiet = args.flag("--quiet") || args.flag("-q");
  const auto files = args.positionals();
  args.finish();
  expect_positionals(files, 1, "BASE");
  progress_line progress("dcr recover: processed", progress_wanted(quiet));
  const auto options = in_place_options_for(no_wait, progress);
  const auto r = std::filesystem::is_directory(files[0])
                     ? dcr::io::recover_sharded_in_place(files[0], options)
                     : dcr::io::recover_in_place(files[0], options);
  progress.finish();
  if (json) {
    ojson j;
    j["base"] = files[0];
    j["journal_found"] = r.journal_found;
    j["rolled_forward"] = r.rolled_forward;
    j["changed_elements"] = r.records;
    j["temporaries_removed"] = r.temporaries_removed;
    j["seconds"] = r.seconds;
    print_json(j);
  } else if (!r.journal_found) {
    fmt::print("dcr recover: no interrupted in-place apply of {}{}\n", files[0],
               r.temporaries_removed ? fmt::format(" ({} unpublished journal file(s) removed)",
                                                   r.temporaries_removed)
                                     : "");
  } else {
    fmt::print("dcr recover: {} {}; journal removed\n", files[0],
               r.rolled_forward ? fmt::format("rolled forward ({} elements written, result "
                                              "verified)",
                                              r.records)
                                : std::string("already held the result"));
  }
  return 0;
}

namespace {

void print_inspect_text(const ojson& j, const std::string& indent) {
  fmt::print("{}{} {}: format {}, {} bytes, {} tensors ({} changed, {} bytes), {} payloads, {} "
             "records, registry {}\n",
             indent, j["kind"].get<std::string>(), j["file"].get<std::string>(),
             j["format_version"].get<int>(), j["bytes"].get<std::uint64_t>(),
             j["tensor_count"].get<std::uint64_t>(), j["changed_tensors"].get<std::uint64_t>(),
             j["tensor_bytes"].get<std::uint64_t>(), j["payload_count"].get<std::uint64_t>(),
             j["records"].get<std::uint64_t>(), j["registry_fingerprint"].get<std::string>());
  fmt::print("{}  base header {}  tensors {}\n{}  result header {}  tensors {}\n", indent,
             j["base_header_digest"].get<std::string>(), j["base_digest"].get<std::string>(),
             indent, j["target_header_digest"].get<std::string>(),
             j["result_digest"].get<std::string>());
  fmt::print("{}  target header: {} bytes, coded against the base's in {}\n", indent,
             j["target_header_bytes"].get<std::uint64_t>(),
             j["target_header_code_bytes"].get<std::uint64_t>());
  if (j["metadata"].is_object())
    for (const auto& [k, v] : j["metadata"].items())
      fmt::print("{}  metadata {} = {}\n", indent, k, v.get<std::string>());
  if (j["tensors"].is_array()) {
    fmt::print("{}tensors:\n{}  {:>5}  {:<40} {:<8} {:<20} {}\n", indent, indent, "id", "name",
               "dtype", "shape", "changed");
    for (const auto& t : j["tensors"])
      fmt::print("{}  {:>5}  {:<40} {:<8} {:<20} {}\n", indent, t["id"].get<std::uint64_t>(),
                 t["name"].get<std::string>(), t["dtype"].get<std::string>(), t["shape"].dump(),
                 t["changed"].get<bool>() ? "yes" : "no");
  }
  for (const auto& p : j["payloads"]) {
    fmt::print("{}payload {} ({}, sequence {}) at byte {}: {} bytes, {} items\n", indent,
               p["index"].get<std::uint64_t>(), p["direction"].get<std::string>(),
               p["sequence"].get<std::uint64_t>(), p["offset"].get<std::uint64_t>(),
               p["bytes"].get<std::uint64_t>(), p["items"].size());
    for (const auto& it : p["items"])
      fmt::print("{}  {:<40} {:<8} {:>10} records  {:<9} loc {:<12} {:>9}/{:<9} val {:<14} "
                 "{:>9}/{:<9}\n",
                 indent,
                 it["tensor"].is_null() ? fmt::format("tensor id {}",
                                                      it["tensor_id"].get<std::uint64_t>())
                                        : it["tensor"].get<std::string>(),
                 it["dtype"].get<std::string>(), it["count"].get<std::uint64_t>(),
                 it["encoding"].get<std::string>(), it["location_coding"].get<std::string>(),
                 it["location_bytes"].get<std::uint64_t>(),
                 it["location_raw_bytes"].get<std::uint64_t>(),
                 it["value_coding"].get<std::string>(), it["value_bytes"].get<std::uint64_t>(),
                 it["value_raw_bytes"].get<std::uint64_t>());
  }
}

}  // namespace

int inspect_main(const std::vector<std::string>& argv) {
  arg_parser args(argv);
  if (args.flag("-h") || args.flag("--help")) {
    fmt::print("{}", inspect_usage);
    return 0;
  }
  const bool json = args.flag("--json");
  const auto files = args.positionals();
  args.finish();
  if (files.size() != 1 && files.size() != 2)
    throw usage_error(
        fmt::format("expected DELTA and optionally BASE ({} file argument(s) given)",
                    files.size()));

  if (dcr::io::is_sharded_delta(files[0])) {
    auto d = dcr::io::blame(dcr::io::input_fault::delta,
                            [&] { return dcr::io::sharded_delta_file::open(files[0]); });
    if (files.size() == 2) {
      // BASE_DIR: its index and shards are checked like apply does (not the tensor bytes) and
      // each shard's delta is bound to its shard, naming its tensors.
      const auto base = dcr::io::blame(dcr::io::input_fault::checkpoint,
                                       [&] { return dcr::io::open_sharded_checkpoint(files[1]); });
      dcr::io::blame(dcr::io::input_fault::wrong_base, [&] { d.require_base_index(base); });
      for (auto& s : d.shards()) {
        const auto path = base.shard_path(s.file);
        const auto f = dcr::io::blame(dcr::io::input_fault::checkpoint,
                                      [&] { return dcr::io::safetensors_file::open(path); });
        dcr::io::detail::bind_delta_base(s.delta, f, "BASE shard '" + path.string() + "'");
      }
    }
    ojson j;
    j["file"] = files[0];
    j["kind"] = "sharded_delta";
    j["format_version"] = dcr::io::sharded_delta_format::version;
    j["index"] = d.index_name();
    j["result_index_bytes"] = d.result_index().size();
    ojson shards = ojson::array();
    std::uint64_t tensors = 0;
    std::uint64_t changed = 0;
    std::uint64_t records = 0;
    for (const auto& s : d.shards()) {
      auto sj = dcr::io::inspect_json(s.delta, s.file);
      tensors += sj["tensor_count"].get<std::uint64_t>();
      changed += sj["changed_tensors"].get<std::uint64_t>();
      records += sj["records"].get<std::uint64_t>();
      shards.push_back(std::move(sj));
    }
    j["shard_count"] = d.shards().size();
    j["tensor_count"] = tensors;
    j["changed_tensors"] = changed;
    j["records"] = records;
    j["shards"] = std::move(shards);
    if (json) {
      print_json(j);
      return 0;
    }
    fmt::print("sharded delta {}: format {}, index {}, {} shards, {} tensors ({} changed), {} "
               "records\n",
               files[0], dcr::io::sharded_delta_format::version, d.index_name(),
               d.shards().size(), tensors, changed, records);
    for (const auto& sj : j["shards"]) {
      fmt::print("shard {}:\n", sj["file"].get<std::string>());
      print_inspect_text(sj, "  ");
    }
    return 0;
  }

  const auto d = dcr::io::open_for_inspect(
      files[0], files.size() == 2 ? std::optional<std::filesystem::path>(files[1]) : std::nullopt);
  const auto j = dcr::io::inspect_json(d, files[0]);
  if (json) print_json(j);
  else print_inspect_text(j, "");
  return 0;
}

}  // namespace dcr_tool
