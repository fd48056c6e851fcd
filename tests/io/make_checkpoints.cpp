// tests/io/make_checkpoints.cpp: writes a pair of safetensors checkpoints for the tool tests,
// shaped like one optimizer step of a small model.
//
//   make_checkpoints DIR [--elements N] [--rate R] [--seed S]
//
// DIR/old.safetensors   BF16 weight matrices drawn from N(0, 0.02) plus one tensor of every
//                       other dtype (F32 norms, F16, F64, FP8, integers, BOOL, a scalar, an
//                       empty tensor), metadata {"format": "pt", "step": "0001"}
// DIR/new.safetensors   the same with a share R of every tensor's elements updated the way the
//                       paper's stress protocol does (x * (1 + 0.01 z), rounded to the dtype;
//                       integers +-1, BOOL toggled, FP8 nudged one code), "step": "0002"
// DIR/other.safetensors old.safetensors with one element of one tensor changed: a wrong base
// Prints the number of changed elements.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "dcr/dtype.hpp"
#include "dcr/io/safetensors.hpp"

namespace {

struct tensor {
  std::string name;
  dcr::dtype type;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;
};

template <class W>
W load(const std::byte* p) {
  W w;
  std::memcpy(&w, p, sizeof(W));
  return w;
}
template <class W>
void store(std::byte* p, W w) {
  std::memcpy(p, &w, sizeof(W));
}

std::uint64_t numel(const std::vector<std::int64_t>& s) {
  std::uint64_t n = 1;
  for (auto e : s) n *= static_cast<std::uint64_t>(e);
  return n;
}

// Fills a tensor with plausible initial values for its dtype.
void fill(tensor& t, std::mt19937_64& rng) {
  const std::size_t n = numel(t.shape);
  const std::size_t w = dcr::dtype_size(t.type);
  t.data.resize(n * w);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (std::size_t i = 0; i < n; ++i) {
    std::byte* p = t.data.data() + i * w;
    switch (t.type) {
      case dcr::dtype::bf16: store(p, dcr::float_to_bf16(normal(rng))); break;
      case dcr::dtype::f16: store(p, dcr::float_to_f16(normal(rng))); break;
      case dcr::dtype::f32: store(p, 1.0f + normal(rng)); break;
      case dcr::dtype::f64: store(p, static_cast<double>(normal(rng))); break;
      case dcr::dtype::boolean: store(p, static_cast<std::uint8_t>(rng() & 1)); break;
      default: {
        const std::uint64_t r = rng();
        std::memcpy(p, &r, w);
      }
    }
  }
}

// Updates about `rate` of the elements; returns how many words changed.
std::uint64_t update(tensor& t, double rate, std::mt19937_64& rng) {
  const std::size_t n = numel(t.shape);
  const std::size_t w = dcr::dtype_size(t.type);
  std::bernoulli_distribution pick(rate);
  std::normal_distribution<float> z(0.0f, 1.0f);
  std::uint64_t changed = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!pick(rng)) continue;
    std::byte* p = t.data.data() + i * w;
    std::vector<std::byte> before(p, p + w);
    const float scale = 1.0f + 0.01f * z(rng);
    switch (t.type) {
      case dcr::dtype::bf16:
        store(p, dcr::float_to_bf16(dcr::bf16_to_float(load<std::uint16_t>(p)) * scale));
        break;
      case dcr::dtype::f16:
        store(p, dcr::float_to_f16(dcr::f16_to_float(load<std::uint16_t>(p)) * scale));
        break;
      case dcr::dtype::f32: store(p, load<float>(p) * scale); break;
      case dcr::dtype::f64: store(p, load<double>(p) * scale); break;
      case dcr::dtype::boolean: store(p, static_cast<std::uint8_t>(load<std::uint8_t>(p) ^ 1)); break;
      case dcr::dtype::f8_e4m3:
      case dcr::dtype::f8_e5m2:
        store(p, static_cast<std::uint8_t>(load<std::uint8_t>(p) ^ 1));
        break;
      default: p[0] ^= std::byte{1}; break;  // integers: +-1 in the low byte
    }
    changed += std::memcmp(before.data(), p, w) != 0 ? 1 : 0;
  }
  return changed;
}

void write(const std::filesystem::path& path, const std::vector<tensor>& tensors,
           const std::string& step) {
  std::vector<dcr::io::safetensors_tensor> t;
  for (const auto& x : tensors) t.push_back({x.name, x.type, x.shape, x.data});
  dcr::io::write_safetensors(path, t, dcr::io::safetensors_metadata{{"format", "pt"}, {"step", step}});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: make_checkpoints DIR [--elements N] [--rate R] [--seed S]\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::uint64_t elements = 1 << 20;
  double rate = 0.01;
  std::uint64_t seed = 1;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--elements") elements = std::stoull(argv[i + 1]);
    else if (flag == "--rate") rate = std::stod(argv[i + 1]);
    else if (flag == "--seed") seed = std::stoull(argv[i + 1]);
    else {
      std::fprintf(stderr, "make_checkpoints: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  std::filesystem::create_directories(dir);
  const auto cols = static_cast<std::int64_t>(256);
  const auto rows = static_cast<std::int64_t>(std::max<std::uint64_t>(1, elements / 4 / cols));
  std::vector<tensor> model = {
      {"model.layers.0.self_attn.qkv_proj.weight", dcr::dtype::bf16, {rows, cols}, {}},
      {"model.layers.0.mlp.down_proj.weight", dcr::dtype::bf16, {cols, rows}, {}},
      {"model.layers.1.self_attn.qkv_proj.weight", dcr::dtype::bf16, {rows, cols}, {}},
      {"model.layers.1.mlp.down_proj.weight", dcr::dtype::bf16, {cols, rows + 1}, {}},
      {"model.norm.weight", dcr::dtype::f32, {cols}, {}},
      {"model.embed_scale", dcr::dtype::f16, {cols * 3}, {}},
      {"model.rope.inv_freq", dcr::dtype::f64, {65}, {}},
      {"model.layers.0.fp8_e4m3", dcr::dtype::f8_e4m3, {1001}, {}},
      {"model.layers.0.fp8_e5m2", dcr::dtype::f8_e5m2, {333}, {}},
      {"model.mask", dcr::dtype::boolean, {77}, {}},
      {"model.token_ids", dcr::dtype::i64, {40}, {}},
      {"model.counts", dcr::dtype::u64, {9}, {}},
      {"model.i32", dcr::dtype::i32, {31}, {}},
      {"model.u32", dcr::dtype::u32, {33}, {}},
      {"model.i16", dcr::dtype::i16, {35}, {}},
      {"model.u16", dcr::dtype::u16, {37}, {}},
      {"model.i8", dcr::dtype::i8, {39}, {}},
      {"model.u8", dcr::dtype::u8, {41}, {}},
      {"model.temperature", dcr::dtype::f32, {}, {}},
      {"model.unused", dcr::dtype::bf16, {0, 16}, {}},
  };
  std::mt19937_64 rng(seed);
  for (auto& t : model) fill(t, rng);
  write(dir / "old.safetensors", model, "0001");
  auto other = model;
  other[4].data[1] ^= std::byte{1};
  write(dir / "other.safetensors", other, "0001");
  std::uint64_t changed = 0;
  for (auto& t : model) changed += update(t, rate, rng);
  write(dir / "new.safetensors", model, "0002");
  std::printf("%llu\n", static_cast<unsigned long long>(changed));
  return 0;
}
