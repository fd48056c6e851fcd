// tests/io/test_sharded_checkpoint.cpp: sharded checkpoints in the library: a round trip, and the
// all-or-nothing promise of the in-place apply of a directory when one shard's result does not
// verify (every shard undone). The command-line scenarios (crashes at every step, refusals,
// links, the lock) are in tests/tool/checkpoint_tool.py.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dcr/io/sharded_checkpoint.hpp"
#include "io_test_util.hpp"

using namespace dcr;
using namespace dcr::io;
using io_test::read_file;
using io_test::scratch_dir;

namespace {

constexpr const char* index_name = "model.safetensors.index.json";

std::string shard_name(int i) { return "model-0000" + std::to_string(i + 1) + "-of-00003.safetensors"; }

// Writes a sharded checkpoint of three shards of two BF16 tensors each into `dir`; `version`
// changes about one element in eight of every tensor.
void write_checkpoint(const std::filesystem::path& dir, int version) {
  std::filesystem::create_directories(dir);
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", 0}};
  auto& map = index["weight_map"];
  for (int s = 0; s < 3; ++s) {
    std::vector<std::vector<std::byte>> data;
    std::vector<safetensors_tensor> tensors;
    for (int t = 0; t < 2; ++t) {
      auto bytes = io_test::random_bytes(2 * 512, static_cast<std::uint64_t>(s * 10 + t));
      for (std::size_t i = 0; i < bytes.size(); i += 16)
        if (version > 0) bytes[i] ^= std::byte{static_cast<unsigned char>(version)};
      data.push_back(std::move(bytes));
    }
    for (int t = 0; t < 2; ++t) {
      const std::string name = "layers." + std::to_string(s) + ".w" + std::to_string(t);
      tensors.push_back({name, dtype::bf16, {16, 32}, data[static_cast<std::size_t>(t)]});
      map[name] = shard_name(s);
    }
    write_safetensors(dir / shard_name(s), tensors);
  }
  const std::string text = index.dump(2);
  io_test::write_file(dir / index_name, std::as_bytes(std::span<const char>(text)));
}

bool same_files(const std::filesystem::path& a, const std::filesystem::path& b) {
  for (int s = 0; s < 3; ++s)
    if (read_file(a / shard_name(s)) != read_file(b / shard_name(s))) return false;
  return read_file(a / index_name) == read_file(b / index_name);
}

}  // namespace

TEST_CASE("sharded: diff, apply to a new directory and in place reproduce NEW") {
  scratch_dir dir;
  write_checkpoint(dir / "old", 0);
  write_checkpoint(dir / "new", 1);
  const auto d = diff_sharded_checkpoints(dir / "old", dir / "new", dir / "step.dcrdelta");
  CHECK(d.tensors == 6);
  CHECK(d.changed_tensors == 6);
  const auto delta = sharded_delta_file::open(dir / "step.dcrdelta");
  REQUIRE(delta.shards().size() == 3);
  CHECK(delta.shards()[0].file == shard_name(0));
  (void)apply_sharded_delta(dir / "step.dcrdelta", dir / "old", dir / "out");
  CHECK(same_files(dir / "out", dir / "new"));
  std::filesystem::copy(dir / "old", dir / "base");
  const auto r = apply_sharded_delta_in_place(dir / "step.dcrdelta", dir / "base");
  CHECK(r.records == d.changed_elements);
  CHECK(same_files(dir / "base", dir / "new"));
  CHECK(apply_sharded_delta_in_place(dir / "step.dcrdelta", dir / "base").already_applied);
}

