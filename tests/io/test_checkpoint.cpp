// Whole-checkpoint diff and apply through the library: delta round trips under every encoding
// policy, wrong bases and corrupted deltas refused without output, and in-place apply with a
// crash injected after every step, recovered to exactly the result bits.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dcr/io/checkpoint.hpp"
#include "io_test_util.hpp"

using dcr::dtype;
using dcr::encoding;
using dcr::encoding_policy;
using dcr::errc;
using namespace dcr::io;
using io_test::progress_calls;
using io_test::read_file;
using io_test::run_in_child;
using io_test::thrown_error;

namespace {

struct tensor_spec {
  std::string name;
  dtype type;
  std::vector<std::int64_t> shape;
};

// The layout of the test checkpoint: every dtype, odd sizes that leave later tensors
// misaligned, a scalar, an empty tensor, one tensor that never changes.
const std::vector<tensor_spec> specs = {
    {"layers.0.attn.weight", dtype::bf16, {300, 700}},  // several scan chunks
    {"layers.0.mlp.weight", dtype::bf16, {257, 129}},
    {"mask", dtype::boolean, {9}},
    {"norm.bias", dtype::f32, {1000}},
    {"embed", dtype::f16, {100, 33}},
    {"scale", dtype::f64, {17}},
    {"fp8.a", dtype::f8_e4m3, {333}},
    {"fp8.b", dtype::f8_e5m2, {65}},
    {"ids", dtype::i64, {40}},
    {"u64", dtype::u64, {21}},
    {"i32", dtype::i32, {31}},
    {"u32", dtype::u32, {3}},
    {"i16", dtype::i16, {70}},
    {"u16", dtype::u16, {71}},
    {"i8", dtype::i8, {90}},
    {"u8", dtype::u8, {91}},
    {"scalar", dtype::f32, {}},
    {"empty", dtype::bf16, {0, 4}},
};

struct checkpoint {
  std::vector<std::vector<std::byte>> data;
  std::optional<safetensors_metadata> metadata;

  void write(const std::filesystem::path& p, const std::vector<std::size_t>& order = {}) const {
    std::vector<safetensors_tensor> t;
    for (std::size_t k = 0; k < specs.size(); ++k) {
      const std::size_t i = order.empty() ? k : order[k];
      t.push_back({specs[i].name, specs[i].type, specs[i].shape, data[i]});
    }
    write_safetensors(p, t, metadata);
  }
};

std::size_t numel(const tensor_spec& s) {
  std::size_t n = 1;
  for (auto e : s.shape) n *= static_cast<std::size_t>(e);
  return n;
}

checkpoint random_checkpoint(std::uint64_t seed) {
  checkpoint c;
  std::uint64_t k = seed;
  for (const auto& s : specs) {
    c.data.push_back(io_test::random_bytes(numel(s) * dcr::dtype_size(s.type), ++k));
    if (s.type == dtype::boolean)
      for (auto& b : c.data.back()) b &= std::byte{1};
  }
  c.metadata = safetensors_metadata{{"format", "pt"}, {"step", "0001"}};
  return c;
}

// `base` with about `rate` of each tensor's words changed (low bits for small updates, a sign
// flip now and then; BOOL toggled), "scale" left alone. Returns the number of changed words.
std::uint64_t mutate(checkpoint& c, double rate, std::uint64_t seed,
                     std::uint64_t& changed_tensors) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution pick(rate);
  std::uint64_t changed = 0;
  changed_tensors = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name == "scale") continue;
    const std::uint64_t before = changed;
    const std::size_t w = dcr::dtype_size(specs[i].type);
    auto& d = c.data[i];
    for (std::size_t e = 0; e < d.size() / w; ++e) {
      if (!pick(rng)) continue;
      std::byte* p = d.data() + e * w;
      if (specs[i].type == dtype::boolean) {
        p[0] ^= std::byte{1};
      } else if (rng() % 8 == 0) {
        p[w - 1] ^= std::byte{0x80};
      } else {
        p[0] ^= static_cast<std::byte>(1 + rng() % 7);
      }
      ++changed;
    }
    changed_tensors += changed != before ? 1 : 0;
  }
  c.metadata = safetensors_metadata{{"format", "pt"}, {"step", "0002"}};
  return changed;
}

struct fixture {
  io_test::scratch_dir dir;
  std::filesystem::path old_path = dir / "old.safetensors";
  std::filesystem::path new_path = dir / "new.safetensors";
  std::filesystem::path delta_path = dir / "step.dcrdelta";
  checkpoint old_ckpt = random_checkpoint(7);
  checkpoint new_ckpt = old_ckpt;
  std::uint64_t changed = 0;
  std::uint64_t changed_tensors = 0;

