// benchmarks/owner_report.cpp: owner construction throughput for docs/benchmarks.md, beside a
// plain two-array compare loop over the same bytes, measured in the same run.
//
// Construction is what an owner does per attempt from candidate shards to compressed payloads:
// detect changed words against the trackers, project them to canonical indices, rebuild and
// compare residual outputs, choose encodings and build items, then pack and compress payloads
// (dcr::owner::build_chunk for every chunk, dcr::pack_payloads with a payload_encoder). It runs
// on the calling thread only, so GB/s here is per core: candidate shard bytes / CPU second.
// With --threads N (N > 1) each owner is also built with dcr::owner::build_payloads on N threads
// (chunks built, then payloads compressed, in parallel); that figure is wall-clock time beside
// the one-thread loop's wall-clock time in the same repetition, and the payloads of both must be
// byte for byte equal (exit 1 if not).
// The baseline reads the same tracker and candidate arrays and counts differing words (the
// compiler vectorizes it; it produces nothing else). The owner's detect stage is also timed
// alone in CPU seconds (dcr::detect_and_gather over the same arrays, the "detect (CPU)"
// columns); the per-stage columns (detect ms .. encode ms) are the owner's own wall-clock
// timings of the best construction and grow with the machine's load.
//
// Every timed build is the first attempt of its transition, as in a refit step: the owner is
// initialized again from a copy of the committed shards before each one (untimed), so no build
// unites its changed set with an earlier attempt's (a retry's path).
//
// The model and layout are `dcr simulate`'s defaults (synthetic MoE, Megatron-style trainer
// TP=2 x DP=2, residual tasks for the fused QKV); every owner rank is measured. Markdown on
// stdout (or JSON with --json), progress on stderr.
//
//   build/benchmarks/owner_report [--size 1G] [--rates 0.01,0.03] [--reps 3]
//                                 [--chunk-bytes 64M] [--bucket-bytes 64M] [--threads N]
//                                 [--json]
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "dcr/refit/owner.hpp"
#include "dcr/sim/moe_model.hpp"
#include "dcr/sim/rank_owner.hpp"

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Minor page faults of the calling thread (fresh pages touched: costly on virtual machines).
std::uint64_t thread_page_faults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return static_cast<std::uint64_t>(u.ru_minflt);
}

std::uint64_t parse_size(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const std::string suffix(end);
  double scale = 1;
  if (suffix == "K") scale = 1024.0;
  else if (suffix == "M") scale = 1024.0 * 1024;
  else if (suffix == "G") scale = 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) {
    fmt::print(stderr, "owner_report: bad size '{}'\n", s);
    std::exit(2);
  }
  return static_cast<std::uint64_t>(v * scale);
}

// The baseline: count differing words of two arrays.
template <class W>
std::uint64_t count_differing(std::span<const std::byte> a, std::span<const std::byte> b) {
  const W* x = reinterpret_cast<const W*>(a.data());
  const W* y = reinterpret_cast<const W*>(b.data());
  const std::size_t n = a.size() / sizeof(W);
  std::uint64_t c = 0;
  for (std::size_t i = 0; i < n; ++i) c += x[i] != y[i];
  return c;
}

std::uint64_t compare_all(const dcr::owner& o, std::span<const std::span<const std::byte>> cand) {
  std::uint64_t c = 0;
  for (std::size_t i = 0; i < cand.size(); ++i) {
    const auto t = o.tracker(i);
    dcr::visit_word(dcr::dtype_size(o.tasks()[i].type), [&](auto w) {
      c += count_differing<decltype(w)>(t, cand[i]);
    });
  }
  return c;
}

// The owner's detect stage alone (dcr::detect_and_gather, what build_chunk runs per affine
// task), over the same arrays, in CPU seconds like the compare loop: the owner's stage
// timings are wall-clock and grow with the load of the machine, its CPU time does not.
struct detect_scratch {
  std::vector<std::uint64_t> changed;
  std::vector<std::byte> old_words, new_words;
};