TEST_CASE("sharded: a shard whose result does not verify undoes every shard") {
  scratch_dir dir;
  write_checkpoint(dir / "old", 0);
  write_checkpoint(dir / "new", 1);
  (void)diff_sharded_checkpoints(dir / "old", dir / "new", dir / "good.dcrdelta");

  // The same delta, but the last shard's delta claims another result digest: it is well formed
  // (its own checksums hold), so only the result verification can catch it, after the first two
  // shards were rolled forward.
  auto good = sharded_delta_file::open(dir / "good.dcrdelta");
  auto& last = good.shards().back();
  {
    const auto base_shard = safetensors_file::open(dir / "old" / last.file);
    last.delta.bind_base(base_shard.header(), base_shard.header_json(), "the last base shard");
    delta_writer w(dir / "last.dcrdelta", container_kind::delta, last.delta.registry(),
                   last.delta.target_header_json(), base_shard.header_json());
    auto result = last.delta.result_digest();
    result.bytes[0] ^= 1;
    w.set_digests(last.delta.base_digest(), result);
    for (std::size_t i = 0; i < last.delta.payload_count(); ++i)
      w.append_payload(last.delta.payload(i));
    (void)w.commit();
  }
  std::vector<std::vector<std::byte>> parts;
  for (std::size_t s = 0; s + 1 < good.shards().size(); ++s) {
    const auto b = good.shards()[s].delta.bytes();
    parts.emplace_back(b.begin(), b.end());
  }
  parts.push_back(read_file(dir / "last.dcrdelta"));
  nlohmann::ordered_json manifest;
  manifest["version"] = 1;
  manifest["index"] = good.index_name();
  manifest["result_index"] = good.result_index();
  // Offsets with a fixed-width manifest: pad the JSON text with spaces (JSON allows them).
  const std::size_t manifest_size = 4096;
  std::uint64_t offset = 16 + manifest_size;
  manifest["shards"] = nlohmann::ordered_json::array();
  for (std::size_t s = 0; s < parts.size(); ++s) {
    manifest["shards"].push_back(
        {{"file", good.shards()[s].file}, {"offset", offset}, {"bytes", parts[s].size()}});
    offset += parts[s].size();
  }
  std::string text = manifest.dump();
  REQUIRE(text.size() <= manifest_size);
  text.append(manifest_size - text.size(), ' ');
  std::vector<std::byte> bad(16);
  std::memcpy(bad.data(), "DCRSHARD", 8);
  dcr::detail::store_le<std::uint64_t>(bad.data() + 8, manifest_size);
  bad.insert(bad.end(), reinterpret_cast<const std::byte*>(text.data()),
             reinterpret_cast<const std::byte*>(text.data()) + text.size());
  for (const auto& p : parts) bad.insert(bad.end(), p.begin(), p.end());
  const auto digest = digest_of(bad);
  for (auto b : digest.bytes) bad.push_back(static_cast<std::byte>(b));
  io_test::write_file(dir / "bad.dcrdelta", bad);

  std::filesystem::copy(dir / "old", dir / "base");
  const auto e = io_test::thrown_error(
      [&] { (void)apply_sharded_delta_in_place(dir / "bad.dcrdelta", dir / "base"); });
  CHECK(e.dcr_code() == errc::verification_failed);
  CHECK(std::string(e.what()).find("every shard") != std::string::npos);
  CHECK(same_files(dir / "base", dir / "old"));
  std::vector<std::string> names;
  for (const auto& f : std::filesystem::directory_iterator(dir / "base"))
    names.push_back(f.path().filename().string());
  CHECK(names.size() == 4);  // the index and the shards; no journal, no working file
  CHECK(!recover_sharded_in_place(dir / "base").journal_found);
  // The good delta still applies.
  (void)apply_sharded_delta_in_place(dir / "good.dcrdelta", dir / "base");
  CHECK(same_files(dir / "base", dir / "new"));
}

TEST_CASE("sharded: the progress of apply, in-place apply and recovery counts every shard") {
  scratch_dir dir;
  write_checkpoint(dir / "old", 0);
  write_checkpoint(dir / "new", 1);
  (void)diff_sharded_checkpoints(dir / "old", dir / "new", dir / "step.dcrdelta");
  // Per shard: two tensors of 512 BF16 elements, one element in eight changed.
  constexpr std::uint64_t t = 2 * 1024;
  constexpr std::uint64_t r = 2 * 64 * 2;
  {
    io_test::progress_calls p;
    (void)apply_sharded_delta(dir / "step.dcrdelta", dir / "old", dir / "out",
                              apply_options{.progress = p.callback()});
    p.check(3 * (3 * t + r));
    CHECK(same_files(dir / "out", dir / "new"));
  }
  // In place (each shard: digested, journaled, digested again in place, written, verified),
  // then again when every shard holds its result.
  std::filesystem::copy(dir / "old", dir / "base");
  for (const bool again : {false, true}) {
    CAPTURE(again);
    io_test::progress_calls p;
    in_place_options o;
    o.progress = p.callback();
    CHECK(apply_sharded_delta_in_place(dir / "step.dcrdelta", dir / "base", o).already_applied ==
          again);
    p.check(3 * (3 * t + 2 * r));
    CHECK(same_files(dir / "base", dir / "new"));
  }
  // Recovery after a crash half way through the first shard: that shard is hidden (not
  // digested before rolling forward), the other two are still in place.
  std::filesystem::remove_all(dir / "base");
  std::filesystem::copy(dir / "old", dir / "base");
  in_place_options crash;
  crash.crash_at = in_place_step::half_written;
  REQUIRE(io_test::run_in_child([&] {
            (void)apply_sharded_delta_in_place(dir / "step.dcrdelta", dir / "base", crash);
          }) == crash_exit_status);
  io_test::progress_calls p;
  in_place_options o;
  o.progress = p.callback();
  CHECK(recover_sharded_in_place(dir / "base", o).rolled_forward);
  p.check((r + t) + 2 * (2 * t + r));
  CHECK(same_files(dir / "base", dir / "new"));
}
