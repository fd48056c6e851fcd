// examples/dlpack_views.cpp: framework tensors through DLPack, without copies.
//
// Frameworks (PyTorch, JAX, CuPy...) export their tensors as DLPack DLTensors: a data pointer,
// a dtype, a shape, strides in elements and a byte offset. dcr::from_dlpack views one as a
// dcr::tensor_view<W> over the same memory. Here both sides of a refit hold their weights as
// framework tensors:
//   - the trainer's shards: their views give the owner its candidate bytes;
//   - the engine's storage: its loader copies into views of the engine's tensors, one of them a
//     transposed export (strides {1, rows}) and one at a byte offset inside a larger arena.
// After one refit, the engine's memory must equal a dense refit through the same loader, and
// from_dlpack must refuse a tensor of the wrong width or on the wrong device.
#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "dcr/dcr.hpp"
#include "dcr/dlpack.hpp"

namespace {

constexpr std::int64_t rows = 6, cols = 4;

// A stand-in for a framework's tensor: memory it owns and the DLTensor it exports (what
// `torch.utils.dlpack.to_dlpack(t)` hands over, minus the managed-tensor deleter).
struct framework_tensor {
  std::vector<std::uint16_t> memory;
  std::vector<std::int64_t> shape, strides;  // strides empty: compact row-major (DLPack: null)
  std::uint64_t byte_offset = 0;
  DLTensor dl{};

  framework_tensor(std::size_t words, std::vector<std::int64_t> shape_,
                   std::vector<std::int64_t> strides_ = {}, std::uint64_t offset = 0)
      : memory(words), shape(std::move(shape_)), strides(std::move(strides_)), byte_offset(offset) {
    dl.data = memory.data();
    dl.device = {kDLCPU, 0};
    dl.ndim = static_cast<std::int32_t>(shape.size());
    dl.dtype = {kDLBfloat, 16, 1};
    dl.shape = shape.data();
    dl.strides = strides.empty() ? nullptr : strides.data();
    dl.byte_offset = byte_offset;
  }
  framework_tensor(const framework_tensor&) = delete;
};

// The engine keeps `w` transposed in memory ([cols, rows] row-major) and exports the logical
// [rows, cols] view with strides {1, rows}; the norm lives 64 bytes into an arena.
struct engine {
  framework_tensor w{rows * cols, {rows, cols}, {1, rows}};
  framework_tensor norm{32 + cols, {cols}, {}, 64};
};

struct engine_loader {
  using loader_concept = dcr::loader_tag;
  engine* e;

  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor& t, dcr::tensor_view<const W> src, Sink& sink) {
    const DLTensor& dst = t.name == "w" ? e->w.dl : e->norm.dl;
    DCR_EXPECTS(dcr::dtype_of(dst.dtype) == t.type, dcr::errc::dtype_mismatch,
                "engine tensor for '" + t.name + "' has another dtype");
    sink.copy(dcr::from_dlpack<W>(dst), src);  // zero-copy view of the engine's memory
  }
};

// The bytes of a compact framework tensor, through its DLPack view.
std::span<const std::byte> bytes_of(const DLTensor& t) {
  const auto v = dcr::from_dlpack<std::uint16_t>(t);
  DCR_EXPECTS(v.is_contiguous(), dcr::errc::invalid_argument, "a shard must be compact");
  return std::as_bytes(std::span(v.data(), static_cast<std::size_t>(v.size())));
}

bool same_memory(const engine& a, const engine& b) {
  return a.w.memory == b.w.memory && a.norm.memory == b.norm.memory;
}

}  // namespace

int main() {
  const dcr::tensor_registry registry({{"w", dcr::dtype::bf16, {rows, cols}},
                                       {"norm", dcr::dtype::bf16, {cols}}});

  // The trainer's shards, whole tensors here (replicated mappings), as framework tensors.
  framework_tensor w_shard(rows * cols, {rows, cols}), norm_shard(cols, {cols});
  for (std::size_t j = 0; j < w_shard.memory.size(); ++j)
    w_shard.memory[j] = dcr::float_to_bf16(0.1f * static_cast<float>(j));
  for (std::size_t j = 0; j < norm_shard.memory.size(); ++j)
    norm_shard.memory[j] = dcr::float_to_bf16(1.0f);

  std::vector<dcr::affine_task> tasks;
  for (const char* name : {"w", "norm"}) {
    dcr::affine_task task;
    task.shard_name = name;
    task.mapping = dcr::replicated(static_cast<std::uint64_t>(registry.at(registry.id(name)).numel()));
    task.targets = {registry.id(name)};
    tasks.push_back(task);
  }
  dcr::owner owner(registry, 0, tasks);
  std::vector<dcr::owner_binding> bindings{{&owner, {bytes_of(w_shard.dl), bytes_of(norm_shard.dl)}}};
  owner.initialize(bindings[0].candidates);

  auto dense_load = [&](dcr::receiver<engine_loader>& rx) {  // the checkpoint, as views
    using view = dcr::tensor_view<const std::uint16_t>;
    rx.dense_load<std::uint16_t>(registry.id("w"), view(dcr::from_dlpack<std::uint16_t>(w_shard.dl)));
    rx.dense_load<std::uint16_t>(registry.id("norm"),
                                 view(dcr::from_dlpack<std::uint16_t>(norm_shard.dl)));
  };
  engine storage;
  engine_loader loader{&storage};
  dcr::receiver<engine_loader> rx(registry, loader);
  rx.prewarm();
  dense_load(rx);

  bool ok = true;
  // The transposed export reads back the canonical element (2, 3) at memory offset 3 * rows + 2.
  ok &= storage.w.memory[3 * rows + 2] == w_shard.memory[2 * cols + 3];

  // The optimizer writes the trainer's tensors in place; the DLPack views see it.
  w_shard.memory[2 * cols + 3] ^= 0x0040;
  norm_shard.memory[1] ^= 0x8000;
  dcr::receiver_endpoint* receivers[] = {&rx};
  dcr::in_process_refit refit(registry, std::span(bindings), std::span(receivers), 0);
  const auto report = refit.run();

  engine reference;
  engine_loader reference_loader{&reference};
  dcr::receiver<engine_loader> dense(registry, reference_loader);
  dense.prewarm();
  dense_load(dense);
  const bool exact = same_memory(storage, reference);
  std::printf("committed: %s, %llu changed element(s), %s\n", report.committed ? "yes" : "no",
              static_cast<unsigned long long>(report.attempts.back().owners.changed_elements),
              exact ? "engine memory bit-identical to a dense refit" : "DIFFERS from a dense refit");
  ok &= report.committed && exact;
  // Nothing outside the views was written: the arena's words before the norm are still zero.
  for (std::size_t j = 0; j < 32; ++j) ok &= storage.norm.memory[j] == 0;

  // What from_dlpack refuses, naming what differs.
  auto refused = [](auto&& f, dcr::errc expected) {
    try {
      f();
    } catch (const dcr::error& e) {
      std::printf("refused: %s\n", e.what());
      return e.dcr_code() == expected;
    }
    return false;
  };
  ok &= refused([&] { (void)dcr::from_dlpack<std::uint32_t>(w_shard.dl); }, dcr::errc::dtype_mismatch);
  DLTensor on_gpu = w_shard.dl;
  on_gpu.device = {kDLCUDA, 0};
  ok &= refused([&] { (void)dcr::from_dlpack<std::uint16_t>(on_gpu); }, dcr::errc::invalid_argument);

  std::printf("%s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
