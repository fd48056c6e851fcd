// python/src/receiver.hpp: a receiver whose loader is an engine's Python load function.
//
// The Python layer (dcr/_intercept.py) runs the engine's loader once at prewarm on probe tensors
// and records every final storage copy it makes (torch: intercepted copy_ calls; NumPy: an
// explicit sink): destination address, dtype, extents and strides, and the source as a strided
// view of the probe (offset and strides in elements), plus the tensors it skips. Those copies
// are the loader's placement; `recorded_loader` is a dcr loader (dcr/apply/loader.hpp) that
// issues exactly them through whatever sink dcr hands it. dcr then compiles it as it compiles
// any C++ loader (every loader condition checked by the library, errors naming the tensor), and
// after prewarm applies, restores and loads entirely in C++: no Python runs per payload.
#pragma once

#include <string>
#include <vector>

#include "common.hpp"
#include "dcr/apply/loader.hpp"
#include "dcr/refit/receiver.hpp"

namespace dcr_py {

/// One final storage copy of a canonical tensor, as the Python loader made it.
struct recorded_copy {
  std::uintptr_t dst = 0;        ///< address of dst's first element (its view origin)
  std::uint8_t dst_bytes = 0;    ///< storage word width
  int rank = 0;
  dcr::index_array extents{}, dst_strides{}, src_strides{};
  std::int64_t src_offset = 0;   ///< elements from the probe's first element to src's origin
  dcr::element_transform transform{};
};

struct recorded_tensor {
  bool seen = false;   ///< the loader copied or skipped it
  bool skipped = false;
  std::vector<recorded_copy> copies;
};

class recorded_loader {
 public:
  using loader_concept = dcr::loader_tag;

  explicit recorded_loader(const dcr::tensor_registry& registry)
      : registry_(&registry), tensors_(registry.size()) {}

  void clear() { tensors_.assign(registry_->size(), {}); }
  void add_copy(dcr::tensor_id id, const recorded_copy& c) {
    tensors_.at(id).seen = true;
    tensors_.at(id).copies.push_back(c);
  }
  void add_skip(dcr::tensor_id id) {
    tensors_.at(id).seen = true;
    tensors_.at(id).skipped = true;
  }
  /// Declares two tensors the Python engine loads into one storage (Receiver(tied=...)).
  void add_tie(std::string first, std::string second) {
    ties_.push_back({std::move(first), std::move(second)});
  }
  /// The ties declared (dcr::declares_ties): prewarm refuses any other shared storage.
  std::vector<dcr::tensor_tie> tied_tensors() const { return ties_; }

  /// Issues the recorded copies of `t` with `src` as the probe. `src` is the contiguous
  /// canonical tensor dcr passes (scratch, or the words of a dense load).
  template <dcr::storage_word W, class Sink>
  void load(const dcr::canonical_tensor& t, dcr::tensor_view<const W> src, Sink& sink) {
    const auto& r = tensors_.at(registry_->id(t.name));
    DCR_EXPECTS(r.seen, dcr::errc::unsupported_loader_path,
                "dcr loader: the Python loader neither copied nor skipped tensor '" + t.name +
                    "' at prewarm (list it in `skip` if the engine does not load it)");
    if (r.skipped) sink.skip(t);
    for (const auto& c : r.copies) {
      const dcr::tensor_view<const W> s(src.data() + c.src_offset, c.rank, c.extents, c.src_strides);
      dcr::visit_word(c.dst_bytes, [&](auto d) {
        using D = decltype(d);
        const dcr::tensor_view<D> dst(reinterpret_cast<D*>(c.dst), c.rank, c.extents, c.dst_strides);
        sink.copy(dst, s, c.transform);
      });
    }
  }

 private:
  const dcr::tensor_registry* registry_;
  std::vector<recorded_tensor> tensors_;
  std::vector<dcr::tensor_tie> ties_;
};

static_assert(dcr::loader<recorded_loader>);

/// The receiver the Python Receiver holds.
struct py_receiver {
  explicit py_receiver(const dcr::tensor_registry& registry)
      : registry(&registry), loader(registry), rx(registry, loader) {}
  const dcr::tensor_registry* registry;
  recorded_loader loader;
  dcr::receiver<recorded_loader> rx;
};

}  // namespace dcr_py
