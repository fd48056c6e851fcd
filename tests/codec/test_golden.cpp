// Golden corpora of the payload format (docs/format.md, "Golden corpora"): the payloads in
// tests/golden/ were written once by make_golden from the inputs in their sidecars and are
// checked here on every run, so that a change of the encoder's output, of the decoder's reading,
// or of the apply path shows up against bytes that are already in flight. The payloads in
// tests/golden-errors/ are each broken in one way: every one must be refused with its own error
// code, by the decoder and by a receiver, before anything is written.
//
// The corpus root is DCR_GOLDEN_ROOT from the environment if set, else the source tree's tests/
// (compiled in by meson).
#include <doctest/doctest.h>

#include <zstd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "dcr/apply/apply.hpp"
#include "dcr/apply/loader.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/refit/receiver.hpp"
#include "golden_corpus.hpp"

namespace {

using namespace dcr_golden;
using dcr::errc;
using dcr::item;
using dcr::location_coding;
using dcr::value_coding;

std::filesystem::path corpus_root() {
  if (const char* env = std::getenv("DCR_GOLDEN_ROOT"); env != nullptr && *env != 0) return env;
#ifdef DCR_GOLDEN_ROOT
  return DCR_GOLDEN_ROOT;
#else
  return "tests";
#endif
}

/// The case names of one corpus directory (the stems of its .dcrp files, sorted); checks that
/// every payload has a sidecar and every sidecar a payload.
std::vector<std::string> case_names(std::string_view dir) {
  const std::filesystem::path d = corpus_root() / dir;
  REQUIRE_MESSAGE(std::filesystem::is_directory(d), "no corpus directory " << d.string());
  std::set<std::string> payloads, sidecars;
  for (const auto& e : std::filesystem::directory_iterator(d)) {
    const auto ext = e.path().extension().string();
    if (ext == payload_ext) payloads.insert(e.path().stem().string());
    if (ext == sidecar_ext) sidecars.insert(e.path().stem().string());
  }
  for (const auto& p : payloads) CHECK_MESSAGE(sidecars.count(p) == 1, p << payload_ext << " has no sidecar");
  for (const auto& s : sidecars) CHECK_MESSAGE(payloads.count(s) == 1, s << sidecar_ext << " has no payload");
  return {payloads.begin(), payloads.end()};
}

std::string path_of(std::string_view dir, const std::string& name, std::string_view ext) {
  return (corpus_root() / dir / (name + std::string(ext))).string();
}

/// The name of the dcr::errc `f` throws ("ok" if none): checks compare names, so that a failure
/// says which error came instead of which number.
std::string error_of(const auto& f) {
  try {
    f();
  } catch (const dcr::error& e) {
    return name_of(errc_names, e.dcr_code());
  }
  return "ok";
}

// ---- A small receiver storage: one buffer per canonical tensor, in canonical order, filled with
// the base words of golden_corpus.hpp; its loader copies each tensor whole into its buffer.

class flat_storage {
 public:
  explicit flat_storage(const dcr::tensor_registry& r) : registry_(&r) {
    for (const auto& t : r.tensors())
      buffers_.emplace_back(std::max<std::size_t>(1, (static_cast<std::size_t>(t.bytes()) + 7) / 8));
    for (dcr::tensor_id id = 0; id < r.size(); ++id) {
      const auto& t = r.tensors()[id];
      const std::size_t wb = dcr::dtype_size(t.type);
      for (std::int64_t i = 0; i < t.numel(); ++i)
        store_word(data(id), static_cast<std::size_t>(i), wb, base_word(id, static_cast<std::uint64_t>(i), wb));
    }
  }
  [[nodiscard]] const dcr::tensor_registry& registry() const noexcept { return *registry_; }
  std::byte* data(dcr::tensor_id id) { return reinterpret_cast<std::byte*>(buffers_[id].data()); }
  [[nodiscard]] std::uint64_t word(dcr::tensor_id id, std::uint64_t i) const {
    return load_word(reinterpret_cast<const std::byte*>(buffers_[id].data()), static_cast<std::size_t>(i),
                     dcr::dtype_size(registry_->tensors()[id].type));
  }
  friend bool operator==(const flat_storage& a, const flat_storage& b) { return a.buffers_ == b.buffers_; }