  explicit fixture(double rate = 0.03) {
    changed = mutate(new_ckpt, rate, 11, changed_tensors);
    old_ckpt.write(old_path);
    new_ckpt.write(new_path);
  }
};

}  // namespace

TEST_CASE("diff then apply reproduces NEW byte for byte under every encoding policy") {
  fixture fx;
  const auto new_bytes = read_file(fx.new_path);
  for (auto policy : {encoding_policy::mixed, encoding_policy::xor_only, encoding_policy::ulp_only,
                      encoding_policy::overwrite_only}) {
    for (std::size_t per_payload : {std::size_t{1} << 21, std::size_t{50}}) {
      CAPTURE(static_cast<int>(policy));
      CAPTURE(per_payload);
      diff_options o;
      o.policy = policy;
      o.payload_records = per_payload;
      const auto r = diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path, o);
      CHECK(r.changed_elements == fx.changed);
      CHECK(r.tensors == specs.size());
      CHECK(r.changed_tensors == fx.changed_tensors);
      CHECK(r.delta_bytes == std::filesystem::file_size(fx.delta_path));
      CHECK(r.checkpoint_bytes == new_bytes.size());
      if (per_payload == 50) {
        // Small payloads split the big tensor's records across payloads, one item in each.
        auto d = delta_file::open(fx.delta_path);
        const auto old_file = safetensors_file::open(fx.old_path);
        d.bind_base(old_file.header(), old_file.header_json(), "OLD");
        CHECK(d.payload_count() == r.payloads);
        const auto big = d.registry().id("layers.0.attn.weight");
        std::size_t with_big = 0;
        std::vector<dcr::item_entry> entries;
        for (std::size_t i = 0; i < d.payload_count(); ++i) {
          (void)dcr::payload_decoder::read_table(d.payload(i), entries);
          for (const auto& e : entries) with_big += e.tensor == big ? 1 : 0;
        }
        CHECK(with_big >= 3);
      } else {
        CHECK(r.payloads == 1);
      }
      const auto only = [&](encoding e) {
        return r.items_by_encoding[static_cast<std::size_t>(e)] == r.items;
      };
      if (policy == encoding_policy::xor_only) CHECK(only(encoding::xor_mask));
      if (policy == encoding_policy::ulp_only) CHECK(only(encoding::ulp));
      if (policy == encoding_policy::overwrite_only) CHECK(only(encoding::overwrite));

      const auto out = fx.dir / "out.safetensors";
      const auto a = apply_delta(fx.delta_path, fx.old_path, out);
      CHECK(a.records == fx.changed);
      CHECK(read_file(out) == new_bytes);
      std::filesystem::remove(out);
    }
  }
  CHECK(fx.dir.files() ==
        std::vector<std::string>{"new.safetensors", "old.safetensors", "step.dcrdelta"});
}

TEST_CASE("the delta file records digests, and its target header coded against the base's") {
  fixture fx;
  (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path);
  auto d = delta_file::open(fx.delta_path);
  const auto old_file = safetensors_file::open(fx.old_path);
  const auto new_file = safetensors_file::open(fx.new_path);
  // Unbound, it knows its base only by digests and fingerprint.
  CHECK_FALSE(d.bound());
  CHECK(thrown_error([&] { (void)d.registry(); }).dcr_code() == errc::not_ready);
  CHECK(thrown_error([&] { (void)d.target_header_json(); }).dcr_code() == errc::not_ready);
  const dcr::tensor_registry registry(old_file.header().canonical_tensors());
  CHECK(d.registry_fingerprint() == registry.fingerprint());
  CHECK(d.tensor_count() == specs.size());
  CHECK(d.target_header_size() == new_file.header_json().size());
  CHECK(d.target_file_size() == new_file.bytes().size());
  CHECK(d.base_header_digest() == header_content_digest(old_file.header_json()));
  CHECK(d.target_header_digest() == header_content_digest(new_file.header_json()));
  std::vector<digest128> old_digests, new_digests;
  for (const auto& t : registry.tensors()) {
    old_digests.push_back(digest_of(old_file.data(*old_file.find(t.name))));
    new_digests.push_back(digest_of(new_file.data(*new_file.find(t.name))));
  }
  CHECK(d.base_digest() == tensors_digest(old_digests));
  CHECK(d.result_digest() == tensors_digest(new_digests));
  // Bound to its base, it gives the registry and the target header verbatim.
  d.bind_base(old_file.header(), old_file.header_json(), "OLD");
  CHECK(d.target_header_json() == new_file.header_json());
  CHECK(d.target_header().metadata()->at("step") == "0002");
  CHECK(d.registry().fingerprint() == registry.fingerprint());
  // The headers differ only in metadata: the coded target header is a few dozen bytes.
  CHECK(d.target_header_code().size() < 64);
  // Digests are XXH3-128 in canonical form: the empty input's is a published constant.
  CHECK(digest_of({}).hex() == "99aa06d3014798d86001c324468d497f");
}

