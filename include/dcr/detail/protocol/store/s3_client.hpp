// dcr/detail/protocol/store/s3_client.hpp: signed S3 requests over libcurl, with retries (implementation only;
// the contract is dcr/protocol/store/s3_payload_store.hpp's).
//
// Signing is libcurl's own SigV4 (CURLOPT_AWS_SIGV4 "aws:amz:REGION:s3", 7.75 or later). What
// libcurl 7.88 leaves to the caller, done here:
//   - x-amz-content-sha256 is sent explicitly (S3 requires it on every SigV4 request, and
//     libcurl does not compute it for uploads it streams): the hex SHA-256 of the body, by
//     OpenSSL's EVP, or UNSIGNED-PAYLOAD when the client is told not to hash;
//   - the query string is written in canonical form: names and values URI-encoded (RFC 3986
//     unreserved characters kept, the rest %XX in upper case), sorted by name, every parameter
//     with its '=' ("?uploads="), because libcurl signs the query as it is written;
//   - the path is URI-encoded once with '/' kept (S3's canonical URI is not double-encoded);
//   - no header is given empty to remove it (such as "Expect:"): libcurl 7.88 lists it among
//     the signed headers although it does not send it, and the signature is refused.
// Credentials go to libcurl as CURLOPT_USERNAME / CURLOPT_PASSWORD, never into a URL, a header
// string of ours or a message.
//
// Bounds: every request has a whole-request limit (request_timeout_ms, CURLOPT_TIMEOUT_MS), a
// connect limit, and a minimum rate (min_rate bytes/s averaged over stall_timeout_s:
// CURLOPT_LOW_SPEED_LIMIT/TIME), so a trickling server is cut, not waited on. A response body
// is capped (request::max_bytes, else client_config::max_body_bytes): a Content-Length above
// the cap, or more bytes than it, ends the transfer at once (never retried: the object is what
// it is), and Content-Length reserves at most the cap. A request may carry a cancellation flag
// and a deadline, checked by libcurl's progress callback (at least once a second, and as data
// moves) and between retries: a cancelled or late request ends within about a second.
//
// Retries: a request is repeated (up to max_retries more times, with exponential backoff and
// full jitter) when libcurl could not complete it (connect failure, timeout, stall, reset) or
// S3 answered 5xx, 429, 503 SlowDown, 400 RequestTimeout or 409 ConditionalRequestConflict, or
// answered 200 with an <Error> body (CompleteMultipartUpload does). Any other status outside
// 2xx and the caller's accepted list throws errc::transport_failure naming the method, the
// bucket and key, the HTTP status and S3's error code and message.
//
// Thread-safe: every call takes an easy handle from a pool (created on demand, kept for reuse,
// so that each keeps its connection alive), one per concurrent call.
#pragma once

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "dcr/detail/protocol/curl.hpp"
#include "dcr/detail/protocol/store/s3_xml.hpp"
#include "dcr/error.hpp"

namespace dcr::detail::s3 {

/// `text` URI-encoded as SigV4 wants it: A-Z a-z 0-9 - _ . ~ kept (and '/' when `keep_slash`),
/// every other byte %XX with upper-case hex.
inline std::string uri_encode(std::string_view text, bool keep_slash) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

/// The canonical query string of `params`: each name=value URI-encoded, sorted by encoded name
/// (then value), joined by '&'. Empty for no parameters.
inline std::string canonical_query(std::vector<std::pair<std::string, std::string>> params) {
  for (auto& [k, v] : params) {
    k = uri_encode(k, false);
    v = uri_encode(v, false);
  }
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [k, v] : params) {
    if (!out.empty()) out += '&';
    out += k;
    out += '=';
    out += v;
  }
  return out;
}

