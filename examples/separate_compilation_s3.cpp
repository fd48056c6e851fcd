// examples/separate_compilation_s3.cpp: the S3 payload store's bodies
// (dcr/protocol/store/s3_payload_store.hpp) compiled once, for a program built with
// DCR_SEPARATE_COMPILATION and DCR_SEPARATE_NETWORK (dcr/config.hpp). One unit per networked
// header, so that a program links only the clients it uses; dcr's own build makes each a static
// library beside dcr_core (meson.build).
#define DCR_SEPARATE_LIBRARY_PART DCR_PART_NETWORK
#include "dcr/separate_compilation.hpp"
#include "dcr/protocol/store/s3_payload_store.hpp"
