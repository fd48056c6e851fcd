// dcr/detail/protocol/plane/etcd_control_plane.inl: the bodies of dcr/protocol/plane/etcd_control_plane.hpp
// (included at its end).
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_NETWORK)

namespace dcr {

DCR_NETWORK_INLINE etcd_address etcd_control_plane::parse_address(std::string_view address) {
  const auto bad = [&](const std::string& why) -> etcd_address {
    throw error(errc::invalid_argument, "etcd address '" + std::string(address) + "': " + why +
                                            " (expected etcd://HOST:PORT[/PREFIX][?OPTIONS])");
  };
  std::string_view rest = address;
  std::string_view query;
  if (const auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
    if (query.empty()) return bad("empty options after '?'");
  }
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
  const bool digits =
      !port.empty() && port.size() <= 5 &&
      std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || std::stoi(std::string(port)) < 1 || std::stoi(std::string(port)) > 65535)
    return bad("bad port '" + std::string(port) + "'");
  std::string prefix = "/dcr";
  if (!path.empty()) {
    while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
    if (path == "/") return bad("empty key prefix");
    prefix = std::string(path);
  }
  etcd_address out{scheme + std::string(authority), std::move(prefix), {}};
  std::string password_file;
  std::vector<std::string> seen;
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    const auto eq = pair.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == pair.size())
      return bad("option '" + std::string(pair) + "' is not NAME=VALUE");
    const std::string name(pair.substr(0, eq));
    const std::string value(pair.substr(eq + 1));
    if (std::find(seen.begin(), seen.end(), name) != seen.end())
      return bad("option '" + name + "' given twice");
    seen.push_back(name);
    if (name == "ca") {
      out.options.ca_file = value;
    } else if (name == "cert") {
      out.options.cert_file = value;
    } else if (name == "key") {
      out.options.key_file = value;
    } else if (name == "user") {
      out.options.user = value;
    } else if (name == "password-file") {
      password_file = value;
    } else {
      return bad("unknown option '" + name + "' (ca, cert, key, user, password-file)");
    }
  }
  const auto& o = out.options;
  if (scheme == "http://" && (!o.ca_file.empty() || !o.cert_file.empty() || !o.key_file.empty()))
    return bad("ca, cert and key need etcds:// (https)");
  if (o.cert_file.empty() != o.key_file.empty()) return bad("cert and key go together");
  if (!password_file.empty() && o.user.empty()) return bad("password-file needs user");
  if (!o.user.empty()) {
    if (!password_file.empty()) {
      std::FILE* f = std::fopen(password_file.c_str(), "rb");
      if (f == nullptr) return bad("cannot read the password file '" + password_file + "'");
      std::string text;
      char buf[512];
      while (const auto n = std::fread(buf, 1, sizeof buf, f)) text.append(buf, n);
      std::fclose(f);
      text = text.substr(0, text.find('\n'));
      if (!text.empty() && text.back() == '\r') text.pop_back();
      out.options.password = std::move(text);
    } else if (const char* p = std::getenv("DCR_ETCD_PASSWORD"); p != nullptr) {
      out.options.password = p;
    }
    if (out.options.password.empty())
      return bad("user '" + o.user + "' has no password (password-file=FILE or DCR_ETCD_PASSWORD)");
  }
  return out;
}

DCR_NETWORK_INLINE etcd_control_plane::etcd_control_plane(std::string endpoint, etcd_options options)
    : endpoint_(std::move(endpoint)), options_(std::move(options)) {
  while (endpoint_.ends_with('/')) endpoint_.pop_back();
  shown_ = shown_endpoint(endpoint_);
  DCR_EXPECTS(endpoint_.starts_with("http://") || endpoint_.starts_with("https://"),
              errc::invalid_argument,
              "etcd control plane: endpoint '" + shown_ + "' is not an http:// or https:// URL");
  DCR_EXPECTS(options_.request_timeout.count() > 0 && options_.connect_timeout.count() > 0 &&
                  options_.auth_timeout.count() > 0,
              errc::invalid_argument, "etcd control plane '" + shown_ + "': timeouts must be > 0");
  const std::string where = "etcd control plane '" + shown_ + "': ";
  DCR_EXPECTS(options_.cert_file.empty() == options_.key_file.empty(), errc::invalid_argument,
              where + "a client certificate needs its key (cert_file and key_file together)");
  DCR_EXPECTS(endpoint_.starts_with("https://") ||
                  (options_.ca_file.empty() && options_.cert_file.empty()),
              errc::invalid_argument, where + "ca_file, cert_file and key_file need an https:// endpoint");
  DCR_EXPECTS(options_.password.empty() || !options_.user.empty(), errc::invalid_argument,
              where + "a password without a user");
  for (const auto* file : {&options_.ca_file, &options_.cert_file, &options_.key_file}) {
    if (file->empty()) continue;
    std::FILE* f = std::fopen(file->c_str(), "rb");
    DCR_EXPECTS(f != nullptr, errc::invalid_argument, where + "cannot read '" + *file + "'");
    std::fclose(f);
  }
  global_init();
  handle_ = new_handle();
  watch_handle_ = new_handle();
}

