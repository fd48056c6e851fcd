// dcr/dcr.hpp: the umbrella header. Everything host-side of dcr: core types, mapping classes,
// detection, codec, receiver apply, transports, commit stores and the refit protocol.
// Never pulls in CUDA, fmt or DLPack (include dcr/dlpack.hpp and kernels/dcr/kernels/*.cuh
// explicitly where wanted).
#pragma once

#include "dcr/config.hpp"
#include "dcr/error.hpp"
#include "dcr/dtype.hpp"
#include "dcr/tensor_view.hpp"
#include "dcr/canonical.hpp"
#include "dcr/mapping.hpp"
#include "dcr/detect/detect.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/apply/loader.hpp"
#include "dcr/apply/sink.hpp"
#include "dcr/apply/apply.hpp"
#include "dcr/apply/dedupe.hpp"
#include "dcr/transport/concept.hpp"
#include "dcr/transport/memory.hpp"
#include "dcr/commit/concept.hpp"
#include "dcr/commit/memory.hpp"
#include "dcr/refit/task.hpp"
#include "dcr/refit/ownership.hpp"
#include "dcr/refit/owner.hpp"
#include "dcr/refit/receiver.hpp"
#include "dcr/refit/coordinator.hpp"