TEST_CASE("identical checkpoints give a delta without payloads") {
  fixture fx(0.0);
  const auto r = diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path);
  CHECK(r.changed_elements == 0);
  CHECK(r.payloads == 0);
  CHECK(delta_file::open(fx.delta_path).payload_count() == 0);
  (void)apply_delta(fx.delta_path, fx.old_path, fx.dir / "out.safetensors");
  CHECK(read_file(fx.dir / "out.safetensors") == read_file(fx.new_path));
}

TEST_CASE("checkpoints with other tensors are refused, listing the differences") {
  fixture fx;
  auto other = fx.new_ckpt;
  std::vector<safetensors_tensor> t;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    auto shape = specs[i].shape;
    auto type = specs[i].type;
    std::string name = specs[i].name;
    if (name == "norm.bias") shape = {10, 100};
    if (name == "u32") type = dtype::i32;
    if (name == "ids") name = "ids2";
    t.push_back({name, type, shape, other.data[i]});
  }
  write_safetensors(fx.dir / "other.safetensors", t);
  const auto e = thrown_error(
      [&] { (void)diff_checkpoints(fx.old_path, fx.dir / "other.safetensors", fx.delta_path); });
  const std::string msg = e.what();
  CHECK(e.dcr_code() == errc::unknown_tensor);  // 'ids' comes first in name order
  CHECK(msg.find("4 differences") != std::string::npos);
  CHECK(msg.find("'ids' only in OLD") != std::string::npos);
  CHECK(msg.find("'norm.bias' has shape [1000] in OLD") != std::string::npos);
  CHECK(msg.find("'u32' is U32 in OLD") != std::string::npos);
  CHECK(msg.find("'ids2' only in NEW") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(fx.delta_path));
}

TEST_CASE("a wrong base is refused, and nothing is created") {
  fixture fx;
  (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path);
  auto wrong = fx.old_ckpt;
  wrong.data[3][5] ^= std::byte{1};  // norm.bias
  wrong.write(fx.dir / "wrong.safetensors");
  const auto files = fx.dir.files();
  const auto out = fx.dir / "out.safetensors";
  const auto e = thrown_error([&] { (void)apply_delta(fx.delta_path, fx.dir / "wrong.safetensors", out); });
  CHECK(e.dcr_code() == errc::verification_failed);
  CHECK(std::string(e.what()).find("wrong base: BASE '") != std::string::npos);
  CHECK(std::string(e.what()).find("its tensors have digest") != std::string::npos);
  CHECK(fx.dir.files() == files);
  // The result itself is not a base either, and in place the base is left untouched.
  CHECK(thrown_error([&] { (void)apply_delta(fx.delta_path, fx.new_path, out); }).dcr_code() ==
        errc::verification_failed);
  const auto wrong_bytes = read_file(fx.dir / "wrong.safetensors");
  CHECK(thrown_error([&] {
          (void)apply_delta_in_place(fx.delta_path, fx.dir / "wrong.safetensors");
        }).dcr_code() == errc::verification_failed);
  CHECK(read_file(fx.dir / "wrong.safetensors") == wrong_bytes);
  CHECK(fx.dir.files() == files);
  // Applying onto the base itself needs the in-place apply.
  CHECK(thrown_error([&] { (void)apply_delta(fx.delta_path, fx.old_path, fx.old_path); })
            .dcr_code() == errc::invalid_argument);
}

