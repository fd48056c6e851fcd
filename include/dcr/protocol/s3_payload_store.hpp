// dcr/protocol/s3_payload_store.hpp: a payload store (dcr/protocol/payload_store.hpp) in an S3
// bucket, on AWS or any S3-compatible server (SeaweedFS, MinIO, Ceph RGW), over libcurl. Link
// with libcurl (7.75 or later; Debian 12's 7.88 is what dcr tests) and OpenSSL's libcrypto. Not
// part of dcr.hpp (the umbrella pulls in neither).
//
// Semantics are the file store's (file_payload_store), object for file:
//   PREFIX <attempt>/o<owner>/p<sequence>   one payload
//   PREFIX <attempt>/o<owner>/manifest      the owner's manifest
// where <attempt> is to_string(attempt_key), "t<base>-<target>-a<number>" (dcr/codec/item.hpp).
//   - put(id, bytes) writes the payload object once. With conditional writes (the default) the
//     PUT carries If-None-Match: * so that S3 itself refuses to replace an existing object
//     (412): then the object is read back, and equal bytes are a no-op, other bytes an
//     errc::transport_failure. Without them (a server that ignores If-None-Match), a HEAD
//     decides first, which is not atomic against a concurrent put of the same id (the protocol
//     has one writer per id). An object appears whole or not at all (S3 PUT and
//     CompleteMultipartUpload are atomic); payloads above multipart_threshold go up in parts of
//     part_size, and a failed multipart upload is aborted.
//   - put_manifest checks with one listing that every id it names was put for its attempt by
//     its owner, then writes the manifest object (replacing an earlier one, as the file store
//     does).
//   - list(key) is ListObjectsV2 over the attempt's prefix, every page; an owner with a
//     manifest lists exactly its manifest's ids (manifests are read once per ETag and cached),
//     an owner without one lists the payload objects seen. Objects of other names under the
//     prefix are ignored.
//   - get answers absent for 404 (NoSuchKey): not put yet, or erased.
//   - erase_through(v) deletes every object of every attempt whose target is <= v (listing the
//     prefix's attempt "directories", then DELETE per object, several at once) and aborts the
//     incomplete multipart uploads under them (left by a process killed mid-upload).
// The credentials' identity needs GetObject, PutObject, DeleteObject, ListBucket and
// AbortMultipartUpload / ListBucketMultipartUploads on the prefix (without ListBucket, S3
// answers 403 instead of 404 for a missing key).
//
// Signing: libcurl's SigV4 (dcr/detail/s3_client.hpp says what dcr adds to it). Bodies are
// hashed (SHA-256 by OpenSSL, about 1.8 GB/s per core here) by default so that the signature
// covers the payload bytes: over plain http a body altered or cut short on the way is refused
// by a server that checks the hash (AWS does; SeaweedFS does not), and the one pass costs less
// than compressing the payload did. s3_payload_hash::unsigned_payload sends UNSIGNED-PAYLOAD
// instead, for https endpoints, where TLS protects the body already. Either way the payload's
// own checksum, checked by the receiver, stays the end-to-end integrity check.
//
// Failures: 5xx, 429, 503 SlowDown, 400 RequestTimeout and transport errors (refused, reset,
// timed out, stalled below 1 byte/s for stall_timeout) are retried max_retries times with
// exponential backoff and jitter; then, and at once for any other 4xx (a wrong secret: 403
// SignatureDoesNotMatch; a missing bucket: 404 NoSuchBucket), errc::transport_failure names the
// operation, s3://BUCKET/KEY, the endpoint, the HTTP status and S3's error code and message.
// Credentials never appear in a message, a URL or a log.
//
// Thread-safe: any number of threads may call any member at once (each request takes its own
// libcurl handle from a pool; the manifest cache is locked).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dcr/codec/item.hpp"
#include "dcr/detail/s3_client.hpp"
#include "dcr/detail/s3_xml.hpp"
#include "dcr/error.hpp"
#include "dcr/protocol/payload_store.hpp"

namespace dcr {

/// AWS credentials. Never printed: no member of dcr formats them into any text.
struct s3_credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  ///< temporary credentials only; sent as x-amz-security-token

