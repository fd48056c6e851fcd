// tests/fuzz/fuzz_payload_decoder.cpp: libFuzzer target for the payload decoder and the apply
// path behind it.
//
// Every input (format: tests/fuzz/recipe.hpp) becomes a byte string that a receiver would get
// from its transport. The target runs it through what a receiver runs and checks the contracts
// the headers state, aborting (a crash to libFuzzer) on any violation:
//   * peek_header / peek_size: either a dcr::error, or a size equal to the payload's length and
//     large enough for the item table; peek_size on the bare 80-byte prefix agrees;
//   * read_table: fails whenever peek_header does; on success the frames lie back to back and
//     fill the stream area exactly;
//   * decode: fails exactly when read_table fails (with its error code) or later; on success
//     every item agrees with its table entry and the registry (type, encoding, count, value
//     bytes, strictly increasing indices below numel); a transition filter of another base
//     version is refused as stale_payload; re-encoding the items with payload_encoder succeeds
//     and decodes (under a matching filter) to the same items;
//   * prewarm (once): the compiled plan skips exactly the tensor the loader skips and marks
//     exactly the tensor it writes twice overwrite-only;
//   * apply: the decoded items go through item_applier (compiled or general path, with or
//     without post-apply verification) and this rank's loader (tests/fuzz/fuzz_model.hpp). The
//     resulting storage must equal an independent model of the loader's placement; an xor or
//     ulp item on the tensor the loader writes twice (overwrite-only on this rank) must be
//     refused with unsupported_loader_path; and whenever decode or apply throws, storage
//     (including the guard bytes between buffers) must be exactly as before: no partial write.
// dcr::error is the expected failure and is caught; anything else (another exception, a
// sanitizer report, an abort) is a finding.
//
// Built with clang -fsanitize=fuzzer,address,undefined by scripts/fuzz.sh; built without
// libFuzzer (tests/fuzz/replay_main.cpp supplies main) by meson to replay seeds and regressions.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dcr/apply/apply.hpp"
#include "dcr/canonical.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/error.hpp"
#include "fuzz_model.hpp"
#include "recipe.hpp"

namespace dcr_fuzz {
namespace {

namespace pf = dcr::payload_format;

[[noreturn]] void fail(const char* property, const std::string& detail = {}) {
  std::fprintf(stderr, "dcr fuzz: property violated: %s%s%s\n", property,
               detail.empty() ? "" : ": ", detail.c_str());
  std::fflush(stderr);
  std::abort();
}

void require(bool ok, const char* property, const std::string& detail = {}) {
  if (!ok) fail(property, detail);
}

/// Runs f(); a dcr::error from it is a finding (the step has no reason to fail).
template <class F>
decltype(auto) must(const char* step, F&& f) {
  try {
    return f();
  } catch (const dcr::error& e) {
    fail(step, std::string("threw dcr::error: ") + e.what());
  }
}

bool same_items(const std::vector<dcr::item>& a, const std::vector<dcr::item>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].tensor != b[i].tensor || a[i].type != b[i].type || a[i].enc != b[i].enc ||
        a[i].indices != b[i].indices || a[i].values != b[i].values)
      return false;
  }
  return true;
}

bool same_header(const dcr::payload_header& a, const dcr::payload_header& b) {
  return a.id == b.id && a.registry_fingerprint == b.registry_fingerprint;
}

/// The bits `e` writes over resident bits `r` for value `v`. Overwrite and xor are stated here
/// independently; other encodings use their policy type from dcr/codec/values.hpp.
template <class W>
W apply_rule(dcr::encoding e, W r, W v) {
  switch (e) {
    case dcr::encoding::overwrite: return v;
    case dcr::encoding::xor_mask: return static_cast<W>(r ^ v);
    default:
      return dcr::visit_encoding(e, [&](auto enc) { return decltype(enc)::template apply<W>(r, v); });
  }
}

