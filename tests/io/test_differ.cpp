// checkpoint_differ: the in-memory diff (diff_tensors) gives the same payloads with and without
// its worker thread, on reuse, and as the delta file of the same checkpoints; errors of the
// payload sink reach the caller and leave the differ usable; bad arguments are refused before
// any payload is produced.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "dcr/io/checkpoint.hpp"
#include "io_test_util.hpp"

using dcr::dtype;
using dcr::errc;
using namespace dcr::io;

namespace {

struct spec {
  std::string name;
  dtype type;
  std::vector<std::int64_t> shape;
};

// Several scan chunks (128 KiB) in the big tensors, every word size, an empty tensor.
const std::vector<spec> specs = {
    {"a.bf16", dtype::bf16, {300, 700}}, {"b.f32", dtype::f32, {80000}},
    {"c.u8", dtype::u8, {5000}},         {"d.f64", dtype::f64, {20000}},
    {"e.empty", dtype::f16, {0}},        {"f.f16", dtype::f16, {1, 333}},
};

struct model {
  dcr::tensor_registry registry;
  // Each tensor's bytes start one byte into its buffer, so that no word is aligned.
  std::vector<std::vector<std::byte>> old_store, new_store;
  std::vector<tensor_pair> pairs;
  std::uint64_t changed = 0;

  explicit model(double rate) {
    std::vector<dcr::canonical_tensor> ts;
    for (const auto& s : specs) ts.push_back({s.name, s.type, s.shape});
    registry = dcr::tensor_registry(ts);
    std::mt19937_64 rng(5);
    std::bernoulli_distribution pick(rate);
    for (const auto& t : registry.tensors()) {
      const auto bytes = static_cast<std::size_t>(t.bytes());
      auto o = io_test::random_bytes(bytes + 1, rng());
      auto n = o;
      const std::size_t w = dcr::dtype_size(t.type);
      for (std::size_t e = 0; e < bytes / w; ++e)
        if (pick(rng)) {
          n[1 + e * w] ^= static_cast<std::byte>(1 + rng() % 255);
          ++changed;
        }
      old_store.push_back(std::move(o));
      new_store.push_back(std::move(n));
    }
    for (std::size_t i = 0; i < old_store.size(); ++i)
      pairs.push_back({std::span<const std::byte>(old_store[i]).subspan(1),
                       std::span<const std::byte>(new_store[i]).subspan(1)});
  }
};

struct collected {
  std::vector<std::vector<std::byte>> payloads;
  std::vector<tensor_digests> digests;
  diff_report report;
};

collected run(checkpoint_differ& differ, const model& m) {
  collected c;
  c.digests.resize(m.registry.size());
  c.report = differ.diff_tensors(
      m.registry, m.pairs,
      [&](std::span<const std::byte> p) { c.payloads.emplace_back(p.begin(), p.end()); },
      c.digests);
  return c;
}

// Applies every payload to copies of the old bytes; true when they become the new bytes.
bool reproduces_new(const model& m, const std::vector<std::vector<std::byte>>& payloads) {
  std::vector<std::vector<std::byte>> resident;
  for (const auto& p : m.pairs) resident.emplace_back(p.old_bytes.begin(), p.old_bytes.end());
  dcr::payload_decoder decoder;
  std::vector<dcr::item> items;
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    const auto h = decoder.decode(payloads[i], m.registry, items, &delta_format::forward);
    REQUIRE(h.id.sequence == i);
    for (const auto& it : items) detail::apply_item(resident[it.tensor], it, "test");
  }
  for (std::size_t id = 0; id < resident.size(); ++id)
    if (!std::equal(resident[id].begin(), resident[id].end(), m.pairs[id].new_bytes.begin()))
      return false;
  return true;
}

}  // namespace

TEST_CASE("diff_tensors: the same payloads on one thread, on two, and on reuse") {
  const model m(0.02);
  for (std::size_t per_payload : {std::size_t{1} << 21, std::size_t{700}, std::size_t{1}}) {
    CAPTURE(per_payload);
    diff_options one;
    one.payload_records = per_payload;
    one.worker_thread = false;
    diff_options two = one;
    two.worker_thread = true;
    checkpoint_differ inline_differ(one), threaded(two);
    const auto a = run(inline_differ, m);
    const auto b = run(threaded, m);
    const auto c = run(threaded, m);  // reused: warm buffers, the same bytes
    REQUIRE(a.payloads.size() == b.payloads.size());
    CHECK(a.payloads == b.payloads);
    CHECK(b.payloads == c.payloads);
    CHECK(a.report.changed_elements == m.changed);
    CHECK(b.report.changed_elements == m.changed);
    CHECK(b.report.payloads == b.payloads.size());
    CHECK(b.report.items == a.report.items);
    CHECK(b.report.items_by_encoding == a.report.items_by_encoding);
    CHECK(b.report.records_by_encoding == a.report.records_by_encoding);
    CHECK(b.report.tensors == specs.size());
    if (per_payload == 1) CHECK(b.payloads.size() > 10);  // many payloads through two slots
    CHECK(reproduces_new(m, b.payloads));
    for (std::size_t id = 0; id < m.registry.size(); ++id) {
      CHECK(b.digests[id].old_digest == digest_of(m.pairs[id].old_bytes));
      CHECK(b.digests[id].new_digest == digest_of(m.pairs[id].new_bytes));
      CHECK(a.digests[id].new_digest == b.digests[id].new_digest);
    }
  }
}