std::uint64_t detect_all(const dcr::owner& o, std::span<const std::span<const std::byte>> cand,
                         detect_scratch& d) {
  std::uint64_t c = 0;
  for (std::size_t i = 0; i < cand.size(); ++i) {
    const auto t = o.tracker(i);
    d.changed.clear();
    d.old_words.clear();
    d.new_words.clear();
    dcr::visit_word(dcr::dtype_size(o.tasks()[i].type), [&](auto w) {
      using W = decltype(w);
      const std::span<const W> x(reinterpret_cast<const W*>(t.data()), t.size() / sizeof(W));
      const std::span<const W> y(reinterpret_cast<const W*>(cand[i].data()), x.size());
      c += dcr::detect_and_gather<W>(x, y, d.changed, d.old_words, d.new_words);
    });
  }
  return c;
}

struct owner_figures {
  std::uint32_t rank = 0;
  double rate = 0;
  std::uint64_t compared_bytes = 0, residual_bytes = 0, changed = 0, payload_bytes = 0;
  std::uint64_t payloads = 0, chunks = 0, page_faults = 0, items = 0;
  double compare_s = 0, build_s = 0;  // best CPU seconds of the thread
  double detect_cpu_s = 0;            // best CPU seconds of detect_all
  double wall_1 = 0, wall_n = 0;      // --threads: best wall seconds, one thread and N
  double cpu_n = 0;                   // --threads: process CPU seconds of the best N-thread run
  double detect_s = 0, project_s = 0, residual_s = 0, encode_s = 0, pack_s = 0;  // of the best
};

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t size = std::uint64_t{1} << 30;
  std::vector<double> rates{0.01};
  int reps = 3;
  std::size_t chunk_bytes = std::size_t{64} << 20, bucket_bytes = std::size_t{64} << 20;
  bool json = false;
  std::size_t threads = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        fmt::print(stderr, "owner_report: {} needs a value\n", a);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--size") size = parse_size(value());
    else if (a == "--reps") reps = std::max(1, std::atoi(value().c_str()));
    else if (a == "--chunk-bytes") chunk_bytes = parse_size(value());
    else if (a == "--bucket-bytes") bucket_bytes = parse_size(value());
    else if (a == "--json") json = true;
    else if (a == "--threads") threads = static_cast<std::size_t>(std::max(1, std::atoi(value().c_str())));
    else if (a == "--rates") {
      rates.clear();
      std::string s = value();
      for (std::size_t p = 0; p < s.size();) {
        auto q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        rates.push_back(std::atof(s.substr(p, q - p).c_str()));
        p = q + 1;
      }
    } else {
      fmt::print(stderr, "usage: owner_report [--size 1G] [--rates 0.01,0.03] [--reps 3] "
                         "[--chunk-bytes 64M] [--bucket-bytes 64M] [--threads N] [--json]\n");
      return 2;
    }
  }

  const auto config = dcr::sim::moe_config::for_bytes(size, dcr::dtype::bf16);
  const dcr::tensor_registry registry(config.canonical_tensors());
  const int tp = 2, dp = 2;
  std::vector<owner_figures> all;
  for (double rate : rates) {
    const dcr::sim::stress_schedule schedule(rate);
    for (std::uint32_t rank = 0; rank < static_cast<std::uint32_t>(tp * dp); ++rank) {
      dcr::sim::synthetic_trainer trainer(config, registry, tp, dp, 1,
                                          dcr::sim::trainer_layout::megatron,
                                          dcr::sim::trainer_selection::owned_by(rank));
      const dcr::sim::rank_owner built = dcr::sim::make_rank_owner(registry, trainer, rank);
      dcr::owner& owner = *built.owner;
      owner.set_chunk_bytes(chunk_bytes);
      std::vector<std::span<const std::byte>> cand, inputs;
      auto spans = [&] { built.spans(trainer, cand, inputs); };
      trainer.advance_to(0, schedule);
      spans();
      // The committed version, kept to start every timed build as a transition's first attempt.
      std::vector<std::vector<std::byte>> committed_copy, residual_copy;
      for (auto s : cand) committed_copy.emplace_back(s.begin(), s.end());
      for (auto s : inputs) residual_copy.emplace_back(s.begin(), s.end());
      const std::vector<std::span<const std::byte>> committed(committed_copy.begin(),
                                                              committed_copy.end());
      const std::vector<std::span<const std::byte>> residual_committed(residual_copy.begin(),
                                                                       residual_copy.end());
      owner.initialize(committed, residual_committed);
      trainer.advance_to(1, schedule);
      spans();

      owner_figures f;
      f.rank = rank;
      f.rate = rate;
      f.chunks = owner.chunk_count();
      for (auto s : inputs) f.residual_bytes += s.size();
      f.compare_s = f.build_s = std::numeric_limits<double>::infinity();
      f.wall_1 = f.wall_n = std::numeric_limits<double>::infinity();
      f.detect_cpu_s = std::numeric_limits<double>::infinity();
      detect_scratch scratch;
      dcr::payload_encoder encoder;
      std::vector<dcr::payload_encoder> encoders(threads);
      std::vector<std::vector<std::byte>> payloads, all_payloads, threaded_payloads;
      std::uint64_t sink = 0;
      for (int rep = 0; rep < reps; ++rep) {
        const double c0 = thread_cpu_seconds();
        const std::uint64_t differing = compare_all(owner, cand);
        sink += differing;
        f.compare_s = std::min(f.compare_s, thread_cpu_seconds() - c0);
        const double d0 = thread_cpu_seconds();
        if (detect_all(owner, cand, scratch) != differing) {
          fmt::print(stderr, "owner_report: detect_and_gather and the compare loop disagree\n");
          return 1;
        }
        f.detect_cpu_s = std::min(f.detect_cpu_s, thread_cpu_seconds() - d0);

        all_payloads.clear();
        owner.initialize(committed, residual_committed);
        const auto w0 = std::chrono::steady_clock::now();
        const double b0 = thread_cpu_seconds();
        const std::uint64_t faults0 = thread_page_faults();
        double pack = 0;
        std::uint64_t bytes = 0, count = 0;
        dcr::payload_header header;
        header.id = dcr::payload_id{{0, 1, static_cast<std::uint32_t>(rep)}, rank, 0};
        header.registry_fingerprint = registry.fingerprint();
        for (std::size_t k = 0; k < owner.chunk_count(); ++k) {
          const auto& items = owner.build_chunk(k, cand, dcr::encoding_policy::mixed, inputs);
          const double p0 = thread_cpu_seconds();
          dcr::pack_payloads(registry, header, items, bucket_bytes, encoder, payloads);
          header.id.sequence += static_cast<std::uint32_t>(payloads.size());
          for (const auto& p : payloads) bytes += p.size();
          all_payloads.insert(all_payloads.end(), payloads.begin(), payloads.end());
          count += payloads.size();
          pack += thread_cpu_seconds() - p0;
        }
        const double b = thread_cpu_seconds() - b0;
        f.wall_1 = std::min(f.wall_1, std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
        const std::uint64_t faults = thread_page_faults() - faults0;
        if (b < f.build_s) {
          f.page_faults = faults;
          const auto& st = owner.stats();
          f.build_s = b;
          f.compared_bytes = st.compared_bytes;
          f.changed = st.changed_elements;
          f.items = st.items;
          f.detect_s = st.detect_seconds;
          f.project_s = st.project_seconds;
          f.residual_s = st.residual_detect_seconds + st.convert_seconds + st.residual_compare_seconds;
          f.encode_s = st.encode_seconds;
          f.pack_s = pack;
          f.payload_bytes = bytes;
          f.payloads = count;
        }
        if (threads > 1) {
          dcr::payload_header h;
          h.id = dcr::payload_id{{0, 1, static_cast<std::uint32_t>(rep)}, rank, 0};
          h.registry_fingerprint = registry.fingerprint();
          owner.initialize(committed, residual_committed);
          const double p0 = process_cpu_seconds();
          const auto t0 = std::chrono::steady_clock::now();
          owner.build_payloads(cand, dcr::encoding_policy::mixed, inputs, {},
                               dcr::build_mode::changes, h, bucket_bytes, encoders,
                               threaded_payloads);
          const double w = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (w < f.wall_n) {
            f.wall_n = w;
            f.cpu_n = process_cpu_seconds() - p0;
          }
          if (threaded_payloads != all_payloads) {
            fmt::print(stderr, "owner_report: owner {} built on {} threads differs from one thread\n",
                       rank, threads);
            return 1;
          }
        }
      }
      if (sink == 0 && rate > 0) fmt::print(stderr, "owner_report: no differing words?\n");
      fmt::print(stderr, "rate {} owner {}: {:.1f} ms construction, {:.1f} ms compare, {} items, {} payloads\n", rate,
                 rank, f.build_s * 1e3, f.compare_s * 1e3, f.items, f.payloads);
      all.push_back(f);
    }
  }

  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& f : all)
      out.push_back({{"rate", f.rate}, {"owner", f.rank}, {"compared_bytes", f.compared_bytes},
                     {"residual_input_bytes", f.residual_bytes}, {"changed_elements", f.changed},
                     {"chunks", f.chunks}, {"items", f.items}, {"payloads", f.payloads}, {"payload_bytes", f.payload_bytes},
                     {"compare_seconds", f.compare_s}, {"construction_seconds", f.build_s},
                     {"detect_seconds", f.detect_s}, {"project_seconds", f.project_s},
                     {"residual_seconds", f.residual_s}, {"encode_seconds", f.encode_s},
                     {"pack_compress_seconds", f.pack_s}, {"page_faults", f.page_faults},
                     {"construction_over_compare", f.compare_s / f.build_s},
                     {"detect_cpu_seconds", f.detect_cpu_s},
                     {"detect_over_compare", f.compare_s / f.detect_cpu_s},
                     {"threads", threads}, {"wall_seconds_one_thread", f.wall_1},
                     {"wall_seconds_threads", threads > 1 ? f.wall_n : f.wall_1},
                     {"cpu_seconds_threads", f.cpu_n}});
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  std::int64_t checkpoint_bytes = 0;
  for (std::size_t t = 0; t < registry.size(); ++t)
    checkpoint_bytes += registry.at(static_cast<dcr::tensor_id>(t)).bytes();
  fmt::print("model: {} bytes BF16, {} canonical tensors; trainer TP={} x DP={} (megatron); "
             "chunk {} MiB, bucket {} MiB; best of {} (CPU seconds of one thread)\n\n",
             checkpoint_bytes, registry.size(), tp, dp, chunk_bytes >> 20,
             bucket_bytes >> 20, reps);
  fmt::print("| rate | owner | shard MB | changed | compare GB/s | construction GB/s | "
             "construction / compare | detect (CPU) GB/s | detect / compare | detect ms | project ms | residual ms | encode ms | "
             "pack + compress ms | page faults | payload bytes |\n");
  fmt::print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& f : all) {
    const double mb = static_cast<double>(f.compared_bytes) / 1e6;
    fmt::print("| {:.0f}% | {} | {:.1f} | {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | "
               "{:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {} | {} |\n",
               f.rate * 100, f.rank, mb, f.changed, mb / 1e3 / f.compare_s, mb / 1e3 / f.build_s,
               f.compare_s / f.build_s, mb / 1e3 / f.detect_cpu_s, f.compare_s / f.detect_cpu_s,
               f.detect_s * 1e3, f.project_s * 1e3, f.residual_s * 1e3,
               f.encode_s * 1e3, f.pack_s * 1e3, f.page_faults, f.payload_bytes);
  }
  if (threads > 1) {
    fmt::print("\nWall-clock construction, one thread (the loop above) and {} threads "
               "(dcr::owner::build_payloads), best of {}; payloads byte for byte equal. CPU / wall: the\n"
               "cores the threaded run got on average (N when nothing else competes for them):\n\n",
               threads, reps);
    fmt::print("| rate | owner | one thread ms | GB/s | {} threads ms | GB/s | speedup | CPU / wall |\n", threads);
    fmt::print("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& f : all) {
      const double gb = static_cast<double>(f.compared_bytes) / 1e9;
      fmt::print("| {:.0f}% | {} | {:.1f} | {:.2f} | {:.1f} | {:.2f} | {:.2f}x | {:.2f} |\n",
                 f.rate * 100, f.rank, f.wall_1 * 1e3, gb / f.wall_1, f.wall_n * 1e3,
                 gb / f.wall_n, f.wall_1 / f.wall_n, f.cpu_n / f.wall_n);
    }
  }
  return 0;
}