  /// From AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and (optional) AWS_SESSION_TOKEN. Throws
  /// errc::invalid_argument naming the variable that is unset or empty (never a value).
  static s3_credentials from_environment() {
    s3_credentials c;
    const auto need = [](const char* name) {
      const char* v = std::getenv(name);
      DCR_EXPECTS(v != nullptr && *v != '\0', errc::invalid_argument,
                  std::string("S3 credentials: ") + name + " is not set");
      return std::string(v);
    };
    c.access_key_id = need("AWS_ACCESS_KEY_ID");
    c.secret_access_key = need("AWS_SECRET_ACCESS_KEY");
    if (const char* t = std::getenv("AWS_SESSION_TOKEN")) c.session_token = t;
    return c;
  }
};

/// The region from AWS_REGION, else AWS_DEFAULT_REGION, else "us-east-1".
inline std::string s3_region_from_environment() {
  for (const char* name : {"AWS_REGION", "AWS_DEFAULT_REGION"})
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return v;
  return "us-east-1";
}

/// How the bucket is named in a request.
enum class s3_addressing {
  path,          ///< ENDPOINT/BUCKET/KEY (S3-compatible servers; any endpoint)
  virtual_host,  ///< BUCKET.ENDPOINT-HOST/KEY (AWS's default; needs a host name, not an IP)
};

/// What x-amz-content-sha256 carries (see the file comment).
enum class s3_payload_hash {
  sha256,            ///< the body's SHA-256: the signature covers the bytes
  unsigned_payload,  ///< UNSIGNED-PAYLOAD: for https, where TLS protects the body
};

/// A bucket and a key prefix, as parse_s3_url reads them.
struct s3_location {
  std::string bucket;
  std::string prefix;  ///< "" or ending in '/'
};

