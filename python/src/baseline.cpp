// python/src/baseline.cpp: the C++ side of the package's benchmark (benchmarks/python/
// bench_python.py), measured in the same run as the Python side on the same data: a receiver
// whose loader is a C++ loader copying each canonical tensor whole into its storage, and an
// owner built and driven entirely in C++. Timed inside C++ (steady clock), so the figure is the
// library's own speed with no Python around it.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>

#include "common.hpp"
#include "dcr/refit/owner.hpp"
#include "dcr/refit/receiver.hpp"

namespace dcr_py {
namespace {

using clock = std::chrono::steady_clock;

double since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

// Tensor i of the registry lives whole and contiguous in storage[i].
struct whole_tensor_loader {
  using loader_concept = dcr::loader_tag;
  const dcr::tensor_registry* registry;
  std::vector<std::byte*> storage;
  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor& t, dcr::tensor_view<const W> src, Sink& sink) {
    auto* dst = reinterpret_cast<W*>(storage[registry->id(t.name)]);
    sink.copy(dcr::tensor_view<W>::contiguous(dst, t.shape), src);
  }
};

std::vector<std::span<const std::byte>> whole_spans(const dcr::tensor_registry& reg,
                                                    const std::vector<tensor_arg>& tensors) {
  DCR_EXPECTS(tensors.size() == reg.size(), dcr::errc::invalid_argument,
              "baseline: one tensor per registry entry expected");
  std::vector<std::span<const std::byte>> s;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = reg.at(static_cast<dcr::tensor_id>(i));
    s.push_back(tensor_bytes(tensors[i].first, t.type, static_cast<std::uint64_t>(t.numel()),
                             "baseline: tensor '" + t.name + "'", tensors[i].second));
  }
  return s;
}

}  // namespace

void bind_baseline(nb::module_& m) {
  m.def("_baseline_receiver_apply",
        [](const dcr::tensor_registry& reg, const std::vector<tensor_arg>& storage,
           const std::vector<nb::bytes>& payloads, std::uint64_t base, std::uint64_t target, int repeats) {
          const auto spans = whole_spans(reg, storage);
          whole_tensor_loader loader{&reg, {}};
          for (const auto& s : spans) loader.storage.push_back(const_cast<std::byte*>(s.data()));
          std::vector<std::span<const std::byte>> p;
          for (const auto& b : payloads) p.emplace_back(static_cast<const std::byte*>(b.data()), b.size());
          nb::gil_scoped_release release;
          dcr::receiver<whole_tensor_loader> rx(reg, loader);
          rx.prewarm();
          // `repeats` passes, each in a fresh transition (deduplication reset) as the Python
          // side's are; the best one counts.
          double best = 1e300;
          for (int k = 0; k < repeats; ++k) {
            rx.begin_attempt(dcr::attempt_key{base + 1, target + 1, 0});
            rx.begin_attempt(dcr::attempt_key{base, target, 0});
            const auto t0 = clock::now();
            for (const auto& bytes : p) rx.apply_payload(bytes);
            best = std::min(best, since(t0));
          }
          return best;
        },
        nb::arg("registry"), nb::arg("storage"), nb::arg("payloads"), nb::arg("base"), nb::arg("target"),
        nb::arg("repeats") = 1,
        "Benchmark baseline: best seconds of `repeats` applies of `payloads` by a C++ receiver "
        "(whole-tensor C++ loader).");

  m.def("_baseline_owner_build",
        [](const dcr::tensor_registry& reg, const std::vector<tensor_arg>& committed,
           const std::vector<tensor_arg>& candidate, int repeats) {
          const auto old_spans = whole_spans(reg, committed);
          const auto new_spans = whole_spans(reg, candidate);
          nb::gil_scoped_release release;
          std::vector<dcr::affine_task> tasks;
          for (std::size_t i = 0; i < reg.size(); ++i) {
            const auto& t = reg.at(static_cast<dcr::tensor_id>(i));
            tasks.push_back({t.name, t.type, dcr::replicated(static_cast<std::uint64_t>(t.numel())),
                             {static_cast<dcr::tensor_id>(i)}, true});
          }
          dcr::owner o(reg, 0, std::move(tasks));
          o.initialize(old_spans);
          dcr::payload_encoder encoder;
          std::vector<std::vector<std::byte>> out;
          dcr::payload_header h;
          h.id = dcr::payload_id{{0, 1, 0}, 0, 0};
          h.registry_fingerprint = reg.fingerprint();
          double best = 1e300;
          for (int k = 0; k < repeats; ++k) {  // as the Python side: the best of `repeats`
            const auto t0 = clock::now();
            const auto& items = o.build_items(new_spans, dcr::encoding_policy::mixed);
            dcr::pack_payloads(reg, h, items, std::size_t{64} << 20, encoder, out);
            best = std::min(best, since(t0));
          }
          return best;
        },
        nb::arg("registry"), nb::arg("committed"), nb::arg("candidate"), nb::arg("repeats") = 1,
        "Benchmark baseline: best seconds of `repeats` builds (detect, encode and pack the "
        "payloads of `candidate` against `committed`) by a C++ owner, one replicated task per tensor.");
}

}  // namespace dcr_py
