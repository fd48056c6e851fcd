// tools/dcr/checkpoint.cpp: `dcr diff`, `dcr apply`, `dcr inspect`, `dcr recover`.
#include "checkpoint.hpp"

#include <fmt/core.h>
#include <zstd.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstring>
#include <fstream>
#include <string>

#include "args.hpp"
#include "dcr/io/checkpoint.hpp"
#include "dcr/io/report_json.hpp"

namespace dcr_tool {
namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* diff_usage = R"(usage: dcr diff OLD.safetensors NEW.safetensors -o DELTA [options]

Writes a delta file holding every element whose stored bits differ between OLD and NEW (both
with the same tensor names, dtypes and shapes), with digests of both so that `dcr apply` can
refuse the wrong base and verify its result.

options:
  -o, --output DELTA      the delta file to write (atomically)
  --encoding E            mixed | xor | ulp | overwrite (default mixed: smallest per item)
  --level N               zstd level of every stream (default 1)
  --payload-records N     records per payload, the bound on raw records in memory
                          (default 2097152)
  --json                  print the report as JSON
  -h, --help              this text
)";

constexpr const char* apply_usage = R"(usage: dcr apply DELTA BASE.safetensors (-o OUT.safetensors | --in-place) [--json]

Applies a delta file to BASE. Refuses a BASE that is not the delta's base (its tensors, its
header and the digest of its tensors' bytes) and verifies the digest of the result's tensors
before the result becomes visible.

options:
  -o, --output OUT        write the result to OUT (atomically); BASE is not changed
  --in-place              update BASE itself, crash-safe (a journal beside BASE lets
                          `dcr recover BASE` or the next in-place apply finish the job)
  --json                  print the report as JSON
  -h, --help              this text
)";

constexpr const char* inspect_usage = R"(usage: dcr inspect DELTA [BASE.safetensors] [--json]

Validates a delta file (or an in-place journal) and prints its header (sizes, registry
fingerprint, the digests of the base's and the result's headers and tensors) and every
payload's items with their codings and stream sizes. A delta names no tensor: its tensors are
its base's. Given BASE (the checkpoint the delta applies to), it is checked against the delta
(tensors and header, not the tensor bytes) and the tensors are listed by name, with the
result's metadata; a journal holds its base's header and is always listed so.

options:
  --json                  print as JSON
  -h, --help              this text
)";

constexpr const char* recover_usage = R"(usage: dcr recover BASE.safetensors [--json]

Finishes an in-place apply of BASE that a crash interrupted: rolls its journal forward,
verifies the result and removes the journal. Does nothing if there is no journal.

options:
  --json                  print the report as JSON
  -h, --help              this text
)";

void expect_positionals(const std::vector<std::string>& p, std::size_t want, const char* names) {
  if (p.size() != want)
    throw usage_error(fmt::format("expected {} ({} file argument(s) given)", names, p.size()));
}

const char* encoding_name(std::uint8_t code) {
  switch (code) {
    case 0: return "overwrite";
    case 1: return "xor";
    case 2: return "ulp";
    default: return "unknown";
  }
}
const char* location_coding_name(std::uint8_t code) {
  constexpr std::array<const char*, 4> names = {"skip_varint", "skip_buckets", "bitmap", "runs"};
  return code < names.size() ? names[code] : "unknown";
}
const char* value_coding_name(std::uint8_t code) {
  constexpr std::array<const char*, 5> names = {"raw", "byte_planes", "zigzag_planes", "buckets",
                                                "zigzag_buckets"};
  return code < names.size() ? names[code] : "unknown";
}

