// benchmarks/codec_report.cpp: the codec's figures for docs/benchmarks.md, every one beside its
// baseline measured in the same run.
//
//   1. Table 2 protocol of the paper: reproduce its overwrite and xor sizes, then dcr's value
//      stream bytes for the same changed words, and the order-0 entropies of xor masks and ulp
//      deltas.
//   2. Stress protocol: bytes per changed element of dcr's payload, the paper's coding (xor + u16
//      gaps + zstd), int32 indices + overwrite values + zstd, dense xor + zstd, `zstd
//      --patch-from`, `xdelta3`, and the entropy bound of independent changes.
//   3. Throughput at each stress rate beside a plain two-array compare loop: dcr's diff (two
//      arrays to payload bytes) and apply (payload to updated words) on one core, with stage
//      times; then the library path of `dcr diff` (dcr::io::checkpoint_differ in memory, on one
//      thread and with its worker thread, with and without digests, and diff_checkpoints on
//      safetensors files under /tmp), with wall, calling-thread and process CPU times.
//
// dcr is measured only through its public API (detect_changes, detect_and_gather,
// encode_gathered_item, payload_encoder / payload_decoder, visit_encoding, checkpoint_differ,
// diff_checkpoints, delta_file), so the report follows the codec as it improves. The baselines are in codec_workloads.hpp, independent of dcr's codec, and every
// baseline and dcr payload is decoded back and compared with the new words before its size is
// reported. Exit status 1 when any round trip fails. Markdown on stdout (or JSON with --json),
// progress on stderr.
#include <signal.h>
#include <sys/resource.h>
#include <time.h>
#include <stdlib.h>
#include <unistd.h>
#include <zstd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "codec_workloads.hpp"
#include "dcr/error_text.hpp"
#include "dcr/apply/record.hpp"
#include "dcr/canonical.hpp"
#include "dcr/codec/encode_item.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/payload.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/detect/detect.hpp"
#include "dcr/error.hpp"
#include "dcr/io/checkpoint.hpp"

namespace {

using dcr::bench::presize;

// In-process timings use the calling thread's CPU clock: on a quiet machine it equals wall time,
// and on a loaded one it leaves out the time the thread waited for a core (it still counts the
// cache and memory-bandwidth contention). Wall time is recorded beside it for the main figures.
struct clock_type {
  static double now() noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
};
double seconds_since(double t0) { return clock_type::now() - t0; }

double wall_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds (user + system) of all waited-for children so far (the CLI tools).
double children_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_CHILDREN, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// ------------------------------------------------------------------------------------------------
// Options

struct options {
  std::size_t table2_elements = 20'000'000;
  std::size_t elements = std::size_t{256} << 20;
  std::size_t tensor_elements = std::size_t{64} << 20;
  std::vector<double> rates = {0.01, 0.03, 0.05};
  int reps = 3;
  int zstd_level = 1;
  std::uint64_t seed = 20250101;
  bool table2 = true, stress = true, throughput = true, tools = true, files = true, json = false;
};

constexpr const char* usage = R"(usage: codec_report [options]
  --table2-elements N   values of the Table 2 protocol (default 20M = 20,000,000)
  --elements N          BF16 elements of the stress and throughput protocols (default 256Mi)
  --tensor-elements N   elements per tensor (one payload item each) for dcr (default 64Mi)
  --rates R,R,...       stress change rates (default 0.01,0.03,0.05)
  --reps K              timed repetitions, best kept (default 3)
  --seed S              random seed (default 20250101)
  --no-table2 --no-stress --no-throughput --no-tools   skip a part (tools: zstd/xdelta3 CLIs)
  --no-files            skip diff_checkpoints on safetensors files under /tmp (throughput)
  --json                JSON on stdout instead of markdown
Sizes take K/M/G (10^3..) or Ki/Mi/Gi (2^10..) suffixes.
)";

std::size_t parse_size(const std::string& s) {
  std::size_t pos = 0;
  const double v = std::stod(s, &pos);
  const std::string suffix = s.substr(pos);
  double mult = 1;
  if (suffix.empty()) mult = 1;
  else if (suffix == "K") mult = 1e3;
  else if (suffix == "M") mult = 1e6;
  else if (suffix == "G") mult = 1e9;
  else if (suffix == "Ki") mult = 1024.0;
  else if (suffix == "Mi") mult = 1024.0 * 1024;
  else if (suffix == "Gi") mult = 1024.0 * 1024 * 1024;
  else throw std::invalid_argument("bad size suffix in '" + s + "'");
  if (v <= 0) throw std::invalid_argument("size must be positive: '" + s + "'");
  return static_cast<std::size_t>(v * mult);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--table2-elements") o.table2_elements = parse_size(value());
    else if (a == "--elements") o.elements = parse_size(value());
    else if (a == "--tensor-elements") o.tensor_elements = parse_size(value());
    else if (a == "--reps") o.reps = std::max(1, std::stoi(value()));
    else if (a == "--seed") o.seed = std::stoull(value());
    else if (a == "--rates") {
      o.rates.clear();
      std::stringstream ss(value());
      for (std::string r; std::getline(ss, r, ',');) {
        const double rate = std::stod(r);
        if (!(rate > 0 && rate < 1)) throw std::invalid_argument("rate outside (0, 1): " + r);
        o.rates.push_back(rate);
      }
    } else if (a == "--no-table2") o.table2 = false;
    else if (a == "--no-stress") o.stress = false;
    else if (a == "--no-throughput") o.throughput = false;
    else if (a == "--no-tools") o.tools = false;
    else if (a == "--no-files") o.files = false;
    else if (a == "--json") o.json = true;
    else if (a == "-h" || a == "--help") {
      std::fputs(usage, stdout);
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown option '" + a + "'");
    }
  }
  if (o.elements > 0x7fffffffu)
    throw std::invalid_argument("--elements above 2^31 - 1 (the int32 baseline cannot index it)");
  return o;
}

void progress(const char* fmt, auto... args) {
  std::fprintf(stderr, "codec_report: ");
  std::fprintf(stderr, fmt, args...);
  std::fprintf(stderr, "\n");
}

std::string format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

// ------------------------------------------------------------------------------------------------
// dcr's codec, through its public API only.

/// Applies decoded items to `resident` (the arrays' words; tensor `id` at spans[id]) through
/// the library's per-record step (one contiguous placement record per tensor).
void apply_items(std::span<const dcr::item> items,
                 std::span<const std::pair<std::size_t, std::size_t>> spans,
                 std::span<std::uint16_t> resident) {
  for (const dcr::item& it : items) {
    const auto [off, len] = spans[it.tensor];
    const auto whole = dcr::placement::contiguous(
        reinterpret_cast<std::byte*>(resident.data() + off), static_cast<std::int64_t>(len), 2,
        it.tensor);
    dcr::apply_item_records<std::uint16_t>(std::span<const dcr::placement>(&whole, 1), it.enc,
                                           it.indices, it.words<std::uint16_t>().data());
  }
}

struct diff_stages {
  double detect_gather = 0, item = 0, encode = 0;  // item: encode_gathered_item
  [[nodiscard]] double total() const { return detect_gather + item + encode; }
};
struct apply_stages {
  double decode = 0, scatter = 0;
  [[nodiscard]] double total() const { return decode + scatter; }
};