TEST_CASE("a corrupted delta is rejected before anything is written") {
  fixture fx;
  diff_options o;
  o.payload_records = 200;
  (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path, o);
  const auto good = read_file(fx.delta_path);
  const auto d = delta_file::open(fx.delta_path);
  REQUIRE(d.payload_count() > 1);
  const auto out = fx.dir / "out.safetensors";
  const auto bad = fx.dir / "bad.dcrdelta";
  const auto rejects = [&](std::vector<std::byte> bytes, errc code, std::string text) {
    io_test::write_file(bad, bytes);
    const auto e = thrown_error([&] { (void)apply_delta(bad, fx.old_path, out); });
    CHECK(e.dcr_code() == code);
    CHECK_MESSAGE(std::string(e.what()).find(text) != std::string::npos, e.what());
    CHECK_FALSE(std::filesystem::exists(out));
  };
  // Header, target header, payloads, trailer: every region is covered.
  auto b = good;
  b[0] = std::byte{'X'};
  rejects(b, errc::corrupt_payload, "not a dcr delta file");
  b = good;
  b[8] = std::byte{1};
  rejects(b, errc::unsupported_version,
          "format version 1 (written by an older dcr; make the delta again with this dcr), "
          "this dcr reads version 2 only");
  b = good;
  b[8] = std::byte{3};
  rejects(b, errc::unsupported_version, "format version 3 (written by a newer dcr)");
  b = good;
  b[80] ^= std::byte{1};  // the base header's digest
  rejects(b, errc::corrupt_payload, "checksum of the header");
  b = good;
  b[delta_format::header_size + 5] ^= std::byte{1};  // the coded target header
  rejects(b, errc::corrupt_payload, "checksum of the header");
  b = good;
  b[d.payload_offset(1) + 100] ^= std::byte{1};
  rejects(b, errc::corrupt_payload, "checksum of the payloads");
  b = good;
  b.resize(b.size() - 1);
  rejects(b, errc::truncated_payload, "header declares");
  // A damaged payload whose container checksum was recomputed still fails the payload's own.
  b = good;
  const std::uint64_t at = d.payload_offset(1) + 90;
  b[at] ^= std::byte{1};
  const std::uint64_t head_end = d.payload_offset(0);
  const std::uint64_t body_end = b.size() - delta_format::trailer_size;
  dcr::detail::store_le<std::uint64_t>(b.data() + body_end + 8,
                                       XXH3_64bits(b.data() + head_end, body_end - head_end));
  rejects(b, errc::corrupt_payload, "payload 1");
  CHECK(fx.dir.files() == std::vector<std::string>{"bad.dcrdelta", "new.safetensors",
                                                   "old.safetensors", "step.dcrdelta"});
}

TEST_CASE("in place: the base becomes the result; a second apply finds it done") {
  fixture fx;
  (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path);
  const auto base = fx.dir / "base.safetensors";
  std::filesystem::copy_file(fx.old_path, base);
  const auto r = apply_delta_in_place(fx.delta_path, base);
  CHECK(r.records == fx.changed);
  CHECK_FALSE(r.already_applied);
  CHECK(read_file(base) == read_file(fx.new_path));
  const auto again = apply_delta_in_place(fx.delta_path, base);
  CHECK(again.already_applied);
  CHECK(read_file(base) == read_file(fx.new_path));
  CHECK(fx.dir.files() == std::vector<std::string>{"base.safetensors", "new.safetensors",
                                                   "old.safetensors", "step.dcrdelta"});
}

TEST_CASE("in place: a shorter target header is padded, a longer or another layout refused") {
  fixture fx;
  const auto base = fx.dir / "base.safetensors";
  SUBCASE("shorter metadata") {
    fx.new_ckpt.metadata = safetensors_metadata{{"format", "pt"}};
    fx.new_ckpt.write(fx.new_path);
    (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path);
    std::filesystem::copy_file(fx.old_path, base);
    (void)apply_delta_in_place(fx.delta_path, base);
    const auto got = safetensors_file::open(base);
    const auto want = safetensors_file::open(fx.new_path);
    CHECK(got.header().header_size() == safetensors_file::open(fx.old_path).header().header_size());
    CHECK(got.metadata() == want.metadata());
    for (const auto& t : want.tensors()) {
      const auto a = got.data(*got.find(t.name));
      const auto b = want.data(t);
      CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));
    }
  }
  SUBCASE("longer metadata") {
    fx.new_ckpt.metadata->emplace("comment", std::string(64, 'x'));
    fx.new_ckpt.write(fx.new_path);
    (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path);
    std::filesystem::copy_file(fx.old_path, base);
    const auto e = thrown_error([&] { (void)apply_delta_in_place(fx.delta_path, base); });
    CHECK(e.dcr_code() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("does not fit") != std::string::npos);
    CHECK(read_file(base) == read_file(fx.old_path));
  }
  SUBCASE("another layout") {
    std::vector<std::size_t> reversed;
    for (std::size_t i = specs.size(); i-- > 0;) reversed.push_back(i);
    fx.new_ckpt.write(fx.new_path, reversed);
    (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path);
    std::filesystem::copy_file(fx.old_path, base);
    const auto e = thrown_error([&] { (void)apply_delta_in_place(fx.delta_path, base); });
    CHECK(e.dcr_code() == errc::invalid_argument);
    CHECK(read_file(base) == read_file(fx.old_path));
    // Out of place, the result takes the target's layout: NEW byte for byte.
    (void)apply_delta(fx.delta_path, fx.old_path, fx.dir / "out.safetensors");
    CHECK(read_file(fx.dir / "out.safetensors") == read_file(fx.new_path));
  }
}