DCR_NETWORK_INLINE etcd_control_plane etcd_control_plane::open(std::string_view address, etcd_options options) {
  auto a = parse_address(address);
  options.key_prefix = std::move(a.key_prefix);
  if (!a.options.ca_file.empty()) options.ca_file = std::move(a.options.ca_file);
  if (!a.options.cert_file.empty()) {
    options.cert_file = std::move(a.options.cert_file);
    options.key_file = std::move(a.options.key_file);
  }
  if (!a.options.user.empty()) {
    options.user = std::move(a.options.user);
    options.password = std::move(a.options.password);
  }
  return etcd_control_plane(std::move(a.endpoint), std::move(options));
}

DCR_NETWORK_INLINE std::optional<control_record> etcd_control_plane::get(const std::string& key) {
  const std::string k = full(key);
  const auto reply = call("get", k, "/v3/kv/range", {{"key", detail::base64_encode(k)}});
  return decode("get", k, [&]() -> std::optional<control_record> {
    const auto kvs = reply.find("kvs");
    if (kvs == reply.end() || kvs->empty()) return std::nullopt;
    return to_record(kvs->at(0));
  });
}

DCR_NETWORK_INLINE std::vector<control_record> etcd_control_plane::list(const std::string& prefix) {
  const std::string k = full(prefix);
  const auto reply = call("list", k, "/v3/kv/range", range_body(k));
  return decode("list", k, [&] {
    std::vector<control_record> out;
    if (const auto kvs = reply.find("kvs"); kvs != reply.end())
      for (const auto& kv : *kvs) out.push_back(to_record(kv));
    return out;  // etcd returns a range sorted by key; dropping a common prefix keeps it so
  });
}

DCR_NETWORK_INLINE bool etcd_control_plane::transact(std::span<const key_compare> compares,
                                         std::span<const key_write> writes) {
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
  const std::string k = full(!writes.empty()     ? writes.front().key
                             : !compares.empty() ? compares.front().key
                                                 : std::string());
  const auto reply =
      call("transact", k, "/v3/kv/txn", {{"compare", std::move(cmp)}, {"success", std::move(ops)}});
  return decode("transact", k, [&] {
    const auto it = reply.find("succeeded");
    return it != reply.end() && it->get<bool>();  // proto3 JSON omits false
  });
}

DCR_NETWORK_INLINE std::int64_t etcd_control_plane::revision() {
  // The member's status: its header holds the store's revision, and etcd asks only that the
  // caller be authenticated, so a user whose role covers just some keys may ask too (a range
  // over a probe key would need read access to that key).
  const std::string what = "(the revision)";
  const auto reply = call("revision", what, "/v3/maintenance/status", nlohmann::json::object());
  return decode("revision", what, [&] { return header_revision(reply); });
}

DCR_NETWORK_INLINE std::int64_t etcd_control_plane::wait_for_change(const std::string& prefix,
                                                        std::int64_t after,
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
  long http = 0;
  for (int renewed = 0;; ++renewed) {
    st = watch_state{};
    st.after = after;
    const std::string auth = token();
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - protocol_clock::now());
    const long left_ms = std::max<long>(1, static_cast<long>(left.count()));
    http = perform(h, "/v3/watch", body, &watch_state::on_data, &st, left_ms,
                   std::min<long>(left_ms, static_cast<long>(options_.connect_timeout.count())),
                   auth);
    // An expired token cancels the watch ("rpc error: code = Unauthenticated ..."): renew once.
    if (renewed == 0 && !auth.empty() && st.failure && token_refused(*st.failure) &&
        protocol_clock::now() < deadline) {
      drop_token(auth);
      continue;
    }
    break;
  }
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

