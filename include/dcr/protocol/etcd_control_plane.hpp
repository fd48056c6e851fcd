// dcr/protocol/etcd_control_plane.hpp: a control plane in etcd v3 (3.4 or later), spoken to
// through etcd's JSON gateway (grpc-gateway, under /v3/) with libcurl. Link with libcurl; the
// JSON bodies use nlohmann-json. Not part of dcr.hpp (the umbrella pulls in no libcurl).
//
// The control-plane model is etcd's, so the mapping is direct:
//   get, list        POST /v3/kv/range (list: range_end = the prefix with its last byte + 1)
//   transact         POST /v3/kv/txn: each compare is `mod_revision == r` (target MOD, result
//                    EQUAL; etcd compares an absent key as mod_revision 0, so r = 0 means absent);
//                    writes are request_put (with the lease) and request_delete_range
//   revision         the `revision` of a range response's header
//   wait_for_change  POST /v3/watch from revision + 1, read as a stream until an event, a
//                    compaction of that revision, or the deadline
//   leases           POST /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke
// Keys and values are bytes (base64 on the wire). Every key is stored under a key prefix
// (etcd_options::key_prefix, prepended verbatim), so that several runs share one etcd; returned
// records carry the key without it.
//
// etcd's own semantics show through, and callers must allow for them:
//   - the revision is etcd's: global to the etcd cluster, shared with every other prefix; it
//     starts at 1, not 0;
//   - etcd's minimum lease TTL is 1.5 election timeouts (2 s with default settings): a shorter
//     ttl is granted as that minimum; expiry is noticed by the lease leader a little after the
//     TTL (typically within a second), and until then the record is still read;
//   - a transaction holds at most etcd's --max-txn-ops writes (128 by default), a request at
//     most --max-request-bytes (1.5 MiB by default); beyond that etcd rejects it
//     (errc::invalid_argument).
//
// Errors: a server that cannot be reached (refused connection, timeout, HTTP 5xx, a response
// that is not what etcd sends, gRPC codes Unavailable, DeadlineExceeded, ResourceExhausted,
// Internal, DataLoss, Aborted, Canceled) throws errc::control_plane_unavailable; any other etcd
// error throws errc::invalid_argument (errc::out_of_range for OutOfRange) with etcd's message,
// and so does a request over the gateway's 2 MiB gRPC message limit (ResourceExhausted, but
// no retry helps).
// Each message names the endpoint (without credentials), the operation and the key. An
// unavailable write may or may not have been applied (a frozen server can apply a request it
// received after the client gave up): callers re-read, as after any lost race.
//
// Thread-safe: one libcurl handle (one kept-alive connection) serves every call but
// wait_for_change, one at a time under a mutex; wait_for_change uses its own handle (a fresh
// one when another thread is already waiting), so waiting never blocks the other calls.
// Not supported yet: TLS client certificates, etcd authentication, several endpoints.
#pragma once

#include <curl/curl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "dcr/detail/base64.hpp"
#include "dcr/detail/curl.hpp"
#include "dcr/error.hpp"
#include "dcr/protocol/control_plane.hpp"

namespace dcr {

/// How an etcd_control_plane talks to etcd.
struct etcd_options {
  /// Limit on each request (all but wait_for_change, which runs to its deadline), connecting
  /// included; past it the call throws control_plane_unavailable.
  std::chrono::milliseconds request_timeout{2000};
  /// Limit on establishing a connection (within request_timeout).
  std::chrono::milliseconds connect_timeout{1000};
  /// Prepended verbatim to every key (e.g. "/dcr"); empty: keys are etcd keys as they are.
  std::string key_prefix;
};

/// Where a control plane lives, as etcd_control_plane::parse_address reads it.
struct etcd_address {
  std::string endpoint;    ///< e.g. "http://127.0.0.1:2379"
  std::string key_prefix;  ///< e.g. "/dcr"
};

class etcd_control_plane {
 public:
  using control_plane_concept = control_plane_tag;