TEST_CASE("in place: a crash after any step never leaves a partial file at BASE, and recovery "
          "gives exactly the result") {
  fixture fx;
  diff_options o;
  o.payload_records = 300;  // several payloads, so half-written stops between and within them
  (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path, o);
  const auto old_bytes = read_file(fx.old_path);
  const auto new_bytes = read_file(fx.new_path);
  for (std::size_t s = 0; s < in_place_step_names.size(); ++s) {
    const auto step = static_cast<in_place_step>(s);
    if (step == in_place_step::index_written) continue;  // directories only (sharded tests)
    CAPTURE(in_place_step_name(step));
    for (const bool via_apply : {false, true}) {
      CAPTURE(via_apply);
      const auto base = fx.dir / "base.safetensors";
      std::filesystem::remove(base);
      std::filesystem::copy_file(fx.old_path, base);
      in_place_options crash;
      crash.crash_at = step;
      const int status = run_in_child([&] { (void)apply_delta_in_place(fx.delta_path, base, crash); });
      REQUIRE(status == crash_exit_status);
      // BASE holds the old file, the new file, or nothing; never a mixture.
      if (std::filesystem::exists(base)) {
        const auto now = read_file(base);
        CHECK((now == old_bytes || now == new_bytes));
        if (step == in_place_step::renamed_back) CHECK(now == new_bytes);
        if (step <= in_place_step::journal_committed) CHECK(now == old_bytes);
      } else {
        CHECK(step >= in_place_step::base_hidden);
        CHECK(step <= in_place_step::verified);
      }
      CHECK(std::filesystem::exists(journal_path(base)) == (step != in_place_step::journal_written));
      // Out-of-place apply refuses to read a BASE with an unfinished in-place apply.
      if (step != in_place_step::journal_written)
        CHECK(thrown_error([&] { (void)apply_delta(fx.delta_path, base, fx.dir / "o"); })
                  .dcr_code() == errc::not_ready);
      if (via_apply) {
        const auto r = apply_delta_in_place(fx.delta_path, base);
        CHECK(r.recovered == (step != in_place_step::journal_written));
        CHECK(r.already_applied == (step != in_place_step::journal_written));
        CHECK(read_file(base) == new_bytes);
      } else {
        const auto r = recover_in_place(base);
        CHECK(r.journal_found == (step != in_place_step::journal_written));
        CHECK(r.temporaries_removed == (step == in_place_step::journal_written ? 1u : 0u));
        // An unpublished journal means the apply never began: BASE is the old file.
        CHECK(read_file(base) ==
              (step == in_place_step::journal_written ? old_bytes : new_bytes));
      }
      CHECK(fx.dir.files() == std::vector<std::string>{"base.safetensors", "new.safetensors",
                                                       "old.safetensors", "step.dcrdelta"});
    }
  }
}

TEST_CASE("recovery refuses a damaged journal and changes nothing") {
  fixture fx;
  (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path);
  const auto base = fx.dir / "base.safetensors";
  std::filesystem::copy_file(fx.old_path, base);
  in_place_options crash;
  crash.crash_at = in_place_step::half_written;
  REQUIRE(run_in_child([&] { (void)apply_delta_in_place(fx.delta_path, base, crash); }) ==
          crash_exit_status);
  const auto journal = journal_path(base);
  auto j = read_file(journal);
  j[j.size() / 2] ^= std::byte{4};
  io_test::write_file(journal, j);
  const auto files = fx.dir.files();
  const auto working = read_file(working_path(base));
  CHECK(thrown_error([&] { (void)recover_in_place(base); }).dcr_code() == errc::corrupt_payload);
  CHECK(fx.dir.files() == files);
  CHECK(read_file(working_path(base)) == working);
}

TEST_CASE("DCR_CRASH_AT names the steps") {
  CHECK(parse_in_place_step("half-written") == in_place_step::half_written);
  CHECK_FALSE(parse_in_place_step("nope").has_value());
  for (std::size_t s = 0; s < in_place_step_names.size(); ++s)
    CHECK(parse_in_place_step(in_place_step_name(static_cast<in_place_step>(s))) ==
          static_cast<in_place_step>(s));
}

