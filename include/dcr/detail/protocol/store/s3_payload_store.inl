// dcr/detail/protocol/store/s3_payload_store.inl: the bodies of dcr/protocol/store/s3_payload_store.hpp
// (included at its end).
#pragma once

#if DCR_HEADER_BODIES_OF(DCR_PART_NETWORK)

namespace dcr {

DCR_NETWORK_INLINE void s3_payload_store::check_access() const {
  auto q = list_query(options_.prefix, "", 1);
  list_page(q, options_.prefix);
}

DCR_NETWORK_INLINE void s3_payload_store::put(const payload_id& id, std::span<const std::byte> bytes) {
  const std::string key = payload_key(id);
  if (!options_.conditional_writes && exists(key)) return require_equal(key, bytes);
  const bool created = bytes.size() > options_.multipart_threshold ? put_multipart(key, bytes)
                                                                   : put_single(key, bytes);
  if (!created) return require_equal(key, bytes);
  ++stats_.objects_put;
  stats_.bytes_put += bytes.size();
}

DCR_NETWORK_INLINE void s3_payload_store::put_manifest(const attempt_key& key, std::uint32_t owner,
                                           std::span<const payload_id> ids) {
  const std::string object = owner_prefix(key, owner) + "manifest";
  std::map<std::uint32_t, std::uint64_t> present;  // sequence -> the object's size
  if (!ids.empty())
    for (const auto& entry : list_all(owner_prefix(key, owner)))
      if (const auto p = parse_owner_entry(entry.key.substr(attempt_prefix(key).size()));
          p && !p->manifest)
        present[p->sequence] = entry.size;
  std::vector<std::uint64_t> sizes;
  for (const auto& id : ids) {
    const auto it = present.find(id.sequence);
    DCR_EXPECTS(id.attempt == key && id.owner == owner && it != present.end(),
                errc::transport_failure,
                "s3_payload_store: manifest " + client_.where(object) +
                    " lists a payload that was not put for its attempt");
    sizes.push_back(it->second);
  }
  const std::string text = detail::manifest_text(ids, sizes);
  client_.call(put_request(object, std::as_bytes(std::span(text)), false));
}

DCR_NETWORK_INLINE std::vector<owner_listing> s3_payload_store::list(const attempt_key& key) const {
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
    if (auto manifest = read_manifest(key, owner, etag)) by_owner[owner] = std::move(*manifest);
  std::vector<owner_listing> out;
  for (auto& [owner, l] : by_owner) {
    if (!l.complete) std::sort(l.ids.begin(), l.ids.end());  // a manifest's come sorted
    out.push_back(std::move(l));
  }
  return out;
}

DCR_NETWORK_INLINE get_status s3_payload_store::get(const payload_id& id, std::vector<std::byte>& out,
                                        const get_control& control) const {
  detail::s3::request r;
  r.method = "GET";
  r.key = payload_key(id);
  r.into = &out;
  r.max_bytes = control.max_bytes;
  r.cancel = control.cancel;
  r.deadline = control.deadline;
  const auto resp = client_.call(r, {404});
  if (missing(resp, r)) {
    out.clear();
    return get_status::absent;
  }
  ++stats_.objects_got;
  stats_.bytes_got += out.size();
  return get_status::found;
}

DCR_NETWORK_INLINE void s3_payload_store::erase_through(std::uint64_t version) {
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
    std::stable_partition(keys.begin(), keys.end(),
                          [](const std::string& k) { return k.ends_with("/manifest"); });
    delete_all(keys);
  }
  std::lock_guard lock(cache_mutex_);
  std::erase_if(manifest_cache_,
                [&](const auto& kv) { return kv.first.first.target_version <= version; });
}

