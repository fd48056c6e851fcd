// bench_s3: the S3 payload store's PUT and GET throughput against a real server, and the
// receiver's prefetch_source at several parallel gets. Run through scripts/with-s3.sh (it sets
// DCR_S3_ENDPOINT, DCR_S3_BUCKET and the credentials):
//   scripts/with-s3.sh build/benchmarks/bench_s3
// Buffers are filled before timing (first touch is expensive here); every put writes a new
// object (a payload is put once), and the benchmark's prefix is erased at the end.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "dcr/protocol/payload_source.hpp"
#include "dcr/protocol/store/s3_payload_store.hpp"

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

const std::string& run_prefix() {
  static const std::string p = "bench-" + std::to_string(::getpid()) + "/";
  return p;
}

dcr::s3_options options(dcr::s3_payload_hash hash, std::size_t multipart_threshold = std::size_t{64} << 20) {
  dcr::s3_options o;
  o.endpoint = env("DCR_S3_ENDPOINT");
  o.bucket = env("DCR_S3_BUCKET");
  o.prefix = run_prefix();
  o.region = dcr::s3_region_from_environment();
  o.credentials = dcr::s3_credentials::from_environment();
  o.payload_hash = hash;
  o.multipart_threshold = multipart_threshold;
  return o;
}

std::vector<std::byte> filled(std::size_t n) {
  std::vector<std::byte> v(n);
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  return v;
}

std::atomic<std::uint32_t> next_owner{1};

// PUT of one object of range(0) bytes per iteration; range(1): 0 SHA-256, 1 UNSIGNED-PAYLOAD.
void BM_s3_put(benchmark::State& state) {
  const auto bytes = filled(static_cast<std::size_t>(state.range(0)));
  dcr::s3_payload_store store(options(state.range(1) == 0 ? dcr::s3_payload_hash::sha256
                                                          : dcr::s3_payload_hash::unsigned_payload));
  const std::uint32_t owner = next_owner++;
  std::uint32_t seq = 0;
  for (auto _ : state) store.put(dcr::payload_id{{1, 2, 0}, owner, seq++}, bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_s3_put)
    ->ArgsProduct({{64 << 10, 1 << 20, 16 << 20, 64 << 20}, {0, 1}})
    ->ArgNames({"bytes", "unsigned"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A multipart upload of range(0) bytes in 16 MiB parts per iteration.
void BM_s3_put_multipart(benchmark::State& state) {
  const auto bytes = filled(static_cast<std::size_t>(state.range(0)));
  dcr::s3_payload_store store(options(dcr::s3_payload_hash::sha256, std::size_t{16} << 20));
  const std::uint32_t owner = next_owner++;
  std::uint32_t seq = 0;
  for (auto _ : state) store.put(dcr::payload_id{{1, 2, 0}, owner, seq++}, bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
  state.counters["multipart"] = static_cast<double>(store.stats().multipart_uploads);
}
BENCHMARK(BM_s3_put_multipart)->Arg(64 << 20)->ArgName("bytes")->Unit(benchmark::kMillisecond)->UseRealTime();

// GET of one object of range(0) bytes per iteration, into a reused buffer.
void BM_s3_get(benchmark::State& state) {
  const auto bytes = filled(static_cast<std::size_t>(state.range(0)));
  dcr::s3_payload_store store(options(dcr::s3_payload_hash::sha256));
  const dcr::payload_id id{{1, 2, 0}, next_owner++, 0};
  store.put(id, bytes);
  std::vector<std::byte> out(bytes.size());
  for (auto _ : state) {
    if (store.get(id, out) != dcr::get_status::found) state.SkipWithError("object missing");
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_s3_get)->Arg(64 << 10)->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20)->ArgName("bytes")
    ->Unit(benchmark::kMillisecond)->UseRealTime();

// A receiver draining an attempt of 32 payloads of 2 MiB through prefetch_source with range(0)
// gets in flight.
void BM_s3_prefetch(benchmark::State& state) {
  constexpr std::uint32_t payloads = 32;
  constexpr std::size_t size = 2 << 20;
  dcr::s3_payload_store store(options(dcr::s3_payload_hash::sha256));
  const std::uint32_t owner = next_owner++;
  const dcr::attempt_key key{7, 8, owner};  // an attempt of its own
  std::vector<dcr::payload_id> ids;
  const auto bytes = filled(size);
  for (std::uint32_t q = 0; q < payloads; ++q) {
    ids.push_back(dcr::payload_id{key, owner, q});
    store.put(ids.back(), bytes);
  }
  store.put_manifest(key, owner, ids);
  dcr::prefetch_options po;
  po.parallel_gets = static_cast<std::size_t>(state.range(0));
  po.poll_interval = std::chrono::milliseconds(5);
  dcr::prefetch_source<dcr::s3_payload_store> source(store, po);
  const std::uint32_t owners[] = {owner};
  for (auto _ : state) {
    source.open(key, owners);
    dcr::delivery d;
    std::uint32_t got = 0;
    for (;;) {
      const auto s = source.next(d, dcr::protocol_clock::now() + std::chrono::seconds(30));
      if (s == dcr::source_status::complete) break;
      if (s != dcr::source_status::delivered) {
        state.SkipWithError("timed out");
        break;
      }
      ++got;
    }
    if (got != payloads) state.SkipWithError("not every payload was delivered");
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * payloads * static_cast<std::int64_t>(size));
}
BENCHMARK(BM_s3_prefetch)->Arg(1)->Arg(4)->Arg(8)->ArgName("parallel_gets")->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  if (env("DCR_S3_ENDPOINT").empty() || env("DCR_S3_BUCKET").empty()) {
    std::fprintf(stderr, "bench_s3: DCR_S3_ENDPOINT/DCR_S3_BUCKET not set (run through scripts/with-s3.sh)\n");
    return 77;
  }
  benchmark::Initialize(&argc, argv);
  {  // A fresh server allocates its first volume on the first write (seconds): not a put's cost.
    dcr::s3_payload_store warm(options(dcr::s3_payload_hash::sha256));
    warm.put(dcr::payload_id{{0, 1, 0}, 0, 0}, filled(1 << 20));
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  dcr::s3_payload_store(options(dcr::s3_payload_hash::sha256)).erase_through(~std::uint64_t{0});
  return 0;
}