/// Exactly-sized heap copy, so AddressSanitizer sees any read past the end.
struct exact_buffer {
  std::unique_ptr<std::byte[]> data;
  std::size_t size = 0;
  explicit exact_buffer(std::span<const std::byte> bytes)
      : data(new std::byte[bytes.empty() ? 1 : bytes.size()]), size(bytes.size()) {
    if (size != 0) std::memcpy(data.get(), bytes.data(), size);
  }
  [[nodiscard]] std::span<std::byte> span() noexcept { return {data.get(), size}; }
};

class target {
 public:
  target() {
    applier_.prewarm();
    // The compiled plan agrees with the model: only e is skipped, only f is overwrite-only.
    for (dcr::tensor_id id = 0; id < tensor_count; ++id)
      require(applier_.skips(id) == (id == id_e), "prewarm: the loader skips exactly e.u8");
    const auto only = applier_.overwrite_only_tensors();
    require(only.size() == 1 && only[0] == id_f,
            "prewarm: f.i16 (written twice) is the only overwrite-only tensor");
  }

  /// One input (see recipe.hpp for the modes).
  void run(std::span<const std::uint8_t> input) {
    if (input.empty()) return;
    const std::uint8_t mode = input[0];
    const auto body = std::as_bytes(input.subspan(1));
    switch (mode_of(mode)) {
      case input_mode::raw: exercise(body, mode); break;
      case input_mode::fixed: {
        exact_buffer b(body);
        fix_up(b.span());
        exercise(b.span(), mode);
        break;
      }
      case input_mode::recipe: run_recipe(input.subspan(1), mode); break;
    }
  }

 private:
  void run_recipe(std::span<const std::uint8_t> body, std::uint8_t mode) {
    parse_recipe(body, registry_, recipe_);
    dcr::payload_encoder& enc = encoder(recipe_.options);
    must("payload_encoder::encode of valid recipe items",
         [&] { enc.encode(recipe_.header, recipe_.items, registry_, payload_); });
    {
      exact_buffer clean(payload_);
      const auto h = must("decode of a freshly encoded payload", [&] {
        return check_decoder_.decode(clean.span(), registry_, items2_);
      });
      require(same_header(h, recipe_.header), "decode returns the encoded header");
      require(same_items(items2_, recipe_.items), "decode returns the encoded items");
    }
    apply_edits(recipe_, payload_);
    exact_buffer edited(payload_);
    if (!recipe_.edits.empty()) fix_up(edited.span());
    exercise(edited.span(), mode);
  }

  void exercise(std::span<const std::byte> bytes, std::uint8_t mode) {
    // Header peeks.
    std::optional<dcr::payload_header> peeked;
    try {
      peeked = dcr::payload_decoder::peek_header(bytes);
    } catch (const dcr::error&) {
    }
    std::optional<std::uint64_t> size;
    try {
      size = dcr::payload_decoder::peek_size(bytes);
    } catch (const dcr::error&) {
    }
    if (peeked) {
      require(size.has_value(), "peek_size accepts what peek_header accepts");
      require(*size == bytes.size(), "peek_size equals the length of a payload peek_header accepts");
      const auto prefix_size = must("peek_size of the 80-byte prefix of an accepted payload", [&] {
        return dcr::payload_decoder::peek_size(bytes.first(pf::header_size));
      });
      require(prefix_size == *size, "peek_size of the prefix equals peek_size of the payload");
    }
    if (size) {
      require(bytes.size() >= pf::header_size, "peek_size needs a whole header");
      const std::uint64_t count = dcr::detail::load_le<std::uint32_t>(bytes.data() + 52);
      require(*size >= pf::header_size + count * pf::entry_size + pf::trailer_size,
              "peek_size leaves room for the item table and trailer");
    }

    // Item table.
    std::optional<dcr::errc> table_error;
    std::optional<dcr::payload_header> table_header;
    try {
      table_header = dcr::payload_decoder::read_table(bytes, entries_);
    } catch (const dcr::error& e) {
      table_error = e.dcr_code();
    }
    if (!peeked) require(table_error.has_value(), "read_table refuses what peek_header refuses");
    if (!table_error) {
      require(same_header(*table_header, *peeked), "read_table returns peek_header's header");
      std::uint64_t pos = pf::header_size + entries_.size() * pf::entry_size;
      for (const dcr::item_entry& e : entries_) {
        require(e.location_offset == pos && e.value_offset == pos + e.location_size,
                "read_table: frames lie back to back");
        pos = e.value_offset + e.value_size;
      }
      require(pos + pf::trailer_size == bytes.size(), "read_table: frames fill the stream area");
    }

    receive(bytes, table_error, table_header, mode);
  }

