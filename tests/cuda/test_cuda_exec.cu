// tests/cuda/test_cuda_exec.cu: the CUDA backend of the exec algorithms gives, bit for bit, what
// the CPU policy gives on the same randomized inputs: detect + compact with a device tracker and
// with a pinned host tracker streamed in chunks (chunk sizes that split the shard unevenly),
// projection for every mapping class, value encodings, byte planes, location skips, tracker
// update (device and pinned host trackers) and the per-record apply through placement records
// (contiguous, transposed, with a gap, through a cast). A plain main(): exit 0 = pass, 1 = fail,
// 77 = skip (no CUDA device), which meson test reports as SKIP.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "dcr/exec/algorithms.hpp"
#include "dcr/kernels/cuda_check.cuh"
#include "dcr/kernels/exec.cuh"
#include "dcr/mapping.hpp"
#include "../random_shard.hpp"
#include "cuda_test.hpp"

namespace {

namespace ex = dcr::exec;

using dcr_test::check;
using dcr_test::make_shard;

template <class T>
std::vector<T> to_host(const T* d, std::size_t n) {
  std::vector<T> h(n);
  if (n != 0) DCR_CUDA_TRY(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

template <class T>
T* to_device(const ex::cuda_policy& policy, ex::device_buffer<T>& buf, const std::vector<T>& h) {
  if (!h.empty())
    DCR_CUDA_TRY(cudaMemcpyAsync(buf.data(), h.data(), h.size() * sizeof(T),
                                 cudaMemcpyHostToDevice, policy.stream));
  DCR_CUDA_TRY(cudaStreamSynchronize(policy.stream));
  return buf.data();
}

using dcr_test::compacted;

template <class W>
void detect_case(const ex::cuda_policy& policy, std::mt19937_64& rng, std::size_t n, double rate) {
  const std::string label = "detect u" + std::to_string(8 * sizeof(W)) + " n=" +
                            std::to_string(n) + " rate=" + std::to_string(rate);
  std::vector<W> tracker, candidate;
  make_shard(rng, n, rate, tracker, candidate);
  const std::uint64_t first = rng() % 100000;
  const auto expected = dcr_test::run_detect(ex::cpu, tracker, candidate, first);
  const std::size_t m = expected.index.size();

  ex::device_buffer<W> d_tracker(policy, n), d_candidate(policy, n), d_old(policy, n),
      d_new(policy, n);
  ex::device_buffer<std::uint64_t> d_index(policy, n);
  to_device(policy, d_tracker, tracker);
  to_device(policy, d_candidate, candidate);
  const ex::changed_words<W> out{d_index.data(), d_old.data(), d_new.data()};

  // Device tracker.
  ex::device_buffer<unsigned char> ws(policy, ex::detect_compact_workspace_bytes<W>(policy, n));
  const std::size_t count = ex::detect_compact(policy, d_tracker.data(), d_candidate.data(), n,
                                               out, ws.as_workspace(), first);
  compacted<W> got{to_host(d_index.data(), count), to_host(d_old.data(), count),
                   to_host(d_new.data(), count)};
  check(count == m, label + ": device tracker count " + std::to_string(count) + " vs " +
                        std::to_string(m));
  check(got == expected, label + ": device tracker records differ from the CPU policy");

  // Pinned host tracker, chunks that split the shard unevenly (and a single chunk).
  W* pinned = nullptr;
  DCR_CUDA_TRY(cudaMallocHost(&pinned, (n != 0 ? n : 1) * sizeof(W)));
  std::copy(tracker.begin(), tracker.end(), pinned);
  for (std::size_t chunk : {std::size_t{1000}, std::size_t{65536}, n + 1}) {
    ex::pinned_tracker_pipeline pipe(chunk);
    ex::device_buffer<unsigned char> pws(policy, pipe.workspace_bytes<W>(policy, n));
    DCR_CUDA_TRY(cudaMemsetAsync(d_index.data(), 0xff, n * sizeof(std::uint64_t), policy.stream));
    const std::size_t pc = ex::wait_count(
        policy, pipe.detect_compact_async(policy, pinned, d_candidate.data(), n, out,
                                          pws.as_workspace(), first));
    compacted<W> pg{to_host(d_index.data(), pc), to_host(d_old.data(), pc),
                    to_host(d_new.data(), pc)};
    check(pg == expected, label + ": pinned tracker (chunk " + std::to_string(chunk) +
                              ") records differ from the CPU policy");
  }

  // Encode helpers over the compacted words.
  for (dcr::encoding enc : {dcr::encoding::overwrite, dcr::encoding::xor_mask, dcr::encoding::ulp}) {
    std::vector<W> host_values(m);
    ex::encode_values(ex::cpu, enc, expected.old_words.data(), expected.new_words.data(), m,
                      host_values.data());
    ex::encode_values(policy, enc, d_old.data(), d_new.data(), m, d_tracker.data());
    DCR_CUDA_TRY(cudaStreamSynchronize(policy.stream));
    check(to_host(d_tracker.data(), m) == host_values, label + ": encoded values differ");
    for (bool zig : {false, true}) {
      std::vector<std::byte> host_planes(m * sizeof(W));
      ex::split_byte_planes(ex::cpu, host_values.data(), m, zig, host_planes.data());
      ex::device_buffer<std::byte> d_planes(policy, m * sizeof(W));
      ex::split_byte_planes(policy, d_tracker.data(), m, zig, d_planes.data());
      DCR_CUDA_TRY(cudaStreamSynchronize(policy.stream));
      check(to_host(d_planes.data(), m * sizeof(W)) == host_planes, label + ": byte planes differ");
    }
  }
  std::vector<std::uint64_t> host_skips(m);
  ex::location_skips(ex::cpu, expected.index.data(), m, host_skips.data());
  ex::device_buffer<std::uint64_t> d_skips(policy, m);
  ex::location_skips(policy, d_index.data(), m, d_skips.data());
  DCR_CUDA_TRY(cudaStreamSynchronize(policy.stream));
  check(to_host(d_skips.data(), m) == host_skips, label + ": skips differ");

  // Tracker update after commit: device tracker and pinned host tracker both become candidate.
  std::vector<std::uint64_t> local(m);
  for (std::size_t k = 0; k < m; ++k) local[k] = expected.index[k] - first;
  ex::device_buffer<std::uint64_t> d_local(policy, m);
  to_device(policy, d_local, local);
  to_device(policy, d_tracker, tracker);
  ex::update_tracker(policy, d_tracker.data(), d_local.data(), d_new.data(), m);
  ex::update_tracker(policy, pinned, d_local.data(), d_new.data(), m);
  DCR_CUDA_TRY(cudaStreamSynchronize(policy.stream));
  check(to_host(d_tracker.data(), n) == candidate, label + ": device tracker update");
  check(std::vector<W>(pinned, pinned + n) == candidate, label + ": pinned tracker update");
  DCR_CUDA_TRY(cudaFreeHost(pinned));
}

template <class M>
void project_case(const ex::cuda_policy& policy, std::mt19937_64& rng, const char* name,
                  const M& mapping) {
  const auto n = static_cast<std::size_t>(mapping.local_size());
  std::vector<std::uint64_t> local;
  for (std::size_t i = 0; i < n; ++i)
    if (rng() % 10 == 0) local.push_back(i);
  const std::size_t m = local.size();
  std::vector<std::uint64_t> index(m);
  std::vector<std::uint32_t> part(m);
  ex::project(ex::cpu, mapping, local.data(), m, index.data(), part.data());
  ex::device_buffer<std::uint64_t> d_local(policy, m), d_index(policy, m);
  ex::device_buffer<std::uint32_t> d_part(policy, m);
  to_device(policy, d_local, local);
  ex::project(policy, mapping, d_local.data(), m, d_index.data(), d_part.data());
  DCR_CUDA_TRY(cudaStreamSynchronize(policy.stream));
  check(to_host(d_index.data(), m) == index, std::string(name) + ": projected indices differ");
  check(to_host(d_part.data(), m) == part, std::string(name) + ": projected parts differ");
}

/// A record of an [rows, cols] canonical tensor stored transposed ([cols, rows]) from `dst`.
dcr::placement transposed_record(std::byte* dst, std::int64_t rows, std::int64_t cols,
                                 std::uint8_t bytes) {
  const std::int64_t stride[] = {cols, 1}, extent[] = {rows, cols}, step[] = {1, rows};
  return dcr::placement::of(dcr::view_inverse::strided(stride, extent, step), 0, dst, bytes);
}

/// Every second column of an [rows, cols] tensor (a strided record with gaps), contiguous dst.
dcr::placement strided_record(std::byte* dst, std::int64_t rows, std::int64_t cols,
                              std::uint8_t bytes) {
  const std::int64_t half = (cols + 1) / 2;
  const std::int64_t stride[] = {cols, 2}, extent[] = {rows, half}, step[] = {half, 1};
  return dcr::placement::of(dcr::view_inverse::strided(stride, extent, step), 0, dst, bytes);
}

/// The same records over host storage and over device storage, one item applied through each.
template <class W, class D>
void apply_case(const ex::cuda_policy& policy, std::mt19937_64& rng, const char* name,
                dcr::encoding enc, dcr::element_transform transform,
                dcr::placement (*make)(std::byte*, std::int64_t, std::int64_t, std::uint8_t),
                double rate) {
  const std::string label = std::string("apply ") + name + " rate=" + std::to_string(rate);
  const std::int64_t rows = 301, cols = 517;
  const auto numel = static_cast<std::size_t>(rows * cols);
  std::vector<D> host_storage(numel);
  for (auto& w : host_storage) w = static_cast<D>(rng());
  ex::device_buffer<D> d_storage(policy, numel);
  to_device(policy, d_storage, host_storage);
  std::vector<std::uint64_t> active;
  std::vector<W> values;
  for (std::size_t i = 0; i < numel; ++i)
    if (std::bernoulli_distribution(rate)(rng)) {
      active.push_back(i);
      values.push_back(static_cast<W>(rng()));
    }
  dcr::placement host_record = make(reinterpret_cast<std::byte*>(host_storage.data()), rows, cols,
                                    sizeof(D));
  dcr::placement device_record = make(reinterpret_cast<std::byte*>(d_storage.data()), rows, cols,
                                      sizeof(D));
  host_record.transform = device_record.transform = transform;
  const std::uint64_t host_writes = ex::apply_item_records<W>(
      ex::cpu, &host_record, 1, enc, active.data(), active.size(), values.data());
  ex::device_buffer<dcr::placement> d_record(policy, 1);
  to_device(policy, d_record, std::vector<dcr::placement>{device_record});
  ex::device_buffer<std::uint64_t> d_active(policy, active.size());
  ex::device_buffer<W> d_values(policy, values.size());
  to_device(policy, d_active, active);
  to_device(policy, d_values, values);
  ex::device_buffer<unsigned char> ws(policy, ex::apply_workspace_bytes(policy));
  const std::uint64_t device_writes =
      ex::apply_item_records<W>(policy, d_record.data(), 1, enc, d_active.data(), active.size(),
                                d_values.data(), ws.as_workspace());
  check(device_writes == host_writes, label + ": writes " + std::to_string(device_writes) +
                                          " vs " + std::to_string(host_writes));
  check(to_host(d_storage.data(), numel) == host_storage, label + ": storage differs");
}

}  // namespace

int main() {
  return dcr_test::run_cuda_test("cuda exec: every algorithm matches the CPU policy", [] {
    cudaStream_t stream = nullptr;
    DCR_CUDA_TRY(cudaStreamCreate(&stream));
    const ex::cuda_policy policy = ex::cuda_policy{}.on(stream);
    std::mt19937_64 rng(20261201);
    for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{4097}, std::size_t{1} << 20})
      for (double rate : {0.0, 0.001, 0.03, 0.5, 1.0}) {
        detect_case<std::uint8_t>(policy, rng, n, rate);
        detect_case<std::uint16_t>(policy, rng, n, rate);
        detect_case<std::uint32_t>(policy, rng, n, rate);
        detect_case<std::uint64_t>(policy, rng, n, rate);
      }
    const std::int64_t shape[] = {1537, 2049};
    const auto n2 = static_cast<std::size_t>(shape[0] * shape[1]);
    project_case(policy, rng, "replicated", dcr::replicated(n2));
    project_case(policy, rng, "row_split 2/4", dcr::row_split(shape, 4, 2));
    project_case(policy, rng, "column_split 1/3", dcr::column_split(shape, 3, 1));
    const std::int64_t expert_shape[] = {96, 260};
    project_case(policy, rng, "stacked",
                 dcr::stacked(4, dcr::column_split(expert_shape, 2, 1).to_box(expert_shape)));
    const std::int64_t off[] = {100, 7}, ext[] = {300, 500};
    const int axes[] = {1, 0};
    project_case(policy, rng, "permuted box", dcr::box(shape, off, ext, axes));

    using dcr::element_transform;
    using dcr::encoding;
    const auto contiguous = +[](std::byte* dst, std::int64_t rows, std::int64_t cols,
                                std::uint8_t bytes) {
      return dcr::placement::contiguous(dst, rows * cols, bytes);
    };
    for (double rate : {0.0, 0.01, 0.3, 1.0}) {
      for (encoding enc : {encoding::overwrite, encoding::xor_mask, encoding::ulp}) {
        apply_case<std::uint16_t, std::uint16_t>(policy, rng, "contiguous", enc,
                                                 element_transform::identity(), contiguous, rate);
        apply_case<std::uint16_t, std::uint16_t>(policy, rng, "transposed", enc,
                                                 element_transform::identity(), transposed_record,
                                                 rate);
        apply_case<std::uint32_t, std::uint32_t>(policy, rng, "strided", enc,
                                                 element_transform::identity(), strided_record,
                                                 rate);
      }
      apply_case<std::uint32_t, std::uint16_t>(
          policy, rng, "f32 -> bf16 cast", encoding::overwrite,
          element_transform::cast(dcr::dtype::f32, dcr::dtype::bf16), transposed_record, rate);
      apply_case<std::uint16_t, std::uint32_t>(
          policy, rng, "f16 -> f32 cast", encoding::overwrite,
          element_transform::cast(dcr::dtype::f16, dcr::dtype::f32), contiguous, rate);
    }
    DCR_CUDA_TRY(cudaStreamDestroy(stream));
  });
}