/// One BF16 array cut into tensors of `tensor_elements` (the last one shorter), one item each in
/// one payload.
class dcr_codec {
 public:
  dcr_codec(std::size_t n, std::size_t tensor_elements, int zstd_level)
      : encoder_(dcr::codec_options{.zstd_level = zstd_level}) {
    std::vector<dcr::canonical_tensor> tensors;
    for (std::size_t off = 0, k = 0; off < n; off += tensor_elements, ++k) {
      const std::size_t len = std::min(tensor_elements, n - off);
      tensors.push_back({format("layers.%04zu.weight", k), dcr::dtype::bf16,
                         {static_cast<std::int64_t>(len)}});
    }
    registry_ = dcr::tensor_registry(std::move(tensors));
    spans_.resize(registry_.size());
    for (std::size_t off = 0, k = 0; off < n; off += tensor_elements, ++k) {
      const auto id = registry_.id(format("layers.%04zu.weight", k));
      spans_[id] = {off, std::min(tensor_elements, n - off)};
    }
    header_.id = {.attempt = {.base_version = 1, .target_version = 2, .number = 0}, .owner = 0, .sequence = 0};
    header_.registry_fingerprint = registry_.fingerprint();
    items_.resize(registry_.size());
  }

  /// Runs one diff and one apply (into `scratch`, which must have the arrays' size) to size and
  /// touch every buffer (items, gathered words, encoder, decoder, payload) for changes like
  /// those between old and new.
  void prepare(std::span<const std::uint16_t> old_words, std::span<const std::uint16_t> new_words,
               std::span<std::uint16_t> scratch) {
    std::copy(old_words.begin(), old_words.end(), scratch.begin());
    diff(old_words, new_words, nullptr);
    apply(scratch, nullptr);
  }

  /// Two arrays -> payload bytes, on the calling thread. Returns the payload size.
  std::size_t diff(std::span<const std::uint16_t> old_words,
                   std::span<const std::uint16_t> new_words, diff_stages* stages) {
    std::size_t used = 0;
    encodings_.clear();
    diff_stages s;
    for (dcr::tensor_id id = 0; id < spans_.size(); ++id) {
      const auto [off, len] = spans_[id];
      // One pass: the changed indices into the item, their old words into its values (turned
      // into the encoding's values in place by encode_gathered_item, as the library's differ
      // and owner do), their new words beside it. The item's buffers are reused from the last
      // diff, so nothing is allocated once warm.
      auto t = clock_type::now();
      dcr::item& it = items_[used];
      it.indices.clear();
      it.values.clear();
      new_gathered_.clear();
      dcr::detect_and_gather<std::uint16_t>(old_words.subspan(off, len),
                                            new_words.subspan(off, len), it.indices, it.values,
                                            new_gathered_);
      s.detect_gather += seconds_since(t);
      if (it.count() == 0) continue;
      t = clock_type::now();
      it.tensor = id;
      it.type = dcr::dtype::bf16;
      const dcr::encoding enc = dcr::encode_gathered_item<std::uint16_t>(
          it, new_gathered_, dcr::encoding_policy::mixed, true, encoder_.options());
      s.item += seconds_since(t);
      ++used;
      ++encodings_[encoding_name(enc)];
    }
    const auto t = clock_type::now();
    encoder_.encode(header_, std::span<const dcr::item>(items_.data(), used), registry_, payload_);
    s.encode += seconds_since(t);
    if (stages != nullptr) *stages = s;
    return payload_.size();
  }

  /// Payload -> resident words updated in place (resident must hold the old words).
  void apply(std::span<std::uint16_t> resident, apply_stages* stages) {
    auto t = clock_type::now();
    decoder_.decode(payload_, registry_, decoded_);
    const double decode = seconds_since(t);
    t = clock_type::now();
    apply_items(decoded_, spans_, resident);
    if (stages != nullptr) *stages = {decode, seconds_since(t)};
  }

  /// CPU seconds of detect_changes alone over every tensor (best of `reps`).
  double detect_seconds(std::span<const std::uint16_t> old_words,
                        std::span<const std::uint16_t> new_words, int reps) {
    double best = 1e300;
    for (int r = 0; r < reps; ++r) {
      const double t = clock_type::now();
      for (const auto& [off, len] : spans_) {
        changed_.clear();
        dcr::detect_changes<std::uint16_t>(old_words.subspan(off, len),
                                           new_words.subspan(off, len), changed_);
      }
      best = std::min(best, seconds_since(t));
    }
    return best;
  }

  /// CPU seconds plain zstd spends compressing and decompressing the streams of the last
  /// payload at `level` (each stream read back from the payload, best of `reps`): how much of
  /// encode and decode is zstd itself. Streams that are not zstd frames are left out.
  [[nodiscard]] std::pair<double, double> zstd_seconds(int level, int reps) const {
    std::vector<dcr::item_entry> entries;
    dcr::payload_decoder::read_table(payload_, entries);
    struct frame {
      const std::byte* data;
      std::size_t size;
      std::vector<std::byte> raw;
    };
    std::vector<frame> frames;
    const auto add = [&](std::uint64_t offset, std::uint64_t size) {
      const std::byte* p = payload_.data() + offset;
      if (size < 4 || ZSTD_getFrameContentSize(p, size) >= ZSTD_CONTENTSIZE_ERROR) return;
      frames.push_back({p, size, {}});
      presize(frames.back().raw, dcr::bench::plain_zstd::content_size(p, size));
    };
    for (const auto& e : entries) {
      add(e.location_offset, e.location_size);
      add(e.value_offset, e.value_size);
    }
    dcr::bench::plain_zstd z(level);
    std::vector<std::byte> out;
    std::size_t most = 0;
    for (auto& f : frames) {
      z.decompress(f.data, f.size, f.raw.data(), f.raw.size());
      most = std::max(most, f.raw.size());
    }
    presize(out, ZSTD_compressBound(most));
    double compress = 1e300, decompress = 1e300;
    for (int r = 0; r < reps; ++r) {
      double t = clock_type::now();
      for (auto& f : frames) z.compress(f.raw.data(), f.raw.size(), out);
      compress = std::min(compress, seconds_since(t));
      t = clock_type::now();
      for (auto& f : frames) z.decompress(f.data, f.size, f.raw.data(), f.raw.size());
      decompress = std::min(decompress, seconds_since(t));
    }
    return {compress, decompress};
  }

  /// Sums of the value and location stream sizes over the payload's item table.
  [[nodiscard]] std::pair<std::size_t, std::size_t> value_and_location_bytes() const {
    std::vector<dcr::item_entry> entries;
    dcr::payload_decoder::read_table(payload_, entries);
    std::size_t values = 0, locations = 0;
    for (const auto& e : entries) {
      values += e.value_size;
      locations += e.location_size;
    }
    return {values, locations};
  }

  /// "ulp x4" style summary of the encodings the last diff chose.
  [[nodiscard]] std::string encodings() const {
    std::string s;
    for (const auto& [name, count] : encodings_)
      s += (s.empty() ? "" : ", ") + name + (spans_.size() > 1 ? " x" + std::to_string(count) : "");
    return s.empty() ? "-" : s;
  }

  [[nodiscard]] std::size_t tensor_count() const { return spans_.size(); }
  [[nodiscard]] const dcr::tensor_registry& registry() const { return registry_; }
  /// Offset and length in the arrays of each tensor, by tensor id.
  [[nodiscard]] std::span<const std::pair<std::size_t, std::size_t>> spans() const {
    return spans_;
  }

 private:
  static std::string encoding_name(dcr::encoding e) {
    switch (e) {
      case dcr::encoding::overwrite: return "overwrite";
      case dcr::encoding::xor_mask: return "xor";
      case dcr::encoding::ulp: return "ulp";
    }
    return "encoding " + std::to_string(static_cast<int>(e));
  }

