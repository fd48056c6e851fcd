// tests/packaging/consumer/umbrella.cpp: dcr/dcr.hpp and dcr/io/ through the io part's flags.
#include "dcr/dcr.hpp"
#include "dcr/io/safetensors.hpp"

#if defined(DCR_CONSUMER_EXPECT_CXX23) && __cplusplus <= 202002L
#error "the consumer asked for C++23 but compiles as C++20 or older: something forced -std"
#endif

int main() { return dcr::version_major == DCR_VERSION_MAJOR ? 0 : 1; }
