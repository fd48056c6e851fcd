// dcr/detail/io/checkpoint.inl: the bodies of dcr/io/checkpoint.hpp (included at its end).
#pragma once

namespace dcr::io::detail {

inline void progress_meter::advance(std::uint64_t bytes) {
  if (callback_ == nullptr) return;
  done_ += bytes;
  (*callback_)(done_, total_);
}

}  // namespace dcr::io::detail

namespace dcr::io {

inline checkpoint_differ::checkpoint_differ(diff_options options)
    : options_(options),
      codec_(codec_with_level(options.zstd_level)),
      encoder_(codec_),
      // Depth 1 with two slots: the worker holds at most one slot (queued or being encoded)
      // while the scan fills the other, so raw records stay within two payloads.
      stage_(
          1, [this](std::size_t& slot_index) { encode_slot(slots_[slot_index]); },
          [this] { return prefault_step(); }) {
  DCR_EXPECTS(options.payload_records > 0, errc::invalid_argument,
              "diff: payload_records must be positive");
}

inline diff_report checkpoint_differ::diff(const safetensors_file& old_file,
                                           const safetensors_file& new_file,
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

  delta_writer writer(delta_path, container_kind::delta, file_registry_, new_file.header_json(),
                      old_file.header_json());
  // The worker maps the files' pages in ahead of the scan between payloads (when the files
  // were opened without populating them, see diff_checkpoints).
  diff_report report = scan_and_encode(
      file_registry_, pairs_,
      [&writer](std::span<const std::byte> payload) { writer.append_payload(payload); }, digests_,
      options_.worker_thread);
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

inline diff_report checkpoint_differ::diff_tensors(
    const tensor_registry& registry, std::span<const tensor_pair> tensors,
    const std::function<void(std::span<const std::byte>)>& on_payload,
    std::span<tensor_digests> digests) {
  return scan_and_encode(registry, tensors, on_payload, digests, false);
}

inline diff_report checkpoint_differ::scan_and_encode(
    const tensor_registry& registry, std::span<const tensor_pair> tensors,
    const std::function<void(std::span<const std::byte>)>& on_payload,
    std::span<tensor_digests> digests, bool prefault) {
  const auto start = detail::clock::now();
  DCR_EXPECTS(tensors.size() == registry.size(), errc::invalid_argument,
              "diff: " + std::to_string(tensors.size()) + " tensor pairs for a registry of " +
                  std::to_string(registry.size()) + " tensors");
  DCR_EXPECTS(digests.empty() || digests.size() == registry.size(), errc::invalid_argument,
              "diff: room for " + std::to_string(digests.size()) + " digests for a registry of " +
                  std::to_string(registry.size()) + " tensors");
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
      visit_word(dtype_size(t.type),
                 [&]<class W>(W) { scan_tensor<W>(id, t.type, tensors[id], digest, report); });
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

inline item& checkpoint_differ::open_item(slot& s, tensor_id id, dtype type, std::size_t words_left,
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
  const std::size_t room = std::min(words_left, options_.payload_records -
                                                    std::min(options_.payload_records, s.records) +
                                                    scan_chunk_bytes / word_bytes);
  it.indices.reserve(room);
  it.values.reserve(room * word_bytes);
  s.new_words[s.used].reserve(room * word_bytes);
  return it;
}

inline void checkpoint_differ::close_item(slot& s, diff_report& report) {
  const std::size_t count = s.items[s.used].count();
  if (count == 0) return;
  s.records += count;
  ++s.used;
  report.changed_elements += count;
}

inline void checkpoint_differ::submit() {
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

inline void checkpoint_differ::wait_idle() {
  if (!options_.worker_thread) return;
  const auto t0 = detail::clock::now();
  stage_.drain();
  wait_seconds_ += detail::seconds_since(t0);
}

inline void checkpoint_differ::start_prefault(std::span<const tensor_pair> tensors) {
  prefault_tensors_ = tensors;
  prefault_id_ = 0;
  prefault_at_ = 0;
  if (!tensors.empty()) stage_.wake_idle();
}

inline bool checkpoint_differ::prefault_step() noexcept {
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

inline void checkpoint_differ::encode_slot(slot& s) {
  const auto t0 = detail::clock::now();
  for (std::size_t i = 0; i < s.used; ++i) {
    item& it = s.items[i];
    const std::size_t count = it.count();
    visit_word(it.word_bytes(), [&]<class W>(W) {
      encode_gathered_item<W>(it, {reinterpret_cast<const W*>(s.new_words[i].data()), count},
                              options_.policy, true, codec_);
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

inline codec_options checkpoint_differ::codec_with_level(int level) {
  codec_options o;
  o.zstd_level = level;
  return o;
}

}  // namespace dcr::io

namespace dcr::io::detail {

inline double seconds_since(clock::time_point t) {
  return std::chrono::duration<double>(clock::now() - t).count();
}

inline std::string shape_string(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace dcr::io::detail

namespace dcr::io {

inline void require_same_tensors(std::span<const canonical_tensor> expected,
                                 std::string_view expected_what, const safetensors_header& actual,
                                 std::string_view actual_what) {
  std::vector<std::string> differences;
  errc first = errc::ok;
  const auto note = [&](errc code, std::string what) {
    if (first == errc::ok) first = code;
    if (differences.size() < 5)
      differences.push_back(std::move(what));
    else
      differences.emplace_back();
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

}  // namespace dcr::io

namespace dcr::io::detail {

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

inline tensor_ranges ranges_in(const delta_file& d, const safetensors_header& h) {
  tensor_ranges r;
  for (const auto& t : d.registry().tensors()) {
    const auto* e = h.find(t.name);
    r.begin.push_back(h.data_offset() + e->begin);
    r.size.push_back(e->size());
  }
  return r;
}

inline digest128 tensors_digest_in(std::span<const std::byte> file, const tensor_ranges& ranges,
                                   progress_meter* meter) {
  std::vector<digest128> per_tensor;
  per_tensor.reserve(ranges.begin.size());
  for (tensor_id id = 0; id < ranges.begin.size(); ++id) {
    per_tensor.push_back(digest_of(ranges.of(file, id)));
    if (meter != nullptr) meter->advance(ranges.size[id]);
  }
  return tensors_digest(per_tensor);
}

inline bool tensors_are(const delta_file& d, std::span<const std::byte> file,
                        const tensor_ranges& ranges, bool result, progress_meter* meter) {
  return tensors_digest_in(file, ranges, meter) == (result ? d.result_digest() : d.base_digest());
}

inline std::string digest_mismatch_message(const delta_file& d, std::span<const std::byte> file,
                                           const tensor_ranges& ranges, std::string_view file_what,
                                           bool result) {
  return std::string(file_what) + ": its tensors have digest " +
         tensors_digest_in(file, ranges).hex() + ", the " + (result ? "result" : "base") + " of " +
         d.where() + " has " + (result ? d.result_digest() : d.base_digest()).hex() +
         (result ? "" : " (same tensor names, dtypes, shapes and header, other bytes)");
}

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

inline std::uint64_t apply_work(const delta_file& d) {
  return 3 * d.tensor_bytes() + changed_bytes(d, false);
}

inline apply_report apply_delta_metered(delta_file& d, const std::filesystem::path& base_path,
                                        const std::filesystem::path& out_path,
                                        progress_meter& meter) {
  const auto start = clock::now();
  DCR_EXPECTS(!path_exists(journal_path(base_path)), errc::not_ready,
              "BASE '" + base_path.string() + "' has an unfinished in-place apply (journal '" +
                  journal_path(base_path).string() + "'); run `dcr recover " + base_path.string() +
                  "` first");
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

inline void crash_point(const in_place_options& o, in_place_step s) {
  if (o.crash_at == s) std::_Exit(crash_exit_status);
}

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

inline std::uint64_t write_journal_words(const delta_file& j, std::span<std::byte> file, bool undo,
                                         const in_place_options& options, progress_meter* meter) {
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

inline std::uint64_t finish_work(const delta_file& j, const std::filesystem::path& base) {
  return (path_exists(base) ? j.tensor_bytes() : 0) + changed_bytes(j, false) + j.tensor_bytes();
}

inline void finish_from_journal(const delta_file& j, const std::filesystem::path& journal,
                                const std::filesystem::path& base, const in_place_options& options,
                                recover_report& report, bool remove_journal,
                                progress_meter& meter) {
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
    DCR_EXPECTS(sized && header_is(f.bytes(), j.base_header_json()) && *tensors == j.base_digest(),
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
    throw error(errc::verification_failed, "in-place apply: the result does not verify (" + why +
                                               "); " + base_what +
                                               " was restored to its original content");
  }
  crash_point(options, in_place_step::verified);
  map = mapped_file();
  rename_durably(working, base);
  crash_point(options, in_place_step::renamed_back);
  if (remove_journal) remove_durably(journal);
}

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

inline recover_report recover_in_place_locked(const std::filesystem::path& base,
                                              const in_place_options& options) {
  const auto start = clock::now();
  recover_report report;
  report.temporaries_removed = remove_journal_temporaries(base);
  const auto journal = journal_path(base);
  if (!path_exists(journal)) {
    DCR_EXPECTS(!path_exists(working_path(base)), errc::not_ready,
                "the working file '" + working_path(base).string() + "' of BASE '" + base.string() +
                    "' exists without a journal; resolve by hand");
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

inline std::uint64_t prepare_work(const delta_file& d) {
  return d.tensor_bytes() + changed_bytes(d, false);
}

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
                    " to lay its tensors out as the delta's target does, but tensor '" + m.name +
                    "' is at buffer bytes " + std::to_string(b->begin) + ".." +
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
    throw input_error(
        input_fault::wrong_base, errc::verification_failed,
        "wrong base: " + digest_mismatch_message(d, base.bytes(), ranges, base_what, false));
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

}  // namespace dcr::io::detail

namespace dcr::io {

inline diff_report diff_checkpoints(const std::filesystem::path& old_path,
                                    const std::filesystem::path& new_path,
                                    const std::filesystem::path& delta_path,
                                    const diff_options& options) {
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

inline in_place_options in_place_options_from_environment() {
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

inline directory_lock in_place_lock(const std::filesystem::path& dir,
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

inline apply_report apply_delta_in_place(const std::filesystem::path& delta_path,
                                         const std::filesystem::path& base_path,
                                         const in_place_options& options) {
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