 private:
  const dcr::tensor_registry* registry_;
  std::vector<std::vector<std::uint64_t>> buffers_;  // 8-byte aligned words
};

struct flat_loader {
  using loader_concept = dcr::loader_tag;
  flat_storage* storage;

  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor& t, dcr::tensor_view<const W> src, Sink& sink) {
    const dcr::tensor_id id = storage->registry().id(t.name);
    sink.copy(dcr::tensor_view<W>::contiguous(reinterpret_cast<W*>(storage->data(id)), t.shape), src);
  }
};

static_assert(dcr::loader<flat_loader>);

// ---- Golden cases, read from their sidecars.

struct golden_case {
  std::string name;
  json sidecar;
  dcr::tensor_registry registry;
  dcr::payload_header header;
  dcr::codec_options options;
  std::vector<item> items;
  std::vector<std::pair<location_coding, value_coding>> codings;  // per item, as encoded
  std::vector<std::vector<std::uint64_t>> new_words;              // per item, if storage_check
  bool storage_check = false;
  bytes_t payload;
};

std::optional<location_coding> optional_location(const json& j) {
  if (j.is_null()) return std::nullopt;
  return parse_name(location_names, j.get<std::string>(), "location coding");
}
std::optional<value_coding> optional_value(const json& j) {
  if (j.is_null()) return std::nullopt;
  return parse_name(value_names, j.get<std::string>(), "value coding");
}

golden_case load_golden(const std::string& name) {
  golden_case c;
  c.name = name;
  c.sidecar = read_json(path_of(golden_dir, name, sidecar_ext));
  c.payload = read_file(path_of(golden_dir, name, payload_ext));
  const json& s = c.sidecar;
  c.registry = registry_from_json(s.at("registry"));
  c.header.id = payload_id_from_json(s.at("header"));
  c.header.registry_fingerprint = c.registry.fingerprint();
  const json& o = s.at("options");
  c.options.zstd_level = o.at("zstd_level").get<int>();
  c.options.zstd_hash_log = o.at("zstd_hash_log").get<int>();
  c.options.byte_planes = o.at("byte_planes").get<bool>();
  c.options.adaptive = o.at("adaptive").get<bool>();
  c.options.exact_choice = o.at("exact_choice").get<bool>();
  c.options.location = optional_location(o.at("location"));
  c.options.value = optional_value(o.at("value"));
  c.storage_check = s.at("storage_check").get<bool>();
  for (const json& ji : s.at("items")) {
    item it;
    it.tensor = c.registry.id(ji.at("tensor").get<std::string>());
    REQUIRE(ji.at("id").get<dcr::tensor_id>() == it.tensor);
    it.type = parse_dtype_name(ji.at("dtype").get<std::string>());
    it.enc = parse_name(encoding_names, ji.at("encoding").get<std::string>(), "encoding");
    it.indices = ji.at("indices").get<std::vector<std::uint64_t>>();
    REQUIRE(ji.at("count").get<std::size_t>() == it.count());
    const std::size_t wb = it.word_bytes();
    const json& values = ji.at("values");
    REQUIRE(values.size() == it.count());
    it.values.resize(it.count() * wb);
    for (std::size_t r = 0; r < it.count(); ++r)
      store_word(it.values.data(), r, wb, parse_hex_word(values[r].get<std::string>(), wb));
    c.codings.emplace_back(parse_name(location_names, ji.at("location_coding").get<std::string>(), "location coding"),
                           parse_name(value_names, ji.at("value_coding").get<std::string>(), "value coding"));
    if (c.storage_check) {
      std::vector<std::uint64_t> news;
      for (const json& w : ji.at("new")) news.push_back(parse_hex_word(w.get<std::string>(), wb));
      REQUIRE(news.size() == it.count());
      c.new_words.push_back(std::move(news));
    }
    c.items.push_back(std::move(it));
  }
  return c;
}

