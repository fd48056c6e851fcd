// tests/protocol/test_relay.cpp: the relay transport (dcr/protocol/relay/relay.hpp) on 127.0.0.1:
// mutual TLS refusals, striped delivery of every payload to every receiver of every node with
// acknowledgements after delivery and bounded memory, duplicates, a root and a node lost
// mid-attempt and the retry after reconnection, and the real agents over the relay for a few
// transitions (faults included), bit-exact with a dense refit. Every wait is bounded.
//
// The certificates, the tree and the drained sources are in relay_test_support.hpp; hostile and
// broken peers (forged roles, malformed counts, overrun windows, floods, frozen roots, connects
// that never finish) are in test_relay_hostile.cpp.
#include "relay_test_support.hpp"

#include "dcr/protocol/coordinator.hpp"
#include "dcr/protocol/plane/memory_control_plane.hpp"
#include "dcr/protocol/owner_agent.hpp"
#include "dcr/protocol/receiver_agent.hpp"
#include "dcr/sim/deployment.hpp"
#include "dcr/sim/moe_engine.hpp"
#include "dcr/sim/moe_model.hpp"
#include "dcr/sim/rank_owner.hpp"
#include "dcr/testing/faults.hpp"

using namespace relay_test;

TEST_CASE("relay: striped delivery of every payload to every receiver, acknowledged after delivery, memory bounded") {
  // 2 roots, 3 nodes of 2 receivers each, 2 owners; a small node window (1 MiB) and owner
  // window (512 KiB) against payloads up to 3 MiB, and receivers that start late, so that
  // credits hold everything back.
  tree t(2, 3, std::uint64_t{1} << 20, std::uint64_t{512} << 10);
  std::vector<std::unique_ptr<dcr::relay_node::source>> sources;
  std::vector<std::string> names;
  for (int r = 0; r < 6; ++r) {
    names.push_back("r" + std::to_string(r));
    sources.push_back(std::make_unique<dcr::relay_node::source>(*t.nodes[static_cast<std::size_t>(r % 3)], names.back()));
  }
  t.wait_connected({2, 2, 2});
  const std::vector<std::size_t> sizes{0, 100, (std::size_t{1} << 20) + 3, std::size_t{3} << 20, 4096, 777, 200000};
  std::map<dcr::payload_id, std::vector<std::byte>> sent;
  std::uint64_t payload_bytes = 0, largest = 0;
  std::atomic<std::uint64_t> deliveries_at_manifest[2] = {0, 0};
  std::vector<std::thread> owners;
  std::vector<std::string> owner_errors(2);
  for (std::uint32_t o = 0; o < 2; ++o)
    for (std::uint32_t k = 0; k < sizes.size(); ++k) {
      const dcr::payload_id id{{0, 1, 0}, o, k};
      sent[id] = random_bytes(sizes[k], 100 * o + k);
      payload_bytes += sizes[k];
      largest = std::max<std::uint64_t>(largest, sizes[k]);
    }
  for (std::uint32_t o = 0; o < 2; ++o)
    owners.emplace_back([&, o] {
      try {
        dcr::relay_owner_store store(t.owner_options(o));
        store.open_attempt(key1, names, soon());
        std::vector<dcr::payload_id> ids;
        for (std::uint32_t k = 0; k < sizes.size(); ++k) {
          const dcr::payload_id id{{0, 1, 0}, o, k};
          store.put(id, sent.at(id));
          ids.push_back(id);
        }
        store.put_manifest(key1, o, ids);
        std::uint64_t d = 0;
        for (auto& n : t.nodes) d += n->stats().deliveries;
        deliveries_at_manifest[o] = d;
      } catch (const std::exception& e) {
        owner_errors[o] = e.what();
      }
    });
  std::this_thread::sleep_for(300ms);  // everything beyond the credits waits for the receivers
  for (auto& r : t.roots) CHECK(r->stats().peak_buffered_bytes <= 2 * (std::uint64_t{512} << 10));
  std::vector<drained> results(sources.size());
  {
    std::vector<std::thread> receivers;
    for (std::size_t r = 0; r < sources.size(); ++r)
      receivers.emplace_back([&, r] { results[r] = drain(*sources[r], key1, {0, 1}); });
    for (auto& th : receivers) th.join();
  }
  for (auto& th : owners) th.join();
  for (const auto& e : owner_errors) CHECK(e == "");
  for (std::size_t r = 0; r < results.size(); ++r) {
    INFO("receiver r" << r << ": " << results[r].error);
    CHECK(results[r].complete);
    CHECK(results[r].duplicates == 0);
    CHECK(results[r].got == sent);
  }
  // Acknowledged after delivery: when an owner's manifest completed, every receiver had taken
  // that owner's payloads (at least 6 x 7 deliveries had happened).
  for (auto& d : deliveries_at_manifest) CHECK(d.load() >= 6 * sizes.size());
  // Striped: both roots carried payloads; each payload crossed once (plus frame headers).
  for (auto& f : t.flows) CHECK(f->bytes() > 0);
  const auto crossing = t.crossing_bytes();
  CHECK(crossing >= payload_bytes);
  CHECK(crossing <= payload_bytes + 64 * 1024);
  // Memory: a node holds at most one window (or one larger payload) per root connection.
  for (auto& n : t.nodes) {
    const auto s = n->stats();
    CHECK(s.peak_held_bytes <= 2 * std::max<std::uint64_t>(std::uint64_t{1} << 20, largest));
    CHECK(s.payloads_received == 14);
    CHECK(s.held_bytes == 0);
  }
}