  // What a receiver does: decode, then apply; storage must be untouched by any failure.
  void receive(std::span<const std::byte> bytes, std::optional<dcr::errc> table_error,
               const std::optional<dcr::payload_header>& table_header, std::uint8_t mode) {
    store_.reset();
    before_ = store_.arena;

    dcr::payload_header header;
    try {
      header = decoder_.decode(bytes, registry_, items_);
    } catch (const dcr::error& e) {
      require(store_.arena == before_, "a failed decode leaves storage unchanged");
      require(e.dcr_code() != dcr::errc::ok && std::strlen(e.what()) > 0,
              "decode errors carry a code and a message");
      if (table_error)
        require(e.dcr_code() == *table_error, "decode fails with read_table's error code",
                e.what());
      return;
    }
    require(!table_error.has_value(), "decode refuses what read_table refuses");
    require(table_header.has_value() && same_header(header, *table_header),
            "decode returns read_table's header");
    check_items_against_table();

    // A filter for another transition is refused.
    const dcr::attempt_key stale{header.id.attempt.base_version + 1,
                                 header.id.attempt.target_version, header.id.attempt.number};
    try {
      (void)check_decoder_.decode(bytes, registry_, items2_, &stale);
      fail("decode with a filter of another base version must throw stale_payload");
    } catch (const dcr::error& e) {
      require(e.dcr_code() == dcr::errc::stale_payload,
              "decode with a filter of another base version throws stale_payload", e.what());
    }

    // Round trip: what the decoder accepts, the encoder accepts, and it decodes back the same.
    dcr::payload_encoder& enc = encoder(reencode_options(mode));
    must("payload_encoder::encode of decoded items",
         [&] { enc.encode(header, items_, registry_, reencoded_); });
    const dcr::attempt_key same = header.id.attempt;
    const auto h2 = must("decode of re-encoded items under their own filter", [&] {
      return check_decoder_.decode(reencoded_, registry_, items2_, &same);
    });
    require(same_header(h2, header), "re-encoded payload keeps the header");
    require(same_items(items2_, items_), "re-encoded payload decodes to the same items");

    check_apply(mode);
  }

  void check_items_against_table() {
    require(items_.size() == entries_.size(), "one item per table entry");
    for (std::size_t i = 0; i < items_.size(); ++i) {
      const dcr::item& it = items_[i];
      const dcr::item_entry& e = entries_[i];
      require(it.tensor == e.tensor && it.tensor < registry_.size(), "item tensor = entry tensor");
      const dcr::canonical_tensor& t = registry_.tensors()[it.tensor];
      require(it.type == t.type && static_cast<std::uint8_t>(it.type) == e.dtype_code,
              "item dtype = entry dtype = registry dtype");
      require(static_cast<std::uint8_t>(it.enc) == e.encoding_code &&
                  dcr::is_supported_encoding(it.enc),
              "item encoding = entry encoding, supported");
      require(it.count() == e.count && it.values.size() == it.count() * it.word_bytes(),
              "item count and value bytes = entry's");
      const auto numel = static_cast<std::uint64_t>(t.numel());
      for (std::size_t j = 0; j < it.indices.size(); ++j) {
        require(it.indices[j] < numel, "decoded index < numel");
        require(j == 0 || it.indices[j - 1] < it.indices[j], "decoded indices strictly increase");
      }
    }
  }