std::vector<golden_case> golden_cases() {
  std::vector<golden_case> cases;
  for (const auto& name : case_names(golden_dir)) cases.push_back(load_golden(name));
  return cases;
}

void check_same(const std::vector<item>& got, const std::vector<item>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].tensor == want[i].tensor);
    CHECK(got[i].type == want[i].type);
    CHECK(got[i].enc == want[i].enc);
    CHECK(got[i].indices == want[i].indices);
    CHECK(got[i].values == want[i].values);
  }
}

/// The offset of the first byte where `a` and `b` differ, or the shorter size.
std::size_t first_difference(const bytes_t& a, const bytes_t& b) {
  std::size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

bool same_zstd(const golden_case& c) {
  return c.sidecar.at("zstd_version").get<std::string>() == ZSTD_versionString();
}

/// Runs `check(c)` for every case, so that one case that throws (a payload the decoder refuses)
/// fails that case and the others are still checked.
template <class Case, class F>
void for_each_case(const std::vector<Case>& cases, const F& check) {
  for (const auto& c : cases) {
    CAPTURE(c.name);
    try {
      check(c);
    } catch (const std::exception& e) {
      FAIL_CHECK("case " << c.name << " threw: " << std::string(e.what()));
    }
  }
}

}  // namespace

// ======================================================================= golden payloads

TEST_CASE("golden: the corpus covers every encoding, coding, word width and special case") {
  const auto cases = golden_cases();
  CHECK(cases.size() >= 30);
  // (encoding, location coding, value coding, word bytes) of every item with records.
  std::set<std::tuple<dcr::encoding, location_coding, value_coding, std::size_t>> combos;
  std::set<std::size_t> widths;
  std::set<std::string> names;
  bool empty_payload = false, zero_records = false, first_release = false;
  for (const auto& c : cases) {
    names.insert(c.name);
    empty_payload = empty_payload || c.items.empty();
    first_release = first_release || !c.options.adaptive;
    for (std::size_t i = 0; i < c.items.size(); ++i) {
      zero_records = zero_records || c.items[i].count() == 0;
      if (c.items[i].count() == 0) continue;
      combos.insert({c.items[i].enc, c.codings[i].first, c.codings[i].second, c.items[i].word_bytes()});
      widths.insert(c.items[i].word_bytes());
    }
  }
  CHECK(combos.size() == 3 * 4 * 5 * 4);
  CHECK(widths == std::set<std::size_t>{1, 2, 4, 8});
  CHECK(empty_payload);
  CHECK(zero_records);
  CHECK(first_release);
  for (const char* n : {"dense_bitmap", "full_tensor_runs", "special_patterns_overwrite",
                        "special_patterns_xor_mask", "special_patterns_ulp", "first_release_example"})
    CHECK_MESSAGE(names.count(n) == 1, "missing golden case " << n);
}

TEST_CASE("golden: re-encoding each case's inputs gives its golden bytes") {
  dcr::payload_decoder dec;
  std::vector<item> got;
  bool told = false;
  for_each_case(golden_cases(), [&](const golden_case& c) {
    CHECK(c.registry.fingerprint() ==
          parse_hex_word(c.sidecar.at("registry_fingerprint").get<std::string>(), 8));
    dcr::payload_encoder enc(c.options);
    bytes_t out;
    enc.encode(c.header, c.items, c.registry, out);
    if (same_zstd(c)) {
      CHECK_MESSAGE(out == c.payload, "re-encoded payload of " << out.size() << " bytes differs from the "
                                          << c.payload.size() << "-byte golden file from byte "
                                          << first_difference(out, c.payload));
    } else {
      // zstd's output may change between library versions; the format is the same, so compare
      // what the payload says rather than its bytes.
      if (!told)
        MESSAGE("libzstd " << std::string(ZSTD_versionString()) << " differs from the "
                           << c.sidecar.at("zstd_version").get<std::string>()
                           << " the golden files were made with: comparing decoded content, not bytes");
      told = true;
      dec.decode(out, c.registry, got);
      check_same(got, c.items);
    }
  });
}