  dcr::tensor_registry registry_;
  std::vector<std::pair<std::size_t, std::size_t>> spans_;  // by tensor id: offset, length
  dcr::payload_header header_;
  dcr::payload_encoder encoder_;
  dcr::payload_decoder decoder_;
  std::vector<std::uint64_t> changed_;  // detect_seconds' output
  std::vector<std::uint16_t> new_gathered_;
  std::vector<dcr::item> items_, decoded_;
  std::vector<std::byte> payload_;
  std::map<std::string, int> encodings_;
};

// ------------------------------------------------------------------------------------------------
// The library path of `dcr diff`: dcr::io::checkpoint_differ (in memory) and
// dcr::io::diff_checkpoints (files), on the same arrays cut into the same tensors.

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

/// Wall, calling-thread CPU and whole-process CPU (every thread, kernel included) of one run.
struct timed_run {
  double wall = 0, main_cpu = 0, process_cpu = 0;
};

template <class F>
timed_run time_run(F&& f) {
  const double w = wall_now(), t = clock_type::now(), p = process_cpu_seconds();
  f();
  return {wall_now() - w, seconds_since(t), process_cpu_seconds() - p};
}

/// checkpoint_differ::diff_tensors over the arrays held in memory; the payloads are kept in
/// memory (one buffer, reused).
class library_differ {
 public:
  library_differ(const dcr_codec& layout, int zstd_level, bool worker_thread, bool digests)
      : layout_(layout),
        differ_(dcr::io::diff_options{.zstd_level = zstd_level, .worker_thread = worker_thread}),
        digests_(digests ? layout.tensor_count() : 0) {}

  timed_run run(std::span<const std::uint16_t> old_words, std::span<const std::uint16_t> new_words) {
    pairs_.resize(layout_.tensor_count());
    for (std::size_t id = 0; id < pairs_.size(); ++id) {
      const auto [off, len] = layout_.spans()[id];
      pairs_[id] = {std::as_bytes(old_words.subspan(off, len)),
                    std::as_bytes(new_words.subspan(off, len))};
    }
    bytes_.clear();
    ends_.clear();
    return time_run([&] {
      report_ = differ_.diff_tensors(
          layout_.registry(), pairs_,
          [this](std::span<const std::byte> payload) {
            bytes_.insert(bytes_.end(), payload.begin(), payload.end());
            ends_.push_back(bytes_.size());
          },
          digests_);
    });
  }

  /// Decodes every payload of the last run into a copy of old and compares it with new; checks
  /// the digests when there are any.
  bool verify(std::span<const std::uint16_t> old_words, std::span<const std::uint16_t> new_words,
              std::span<std::uint16_t> scratch) {
    std::copy(old_words.begin(), old_words.end(), scratch.begin());
    dcr::payload_decoder decoder;
    std::vector<dcr::item> items;
    std::size_t begin = 0;
    for (const std::size_t end : ends_) {
      decoder.decode(std::span<const std::byte>(bytes_.data() + begin, end - begin),
                     layout_.registry(), items);
      apply_items(items, layout_.spans(), scratch);
      begin = end;
    }
    bool ok = std::equal(scratch.begin(), scratch.end(), new_words.begin());
    for (std::size_t id = 0; id < digests_.size(); ++id) {
      const auto [off, len] = layout_.spans()[id];
      ok = ok && digests_[id].old_digest == dcr::io::digest_of(std::as_bytes(old_words.subspan(off, len))) &&
           digests_[id].new_digest == dcr::io::digest_of(std::as_bytes(new_words.subspan(off, len)));
    }
    return ok;
  }

  [[nodiscard]] std::size_t payload_bytes() const { return bytes_.size(); }
  [[nodiscard]] const dcr::io::diff_report& report() const { return report_; }

 private:
  const dcr_codec& layout_;
  dcr::io::checkpoint_differ differ_;
  std::vector<dcr::io::tensor_pair> pairs_;
  std::vector<dcr::io::tensor_digests> digests_;
  std::vector<std::byte> bytes_;
  std::vector<std::size_t> ends_;
  dcr::io::diff_report report_;
};

/// Writes the arrays as a safetensors checkpoint with the tensors of `layout` (1-d each).
void write_checkpoint(const std::string& path, const dcr_codec& layout,
                      std::span<const std::uint16_t> words) {
  std::vector<dcr::io::safetensors_tensor> tensors;
  for (std::size_t id = 0; id < layout.tensor_count(); ++id) {
    const auto [off, len] = layout.spans()[id];
    tensors.push_back({layout.registry().tensors()[id].name, dcr::dtype::bf16,
                       {static_cast<std::int64_t>(len)},
                       std::as_bytes(words.subspan(off, len))});
  }
  // Metadata as PyTorch writes it (and a present optional keeps GCC 12 from a false warning).
  const std::optional<dcr::io::safetensors_metadata> metadata{
      dcr::io::safetensors_metadata{{"format", "pt"}}};
  dcr::io::write_safetensors(path, tensors, metadata);
}

/// Decodes every payload of the delta file at `path` into a copy of old and compares it with
/// new; checks the delta's base and result digests.
bool verify_delta_file(const std::string& path, const dcr_codec& layout,
                       std::span<const std::uint16_t> old_words,
                       std::span<const std::uint16_t> new_words, std::span<std::uint16_t> scratch) {
  const auto d = dcr::io::delta_file::open(path);
  if (d.registry_fingerprint() != layout.registry().fingerprint()) return false;
  std::copy(old_words.begin(), old_words.end(), scratch.begin());
  dcr::payload_decoder decoder;
  std::vector<dcr::item> items;
  for (std::size_t i = 0; i < d.payload_count(); ++i) {
    const auto expect = d.expected_transition(i);
    decoder.decode(d.payload(i), layout.registry(), items, &expect);
    apply_items(items, layout.spans(), scratch);
  }
  bool ok = std::equal(scratch.begin(), scratch.end(), new_words.begin());
  std::vector<dcr::io::digest128> old_digests, new_digests;
  for (std::size_t id = 0; id < layout.tensor_count(); ++id) {
    const auto [off, len] = layout.spans()[id];
    old_digests.push_back(dcr::io::digest_of(std::as_bytes(old_words.subspan(off, len))));
    new_digests.push_back(dcr::io::digest_of(std::as_bytes(new_words.subspan(off, len))));
  }
  return ok && d.base_digest() == dcr::io::tensors_digest(old_digests) &&
         d.result_digest() == dcr::io::tensors_digest(new_digests);
}

// ------------------------------------------------------------------------------------------------
// Plain loops (the memory-bandwidth baseline).

[[gnu::noinline]] std::size_t compare_count(const std::uint16_t* a, const std::uint16_t* b,
                                            std::size_t n) {
  std::size_t d = 0;
  for (std::size_t i = 0; i < n; ++i) d += a[i] != b[i];
  return d;
}

// ------------------------------------------------------------------------------------------------
// Results

struct table2_row {
  double a = 0;
  std::size_t changed = 0;
  std::size_t overwrite_bytes = 0, xor_bytes = 0;
  double xor_entropy_bytes = 0, ulp_entropy_bytes = 0;
  std::size_t ours_value_bytes = 0, ours_location_bytes = 0;
  std::string ours_encoding;
  bool verified = false;
};
struct paper_table2 {
  double a, overwrite_mb, xor_mb, xor_h0_mb, ulp_h0_mb;
};
constexpr std::array<paper_table2, 3> paper_rows = {{{1e-4, 0.74, 0.33, 0.227, 0.181},
                                                     {1e-3, 7.02, 3.23, 2.19, 1.77},
                                                     {1e-2, 25.70, 14.93, 10.9, 9.67}}};
constexpr double paper_values = 20e6;