TEST_CASE("in place refuses links; outputs never replace their own inputs") {
  fixture fx;
  (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path);
  const auto base = fx.dir / "base.safetensors";
  std::filesystem::copy_file(fx.old_path, base);
  std::filesystem::create_symlink(base, fx.dir / "link.safetensors");
  CHECK(thrown_error([&] { (void)apply_delta_in_place(fx.delta_path, fx.dir / "link.safetensors"); })
            .dcr_code() == errc::invalid_argument);
  std::filesystem::create_hard_link(base, fx.dir / "hard.safetensors");
  const auto e = thrown_error([&] { (void)apply_delta_in_place(fx.delta_path, base); });
  CHECK(e.dcr_code() == errc::invalid_argument);
  CHECK(std::string(e.what()).find("2 hard links") != std::string::npos);
  CHECK(read_file(base) == read_file(fx.old_path));
  CHECK(thrown_error([&] { (void)diff_checkpoints(fx.old_path, fx.new_path, fx.old_path); })
            .dcr_code() == errc::invalid_argument);
  CHECK(thrown_error([&] { (void)apply_delta(fx.delta_path, fx.old_path, fx.delta_path); })
            .dcr_code() == errc::invalid_argument);
  CHECK(read_file(fx.old_path) == read_file(base));
}

namespace {

// A checkpoint of `n` tensors of 64 BF16 elements with names like a transformer's.
std::vector<std::vector<std::byte>> many_tensors(std::size_t n, std::vector<safetensors_tensor>& t) {
  std::vector<std::vector<std::byte>> data;
  for (std::size_t i = 0; i < n; ++i) data.push_back(io_test::random_bytes(128, 100 + i));
  for (std::size_t i = 0; i < n; ++i)
    t.push_back({"model.layers." + std::to_string(i / 8) + ".mlp.weight_" + std::to_string(i % 8),
                 dtype::bf16, {8, 8}, data[i]});
  return data;
}

}  // namespace

TEST_CASE("a delta between identical files is at most 1 KB, whatever the tensor count") {
  for (std::size_t n : {10, 103, 1000}) {
    CAPTURE(n);
    io_test::scratch_dir dir;
    std::vector<safetensors_tensor> t;
    const auto data = many_tensors(n, t);
    const safetensors_metadata meta{{"format", "pt"}};
    write_safetensors(dir / "a.safetensors", t, meta);
    write_safetensors(dir / "b.safetensors", t, meta);
    const auto r = diff_checkpoints(dir / "a.safetensors", dir / "b.safetensors", dir / "d");
    CHECK(r.delta_bytes <= 1024);
    MESSAGE(n << " tensors: identical files give a delta of " << r.delta_bytes << " bytes");
    (void)apply_delta(dir / "d", dir / "a.safetensors", dir / "out.safetensors");
    CHECK(read_file(dir / "out.safetensors") == read_file(dir / "b.safetensors"));
  }
}

