// tests/packaging/test_version.cpp: dcr/version.hpp says the version meson.build's project()
// says (the build passes it as DCR_EXPECT_*): bump both together.
#include <cstdio>
#include <cstring>

#include "dcr/version.hpp"

int main() {
  const bool numbers = DCR_VERSION_MAJOR == DCR_EXPECT_MAJOR &&
                       DCR_VERSION_MINOR == DCR_EXPECT_MINOR && DCR_VERSION_PATCH == DCR_EXPECT_PATCH;
  const bool text = std::strcmp(DCR_VERSION_STRING, DCR_EXPECT_VERSION) == 0;
  const bool order = DCR_VERSION == DCR_EXPECT_MAJOR * 10000 + DCR_EXPECT_MINOR * 100 + DCR_EXPECT_PATCH;
  const bool constants = dcr::version_major == DCR_VERSION_MAJOR &&
                         dcr::version_minor == DCR_VERSION_MINOR &&
                         dcr::version_patch == DCR_VERSION_PATCH &&
                         std::strcmp(dcr::version_string, DCR_VERSION_STRING) == 0;
  if (numbers && text && order && constants) {
    std::printf("dcr/version.hpp: %s, as meson.build\n", DCR_VERSION_STRING);
    return 0;
  }
  std::fprintf(stderr,
               "dcr/version.hpp says %d.%d.%d (\"%s\", DCR_VERSION %d) but meson.build's project "
               "version is %s: change both together\n",
               DCR_VERSION_MAJOR, DCR_VERSION_MINOR, DCR_VERSION_PATCH, DCR_VERSION_STRING,
               DCR_VERSION, DCR_EXPECT_VERSION);
  return 1;
}
