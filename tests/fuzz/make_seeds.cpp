// tests/fuzz/make_seeds.cpp: writes the payload fuzz target's seed corpus (tests/fuzz/seeds.hpp)
// into a directory, one file per seed, for libFuzzer to start from.
//
// Usage: make_seeds DIR   (DIR must exist; files in it with a seed's name are overwritten)
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

#include "seeds.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  try {
    const auto seeds = dcr_fuzz::seed_inputs();
    for (const auto& s : seeds) {
      const std::string path = std::string(argv[1]) + "/" + s.name;
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(s.bytes.data()),
                static_cast<std::streamsize>(s.bytes.size()));
      if (!out) {
        std::fprintf(stderr, "make_seeds: cannot write %s\n", path.c_str());
        return 1;
      }
    }
    std::printf("make_seeds: wrote %zu seeds to %s\n", seeds.size(), argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