TEST_CASE("a base with the right tensors but another header is refused, saying why") {
  fixture fx;
  (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path);
  // The same tensors and bytes, written in another order: other offsets, another header.
  const auto resaved = fx.dir / "resaved.safetensors";
  std::vector<std::size_t> order(specs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  fx.old_ckpt.write(resaved, order);
  for (bool in_place : {false, true}) {
    const auto e = thrown_error([&] {
      if (in_place)
        (void)apply_delta_in_place(fx.delta_path, resaved);
      else
        (void)apply_delta(fx.delta_path, resaved, fx.dir / "out.safetensors");
    });
    CHECK(e.dcr_code() == errc::verification_failed);
    CHECK(std::string(e.what()).find("wrong base: BASE '") != std::string::npos);
    CHECK(std::string(e.what()).find("its JSON header has digest") != std::string::npos);
    CHECK(std::string(e.what()).find("another tensor order, offsets or metadata") !=
          std::string::npos);
  }
  // Other tensors: the registry differs.
  auto other = fx.old_ckpt;
  std::vector<safetensors_tensor> t;
  for (std::size_t i = 0; i + 1 < specs.size(); ++i)
    t.push_back({specs[i].name, specs[i].type, specs[i].shape, other.data[i]});
  write_safetensors(fx.dir / "fewer.safetensors", t);
  const auto e = thrown_error(
      [&] { (void)apply_delta(fx.delta_path, fx.dir / "fewer.safetensors", fx.dir / "o"); });
  CHECK(e.dcr_code() == errc::registry_mismatch);
  CHECK(std::string(e.what()).find("holds other tensors than the base of") != std::string::npos);
  CHECK(fx.dir.files() == std::vector<std::string>{"fewer.safetensors", "new.safetensors",
                                                   "old.safetensors", "resaved.safetensors",
                                                   "step.dcrdelta"});
}

TEST_CASE("in place: a base whose header was padded by an earlier in-place apply takes the next delta") {
  // step 1 shortens the header (padded in place to the base's length); step 2 is made from the
  // file step 1 produced with -o: its base header has the same content, less padding.
  fixture fx;
  fx.new_ckpt.metadata = safetensors_metadata{{"format", "pt"}};
  fx.new_ckpt.write(fx.new_path);
  (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path);
  const auto base = fx.dir / "base.safetensors";
  std::filesystem::copy_file(fx.old_path, base);
  (void)apply_delta_in_place(fx.delta_path, base);
  REQUIRE(read_file(base) != read_file(fx.new_path));  // same tensors, padded header
  auto next = fx.new_ckpt;
  std::uint64_t changed_tensors = 0;
  (void)mutate(next, 0.01, 12, changed_tensors);
  next.write(fx.dir / "next.safetensors");
  (void)diff_checkpoints(fx.new_path, fx.dir / "next.safetensors", fx.dir / "step2.dcrdelta");
  (void)apply_delta(fx.dir / "step2.dcrdelta", base, fx.dir / "out.safetensors");
  CHECK(read_file(fx.dir / "out.safetensors") == read_file(fx.dir / "next.safetensors"));
  (void)apply_delta_in_place(fx.dir / "step2.dcrdelta", base);
  const auto got = safetensors_file::open(base);
  const auto want = safetensors_file::open(fx.dir / "next.safetensors");
  for (const auto& w : want.tensors()) {
    const auto a = got.data(*got.find(w.name));
    const auto b = want.data(w);
    CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));
  }
  CHECK(got.header().header_size() == safetensors_file::open(fx.old_path).header().header_size());
}

TEST_CASE("a delta listing an element twice, in two payloads, is refused the same way on every path") {
  fixture fx;
  (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path);
  auto d = delta_file::open(fx.delta_path);
  const auto old_file = safetensors_file::open(fx.old_path);
  d.bind_base(old_file.header(), old_file.header_json(), "OLD");
  REQUIRE(d.payload_count() == 1);
  // A second payload repeating the first item's first record, as an overwrite with its new bits:
  // applying it again changes nothing, so only the rule "each element once" can refuse it.
  std::vector<dcr::item> items;
  dcr::payload_decoder decoder;
  (void)decoder.decode(d.payload(0), d.registry(), items, &delta_format::forward);
  REQUIRE_FALSE(items.empty());
  dcr::item again;
  again.tensor = items[0].tensor;
  again.type = items[0].type;
  again.enc = encoding::overwrite;
  again.indices = {items[0].indices[0]};
  const auto& t = d.registry().tensors()[again.tensor];
  const std::size_t w = dcr::dtype_size(t.type);
  const auto new_file = safetensors_file::open(fx.new_path);
  const auto* e = new_file.find(t.name);  // (not into a temporary file's header)
  const auto bytes = new_file.data(*e);
  again.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(again.indices[0] * w),
                      bytes.begin() + static_cast<std::ptrdiff_t>((again.indices[0] + 1) * w));
  const auto twice = fx.dir / "twice.dcrdelta";
  {
    delta_writer writer(twice, container_kind::delta, d.registry(), d.target_header_json(),
                        old_file.header_json());
    writer.set_digests(d.base_digest(), d.result_digest());
    writer.append_payload(d.payload(0));
    dcr::payload_header h;
    h.registry_fingerprint = d.registry().fingerprint();
    h.id = {0, 1, 0, 0, 1};
    std::vector<std::byte> p;
    dcr::payload_encoder encoder;
    encoder.encode(h, std::span<const dcr::item>(&again, 1), d.registry(), p);
    writer.append_payload(p);
    writer.commit();
  }
  const auto files = fx.dir.files();
  const auto base = fx.dir / "base.safetensors";
  std::filesystem::copy_file(fx.old_path, base);
  const auto base_bytes = read_file(base);
  for (bool in_place : {false, true}) {
    CAPTURE(in_place);
    const auto e2 = thrown_error([&] {
      if (in_place)
        (void)apply_delta_in_place(twice, base);
      else
        (void)apply_delta(twice, fx.old_path, fx.dir / "out.safetensors");
    });
    CHECK(e2.dcr_code() == errc::corrupt_payload);
    CHECK(std::string(e2.what()).find("payload 1") != std::string::npos);
    CHECK(std::string(e2.what()).find("of an earlier payload (each element may be listed once") !=
          std::string::npos);
  }
  CHECK(read_file(base) == base_bytes);
  std::filesystem::remove(base);
  CHECK(fx.dir.files() == files);
}