/// Reads `s3://BUCKET[/PREFIX]`. BUCKET follows S3's naming rules (3 to 63 characters of
/// a-z, 0-9, '.' and '-', starting and ending with a letter or digit); PREFIX loses leading
/// and gains one trailing '/' ("s3://b/runs/x" -> prefix "runs/x/"), and may not hold empty
/// segments ("a//b"), "." or ".." segments or control characters. Throws errc::invalid_argument
/// naming the URL and what is wrong.
inline s3_location parse_s3_url(std::string_view url) {
  const auto bad = [&](const std::string& why) -> s3_location {
    throw error(errc::invalid_argument,
                "S3 URL '" + std::string(url) + "': " + why + " (expected s3://BUCKET[/PREFIX])");
  };
  if (!url.starts_with("s3://")) return bad("not an s3:// URL");
  std::string_view rest = url.substr(5);
  const auto slash = rest.find('/');
  const std::string_view bucket = rest.substr(0, slash);
  if (bucket.size() < 3 || bucket.size() > 63) return bad("the bucket name must have 3 to 63 characters");
  const auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!std::all_of(bucket.begin(), bucket.end(), [&](char c) { return alnum(c) || c == '.' || c == '-'; }) ||
      !alnum(bucket.front()) || !alnum(bucket.back()))
    return bad("bad bucket name '" + std::string(bucket) + "' (a-z, 0-9, '.', '-')");
  s3_location out{std::string(bucket), {}};
  if (slash == std::string_view::npos) return out;
  std::string_view prefix = rest.substr(slash + 1);
  while (prefix.ends_with('/')) prefix.remove_suffix(1);
  if (prefix.empty()) return out;
  for (std::size_t at = 0; at <= prefix.size();) {
    const auto end = std::min(prefix.find('/', at), prefix.size());
    const auto segment = prefix.substr(at, end - at);
    if (segment.empty()) return bad("empty segment in the prefix");
    if (segment == "." || segment == "..") return bad("'" + std::string(segment) + "' segment in the prefix");
    at = end + 1;
  }
  if (std::any_of(prefix.begin(), prefix.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    return bad("control character in the prefix");
  out.prefix = std::string(prefix) + "/";
  return out;
}

/// How an s3_payload_store reaches its bucket.
struct s3_options {
  /// http:// or https:// URL of the S3 service (scheme, host, optional port; no path, no
  /// user:password@). Empty: https://s3.REGION.amazonaws.com.
  std::string endpoint;
  std::string bucket;
  std::string prefix;  ///< key prefix ("" or ending in '/'; parse_s3_url gives one)
  std::string region = "us-east-1";
  s3_addressing addressing = s3_addressing::path;
  s3_credentials credentials;
  /// Payloads larger than this go up as a multipart upload, in parts of part_size bytes (the
  /// last one shorter). AWS requires parts of at least 5 MiB (except the last) and at most
  /// 10,000 parts: part_size grows to fit a payload into 10,000.
  std::size_t multipart_threshold = std::size_t{64} << 20;
  std::size_t part_size = std::size_t{16} << 20;
  int max_retries = 5;  ///< further tries of a retryable failure
  std::chrono::milliseconds backoff_initial{100};  ///< first wait; doubles per retry
  std::chrono::milliseconds backoff_max{5000};
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds request_timeout{0};  ///< whole request; 0: none (see stall_timeout)
  std::chrono::seconds stall_timeout{30};  ///< a transfer below 1 byte/s this long fails
  std::size_t list_page_size = 1000;  ///< ListObjectsV2 max-keys (S3's own maximum is 1000)
  std::size_t parallel_deletes = 8;   ///< DELETE requests in flight in erase_through
  bool conditional_writes = true;     ///< If-None-Match: * on payload puts (see the file comment)
  s3_payload_hash payload_hash = s3_payload_hash::sha256;

  /// Options for `url` (s3://BUCKET[/PREFIX]) at `endpoint` ("" for AWS), with credentials
  /// and region from the environment (s3_credentials::from_environment,
  /// s3_region_from_environment). Path-style addressing when an endpoint is given, virtual-host
  /// style for AWS.
  static s3_options from_environment(std::string_view url, std::string endpoint = {}) {
    s3_options o;
    const auto loc = parse_s3_url(url);
    o.bucket = loc.bucket;
    o.prefix = loc.prefix;
    o.addressing = endpoint.empty() ? s3_addressing::virtual_host : s3_addressing::path;
    o.endpoint = std::move(endpoint);
    o.region = s3_region_from_environment();
    o.credentials = s3_credentials::from_environment();
    return o;
  }
};

/// What an s3_payload_store did since construction.
struct s3_store_stats {
  std::uint64_t objects_put = 0;        ///< payload objects written (not no-op re-puts)
  std::uint64_t bytes_put = 0;          ///< their bytes
  std::uint64_t multipart_uploads = 0;  ///< of them, written in parts
  std::uint64_t objects_got = 0;        ///< payload gets that found the object
  std::uint64_t bytes_got = 0;
  std::uint64_t list_requests = 0;      ///< ListObjectsV2 pages requested
  std::uint64_t objects_deleted = 0;
};

class s3_payload_store {
 public:
  using payload_store_concept = payload_store_tag;

  /// A store in `options.bucket` under `options.prefix`. Sends nothing yet (check_access()
  /// does). Throws errc::invalid_argument for an endpoint that is not an http(s) URL, holds
  /// credentials or a path, virtual-host addressing of an IP endpoint, a prefix that does not
  /// end in '/', missing credentials, or a zero part size or page size.
  explicit s3_payload_store(s3_options options) : options_(std::move(options)), client_(config_of(options_)) {}

  s3_payload_store(const s3_payload_store&) = delete;
  s3_payload_store& operator=(const s3_payload_store&) = delete;

  [[nodiscard]] const std::string& bucket() const noexcept { return options_.bucket; }
  [[nodiscard]] const std::string& prefix() const noexcept { return options_.prefix; }
  /// "s3://BUCKET/PREFIX".
  [[nodiscard]] std::string url() const { return "s3://" + options_.bucket + "/" + options_.prefix; }

  /// One ListObjectsV2 of the prefix (one key at most): throws errc::transport_failure as any
  /// request would when the endpoint, the bucket or the credentials are wrong (a wrong secret:
  /// HTTP 403 SignatureDoesNotMatch), before anything is written.
  void check_access() const {
    auto q = list_query(options_.prefix, "", 1);
    list_page(q, options_.prefix);
  }

  void put(const payload_id& id, std::span<const std::byte> bytes) {
    const std::string key = payload_key(id);
    if (!options_.conditional_writes && exists(key)) return require_equal(key, bytes);
    const bool created = bytes.size() > options_.multipart_threshold ? put_multipart(key, bytes)
                                                                     : put_single(key, bytes);
    if (!created) return require_equal(key, bytes);
    ++stats_.objects_put;
    stats_.bytes_put += bytes.size();
  }

  void put_manifest(const attempt_key& key, std::uint32_t owner, std::span<const payload_id> ids) {
    const std::string object = owner_prefix(key, owner) + "manifest";
    std::vector<std::uint32_t> present;
    if (!ids.empty())
      for (const auto& entry : list_all(owner_prefix(key, owner)))
        if (const auto p = parse_owner_entry(entry.key.substr(attempt_prefix(key).size())); p && !p->manifest)
          present.push_back(p->sequence);
    std::sort(present.begin(), present.end());
    for (const auto& id : ids)
      DCR_EXPECTS(id.attempt == key && id.owner == owner &&
                      std::binary_search(present.begin(), present.end(), id.sequence),
                  errc::transport_failure,
                  "s3_payload_store: manifest " + client_.where(object) +
                      " lists a payload that was not put for its attempt");
    const std::string text = detail::manifest_text(ids);
    client_.call(put_request(object, std::as_bytes(std::span(text)), false));
  }

  std::vector<owner_listing> list(const attempt_key& key) const {
    const std::string prefix = attempt_prefix(key);
    std::map<std::uint32_t, owner_listing> by_owner;
    std::map<std::uint32_t, std::string> manifest_etags;
    for (const auto& entry : list_all(prefix)) {
      const auto p = parse_owner_entry(std::string_view(entry.key).substr(prefix.size()));
      if (!p) continue;
      auto& l = by_owner[p->owner];
      l.owner = p->owner;
      if (p->manifest) {
        manifest_etags[p->owner] = entry.etag;
      } else {
        l.ids.push_back(payload_id{key, p->owner, p->sequence});
      }
    }
    for (const auto& [owner, etag] : manifest_etags)
      if (auto ids = read_manifest(key, owner, etag)) by_owner[owner] = {owner, std::move(*ids), true};
    std::vector<owner_listing> out;
    for (auto& [owner, l] : by_owner) {
      std::sort(l.ids.begin(), l.ids.end());
      out.push_back(std::move(l));
    }
    return out;
  }

  get_status get(const payload_id& id, std::vector<std::byte>& out) const {
    detail::s3::request r;
    r.method = "GET";
    r.key = payload_key(id);
    r.into = &out;
    const auto resp = client_.call(r, {404});
    if (missing(resp, r)) {
      out.clear();
      return get_status::absent;
    }
    ++stats_.objects_got;
    stats_.bytes_got += out.size();
    return get_status::found;
  }

  void erase_through(std::uint64_t version) {
    std::vector<std::string> doomed;  // attempt prefixes
    std::string token;
    do {
      auto q = list_query(options_.prefix, token, options_.list_page_size);
      q.emplace_back("delimiter", "/");
      const auto page = list_page(q, options_.prefix);
      for (const auto& p : page.common_prefixes) {
        const auto key = attempt_directory(std::string_view(p).substr(options_.prefix.size()));
        if (key && key->target_version <= version) doomed.push_back(p);
      }
      token = page.next_token;
    } while (!token.empty());
    abort_uploads_through(version);
    for (const auto& t : doomed) {
      std::vector<std::string> keys;
      for (auto& entry : list_all(t)) keys.push_back(std::move(entry.key));
      // Manifests first: a listing that races the erase never sees a complete owner whose
      // payloads are already gone.
      std::stable_partition(keys.begin(), keys.end(), [](const std::string& k) { return k.ends_with("/manifest"); });
      delete_all(keys);
    }
    std::lock_guard lock(cache_mutex_);
    std::erase_if(manifest_cache_, [&](const auto& kv) { return kv.first.first.target_version <= version; });
  }

  /// What this store did since construction.
  [[nodiscard]] s3_store_stats stats() const {
    s3_store_stats s;
    s.objects_put = stats_.objects_put.load();
    s.bytes_put = stats_.bytes_put.load();
    s.multipart_uploads = stats_.multipart_uploads.load();
    s.objects_got = stats_.objects_got.load();
    s.bytes_got = stats_.bytes_got.load();
    s.list_requests = stats_.list_requests.load();
    s.objects_deleted = stats_.objects_deleted.load();
    return s;
  }

  /// The key of payload `id`'s object (for other clients and tests).
  [[nodiscard]] std::string payload_key(const payload_id& id) const {
    return owner_prefix(id.attempt, id.owner) + "p" + std::to_string(id.sequence);
  }
  /// The key of `owner`'s manifest object for `key`.
  [[nodiscard]] std::string manifest_key(const attempt_key& key, std::uint32_t owner) const {
    return owner_prefix(key, owner) + "manifest";
  }

 private:
  struct listed_object {
    std::string key;
    std::string etag;
  };
  struct list_result {
    std::vector<listed_object> objects;
    std::vector<std::string> common_prefixes;
    std::string next_token;  ///< "" on the last page
  };
  struct owner_entry {
    std::uint32_t owner = 0;
    bool manifest = false;
    std::uint32_t sequence = 0;
  };
  struct counters {
    std::atomic<std::uint64_t> objects_put{0}, bytes_put{0}, multipart_uploads{0}, objects_got{0},
        bytes_got{0}, list_requests{0}, objects_deleted{0};
  };

  static detail::s3::client_config config_of(const s3_options& o) {
    detail::s3::client_config c;
    const auto bad = [&](const std::string& why) -> detail::s3::client_config {
      throw error(errc::invalid_argument, "s3_payload_store: " + why);
    };
    std::string endpoint = o.endpoint.empty() ? "https://s3." + o.region + ".amazonaws.com" : o.endpoint;
    while (endpoint.ends_with('/')) endpoint.pop_back();
    const auto scheme_end = endpoint.find("://");
    if (scheme_end == std::string::npos) return bad("endpoint '" + endpoint + "' is not an http:// or https:// URL");
    c.scheme = endpoint.substr(0, scheme_end);
    c.authority = endpoint.substr(scheme_end + 3);
    if (c.scheme != "http" && c.scheme != "https")
      return bad("endpoint '" + endpoint + "' is not an http:// or https:// URL");
    if (c.authority.find('@') != std::string::npos)
      return bad("the endpoint must not hold credentials (give them as s3_options::credentials)");
    if (c.authority.empty() || c.authority.find_first_of("/?#") != std::string::npos)
      return bad("endpoint '" + endpoint + "' must be scheme://host[:port], without a path");
    if (o.bucket.empty()) return bad("no bucket");
    if (!o.prefix.empty() && !o.prefix.ends_with('/')) return bad("prefix '" + o.prefix + "' must end in '/'");
    if (o.part_size == 0 || o.list_page_size == 0 || o.parallel_deletes == 0 || o.max_retries < 0)
      return bad("part_size, list_page_size and parallel_deletes must be > 0, max_retries >= 0");
    if (o.credentials.access_key_id.empty() || o.credentials.secret_access_key.empty())
      return bad("no credentials (an access key id and a secret access key)");
    c.bucket = o.bucket;
    c.virtual_host = o.addressing == s3_addressing::virtual_host;
    if (c.virtual_host) {
      const std::string host = c.authority.substr(0, c.authority.rfind(':') == std::string::npos ||
                                                             c.authority.front() == '['
                                                         ? c.authority.size()
                                                         : c.authority.rfind(':'));
      const bool ip = host.front() == '[' || std::all_of(host.begin(), host.end(), [](char ch) {
                        return (ch >= '0' && ch <= '9') || ch == '.';
                      });
      if (ip) return bad("virtual-host addressing needs a host name in the endpoint, not '" + host + "'");
    }
    c.region = o.region;
    c.access_key_id = o.credentials.access_key_id;
    c.secret_access_key = o.credentials.secret_access_key;
    c.session_token = o.credentials.session_token;
    c.sign_payload = o.payload_hash == s3_payload_hash::sha256;
    c.connect_timeout_ms = static_cast<long>(o.connect_timeout.count());
    c.request_timeout_ms = static_cast<long>(o.request_timeout.count());
    c.stall_timeout_s = static_cast<long>(o.stall_timeout.count());
    c.max_retries = o.max_retries;
    c.backoff_initial = o.backoff_initial;
    c.backoff_max = o.backoff_max;
    return c;
  }

  // ---- keys

  [[nodiscard]] std::string attempt_prefix(const attempt_key& key) const {
    return options_.prefix + to_string(key) + "/";
  }
  [[nodiscard]] std::string owner_prefix(const attempt_key& key, std::uint32_t owner) const {
    return attempt_prefix(key) + "o" + std::to_string(owner) + "/";
  }

  // "o<owner>/p<sequence>" or "o<owner>/manifest" (relative to the attempt's prefix).
  static std::optional<owner_entry> parse_owner_entry(std::string_view rest) {
    const auto owner = detail::take_number(rest, "o", UINT32_MAX);
    if (!owner || !rest.starts_with('/')) return std::nullopt;
    rest.remove_prefix(1);
    if (rest == "manifest") return owner_entry{static_cast<std::uint32_t>(*owner), true, 0};
    const auto seq = detail::take_number(rest, "p", UINT32_MAX);
    if (!seq || !rest.empty()) return std::nullopt;
    return owner_entry{static_cast<std::uint32_t>(*owner), false, static_cast<std::uint32_t>(*seq)};
  }
  // "<attempt>/" (relative to the store's prefix): the attempt.
  static std::optional<attempt_key> attempt_directory(std::string_view rest) {
    if (!rest.ends_with('/')) return std::nullopt;
    return parse_attempt_key(rest.substr(0, rest.size() - 1));
  }

  // ---- requests

  detail::s3::request put_request(const std::string& key, std::span<const std::byte> body,
                                  bool if_none_match) const {
    detail::s3::request r;
    r.method = "PUT";
    r.key = key;
    r.body = body;
    r.headers.push_back("Content-Type: application/octet-stream");
    if (if_none_match) r.headers.push_back("If-None-Match: *");
    return r;
  }

  // True if the object was written, false if S3 refused because it exists (412).
  bool put_single(const std::string& key, std::span<const std::byte> bytes) {
    const auto resp = client_.call(put_request(key, bytes, options_.conditional_writes), {412});
    return resp.status != 412;
  }

  // A multipart upload, aborted if anything fails. True if written, false if it exists.
  bool put_multipart(const std::string& key, std::span<const std::byte> bytes) {
    // An existing object is found before any part goes up (a retry after a lost reply).
    if (options_.conditional_writes && exists(key)) return false;
    detail::s3::request init;
    init.method = "POST";
    init.key = key;
    init.query = {{"uploads", ""}};
    init.headers.push_back("Content-Type: application/octet-stream");
    const auto started = client_.call(init);
    std::string upload_id;
    try {
      upload_id = detail::s3::first_text(started.text, "UploadId").value_or("");
    } catch (const std::invalid_argument& e) {
      throw error(errc::transport_failure, "S3 POST " + client_.where(key) +
                                               "?uploads: unreadable InitiateMultipartUpload reply: " + e.what());
    }
    DCR_EXPECTS(!upload_id.empty(), errc::transport_failure,
                "S3 POST " + client_.where(key) + "?uploads: no UploadId in the reply");
    try {
      std::size_t part = options_.part_size;
      const std::size_t max_parts = 10000;
      if ((bytes.size() + part - 1) / part > max_parts) part = (bytes.size() + max_parts - 1) / max_parts;
      std::string complete = "<CompleteMultipartUpload>";
      std::size_t number = 1;
      for (std::size_t at = 0; at < bytes.size(); at += part, ++number) {
        detail::s3::request r;
        r.method = "PUT";
        r.key = key;
        r.query = {{"partNumber", std::to_string(number)}, {"uploadId", upload_id}};
        r.body = bytes.subspan(at, std::min(part, bytes.size() - at));
        const auto resp = client_.call(r);
        DCR_EXPECTS(!resp.etag.empty(), errc::transport_failure,
                    "S3 PUT " + client_.where(key) + " part " + std::to_string(number) + ": no ETag in the reply");
        complete += "<Part><PartNumber>" + std::to_string(number) + "</PartNumber><ETag>" +
                    detail::s3::escape(resp.etag) + "</ETag></Part>";
      }
      complete += "</CompleteMultipartUpload>";
      detail::s3::request done;
      done.method = "POST";
      done.key = key;
      done.query = {{"uploadId", upload_id}};
      done.body = std::as_bytes(std::span(complete));
      done.headers.push_back("Content-Type: application/xml");
      if (options_.conditional_writes) done.headers.push_back("If-None-Match: *");
      // 404 NoSuchUpload after a retry: an earlier try completed it (its reply was lost); 412:
      // the object appeared meanwhile. Either way the bytes there decide (require_equal).
      const auto resp = client_.call(done, {404, 412});
      if (resp.status == 404 && resp.attempts == 1) {
        throw error(errc::transport_failure, "S3 POST " + client_.where(key) +
                                                 " (complete multipart upload): HTTP 404 " + resp.error_code +
                                                 ": " + resp.error_message);
      }
      if (resp.status == 412 || resp.status == 404) {
        abort_upload(key, upload_id);
        return false;
      }
    } catch (...) {
      abort_upload(key, upload_id);
      throw;
    }
    ++stats_.multipart_uploads;
    return true;
  }

  void abort_upload(const std::string& key, const std::string& upload_id) noexcept {
    try {
      detail::s3::request r;
      r.method = "DELETE";
      r.key = key;
      r.query = {{"uploadId", upload_id}};
      client_.call(r, {404});
    } catch (const std::exception&) {
      // best effort: erase_through aborts what is left under erased transitions
    }
  }

  // Aborts the incomplete multipart uploads of transitions whose target is <= `version` (an
  // upload in progress has no object yet, so the listing of objects does not find it).
  void abort_uploads_through(std::uint64_t version) {
    std::string key_marker, upload_marker;
    for (;;) {
      detail::s3::request r;
      r.method = "GET";
      r.subject = options_.prefix + " (ListMultipartUploads)";
      r.query = {{"uploads", ""}, {"prefix", options_.prefix}};
      if (!key_marker.empty()) r.query.emplace_back("key-marker", key_marker);
      if (!upload_marker.empty()) r.query.emplace_back("upload-id-marker", upload_marker);
      const auto resp = client_.call(r);
      std::vector<std::pair<std::string, std::string>> uploads;
      bool truncated = false;
      try {
        for (const auto upload : detail::s3::elements(resp.text, "Upload"))
          uploads.emplace_back(detail::s3::first_text(upload, "Key").value_or(""),
                               detail::s3::first_text(upload, "UploadId").value_or(""));
        truncated = detail::s3::first_text(resp.text, "IsTruncated").value_or("false") == "true";
        key_marker = detail::s3::first_text(resp.text, "NextKeyMarker").value_or("");
        upload_marker = detail::s3::first_text(resp.text, "NextUploadIdMarker").value_or("");
      } catch (const std::invalid_argument& e) {
        throw error(errc::transport_failure, "S3 GET " + client_.where(r.subject) + ": unreadable reply: " + e.what());
      }
      for (const auto& [key, id] : uploads) {
        if (!key.starts_with(options_.prefix) || id.empty()) continue;
        const std::string_view rest = std::string_view(key).substr(options_.prefix.size());
        const auto slash = rest.find('/');
        if (slash == std::string_view::npos) continue;
        const auto attempt = attempt_directory(rest.substr(0, slash + 1));
        if (attempt && attempt->target_version <= version) abort_upload(key, id);
      }
      if (!truncated || (key_marker.empty() && upload_marker.empty())) return;
    }
  }

  // Whether a GET answered that the object is not there: 404 NoSuchKey. A 404 for the bucket
  // (NoSuchBucket) is no absent payload but a wrong bucket: it throws.
  bool missing(const detail::s3::response& resp, const detail::s3::request& r) const {
    if (resp.status != 404) return false;
    DCR_EXPECTS(resp.error_code != "NoSuchBucket", errc::transport_failure,
                "S3 " + std::string(r.method) + " " + client_.where(r.key) + ": HTTP 404 NoSuchBucket: " +
                    resp.error_message);
    return true;
  }

  [[nodiscard]] bool exists(const std::string& key) const {
    detail::s3::request r;
    r.method = "HEAD";
    r.key = key;
    return client_.call(r, {404}).status != 404;
  }

  // The object at `key` exists: its bytes must be `bytes`.
  void require_equal(const std::string& key, std::span<const std::byte> bytes) const {
    std::vector<std::byte> have;
    detail::s3::request r;
    r.method = "GET";
    r.key = key;
    r.into = &have;
    const auto resp = client_.call(r, {404});
    DCR_EXPECTS(!missing(resp, r), errc::transport_failure,
                "s3_payload_store: " + client_.where(key) + " vanished while put again (erased meanwhile?)");
    DCR_EXPECTS(std::equal(bytes.begin(), bytes.end(), have.begin(), have.end()), errc::transport_failure,
                "s3_payload_store: " + client_.where(key) + " put again with other bytes");
  }

  [[nodiscard]] std::vector<std::pair<std::string, std::string>> list_query(const std::string& prefix,
                                                                            const std::string& token,
                                                                            std::size_t max_keys) const {
    std::vector<std::pair<std::string, std::string>> q{
        {"list-type", "2"}, {"prefix", prefix}, {"max-keys", std::to_string(max_keys)}};
    if (!token.empty()) q.emplace_back("continuation-token", token);
    return q;
  }

  list_result list_page(const std::vector<std::pair<std::string, std::string>>& query,
                        const std::string& prefix) const {
    detail::s3::request r;
    r.method = "GET";
    r.subject = prefix + " (ListObjectsV2)";
    r.query = query;
    const auto resp = client_.call(r);
    ++stats_.list_requests;
    list_result out;
    try {
      for (const auto c : detail::s3::elements(resp.text, "Contents"))
        out.objects.push_back({detail::s3::first_text(c, "Key").value_or(""),
                               detail::s3::first_text(c, "ETag").value_or("")});
      for (const auto c : detail::s3::elements(resp.text, "CommonPrefixes"))
        out.common_prefixes.push_back(detail::s3::first_text(c, "Prefix").value_or(""));
      if (detail::s3::first_text(resp.text, "IsTruncated").value_or("false") == "true") {
        out.next_token = detail::s3::first_text(resp.text, "NextContinuationToken").value_or("");
        if (out.next_token.empty()) throw std::invalid_argument("truncated without a NextContinuationToken");
      }
    } catch (const std::invalid_argument& e) {
      throw error(errc::transport_failure, "S3 GET " + client_.where(r.subject) + ": unreadable reply: " + e.what());
    }
    for (const auto& o : out.objects)
      DCR_EXPECTS(o.key.starts_with(prefix), errc::transport_failure,
                  "S3 GET " + client_.where(r.subject) + ": the reply lists '" + o.key + "', outside the prefix");
    return out;
  }

  std::vector<listed_object> list_all(const std::string& prefix) const {
    std::vector<listed_object> out;
    std::string token;
    do {
      auto page = list_page(list_query(prefix, token, options_.list_page_size), prefix);
      for (auto& o : page.objects) out.push_back(std::move(o));
      token = std::move(page.next_token);
    } while (!token.empty());
    return out;
  }

  // The manifest's ids (nullopt if it vanished since the listing), read once per ETag.
  std::optional<std::vector<payload_id>> read_manifest(const attempt_key& key, std::uint32_t owner,
                                                       const std::string& etag) const {
    const auto cache_key = std::make_pair(key, owner);
    {
      std::lock_guard lock(cache_mutex_);
      if (auto it = manifest_cache_.find(cache_key); it != manifest_cache_.end() && !etag.empty() &&
                                                      it->second.first == etag)
        return it->second.second;
    }
    std::vector<std::byte> raw;
    detail::s3::request r;
    r.method = "GET";
    r.key = manifest_key(key, owner);
    r.into = &raw;
    const auto resp = client_.call(r, {404});
    if (missing(resp, r)) return std::nullopt;
    auto ids = detail::parse_manifest(std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()),
                                      key, owner, "s3_payload_store: manifest " + client_.where(r.key));
    // The ETag of what was read (the listing's may be older than a replaced manifest).
    const std::string& read_etag = resp.etag.empty() ? etag : resp.etag;
    std::lock_guard lock(cache_mutex_);
    if (manifest_cache_.size() >= 4096) manifest_cache_.clear();
    if (!read_etag.empty()) manifest_cache_[cache_key] = {read_etag, ids};
    return ids;
  }

  // DELETE every key, parallel_deletes at a time; the first failure is rethrown after all ran.
  void delete_all(const std::vector<std::string>& keys) {
    std::atomic<std::size_t> next{0};
    std::mutex failure_mutex;
    std::exception_ptr failure;
    auto work = [&] {
      for (std::size_t i = next++; i < keys.size(); i = next++) {
        try {
          detail::s3::request r;
          r.method = "DELETE";
          r.key = keys[i];
          client_.call(r, {404});
          ++stats_.objects_deleted;
        } catch (...) {
          std::lock_guard lock(failure_mutex);
          if (!failure) failure = std::current_exception();
        }
      }
    };
    const std::size_t threads = std::min(options_.parallel_deletes, keys.size());
    std::vector<std::thread> pool;
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    if (failure) std::rethrow_exception(failure);
  }

  s3_options options_;
  mutable detail::s3::client client_;
  mutable counters stats_;
  mutable std::mutex cache_mutex_;
  mutable std::map<std::pair<attempt_key, std::uint32_t>, std::pair<std::string, std::vector<payload_id>>>
      manifest_cache_;
};

static_assert(payload_store<s3_payload_store>);

}  // namespace dcr
