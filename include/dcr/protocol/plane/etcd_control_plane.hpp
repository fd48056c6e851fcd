// dcr/protocol/plane/etcd_control_plane.hpp: a control plane in etcd v3 (3.4 or later), spoken to
// through etcd's JSON gateway (grpc-gateway, under /v3/) with libcurl. Link with libcurl; the
// JSON bodies use nlohmann-json. Not part of dcr.hpp (the umbrella pulls in no libcurl).
//
// The control-plane model is etcd's, so the mapping is direct:
//   get, list        POST /v3/kv/range (list: range_end = the prefix with its last byte + 1)
//   transact         POST /v3/kv/txn: each compare is `mod_revision == r` (target MOD, result
//                    EQUAL; etcd compares an absent key as mod_revision 0, so r = 0 means absent);
//                    writes are request_put (with the lease) and request_delete_range
//   revision         POST /v3/maintenance/status: the `revision` of its header (needs no key
//                    permission, only an authenticated caller)
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
// Security: an https:// endpoint (etcds:// address) is verified against etcd_options::ca_file
// (else the system's CAs); cert_file and key_file present a client certificate (etcd's
// --client-cert-auth; etcd's gateway refuses certificates that carry a CommonName, so use one
// without). With a user, the plane authenticates (POST /v3/auth/authenticate with the user and
// password) before its first call and sends the token in the Authorization header; a token
// etcd no longer accepts (gRPC Unauthenticated, "invalid auth token": simple tokens expire
// after --auth-token-ttl without use, and on a leader change) is renewed and the call repeated
// once. A wrong password throws errc::invalid_argument naming the user. The password is never
// in a message or a URL.
//
// Thread-safe: one libcurl handle (one kept-alive connection) serves every call but
// wait_for_change, one at a time under a mutex; wait_for_change uses its own handle (a fresh
// one when another thread is already waiting), so waiting never blocks the other calls.
// Not supported yet: several endpoints.
#pragma once

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "dcr/config.hpp"
#include "dcr/detail/base64.hpp"
#include "dcr/detail/protocol/curl.hpp"
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
  /// PEM bundle of the CAs etcd's certificate is verified against (https); "": the system's.
  std::string ca_file;
  /// PEM client certificate and its key, for etcd's --client-cert-auth (both or neither).
  std::string cert_file, key_file;
  /// etcd user and password (authentication enabled); empty user: no authentication.
  std::string user, password;
  /// Limit on one authentication (connecting included). Longer than request_timeout: etcd
  /// checks the password with bcrypt, one request at a time, which takes seconds when many
  /// clients authenticate at once on a busy host.
  std::chrono::milliseconds auth_timeout{15000};
};

/// Where a control plane lives, as etcd_control_plane::parse_address reads it.
struct etcd_address {
  std::string endpoint;    ///< e.g. "http://127.0.0.1:2379"
  std::string key_prefix;  ///< e.g. "/dcr"
  /// The address's ca, cert, key and user settings, and the password they name (the rest of
  /// the options at their defaults).
  etcd_options options;
};

class etcd_control_plane {
 public:
  using control_plane_concept = control_plane_tag;

  /// Reads the address syntax of `dcr simulate --control-plane`:
  ///   etcd://HOST:PORT[/PREFIX][?OPTIONS]    endpoint http://HOST:PORT, key prefix /PREFIX
  ///                                          (default /dcr)
  ///   etcds://HOST:PORT[/PREFIX][?OPTIONS]   the same over https
  /// HOST is a name, an IPv4 address or a bracketed IPv6 address ([::1]); PORT is 1 to 65535
  /// and required; PREFIX keeps its inner slashes and loses trailing ones ("/a/b/" -> "/a/b"),
  /// and must not be empty (`etcd://h:1/` is rejected, so a typo never selects the whole
  /// keyspace). OPTIONS are NAME=VALUE pairs joined by '&', each at most once: ca=FILE,
  /// cert=FILE, key=FILE (etcds only; cert and key together), user=NAME, and password-file=FILE
  /// (the password is the file's first line; without it, DCR_ETCD_PASSWORD), needing user. No
  /// password is ever written in an address. Throws errc::invalid_argument naming the address
  /// (without its options' values past the file names) and what is wrong, or the password file
  /// that cannot be read.
  static etcd_address parse_address(std::string_view address);

  /// A control plane at `endpoint`, an http:// or https:// URL of one etcd member's client
  /// port (e.g. "http://127.0.0.1:2379"; a trailing '/' is dropped). Connects lazily: an
  /// unreachable etcd is reported by the first operation. Throws errc::invalid_argument for an
  /// endpoint that is not such a URL, non-positive timeouts, a certificate without its key (or
  /// the reverse), TLS files over http://, a password without a user, or a CA, certificate or
  /// key file that cannot be read.
  explicit etcd_control_plane(std::string endpoint, etcd_options options = {});

  /// A control plane at an etcd://HOST:PORT[/PREFIX][?OPTIONS] address (parse_address); the
  /// address's prefix replaces options.key_prefix, and its ca, cert, key and user settings
  /// those of `options`.
  static etcd_control_plane open(std::string_view address, etcd_options options = {});

  etcd_control_plane(const etcd_control_plane&) = delete;
  etcd_control_plane& operator=(const etcd_control_plane&) = delete;

  /// The endpoint as given (trailing '/' dropped).
  [[nodiscard]] const std::string& endpoint() const noexcept { return endpoint_; }
  /// The key prefix every key is stored under.
  [[nodiscard]] const std::string& key_prefix() const noexcept { return options_.key_prefix; }

