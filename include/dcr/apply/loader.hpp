// dcr/apply/loader.hpp: the contract between dcr and an engine's native weight loader.
//
// dcr never knows where a receiver keeps its weights. The engine's own loader does: given one
// canonical tensor (Hugging Face name, dtype, shape) and a read-only view of its words, it splits
// by tensor-parallel rank, fuses q/k/v or gate/up, transposes, pads, casts, or skips experts the
// rank does not hold, exactly as it would for a dense checkpoint load. dcr only asks the loader
// to perform every *final storage copy* through a sink:
//
//   struct my_engine_loader {
//     using loader_concept = dcr::loader_tag;
//     template <dcr::storage_word W, class Sink>
//     void load(const dcr::canonical_tensor& t, dcr::tensor_view<const W> src, Sink& sink) {
//       auto dst = /* tensor_view<W> into engine storage */;
//       sink.copy(dst, src.slice(0, row_begin, rows));   // a view of src, same shape as dst
//       // a copy into storage of another dtype (an fp32 copy of a bf16 norm):
//       //   sink.copy(norm_f32 /* tensor_view<std::uint32_t> */, src,
//       //             dcr::element_transform::cast(t.type, dcr::dtype::f32));
//       // or, when this rank holds nothing of t:  sink.skip(t);
//     }
//   };
//
// The same loader then serves the dense refit (dcr::dense_sink copies every element), the
// prewarm probe that compiles its placement (dcr/apply/placement.hpp) and the general in-place
// apply (dcr::delta_sink writes only the changed elements), which is why a delta apply ends
// bit-identical to a dense refit.
//
// Loader conditions (a violation is errc::unsupported_loader_path naming the tensor, reported
// by item_applier::prewarm() before any transition; docs/receiver.md lists what can and cannot
// be checked):
//   * every storage write of a canonical value goes through sink.copy(); every `src` passed to
//     copy() is a view of the `src` the loader was given (built with slice/select/transpose/
//     reshape, or any strided view of the same words): dcr locates canonical elements by
//     address, so a copy from a temporary buffer cannot be placed;
//   * src views are non-overlapping strided views (no broadcast, stride 0 with extent > 1);
//   * dst and src of one copy have the same extents;
//   * each canonical value reaches storage unchanged or through one element transform
//     (dcr/apply/transform.hpp: dtype casts on bits); the two-argument copy() is the identity;
//   * each destination element receives at most one canonical element: writing the same
//     element twice makes the tensor overwrite-only; two different tensors may share storage
//     only as a declared tie (below), which makes both overwrite-only;
//   * the loader does not modify its src (the scratch);
//   * for every tensor, load() either issues copies or calls skip(t), never both, never neither;
//   * load() is deterministic: the same tensor yields the same copies on every call, and the
//     placement does not depend on the values in src.
//
// Tied weights. An engine that loads two canonical tensors into one storage (a model with
// tie_word_embeddings whose checkpoint stores both model.embed_tokens.weight and lm_head.weight)
// declares the pair with a member function
//
//     std::vector<dcr::tensor_tie> tied_tensors() const {
//       return {{"model.embed_tokens.weight", "lm_head.weight"}};
//     }
//
// Element i of one tensor may then land where element i of the other does (same dtype, same
// transform); both tensors become overwrite-only, and exactness relies on the checkpoint keeping
// them bit-equal, as tied weights are. Any overlap of two tensors' writes that is not declared
// is refused at prewarm, naming both tensors and the destination address range: a loader that
// writes lm_head into the embedding's storage by mistake would otherwise commit a result no
// dense load gives.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "dcr/apply/transform.hpp"
#include "dcr/canonical.hpp"
#include "dcr/dtype.hpp"
#include "dcr/tensor_view.hpp"

namespace dcr {

/// Opt-in tag: a loader declares `using loader_concept = dcr::loader_tag;`.
struct loader_tag {};

/// Two canonical tensors (by name) that an engine loads into one shared storage: a tie.
struct tensor_tie {
  std::string first;
  std::string second;
};

/// A loader that declares its ties: `std::vector<dcr::tensor_tie> tied_tensors() const`.
template <class L>
concept declares_ties = requires(const L& l) {
  { l.tied_tensors() } -> std::convertible_to<std::vector<tensor_tie>>;
};

/// Opt-in tag carried by dcr's sinks (`using sink_concept = dcr::sink_tag;`).
struct sink_tag {};

namespace detail {
/// The narrowest sink a loader may rely on: exactly the operations every dcr sink provides.
/// Declared only, never defined: it exists to check loaders in unevaluated contexts.
template <storage_word W>
struct archetype_sink {
  using sink_concept = sink_tag;
  void copy(tensor_view<W> dst, tensor_view<const W> src);
  template <storage_word D>
  void copy(tensor_view<D> dst, tensor_view<const W> src, element_transform transform);
  void skip(const canonical_tensor& t);
};
}  // namespace detail

/// A sink for words W: receives a loader's final storage copies (identity, or with an element
/// transform into storage words of any width) and explicit skips.
template <class S, class W>
concept sink_for = storage_word<W> && std::derived_from<typename S::sink_concept, sink_tag> &&
                   requires(S& s, tensor_view<W> dst, tensor_view<std::uint32_t> dst32,
                            tensor_view<std::uint16_t> dst16, tensor_view<const W> src,
                            element_transform tr, const canonical_tensor& t) {
                     s.copy(dst, src);
                     s.copy(dst, src, tr);
                     s.copy(dst32, src, tr);
                     s.copy(dst16, src, tr);
                     s.skip(t);
                   };

static_assert(sink_for<detail::archetype_sink<std::uint16_t>, std::uint16_t>);

/// A loader that can place canonical tensors of word type W. It opts in with the tag and its
/// `load` must compile against the archetype sink, i.e. use nothing beyond copy() and skip().
template <class L, class W>
concept loader_for =
    storage_word<W> && std::derived_from<typename std::remove_cvref_t<L>::loader_concept, loader_tag> &&
    requires(L& l, const canonical_tensor& t, tensor_view<const W> src,
             detail::archetype_sink<W>& sink) { l.load(t, src, sink); };

/// A loader for every word width dcr moves (1, 2, 4 and 8 bytes); the receiver picks the width
/// from each tensor's dtype at run time, so it instantiates all four.
template <class L>
concept loader = loader_for<L, std::uint8_t> && loader_for<L, std::uint16_t> &&
                 loader_for<L, std::uint32_t> && loader_for<L, std::uint64_t>;

}  // namespace dcr
