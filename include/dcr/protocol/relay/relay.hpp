// dcr/protocol/relay/relay.hpp: the relay transport, authenticated with mutual TLS (docs/transports.md).
// Not part of dcr.hpp: it needs standalone Asio and OpenSSL (meson: the dcr-relay dependency).
//
//   trainer cluster          |  rollout cluster
//                            |
//   owner 0 --\  cross-      |  root 0 --\   local      node A: receivers r0, r1
//   owner 1 ---+ cluster  ---+  root 1 ---+  links  --> node B: receivers r2, r3
//   owner 2 --/  flows       |  root 2 --/             ...
//
// Three parts, each in its own header:
//   relay_owner_store (relay_owner.hpp)  the owner's payload sink: streams each payload to one
//       root (striped by payload: (owner + sequence) mod roots), booking its bytes on that
//       root's cross-cluster flow (a dcr::link_shaper); its manifest completes only once every
//       payload was delivered to every required receiver;
//   relay_root (relay_root.hpp)          in the rollout cluster: forwards each payload, chunk by
//       chunk as it arrives, to every node hosting a receiver the attempt requires;
//   relay_node (relay_node.hpp)          one per rollout node: assembles payloads and hands them
//       to its receivers through relay_node::source (a payload_source).
// One root is the paper's relay tree (a star: the root forwards to every node itself); several
// roots stripe the payloads so that each root, with its own cross-cluster flow(s), carries a
// share, and each payload still crosses the boundary exactly once per attempt.
//
// The protocol around the data (dcr/protocol/owner_agent.hpp, receiver_agent.hpp) is unchanged:
// the owner agent announces each attempt to its sink (attempt_routed_sink) before its payloads,
// the receiver agent closes its source at the end of each attempt (closable_source), the
// coordinator has nothing to erase (nothing_to_erase). Receivers still deduplicate, refuse
// stale payloads and refetch as over any store. Credits bound every buffer: an owner's bytes at
// a root by the root's window, a root's bytes at a node by the node's window.
#pragma once

#include "dcr/protocol/relay/relay_link.hpp"
#include "dcr/protocol/relay/relay_node.hpp"
#include "dcr/protocol/relay/relay_owner.hpp"
#include "dcr/protocol/relay/relay_root.hpp"
