// tests/io/interop.cpp: the C++ half of the reference-implementation interop test
// (tests/io/reference_files.py).
//
//   interop check FILE EXPECTED.json   reads FILE with dcr's reader; exit 0 only if its tensors
//                                      (names, dtypes, shapes, bytes) and metadata are exactly
//                                      those EXPECTED.json lists
//   interop write FILE EXPECTED.json   writes FILE with dcr's writer (every dtype, a scalar, an
//                                      empty tensor, metadata) and EXPECTED.json describing it
//   interop rewrite IN OUT             reads IN and writes its tensors (in IN's offset order)
//                                      and metadata to OUT with dcr's writer
//
// EXPECTED.json: {"metadata": {...} | null,
//                 "tensors": {name: {"dtype": "BF16", "shape": [..], "hex": "0a1b.."}}}
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "dcr/io/safetensors.hpp"

namespace {

std::string to_hex(std::span<const std::byte> b) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  for (auto x : b) {
    s += digits[std::to_integer<int>(x) >> 4];
    s += digits[std::to_integer<int>(x) & 15];
  }
  return s;
}

int fail(const std::string& why) {
  std::fprintf(stderr, "interop: %s\n", why.c_str());
  return 1;
}

int check(const std::string& file, const std::string& expected_path) {
  std::ifstream in(expected_path);
  const auto expected = nlohmann::json::parse(in);
  const auto f = dcr::io::safetensors_file::open(file);
  const auto& want = expected.at("tensors");
  if (f.tensors().size() != want.size())
    return fail(file + ": " + std::to_string(f.tensors().size()) + " tensors, expected " +
                std::to_string(want.size()));
  for (auto it = want.begin(); it != want.end(); ++it) {
    const auto* e = f.find(it.key());
    if (e == nullptr) return fail(file + ": tensor '" + it.key() + "' missing");
    if (std::string(dcr::dtype_name(e->type)) != it.value().at("dtype").get<std::string>())
      return fail(file + ": tensor '" + it.key() + "' has dtype " +
                  std::string(dcr::dtype_name(e->type)));
    if (e->shape != it.value().at("shape").get<std::vector<std::int64_t>>())
      return fail(file + ": tensor '" + it.key() + "' has another shape");
    if (to_hex(f.data(*e)) != it.value().at("hex").get<std::string>())
      return fail(file + ": tensor '" + it.key() + "' has other bytes");
  }
  const auto& meta = expected.at("metadata");
  if (meta.is_null() != !f.metadata().has_value()) return fail(file + ": metadata presence");
  if (!meta.is_null() && meta.get<dcr::io::safetensors_metadata>() != *f.metadata())
    return fail(file + ": metadata differs");
  std::printf("interop: %s: %zu tensors read bit-exact\n", file.c_str(), f.tensors().size());
  return 0;
}

int write(const std::string& file, const std::string& expected_path) {
  using dcr::dtype;
  const dtype all[] = {dtype::boolean, dtype::u8,  dtype::i8,  dtype::f8_e5m2, dtype::f8_e4m3,
                       dtype::i16,     dtype::u16, dtype::f16, dtype::bf16,    dtype::i32,
                       dtype::u32,     dtype::f32, dtype::f64, dtype::i64,     dtype::u64};
  std::mt19937_64 rng(2024);
  std::vector<std::vector<std::byte>> data;
  std::vector<dcr::io::safetensors_tensor> tensors;
  data.reserve(32);
  for (dtype t : all) {
    const std::vector<std::int64_t> shape = {3, 7};
    std::vector<std::byte> d(21 * dcr::dtype_size(t));
    for (auto& b : d) b = static_cast<std::byte>(t == dtype::boolean ? rng() & 1 : rng());
    data.push_back(std::move(d));
    tensors.push_back({"ours." + std::string(dcr::dtype_name(t)), t, shape, data.back()});
  }
  data.emplace_back(4);
  for (auto& b : data.back()) b = static_cast<std::byte>(rng());
  tensors.push_back({"ours.scalar", dtype::f32, {}, data.back()});
  data.emplace_back();
  tensors.push_back({"ours.empty", dtype::bf16, {0, 5}, data.back()});
  const dcr::io::safetensors_metadata metadata = {{"format", "pt"}, {"writer", "dcr"}};
  dcr::io::write_safetensors(file, tensors, metadata);

  nlohmann::json expected;
  expected["metadata"] = metadata;
  expected["tensors"] = nlohmann::json::object();
  for (const auto& t : tensors)
    expected["tensors"][t.name] = {{"dtype", std::string(dcr::dtype_name(t.type))},
                                   {"shape", t.shape},
                                   {"hex", to_hex(t.data)}};
  std::ofstream(expected_path) << expected.dump(1);
  return 0;
}

int rewrite(const std::string& in, const std::string& out) {
  const auto f = dcr::io::safetensors_file::open(in);
  std::vector<dcr::io::safetensors_tensor> tensors;
  for (const auto& e : f.tensors()) tensors.push_back({e.name, e.type, e.shape, f.data(e)});
  dcr::io::write_safetensors(out, tensors, f.metadata());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: interop check|write FILE EXPECTED.json | interop rewrite IN OUT\n");
    return 2;
  }
  try {
    const std::string mode = argv[1];
    if (mode == "check") return check(argv[2], argv[3]);
    if (mode == "write") return write(argv[2], argv[3]);
    if (mode == "rewrite") return rewrite(argv[2], argv[3]);
    return fail("unknown mode " + mode);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
