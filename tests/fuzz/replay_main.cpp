// tests/fuzz/replay_main.cpp: a main for the payload fuzz target built without libFuzzer (any
// compiler): runs the generated seed corpus and the given files or directories through
// LLVMFuzzerTestOneInput once each. A violated property aborts, as under libFuzzer.
//
// Usage: fuzz_payload_replay [--seeds] [--if-present DIR] [FILE|DIR]...
//   --seeds            also run every seed of tests/fuzz/seeds.hpp (generated in memory)
//   --if-present DIR   every regular file in DIR, if DIR exists (tests/fuzz/regressions/)
//   DIR                every regular file in it (a missing directory is an error)
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "seeds.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {
void run_file(const std::filesystem::path& p, std::size_t& runs) {
  std::ifstream in(p, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::printf("replay: %s (%zu bytes)\n", p.string().c_str(), bytes.size());
  std::fflush(stdout);
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  ++runs;
}
}  // namespace

int main(int argc, char** argv) {
  std::size_t runs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--seeds") {
      for (const auto& s : dcr_fuzz::seed_inputs()) {
        LLVMFuzzerTestOneInput(s.bytes.data(), s.bytes.size());
        ++runs;
      }
      continue;
    }
    if (arg == "--if-present") {
      if (i + 1 == argc) {
        std::fprintf(stderr, "replay: --if-present needs a directory\n");
        return 2;
      }
      const std::filesystem::path dir(argv[++i]);
      if (std::filesystem::is_directory(dir))
        for (const auto& e : std::filesystem::directory_iterator(dir))
          if (e.is_regular_file()) run_file(e.path(), runs);
      continue;
    }
    const std::filesystem::path p(arg);
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::directory_iterator(p))
        if (e.is_regular_file()) run_file(e.path(), runs);
    } else if (std::filesystem::is_regular_file(p)) {
      run_file(p, runs);
    } else {
      std::fprintf(stderr, "replay: no such file or directory: %s\n", argv[i]);
      return 2;
    }
  }
  std::printf("replay: %zu inputs, all properties held\n", runs);
  return 0;
}
