// dcr/codec/encode_item.hpp: the one path from one tensor's gathered changes to an item in its
// chosen encoding. The owner (dcr/refit/owner.hpp), the whole-checkpoint differ
// (dcr/io/checkpoint.hpp) and the codec benchmarks all build their items here, so what they
// measure and what they send is the same code.
//
// The steps, and who does each:
//   1. gather: the changed indices with their old and new words, entry i of each belonging to
//      one record. The caller does this its own way (detect_and_gather over whole tensors or
//      slices of them, or the owner's projection of its shards), writing indices and old words
//      straight into the item's buffers, so nothing is copied on the way.
//   2. choose the encoding (choose_encoding: policy, permission, estimate) and
//   3. compute the values in place over the old words (encode_words): encode_gathered_item.
//   4. pack the items into a payload (payload_encoder::encode), which also checks what it packs
//      against the registry (indices strictly increasing and in range, dtype, lengths).
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "dcr/codec/choose.hpp"
#include "dcr/codec/item.hpp"
#include "dcr/codec/options.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/dtype.hpp"
#include "dcr/error.hpp"

namespace dcr {

/// Turns an item holding gathered changes into an item in its encoding, in place, and returns
/// that encoding.
///
/// On entry `it` holds the records of one tensor: `it.tensor`, `it.type` (of width sizeof(W)),
/// `it.indices` (the changed canonical flat indices, strictly increasing) and `it.values` (the
/// gathered old words: it.count() words of sizeof(W) bytes in host byte order, entry i the
/// committed word of element it.indices[i]; the layout detect_and_gather leaves when handed
/// `it.indices` and `it.values`). `new_words[i]` is the new word of element it.indices[i].
///
/// Sets `it.enc` to choose_encoding<W>(policy, delta_permitted, old words, new_words, options)
/// and overwrites each old word with E::encode(old, new) of that encoding (new bits, xor mask or
/// ulp delta). `it.tensor`, `it.type` and `it.indices` are left as they are; index order and
/// range are not re-checked here (payload_encoder::encode and item_applier do that).
///
/// Errors (dcr::error, `it` unchanged): invalid_argument when W is not the width of it.type, or
/// it.values or new_words does not hold it.count() words.
///
/// Allocates nothing once the calling thread's coding planner is warm (see choose_encoding).
/// Thread safety: calls on different items may run on any threads at once; each thread uses its
/// own planner. `it` and `new_words` must not be written by another thread during the call.
/// Deterministic: equal inputs give equal items on every thread and build.
template <storage_word W>
encoding encode_gathered_item(item& it, std::span<const W> new_words, encoding_policy policy,
                              bool delta_permitted, const codec_options& options = {});

}  // namespace dcr

#include "dcr/detail/codec/encode_item.inl"
