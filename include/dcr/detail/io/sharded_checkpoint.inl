// dcr/detail/io/sharded_checkpoint.inl: the bodies of dcr/io/sharded_checkpoint.hpp (included at
// its end).
#pragma once

namespace dcr::io {

inline std::filesystem::path sharded_checkpoint::shard_path(const std::string& shard) const {
  return dir / shard;
}

inline std::vector<std::string> sharded_checkpoint::tensors_of(const std::string& shard) const {
  std::vector<std::string> names;
  for (const auto& [tensor, file] : weight_map)
    if (file == shard) names.push_back(tensor);
  return names;
}

inline sharded_delta_file sharded_delta_file::open(const std::filesystem::path& path) {
  sharded_delta_file d;
  d.path_ = path;
  d.map_ = mapped_file::open_read(path);
  const auto b = d.map_.bytes();
  const std::string where = "the sharded delta '" + path.string() + "'";
  using namespace sharded_delta_format;
  DCR_EXPECTS(b.size() >= prefix_size + trailer_size, errc::truncated_payload,
              where + ": " + std::to_string(b.size()) + " bytes, shorter than any sharded delta");
  DCR_EXPECTS(std::memcmp(b.data(), magic.data(), 8) == 0, errc::corrupt_payload,
              where + ": no DCRSHARD magic");
  const auto m = dcr::detail::load_le<std::uint64_t>(b.data() + 8);
  DCR_EXPECTS(m <= max_manifest_size && m <= b.size() - prefix_size - trailer_size,
              errc::truncated_payload,
              where + ": manifest of " + std::to_string(m) + " bytes does not fit in the file (" +
                  std::to_string(b.size()) + " bytes; truncated?)");
  digest128 stored;
  std::memcpy(stored.bytes.data(), b.data() + b.size() - trailer_size, 16);
  const auto actual = digest_of(b.first(b.size() - trailer_size));
  DCR_EXPECTS(stored == actual, errc::corrupt_payload,
              where + ": digest " + actual.hex() + " differs from the stored " + stored.hex() +
                  " (damaged or truncated)");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(std::string_view(
        reinterpret_cast<const char*>(b.data() + prefix_size), static_cast<std::size_t>(m)));
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::corrupt_payload, where + ": manifest is not JSON (" + e.what() + ")");
  }
  try {
    DCR_EXPECTS(doc.at("version").get<std::uint64_t>() == version, errc::unsupported_version,
                where + ": sharded delta version " + doc.at("version").dump() +
                    ", this reader knows " + std::to_string(version));
    d.index_name_ = doc.at("index").get<std::string>();
    d.result_index_ = doc.at("result_index").get<std::string>();
    const std::uint64_t data_end = b.size() - trailer_size;
    std::uint64_t expect_offset = prefix_size + m;
    for (const auto& s : doc.at("shards")) {
      shard sh;
      sh.file = s.at("file").get<std::string>();
      detail::require_plain_file_name(sh.file, where);
      DCR_EXPECTS(d.shards_.empty() || d.shards_.back().file < sh.file, errc::corrupt_payload,
                  where + ": shard '" + sh.file + "' out of order or repeated");
      const auto offset = s.at("offset").get<std::uint64_t>();
      const auto bytes = s.at("bytes").get<std::uint64_t>();
      DCR_EXPECTS(offset == expect_offset && bytes <= data_end - offset, errc::corrupt_payload,
                  where + ": shard '" + sh.file + "' at bytes " + std::to_string(offset) + "+" +
                      std::to_string(bytes) + " is not where the previous one ends");
      expect_offset = offset + bytes;
      sh.delta = delta_file::parse(
          b.subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(bytes)),
          where + ", shard '" + sh.file + "'", container_kind::delta);
      d.shards_.push_back(std::move(sh));
    }
    DCR_EXPECTS(
        expect_offset == data_end, errc::corrupt_payload,
        where + ": " + std::to_string(data_end - expect_offset) + " bytes after the last shard");
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::corrupt_payload, where + ": malformed manifest (" + e.what() + ")");
  }
  DCR_EXPECTS(!d.shards_.empty(), errc::corrupt_payload, where + ": no shards");
  return d;
}

inline std::string sharded_delta_file::shard_what(const shard& s) const {
  return "shard '" + s.file + "' of the sharded delta '" + path_.string() + "'";
}

