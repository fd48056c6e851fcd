// dcr/transport/concept.hpp: what a transport policy type provides.
//
// Transports carry payloads from owners to receivers with object-storage semantics: an owner
// publishes each payload once, then publishes its part of the attempt's manifest (the list of
// payload ids it produced); receivers read the manifest and fetch every payload it lists. No
// collective spans trainer and rollout. Implementations: memory_transport (in-process, tests and
// `dcr simulate`); filesystem, S3 and relay-tree transports are separate policy types.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dcr/codec/item.hpp"

namespace dcr {

/// Opt-in tag: a transport declares `using transport_concept = dcr::transport_tag;`.
struct transport_tag {};

template <class T>
concept transport =
    std::same_as<typename T::transport_concept, transport_tag> &&
    requires(T& t, const payload_id& id, std::span<const std::byte> bytes, const attempt_key& key,
             std::uint32_t owner, std::span<const payload_id> ids, std::vector<std::byte>& out) {
      t.publish(id, bytes);                 // upload one payload (idempotent for equal bytes)
      t.publish_manifest(key, owner, ids);  // this owner's payloads of the attempt are complete
      { t.manifest(key) } -> std::same_as<std::vector<payload_id>>;  // all ids listed so far
      { t.owners_listed(key) } -> std::same_as<std::uint32_t>;       // owners that published
      t.fetch(id, out);                     // download; throws transport_failure if absent
    };

}  // namespace dcr