TEST_CASE("diff_tensors without digests, and a delta file of the same checkpoints, agree") {
  const model m(0.05);
  checkpoint_differ differ;
  collected in_memory;
  in_memory.report = differ.diff_tensors(
      m.registry, m.pairs,
      [&](std::span<const std::byte> p) { in_memory.payloads.emplace_back(p.begin(), p.end()); });
  CHECK(in_memory.report.changed_elements == m.changed);

  io_test::scratch_dir dir;
  const auto write = [&](const std::filesystem::path& path, bool is_new) {
    std::vector<safetensors_tensor> ts;
    for (std::size_t id = 0; id < m.registry.size(); ++id) {
      const auto& t = m.registry.tensors()[id];
      ts.push_back({t.name, t.type, t.shape, is_new ? m.pairs[id].new_bytes : m.pairs[id].old_bytes});
    }
    write_safetensors(path, ts, safetensors_metadata{{"format", "pt"}});
  };
  write(dir / "old.safetensors", false);
  write(dir / "new.safetensors", true);
  const auto r = diff_checkpoints(dir / "old.safetensors", dir / "new.safetensors",
                                  dir / "d.dcrdelta");
  CHECK(r.changed_elements == m.changed);
  const auto d = delta_file::open(dir / "d.dcrdelta");
  REQUIRE(d.payload_count() == in_memory.payloads.size());
  for (std::size_t i = 0; i < d.payload_count(); ++i) {
    const auto p = d.payload(i);
    CHECK(std::vector<std::byte>(p.begin(), p.end()) == in_memory.payloads[i]);
  }
}

TEST_CASE("an error of the payload sink reaches the caller and the differ stays usable") {
  const model m(0.02);
  for (bool worker : {true, false}) {
    CAPTURE(worker);
    diff_options o;
    o.payload_records = 500;
    o.worker_thread = worker;
    checkpoint_differ differ(o);
    int calls = 0;
    const auto thrown = io_test::thrown_error([&] {
      (void)differ.diff_tensors(m.registry, m.pairs, [&](std::span<const std::byte>) {
        if (++calls == 2) throw dcr::error(errc::io_error, "disk full (test)");
      });
    });
    CHECK(thrown.dcr_code() == errc::io_error);
    CHECK(std::string(thrown.what()).find("disk full (test)") != std::string::npos);
    CHECK(calls == 2);  // nothing was encoded or handed over after the failure
    const auto again = run(differ, m);
    CHECK(again.report.changed_elements == m.changed);
    CHECK(reproduces_new(m, again.payloads));
  }
}

TEST_CASE("diff_tensors refuses mismatched arguments before producing anything") {
  const model m(0.02);
  checkpoint_differ differ;
  int calls = 0;
  const auto sink = [&](std::span<const std::byte>) { ++calls; };
  std::vector<tensor_pair> fewer(m.pairs.begin(), m.pairs.end() - 1);
  CHECK(io_test::thrown_error([&] { (void)differ.diff_tensors(m.registry, fewer, sink); }).dcr_code() ==
        errc::invalid_argument);
  std::vector<tensor_pair> short_one = m.pairs;
  short_one.back().new_bytes = short_one.back().new_bytes.first(short_one.back().new_bytes.size() - 2);
  const auto e = io_test::thrown_error([&] { (void)differ.diff_tensors(m.registry, short_one, sink); });
  CHECK(e.dcr_code() == errc::shape_mismatch);
  CHECK(std::string(e.what()).find(m.registry.tensors().back().name) != std::string::npos);
  std::vector<tensor_digests> too_few(1);
  CHECK(io_test::thrown_error([&] {
          (void)differ.diff_tensors(m.registry, m.pairs, sink, too_few);
        }).dcr_code() == errc::invalid_argument);
  CHECK(calls == 0);
}