DCR_NETWORK_INLINE s3_store_stats s3_payload_store::stats() const {
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

DCR_NETWORK_INLINE std::string s3_payload_store::payload_key(const payload_id& id) const {
  return owner_prefix(id.attempt, id.owner) + "p" + std::to_string(id.sequence);
}

DCR_NETWORK_INLINE std::string s3_payload_store::manifest_key(const attempt_key& key,
                                                  std::uint32_t owner) const {
  return owner_prefix(key, owner) + "manifest";
}

DCR_NETWORK_INLINE detail::s3::client_config s3_payload_store::config_of(const s3_options& o) {
  detail::s3::client_config c;
  const auto bad = [&](const std::string& why) -> detail::s3::client_config {
    throw error(errc::invalid_argument, "s3_payload_store: " + why);
  };
  std::string endpoint =
      o.endpoint.empty() ? "https://s3." + o.region + ".amazonaws.com" : o.endpoint;
  while (endpoint.ends_with('/')) endpoint.pop_back();
  const auto scheme_end = endpoint.find("://");
  if (scheme_end == std::string::npos)
    return bad("endpoint '" + endpoint + "' is not an http:// or https:// URL");
  c.scheme = endpoint.substr(0, scheme_end);
  c.authority = endpoint.substr(scheme_end + 3);
  if (c.scheme != "http" && c.scheme != "https")
    return bad("endpoint '" + endpoint + "' is not an http:// or https:// URL");
  if (c.authority.find('@') != std::string::npos)
    return bad("the endpoint must not hold credentials (give them as s3_options::credentials)");
  if (c.authority.empty() || c.authority.find_first_of("/?#") != std::string::npos)
    return bad("endpoint '" + endpoint + "' must be scheme://host[:port], without a path");
  if (o.bucket.empty()) return bad("no bucket");
  if (!o.prefix.empty() && !o.prefix.ends_with('/'))
    return bad("prefix '" + o.prefix + "' must end in '/'");
  if (o.part_size == 0 || o.list_page_size == 0 || o.parallel_deletes == 0 || o.max_retries < 0)
    return bad("part_size, list_page_size and parallel_deletes must be > 0, max_retries >= 0");
  if (o.credentials.access_key_id.empty() || o.credentials.secret_access_key.empty())
    return bad("no credentials (an access key id and a secret access key)");
  if (o.connect_timeout.count() <= 0 || o.request_timeout.count() <= 0 ||
      o.stall_timeout.count() <= 0 || o.min_rate == 0 || o.max_object_size == 0)
    return bad("connect_timeout, request_timeout, stall_timeout, min_rate and max_object_size must be > 0");
  if (!o.ca_file.empty()) {
    std::FILE* f = std::fopen(o.ca_file.c_str(), "rb");
    if (f == nullptr) return bad("cannot read the CA bundle '" + o.ca_file + "'");
    std::fclose(f);
  }
  c.ca_file = o.ca_file;
  c.min_rate = static_cast<long>(std::min<std::uint64_t>(o.min_rate, LONG_MAX));
  c.max_body_bytes = o.max_object_size;
  c.bucket = o.bucket;
  c.virtual_host = o.addressing == s3_addressing::virtual_host;
  if (c.virtual_host) {
    const std::string host = c.authority.substr(
        0, c.authority.rfind(':') == std::string::npos || c.authority.front() == '['
               ? c.authority.size()
               : c.authority.rfind(':'));
    const bool ip = host.front() == '[' || std::all_of(host.begin(), host.end(), [](char ch) {
                      return (ch >= '0' && ch <= '9') || ch == '.';
                    });
    if (ip)
      return bad("virtual-host addressing needs a host name in the endpoint, not '" + host + "'");
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

DCR_NETWORK_INLINE std::string s3_payload_store::attempt_prefix(const attempt_key& key) const {
  return options_.prefix + to_string(key) + "/";
}

DCR_NETWORK_INLINE std::string s3_payload_store::owner_prefix(const attempt_key& key,
                                                  std::uint32_t owner) const {
  return attempt_prefix(key) + "o" + std::to_string(owner) + "/";
}

DCR_NETWORK_INLINE std::optional<s3_payload_store::owner_entry> s3_payload_store::parse_owner_entry(
    std::string_view rest) {
  const auto owner = detail::take_number(rest, "o", UINT32_MAX);
  if (!owner || !rest.starts_with('/')) return std::nullopt;
  rest.remove_prefix(1);
  if (rest == "manifest") return owner_entry{static_cast<std::uint32_t>(*owner), true, 0};
  const auto seq = detail::take_number(rest, "p", UINT32_MAX);
  if (!seq || !rest.empty()) return std::nullopt;
  return owner_entry{static_cast<std::uint32_t>(*owner), false, static_cast<std::uint32_t>(*seq)};
}

DCR_NETWORK_INLINE std::optional<attempt_key> s3_payload_store::attempt_directory(std::string_view rest) {
  if (!rest.ends_with('/')) return std::nullopt;
  return parse_attempt_key(rest.substr(0, rest.size() - 1));
}

DCR_NETWORK_INLINE detail::s3::request s3_payload_store::put_request(const std::string& key,
                                                         std::span<const std::byte> body,
                                                         bool if_none_match) const {
  detail::s3::request r;
  r.method = "PUT";
  r.key = key;
  r.body = body;
  r.headers.push_back("Content-Type: application/octet-stream");
  if (if_none_match) r.headers.push_back("If-None-Match: *");
  return r;
}

DCR_NETWORK_INLINE bool s3_payload_store::put_single(const std::string& key, std::span<const std::byte> bytes) {
  const auto resp = client_.call(put_request(key, bytes, options_.conditional_writes), {412});
  return resp.status != 412;
}

DCR_NETWORK_INLINE bool s3_payload_store::put_multipart(const std::string& key,
                                            std::span<const std::byte> bytes) {
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
    throw error(errc::transport_failure,
                "S3 POST " + client_.where(key) +
                    "?uploads: unreadable InitiateMultipartUpload reply: " + e.what());
  }
  DCR_EXPECTS(!upload_id.empty(), errc::transport_failure,
              "S3 POST " + client_.where(key) + "?uploads: no UploadId in the reply");
  try {
    std::size_t part = options_.part_size;
    const std::size_t max_parts = 10000;
    if ((bytes.size() + part - 1) / part > max_parts)
      part = (bytes.size() + max_parts - 1) / max_parts;
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
                  "S3 PUT " + client_.where(key) + " part " + std::to_string(number) +
                      ": no ETag in the reply");
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
                                               " (complete multipart upload): HTTP 404 " +
                                               resp.error_code + ": " + resp.error_message);
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

DCR_NETWORK_INLINE void s3_payload_store::abort_upload(const std::string& key,
                                           const std::string& upload_id) noexcept {
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

DCR_NETWORK_INLINE void s3_payload_store::abort_uploads_through(std::uint64_t version) {
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
      throw error(errc::transport_failure,
                  "S3 GET " + client_.where(r.subject) + ": unreadable reply: " + e.what());
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

DCR_NETWORK_INLINE bool s3_payload_store::missing(const detail::s3::response& resp,
                                      const detail::s3::request& r) const {
  if (resp.status != 404) return false;
  DCR_EXPECTS(resp.error_code != "NoSuchBucket", errc::transport_failure,
              "S3 " + std::string(r.method) + " " + client_.where(r.key) +
                  ": HTTP 404 NoSuchBucket: " + resp.error_message);
  return true;
}

DCR_NETWORK_INLINE bool s3_payload_store::exists(const std::string& key) const {
  detail::s3::request r;
  r.method = "HEAD";
  r.key = key;
  return client_.call(r, {404}).status != 404;
}

DCR_NETWORK_INLINE void s3_payload_store::require_equal(const std::string& key,
                                            std::span<const std::byte> bytes) const {
  std::vector<std::byte> have;
  detail::s3::request r;
  r.method = "GET";
  r.key = key;
  r.into = &have;
  const auto resp = client_.call(r, {404});
  DCR_EXPECTS(
      !missing(resp, r), errc::transport_failure,
      "s3_payload_store: " + client_.where(key) + " vanished while put again (erased meanwhile?)");
  DCR_EXPECTS(std::equal(bytes.begin(), bytes.end(), have.begin(), have.end()),
              errc::transport_failure,
              "s3_payload_store: " + client_.where(key) + " put again with other bytes");
}

DCR_NETWORK_INLINE std::vector<std::pair<std::string, std::string>> s3_payload_store::list_query(
    const std::string& prefix, const std::string& token, std::size_t max_keys) const {
  std::vector<std::pair<std::string, std::string>> q{
      {"list-type", "2"}, {"prefix", prefix}, {"max-keys", std::to_string(max_keys)}};
  if (!token.empty()) q.emplace_back("continuation-token", token);
  return q;
}

DCR_NETWORK_INLINE s3_payload_store::list_result s3_payload_store::list_page(
    const std::vector<std::pair<std::string, std::string>>& query,
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
                             detail::s3::first_text(c, "ETag").value_or(""),
                             object_size(detail::s3::first_text(c, "Size").value_or(""))});
    for (const auto c : detail::s3::elements(resp.text, "CommonPrefixes"))
      out.common_prefixes.push_back(detail::s3::first_text(c, "Prefix").value_or(""));
    if (detail::s3::first_text(resp.text, "IsTruncated").value_or("false") == "true") {
      out.next_token = detail::s3::first_text(resp.text, "NextContinuationToken").value_or("");
      if (out.next_token.empty())
        throw std::invalid_argument("truncated without a NextContinuationToken");
    }
  } catch (const std::invalid_argument& e) {
    throw error(errc::transport_failure,
                "S3 GET " + client_.where(r.subject) + ": unreadable reply: " + e.what());
  }
  for (const auto& o : out.objects)
    DCR_EXPECTS(o.key.starts_with(prefix), errc::transport_failure,
                "S3 GET " + client_.where(r.subject) + ": the reply lists '" + o.key +
                    "', outside the prefix");
  return out;
}

DCR_NETWORK_INLINE std::vector<s3_payload_store::listed_object> s3_payload_store::list_all(
    const std::string& prefix) const {
  std::vector<listed_object> out;
  std::string token;
  do {
    auto page = list_page(list_query(prefix, token, options_.list_page_size), prefix);
    for (auto& o : page.objects) out.push_back(std::move(o));
    token = std::move(page.next_token);
  } while (!token.empty());
  return out;
}

DCR_NETWORK_INLINE std::uint64_t s3_payload_store::object_size(std::string_view text) {
  const auto size = detail::parse_number(text, "", UINT64_MAX);
  if (!size) throw std::invalid_argument("an object's Size is '" + std::string(text) + "'");
  return *size;
}

DCR_NETWORK_INLINE std::optional<owner_listing> s3_payload_store::read_manifest(
    const attempt_key& key, std::uint32_t owner, const std::string& etag) const {
  const auto cache_key = std::make_pair(key, owner);
  {
    std::lock_guard lock(cache_mutex_);
    if (auto it = manifest_cache_.find(cache_key);
        it != manifest_cache_.end() && !etag.empty() && it->second.first == etag)
      return it->second.second;
  }
  std::vector<std::byte> raw;
  detail::s3::request r;
  r.method = "GET";
  r.key = manifest_key(key, owner);
  r.into = &raw;
  const auto resp = client_.call(r, {404});
  if (missing(resp, r)) return std::nullopt;
  auto manifest = detail::parse_manifest(
      std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()), key, owner,
      "s3_payload_store: manifest " + client_.where(r.key));
  // The ETag of what was read (the listing's may be older than a replaced manifest).
  const std::string& read_etag = resp.etag.empty() ? etag : resp.etag;
  std::lock_guard lock(cache_mutex_);
  if (manifest_cache_.size() >= 4096) manifest_cache_.clear();
  if (!read_etag.empty()) manifest_cache_[cache_key] = {read_etag, manifest};
  return manifest;
}