/// The paper's row r scaled to n values (the paper's figures are for 20,000,000).
paper_table2 paper_row(std::size_t r, std::size_t n) {
  const double k = static_cast<double>(n) / paper_values;
  const auto& p = paper_rows[r];
  return {p.a, p.overwrite_mb * k, p.xor_mb * k, p.xor_h0_mb * k, p.ulp_h0_mb * k};
}

struct method_result {
  std::string name, note;
  std::size_t bytes = 0;
  double seconds = 0;       // CPU seconds of the encoding (0: not timed)
  double wall_seconds = 0;  // wall seconds of the same run
  bool verified = false;
};
struct stress_row {
  double rate = 0;
  std::size_t picked = 0, changed = 0;
  double index_entropy_bytes = 0, value_entropy_bytes = 0;
  std::string ours_encoding;
  std::vector<method_result> methods;
  [[nodiscard]] double bound_bytes() const { return index_entropy_bytes + value_entropy_bytes; }
  [[nodiscard]] const method_result* find(const std::string& n) const {
    for (const auto& m : methods)
      if (m.name == n) return &m;
    return nullptr;
  }
};
/// One way through the library (checkpoint_differ in memory, or diff_checkpoints on files).
struct library_result {
  std::string name, note;
  int threads = 1;
  std::vector<timed_run> runs;
  std::size_t bytes = 0, payloads = 0;
  bool verified = false;
  [[nodiscard]] double best(double timed_run::*field) const {
    double b = 1e300;
    for (const auto& r : runs) b = std::min(b, r.*field);
    return b;
  }
  [[nodiscard]] double worst(double timed_run::*field) const {
    double w = 0;
    for (const auto& r : runs) w = std::max(w, r.*field);
    return w;
  }
};

struct throughput_row {
  double rate = 0;
  double compare_s = 0, diff_s = 0, apply_s = 0;  // CPU seconds, best repetition
  double compare_wall_s = 0;                       // wall seconds, best repetition
  std::vector<library_result> library;
  double diff_wall_s = 0;                          // wall seconds of that diff
  double zstd_compress_s = 0, zstd_decompress_s = 0;  // plain zstd on the payload's streams
  double detect_alone_s = 0;                          // detect_changes alone, best of reps
  diff_stages diff;
  apply_stages apply;
  bool verified = false;
};

// ------------------------------------------------------------------------------------------------
// Temp files for the CLI tools, removed at exit (and on SIGINT/SIGTERM).

char g_tmp_dir[256] = "";
char g_tmp_files[8][320];
int g_tmp_file_count = 0;

void remove_temp_files() noexcept {
  for (int i = 0; i < g_tmp_file_count; ++i) ::unlink(g_tmp_files[i]);
  if (g_tmp_dir[0] != '\0') ::rmdir(g_tmp_dir);
}
extern "C" void on_signal(int sig) {
  remove_temp_files();  // unlink and rmdir are async-signal-safe
  ::_exit(128 + sig);
}

class temp_dir {
 public:
  temp_dir() {
    std::snprintf(g_tmp_dir, sizeof g_tmp_dir, "/tmp/dcr-codec-report.XXXXXX");
    if (::mkdtemp(g_tmp_dir) == nullptr) throw std::runtime_error("mkdtemp failed under /tmp");
    for (const char* name : {"old.bin", "new.bin", "patch.zst", "patch.vcdiff", "out.bin",
                             "old.safetensors", "new.safetensors", "step.dcrdelta"}) {
      std::snprintf(g_tmp_files[g_tmp_file_count++], sizeof g_tmp_files[0], "%s/%s", g_tmp_dir,
                    name);
    }
    ::signal(SIGINT, on_signal);
    ::signal(SIGTERM, on_signal);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    remove_temp_files();
    g_tmp_dir[0] = '\0';
    g_tmp_file_count = 0;
  }
  [[nodiscard]] std::string path(const char* name) const {
    return std::string(g_tmp_dir) + "/" + name;
  }
};

void write_file(const std::string& path, std::span<const std::uint16_t> words) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(words.data()),
          static_cast<std::streamsize>(words.size_bytes()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

bool file_equals(const std::string& path, std::span<const std::uint16_t> words) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::vector<char> buf(std::size_t{1} << 24);
  std::size_t off = 0;
  const auto* expect = reinterpret_cast<const char*>(words.data());
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = static_cast<std::size_t>(f.gcount());
    if (got == 0) break;
    if (off + got > words.size_bytes() || std::memcmp(buf.data(), expect + off, got) != 0)
      return false;
    off += got;
  }
  return off == words.size_bytes();
}

std::string shell_quote(const std::string& s) { return "'" + s + "'"; }

bool tool_available(const char* name) {
  return std::system((std::string("command -v ") + name + " >/dev/null 2>&1").c_str()) == 0;
}

