// benchmarks/relay_report.cpp: the relay's throughput on loopback (docs/benchmarks.md, "Relay"),
// in one run against two baselines on the same machine:
//   tcp    one plain TCP stream (Asio), 1 MiB writes: what loopback carries;
//   tls    one TLS stream (Asio ssl::stream over OpenSSL, the relay's certificates), 1 MiB
//          writes: what one authenticated connection carries;
//   relay  one owner streaming payloads through R roots (striped) to N nodes of one receiver
//          each, from open_attempt until put_manifest returns (every payload delivered to every
//          receiver): every byte is encrypted once by the owner, decrypted and re-encrypted per
//          node by its root, and decrypted by each node.
// Rates are payload bytes per second of wall time (MB = 1e6 bytes). Certificates come from
// scripts/make-test-certs.sh (DCR_MAKE_TEST_CERTS) in a temporary directory.
//
//   relay_report [--mib N] [--payload-mib P] [--reps K] [--json]
#include <fmt/core.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "dcr/protocol/relay/relay.hpp"

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;
using asio::ip::tcp;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

/// One stream of `total` bytes in 1 MiB writes over loopback, plain or TLS; returns seconds.
double one_stream(std::uint64_t total, const fs::path* certs) {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const auto port = acceptor.local_endpoint().port();
  std::vector<char> buffer(std::size_t{1} << 20, 'x');
  std::optional<asio::ssl::context> server_ctx, client_ctx;
  if (certs) {
    server_ctx.emplace(dcr::relay_detail::make_context(dcr::relay_tls::in_directory(*certs, "node"), true));
    client_ctx.emplace(dcr::relay_detail::make_context(dcr::relay_tls::in_directory(*certs, "root"), false));
  }
  double seconds = 0;
  std::thread reader([&] {
    std::vector<char> in(std::size_t{1} << 20);
    tcp::socket s(io);
    acceptor.accept(s);
    if (certs) {
      asio::ssl::stream<tcp::socket&> tls(s, *server_ctx);
      tls.handshake(asio::ssl::stream_base::server);
      for (std::uint64_t got = 0; got < total;) got += tls.read_some(asio::buffer(in));
    } else {
      for (std::uint64_t got = 0; got < total;) got += s.read_some(asio::buffer(in));
    }
  });
  tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  if (certs) {
    asio::ssl::stream<tcp::socket&> tls(s, *client_ctx);
    tls.handshake(asio::ssl::stream_base::client);
    const auto t0 = clock_type::now();
    for (std::uint64_t sent = 0; sent < total; sent += buffer.size()) asio::write(tls, asio::buffer(buffer));
    reader.join();
    seconds = seconds_since(t0);
  } else {
    const auto t0 = clock_type::now();
    for (std::uint64_t sent = 0; sent < total; sent += buffer.size()) asio::write(s, asio::buffer(buffer));
    reader.join();
    seconds = seconds_since(t0);
  }
  return seconds;
}