  void check_apply(std::uint8_t mode) {
    // The expected storage, from the independent placement model.
    expected_ = before_;
    auto* const base = reinterpret_cast<std::byte*>(expected_.data());
    bool refuse = false;
    std::uint64_t records = 0, writes = 0, skipped = 0;
    for (const dcr::item& it : items_) {
      records += it.count();
      // Refused even without records: the receiver declares f overwrite-only.
      if (writes_twice(it.tensor) && it.enc != dcr::encoding::overwrite) refuse = true;
      if (it.count() == 0) continue;
      if (it.tensor == id_e) {
        ++skipped;
        continue;
      }
      dcr::visit_word(it.word_bytes(), [&](auto w) {
        using W = decltype(w);
        const auto values = it.words<W>();
        for (std::size_t j = 0; j < it.count(); ++j) {
          const placement p = placements(it.tensor, it.indices[j]);
          for (int k = 0; k < p.count; ++k) {
            const storage::buffer& b = store_.buffers[p.buffer[k]];
            require(p.word[k] < b.words && b.word_bytes == sizeof(W), "placement model in range");
            std::byte* at = base + b.offset + p.word[k] * sizeof(W);
            W r;
            std::memcpy(&r, at, sizeof(W));
            r = apply_rule<W>(it.enc, r, values[j]);
            std::memcpy(at, &r, sizeof(W));
          }
          writes += static_cast<std::uint64_t>(p.count) * (writes_twice(it.tensor) ? 2 : 1);
        }
      });
    }

    // Bit 6 of the mode byte picks the general path (loader with a delta sink per item), else
    // the compiled one; bit 7 turns on the post-apply verification.
    dcr::apply_options options;
    options.path = (mode & 0x40) != 0 ? dcr::apply_path::general : dcr::apply_path::compiled;
    options.verify = (mode & 0x80) != 0;
    dcr::apply_stats stats;
    try {
      stats = applier_.apply(items_, options);
    } catch (const dcr::error& e) {
      require(store_.arena == before_, "a refused apply leaves storage unchanged", e.what());
      require(refuse, "apply accepts decoded items the loader can take", e.what());
      require(e.dcr_code() == dcr::errc::unsupported_loader_path,
              "apply refuses overlapping non-idempotent writes with unsupported_loader_path",
              e.what());
      return;
    }
    require(!refuse, "apply refuses xor/ulp items on a tensor the loader writes twice");
    require(store_.arena == expected_, "apply writes exactly the placement model's words");
    require(stats.items == items_.size() && stats.records == records && stats.writes == writes &&
                stats.skipped_items == skipped && stats.verified == (options.verify ? writes : 0),
            "apply_stats count items, records, writes, skipped items and verified writes",
            "writes " + std::to_string(stats.writes) + ", model " + std::to_string(writes));
  }

  dcr::payload_encoder& encoder(const dcr::codec_options& o) {
    for (auto& [opts, enc] : encoders_)
      if (same_options(opts, o)) return *enc;
    encoders_.emplace_back(o, std::make_unique<dcr::payload_encoder>(o));
    return *encoders_.back().second;
  }

  dcr::tensor_registry registry_ = make_registry();
  storage store_;
  loader loader_{&store_};
  dcr::item_applier<loader> applier_{registry_, loader_};
  dcr::payload_decoder decoder_;        // reused across inputs, as a receiver's is
  dcr::payload_decoder check_decoder_;  // for the checks, so decoder_'s state is only its own
  std::vector<std::pair<dcr::codec_options, std::unique_ptr<dcr::payload_encoder>>> encoders_;
  std::vector<dcr::item> items_, items2_;
  std::vector<dcr::item_entry> entries_;
  std::vector<std::byte> payload_, reencoded_;
  std::vector<std::uint64_t> before_, expected_;
  recipe recipe_;
};

}  // namespace
}  // namespace dcr_fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static dcr_fuzz::target t;
  t.run({data, size});
  return 0;
}