std::string command_output(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// Runs `encode`, times it, then `decode` and compares its output file with new_words.
method_result run_tool(const std::string& name, const std::string& encode_cmd,
                       const std::string& decode_cmd, const std::string& patch,
                       const std::string& out, std::span<const std::uint16_t> new_words,
                       const std::string& note) {
  method_result m;
  m.name = name;
  m.note = note;
  const double t = wall_now(), cpu = children_cpu_seconds();
  const int rc = std::system(encode_cmd.c_str());
  m.wall_seconds = wall_now() - t;
  m.seconds = children_cpu_seconds() - cpu;
  if (rc != 0) {
    m.note += " (encode FAILED: " + encode_cmd + ")";
    return m;
  }
  m.bytes = std::filesystem::file_size(patch);
  m.verified = std::system(decode_cmd.c_str()) == 0 && file_equals(out, new_words);
  std::filesystem::remove(out);
  return m;
}

// ------------------------------------------------------------------------------------------------
// The three parts.

std::vector<table2_row> run_table2(const options& o) {
  const std::size_t n = o.table2_elements;
  progress("table 2: %zu values", n);
  std::vector<std::uint16_t> old_words(n), new_words(n), resident(n), changed_words;
  dcr::bench::fill_normal_bf16(old_words, o.seed);
  dcr::bench::plain_zstd z(o.zstd_level);
  std::vector<std::byte> zbuf;
  dcr_codec ours(n, n, o.zstd_level);
  std::vector<table2_row> rows;
  for (std::size_t r = 0; r < paper_rows.size(); ++r) {
    table2_row row;
    row.a = paper_rows[r].a;
    dcr::bench::table2_update(old_words, row.a, new_words, o.seed + 1 + r);
    // The paper's streams: the changed words in input order, no locations.
    changed_words.clear();
    std::vector<std::uint16_t> masks;
    dcr::bench::histogram16 xor_hist, ulp_hist;
    for (std::size_t i = 0; i < n; ++i) {
      if (old_words[i] == new_words[i]) continue;
      changed_words.push_back(new_words[i]);
      const auto x = static_cast<std::uint16_t>(old_words[i] ^ new_words[i]);
      masks.push_back(x);
      xor_hist.add(x);
      ulp_hist.add(static_cast<std::uint16_t>(dcr::bench::bf16_order_key(new_words[i]) -
                                              dcr::bench::bf16_order_key(old_words[i])));
    }
    row.changed = masks.size();
    row.overwrite_bytes = z.compress(changed_words.data(), changed_words.size() * 2, zbuf);
    row.xor_bytes = z.compress(masks.data(), masks.size() * 2, zbuf);
    row.xor_entropy_bytes = xor_hist.entropy_bits() / 8;
    row.ulp_entropy_bytes = ulp_hist.entropy_bits() / 8;
    // Ours: one item of one tensor holding the 20M values.
    ours.diff(old_words, new_words, nullptr);
    std::tie(row.ours_value_bytes, row.ours_location_bytes) = ours.value_and_location_bytes();
    row.ours_encoding = ours.encodings();
    resident = old_words;
    ours.apply(resident, nullptr);
    row.verified = resident == new_words;
    rows.push_back(row);
  }
  return rows;
}

struct stress_results {
  std::vector<stress_row> sizes;
  std::vector<throughput_row> speeds;
  std::size_t tensors = 0;
  std::string zstd_flags, xdelta_flags;
};

template <class Baseline>
method_result run_baseline(const char* name, Baseline& b, std::span<const std::uint16_t> old_words,
                           std::span<const std::uint16_t> new_words,
                           std::span<std::uint16_t> scratch, std::size_t changed, int reps) {
  method_result m;
  m.name = name;
  b.prepare(old_words.size(), changed);
  m.seconds = 1e300;
  for (int r = 0; r < reps; ++r) {
    const double w = wall_now(), t = clock_type::now();
    m.bytes = b.encode(old_words, new_words);
    if (seconds_since(t) < m.seconds) {
      m.seconds = seconds_since(t);
      m.wall_seconds = wall_now() - w;
    }
  }
  b.decode(old_words, scratch);
  m.verified = std::equal(scratch.begin(), scratch.end(), new_words.begin());
  return m;
}

// The library variants of one rate: checkpoint_differ in memory on one and on two threads, with
// the digests `dcr diff` records, and diff_checkpoints on files under /tmp (when `tmp`).
void run_library(const options& o, const dcr_codec& ours, std::span<const std::uint16_t> old_words,
                 std::span<const std::uint16_t> new_words, std::span<std::uint16_t> scratch,
                 const temp_dir* tmp, throughput_row& speed) {
  struct variant {
    const char* name;
    bool worker, digests;
    const char* note;
  };
  for (const variant v :
       {variant{"differ", false, false, "checkpoint_differ::diff_tensors, in memory, one thread"},
        variant{"differ", true, false,
                "checkpoint_differ::diff_tensors, in memory, worker thread"},
        variant{"differ + digests", false, true,
                "the same with the XXH3-128 digests of every tensor (what dcr diff records)"},
        variant{"differ + digests", true, true,
                "the same with the XXH3-128 digests of every tensor (what dcr diff records)"}}) {
    progress("rate %.3f: %s, %s", speed.rate, v.name, v.worker ? "2 threads" : "1 thread");
    library_result r;
    r.name = v.name;
    r.note = v.note;
    r.threads = v.worker ? 2 : 1;
    library_differ ld(ours, o.zstd_level, v.worker, v.digests);
    (void)ld.run(old_words, new_words);  // sizes and touches every buffer, starts the worker
    for (int k = 0; k < o.reps; ++k) r.runs.push_back(ld.run(old_words, new_words));
    r.verified = ld.verify(old_words, new_words, scratch);
    r.bytes = ld.payload_bytes();
    r.payloads = ld.report().payloads;
    speed.library.push_back(std::move(r));
  }
  if (tmp == nullptr) return;
  progress("rate %.3f: diff_checkpoints on files", speed.rate);
  const std::string old_path = tmp->path("old.safetensors"), new_path = tmp->path("new.safetensors"),
                    delta_path = tmp->path("step.dcrdelta");
  write_checkpoint(new_path, ours, new_words);
  library_result r;
  r.name = "diff_checkpoints";
  r.note = "files under /tmp (in the page cache), as `dcr diff` runs: a new differ each time, "
           "files mapped, digests, delta file written and fsynced";
  r.threads = 2;
  dcr::io::diff_report report;
  for (int k = 0; k < o.reps; ++k)
    r.runs.push_back(time_run([&] { report = dcr::io::diff_checkpoints(old_path, new_path, delta_path); }));
  r.verified = verify_delta_file(delta_path, ours, old_words, new_words, scratch);
  r.bytes = report.delta_bytes;
  r.payloads = report.payloads;
  speed.library.push_back(std::move(r));
  std::filesystem::remove(delta_path);
  std::filesystem::remove(new_path);
}

stress_results run_stress(const options& o) {
  stress_results res;
  const std::size_t n = o.elements;
  progress("stress: %zu BF16 elements (%.0f MiB per array), tensors of %zu", n,
           n * 2.0 / (1 << 20), o.tensor_elements);
  std::vector<std::uint16_t> old_words, new_words, scratch;
  presize(old_words, n);
  presize(new_words, n);
  presize(scratch, n);
  dcr::bench::fill_normal_bf16(old_words, o.seed);
  std::vector<std::uint64_t> chosen;
  dcr_codec ours(n, o.tensor_elements, o.zstd_level);
  res.tensors = ours.tensor_count();

  const bool tools = o.stress && o.tools;
  const bool have_zstd = tools && tool_available("zstd");
  const bool have_xdelta = tools && tool_available("xdelta3");
  const bool files = o.throughput && o.files;
  std::optional<temp_dir> tmp;
  if (have_zstd || have_xdelta || files) tmp.emplace();
  if (have_zstd || have_xdelta) write_file(tmp->path("old.bin"), old_words);
  if (files) write_checkpoint(tmp->path("old.safetensors"), ours, old_words);
  res.zstd_flags = format("zstd -q -f -T1 -%d --long=31 --patch-from=old.bin new.bin -o patch.zst",
                          o.zstd_level);
  res.xdelta_flags = "xdelta3 -e -f -q -s old.bin new.bin patch.vcdiff";

  for (std::size_t ri = 0; ri < o.rates.size(); ++ri) {
    const double rate = o.rates[ri];
    stress_row row;
    row.rate = rate;
    row.picked = dcr::bench::stress_update(old_words, rate, new_words, o.seed + 100 + ri, chosen);
    dcr::bench::histogram16 ulp_hist;
    for (std::size_t i = 0; i < n; ++i)
      if (old_words[i] != new_words[i])
        ulp_hist.add(static_cast<std::uint16_t>(dcr::bench::bf16_order_key(new_words[i]) -
                                                dcr::bench::bf16_order_key(old_words[i])));
    row.changed = ulp_hist.total;
    const double p = static_cast<double>(row.changed) / static_cast<double>(n);
    row.index_entropy_bytes = static_cast<double>(n) * dcr::bench::binary_entropy(p) / 8;
    row.value_entropy_bytes = ulp_hist.entropy_bits() / 8;
    progress("rate %.3f: %zu picked, %zu changed", rate, row.picked, row.changed);

    // Ours: diff (timed, best of reps), then apply into a copy of old (timed) and compare.
    ours.prepare(old_words, new_words, scratch);
    throughput_row speed;
    speed.rate = rate;
    speed.diff_s = speed.apply_s = speed.compare_s = 1e300;
    method_result mine;
    mine.name = "dcr";
    for (int r = 0; r < o.reps; ++r) {
      diff_stages s;
      const double w = wall_now(), t = clock_type::now();
      mine.bytes = ours.diff(old_words, new_words, &s);
      const double sec = seconds_since(t);
      if (sec < speed.diff_s) {
        speed.diff_s = sec;
        speed.diff_wall_s = wall_now() - w;
        speed.diff = s;
      }
    }
    mine.seconds = speed.diff_s;
    mine.wall_seconds = speed.diff_wall_s;
    row.ours_encoding = ours.encodings();
    mine.note = format("one payload, %zu items of <= %zu elements (%s)", ours.tensor_count(),
                       o.tensor_elements, row.ours_encoding.c_str());
    bool apply_ok = true;
    for (int r = 0; r < o.reps; ++r) {
      std::memcpy(scratch.data(), old_words.data(), n * 2);
      apply_stages s;
      const auto t = clock_type::now();
      ours.apply(scratch, &s);
      const double sec = seconds_since(t);
      apply_ok = apply_ok && scratch == new_words;
      if (sec < speed.apply_s) {
        speed.apply_s = sec;
        speed.apply = s;
      }
    }
    mine.verified = speed.verified = apply_ok;
    std::tie(speed.zstd_compress_s, speed.zstd_decompress_s) =
        ours.zstd_seconds(o.zstd_level, o.reps);
    row.methods.push_back(mine);
    if (o.throughput) {
      std::size_t d = 0;
      speed.compare_wall_s = 1e300;
      for (int r = 0; r < std::max(o.reps, 3); ++r) {
        const double w = wall_now();
        const auto t = clock_type::now();
        d = compare_count(old_words.data(), new_words.data(), n);
        speed.compare_s = std::min(speed.compare_s, seconds_since(t));
        speed.compare_wall_s = std::min(speed.compare_wall_s, wall_now() - w);
      }
      if (d != row.changed) throw std::logic_error("compare loop disagrees with the change count");
      speed.detect_alone_s = ours.detect_seconds(old_words, new_words, std::max(o.reps, 3));
      run_library(o, ours, old_words, new_words, scratch, files ? &*tmp : nullptr, speed);
      res.speeds.push_back(speed);
    }

    if (o.stress) {
      {
        dcr::bench::paper_style b(o.zstd_level);
        row.methods.push_back(
            run_baseline("paper-style", b, old_words, new_words, scratch, row.changed, o.reps));
        row.methods.back().note = format("xor %zu + gaps %zu bytes", b.mask_bytes(), b.gap_bytes());
      }
      {
        dcr::bench::sparse_int32 b(o.zstd_level);
        row.methods.push_back(
            run_baseline("int32+overwrite", b, old_words, new_words, scratch, row.changed, o.reps));
      }
      {
        dcr::bench::dense_xor b(o.zstd_level);
        row.methods.push_back(run_baseline("dense xor", b, old_words, new_words, scratch,
                                           row.changed, std::min(o.reps, 2)));
      }
      if (have_zstd || have_xdelta) write_file(tmp->path("new.bin"), new_words);
      const std::string old_f = shell_quote(tmp ? tmp->path("old.bin") : "");
      const std::string new_f = shell_quote(tmp ? tmp->path("new.bin") : "");
      const std::string out_f = tmp ? tmp->path("out.bin") : "";
      if (have_zstd) {
        progress("rate %.3f: zstd --patch-from", rate);
        const std::string patch = tmp->path("patch.zst");
        row.methods.push_back(run_tool(
            "zstd --patch-from",
            format("zstd -q -f -T1 -%d --long=31 --patch-from=", o.zstd_level) + old_f + " " +
                new_f + " -o " + shell_quote(patch),
            "zstd -q -f -d -T1 --long=31 --patch-from=" + old_f + " " + shell_quote(patch) +
                " -o " + shell_quote(out_f),
            patch, out_f, new_words, "CLI, CPU time incl. file I/O"));
        std::filesystem::remove(patch);
      }
      if (have_xdelta) {
        progress("rate %.3f: xdelta3", rate);
        const std::string patch = tmp->path("patch.vcdiff");
        row.methods.push_back(run_tool(
            "xdelta3", "xdelta3 -e -f -q -s " + old_f + " " + new_f + " " + shell_quote(patch),
            "xdelta3 -d -f -q -s " + old_f + " " + shell_quote(patch) + " " + shell_quote(out_f),
            patch, out_f, new_words, "CLI, CPU time incl. file I/O"));
        std::filesystem::remove(patch);
      }
    }
    res.sizes.push_back(row);
  }
  return res;
}

// ------------------------------------------------------------------------------------------------
// Output

std::string read_first_line(const char* path, const char* key) {
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);)
    if (line.rfind(key, 0) == 0) {
      const auto colon = line.find(':');
      std::string v = colon == std::string::npos ? line : line.substr(colon + 1);
      while (!v.empty() && v.front() == ' ') v.erase(v.begin());
      return v;
    }
  return "?";
}
std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