namespace {

// Tensor bytes of `c`, and bytes of the elements that differ between `a` and `b`.
std::uint64_t tensor_bytes_of(const checkpoint& c) {
  std::uint64_t n = 0;
  for (const auto& d : c.data) n += d.size();
  return n;
}
std::uint64_t changed_bytes_between(const checkpoint& a, const checkpoint& b) {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::size_t w = dcr::dtype_size(specs[i].type);
    for (std::size_t e = 0; e < a.data[i].size(); e += w)
      if (std::memcmp(a.data[i].data() + e, b.data[i].data() + e, w) != 0) n += w;
  }
  return n;
}

}  // namespace

TEST_CASE("progress: apply, in-place apply and recovery count the bytes planned at the start") {
  fixture fx;
  diff_options o;
  o.payload_records = 300;  // several payloads
  (void)diff_checkpoints(fx.old_path, fx.new_path, fx.delta_path, o);
  const std::uint64_t tensors = tensor_bytes_of(fx.old_ckpt);
  const std::uint64_t changed = changed_bytes_between(fx.old_ckpt, fx.new_ckpt);
  REQUIRE(changed > 0);
  const auto base = fx.dir / "base.safetensors";
  const auto fresh_base = [&] {
    std::filesystem::remove(base);
    std::filesystem::copy_file(fx.old_path, base);
  };

  SUBCASE("apply to a new file: BASE digested and copied, the changes, the result digested") {
    progress_calls p;
    (void)apply_delta(fx.delta_path, fx.old_path, fx.dir / "out.safetensors",
                      apply_options{.progress = p.callback()});
    p.check(3 * tensors + changed);
    CHECK(read_file(fx.dir / "out.safetensors") == read_file(fx.new_path));
  }
  SUBCASE("in place, and again when already applied: BASE digested, changes journaled and "
          "written, the result digested") {
    fresh_base();
    for (const bool again : {false, true}) {
      CAPTURE(again);
      progress_calls p;
      in_place_options io;
      io.progress = p.callback();
      CHECK(apply_delta_in_place(fx.delta_path, base, io).already_applied == again);
      p.check(2 * tensors + 2 * changed);
      CHECK(read_file(base) == read_file(fx.new_path));
    }
  }
  SUBCASE("recovery: BASE digested if it is still there, the changes written, the result "
          "digested") {
    for (const auto step : {in_place_step::journal_committed, in_place_step::half_written}) {
      CAPTURE(in_place_step_name(step));
      fresh_base();
      in_place_options crash;
      crash.crash_at = step;
      REQUIRE(run_in_child([&] { (void)apply_delta_in_place(fx.delta_path, base, crash); }) ==
              crash_exit_status);
      progress_calls p;
      in_place_options io;
      io.progress = p.callback();
      CHECK(recover_in_place(base, io).rolled_forward);
      p.check((step == in_place_step::journal_committed ? tensors : 0) + changed + tensors);
      CHECK(read_file(base) == read_file(fx.new_path));
    }
  }
  SUBCASE("an in-place apply that finishes an interrupted one reports both, each from 0") {
    fresh_base();
    in_place_options crash;
    crash.crash_at = in_place_step::half_written;
    REQUIRE(run_in_child([&] { (void)apply_delta_in_place(fx.delta_path, base, crash); }) ==
            crash_exit_status);
    progress_calls p;
    in_place_options io;
    io.progress = p.callback();
    const auto r = apply_delta_in_place(fx.delta_path, base, io);
    CHECK(r.recovered);
    CHECK(r.already_applied);
    REQUIRE_FALSE(p.calls.empty());
    // The recovery's calls, then the apply's (which finds the result in place).
    const std::uint64_t recovery = changed + tensors;
    const auto split = std::find_if(p.calls.begin(), p.calls.end(),
                                    [&](const auto& c) { return c.second != recovery; });
    progress_calls first{{p.calls.begin(), split}};
    progress_calls second{{split, p.calls.end()}};
    first.check(recovery);
    second.check(2 * tensors + 2 * changed);
  }
}