TEST_CASE("golden: each golden payload decodes to its sidecar's items and codings") {
  dcr::payload_decoder dec;
  std::vector<item> got;
  for_each_case(golden_cases(), [&](const golden_case& c) {
    CHECK(c.payload.size() == c.sidecar.at("payload_bytes").get<std::size_t>());
    const dcr::payload_header h = dec.decode(c.payload, c.registry, got);
    CHECK(h.id == c.header.id);
    CHECK(h.registry_fingerprint == c.registry.fingerprint());
    check_same(got, c.items);
    std::vector<dcr::item_entry> table;
    dcr::payload_decoder::read_table(c.payload, table);
    REQUIRE(table.size() == c.codings.size());
    for (std::size_t i = 0; i < table.size(); ++i) {
      CAPTURE(i);
      CHECK(table[i].location_code == static_cast<std::uint8_t>(c.codings[i].first));
      CHECK(table[i].value_code == static_cast<std::uint8_t>(c.codings[i].second));
    }
  });
}

TEST_CASE("golden: each golden payload applied to the base storage gives the new bits") {
  std::size_t checked = 0;
  for_each_case(golden_cases(), [&](const golden_case& c) {
    if (!c.storage_check) return;
    dcr::payload_decoder dec;
    std::vector<item> items;
    dec.decode(c.payload, c.registry, items);

    flat_storage compiled(c.registry), general(c.registry);
    const flat_storage base(c.registry);
    flat_loader compiled_loader{&compiled}, general_loader{&general};
    dcr::item_applier<flat_loader> a(c.registry, compiled_loader);
    dcr::item_applier<flat_loader> g(c.registry, general_loader, {.path = dcr::apply_path::general});
    a.prewarm();
    g.prewarm();
    a.apply(items);
    g.apply(items);
    CHECK(compiled == general);  // both apply paths give the same bits

    // Records hold their new bits; every other element its base bits.
    std::map<std::pair<dcr::tensor_id, std::uint64_t>, std::uint64_t> want;
    for (std::size_t i = 0; i < c.items.size(); ++i)
      for (std::size_t r = 0; r < c.items[i].count(); ++r)
        want[{c.items[i].tensor, c.items[i].indices[r]}] = c.new_words[i][r];
    std::size_t wrong = 0;
    for (dcr::tensor_id id = 0; id < c.registry.size(); ++id) {
      for (std::int64_t k = 0; k < c.registry.tensors()[id].numel(); ++k) {
        const auto i = static_cast<std::uint64_t>(k);
        const auto it = want.find({id, i});
        const std::uint64_t expected = it != want.end() ? it->second : base.word(id, i);
        if (compiled.word(id, i) != expected && wrong++ < 5)
          FAIL_CHECK(c.registry.tensors()[id].name << "[" << i << "] holds "
                                                   << hex_word(compiled.word(id, i), 8) << ", expected "
                                                   << hex_word(expected, 8));
      }
    }
    CHECK(wrong == 0);
    ++checked;
  });
  CHECK(checked >= 30);
}

// ======================================================================= error payloads

namespace {

struct error_case {
  std::string name;
  json sidecar;
  errc expected;
  std::string expected_name;
  dcr::tensor_registry registry;
  dcr::attempt_key attempt;
  bytes_t payload;
};

error_case load_error(const std::string& name) {
  error_case c{.name = name,
               .sidecar = read_json(path_of(errors_dir, name, sidecar_ext)),
               .expected = errc::ok,
               .expected_name = {},
               .registry = {},
               .attempt = {},
               .payload = read_file(path_of(errors_dir, name, payload_ext))};
  c.expected_name = c.sidecar.at("expected_error").get<std::string>();
  c.expected = parse_name(errc_names, c.expected_name, "error code");
  c.registry = registry_from_json(c.sidecar.at("registry"));
  const dcr::payload_id a = payload_id_from_json(c.sidecar.at("receiver_attempt"));
  c.attempt = a.attempt;
  return c;
}

std::vector<error_case> error_cases() {
  std::vector<error_case> cases;
  for (const auto& name : case_names(errors_dir)) cases.push_back(load_error(name));
  return cases;
}

}  // namespace