TEST_CASE("relay: owners stripe by payload; one root is the paper's tree") {
  CHECK(dcr::relay_owner_store::root_of({0, 1, 0, 3, 0}, 4) == 3);
  CHECK(dcr::relay_owner_store::root_of({0, 1, 0, 3, 1}, 4) == 0);
  CHECK(dcr::relay_owner_store::root_of({0, 1, 0, 3, 7}, 1) == 0);
  tree t(1, 2);
  dcr::relay_node::source a(*t.nodes[0], "a"), b(*t.nodes[1], "b");
  t.wait_connected({1, 1});
  dcr::relay_owner_store store(t.owner_options(5));
  const std::vector<std::string> names{"a", "b"};
  store.open_attempt(key1, names, soon());
  std::vector<dcr::payload_id> ids;
  for (std::uint32_t k = 0; k < 5; ++k) {
    ids.push_back({0, 1, 0, 5, k});
    store.put(ids.back(), random_bytes(5000 + k, k));
  }
  // The same id again: equal bytes is a no-op, other bytes an error.
  store.put(ids[0], random_bytes(5000, 0));
  CHECK(message_of([&] { store.put(ids[0], random_bytes(5000, 99)); }).find("put again with other bytes") != std::string::npos);
  std::string err;
  std::thread manifest([&] { err = message_of([&] { store.put_manifest(key1, 5, ids); }); });
  const auto da = drain(a, key1, {5});
  const auto db = drain(b, key1, {5});
  manifest.join();
  CHECK(err == "");
  CHECK(da.complete);
  CHECK(db.complete);
  CHECK(da.got.size() == 5);
  CHECK(db.got == da.got);
  CHECK(t.roots[0]->stats().payloads == 5);
}

TEST_CASE("relay: attempts follow each other by base version and attempt number, restores included") {
  CHECK(dcr::relay_wire::later_attempt({3, 3, 1}, {3, 4, 0}));  // a restore after a failed refit
  CHECK(dcr::relay_wire::later_attempt({3, 4, 2}, {3, 3, 1}));
  CHECK(dcr::relay_wire::later_attempt({4, 5, 0}, {3, 4, 9}));
  CHECK(!dcr::relay_wire::later_attempt({3, 4, 0}, {3, 4, 0}));
  tree t(2, 1);
  dcr::relay_node::source a(*t.nodes[0], "a");
  t.wait_connected({1});
  dcr::relay_owner_store store(t.owner_options(0));
  const std::vector<std::string> names{"a"};
  for (const dcr::attempt_key key : {dcr::attempt_key{3, 4, 0}, dcr::attempt_key{3, 3, 1}, dcr::attempt_key{3, 4, 2}}) {
    std::vector<dcr::payload_id> ids;
    std::string err;
    std::thread owner([&] {
      err = message_of([&] {
        store.open_attempt(key, names, soon());
        for (std::uint32_t k = 0; k < 3; ++k) {
          ids.push_back({key, 0, k});
          store.put(ids.back(), random_bytes(1000, k));
        }
        store.put_manifest(key, 0, ids);
      });
    });
    const auto d = drain(a, key, {0});
    owner.join();
    CHECK(err == "");
    CHECK(d.complete);
    CHECK(d.got.size() == 3);
  }
}