/// Lower-case hex SHA-256 of `bytes` (OpenSSL EVP).
inline std::string sha256_hex(std::span<const std::byte> bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md, &length, EVP_sha256(), nullptr) != 1)
    throw error(errc::transport_failure, "S3: OpenSSL could not compute a SHA-256");
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(length * 2);
  for (unsigned int i = 0; i < length; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

/// Everything a client needs; filled by s3_payload_store from its options.
struct client_config {
  std::string scheme;     ///< "http" or "https"
  std::string authority;  ///< host[:port] of the endpoint
  std::string bucket;
  bool virtual_host = false;  ///< BUCKET.host/key instead of host/BUCKET/key
  std::string region;
  std::string access_key_id, secret_access_key, session_token;
  bool sign_payload = true;  ///< hash bodies (else UNSIGNED-PAYLOAD)
  std::string ca_file;       ///< PEM bundle of trusted CAs for https ("": libcurl's default)
  long connect_timeout_ms = 5000;
  long request_timeout_ms = 120000;  ///< whole request, > 0
  long stall_timeout_s = 30;         ///< abort below min_rate bytes/s for this long
  long min_rate = 1024;              ///< bytes/s, >= 1
  std::uint64_t max_body_bytes = std::uint64_t{8} << 30;  ///< response body cap
  int max_retries = 5;
  std::chrono::milliseconds backoff_initial{100};
  std::chrono::milliseconds backoff_max{5000};
};

/// One request.
struct request {
  std::string_view method;  ///< GET, PUT, POST, DELETE, HEAD
  std::string key;          ///< object key; empty: the bucket itself
  std::string subject;      ///< what messages name after s3://BUCKET/ (default: the key)
  std::vector<std::pair<std::string, std::string>> query;  ///< any order: sent canonical
  std::span<const std::byte> body;
  std::vector<std::string> headers;  ///< extra "Name: value" lines (never credentials)
  /// A successful response body goes here (replacing its contents) instead of `text`.
  std::vector<std::byte>* into = nullptr;
  /// The body may hold at most this many bytes (0: client_config::max_body_bytes).
  std::uint64_t max_bytes = 0;
  /// Set (by another thread): the request ends, errc::transport_failure "cancelled".
  const std::atomic<bool>* cancel = nullptr;
  /// Past it the request ends (and is not retried), errc::deadline_exceeded.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

/// What S3 answered.
struct response {
  long status = 0;
  std::string text;        ///< the body, unless it went to request::into
  std::string etag;        ///< the ETag header, quotes included
  std::string error_code;  ///< S3's <Code>, for an error body
  std::string error_message;
  int attempts = 0;        ///< tries it took (1: no retry)
  CURLcode curl_code = CURLE_OK;  ///< libcurl's outcome (status 0 when not CURLE_OK)
  bool too_large = false;  ///< the body exceeded the cap (status 0)
  bool cancelled = false;  ///< the cancellation flag was set (status 0)
  bool late = false;       ///< the request's deadline passed (status 0)
};

class client {
 public:
  explicit client(client_config config) : config_(std::move(config)) {
    global_init();
    signer_ = "aws:amz:" + config_.region + ":s3";
  }
  client(const client&) = delete;
  client& operator=(const client&) = delete;
  ~client() {
    for (CURL* h : idle_) curl_easy_cleanup(h);
  }

  [[nodiscard]] const client_config& config() const noexcept { return config_; }

  /// "s3://BUCKET/KEY" (for messages).
  [[nodiscard]] std::string where(const std::string& key) const {
    return "s3://" + config_.bucket + "/" + key;
  }

  /// Sends `r`, retrying as the file comment says, and returns the response when its status is
  /// 2xx or in `accepted`. Throws errc::transport_failure otherwise.
  response call(const request& r, std::initializer_list<long> accepted = {}) {
    response out;
    for (int attempt = 0;; ++attempt) {
      out = once(r);
      out.attempts = attempt + 1;
      const bool ok_status = (out.status >= 200 && out.status < 300 && out.error_code.empty()) ||
                             std::find(accepted.begin(), accepted.end(), out.status) != accepted.end();
      if (out.status != 0 && ok_status) return out;
      if (!retryable(out) || attempt >= config_.max_retries) fail(r, out);
      if (!backoff(attempt, r)) {  // cancelled or past the deadline while waiting
        out.status = 0;
        out.cancelled = cancelled(r);
        out.late = !out.cancelled;
        out.error_message = out.cancelled ? "cancelled" : "deadline passed";
        fail(r, out);
      }
    }
  }

 private:
  // Per-call state the callbacks see.
  struct transfer {
    std::span<const std::byte> body;
    std::size_t sent = 0;
    std::vector<std::byte>* into = nullptr;
    std::string text;
    std::string etag;
    CURLcode curl_code = CURLE_OK;
    std::string curl_message;
    std::uint64_t max_bytes = 0;
    std::uint64_t received = 0;
    std::uint64_t declared = 0;  // Content-Length of the last response (0: none)
    const std::atomic<bool>* cancel = nullptr;
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
    bool too_large = false, cancelled = false, late = false;
    bool head = false;  // a HEAD request: no body follows its Content-Length

    static int on_progress(void* self, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
      auto& t = *static_cast<transfer*>(self);
      if (t.cancel != nullptr && t.cancel->load(std::memory_order_relaxed)) {
        t.cancelled = true;
        return 1;  // CURLE_ABORTED_BY_CALLBACK
      }
      if (std::chrono::steady_clock::now() >= t.deadline) {
        t.late = true;
        return 1;
      }
      return 0;
    }

    static std::size_t on_read(char* buffer, std::size_t size, std::size_t count, void* self) {
      auto& t = *static_cast<transfer*>(self);
      const std::size_t n = std::min(size * count, t.body.size() - t.sent);
      std::copy_n(reinterpret_cast<const char*>(t.body.data()) + t.sent, n, buffer);
      t.sent += n;
      return n;
    }
    static int on_seek(void* self, curl_off_t offset, int origin) {
      auto& t = *static_cast<transfer*>(self);
      if (origin != SEEK_SET || offset < 0 || static_cast<std::size_t>(offset) > t.body.size())
        return CURL_SEEKFUNC_CANTSEEK;
      t.sent = static_cast<std::size_t>(offset);
      return CURL_SEEKFUNC_OK;
    }
    static std::size_t on_write(char* data, std::size_t size, std::size_t count, void* self) {
      auto& t = *static_cast<transfer*>(self);
      t.received += size * count;
      if (t.received > t.max_bytes) {
        t.too_large = true;
        return 0;  // CURLE_WRITE_ERROR
      }
      try {  // nothing may propagate through libcurl
        if (t.into != nullptr) {
          const auto* p = reinterpret_cast<const std::byte*>(data);
          t.into->insert(t.into->end(), p, p + size * count);
        } else {
          t.text.append(data, size * count);
        }
      } catch (const std::bad_alloc&) {
        return 0;  // CURLE_WRITE_ERROR
      }
      return size * count;
    }
    static std::size_t on_header(char* data, std::size_t size, std::size_t count, void* self) {
      auto& t = *static_cast<transfer*>(self);
      const std::string_view line(data, size * count);
      const auto colon = line.find(':');
      if (line.starts_with("HTTP/")) {  // a new response (after 100 Continue): start over
        t.etag.clear();
        t.declared = 0;
      } else if (colon != std::string_view::npos) {
        std::string name(line.substr(0, colon));
        std::transform(name.begin(), name.end(), name.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        std::string_view value = line.substr(colon + 1);
        while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
        while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' '))
          value.remove_suffix(1);
        try {
          if (name == "etag") t.etag = std::string(value);
          if (name == "content-length" && !t.head) {  // a HEAD's is the object's size
            const auto n = std::stoull(std::string(value));
            t.declared = n;
            if (n > t.max_bytes) {  // refused before a byte of the body is read
              t.too_large = true;
              return 0;
            }
            // Never more than 64 MiB up front: a length that lies costs at most that.
            if (t.into != nullptr)
              t.into->reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n, std::uint64_t{64} << 20)));
          }
        } catch (const std::exception&) {
          // a malformed header: not ours to judge (the status decides)
        }
      }
      return size * count;
    }
  };

  static void global_init() {
    [[maybe_unused]] static const bool done = [] {
      if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        throw error(errc::transport_failure, "S3: libcurl failed to initialize");
      return true;
    }();
  }

  CURL* acquire() {
    {
      std::lock_guard lock(mutex_);
      if (!idle_.empty()) {
        CURL* h = idle_.back();
        idle_.pop_back();
        return h;
      }
    }
    CURL* h = curl_easy_init();
    DCR_EXPECTS(h != nullptr, errc::transport_failure, "S3: libcurl could not make a handle");
    return h;
  }
  void release(CURL* h) {
    std::lock_guard lock(mutex_);
    idle_.push_back(h);
  }

  std::string url_of(const request& r) const {
    std::string url = config_.scheme + "://";
    if (config_.virtual_host) {
      url += config_.bucket + "." + config_.authority + "/";
    } else {
      url += config_.authority + "/" + config_.bucket + "/";
    }
    url += uri_encode(r.key, true);
    if (!r.query.empty()) url += "?" + canonical_query(r.query);
    return url;
  }

  response once(const request& r) {
    transfer t;
    t.body = r.body;
    t.into = r.into;
    t.max_bytes = r.max_bytes != 0 ? std::min(r.max_bytes, config_.max_body_bytes) : config_.max_body_bytes;
    t.cancel = r.cancel;
    t.deadline = r.deadline;
    t.head = r.method == "HEAD";
    if (t.into != nullptr) t.into->clear();
    if (cancelled(r) || std::chrono::steady_clock::now() >= r.deadline) {
      response out;
      out.cancelled = cancelled(r);
      out.late = !out.cancelled;
      out.error_message = out.cancelled ? "cancelled" : "deadline passed";
      return out;
    }
    const std::string url = url_of(r);
    const std::string hash = config_.sign_payload || r.body.empty() ? sha256_hex(r.body) : "UNSIGNED-PAYLOAD";
    const std::string method(r.method);
    std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> headers(nullptr, &curl_slist_free_all);
    auto add = [&](const std::string& line) {
      curl_slist* head = curl_slist_append(headers.get(), line.c_str());
      if (head == nullptr) throw std::bad_alloc();
      (void)headers.release();  // the same list, or a new one when it was empty
      headers.reset(head);
    };
    add("x-amz-content-sha256: " + hash);
    if (!config_.session_token.empty()) add("x-amz-security-token: " + config_.session_token);
    for (const auto& h : r.headers) add(h);
    // No "Expect:" to skip the 100-continue round trip: libcurl 7.88 would sign that header
    // although it is not sent, and S3 would refuse the signature. A short wait instead.

    CURL* h = acquire();
    curl_easy_reset(h);  // keeps the connection, DNS and TLS session caches
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, signer_.c_str());
    curl_easy_setopt(h, CURLOPT_USERNAME, config_.access_key_id.c_str());
    curl_easy_setopt(h, CURLOPT_PASSWORD, config_.secret_access_key.c_str());
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &transfer::on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, static_cast<void*>(&t));
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &transfer::on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, static_cast<void*>(&t));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, config_.connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, config_.request_timeout_ms);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, config_.min_rate);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, config_.stall_timeout_s);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, &transfer::on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, static_cast<void*>(&t));
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    if (!config_.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, config_.ca_file.c_str());
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for timeouts
    curl_easy_setopt(h, CURLOPT_EXPECT_100_TIMEOUT_MS, 200L);
    if (r.method == "GET") {
      curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    } else if (r.method == "HEAD") {
      curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (r.method == "PUT") {
      curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(h, CURLOPT_READFUNCTION, &transfer::on_read);
      curl_easy_setopt(h, CURLOPT_READDATA, static_cast<void*>(&t));
      curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, &transfer::on_seek);
      curl_easy_setopt(h, CURLOPT_SEEKDATA, static_cast<void*>(&t));
      curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
    } else if (r.method == "POST") {
      curl_easy_setopt(h, CURLOPT_POST, 1L);
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, reinterpret_cast<const char*>(r.body.data()));
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
    } else {
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method.c_str());
    }
    const auto outcome = curl_perform(h, headers.release());
    release(h);

    response out;
    out.etag = std::move(t.etag);
    if (outcome.code != CURLE_OK) {
      out.curl_code = outcome.code;
      out.error_message = outcome.message;
      out.too_large = t.too_large;
      out.cancelled = t.cancelled;
      out.late = t.late;
      if (t.too_large)
        out.error_message = "the body exceeds the cap of " + std::to_string(t.max_bytes) + " bytes" +
                            (t.declared > t.max_bytes ? " (Content-Length " + std::to_string(t.declared) + ")"
                                                      : std::string());
      else if (t.cancelled)
        out.error_message = "cancelled";
      else if (t.late)
        out.error_message = "deadline passed";
      if (t.into != nullptr) t.into->clear();
      return out;
    }
    const long status = outcome.status;
    out.status = status;
    // An error body: a non-2xx answer, or a 2xx one whose document is <Error> (S3 reports
    // some failures of CompleteMultipartUpload that way).
    std::string_view body = t.text;
    std::string moved;
    if (t.into != nullptr && (status < 200 || status >= 300)) {
      moved.assign(reinterpret_cast<const char*>(t.into->data()), t.into->size());
      t.into->clear();
      body = moved;
    }
    if (r.method != "GET" || status < 200 || status >= 300) {
      try {
        if (root_name(body) == "Error") {
          out.error_code = first_text(body, "Code").value_or("");
          out.error_message = first_text(body, "Message").value_or("");
          if (out.error_code.empty()) out.error_code = "(no code)";
        }
      } catch (const std::invalid_argument&) {
        out.error_message = "unreadable error body";
      }
    }
    out.text = t.into != nullptr ? std::move(moved) : std::move(t.text);
    return out;
  }

  static bool cancelled(const request& r) noexcept {
    return r.cancel != nullptr && r.cancel->load(std::memory_order_relaxed);
  }

  bool retryable(const response& r) const {
    if (r.too_large || r.cancelled || r.late) return false;
    if (r.status == 0) {  // libcurl could not complete the exchange
      switch (r.curl_code) {
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_COULDNT_CONNECT:
        case CURLE_OPERATION_TIMEDOUT:
        case CURLE_SEND_ERROR:
        case CURLE_RECV_ERROR:
        case CURLE_GOT_NOTHING:
        case CURLE_PARTIAL_FILE:
        case CURLE_SSL_CONNECT_ERROR:
        case CURLE_HTTP2:
        case CURLE_HTTP2_STREAM:
          return true;
        default:
          return false;
      }
    }
    if (r.status >= 500 || r.status == 429) return true;
    if (r.status == 400 && r.error_code == "RequestTimeout") return true;
    if (r.status == 409 && r.error_code == "ConditionalRequestConflict") return true;
    if (r.status >= 200 && r.status < 300 && !r.error_code.empty())  // 200 with <Error>
      return r.error_code == "InternalError" || r.error_code == "SlowDown" ||
             r.error_code == "ServiceUnavailable";
    return false;
  }

  // Waits before retry `attempt`; false (at once) if the request is cancelled or its deadline
  // passes meanwhile.
  bool backoff(int attempt, const request& r) {
    const auto cap = std::min<std::int64_t>(config_.backoff_max.count(),
                                            config_.backoff_initial.count() << std::min(attempt, 20));
    std::int64_t wait = 0;
    {
      std::lock_guard lock(mutex_);
      wait = std::uniform_int_distribution<std::int64_t>(cap / 2, std::max<std::int64_t>(cap, 0))(rng_);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait);
    for (;;) {
      if (cancelled(r)) return false;
      const auto now = std::chrono::steady_clock::now();
      if (now >= r.deadline) return false;
      if (now >= until) return true;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          until - now, std::chrono::milliseconds(20)));
    }
  }

  [[noreturn]] void fail(const request& r, const response& out) const {
    std::string what = "S3 " + std::string(r.method) + " " + where(r.subject.empty() ? r.key : r.subject);
    for (std::size_t i = 0; i < r.query.size(); ++i)
      if (r.query[i].first == "uploadId" || r.query[i].first == "partNumber")
        what += (what.find('?') == std::string::npos ? "?" : "&") + r.query[i].first + "=" + r.query[i].second;
    what += " (endpoint " + config_.scheme + "://" + config_.authority + "): ";
    if (out.status == 0) {
      what += out.error_message;
    } else {
      what += "HTTP " + std::to_string(out.status);
      if (!out.error_code.empty()) what += " " + out.error_code;
      if (!out.error_message.empty()) what += ": " + out.error_message;
      if (out.error_code.empty() && out.status == 403)
        what += " (access denied: check the credentials, the region and the bucket policy)";
    }
    if (out.attempts > 1) what += " (after " + std::to_string(out.attempts) + " attempts)";
    throw error(out.late ? errc::deadline_exceeded : errc::transport_failure, what);
  }

  client_config config_;
  std::string signer_;
  std::mutex mutex_;
  std::vector<CURL*> idle_;
  std::minstd_rand rng_{static_cast<std::uint32_t>(
      std::chrono::steady_clock::now().time_since_epoch().count())};
};

}  // namespace dcr::detail::s3
