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

namespace dcr::io {

inline std::filesystem::path find_safetensors_index(
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

inline sharded_checkpoint open_sharded_checkpoint(const std::filesystem::path& dir) {
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

inline diff_report diff_sharded_checkpoints(const std::filesystem::path& old_dir,
                                            const std::filesystem::path& new_dir,
                                            const std::filesystem::path& delta_path,
                                            const diff_options& options) {
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

inline apply_report apply_sharded_delta(const std::filesystem::path& delta_path,
                                        const std::filesystem::path& base_dir,
                                        const std::filesystem::path& out_dir_arg,
                                        const apply_options& options) {
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

inline apply_report apply_sharded_delta_in_place(const std::filesystem::path& delta_path,
                                                 const std::filesystem::path& dir_arg,
                                                 const in_place_options& options) {
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
