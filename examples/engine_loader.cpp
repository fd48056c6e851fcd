// examples/engine_loader.cpp: integrating an engine with dcr.
//
// The engine stores q/k/v fused in one buffer (as inference engines do). Its loader, written
// once, serves both the dense load and every delta refit. A two-rank trainer holds q, k and v
// split by rows; two owners detect their changes, and one transition brings the engine to the
// new weights in place, bit for bit.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "dcr/dcr.hpp"

namespace {

constexpr std::int64_t rows = 6, hidden = 4;

// The engine: qkv [3 * rows, hidden] in BF16 words.
struct engine {
  std::vector<std::uint16_t> qkv = std::vector<std::uint16_t>(3 * rows * hidden, 0);
};

// The engine's native loader: places each canonical tensor by name, through the sink.
struct engine_loader {
  using loader_concept = dcr::loader_tag;
  engine* e;

  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor& t, dcr::tensor_view<const W> src, Sink& sink) {
    const std::int64_t block = t.name == "q" ? 0 : t.name == "k" ? 1 : 2;
    auto qkv = dcr::tensor_view<W>::contiguous(reinterpret_cast<W*>(e->qkv.data()),
                                               {3 * rows, hidden});
    sink.copy(qkv.slice(0, block * rows, rows), src);
  }
};

}  // namespace

int main() {
  const dcr::tensor_registry registry({{"q", dcr::dtype::bf16, {rows, hidden}},
                                       {"k", dcr::dtype::bf16, {rows, hidden}},
                                       {"v", dcr::dtype::bf16, {rows, hidden}}});

  // Trainer: two tensor-parallel ranks, each holding a row split of q, k and v.
  std::vector<std::vector<std::uint16_t>> shards;
  std::vector<std::unique_ptr<dcr::owner>> owners;
  std::vector<dcr::owner_binding> bindings;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<dcr::affine_task> tasks;
    for (const char* name : {"q", "k", "v"}) {
      const auto id = registry.id(name);
      dcr::affine_task task;
      task.shard_name = std::string("tp") + char('0' + rank) + "/" + name;
      task.mapping = dcr::row_split(registry.at(id).shape, 2, rank);
      task.targets = {id};
      tasks.push_back(task);
      shards.emplace_back(dcr::local_size(task.mapping));
      for (std::size_t j = 0; j < shards.back().size(); ++j)
        shards.back()[j] = dcr::float_to_bf16(0.01f * static_cast<float>(j + 7 * shards.size()));
    }
    owners.push_back(std::make_unique<dcr::owner>(registry, rank, std::move(tasks)));
  }
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::span<const std::byte>> words;
    for (int t = 0; t < 3; ++t) words.push_back(std::as_bytes(std::span(shards[3 * rank + t])));
    owners[rank]->initialize(words);
    bindings.push_back({owners[rank].get(), words});
  }

  // The canonical tensor `name` assembled from the two ranks' row splits.
  auto canonical = [&](const char* name) {
    const int task = name[0] == 'q' ? 0 : name[0] == 'k' ? 1 : 2;
    std::vector<std::uint16_t> full;
    for (int rank = 0; rank < 2; ++rank)
      full.insert(full.end(), shards[3 * rank + task].begin(), shards[3 * rank + task].end());
    return full;
  };
  auto dense_load = [&](dcr::receiver<engine_loader>& r) {
    for (const char* name : {"q", "k", "v"}) {
      const auto words = canonical(name);
      r.dense_load<std::uint16_t>(registry.id(name),
                                  dcr::tensor_view<const std::uint16_t>::contiguous(
                                      words.data(), {rows, hidden}));
    }
  };

  // Receiver: dense load of version 0 through the engine's loader.
  engine storage;
  engine_loader loader{&storage};
  dcr::receiver<engine_loader> rx(registry, loader);
  rx.prewarm();
  dense_load(rx);

  // One optimizer step changes a few words, one of them only in its sign bit.
  shards[0][3] ^= 0x0001;  // q, rank 0
  shards[4][1] ^= 0x8000;  // k, rank 1

  // The protocol's agents in one process (memory control plane and payload store).
  dcr::receiver_endpoint* receivers[] = {&rx};
  dcr::in_process_refit refit(registry, std::span(bindings), std::span(receivers), 0);
  const auto report = refit.run();

  // A dense refit of the new weights into fresh storage, through the same loader.
  engine reference;
  engine_loader reference_loader{&reference};
  dcr::receiver<engine_loader> dense(registry, reference_loader);
  dense.prewarm();
  dense_load(dense);

  const auto& a = report.attempts.back();
  const bool exact = storage.qkv == reference.qkv;
  std::printf("committed: %s, %llu changed element(s), %llu payload byte(s), %s\n",
              report.committed ? "yes" : "no", static_cast<unsigned long long>(a.owners.changed_elements),
              static_cast<unsigned long long>(a.payload_bytes),
              exact ? "bit-identical to a dense refit" : "DIFFERS from a dense refit");
  return report.committed && exact ? 0 : 1;
}