inline void sharded_delta_file::require_base_index(const sharded_checkpoint& base) const {
  const std::string what = "wrong base: the index '" + base.index_path.string() + "'";
  std::map<std::string, std::string> delta_map;
  for (const auto& s : shards_) {
    const auto path = base.shard_path(s.file);
    const auto f = blame(input_fault::checkpoint, [&] { return safetensors_file::open(path); });
    const tensor_registry registry(f.header().canonical_tensors());
    DCR_EXPECTS(registry.fingerprint() == s.delta.registry_fingerprint() &&
                    registry.size() == s.delta.tensor_count(),
                errc::registry_mismatch,
                "wrong base: the shard '" + path.string() +
                    "' holds other tensors (names, dtypes or shapes) than the base of " +
                    shard_what(s));
    for (const auto& t : registry.tensors()) delta_map.emplace(t.name, s.file);
  }
  for (const auto& [tensor, file] : base.weight_map) {
    const auto it = delta_map.find(tensor);
    DCR_EXPECTS(it != delta_map.end(), errc::verification_failed,
                what + " names tensor '" + tensor + "' (in '" + file +
                    "'), which the delta's base does not hold");
    DCR_EXPECTS(it->second == file, errc::verification_failed,
                what + " places tensor '" + tensor + "' in '" + file + "', the delta's base in '" +
                    std::string(it->second) + "'");
  }
  for (const auto& [tensor, file] : delta_map)
    DCR_EXPECTS(base.weight_map.count(std::string(tensor)) != 0, errc::verification_failed,
                what + " does not name tensor '" + std::string(tensor) +
                    "', which the delta's base holds in '" + std::string(file) + "'");
}

}  // namespace dcr::io

