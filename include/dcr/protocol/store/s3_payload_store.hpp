// dcr/protocol/store/s3_payload_store.hpp: a payload store (dcr/protocol/payload_store.hpp) in an S3
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
//     does) with each payload's size from that listing.
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
// Signing: libcurl's SigV4 (dcr/detail/protocol/store/s3_client.hpp says what dcr adds to it). Bodies are
// hashed (SHA-256 by OpenSSL, about 1.8 GB/s per core here) by default so that the signature
// covers the payload bytes: over plain http a body altered or cut short on the way is refused
// by a server that checks the hash (AWS does; SeaweedFS does not), and the one pass costs less
// than compressing the payload did. s3_payload_hash::unsigned_payload sends UNSIGNED-PAYLOAD
// instead, for https endpoints, where TLS protects the body already. Either way the payload's
// own checksum, checked by the receiver, stays the end-to-end integrity check.
//
// Bounds: every request is cut after request_timeout (120 s by default), after connect_timeout
// without a connection, and when it moves fewer than min_rate bytes/s (1 KiB/s) for
// stall_timeout (30 s), so a trickling or frozen server costs a bounded time. A response body
// larger than max_object_size (8 GiB), or than get_control::max_bytes, is refused at its
// Content-Length or as soon as it grows past the cap, and never retried. get(id, out, control)
// ends at once (within about a second) when the control's flag is set or its deadline passes,
// also while waiting between retries; the payload sources use it to cancel the gets of an
// attempt the receiver left (a fence, a deadline). The manifests record each payload's size
// and the payload sources pass it as the cap of every get of a payload its owner's manifest
// lists, and refuse a body of any other length (get_listed in dcr/protocol/payload_source.hpp);
// the payload's checksum, checked by the receiver (and by fanout_store before it shares a
// copy), catches a body altered to the same length.
//
// https: the endpoint https://... is verified against the system's CAs, or against
// s3_options::ca_file (from AWS_CA_BUNDLE in from_environment).
//
// Failures: 5xx, 429, 503 SlowDown, 400 RequestTimeout and transport errors (refused, reset,
// timed out, stalled below min_rate for stall_timeout) are retried max_retries times with
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
#include <climits>
#include <cstdint>
#include <cstdio>
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
#include "dcr/config.hpp"
#include "dcr/detail/protocol/store/s3_client.hpp"
#include "dcr/detail/protocol/store/s3_xml.hpp"
#include "dcr/error.hpp"
#include "dcr/protocol/payload_source.hpp"
#include "dcr/protocol/payload_store.hpp"

namespace dcr {

/// AWS credentials. Never printed: no member of dcr formats them into any text.
struct s3_credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  ///< temporary credentials only; sent as x-amz-security-token

  /// The standard sources, in the AWS CLI's order: AWS_ACCESS_KEY_ID and
  /// AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN if set) when AWS_ACCESS_KEY_ID is set; else
  /// the profile AWS_PROFILE (default "default") of the shared credentials file
  /// AWS_SHARED_CREDENTIALS_FILE (default ~/.aws/credentials), read by from_profile. Throws
  /// errc::invalid_argument naming the variable, file or profile that is missing or incomplete
  /// (never a value).
  static s3_credentials from_environment();

  /// Profile `profile` of the INI file `path` (aws_access_key_id, aws_secret_access_key,
  /// optional aws_session_token; '#' and ';' comments; other keys ignored). Throws
  /// errc::invalid_argument naming the file and profile when the file cannot be read, the
  /// profile is absent, or a key is missing.
  static s3_credentials from_profile(const std::string& path, const std::string& profile);
};