void print_json(const ojson& j) { fmt::print("{}\n", j.dump(2)); }

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

  const auto r = dcr::io::diff_checkpoints(files[0], files[1], out, options);
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
  const bool json = args.flag("--json");
  const auto files = args.positionals();
  args.finish();
  expect_positionals(files, 2, "DELTA and BASE");
  if (in_place == !out.empty()) throw usage_error("give exactly one of -o OUT and --in-place");

  const auto r = in_place ? dcr::io::apply_delta_in_place(
                                files[0], files[1], dcr::io::in_place_options_from_environment())
                          : dcr::io::apply_delta(files[0], files[1], out);
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
  const bool json = args.flag("--json");
  const auto files = args.positionals();
  args.finish();
  expect_positionals(files, 1, "BASE");
  const auto r = dcr::io::recover_in_place(files[0], dcr::io::in_place_options_from_environment());
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

  // A journal is inspected as such; anything else must be a delta file.
  auto kind = dcr::io::container_kind::delta;
  {
    std::ifstream in(files[0], std::ios::binary);
    char magic[8] = {};
    in.read(magic, 8);
    if (in.gcount() == 8 &&
        std::memcmp(magic, dcr::io::delta_format::journal_magic.data(), 8) == 0)
      kind = dcr::io::container_kind::journal;
  }
  auto d = dcr::io::delta_file::open(files[0], kind);
  if (files.size() == 2 && kind == dcr::io::container_kind::delta) {
    const auto base = dcr::io::safetensors_file::open(files[1]);
    d.bind_base(base.header(), base.header_json(), "BASE '" + files[1] + "'");
  }

  ojson j;
  j["file"] = files[0];
  j["kind"] = kind == dcr::io::container_kind::delta ? "delta" : "journal";
  j["format_version"] = dcr::io::delta_format::version;
  j["bytes"] = d.bytes().size();
  j["registry_fingerprint"] = fmt::format("{:016x}", d.registry_fingerprint());
  j["tensor_count"] = d.tensor_count();
  j["tensor_bytes"] = d.tensor_bytes();
  j["target_file_bytes"] = d.target_file_size();
  j["target_header_bytes"] = d.target_header_size();
  j["target_header_code_bytes"] = d.target_header_code().size();
  j["base_header_digest"] = d.base_header_digest().hex();
  j["target_header_digest"] = d.target_header_digest().hex();
  j["base_digest"] = d.base_digest().hex();
  j["result_digest"] = d.result_digest().hex();
  j["changed"] = d.base_digest() != d.result_digest() ||
                 d.base_header_digest() != d.target_header_digest();
  const auto name_of = [&](std::uint64_t id) -> ojson {
    if (!d.bound()) return nullptr;
    return id < d.registry().size() ? ojson(d.registry().tensors()[id].name) : ojson("?");
  };
  ojson payloads = ojson::array();
  std::vector<dcr::item_entry> entries;
  std::vector<bool> changed(d.tensor_count(), false);
  std::uint64_t records = 0;
  for (std::size_t i = 0; i < d.payload_count(); ++i) {
    const auto h = dcr::payload_decoder::read_table(d.payload(i), entries);
    ojson p;
    p["index"] = i;
    p["offset"] = d.payload_offset(i);
    p["bytes"] = d.payload(i).size();
    p["direction"] = d.is_undo(i) ? "undo" : "forward";
    p["base_version"] = h.id.base_version;
    p["target_version"] = h.id.target_version;
    p["attempt"] = h.id.attempt;
    p["owner"] = h.id.owner;
    p["sequence"] = h.id.sequence;
    ojson items = ojson::array();
    for (const auto& e : entries) {
      ojson it;
      it["tensor_id"] = e.tensor;
      it["tensor"] = name_of(e.tensor);
      const auto type = dcr::dtype_from_code(e.dtype_code);
      it["dtype"] = type ? std::string(dcr::dtype_name(*type)) : "?";
      it["count"] = e.count;
      it["numel"] = e.numel;
      it["encoding"] = encoding_name(e.encoding_code);
      it["location_coding"] = location_coding_name(e.location_code);
      it["value_coding"] = value_coding_name(e.value_code);
      it["location_bytes"] = e.location_size;
      it["location_raw_bytes"] = e.location_raw_size;
      it["value_bytes"] = e.value_size;
      it["value_raw_bytes"] = e.value_raw_size;
      if (e.tensor < changed.size()) changed[e.tensor] = true;
      records += e.count;
      items.push_back(std::move(it));
    }
    p["items"] = std::move(items);
    payloads.push_back(std::move(p));
  }
  std::uint64_t changed_tensors = 0;
  for (bool c : changed) changed_tensors += c ? 1 : 0;
  j["changed_tensors"] = changed_tensors;
  j["payload_count"] = d.payload_count();
  j["records"] = records;
  // With a base: the result's metadata and the tensors by name (changed: has items).
  ojson tensors = nullptr;
  j["metadata"] = nullptr;
  if (d.bound()) {
    const auto& target = d.target_header();
    if (target.metadata()) {
      ojson m = ojson::object();
      for (const auto& [k, v] : *target.metadata()) m[k] = v;
      j["metadata"] = m;
    }
    tensors = ojson::array();
    for (dcr::tensor_id id = 0; id < d.registry().size(); ++id) {
      const auto& t = d.registry().tensors()[id];
      ojson e;
      e["id"] = id;
      e["name"] = t.name;
      e["dtype"] = std::string(dcr::dtype_name(t.type));
      e["shape"] = t.shape;
      e["bytes"] = t.bytes();
      e["changed"] = static_cast<bool>(changed[id]);
      tensors.push_back(std::move(e));
    }
  }
  j["tensors"] = std::move(tensors);
  j["payloads"] = std::move(payloads);

  if (json) {
    print_json(j);
    return 0;
  }
  fmt::print("{} {}: format {}, {} bytes, {} tensors ({} changed, {} bytes), {} payloads, {} "
             "records, registry {}\n",
             j["kind"].get<std::string>(), files[0], dcr::io::delta_format::version,
             d.bytes().size(), d.tensor_count(), changed_tensors, d.tensor_bytes(),
             d.payload_count(), records, j["registry_fingerprint"].get<std::string>());
  fmt::print("  base header {}  tensors {}\n  result header {}  tensors {}\n",
             d.base_header_digest().hex(), d.base_digest().hex(), d.target_header_digest().hex(),
             d.result_digest().hex());
  fmt::print("  target header: {} bytes, coded against the base's in {}\n",
             d.target_header_size(), d.target_header_code().size());
  if (d.bound()) {
    if (d.target_header().metadata())
      for (const auto& [k, v] : *d.target_header().metadata())
        fmt::print("  metadata {} = {}\n", k, v);
    fmt::print("tensors:\n  {:>5}  {:<40} {:<8} {:<20} {}\n", "id", "name", "dtype", "shape",
               "changed");
    for (const auto& t : j["tensors"])
      fmt::print("  {:>5}  {:<40} {:<8} {:<20} {}\n", t["id"].get<std::uint64_t>(),
                 t["name"].get<std::string>(), t["dtype"].get<std::string>(), t["shape"].dump(),
                 t["changed"].get<bool>() ? "yes" : "no");
  }
  for (const auto& p : j["payloads"]) {
    fmt::print("payload {} ({}, sequence {}) at byte {}: {} bytes, {} items\n",
               p["index"].get<std::uint64_t>(), p["direction"].get<std::string>(),
               p["sequence"].get<std::uint64_t>(), p["offset"].get<std::uint64_t>(),
               p["bytes"].get<std::uint64_t>(), p["items"].size());
    for (const auto& it : p["items"])
      fmt::print("  {:<40} {:<8} {:>10} records  {:<9} loc {:<12} {:>9}/{:<9} val {:<14} "
                 "{:>9}/{:<9}\n",
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
  return 0;
}

}  // namespace dcr_tool