DCR_NETWORK_INLINE void s3_payload_store::delete_all(const std::vector<std::string>& keys) {
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

DCR_NETWORK_INLINE s3_credentials s3_credentials::from_environment() {
  const auto var = [](const char* name) {
    const char* v = std::getenv(name);
    return v == nullptr ? std::string() : std::string(v);
  };
  if (!var("AWS_ACCESS_KEY_ID").empty() || !var("AWS_SECRET_ACCESS_KEY").empty()) {
    s3_credentials c;
    c.access_key_id = var("AWS_ACCESS_KEY_ID");
    c.secret_access_key = var("AWS_SECRET_ACCESS_KEY");
    DCR_EXPECTS(!c.access_key_id.empty(), errc::invalid_argument,
                "S3 credentials: AWS_ACCESS_KEY_ID is not set (AWS_SECRET_ACCESS_KEY is)");
    DCR_EXPECTS(!c.secret_access_key.empty(), errc::invalid_argument,
                "S3 credentials: AWS_SECRET_ACCESS_KEY is not set (AWS_ACCESS_KEY_ID is)");
    c.session_token = var("AWS_SESSION_TOKEN");
    return c;
  }
  std::string path = var("AWS_SHARED_CREDENTIALS_FILE");
  if (path.empty()) {
    const std::string home = var("HOME");
    DCR_EXPECTS(!home.empty(), errc::invalid_argument,
                "S3 credentials: AWS_ACCESS_KEY_ID is not set, and neither "
                "AWS_SHARED_CREDENTIALS_FILE nor HOME names a credentials file");
    path = home + "/.aws/credentials";
  }
  std::string profile = var("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  std::FILE* probe = std::fopen(path.c_str(), "rb");
  DCR_EXPECTS(probe != nullptr, errc::invalid_argument,
              "S3 credentials: AWS_ACCESS_KEY_ID is not set and there is no credentials file '" +
                  path + "' (AWS_SHARED_CREDENTIALS_FILE)");
  std::fclose(probe);
  return from_profile(path, profile);
}

DCR_NETWORK_INLINE s3_credentials s3_credentials::from_profile(const std::string& path,
                                                   const std::string& profile) {
  const std::string where = "S3 credentials: profile '" + profile + "' of '" + path + "'";
  std::FILE* f = std::fopen(path.c_str(), "rb");
  DCR_EXPECTS(f != nullptr, errc::invalid_argument, where + ": the file cannot be read");
  std::string text;
  char buf[4096];
  while (const auto n = std::fread(buf, 1, sizeof buf, f)) text.append(buf, n);
  std::fclose(f);
  const auto trim = [](std::string_view v) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r')) v.remove_suffix(1);
    return v;
  };
  s3_credentials c;
  bool in_profile = false, found = false;
  std::string_view rest = text;
  while (!rest.empty()) {
    const auto eol = rest.find('\n');
    const std::string_view line = trim(rest.substr(0, eol));
    rest = eol == std::string_view::npos ? std::string_view{} : rest.substr(eol + 1);
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[') {
      const auto close = line.find(']');
      DCR_EXPECTS(close != std::string_view::npos, errc::invalid_argument,
                  where + ": a section header without ']'");
      in_profile = trim(line.substr(1, close - 1)) == profile;
      found = found || in_profile;
      continue;
    }
    if (!in_profile) continue;
    const auto eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    const auto name = trim(line.substr(0, eq));
    const std::string value(trim(line.substr(eq + 1)));
    if (name == "aws_access_key_id") c.access_key_id = value;
    if (name == "aws_secret_access_key") c.secret_access_key = value;
    if (name == "aws_session_token") c.session_token = value;
  }
  DCR_EXPECTS(found, errc::invalid_argument, where + ": no such profile (AWS_PROFILE)");
  DCR_EXPECTS(!c.access_key_id.empty(), errc::invalid_argument,
              where + ": no aws_access_key_id");
  DCR_EXPECTS(!c.secret_access_key.empty(), errc::invalid_argument,
              where + ": no aws_secret_access_key");
  return c;
}

DCR_NETWORK_INLINE s3_options s3_options::from_environment(std::string_view url, std::string endpoint) {
  s3_options o;
  const auto loc = parse_s3_url(url);
  o.bucket = loc.bucket;
  o.prefix = loc.prefix;
  o.addressing = endpoint.empty() ? s3_addressing::virtual_host : s3_addressing::path;
  o.endpoint = std::move(endpoint);
  o.region = s3_region_from_environment();
  o.credentials = s3_credentials::from_environment();
  if (const char* ca = std::getenv("AWS_CA_BUNDLE"); ca != nullptr) o.ca_file = ca;
  return o;
}

DCR_NETWORK_INLINE std::string s3_region_from_environment() {
  for (const char* name : {"AWS_REGION", "AWS_DEFAULT_REGION"})
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return v;
  return "us-east-1";
}

DCR_NETWORK_INLINE s3_location parse_s3_url(std::string_view url) {
  const auto bad = [&](const std::string& why) -> s3_location {
    throw error(errc::invalid_argument,
                "S3 URL '" + std::string(url) + "': " + why + " (expected s3://BUCKET[/PREFIX])");
  };
  if (!url.starts_with("s3://")) return bad("not an s3:// URL");
  std::string_view rest = url.substr(5);
  const auto slash = rest.find('/');
  const std::string_view bucket = rest.substr(0, slash);
  if (bucket.size() < 3 || bucket.size() > 63)
    return bad("the bucket name must have 3 to 63 characters");
  const auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!std::all_of(bucket.begin(), bucket.end(),
                   [&](char c) { return alnum(c) || c == '.' || c == '-'; }) ||
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
    if (segment == "." || segment == "..")
      return bad("'" + std::string(segment) + "' segment in the prefix");
    at = end + 1;
  }
  if (std::any_of(prefix.begin(), prefix.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    return bad("control character in the prefix");
  out.prefix = std::string(prefix) + "/";
  return out;
}

}  // namespace dcr

#endif  // DCR_HEADER_BODIES_OF(DCR_PART_NETWORK)