  /// Reads the address syntax of `dcr simulate --control-plane`:
  ///   etcd://HOST:PORT[/PREFIX]    endpoint http://HOST:PORT, key prefix /PREFIX (default /dcr)
  ///   etcds://HOST:PORT[/PREFIX]   the same over https
  /// HOST is a name, an IPv4 address or a bracketed IPv6 address ([::1]); PORT is 1 to 65535
  /// and required; PREFIX keeps its inner slashes and loses trailing ones ("/a/b/" -> "/a/b"),
  /// and must not be empty (`etcd://h:1/` is rejected, so a typo never selects the whole
  /// keyspace). Throws errc::invalid_argument naming the address and what is wrong.
  static etcd_address parse_address(std::string_view address) {
    const auto bad = [&](const std::string& why) -> etcd_address {
      throw error(errc::invalid_argument,
                  "etcd address '" + std::string(address) + "': " + why +
                      " (expected etcd://HOST:PORT[/PREFIX])");
    };
    std::string_view rest = address;
    std::string scheme;
    if (rest.starts_with("etcd://")) {
      scheme = "http://";
      rest.remove_prefix(7);
    } else if (rest.starts_with("etcds://")) {
      scheme = "https://";
      rest.remove_prefix(8);
    } else {
      return bad("not an etcd:// address");
    }
    const auto slash = rest.find('/');
    const std::string_view authority = rest.substr(0, slash);
    std::string_view path = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash);
    std::size_t colon;
    if (authority.starts_with('[')) {
      const auto close = authority.find(']');
      if (close == std::string_view::npos || close == 1) return bad("unterminated IPv6 host");
      if (close + 1 >= authority.size() || authority[close + 1] != ':') return bad("no port");
      colon = close + 1;
    } else {
      colon = authority.rfind(':');
      if (colon == std::string_view::npos) return bad("no port");
      if (colon == 0) return bad("no host");
      const auto host = authority.substr(0, colon);
      const bool host_ok = std::all_of(host.begin(), host.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '-' || c == '_';
      });
      if (!host_ok) return bad("bad host '" + std::string(host) + "'");
    }
    const auto port = authority.substr(colon + 1);
    const bool digits = !port.empty() && port.size() <= 5 &&
                        std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || std::stoi(std::string(port)) < 1 || std::stoi(std::string(port)) > 65535)
      return bad("bad port '" + std::string(port) + "'");
    std::string prefix = "/dcr";
    if (!path.empty()) {
      while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
      if (path == "/") return bad("empty key prefix");
      prefix = std::string(path);
    }
    return etcd_address{scheme + std::string(authority), std::move(prefix)};
  }

  /// A control plane at `endpoint`, an http:// or https:// URL of one etcd member's client
  /// port (e.g. "http://127.0.0.1:2379"; a trailing '/' is dropped). Connects lazily: an
  /// unreachable etcd is reported by the first operation. Throws errc::invalid_argument for an
  /// endpoint that is not such a URL or non-positive timeouts.
  explicit etcd_control_plane(std::string endpoint, etcd_options options = {})
      : endpoint_(std::move(endpoint)), options_(std::move(options)) {
    while (endpoint_.ends_with('/')) endpoint_.pop_back();
    shown_ = shown_endpoint(endpoint_);
    DCR_EXPECTS(endpoint_.starts_with("http://") || endpoint_.starts_with("https://"),
                errc::invalid_argument,
                "etcd control plane: endpoint '" + shown_ + "' is not an http:// or https:// URL");
    DCR_EXPECTS(options_.request_timeout.count() > 0 && options_.connect_timeout.count() > 0,
                errc::invalid_argument, "etcd control plane '" + shown_ + "': timeouts must be > 0");
    global_init();
    handle_ = new_handle();
    watch_handle_ = new_handle();
  }

  /// A control plane at an etcd://HOST:PORT[/PREFIX] address (parse_address); the address's
  /// prefix replaces options.key_prefix.
  static etcd_control_plane open(std::string_view address, etcd_options options = {}) {
    auto a = parse_address(address);
    options.key_prefix = std::move(a.key_prefix);
    return etcd_control_plane(std::move(a.endpoint), std::move(options));
  }

  etcd_control_plane(const etcd_control_plane&) = delete;
  etcd_control_plane& operator=(const etcd_control_plane&) = delete;

  /// The endpoint as given (trailing '/' dropped).
  [[nodiscard]] const std::string& endpoint() const noexcept { return endpoint_; }
  /// The key prefix every key is stored under.
  [[nodiscard]] const std::string& key_prefix() const noexcept { return options_.key_prefix; }

  /// The record under `key` (without the prefix), or nullopt if absent. A leased record whose
  /// lease expired is absent once etcd has collected the lease (shortly after its TTL).
  std::optional<control_record> get(const std::string& key) {
    const std::string k = full(key);
    const auto reply = call("get", k, "/v3/kv/range", {{"key", detail::base64_encode(k)}});
    return decode("get", k, [&]() -> std::optional<control_record> {
      const auto kvs = reply.find("kvs");
      if (kvs == reply.end() || kvs->empty()) return std::nullopt;
      return to_record(kvs->at(0));
    });
  }

  /// Every record whose key starts with `prefix` (after the key prefix), sorted by key.
  std::vector<control_record> list(const std::string& prefix) {
    const std::string k = full(prefix);
    const auto reply = call("list", k, "/v3/kv/range", range_body(k));
    return decode("list", k, [&] {
      std::vector<control_record> out;
      if (const auto kvs = reply.find("kvs"); kvs != reply.end())
        for (const auto& kv : *kvs) out.push_back(to_record(kv));
      return out;  // etcd returns a range sorted by key; dropping a common prefix keeps it so
    });
  }

  /// If every compare holds (the key's mod_revision equals `revision`, 0: the key is absent),
  /// applies every write in one etcd transaction and returns true; otherwise writes nothing and
  /// returns false. A put under an unknown or expired lease, a key written twice, or more
  /// writes than etcd's --max-txn-ops throw errc::invalid_argument. An empty `writes` changes
  /// nothing and does not advance the revision.
  bool transact(std::span<const key_compare> compares, std::span<const key_write> writes) {
    nlohmann::json cmp = nlohmann::json::array();
    for (const auto& c : compares)
      cmp.push_back({{"key", detail::base64_encode(full(c.key))},
                     {"target", "MOD"},
                     {"result", "EQUAL"},
                     {"mod_revision", std::to_string(c.revision)}});
    nlohmann::json ops = nlohmann::json::array();
    for (const auto& w : writes) {
      if (w.erase) {
        ops.push_back({{"request_delete_range", {{"key", detail::base64_encode(full(w.key))}}}});
      } else {
        nlohmann::json put = {{"key", detail::base64_encode(full(w.key))},
                              {"value", detail::base64_encode(w.value)}};
        if (w.lease != 0) put["lease"] = std::to_string(w.lease);
        ops.push_back({{"request_put", std::move(put)}});
      }
    }
    const std::string k = full(!writes.empty()    ? writes.front().key
                               : !compares.empty() ? compares.front().key
                                                   : std::string());
    const auto reply = call("transact", k, "/v3/kv/txn",
                            {{"compare", std::move(cmp)}, {"success", std::move(ops)}});
    return decode("transact", k, [&] {
      const auto it = reply.find("succeeded");
      return it != reply.end() && it->get<bool>();  // proto3 JSON omits false
    });
  }

  /// etcd's current revision (cluster-wide, not per prefix).
  std::int64_t revision() {
    const std::string k = options_.key_prefix.empty() ? std::string(1, '\0') : options_.key_prefix;
    const auto reply =
        call("revision", k, "/v3/kv/range", {{"key", detail::base64_encode(k)}, {"count_only", true}});
    return decode("revision", k, [&] { return header_revision(reply); });
  }

  /// Watches the keys starting with `prefix` from revision `after` + 1 and returns as soon as
  /// etcd reports a change there (a put, a delete, a lease expiry, which etcd reports as a
  /// delete) with the revision of that report, or a compaction past `after` (changes may have
  /// been lost: the caller re-reads), or at `deadline` with the last revision etcd reported.
  /// An early return without a change is possible (etcd ended the watch). Past the deadline, or
  /// when etcd did not even confirm the watch by then, returns revision() instead (so a frozen
  /// etcd throws control_plane_unavailable after the deadline plus request_timeout).
  std::int64_t wait_for_change(const std::string& prefix, std::int64_t after,
                               protocol_clock::time_point deadline) {
    const std::string k = full(prefix);
    if (protocol_clock::now() >= deadline) return revision();
    nlohmann::json create = range_body(k);
    create["start_revision"] = std::to_string(after + 1);
    const std::string body = nlohmann::json{{"create_request", std::move(create)}}.dump();

    std::unique_lock lock(watch_mutex_, std::try_to_lock);
    handle_ptr spare;
    CURL* h = watch_handle_.get();
    if (!lock.owns_lock()) {  // another thread is waiting on the shared watch handle
      spare = new_handle();
      h = spare.get();
    }
    watch_state st;
    st.after = after;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - protocol_clock::now());
    const long left_ms = std::max<long>(1, static_cast<long>(left.count()));
    const long http = perform(h, "/v3/watch", body, &watch_state::on_data, &st, left_ms,
                              std::min<long>(left_ms, static_cast<long>(options_.connect_timeout.count())));
    if (st.failure) {  // an etcd error, or a stream we could not read
      if (st.failure->grpc_code >= 0) fail_grpc("wait_for_change", k, *st.failure);
      unavailable("wait_for_change", k, st.failure->message);
    }
    if (st.changed) return std::max(st.observed, after + 1);
    if (st.stopped) return st.observed > 0 ? st.observed : revision();  // watch canceled
    if (st.curl_code == CURLE_OPERATION_TIMEDOUT)
      return st.created ? st.observed : revision();  // the deadline
    if (st.curl_code != CURLE_OK) unavailable("wait_for_change", k, st.curl_message);
    if (http >= 300) unavailable("wait_for_change", k, "HTTP " + std::to_string(http));
    return st.observed > 0 ? st.observed : revision();  // etcd closed the stream
  }

  /// A new lease of `ttl` (> 0); etcd raises a ttl below its minimum (see above) to that
  /// minimum. Records written under it vanish once it is neither kept alive nor revoked.
  lease_id grant_lease(std::chrono::seconds ttl) {
    DCR_EXPECTS(ttl.count() > 0, errc::invalid_argument,
                "etcd control plane '" + shown_ + "': grant_lease: ttl must be > 0 s");
    const auto reply = call("grant_lease", "-", "/v3/lease/grant", {{"TTL", ttl.count()}, {"ID", 0}});
    return decode("grant_lease", "-", [&] {
      const lease_id id = to_i64(reply, "ID");
      if (id == 0) throw std::invalid_argument("no lease ID in the reply");
      return id;
    });
  }

  /// Renews `lease` for its full TTL; false if etcd no longer knows it (expired or revoked:
  /// its records are gone, or about to be).
  bool keep_alive(lease_id lease) {
    if (lease == 0) return false;
    const std::string what = std::to_string(lease);
    const auto reply = call("keep_alive", what, "/v3/lease/keepalive", {{"ID", what}});
    return decode("keep_alive", what, [&] {
      // A streaming call: the gateway wraps the reply in "result"; an unknown lease comes
      // back with TTL 0, which proto3 JSON leaves out.
      const auto r = reply.find("result");
      return to_i64(r != reply.end() ? *r : reply, "TTL") > 0;
    });
  }

  /// Ends `lease` now; etcd erases its records in the same step. An unknown (expired or
  /// already revoked) lease is not an error.
  void revoke(lease_id lease) {
    if (lease == 0) return;
    const std::string what = std::to_string(lease);
    call("revoke", what, "/v3/lease/revoke", {{"ID", what}}, /*not_found_ok=*/true);
  }

 private:
  struct handle_deleter {
    void operator()(CURL* h) const noexcept { curl_easy_cleanup(h); }
  };
  using handle_ptr = std::unique_ptr<CURL, handle_deleter>;

  // An error etcd reported: its gRPC code (-1: not an etcd error) and message.
  struct etcd_failure {
    int grpc_code = -1;
    std::string message;
  };

  // What a watch stream said so far; fed by libcurl's write callback.
  struct watch_state {
    std::int64_t after = 0;
    std::int64_t observed = 0;  // highest header revision etcd reported
    bool created = false;       // etcd confirmed the watch
    bool changed = false;       // events, or a compaction past `after`
    bool stopped = false;       // we ended the transfer (changed, canceled or failure)
    std::optional<etcd_failure> failure;
    std::string buffer;
    CURLcode curl_code = CURLE_OK;
    std::string curl_message;

    static std::size_t on_data(char* data, std::size_t size, std::size_t count, void* self) {
      auto& st = *static_cast<watch_state*>(self);
      try {  // nothing may propagate through libcurl
        st.buffer.append(data, size * count);
        std::size_t at = 0;
        for (;;) {
          const std::size_t end = json_value_end(st.buffer, at);
          if (end == std::string::npos) break;
          st.take(std::string_view(st.buffer).substr(at, end - at));
          at = end;
          if (st.stopped) return 0;  // ends the transfer (CURLE_WRITE_ERROR)
        }
        st.buffer.erase(0, at);
      } catch (const std::exception& e) {
        st.failure = etcd_failure{-1, std::string("reading the watch stream: ") + e.what()};
        st.stopped = true;
        return 0;
      }
      return size * count;
    }

    void take(std::string_view text) {
      try {
        const auto msg = nlohmann::json::parse(text);
        if (auto f = etcd_error(msg)) {
          failure = std::move(f);
          stopped = true;
          return;
        }
        const auto& r = msg.at("result");
        observed = std::max(observed, header_revision(r, /*required=*/false));
        if (r.value("created", false)) created = true;
        const std::int64_t compacted = to_i64(r, "compact_revision");
        const auto events = r.find("events");
        if ((events != r.end() && !events->empty()) || compacted > after) {
          observed = std::max(observed, compacted);
          changed = stopped = true;
        } else if (r.value("canceled", false)) {
          // etcd ended the watch; with a reason (e.g. permission denied) retrying cannot help
          if (const auto why = r.value("cancel_reason", std::string()); !why.empty())
            failure = etcd_failure{2, "watch canceled: " + why};
          stopped = true;
        }
      } catch (const std::exception& e) {
        failure = etcd_failure{-1, std::string("unreadable watch response: ") + e.what()};
        stopped = true;
      }
    }
  };

  static void global_init() {
    // Once per process, before any handle; not thread-safe itself, hence the static.
    [[maybe_unused]] static const bool done = [] {
      if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        throw error(errc::control_plane_unavailable, "etcd control plane: libcurl failed to initialize");
      return true;
    }();
  }

  handle_ptr new_handle() const {
    handle_ptr h(curl_easy_init());
    DCR_EXPECTS(h != nullptr, errc::control_plane_unavailable,
                "etcd control plane '" + shown_ + "': libcurl could not make a handle");
    return h;
  }

  // The endpoint for messages: without any user:password@.
  static std::string shown_endpoint(const std::string& e) {
    const auto scheme = e.find("://");
    const auto start = scheme == std::string::npos ? 0 : scheme + 3;
    const auto at = e.find('@', start);
    const auto slash = e.find('/', start);
    if (at == std::string::npos || (slash != std::string::npos && at > slash)) return e;
    return e.substr(0, start) + e.substr(at + 1);
  }

  std::string full(const std::string& key) const { return options_.key_prefix + key; }

  // Range body covering every key that starts with `k` (all keys if `k` is empty).
  static nlohmann::json range_body(const std::string& k) {
    if (k.empty())
      return {{"key", detail::base64_encode(std::string(1, '\0'))},
              {"range_end", detail::base64_encode(std::string(1, '\0'))}};
    std::string end = k;
    while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
    if (end.empty()) {
      end.assign(1, '\0');  // `k` is all 0xff bytes: every key from `k` on
    } else {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
    }
    return {{"key", detail::base64_encode(k)}, {"range_end", detail::base64_encode(end)}};
  }

  // The end of the JSON value starting at or after `at` in `s` (after leading whitespace), or
  // npos if it is not complete yet. Tracks nesting and strings only; parsing comes later.
  static std::size_t json_value_end(const std::string& s, std::size_t at) {
    while (at < s.size() && (s[at] == ' ' || s[at] == '\n' || s[at] == '\r' || s[at] == '\t')) ++at;
    if (at == s.size()) return std::string::npos;
    int depth = 0;
    bool in_string = false;
    for (std::size_t i = at; i < s.size(); ++i) {
      const char c = s[i];
      if (in_string) {
        if (c == '\\') {
          ++i;
        } else if (c == '"') {
          in_string = false;
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth <= 0) return i + 1;
      } else if (depth == 0) {
        return i + 1;  // a stray scalar: hand it to the parser, which rejects it
      }
    }
    return std::string::npos;
  }

  // An int64 field of proto3 JSON (a decimal string, or a number); 0 when left out.
  static std::int64_t to_i64(const nlohmann::json& j, const char* field) {
    const auto it = j.find(field);
    if (it == j.end() || it->is_null()) return 0;
    if (it->is_number_integer()) return it->get<std::int64_t>();
    const auto& s = it->get_ref<const std::string&>();
    std::size_t used = 0;
    const std::int64_t v = std::stoll(s, &used);
    if (used != s.size()) throw std::invalid_argument("bad integer '" + s + "' in " + field);
    return v;
  }

  static std::int64_t header_revision(const nlohmann::json& reply, bool required = true) {
    const auto h = reply.find("header");
    if (h == reply.end()) {
      if (required) throw std::invalid_argument("no header in the reply");
      return 0;
    }
    const std::int64_t r = to_i64(*h, "revision");
    if (required && r <= 0) throw std::invalid_argument("no revision in the reply header");
    return r;
  }

  // The error in an etcd reply, if it is one. Unary calls answer {"error": "...", "code": N,
  // "message": "..."}; streams answer {"error": {"grpc_code": N, "message": "...", ...}}.
  static std::optional<etcd_failure> etcd_error(const nlohmann::json& reply) {
    if (!reply.is_object()) return std::nullopt;
    const auto e = reply.find("error");
    if (e == reply.end()) return std::nullopt;
    if (e->is_object()) {
      return etcd_failure{e->value("grpc_code", 2), e->value("message", std::string("(no message)"))};
    }
    if (e->is_string() && e->get_ref<const std::string&>().empty()) return std::nullopt;
    std::string message = reply.value("message", std::string());
    if (message.empty() && e->is_string()) message = e->get<std::string>();
    return etcd_failure{reply.value("code", 2), message.empty() ? "(no message)" : message};
  }

  [[noreturn]] void unavailable(std::string_view op, const std::string& key,
                                const std::string& why) const {
    throw error(errc::control_plane_unavailable,
                "etcd control plane '" + shown_ + "': " + std::string(op) + " '" + printable(key) +
                    "': " + why);
  }

  [[noreturn]] void fail_grpc(std::string_view op, const std::string& key,
                              const etcd_failure& f) const {
    errc code = errc::invalid_argument;
    switch (f.grpc_code) {
      case 1:   // Canceled
      case 4:   // DeadlineExceeded (e.g. "request timed out", no leader)
      case 8:   // ResourceExhausted ("too many requests", "database space exceeded"), but
        // a request over the gateway's gRPC message limit is the caller's to fix
        if (f.message.find("larger than max") == std::string::npos)
          code = errc::control_plane_unavailable;
        break;
      case 10:  // Aborted
      case 13:  // Internal
      case 14:  // Unavailable ("no leader", "leader changed")
      case 15:  // DataLoss (corruption)
        code = errc::control_plane_unavailable;
        break;
      case 11:  // OutOfRange (a compacted or future revision)
        code = errc::out_of_range;
        break;
      default:
        break;
    }
    throw error(code, "etcd control plane '" + shown_ + "': " + std::string(op) + " '" +
                          printable(key) + "': etcd error (gRPC code " +
                          std::to_string(f.grpc_code) + "): " + f.message);
  }

  // Keys are bytes; messages show control characters as \xNN.
  static std::string printable(const std::string& key) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    for (const char ch : key) {
      const auto c = static_cast<unsigned char>(ch);
      if (c < 0x20 || c == 0x7f) {
        out += "\\x";
        out += hex[c >> 4];
        out += hex[c & 15];
      } else {
        out += static_cast<char>(c);
      }
    }
    return out;
  }

  // Runs `f` over a reply already checked for errors; a reply of the wrong shape means we are
  // not talking to the etcd we expect: unavailable.
  template <class F>
  auto decode(std::string_view op, const std::string& key, F&& f) const -> decltype(f()) {
    try {
      return f();
    } catch (const error&) {
      throw;
    } catch (const std::exception& e) {
      unavailable(op, key, std::string("unexpected reply from etcd: ") + e.what());
    }
  }

  // One POST on handle `h`: sets every option it relies on (handles are reused), performs it
  // and returns the HTTP status (0 if none). The reply goes to `write(..., sink)`; libcurl's
  // outcome to sink->curl_code and sink->curl_message.
  template <class Sink>
  long perform(CURL* h, const char* path, const std::string& body,
               std::size_t (*write)(char*, std::size_t, std::size_t, void*), Sink* sink,
               long timeout_ms, long connect_ms) const {
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
    const std::string url = endpoint_ + path;
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, static_cast<void*>(sink));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM for timeouts: threads
    curl_easy_setopt(h, CURLOPT_PROXY, "");     // a cluster-internal service: ignore *_proxy
    const auto outcome = detail::curl_perform(h, headers);
    sink->curl_code = outcome.code;
    if (outcome.code != CURLE_OK) {
      sink->curl_message = outcome.message;
      if (outcome.code == CURLE_OPERATION_TIMEDOUT)
        sink->curl_message += " (timeout " + std::to_string(timeout_ms) + " ms)";
    }
    return outcome.status;
  }

  struct unary_state {
    std::string body;
    CURLcode curl_code = CURLE_OK;
    std::string curl_message;
    static std::size_t on_data(char* data, std::size_t size, std::size_t count, void* self) {
      try {  // nothing may propagate through libcurl
        static_cast<unary_state*>(self)->body.append(data, size * count);
      } catch (const std::bad_alloc&) {
        return 0;  // the call fails with CURLE_WRITE_ERROR
      }
      return size * count;
    }
  };

  // One unary call: POST `body` to `path`, return the reply's JSON object. Throws
  // control_plane_unavailable for transport failures, HTTP 5xx and unreadable replies, and the
  // mapped code for an etcd error (NotFound ignored, giving an empty object, if `not_found_ok`).
  nlohmann::json call(std::string_view op, const std::string& key, const char* path,
                      const nlohmann::json& body, bool not_found_ok = false) {
    const std::string text = body.dump();
    unary_state st;
    long status = 0;
    {
      std::lock_guard lock(mutex_);
      status = perform(handle_.get(), path, text, &unary_state::on_data, &st,
                       static_cast<long>(options_.request_timeout.count()),
                       static_cast<long>(options_.connect_timeout.count()));
    }
    if (st.curl_code != CURLE_OK) unavailable(op, key, st.curl_message);
    nlohmann::json reply;
    std::string parse_error;
    try {
      // Streaming calls (keepalive) may send several values; the first is the reply.
      const auto end = json_value_end(st.body, 0);
      reply = nlohmann::json::parse(end == std::string::npos ? std::string_view(st.body)
                                                             : std::string_view(st.body).substr(0, end));
    } catch (const std::exception& e) {
      parse_error = e.what();
    }
    const auto failure = parse_error.empty() ? etcd_error(reply) : std::nullopt;
    if (status >= 500)
      unavailable(op, key, "HTTP " + std::to_string(status) +
                               (failure ? ": " + failure->message : std::string()));
    if (failure) {
      if (not_found_ok && failure->grpc_code == 5) return nlohmann::json::object();
      fail_grpc(op, key, *failure);
    }
    if (!parse_error.empty() || !reply.is_object() || status != 200)
      unavailable(op, key, "not an etcd v3 reply (HTTP " + std::to_string(status) + "): " +
                               printable(st.body.substr(0, 120)));
    return reply;
  }

  control_record to_record(const nlohmann::json& kv) const {
    const auto key = detail::base64_decode(kv.at("key").get_ref<const std::string&>());
    const auto vit = kv.find("value");  // proto3 JSON leaves out an empty value
    const auto value = vit == kv.end() ? std::optional<std::string>(std::string())
                                       : detail::base64_decode(vit->get_ref<const std::string&>());
    if (!key || !value) throw std::invalid_argument("a key or value that is not base64");
    if (!key->starts_with(options_.key_prefix))
      throw std::invalid_argument("a key outside the prefix");
    return control_record{key->substr(options_.key_prefix.size()), *value, to_i64(kv, "mod_revision"),
                          to_i64(kv, "lease")};
  }

  std::string endpoint_;
  std::string shown_;  // endpoint_ without credentials, for messages
  etcd_options options_;
  std::mutex mutex_;  // guards handle_
  handle_ptr handle_;
  std::mutex watch_mutex_;  // guards watch_handle_
  handle_ptr watch_handle_;
};

static_assert(control_plane<etcd_control_plane>);

}  // namespace dcr