/// `total` bytes in payloads of `payload` bytes from one owner through `roots` roots to `nodes`
/// nodes of one receiver each; returns seconds from open_attempt to put_manifest.
double relay(std::uint64_t total, std::uint64_t payload, int roots, int nodes, const fs::path& certs,
             std::uint32_t attempt) {
  std::vector<std::unique_ptr<dcr::relay_node>> node;
  std::vector<std::unique_ptr<dcr::relay_node::source>> sources;
  std::vector<std::string> names;
  for (int n = 0; n < nodes; ++n) {
    dcr::relay_node_options o;
    o.listen = {"127.0.0.1", 0};
    o.tls = dcr::relay_tls::in_directory(certs, "node");
    node.push_back(std::make_unique<dcr::relay_node>(o));
    names.push_back("r" + std::to_string(n));
    sources.push_back(std::make_unique<dcr::relay_node::source>(*node.back(), names.back()));
  }
  std::vector<std::unique_ptr<dcr::relay_root>> root;
  dcr::relay_owner_options oo;
  oo.tls = dcr::relay_tls::in_directory(certs, "owner");
  for (int r = 0; r < roots; ++r) {
    dcr::relay_root_options o;
    o.listen = {"127.0.0.1", 0};
    o.tls = dcr::relay_tls::in_directory(certs, "root");
    for (auto& n : node) o.nodes.push_back(n->endpoint());
    root.push_back(std::make_unique<dcr::relay_root>(o));
    oo.roots.push_back(root.back()->endpoint());
  }
  dcr::relay_owner_store owner(oo);
  const dcr::attempt_key key{0, 1, attempt};
  std::vector<std::thread> receivers;
  for (auto& s : sources)
    receivers.emplace_back([&s, key] {
      s->open(key, std::vector<std::uint32_t>{0});
      dcr::delivery d;
      const auto deadline = dcr::protocol_clock::now() + std::chrono::seconds(300);
      while (s->next(d, deadline) == dcr::source_status::delivered) {
      }
    });
  const std::vector<std::byte> bytes(payload, std::byte{0x5a});
  const auto t0 = clock_type::now();
  owner.open_attempt(key, names, dcr::protocol_clock::now() + std::chrono::seconds(300));
  std::vector<dcr::payload_id> ids;
  for (std::uint32_t k = 0; std::uint64_t{k} * payload < total; ++k) {
    ids.push_back({0, 1, attempt, 0, k});
    owner.put(ids.back(), bytes);
  }
  owner.put_manifest(key, 0, ids);
  const double seconds = seconds_since(t0);
  for (auto& t : receivers) t.join();
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t mib = 256, payload_mib = 16;
  int reps = 3;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) mib = std::stoull(argv[++i]);
    else if (a == "--payload-mib" && i + 1 < argc) payload_mib = std::stoull(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (a == "--json") json = true;
    else {
      fmt::print(stderr, "usage: relay_report [--mib N] [--payload-mib P] [--reps K] [--json]\n");
      return 2;
    }
  }
  char tmpl[] = "/tmp/dcr-relay-report-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const fs::path certs = fs::path(tmpl) / "certs";
  const std::string cmd = std::string("bash '") + DCR_MAKE_TEST_CERTS + "' '" + certs.string() + "' owner root node";
  if (std::system(cmd.c_str()) != 0) {
    fmt::print(stderr, "relay_report: {} failed\n", cmd);
    return 1;
  }
  const std::uint64_t total = mib << 20, payload = payload_mib << 20;
  struct row {
    std::string name;
    double best = 1e300;
  };
  std::vector<row> rows{{"tcp: one plain TCP stream"}, {"tls: one TLS stream"},
                        {"relay: 1 root, 1 node"}, {"relay: 4 roots, 1 node"},
                        {"relay: 1 root, 2 nodes"}};
  std::uint32_t attempt = 0;
  for (int rep = 0; rep < reps; ++rep) {
    rows[0].best = std::min(rows[0].best, one_stream(total, nullptr));
    rows[1].best = std::min(rows[1].best, one_stream(total, &certs));
    rows[2].best = std::min(rows[2].best, relay(total, payload, 1, 1, certs, attempt++));
    rows[3].best = std::min(rows[3].best, relay(total, payload, 4, 1, certs, attempt++));
    rows[4].best = std::min(rows[4].best, relay(total, payload, 1, 2, certs, attempt++));
  }
  std::error_code ec;
  fs::remove_all(tmpl, ec);
  if (json) {
    nlohmann::json out{{"bytes", total}, {"payload_bytes", payload}, {"reps", reps}};
    for (const auto& r : rows) out["cases"].push_back({{"case", r.name}, {"seconds", r.best}, {"mb_per_s", total / r.best / 1e6}});
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print("| case ({} MiB, payloads of {} MiB, best of {}) | MB/s | vs one TLS stream |\n|---|---:|---:|\n", mib,
               payload_mib, reps);
    for (const auto& r : rows)
      fmt::print("| {} | {:.0f} | {:.2f} |\n", r.name, total / r.best / 1e6, rows[1].best / r.best);
  }
  return 0;
}