DCR_NETWORK_INLINE lease_id etcd_control_plane::grant_lease(std::chrono::seconds ttl) {
  DCR_EXPECTS(ttl.count() > 0, errc::invalid_argument,
              "etcd control plane '" + shown_ + "': grant_lease: ttl must be > 0 s");
  const auto reply = call("grant_lease", "-", "/v3/lease/grant", {{"TTL", ttl.count()}, {"ID", 0}});
  return decode("grant_lease", "-", [&] {
    const lease_id id = to_i64(reply, "ID");
    if (id == 0) throw std::invalid_argument("no lease ID in the reply");
    return id;
  });
}

DCR_NETWORK_INLINE bool etcd_control_plane::keep_alive(lease_id lease) {
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

DCR_NETWORK_INLINE void etcd_control_plane::revoke(lease_id lease) {
  if (lease == 0) return;
  const std::string what = std::to_string(lease);
  call("revoke", what, "/v3/lease/revoke", {{"ID", what}}, /*not_found_ok=*/true);
}

DCR_NETWORK_INLINE void etcd_control_plane::global_init() {
  // Once per process, before any handle; not thread-safe itself, hence the static.
  [[maybe_unused]] static const bool done = [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
      throw error(errc::control_plane_unavailable,
                  "etcd control plane: libcurl failed to initialize");
    return true;
  }();
}

DCR_NETWORK_INLINE etcd_control_plane::handle_ptr etcd_control_plane::new_handle() const {
  handle_ptr h(curl_easy_init());
  DCR_EXPECTS(h != nullptr, errc::control_plane_unavailable,
              "etcd control plane '" + shown_ + "': libcurl could not make a handle");
  return h;
}

DCR_NETWORK_INLINE std::string etcd_control_plane::shown_endpoint(const std::string& e) {
  const auto scheme = e.find("://");
  const auto start = scheme == std::string::npos ? 0 : scheme + 3;
  const auto at = e.find('@', start);
  const auto slash = e.find('/', start);
  if (at == std::string::npos || (slash != std::string::npos && at > slash)) return e;
  return e.substr(0, start) + e.substr(at + 1);
}

DCR_NETWORK_INLINE nlohmann::json etcd_control_plane::range_body(const std::string& k) {
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

DCR_NETWORK_INLINE std::size_t etcd_control_plane::json_value_end(const std::string& s, std::size_t at) {
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

DCR_NETWORK_INLINE std::int64_t etcd_control_plane::to_i64(const nlohmann::json& j, const char* field) {
  const auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  const auto& s = it->get_ref<const std::string&>();
  std::size_t used = 0;
  const std::int64_t v = std::stoll(s, &used);
  if (used != s.size()) throw std::invalid_argument("bad integer '" + s + "' in " + field);
  return v;
}

DCR_NETWORK_INLINE std::int64_t etcd_control_plane::header_revision(const nlohmann::json& reply,
                                                        bool required) {
  const auto h = reply.find("header");
  if (h == reply.end()) {
    if (required) throw std::invalid_argument("no header in the reply");
    return 0;
  }
  const std::int64_t r = to_i64(*h, "revision");
  if (required && r <= 0) throw std::invalid_argument("no revision in the reply header");
  return r;
}

DCR_NETWORK_INLINE std::optional<etcd_control_plane::etcd_failure> etcd_control_plane::etcd_error(
    const nlohmann::json& reply) {
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

DCR_NETWORK_INLINE void etcd_control_plane::unavailable(std::string_view op, const std::string& key,
                                            const std::string& why) const {
  throw error(errc::control_plane_unavailable, "etcd control plane '" + shown_ +
                                                   "': " + std::string(op) + " '" + printable(key) +
                                                   "': " + why);
}

DCR_NETWORK_INLINE void etcd_control_plane::fail_grpc(std::string_view op, const std::string& key,
                                          const etcd_failure& f) const {
  errc code = errc::invalid_argument;
  switch (f.grpc_code) {
    case 1:  // Canceled
    case 4:  // DeadlineExceeded (e.g. "request timed out", no leader)
    case 8:  // ResourceExhausted ("too many requests", "database space exceeded"), but
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
                        printable(key) + "': etcd error (gRPC code " + std::to_string(f.grpc_code) +
                        "): " + f.message);
}

DCR_NETWORK_INLINE std::string etcd_control_plane::printable(const std::string& key) {
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

DCR_NETWORK_INLINE std::string etcd_control_plane::token() {
  if (options_.user.empty()) return {};
  std::lock_guard lock(auth_mutex_);
  if (!token_.empty()) return token_;
  const std::string text =
      nlohmann::json{{"name", options_.user}, {"password", options_.password}}.dump();
  std::optional<etcd_failure> refused;
  const std::string what = "user " + options_.user;
  const auto reply = call_once("authenticate", what, "/v3/auth/authenticate", text, {}, refused,
                               static_cast<long>(options_.auth_timeout.count()));
  if (refused) fail_grpc("authenticate", what, *refused);  // a wrong password: invalid_argument
  token_ = decode("authenticate", what, [&] {
    const auto t = reply.at("token").get<std::string>();
    if (t.empty()) throw std::invalid_argument("an empty token");
    return t;
  });
  ++authentications_;
  return token_;
}

DCR_NETWORK_INLINE void etcd_control_plane::drop_token(const std::string& used) {
  std::lock_guard lock(auth_mutex_);
  if (token_ == used) token_.clear();
}

DCR_NETWORK_INLINE bool etcd_control_plane::token_refused(const etcd_failure& f) {
  return f.grpc_code == 16 || f.message.find("invalid auth token") != std::string::npos ||
         f.message.find("code = Unauthenticated") != std::string::npos;
}

DCR_NETWORK_INLINE nlohmann::json etcd_control_plane::call(std::string_view op, const std::string& key,
                                               const char* path, const nlohmann::json& body,
                                               bool not_found_ok) {
  const std::string text = body.dump();
  for (int renewed = 0;; ++renewed) {
    const std::string auth = token();
    std::optional<etcd_failure> failure;
    auto reply = call_once(op, key, path, text, auth, failure,
                           static_cast<long>(options_.request_timeout.count()));
    if (!failure) return reply;
    if (renewed == 0 && !auth.empty() && token_refused(*failure)) {
      drop_token(auth);  // expired (or revoked by a leader change): renew once
      continue;
    }
    if (not_found_ok && failure->grpc_code == 5) return nlohmann::json::object();
    fail_grpc(op, key, *failure);
  }
}

DCR_NETWORK_INLINE nlohmann::json etcd_control_plane::call_once(std::string_view op, const std::string& key,
                                                    const char* path, const std::string& text,
                                                    const std::string& auth_token,
                                                    std::optional<etcd_failure>& refused,
                                                    long timeout_ms) {
  unary_state st;
  long status = 0;
  {
    std::lock_guard lock(mutex_);
    status = perform(handle_.get(), path, text, &unary_state::on_data, &st, timeout_ms,
                     static_cast<long>(options_.connect_timeout.count()), auth_token);
  }
  if (st.curl_code != CURLE_OK) unavailable(op, key, st.curl_message);
  nlohmann::json reply;
  std::string parse_error;
  try {
    // Streaming calls (keepalive) may send several values; the first is the reply.
    const auto end = json_value_end(st.body, 0);
    reply =
        nlohmann::json::parse(end == std::string::npos ? std::string_view(st.body)
                                                       : std::string_view(st.body).substr(0, end));
  } catch (const std::exception& e) {
    parse_error = e.what();
  }
  const auto failure = parse_error.empty() ? etcd_error(reply) : std::nullopt;
  if (status >= 500)
    unavailable(
        op, key,
        "HTTP " + std::to_string(status) + (failure ? ": " + failure->message : std::string()));
  if (failure) {
    refused = failure;
    return {};
  }
  if (!parse_error.empty() || !reply.is_object() || status != 200)
    unavailable(op, key,
                "not an etcd v3 reply (HTTP " + std::to_string(status) +
                    "): " + printable(st.body.substr(0, 120)));
  return reply;
}

DCR_NETWORK_INLINE control_record etcd_control_plane::to_record(const nlohmann::json& kv) const {
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

}  // namespace dcr

#endif  // DCR_HEADER_BODIES_OF(DCR_PART_NETWORK)