TEST_CASE("golden errors: the corpus covers every error a payload can carry") {
  const auto cases = error_cases();
  CHECK(cases.size() >= 30);
  std::set<errc> codes;
  std::set<std::uint8_t> out_of_range_codings;
  for (const auto& c : cases) {
    codes.insert(c.expected);
    if (c.expected == errc::out_of_range) {
      std::vector<dcr::item_entry> table;
      dcr::payload_decoder::read_table(c.payload, table);  // framing is intact
      for (const auto& e : table) out_of_range_codings.insert(e.location_code);
    }
  }
  for (const errc e : {errc::corrupt_payload, errc::truncated_payload, errc::reserved_bits_set,
                       errc::unsupported_version, errc::out_of_range, errc::overflow,
                       errc::stale_payload, errc::registry_mismatch, errc::unknown_tensor,
                       errc::dtype_mismatch, errc::shape_mismatch})
    CHECK_MESSAGE(codes.count(e) == 1, "no error case for " << name_of(errc_names, e));
  CHECK(out_of_range_codings == std::set<std::uint8_t>{0, 1, 2, 3});
}

TEST_CASE("golden errors: the decoder refuses each payload with its error and returns nothing") {
  dcr::payload_decoder dec;
  for_each_case(error_cases(), [&](const error_case& c) {
    // The payload it was edited from is valid: the edit is what the decoder refuses.
    const json& from = c.sidecar.at("derived_from");
    if (!from.is_null()) {
      const bytes_t base = read_file((corpus_root() / from.get<std::string>()).string());
      std::vector<item> items;
      CHECK(error_of([&] { dec.decode(base, c.registry, items, &c.attempt); }) == "ok");
    }
    // A failed decode leaves the caller's items as they were.
    std::vector<item> items(1);
    items[0].indices = {7};
    items[0].values.resize(2);
    CHECK(error_of([&] { dec.decode(c.payload, c.registry, items, &c.attempt); }) == c.expected_name);
    REQUIRE(items.size() == 1);
    CHECK(items[0].indices == std::vector<std::uint64_t>{7});
    // Without a transition filter only the stale payloads decode.
    CHECK(error_of([&] { dec.decode(c.payload, c.registry, items); }) ==
          (c.expected == errc::stale_payload ? std::string("ok") : c.expected_name));
  });
}

TEST_CASE("golden errors: a receiver refuses each payload before writing anything") {
  for_each_case(error_cases(), [&](const error_case& c) {
    flat_storage storage(c.registry);
    const flat_storage before(c.registry);
    flat_loader loader{&storage};
    dcr::receiver<flat_loader> rcv(c.registry, loader);
    rcv.prewarm();
    rcv.begin_attempt({c.attempt});
    for (const auto path : {dcr::apply_path::compiled, dcr::apply_path::general}) {
      CAPTURE(static_cast<int>(path));
      CHECK(error_of([&] { rcv.apply_payload(c.payload, {.path = path}); }) == c.expected_name);
      CHECK(storage == before);
      CHECK(rcv.stats().payloads_applied == 0);
    }
    // The receiver is unharmed: the valid payload the case was edited from still applies.
    const json& from = c.sidecar.at("derived_from");
    if (!from.is_null()) {
      const bytes_t base = read_file((corpus_root() / from.get<std::string>()).string());
      CHECK(rcv.apply_payload(base) == dcr::apply_outcome::applied);
      CHECK(rcv.stats().payloads_applied == 1);
    }
  });
}
