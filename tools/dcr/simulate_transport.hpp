// tools/dcr/simulate_transport.hpp: the payload transport of `dcr simulate` across processes,
// one function per side, so that each transport (--store DIR today) is one branch in each:
//   with_owner_store(s, f)        f(store): what an owner agent puts its payloads into;
//   with_coordinator_store(s, f)  f(store): what the coordinator erases committed payloads from;
//   with_receiver_source(s, f)    f(source): what a receiver agent reads its payloads from.
// Each calls f with an object that lives for the whole call and returns what f returns.
#pragma once

#include <filesystem>
#include <string>

#include "dcr/protocol/payload_source.hpp"
#include "dcr/protocol/payload_store.hpp"
#include "simulate_processes.hpp"

namespace dcr_tool {

/// The filesystem payload store's directory: --store DIR, or DIR/store of the work directory.
inline std::string store_dir(const simulate_settings& s) {
  return s.store.empty() ? (std::filesystem::path(s.workdir) / "store").string() : s.store;
}

template <class F>
int with_owner_store(const simulate_settings& s, F&& f) {
  dcr::file_payload_store store(store_dir(s));
  return f(store);
}

template <class F>
int with_coordinator_store(const simulate_settings& s, F&& f) {
  dcr::file_payload_store store(store_dir(s));
  return f(store);
}

template <class F>
int with_receiver_source(const simulate_settings& s, F&& f) {
  dcr::file_payload_store store(store_dir(s));
  dcr::store_source<dcr::file_payload_store> source(store);
  return f(source);
}

}  // namespace dcr_tool