  /// The record under `key` (without the prefix), or nullopt if absent. A leased record whose
  /// lease expired is absent once etcd has collected the lease (shortly after its TTL).
  std::optional<control_record> get(const std::string& key);

  /// Every record whose key starts with `prefix` (after the key prefix), sorted by key.
  std::vector<control_record> list(const std::string& prefix);

  /// If every compare holds (the key's mod_revision equals `revision`, 0: the key is absent),
  /// applies every write in one etcd transaction and returns true; otherwise writes nothing and
  /// returns false. A put under an unknown or expired lease, a key written twice, or more
  /// writes than etcd's --max-txn-ops throw errc::invalid_argument. An empty `writes` changes
  /// nothing and does not advance the revision.
  bool transact(std::span<const key_compare> compares, std::span<const key_write> writes);

  /// etcd's current revision (cluster-wide, not per prefix).
  std::int64_t revision();

  /// Watches the keys starting with `prefix` from revision `after` + 1 and returns as soon as
  /// etcd reports a change there (a put, a delete, a lease expiry, which etcd reports as a
  /// delete) with the revision of that report, or a compaction past `after` (changes may have
  /// been lost: the caller re-reads), or at `deadline` with the last revision etcd reported.
  /// An early return without a change is possible (etcd ended the watch). Past the deadline, or
  /// when etcd did not even confirm the watch by then, returns revision() instead (so a frozen
  /// etcd throws control_plane_unavailable after the deadline plus request_timeout).
  std::int64_t wait_for_change(const std::string& prefix, std::int64_t after,
                               protocol_clock::time_point deadline);

  /// A new lease of `ttl` (> 0); etcd raises a ttl below its minimum (see above) to that
  /// minimum. Records written under it vanish once it is neither kept alive nor revoked.
  lease_id grant_lease(std::chrono::seconds ttl);

  /// Renews `lease` for its full TTL; false if etcd no longer knows it (expired or revoked:
  /// its records are gone, or about to be).
  bool keep_alive(lease_id lease);

  /// Ends `lease` now; etcd erases its records in the same step. An unknown (expired or
  /// already revoked) lease is not an error.
  void revoke(lease_id lease);

  /// Authentications made since construction (the first call's, then one per renewed token).
  [[nodiscard]] std::uint64_t authentications() const noexcept { return authentications_.load(); }

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

  static void global_init();

  handle_ptr new_handle() const;

  // The endpoint for messages: without any user:password@.
  static std::string shown_endpoint(const std::string& e);

  std::string full(const std::string& key) const { return options_.key_prefix + key; }

  // Range body covering every key that starts with `k` (all keys if `k` is empty).
  static nlohmann::json range_body(const std::string& k);

  // The end of the JSON value starting at or after `at` in `s` (after leading whitespace), or
  // npos if it is not complete yet. Tracks nesting and strings only; parsing comes later.
  static std::size_t json_value_end(const std::string& s, std::size_t at);

  // An int64 field of proto3 JSON (a decimal string, or a number); 0 when left out.
  static std::int64_t to_i64(const nlohmann::json& j, const char* field);

  static std::int64_t header_revision(const nlohmann::json& reply, bool required = true);

  // The error in an etcd reply, if it is one. Unary calls answer {"error": "...", "code": N,
  // "message": "..."}; streams answer {"error": {"grpc_code": N, "message": "...", ...}}.
  static std::optional<etcd_failure> etcd_error(const nlohmann::json& reply);

  [[noreturn]] void unavailable(std::string_view op, const std::string& key,
                                const std::string& why) const;

  // The token to send ("" without a user), authenticating first when there is none.
  std::string token();
  // `used` was refused as expired: forget it (unless another thread already renewed it).
  void drop_token(const std::string& used);
  // Whether `f` is etcd refusing a token (gRPC Unauthenticated).
  static bool token_refused(const etcd_failure& f);

  [[noreturn]] void fail_grpc(std::string_view op, const std::string& key,
                              const etcd_failure& f) const;

  // Keys are bytes; messages show control characters as \xNN.
  static std::string printable(const std::string& key);

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
               long timeout_ms, long connect_ms, const std::string& auth_token) const {
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
    // Only when given: a fresh handle keeps libcurl's default CA bundle (the system's).
    if (!options_.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, options_.ca_file.c_str());
    if (!options_.cert_file.empty()) {
      curl_easy_setopt(h, CURLOPT_SSLCERT, options_.cert_file.c_str());
      curl_easy_setopt(h, CURLOPT_SSLKEY, options_.key_file.c_str());
    }
    if (!auth_token.empty()) {
      const std::string line = "Authorization: " + auth_token;
      headers = curl_slist_append(headers, line.c_str());
    }
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
                      const nlohmann::json& body, bool not_found_ok = false);

  // call() without authentication or token renewal: the body of one POST.
  nlohmann::json call_once(std::string_view op, const std::string& key, const char* path,
                           const std::string& text, const std::string& auth_token,
                           std::optional<etcd_failure>& refused, long timeout_ms);

  control_record to_record(const nlohmann::json& kv) const;

  std::string endpoint_;
  std::string shown_;  // endpoint_ without credentials, for messages
  etcd_options options_;
  std::mutex mutex_;  // guards handle_
  handle_ptr handle_;
  std::mutex watch_mutex_;  // guards watch_handle_
  handle_ptr watch_handle_;
  std::mutex auth_mutex_;  // guards token_
  std::string token_;
  std::atomic<std::uint64_t> authentications_{0};
};

static_assert(control_plane<etcd_control_plane>);

}  // namespace dcr

#include "dcr/detail/protocol/plane/etcd_control_plane.inl"