struct machine_info {
  std::string cpu, memory, cores, compiler, zstd_lib, zstd_cli, xdelta, load_start, load_end;
};

machine_info describe_machine() {
  machine_info m;
  m.cpu = read_first_line("/proc/cpuinfo", "model name");
  const std::string flags = " " + read_first_line("/proc/cpuinfo", "flags") + " ";
  const bool avx512 = flags.find(" avx512bw ") != std::string::npos &&
                      flags.find(" avx512_vbmi2 ") != std::string::npos;
  m.cpu += avx512 ? " (AVX-512 BW/VBMI2)" : " (no AVX-512 BW/VBMI2)";
  const std::string kb = read_first_line("/proc/meminfo", "MemTotal");
  m.memory = kb == "?" ? kb : format("%.1f GiB", std::stod(kb) / (1 << 20));
  m.cores = std::to_string(::sysconf(_SC_NPROCESSORS_ONLN));
  m.compiler = std::string("g++ ") + __VERSION__;
  m.zstd_lib = ZSTD_versionString();
  m.zstd_cli = command_output("zstd --version 2>/dev/null | grep -o 'v[0-9][0-9.]*' | head -1");
  m.xdelta = command_output("xdelta3 -V 2>&1 | grep -o 'version [0-9][0-9.]*' | head -1");
  m.load_start = loadavg();
  return m;
}

double mb(double bytes) { return bytes / 1e6; }
double gbps(std::size_t n, double s) { return n * 2.0 / 1e9 / s; }

