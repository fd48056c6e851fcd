// dcr/apply/loader.hpp: the contract between dcr and an engine's native weight loader.
//
// dcr never knows where a receiver keeps its weights. The engine's own loader does: given one
// canonical tensor (Hugging Face name, dtype, shape) and a read-only view of its words, it splits
// by tensor-parallel rank, fuses q/k/v or gate/up, transposes, pads, or skips experts the rank
// does not hold, exactly as it would for a dense checkpoint load. dcr only asks the loader to
// perform every *final storage copy* through a sink:
//
//   struct my_engine_loader {
//     using loader_concept = dcr::loader_tag;
//     template <dcr::storage_word W, class Sink>
//     void load(const dcr::canonical_tensor& t, dcr::tensor_view<const W> src, Sink& sink) {
//       auto dst = /* tensor_view<W> into engine storage */;
//       sink.copy(dst, src.slice(0, row_begin, rows));   // a view of src, same shape as dst
//       // or, when this rank holds nothing of t:  sink.skip(t);
//     }
//   };
//
// The same loader then serves the dense refit (dcr::dense_sink copies every element) and the
// in-place delta apply (dcr::delta_sink writes only the changed elements), which is why a delta
// apply ends bit-identical to a dense refit.
//
// Loader conditions (checked by the sinks; a violation is errc::unsupported_loader_path naming
// the tensor):
//   * every `src` passed to copy() is a view of the `src` the loader was given (built with
//     slice/select/transpose/reshape, or any strided view of the same words): the delta sink
//     locates changed elements by address, so a copy from a temporary buffer cannot be applied;
//   * src views are non-overlapping strided views (no broadcast, stride 0 with extent > 1);
//   * dst and src of one copy have the same extents;
//   * each canonical value reaches storage unchanged (same word, no arithmetic); element
//     transforms such as dtype casts are a planned extension (see below);
//   * for every tensor, load() either issues copies or calls skip(t), never both, never neither;
//   * load() is deterministic: the same tensor yields the same copies on every call.
//
// Extension: a later revision adds `sink.copy(dst, src, transform)` for element transforms.
// The two-argument copy() keeps meaning "identity", so loaders written against this header keep
// compiling and keep their meaning.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "dcr/canonical.hpp"
#include "dcr/dtype.hpp"
#include "dcr/tensor_view.hpp"

namespace dcr {

/// Opt-in tag: a loader declares `using loader_concept = dcr::loader_tag;`.
struct loader_tag {};

/// Opt-in tag carried by dcr's sinks (`using sink_concept = dcr::sink_tag;`).
struct sink_tag {};

namespace detail {
/// The narrowest sink a loader may rely on: exactly the operations every dcr sink provides.
/// Declared only, never defined: it exists to check loaders in unevaluated contexts.
template <storage_word W>
struct archetype_sink {
  using sink_concept = sink_tag;
  void copy(tensor_view<W> dst, tensor_view<const W> src);
  void skip(const canonical_tensor& t);
};
}  // namespace detail

/// A sink for words W: receives a loader's final storage copies and explicit skips.
template <class S, class W>
concept sink_for = storage_word<W> && std::same_as<typename S::sink_concept, sink_tag> &&
                   requires(S& s, tensor_view<W> dst, tensor_view<const W> src,
                            const canonical_tensor& t) {
                     s.copy(dst, src);
                     s.skip(t);
                   };

static_assert(sink_for<detail::archetype_sink<std::uint16_t>, std::uint16_t>);

/// A loader that can place canonical tensors of word type W. It opts in with the tag and its
/// `load` must compile against the archetype sink, i.e. use nothing beyond copy() and skip().
template <class L, class W>
concept loader_for =
    storage_word<W> && std::same_as<typename std::remove_cvref_t<L>::loader_concept, loader_tag> &&
    requires(L& l, const canonical_tensor& t, tensor_view<const W> src,
             detail::archetype_sink<W>& sink) { l.load(t, src, sink); };

/// A loader for every word width dcr moves (1, 2, 4 and 8 bytes); the receiver picks the width
/// from each tensor's dtype at run time, so it instantiates all four.
template <class L>
concept loader = loader_for<L, std::uint8_t> && loader_for<L, std::uint16_t> &&
                 loader_for<L, std::uint32_t> && loader_for<L, std::uint64_t>;

}  // namespace dcr