TEST_CASE("relay: a peer without a certificate, or with one from another CA, is refused naming its address; nothing it sends is delivered") {
  tree t(1, 1);
  dcr::relay_node::source rx(*t.nodes[0], "r0");
  t.wait_connected({1});
  const std::vector<std::string> names{"r0"};
  const auto root = t.roots[0]->endpoint().text();

  // An owner with these TLS files tries to open an attempt: what it is told, and what the root
  // reports (exactly one refusal expected). Either side may report first (the owner can read the
  // root's alert before the root's handshake handler ran), so the root's report is waited for.
  auto try_owner = [&](const dcr::relay_tls& files) {
    auto o = t.owner_options(0);
    o.tls = files;
    dcr::relay_owner_store store(o);
    const auto err = message_of([&] { store.open_attempt(key1, names, soon()); });
    CHECK(eventually([&] { return !t.roots[0]->refusals().empty(); }));
    const auto refusals = t.roots[0]->refusals();
    CHECK(refusals.size() <= 1);
    return std::pair{err, refusals.empty() ? std::string() : refusals.front()};
  };
  const auto good = tls("owner");
  SUBCASE("no client certificate") {
    const auto [err, refusal] = try_owner({good.ca_file, {}, {}});
    INFO(err);
    INFO(refusal);
    CHECK(err.find("root " + root + " refused this peer") != std::string::npos);
    CHECK(refusal.find("refused peer 127.0.0.1:") != std::string::npos);
    CHECK(refusal.find("peer did not return a certificate") != std::string::npos);
  }
  SUBCASE("a client certificate signed by another CA") {
    const auto [err, refusal] = try_owner({good.ca_file, certs().rogue / "owner.pem", certs().rogue / "owner.key"});
    INFO(err);
    INFO(refusal);
    CHECK(err.find("root " + root) != std::string::npos);
    CHECK(refusal.find("refused peer 127.0.0.1:") != std::string::npos);
    CHECK(refusal.find("certificate verify failed") != std::string::npos);
  }
  SUBCASE("a root whose certificate the owner's CA did not sign") {
    const auto [err, refusal] = try_owner({certs().rogue / "ca.pem", good.cert_file, good.key_file});
    INFO(err);
    CHECK(err.find("TLS handshake with root " + root + " failed") != std::string::npos);
    CHECK(err.find("certificate verify failed") != std::string::npos);
  }
  SUBCASE("a root with another CA's certificate is refused by the node") {
    auto o = t.root_options;
    o.listen = any_port;
    o.tls.cert_file = certs().rogue / "root.pem";  // trusts the deployment's CA, is not trusted
    o.tls.key_file = certs().rogue / "root.key";
    o.name = "rogue root";
    dcr::relay_root rogue(o);
    const auto deadline = protocol_clock::now() + 10s;
    while (t.nodes[0]->refusals().empty() && protocol_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    const auto refusals = t.nodes[0]->refusals();
    REQUIRE(!refusals.empty());
    INFO(refusals[0]);
    CHECK(refusals[0].find("node 0 " + t.nodes[0]->endpoint().text() + ": refused peer 127.0.0.1:") != std::string::npos);
    CHECK(refusals[0].find("certificate verify failed") != std::string::npos);
    CHECK(rogue.stats().nodes_connected == 0);
  }
  SUBCASE("frames written by a peer without a certificate never reach anyone") {
    asio::io_context io;
    asio::ssl::context ctx(asio::ssl::context::tls_client);
    ctx.load_verify_file((certs().good / "ca.pem").string());
    ctx.set_verify_mode(asio::ssl::verify_peer);
    asio::ssl::stream<asio::ip::tcp::socket> s(io, ctx);
    s.lowest_layer().connect({asio::ip::make_address("127.0.0.1"), t.roots[0]->endpoint().port});
    asio::error_code ec;
    s.handshake(asio::ssl::stream_base::client, ec);  // TLS 1.3: the client's side completes
    if (!ec) {
      std::vector<dcr::relay_wire::frame_ptr> frames{
          dcr::relay_wire::hello_frame({dcr::relay_role::owner, 0, "intruder"}),
          dcr::relay_wire::attempt_frame(key1, names),
          dcr::relay_wire::chunk_frame({0, 1, 0, 0, 0}, 3, 0, random_bytes(3, 1))};
      for (auto& f : frames) asio::write(s, asio::buffer(*f), ec);
    }
    const auto deadline = protocol_clock::now() + 10s;
    while (t.roots[0]->refusals().empty() && protocol_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    CHECK(t.roots[0]->refusals().size() == 1);
    rx.open(key1, std::vector<std::uint32_t>{0});
    dcr::delivery d;
    CHECK(rx.next(d, protocol_clock::now() + 300ms) == dcr::source_status::timed_out);
  }
  CHECK(t.roots[0]->stats().payloads == 0);
  CHECK(t.nodes[0]->stats().payloads_received == 0);
}

TEST_CASE("relay: a root lost mid-attempt fails the attempt for its owner; after it restarts the retry is delivered") {
  tree t(2, 2);
  dcr::relay_node::source a(*t.nodes[0], "a"), b(*t.nodes[1], "b");
  t.wait_connected({1, 1});
  const std::vector<std::string> names{"a", "b"};
  dcr::relay_owner_store store(t.owner_options(0));
  store.open_attempt(key1, names, soon());
  store.put({0, 1, 0, 0, 0}, random_bytes(10000, 1));  // root 0
  const auto port = t.roots[1]->endpoint().port;
  t.roots[1].reset();  // dies mid-attempt
  // The put through root 1 fails if the owner has seen the loss already; if not, it goes out
  // into the dead connection and the manifest's wait reports the loss (which side of the race
  // the owner is on depends on the scheduler, not on the relay).
  const auto err = message_of([&] {
    store.put({0, 1, 0, 0, 1}, random_bytes(10000, 2));  // root 1
    store.put_manifest(key1, 0, std::vector<dcr::payload_id>{{0, 1, 0, 0, 0}, {0, 1, 0, 0, 1}});
  });
  INFO(err);
  CHECK(err.find("root 127.0.0.1:" + std::to_string(port) + " lost") != std::string::npos);
  {
    // The receivers cannot complete the attempt (they would time out; the protocol fences it).
    const auto da = drain(a, key1, {0}, 300ms);
    CHECK(!da.complete);
    CHECK(da.got.size() == 1);
  }
  // The root comes back on its port; the next attempt reconnects and is delivered everywhere.
  auto o = t.root_options;
  o.listen = {"127.0.0.1", port};
  o.name = "root 1 again";
  t.roots[1] = std::make_unique<dcr::relay_root>(o);
  t.wait_connected({1, 1});
  const dcr::attempt_key key2{0, 1, 1};
  std::vector<dcr::payload_id> ids2;
  std::string retry_error;
  std::thread owner([&] {
    try {
      store.open_attempt(key2, names, soon());
      for (std::uint32_t k = 0; k < 4; ++k) {
        ids2.push_back({0, 1, 1, 0, k});
        store.put(ids2.back(), random_bytes(3000 + k, 10 + k));
      }
      store.put_manifest(key2, 0, ids2);
    } catch (const std::exception& e) {
      retry_error = e.what();
    }
  });
  drained da, db;
  std::thread ta([&] { da = drain(a, key2, {0}); });
  std::thread tb([&] { db = drain(b, key2, {0}); });
  ta.join();
  tb.join();
  owner.join();
  CHECK(retry_error == "");
  CHECK(da.complete);
  CHECK(db.complete);
  CHECK(da.got.size() == 4);
  CHECK(db.got == da.got);
  CHECK(store.stats().connects == 3);
}

TEST_CASE("relay: a node lost mid-attempt fails the attempt with the node named; a receiver that ends an attempt early is named") {
  tree t(1, 2);
  auto a = std::make_unique<dcr::relay_node::source>(*t.nodes[0], "a");
  auto b = std::make_unique<dcr::relay_node::source>(*t.nodes[1], "b");
  t.wait_connected({1, 1});
  const std::vector<std::string> names{"a", "b"};
  dcr::relay_owner_store store(t.owner_options(0));

  SUBCASE("node lost") {
    store.open_attempt(key1, names, soon());
    store.put({0, 1, 0, 0, 0}, random_bytes(1000, 1));
    const auto node1 = t.nodes[1]->endpoint().text();
    b.reset();
    t.nodes[1].reset();
    const std::vector<dcr::payload_id> ids{{0, 1, 0, 0, 0}};
    const auto err = message_of([&] { store.put_manifest(key1, 0, ids); });
    INFO(err);
    CHECK(err.find("node " + node1) != std::string::npos);
  }
  SUBCASE("receiver ends the attempt before taking a payload") {
    store.open_attempt(key1, names, soon());
    store.put({0, 1, 0, 0, 0}, random_bytes(1000, 1));
    const std::vector<dcr::payload_id> ids{{0, 1, 0, 0, 0}};
    std::string err;
    std::thread manifest([&] { err = message_of([&] { store.put_manifest(key1, 0, ids); }); });
    const auto da = drain(*a, key1, {0});
    CHECK(da.complete);
    b->open(key1, std::vector<std::uint32_t>{0});
    b->close(key1);  // failed before its first payload
    manifest.join();
    INFO(err);
    CHECK(err.find("receiver 'b' ended attempt t0-1-a0 before taking it") != std::string::npos);
  }
  SUBCASE("a required receiver attached nowhere: the root says which and why") {
    const std::vector<std::string> more{"a", "b", "c"};
    const auto err = message_of([&] { store.open_attempt(key1, more, soon()); });
    INFO(err);
    CHECK(err.find("receiver(s) 'c'") != std::string::npos);
    CHECK(err.find("not attached to any connected node") != std::string::npos);
  }
}

namespace {

/// A refit deployment in one process over the relay: the real coordinator, owner agents and
/// receiver agents on a memory control plane; 2 roots, 2 nodes, 4 serving ranks (r0, r2 on node
/// 0; r1, r3 on node 1); every receiver's source wrapped in a faulty_source driven by `faults`.
struct relay_deployment {
  using plane_t = dcr::memory_control_plane;
  using source_t = dcr::testing::faulty_source<dcr::relay_node::source>;
  using engine_receiver = dcr::receiver<dcr::sim::moe_engine_loader>;
  struct engine {
    engine(const dcr::sim::moe_config& c, int world, int rank, const dcr::tensor_registry& registry)
        : storage(c, world, rank), loader(storage), rx(registry, loader, dcr::apply_options{}) {}
    dcr::sim::moe_engine_storage storage;
    dcr::sim::moe_engine_loader loader;
    engine_receiver rx;
  };
  static constexpr int ranks = 4;

  dcr::sim::moe_config model{};
  dcr::tensor_registry registry{model.canonical_tensors()};
  dcr::sim::synthetic_trainer trainer{model, registry, 2, 2, 7};
  std::vector<std::vector<std::byte>> canonical;
  plane_t plane;
  tree t{2, 2};
  dcr::nothing_to_erase nothing;
  std::vector<std::unique_ptr<engine>> engines;
  std::vector<std::unique_ptr<dcr::relay_node::source>> node_sources;
  std::vector<std::unique_ptr<source_t>> sources;
  std::vector<std::unique_ptr<dcr::receiver_agent<plane_t, source_t>>> receivers;
  std::vector<dcr::sim::rank_owner> owners;
  std::vector<std::unique_ptr<dcr::relay_owner_store>> stores;
  std::vector<std::unique_ptr<dcr::owner_agent<plane_t, dcr::relay_owner_store>>> owner_agents;
  std::unique_ptr<dcr::coordinator<plane_t, dcr::nothing_to_erase>> coordinator;
  /// (rank, attempt key, delivery ordinal) -> fault; set between transitions.
  std::function<dcr::testing::delivery_fault(int, const dcr::attempt_key&, std::uint64_t)> faults;

  relay_deployment() {
    const auto deadline = protocol_clock::now() + 30s;
    std::set<std::uint32_t> ids;
    for (auto o : trainer.owners()) ids.insert(o);
    for (auto o : trainer.residual_owners()) ids.insert(o);
    dcr::coordinator_options co;
    co.attempt_timeout = 20000ms;
    co.min_receivers = ranks;
    coordinator = std::make_unique<dcr::coordinator<plane_t, dcr::nothing_to_erase>>(
        plane, nothing, registry.fingerprint(), std::vector<std::uint32_t>(ids.begin(), ids.end()), co);
    coordinator->initialize(0, deadline);
    for (auto id : ids) {
      owners.push_back(dcr::sim::make_rank_owner(registry, trainer, id));
      std::vector<std::span<const std::byte>> cand, in;
      owners.back().spans(trainer, cand, in);
      owners.back().owner->initialize(cand, in);
      stores.push_back(std::make_unique<dcr::relay_owner_store>(t.owner_options(id)));
      dcr::owner_agent_options oo;
      oo.bucket_bytes = 1536;
      oo.chunk_bytes = 16384;
      owner_agents.push_back(std::make_unique<dcr::owner_agent<plane_t, dcr::relay_owner_store>>(
          *owners.back().owner, registry, plane, *stores.back(), oo));
      owner_agents.back()->start(0, deadline);
    }
    assemble();
    for (int r = 0; r < ranks; ++r) {
      engines.push_back(std::make_unique<engine>(model, ranks, r, registry));
      engines.back()->rx.prewarm();
      dense_load(engines.back()->rx);
      node_sources.push_back(std::make_unique<dcr::relay_node::source>(*t.nodes[static_cast<std::size_t>(r % 2)], name(r)));
      sources.push_back(std::make_unique<source_t>(*node_sources.back(), [this, r](const dcr::attempt_key& k, std::uint64_t n) {
        return faults ? faults(r, k, n) : dcr::testing::delivery_fault::none;
      }));
      receivers.push_back(std::make_unique<dcr::receiver_agent<plane_t, source_t>>(
          name(r), engines.back()->rx, registry.fingerprint(), plane, *sources.back()));
      receivers.back()->start(0, true, deadline);
    }
    t.wait_connected({2, 2});
  }
  ~relay_deployment() {
    receivers.clear();  // agents before their sources, sources before the nodes
    sources.clear();
    node_sources.clear();
    owner_agents.clear();
    stores.clear();
  }

  static std::string name(int r) {
    std::string n = std::to_string(r);
    n.insert(n.begin(), 'r');  // (not "r" + ...: GCC 12's -Wrestrict false positive at -O3)
    return n;
  }

  void assemble() {
    canonical.resize(registry.size());
    std::vector<std::span<std::byte>> spans;
    for (std::size_t id = 0; id < registry.size(); ++id) {
      canonical[id].resize(static_cast<std::size_t>(registry.at(static_cast<dcr::tensor_id>(id)).bytes()));
      spans.emplace_back(canonical[id]);
    }
    trainer.assemble_canonical(spans);
  }
  void dense_load(engine_receiver& rx) { dcr::sim::dense_load_all(rx, registry, canonical); }

  /// One transition: every agent on its own thread, the coordinator here. Returns its summary.
  dcr::transition_summary step(double rate) {
    trainer.stress_step(rate);
    const auto target = trainer.step();
    const std::string candidate = "step " + std::to_string(target);
    const auto deadline = protocol_clock::now() + 60s;
    std::vector<std::thread> threads;
    std::vector<std::string> errors(owner_agents.size() + receivers.size());
    for (std::size_t k = 0; k < owner_agents.size(); ++k)
      threads.emplace_back([&, k] {
        try {
          std::vector<std::span<const std::byte>> cand, in;
          owners[k].spans(trainer, cand, in);
          owner_agents[k]->serve_transition(candidate, cand, in, deadline);
        } catch (const std::exception& e) {
          errors[k] = e.what();
        }
      });
    for (std::size_t r = 0; r < receivers.size(); ++r)
      threads.emplace_back([&, r] {
        try {
          receivers[r]->serve_until(target, deadline);
        } catch (const std::exception& e) {
          errors[owner_agents.size() + r] = e.what();
        }
      });
    dcr::transition_summary s;
    std::string failure;
    try {
      s = coordinator->run_transition(candidate, deadline);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    for (auto& th : threads) th.join();
    CHECK(failure == "");
    for (const auto& e : errors) CHECK(e == "");
    return s;
  }

  /// "" or how a receiver differs from a dense refit of the trainer's current step.
  std::string verify() {
    assemble();
    std::string problems;
    for (int r = 0; r < ranks; ++r) {
      engine ref(model, ranks, r, registry);
      ref.storage.reset();
      dense_load(ref.rx);
      const auto diff = engines[static_cast<std::size_t>(r)]->storage.first_difference(ref.storage);
      if (!diff.empty()) problems += name(r) + ": " + diff + "; ";
      if (receivers[static_cast<std::size_t>(r)]->committed_version() != trainer.step())
        problems += name(r) + " holds version " + std::to_string(receivers[static_cast<std::size_t>(r)]->committed_version()) + "; ";
    }
    return problems;
  }
};

}  // namespace

TEST_CASE("relay: the real agents over a striped relay commit every transition bit-exact, faults included") {
  using dcr::testing::delivery_fault;
  relay_deployment d;
  // 1: no fault.
  auto s = d.step(0.05);
  CHECK(s.committed);
  CHECK(d.verify() == "");
  // 2: duplicates, reorders and a corrupted copy (refetched from the node) in the first attempt.
  d.faults = [](int rank, const dcr::attempt_key& k, std::uint64_t n) {
    if (k.number != 0 || k.base_version == k.target_version) return delivery_fault::none;
    if (rank == 0 && n < 3) return delivery_fault::duplicate;
    if (rank == 1 && n % 2 == 0) return delivery_fault::reorder;
    if (rank == 2 && n == 1) return delivery_fault::corrupt;
    return delivery_fault::none;
  };
  s = d.step(0.05);
  CHECK(s.committed);
  CHECK(s.attempts.size() == 1);
  CHECK(d.verify() == "");
  std::uint64_t duplicates = 0, refetched = 0;
  for (const auto& a : s.attempts.back().acks) {
    duplicates += a.duplicates;
    refetched += a.refetched;
  }
  CHECK(duplicates >= 3);
  CHECK(refetched == 1);
  // 3: r3 fails its first attempt (its source throws at the second delivery), so the nodes nack
  // what it did not take and the attempt fails; in the overwrite retry r0 is handed a late
  // payload of the failed attempt, which it refuses as stale.
  d.faults = [](int rank, const dcr::attempt_key& k, std::uint64_t n) {
    if (k.base_version == k.target_version) return delivery_fault::none;
    if (k.number == 0 && rank == 3 && n == 1) return delivery_fault::drop;
    if (k.number > 0 && rank == 0 && n == 0) return delivery_fault::stale;
    return delivery_fault::none;
  };
  s = d.step(0.05);
  CHECK(s.committed);
  REQUIRE(s.attempts.size() >= 2);
  // The attempt's failure is whichever the coordinator saw first (r3's failed acknowledgement,
  // or an owner whose payloads a node refused); r3's acknowledgement names the injected drop.
  CHECK_FALSE(s.attempts.front().failure.empty());
  CHECK(std::any_of(s.attempts.front().acks.begin(), s.attempts.front().acks.end(), [](const auto& a) {
    return a.failure.find("dropped (injected)") != std::string::npos;
  }));
  CHECK(s.attempts.back().policy == dcr::encoding_policy::overwrite_only);
  std::uint64_t stale = 0;
  for (const auto& a : s.attempts.back().acks) stale += a.stale;
  CHECK(stale == 1);
  CHECK(d.verify() == "");
  // 4: clean again.
  d.faults = {};
  s = d.step(0.05);
  CHECK(s.committed);
  CHECK(s.attempts.size() == 1);
  CHECK(d.verify() == "");
}