namespace dcr::io::detail {

inline directory_remover::~directory_remover() {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

inline std::filesystem::path without_trailing_separator(std::filesystem::path p) {
  p = p.lexically_normal();
  if (p.has_filename() || !p.has_parent_path() || p == p.root_path()) return p;
  return p.parent_path();
}

inline void require_plain_file_name(const std::string& name, std::string_view where) {
  DCR_EXPECTS(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
                  name.find('\0') == std::string::npos,
              errc::corrupt_payload,
              std::string(where) + ": shard '" + name +
                  "' is not a file name in the checkpoint's directory");
}

inline std::string read_whole_file(const std::filesystem::path& path) {
  const auto f = mapped_file::open_read(path);
  const auto b = f.bytes();
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

inline void write_file_atomically(const std::filesystem::path& path, std::string_view text,
                                  mode_t mode) {
  atomic_file f(path);
  f.set_permissions(mode);
  f.write_at(std::as_bytes(std::span<const char>(text.data(), text.size())), 0);
  f.commit();
}

}  // namespace dcr::io::detail

namespace dcr::io {

inline void require_index_matches_shard(const sharded_checkpoint& c, const std::string& shard,
                                        const safetensors_header& header) {
  const auto expected = c.tensors_of(shard);
  std::vector<std::string> actual;
  for (const auto& t : header.tensors()) actual.push_back(t.name);
  std::sort(actual.begin(), actual.end());
  if (expected == actual) return;
  std::string why;
  for (const auto& name : expected)
    if (!std::binary_search(actual.begin(), actual.end(), name)) {
      why = "the index places '" + name + "' in it, but the shard does not hold it";
      break;
    }
  if (why.empty())
    for (const auto& name : actual)
      if (!std::binary_search(expected.begin(), expected.end(), name)) {
        why = "it holds '" + name + "', which the index places " +
              (c.weight_map.count(name) ? "in '" + c.weight_map.at(name) + "'" : "nowhere");
        break;
      }
  throw error(errc::corrupt_payload, "the index '" + c.index_path.string() +
                                         "' does not match the shard '" +
                                         c.shard_path(shard).string() + "': " + why);
}

}  // namespace dcr::io

namespace dcr::io::detail {

inline void require_sharded_base(const sharded_delta_file& d, const sharded_checkpoint& base) {
  DCR_EXPECTS(!path_exists(sharded_journal_path(base.dir)), errc::not_ready,
              "BASE '" + base.dir.string() + "' has an unfinished in-place apply (journal '" +
                  sharded_journal_path(base.dir).string() + "'); run `dcr recover " +
                  base.dir.string() + "` first");
  DCR_EXPECTS(base.index_name == d.index_name(), errc::verification_failed,
              "wrong base: BASE '" + base.dir.string() + "' has the index '" + base.index_name +
                  "', the delta's base '" + d.index_name() + "'");
  d.require_base_index(base);
}

inline std::filesystem::path shard_journal_in(const std::filesystem::path& journal_dir,
                                              const std::string& shard) {
  return journal_dir / (shard + ".dcr-journal");
}

inline in_place_options shard_options(const in_place_options& options, std::size_t i) {
  in_place_options o;
  if (i == options.crash_shard) o.crash_at = options.crash_at;
  return o;
}

inline void retire_sharded_journal(const std::filesystem::path& dir) {
  const auto journal = sharded_journal_path(dir);
  const auto retired = sharded_journal_temporary(dir, "retired-" + std::to_string(::getpid()));
  if (::rename(journal.c_str(), retired.c_str()) != 0)
    throw_io_error("cannot rename to '" + retired.string() + "' the directory", journal, errno);
  sync_directory(dir);
  std::error_code ec;
  std::filesystem::remove_all(retired, ec);
  if (ec) throw_io_error("cannot remove", retired, ec.value());
  sync_directory(dir);
}

inline std::size_t remove_sharded_journal_temporaries(const std::filesystem::path& dir) {
  const std::string prefix = sharded_journal_temporary(dir, "").filename().string();
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) found.push_back(e.path());
  if (ec) throw_io_error("cannot list the directory", dir, ec.value());
  for (const auto& p : found) {
    std::filesystem::remove_all(p, ec);
    if (ec) throw_io_error("cannot remove", p, ec.value());
  }
  if (!found.empty()) sync_directory(dir);
  return found.size();
}

inline void finish_sharded_journal(const std::filesystem::path& dir,
                                   const in_place_options& options, recover_report& report,
                                   progress_meter* meter) {
  const auto journal = sharded_journal_path(dir);
  const auto listing_path = journal / sharded_journal_manifest;
  nlohmann::json listing;
  try {
    listing = nlohmann::json::parse(read_whole_file(listing_path));
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::corrupt_payload, "the journal listing '" + listing_path.string() +
                                           "' is damaged (" + e.what() + "); resolve by hand");
  }
  std::vector<std::string> shards;
  std::string index_name;
  try {
    index_name = listing.at("index").get<std::string>();
    for (const auto& s : listing.at("shards")) shards.push_back(s.get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::corrupt_payload, "the journal listing '" + listing_path.string() +
                                           "' is malformed (" + e.what() + ")");
  }
  require_plain_file_name(index_name, listing_path.string());
  // Validate every shard journal before touching anything.
  std::vector<delta_file> journals;
  for (const auto& s : shards) {
    require_plain_file_name(s, listing_path.string());
    journals.push_back(delta_file::open(shard_journal_in(journal, s), container_kind::journal));
  }
  const std::string new_index = read_whole_file(journal / sharded_journal_index);
  std::uint64_t work = 0;
  if (meter == nullptr && options.progress)
    for (std::size_t i = 0; i < shards.size(); ++i)
      work += finish_work(journals[i], dir / shards[i]);
  progress_meter own(options.progress, work);
  if (meter == nullptr) meter = &own;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    recover_report r;
    try {
      finish_from_journal(journals[i], shard_journal_in(journal, shards[i]), dir / shards[i],
                          shard_options(options, i), r, false, *meter);
    } catch (const error& e) {
      if (!r.rolled_back) throw;
      for (std::size_t k = 0; k < i; ++k)
        roll_back_from_journal(journals[k], shard_journal_in(journal, shards[k]), dir / shards[k],
                               shard_options(options, k));
      retire_sharded_journal(dir);
      report.rolled_back = true;
      throw error(e.dcr_code(), std::string(e.what()) + "; every shard of '" + dir.string() +
                                    "' was restored to its original content");
    }
    report.records += r.records;
    report.rolled_forward = report.rolled_forward || r.rolled_forward;
  }
  const auto index_path = dir / index_name;
  if (!path_exists(index_path) || read_whole_file(index_path) != new_index) {
    const mode_t mode = path_exists(index_path) ? permission_bits(index_path) : 0644;
    write_file_atomically(index_path, new_index, mode);
    report.rolled_forward = true;
  }
  crash_point(options, in_place_step::index_written);
  retire_sharded_journal(dir);
}

inline recover_report recover_sharded_locked(const std::filesystem::path& dir,
                                             const in_place_options& options) {
  const auto start = clock::now();
  recover_report report;
  report.temporaries_removed = remove_sharded_journal_temporaries(dir);
  if (path_exists(sharded_journal_path(dir))) {
    report.journal_found = true;
    finish_sharded_journal(dir, options, report, nullptr);
  }
  report.seconds = seconds_since(start);
  return report;
}

}  // namespace dcr::io::detail