/// The region from AWS_REGION, else AWS_DEFAULT_REGION, else "us-east-1".
std::string s3_region_from_environment();

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
s3_location parse_s3_url(std::string_view url);

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
  /// Whole request (one try), > 0. Raise it for single payloads that take longer to move.
  std::chrono::milliseconds request_timeout{120000};
  std::chrono::seconds stall_timeout{30};  ///< a transfer below min_rate this long fails, > 0
  std::uint64_t min_rate = 1024;           ///< bytes/s, >= 1 (see stall_timeout)
  /// A response body (a payload, a listing) larger than this is refused, > 0.
  std::uint64_t max_object_size = std::uint64_t{8} << 30;
  /// PEM bundle of the CAs an https endpoint is verified against; "": the system's.
  std::string ca_file;
  std::size_t list_page_size = 1000;  ///< ListObjectsV2 max-keys (S3's own maximum is 1000)
  std::size_t parallel_deletes = 8;   ///< DELETE requests in flight in erase_through
  bool conditional_writes = true;     ///< If-None-Match: * on payload puts (see the file comment)
  s3_payload_hash payload_hash = s3_payload_hash::sha256;

  /// Options for `url` (s3://BUCKET[/PREFIX]) at `endpoint` ("" for AWS), with credentials
  /// and region from the environment (s3_credentials::from_environment,
  /// s3_region_from_environment) and ca_file from AWS_CA_BUNDLE. Path-style addressing when an
  /// endpoint is given, virtual-host style for AWS.
  static s3_options from_environment(std::string_view url, std::string endpoint = {});
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
  /// end in '/', missing credentials, a zero part size or page size, non-positive timeouts,
  /// min_rate or max_object_size, or a ca_file that cannot be read.
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
  void check_access() const;

  void put(const payload_id& id, std::span<const std::byte> bytes);

  void put_manifest(const attempt_key& key, std::uint32_t owner, std::span<const payload_id> ids);

  std::vector<owner_listing> list(const attempt_key& key) const;

  get_status get(const payload_id& id, std::vector<std::byte>& out) const {
    return get(id, out, get_control{});
  }

  /// get, ended early by `control` (its flag, its deadline) and capped at control.max_bytes
  /// (when not 0) as the file comment says. control.fresh changes nothing (no cache here).
  get_status get(const payload_id& id, std::vector<std::byte>& out, const get_control& control) const;

  void erase_through(std::uint64_t version);

  /// What this store did since construction.
  [[nodiscard]] s3_store_stats stats() const;

  /// The key of payload `id`'s object (for other clients and tests).
  [[nodiscard]] std::string payload_key(const payload_id& id) const;
  /// The key of `owner`'s manifest object for `key`.
  [[nodiscard]] std::string manifest_key(const attempt_key& key, std::uint32_t owner) const;

 private:
  struct listed_object {
    std::string key;
    std::string etag;
    std::uint64_t size = 0;
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

  static detail::s3::client_config config_of(const s3_options& o);

  // ---- keys

  [[nodiscard]] std::string attempt_prefix(const attempt_key& key) const;
  [[nodiscard]] std::string owner_prefix(const attempt_key& key, std::uint32_t owner) const;

  // "o<owner>/p<sequence>" or "o<owner>/manifest" (relative to the attempt's prefix).
  static std::optional<owner_entry> parse_owner_entry(std::string_view rest);
  // "<attempt>/" (relative to the store's prefix): the attempt.
  static std::optional<attempt_key> attempt_directory(std::string_view rest);

  // ---- requests

  detail::s3::request put_request(const std::string& key, std::span<const std::byte> body,
                                  bool if_none_match) const;

  // True if the object was written, false if S3 refused because it exists (412).
  bool put_single(const std::string& key, std::span<const std::byte> bytes);

  // A multipart upload, aborted if anything fails. True if written, false if it exists.
  bool put_multipart(const std::string& key, std::span<const std::byte> bytes);

  void abort_upload(const std::string& key, const std::string& upload_id) noexcept;

  // Aborts the incomplete multipart uploads of transitions whose target is <= `version` (an
  // upload in progress has no object yet, so the listing of objects does not find it).
  void abort_uploads_through(std::uint64_t version);

  // Whether a GET answered that the object is not there: 404 NoSuchKey. A 404 for the bucket
  // (NoSuchBucket) is no absent payload but a wrong bucket: it throws.
  bool missing(const detail::s3::response& resp, const detail::s3::request& r) const;

  [[nodiscard]] bool exists(const std::string& key) const;

  // The object at `key` exists: its bytes must be `bytes`.
  void require_equal(const std::string& key, std::span<const std::byte> bytes) const;

  [[nodiscard]] std::vector<std::pair<std::string, std::string>> list_query(const std::string& prefix,
                                                                            const std::string& token,
                                                                            std::size_t max_keys) const;

  list_result list_page(const std::vector<std::pair<std::string, std::string>>& query,
                        const std::string& prefix) const;

  std::vector<listed_object> list_all(const std::string& prefix) const;

  // A listing's <Size>; std::invalid_argument (an unreadable reply) if it is not a number.
  static std::uint64_t object_size(std::string_view text);

  // The manifest's listing (nullopt if it vanished since the listing), read once per ETag.
  std::optional<owner_listing> read_manifest(const attempt_key& key, std::uint32_t owner,
                                                       const std::string& etag) const;

  // DELETE every key, parallel_deletes at a time; the first failure is rethrown after all ran.
  void delete_all(const std::vector<std::string>& keys);

  s3_options options_;
  mutable detail::s3::client client_;
  mutable counters stats_;
  mutable std::mutex cache_mutex_;
  mutable std::map<std::pair<attempt_key, std::uint32_t>, std::pair<std::string, owner_listing>>
      manifest_cache_;
};

static_assert(payload_store<s3_payload_store>);
static_assert(controllable_store<s3_payload_store>);

}  // namespace dcr

#include "dcr/detail/protocol/store/s3_payload_store.inl"