void print_markdown(const options& o, const machine_info& mi, const std::vector<table2_row>& t2,
                    const std::optional<stress_results>& st) {
  std::printf("<!-- codec_report --elements %zu --tensor-elements %zu --table2-elements %zu "
              "--reps %d --seed %llu -->\n\n",
              o.elements, o.tensor_elements, o.table2_elements, o.reps,
              static_cast<unsigned long long>(o.seed));
  std::printf("Machine: %s, %s cores online, %s memory, %s; zstd library %s, zstd CLI %s, "
              "xdelta3 %s. Load average (1, 5, 15 min) at start %s, at end %s.\n\n",
              mi.cpu.c_str(), mi.cores.c_str(), mi.memory.c_str(), mi.compiler.c_str(),
              mi.zstd_lib.c_str(), mi.zstd_cli.c_str(), mi.xdelta.c_str(), mi.load_start.c_str(),
              mi.load_end.c_str());

  if (!t2.empty()) {
    std::printf("### Table 2 protocol (%zu values, zstd -%d, MB = 10^6 bytes)\n\n",
                o.table2_elements, o.zstd_level);
    if (o.table2_elements != paper_values)
      std::printf("(The paper's figures, for 20,000,000 values, are scaled by %zu / "
                  "20,000,000.)\n\n",
                  o.table2_elements);
    std::printf("| a | changed words | overwrite MB (paper, deviation) | xor MB (paper, deviation) | xor H0 MB (ref) | "
                "ulp H0 MB (ref) |\n|---:|---:|---:|---:|---:|---:|\n");
    for (std::size_t r = 0; r < t2.size(); ++r) {
      const auto& row = t2[r];
      const auto p = paper_row(r, o.table2_elements);
      std::printf("| %.0e | %zu | %.3f (%.2f, %+.1f%%) | %.3f (%.2f, %+.1f%%) | %.3f (%.3f) | "
                  "%.3f (%.3f) |\n",
                  row.a, row.changed, mb(row.overwrite_bytes), p.overwrite_mb,
                  100 * (mb(row.overwrite_bytes) / p.overwrite_mb - 1), mb(row.xor_bytes),
                  p.xor_mb, 100 * (mb(row.xor_bytes) / p.xor_mb - 1),
                  mb(row.xor_entropy_bytes), p.xor_h0_mb, mb(row.ulp_entropy_bytes), p.ulp_h0_mb);
    }
    std::printf("\ndcr's value streams for the same changed words (one item; values only, as in "
                "the paper; the item's location stream is listed apart). Target: paper xor / dcr "
                ">= 1.45 on every row.\n\n");
    std::printf("| a | encoding | dcr value MB | paper xor / dcr | measured xor / dcr | dcr / ulp H0 "
                "| location MB | round trip |\n|---:|---|---:|---:|---:|---:|---:|---|\n");
    for (std::size_t r = 0; r < t2.size(); ++r) {
      const auto& row = t2[r];
      const double v = mb(row.ours_value_bytes);
      const double ratio = paper_row(r, o.table2_elements).xor_mb / v;
      std::printf("| %.0e | %s | %.3f | %.2fx %s | %.2fx | %.3f | %.3f | %s |\n", row.a,
                  row.ours_encoding.c_str(), v, ratio, ratio >= 1.45 ? "(met)" : "(**missed**)",
                  mb(row.xor_bytes) / v, row.ours_value_bytes / row.ulp_entropy_bytes,
                  mb(row.ours_location_bytes), row.verified ? "bit-exact" : "**FAILED**");
    }
    std::printf("\n");
  }

  if (st && !st->sizes.empty() && o.stress) {
    std::printf("### Stress protocol (%zu BF16 elements, zstd -%d)\n\n", o.elements,
                o.zstd_level);
    std::printf("dcr: one payload of %zu items (tensors of up to %zu elements), whole payload "
                "bytes (header, table, checksum included). Baselines over the whole array, each "
                "stream one zstd call. MB/s = checkpoint (old array) bytes per CPU second of encoding "
                "on one core (best of %d); CLI tools: user + system CPU seconds of one run "
                "including file I/O. Bound = N*H2(p) + "
                "changed*H0(ulp deltas), p = changed / N.\n\n",
                st->tensors, o.tensor_elements, o.reps);
    std::printf("CLI flags: `%s`; `%s`.\n\n", st->zstd_flags.c_str(), st->xdelta_flags.c_str());
    std::printf("| rate | changed | method | bytes | B / changed | x paper-style | / bound | MB/s | "
                "round trip |\n|---:|---:|---|---:|---:|---:|---:|---:|---|\n");
    for (const auto& row : st->sizes) {
      const auto* paper = row.find("paper-style");
      const double changed = static_cast<double>(row.changed);
      for (const auto& m : row.methods) {
        std::printf("| %.0f%% | %zu | %s | %zu | %.3f | %s | %.3f | %s | %s |\n", row.rate * 100,
                    row.changed, m.name.c_str(), m.bytes, m.bytes / changed,
                    paper != nullptr && m.bytes != 0
                        ? format("%.2fx", static_cast<double>(paper->bytes) / m.bytes).c_str()
                        : "-",
                    m.bytes / row.bound_bytes(),
                    m.seconds > 0 ? format("%.0f", o.elements * 2.0 / 1e6 / m.seconds).c_str()
                                  : "-",
                    m.verified ? "bit-exact" : "**FAILED**");
      }
      std::printf("| %.0f%% | %zu | entropy bound | %.0f | %.3f | %s | 1.000 | - | - |\n",
                  row.rate * 100, row.changed, row.bound_bytes(), row.bound_bytes() / changed,
                  paper ? format("%.2fx", paper->bytes / row.bound_bytes()).c_str() : "-");
    }
    std::printf("\nTargets: paper-style / dcr >= 1.4 and dcr <= 1.05 x bound at each rate.\n\n");
    std::printf("| rate | picked | changed | index entropy B | value entropy B | paper-style / "
                "dcr | dcr / bound |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& row : st->sizes) {
      const auto* paper = row.find("paper-style");
      const auto* mine = row.find("dcr");
      const double vs_paper = paper ? static_cast<double>(paper->bytes) / mine->bytes : 0;
      const double vs_bound = mine->bytes / row.bound_bytes();
      std::printf("| %.0f%% | %zu | %zu | %.0f | %.0f | %.3fx %s | %.3f %s |\n", row.rate * 100,
                  row.picked, row.changed, row.index_entropy_bytes, row.value_entropy_bytes,
                  vs_paper, vs_paper >= 1.4 ? "(met)" : "(**missed**)", vs_bound,
                  vs_bound <= 1.05 ? "(met)" : "(**missed**)");
    }
    std::printf("\n");
  }

  if (st && !st->speeds.empty()) {
    std::printf("### Throughput, one core (%zu BF16 elements, %.0f MiB per array; best of %d)\n\n",
                o.elements, o.elements * 2.0 / (1 << 20), o.reps);
    std::printf("GB/s of checkpoint = old array bytes / CPU second of the thread (CPU / wall "
                "near 1 means the thread had its core to itself). compare = plain loop counting "
                "differing u16 words. diff (one thread) = the codec through its public API on the "
                "calling thread: detect_and_gather + encode_gathered_item (choose_encoding, "
                "values in place) + payload_encoder::encode (locations, values, zstd), one payload. apply = decode "
                "(incl. zstd) + write new words into a copy of old. Targets at 3%%: diff >= 0.60 x "
                "compare (judged on the library diff below, which may use a second thread); apply "
                ">= 1 GB/s.\n\n");
    std::printf("| rate | compare GB/s | diff GB/s (one thread) | diff / compare | apply GB/s | "
                "diff CPU / wall | round trip |\n|---:|---:|---:|---:|---:|---:|---|\n");
    for (const auto& s : st->speeds) {
      const double c = gbps(o.elements, s.compare_s), d = gbps(o.elements, s.diff_s),
                   a = gbps(o.elements, s.apply_s);
      std::printf("| %.0f%% | %.2f | %.2f | %.2f | %.2f %s | %.2f | %s |\n", s.rate * 100, c, d,
                  d / c, a, a >= 1 ? "(met)" : "(**missed**)", s.diff_s / s.diff_wall_s,
                  s.verified ? "bit-exact" : "**FAILED**");
    }
    std::printf("\nThe library path of `dcr diff` on the same data (the tensors above; "
                "dcr::io::checkpoint_differ, default options: payloads of up to 2 Mi records). "
                "In memory: diff_tensors on the arrays, payloads copied into one buffer, warm "
                "differ. Files: diff_checkpoints on safetensors files under /tmp (in the page "
                "cache), cold as `dcr diff` runs it (new differ, files mapped, digests, delta "
                "file written and fsynced). Times are best (worst) of %d: wall, CPU of the "
                "calling thread, CPU of the whole process (every thread, kernel included). "
                "GB/s and x compare use the best wall time against the compare loop's best wall "
                "time (%s).\n\n",
                o.reps, "a loaded machine stretches two-thread wall times most");
    std::printf("| rate | path | threads | wall ms | calling thread CPU ms | process CPU ms | "
                "GB/s | x compare | payloads | bytes | round trip |\n"
                "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (const auto& s : st->speeds)
      for (const auto& l : s.library) {
        const double g = gbps(o.elements, l.best(&timed_run::wall));
        const double x = s.compare_wall_s / l.best(&timed_run::wall);
        const bool judged = l.name == "differ" && l.threads == 2 && std::abs(s.rate - 0.03) < 1e-9;
        std::printf("| %.0f%% | %s | %d | %.1f (%.1f) | %.1f (%.1f) | %.1f (%.1f) | %.2f | %.2f%s "
                    "| %zu | %zu | %s |\n",
                    s.rate * 100, l.name.c_str(), l.threads, l.best(&timed_run::wall) * 1e3,
                    l.worst(&timed_run::wall) * 1e3, l.best(&timed_run::main_cpu) * 1e3,
                    l.worst(&timed_run::main_cpu) * 1e3, l.best(&timed_run::process_cpu) * 1e3,
                    l.worst(&timed_run::process_cpu) * 1e3, g, x,
                    judged ? (x >= 0.6 ? " (met)" : " (**missed**)") : "", l.payloads, l.bytes,
                    l.verified ? "bit-exact" : "**FAILED**");
      }
    std::printf("\nStage times of the best repetition (ms; share of the total):\n\n");
    std::printf("(zstd inside encode / decode: plain zstd at the same level compressing / "
                "decompressing the payload's streams, timed apart.)\n\n");
    std::printf("detect alone: detect_changes over the same tensors outside the diff (for "
                "scale). detect + gather: detect_and_gather, the changed indices and their old "
                "and new words in one pass. choose + values: encode_gathered_item, the encoding "
                "chosen and its values computed in place over the gathered old words.\n\n");
    std::printf("| rate | compare loop | detect alone | detect + gather | choose + values | "
                "encode | zstd inside encode | diff total | decode | zstd inside decode | "
                "scatter | apply total "
                "|\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& s : st->speeds) {
      const auto cell = [](double v, double total) {
        return format("%.1f (%.0f%%)", v * 1e3, 100 * v / total);
      };
      const double dt = s.diff.total(), at = s.apply.total();
      std::printf("| %.0f%% | %.1f | %.1f | %s | %s | %s | %s | %.1f | %s | %s | %s | %.1f |\n",
                  s.rate * 100, s.compare_s * 1e3, s.detect_alone_s * 1e3,
                  cell(s.diff.detect_gather, dt).c_str(), cell(s.diff.item, dt).c_str(),
                  cell(s.diff.encode, dt).c_str(), cell(s.zstd_compress_s, dt).c_str(), dt * 1e3,
                  cell(s.apply.decode, at).c_str(), cell(s.zstd_decompress_s, at).c_str(),
                  cell(s.apply.scatter, at).c_str(), at * 1e3);
    }
    std::printf("\n");
  }
}

void print_json(const options& o, const machine_info& mi, const std::vector<table2_row>& t2,
                const std::optional<stress_results>& st) {
  using json = nlohmann::ordered_json;
  json out;
  out["options"] = {{"elements", o.elements},   {"tensor_elements", o.tensor_elements},
                    {"table2_elements", o.table2_elements}, {"reps", o.reps},
                    {"zstd_level", o.zstd_level}, {"seed", o.seed}};
  out["machine"] = {{"cpu", mi.cpu},
                    {"cores", std::stoll(mi.cores)},
                    {"memory", mi.memory},
                    {"compiler", mi.compiler},
                    {"zstd", mi.zstd_lib},
                    {"zstd_cli", mi.zstd_cli},
                    {"xdelta3", mi.xdelta},
                    {"load_start", mi.load_start},
                    {"load_end", mi.load_end}};
  json& table2 = out["table2"] = json::array();
  for (std::size_t r = 0; r < t2.size(); ++r) {
    const auto& row = t2[r];
    const auto paper = paper_row(r, o.table2_elements);
    table2.push_back({{"a", row.a},
                      {"changed", row.changed},
                      {"overwrite_bytes", row.overwrite_bytes},
                      {"xor_bytes", row.xor_bytes},
                      {"paper_overwrite_mb", paper.overwrite_mb},
                      {"paper_xor_mb", paper.xor_mb},
                      {"xor_entropy_bytes", std::round(row.xor_entropy_bytes)},
                      {"ulp_entropy_bytes", std::round(row.ulp_entropy_bytes)},
                      {"dcr_encoding", row.ours_encoding},
                      {"dcr_value_bytes", row.ours_value_bytes},
                      {"dcr_location_bytes", row.ours_location_bytes},
                      {"paper_xor_over_dcr", paper.xor_mb / mb(row.ours_value_bytes)},
                      {"verified", row.verified}});
  }
  json& stress = out["stress"] = json::array();
  if (st && o.stress)
    for (const auto& row : st->sizes) {
      json methods = json::array();
      for (const auto& m : row.methods)
        methods.push_back({{"name", m.name},
                           {"bytes", m.bytes},
                           {"cpu_seconds", m.seconds},
                           {"wall_seconds", m.wall_seconds},
                           {"verified", m.verified},
                           {"note", m.note}});
      stress.push_back({{"rate", row.rate},
                        {"picked", row.picked},
                        {"changed", row.changed},
                        {"index_entropy_bytes", std::round(row.index_entropy_bytes)},
                        {"value_entropy_bytes", std::round(row.value_entropy_bytes)},
                        {"methods", std::move(methods)}});
    }
  json& throughput = out["throughput"] = json::array();
  if (st)
    for (const auto& s : st->speeds) {
      json library = json::array();
      for (const auto& l : s.library) {
        json runs = json::array();
        for (const auto& q : l.runs)
          runs.push_back(
              {{"wall_s", q.wall}, {"main_cpu_s", q.main_cpu}, {"process_cpu_s", q.process_cpu}});
        library.push_back({{"name", l.name},
                           {"threads", l.threads},
                           {"note", l.note},
                           {"payloads", l.payloads},
                           {"bytes", l.bytes},
                           {"verified", l.verified},
                           {"runs", std::move(runs)}});
      }
      throughput.push_back(
          {{"rate", s.rate},
           {"compare_s", s.compare_s},
           {"diff_s", s.diff_s},
           {"diff_wall_s", s.diff_wall_s},
           {"apply_s", s.apply_s},
           {"detect_alone_s", s.detect_alone_s},
           {"diff_stages_s",
            {{"detect_gather", s.diff.detect_gather},
             {"choose_values", s.diff.item},
             {"encode", s.diff.encode}}},
           {"apply_stages_s", {{"decode", s.apply.decode}, {"scatter", s.apply.scatter}}},
           {"zstd_compress_s", s.zstd_compress_s},
           {"zstd_decompress_s", s.zstd_decompress_s},
           {"compare_wall_s", s.compare_wall_s},
           {"verified", s.verified},
           {"library", std::move(library)}});
    }
  std::printf("%s\n", out.dump(2, ' ', false, json::error_handler_t::replace).c_str());
}

bool all_verified(const std::vector<table2_row>& t2, const std::optional<stress_results>& st) {
  for (const auto& r : t2)
    if (!r.verified) return false;
  if (st)
    for (const auto& r : st->sizes)
      for (const auto& m : r.methods)
        if (!m.verified) return false;
  if (st)
    for (const auto& s : st->speeds)
      for (const auto& l : s.library)
        if (!l.verified) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    machine_info mi = describe_machine();
    std::vector<table2_row> t2;
    if (o.table2) t2 = run_table2(o);
    std::optional<stress_results> st;
    if (o.stress || o.throughput) st = run_stress(o);
    mi.load_end = loadavg();
    if (o.json) print_json(o, mi, t2, st);
    else print_markdown(o, mi, t2, st);
    if (!all_verified(t2, st)) {
      std::fprintf(stderr, "codec_report: a round trip FAILED (see the tables)\n");
      return 1;
    }
    return 0;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "codec_report: %s\n%s", e.what(), usage);
    return 2;
  } catch (const dcr::error& e) {
    std::fprintf(stderr, "codec_report: dcr error [%s]: %s\n", e.code().message().c_str(),
                 dcr::error_text(e).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "codec_report: %s\n", e.what());
    return 1;
  }
}
