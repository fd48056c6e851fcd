// tests/protocol/relay_test_support.hpp: what the relay's test units share (test_relay.cpp,
// test_relay_hostile.cpp): the test certificates, a tree of nodes and roots on 127.0.0.1 with
// its log, and a drained source. Every wait is bounded.
//
// Certificates come from scripts/make-test-certs.sh (DCR_MAKE_TEST_CERTS, set by meson): the
// deployment's CA ("good": owner, root, node; norole, whose certificate grants no role; far, a
// root's certificate issued for DNS:elsewhere.invalid only) and a second, unrelated CA
// ("rogue") in a temporary directory.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "../error_capture.hpp"
#include "dcr/protocol/relay/relay.hpp"

#ifndef DCR_MAKE_TEST_CERTS
#error "DCR_MAKE_TEST_CERTS (the path of scripts/make-test-certs.sh) must be defined"
#endif

namespace relay_test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using dcr::protocol_clock;
using dcr_test::message_of;

/// Lines a relay component logged (its `log` callback runs on its io thread).
struct log_sink {
  mutable std::mutex m;
  std::vector<std::string> lines;
  void add(const std::string& s) {
    std::lock_guard lock(m);
    lines.push_back(s);
  }
  [[nodiscard]] bool contains(const std::string& what) const {
    std::lock_guard lock(m);
    return std::any_of(lines.begin(), lines.end(), [&](auto& l) { return l.find(what) != std::string::npos; });
  }
  [[nodiscard]] std::string all() const {
    std::lock_guard lock(m);
    std::string out;
    for (auto& l : lines) out += l + "\n";
    return out;
  }
};

/// Waits until `done()` or `limit` passes; returns done().
template <class F>
bool eventually(F done, protocol_clock::duration limit = 10s) {
  const auto deadline = protocol_clock::now() + limit;
  while (!done()) {
    if (protocol_clock::now() >= deadline) return done();
    std::this_thread::sleep_for(5ms);
  }
  return true;
}


namespace fs = std::filesystem;
using namespace std::chrono_literals;
using dcr::protocol_clock;
using dcr_test::message_of;

/// The deployment's CA ("good") and an unrelated one ("rogue"), made once per test process.
struct test_certs {
  fs::path good, rogue;
  test_certs() {
    char tmpl[] = "/tmp/dcr-relay-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    const fs::path dir = tmpl;
    good = dir / "good";
    rogue = dir / "rogue";
    const std::string script = std::string("bash '") + DCR_MAKE_TEST_CERTS + "' '";
    for (const auto& cmd : {script + good.string() + "' owner root node norole:none",
                            "DCR_CERT_SAN=DNS:elsewhere.invalid " + script + good.string() + "' far:root",
                            script + rogue.string() + "' owner root node"})
      REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, "make-test-certs.sh failed: " << cmd);
  }
  ~test_certs() {
    std::error_code ec;
    fs::remove_all(good.parent_path(), ec);
  }
};
inline const test_certs& certs() {
  static const test_certs c;
  return c;
}
inline dcr::relay_tls tls(const std::string& role) { return dcr::relay_tls::in_directory(certs().good, role); }

inline const dcr::relay_endpoint any_port{"127.0.0.1", 0};

/// Nodes, then roots connected to every node; owners and sources are made by each test. `tune`
/// may change the options before anything is made; everything logs into `log`.
struct tree {
  using tuning = std::function<void(dcr::relay_node_options&, dcr::relay_root_options&)>;
  log_sink log;  // first: outlives the components that write to it
  std::vector<std::unique_ptr<dcr::relay_node>> nodes;
  std::vector<std::unique_ptr<dcr::relay_root>> roots;
  std::vector<std::unique_ptr<dcr::link_shaper>> flows;  // one per root (unshaped: counts bytes)
  dcr::relay_node_options node_options;
  dcr::relay_root_options root_options;

  tree(int root_count, int node_count, std::uint64_t node_window = std::uint64_t{256} << 20,
       std::uint64_t owner_window = std::uint64_t{8} << 20, const tuning& tune = {}) {
    node_options.tls = tls("node");
    node_options.window_bytes = node_window;
    node_options.log = [this](const std::string& s) { log.add(s); };
    root_options.log = [this](const std::string& s) { log.add(s); };
    root_options.tls = tls("root");
    root_options.owner_window_bytes = owner_window;
    root_options.ready_timeout = 3000ms;
    if (tune) tune(node_options, root_options);
    for (int n = 0; n < node_count; ++n) {
      auto o = node_options;
      o.listen = any_port;
      o.name = "node " + std::to_string(n);
      nodes.push_back(std::make_unique<dcr::relay_node>(o));
    }
    for (auto& n : nodes) root_options.nodes.push_back(n->endpoint());
    for (int r = 0; r < root_count; ++r) {
      auto o = root_options;
      o.listen = any_port;
      o.name = "root " + std::to_string(r);
      roots.push_back(std::make_unique<dcr::relay_root>(o));
      flows.push_back(std::make_unique<dcr::link_shaper>(0.0));
    }
  }
  [[nodiscard]] dcr::relay_owner_options owner_options(std::uint32_t owner) const {
    dcr::relay_owner_options o;
    for (auto& r : roots) o.roots.push_back(r->endpoint());
    for (auto& f : flows) o.flows.push_back(f.get());
    o.tls = tls("owner");
    o.name = "owner " + std::to_string(owner);
    o.chunk_bytes = 256 * 1024;
    o.connect_timeout = 5000ms;
    return o;
  }
  /// Waits until every root is connected to every node and knows its receivers.
  void wait_connected(const std::vector<std::size_t>& attached_per_node) {
    const auto deadline = protocol_clock::now() + 10s;
    for (;;) {
      bool ok = true;
      for (auto& n : nodes) ok = ok && n->roots_connected() == roots.size();
      for (auto& r : roots) ok = ok && r->stats().nodes_connected == nodes.size();
      (void)attached_per_node;
      if (ok) return;
      REQUIRE_MESSAGE(protocol_clock::now() < deadline, "the relay tree did not connect");
      std::this_thread::sleep_for(5ms);
    }
  }
  [[nodiscard]] std::uint64_t crossing_bytes() const {
    std::uint64_t b = 0;
    for (auto& f : flows) b += f->bytes();
    return b;
  }
};

inline std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> out(n);
  std::mt19937_64 rng(seed);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

/// Drains one source for `key` until complete: id -> bytes (each id once).
struct drained {
  std::map<dcr::payload_id, std::vector<std::byte>> got;
  std::size_t duplicates = 0;
  std::string error;
  bool complete = false;
};
inline drained drain(dcr::relay_node::source& s, const dcr::attempt_key& key, std::vector<std::uint32_t> owners,
              protocol_clock::duration limit = 20s) {
  drained out;
  s.open(key, owners);
  const auto deadline = protocol_clock::now() + limit;
  try {
    for (;;) {
      dcr::delivery d;
      const auto st = s.next(d, deadline);
      if (st == dcr::source_status::complete) {
        out.complete = true;
        break;
      }
      if (st == dcr::source_status::timed_out) break;
      if (!out.got.emplace(d.id, std::move(d.bytes)).second) ++out.duplicates;
    }
  } catch (const dcr::error& e) {
    out.error = e.what();
  }
  s.close(key);
  return out;
}

inline const dcr::attempt_key key1{0, 1, 0};

/// An attempt deadline for the tests' owners: every wait of theirs ends by then.
inline protocol_clock::time_point soon() { return protocol_clock::now() + 8s; }


}  // namespace relay_test
