// examples/checkpoint_io.cpp: diff and apply whole safetensors checkpoints through the library.
//
// What `dcr diff` and `dcr apply` do, called from a program (dcr/io/checkpoint.hpp; needs
// nlohmann-json): write two checkpoints, diff them into a delta file, apply the delta to a copy
// of the old checkpoint (to a new file, then in place), and check that each result equals the
// new checkpoint byte for byte. Then the refusals: the delta applied to the wrong base, and a
// delta with one damaged byte, both refused with nothing created. Exits non-zero otherwise.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "dcr/dtype.hpp"
#include "dcr/io/checkpoint.hpp"
#include "dcr/io/safetensors.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<char> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  return ok;
}

// A checkpoint: two BF16 matrices and an FP32 norm.
struct checkpoint {
  std::vector<std::uint16_t> embed = std::vector<std::uint16_t>(64 * 16), proj = std::vector<std::uint16_t>(16 * 16);
  std::vector<float> norm = std::vector<float>(16);

  void write(const fs::path& path) const {
    const dcr::io::safetensors_tensor tensors[] = {
        {"model.embed_tokens.weight", dcr::dtype::bf16, {64, 16}, std::as_bytes(std::span(embed))},
        {"model.layers.0.o_proj.weight", dcr::dtype::bf16, {16, 16}, std::as_bytes(std::span(proj))},
        {"model.norm.weight", dcr::dtype::f32, {16}, std::as_bytes(std::span(norm))},
    };
    dcr::io::write_safetensors(path, tensors, dcr::io::safetensors_metadata{{"format", "pt"}});
  }
};

}  // namespace

int main() {
  std::string dir_template = (fs::temp_directory_path() / "dcr-checkpoint-io-XXXXXX").string();
  if (mkdtemp(dir_template.data()) == nullptr) return 1;
  const fs::path dir = dir_template;
  bool ok = true;
  try {
    checkpoint old_ckpt;
    for (std::size_t j = 0; j < old_ckpt.embed.size(); ++j)
      old_ckpt.embed[j] = dcr::float_to_bf16(std::sin(0.1f * static_cast<float>(j)));
    for (std::size_t j = 0; j < old_ckpt.proj.size(); ++j)
      old_ckpt.proj[j] = dcr::float_to_bf16(0.01f * static_cast<float>(j));
    for (std::size_t j = 0; j < old_ckpt.norm.size(); ++j) old_ckpt.norm[j] = 1.0f;

    // One optimizer step: a few elements change; +0 -> -0 and a NaN payload count as changes.
    checkpoint new_ckpt = old_ckpt;
    new_ckpt.embed[3] = dcr::float_to_bf16(0.5f);
    new_ckpt.embed[900] ^= 0x0001;
    new_ckpt.proj[0] ^= 0x8000;  // proj[0] is +0: now -0
    std::uint32_t nan_bits = 0x7fc00001;
    std::memcpy(&new_ckpt.norm[7], &nan_bits, 4);

    const auto old_path = dir / "old.safetensors", new_path = dir / "new.safetensors";
    const auto delta_path = dir / "step.dcrdelta", out_path = dir / "out.safetensors";
    old_ckpt.write(old_path);
    new_ckpt.write(new_path);

    // diff
    const auto d = dcr::io::diff_checkpoints(old_path, new_path, delta_path);
    std::printf("      diff: %llu of %llu element(s) changed, delta %llu bytes, checkpoint %llu bytes\n",
                static_cast<unsigned long long>(d.changed_elements),
                static_cast<unsigned long long>(d.elements),
                static_cast<unsigned long long>(d.delta_bytes),
                static_cast<unsigned long long>(d.checkpoint_bytes));
    ok &= check(d.changed_elements == 4 && d.changed_tensors == 3,
                "diff finds the 4 changed elements, signed zero and NaN payload included");

    // apply to a new file
    dcr::io::apply_delta(delta_path, old_path, out_path);
    ok &= check(read_all(out_path) == read_all(new_path), "apply -o: OUT equals NEW byte for byte");

    // apply in place (journaled: a crash leaves BASE old or new, dcr::io::recover_in_place)
    const auto serving = dir / "serving.safetensors";
    fs::copy_file(old_path, serving);
    dcr::io::apply_delta_in_place(delta_path, serving);
    ok &= check(read_all(serving) == read_all(new_path), "apply --in-place: BASE equals NEW");

    // refusals: nothing is created
    auto refused = [&](const fs::path& delta, const fs::path& base, const char* what) {
      const auto out = dir / "refused.safetensors";
      try {
        dcr::io::apply_delta(delta, base, out);
      } catch (const dcr::error& e) {
        std::printf("      %s\n", e.what());
        return check(!fs::exists(out), std::string(what) + " is refused, nothing created");
      }
      return check(false, std::string(what) + " is refused");
    };
    ok &= refused(delta_path, new_path, "the delta applied to the wrong base");
    auto damaged = read_all(delta_path);
    damaged[damaged.size() - 40] ^= 0x10;
    const auto damaged_path = dir / "damaged.dcrdelta";
    std::ofstream(damaged_path, std::ios::binary).write(damaged.data(), static_cast<std::streamsize>(damaged.size()));
    ok &= refused(damaged_path, old_path, "a delta with one damaged byte");
  } catch (const dcr::error& e) {
    std::printf("FAIL: %s\n", e.what());
    ok = false;
  }
  fs::remove_all(dir);
  std::printf("%s\n", ok ? "all checks hold" : "SOME CHECKS FAILED");
  return ok ? 0 : 1;
}
