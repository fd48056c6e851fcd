// tests/packaging/consumer/gpu_detect.cuh: the CUDA kernels from a consumer's nvcc translation
// unit. Including them checks the flags they need (C++20, --expt-relaxed-constexpr) arrived; on a
// machine with a CUDA device it also detects changes on the GPU and checks the result.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "dcr/kernels/exec.cuh"
#include "dcr/mapping/replicated.hpp"

inline int run_gpu_detect(const char* who) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("%s: no CUDA device; the kernels compiled, not run\n", who);
    return 0;
  }
  std::vector<std::uint16_t> a(4096, 7), b(4096, 7);
  b[5] = 8;
  b[4000] = 9;
  std::uint16_t *da = nullptr, *db = nullptr, *dnew = nullptr;
  std::uint64_t* dindex = nullptr;
  DCR_CUDA_TRY(cudaMalloc(&da, a.size() * 2));
  DCR_CUDA_TRY(cudaMalloc(&db, b.size() * 2));
  DCR_CUDA_TRY(cudaMalloc(&dnew, b.size() * 2));
  DCR_CUDA_TRY(cudaMalloc(&dindex, b.size() * 8));
  DCR_CUDA_TRY(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  DCR_CUDA_TRY(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  const dcr::exec::cuda_policy policy{};
  const std::size_t bytes = dcr::exec::detect_compact_workspace_bytes<std::uint16_t>(policy, a.size());
  void* workspace = nullptr;
  DCR_CUDA_TRY(cudaMalloc(&workspace, bytes));
  const std::size_t n = dcr::exec::detect_project<std::uint16_t>(
      policy, da, db, a.size(), dcr::replicated(a.size()),
      dcr::exec::changed_words<std::uint16_t>{dindex, nullptr, dnew}, nullptr, {workspace, bytes});
  std::vector<std::uint64_t> index(n);
  DCR_CUDA_TRY(cudaMemcpy(index.data(), dindex, n * 8, cudaMemcpyDeviceToHost));
  for (void* p : {workspace, static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dnew),
                  static_cast<void*>(dindex)})
    cudaFree(p);
  const bool ok = index == std::vector<std::uint64_t>{5, 4000};
  std::printf("%s: GPU detect %s\n", who, ok ? "matches" : "DIFFERS");
  return ok ? 0 : 1;
}
