// dcr/detail/protocol/curl.hpp: what every libcurl transfer of dcr does around curl_easy_perform
// (implementation only; the etcd control plane and the S3 client use it).
#pragma once

#include <curl/curl.h>

#include <string>

namespace dcr::detail {

/// What a transfer came to.
struct curl_outcome {
  CURLcode code = CURLE_OK;
  long status = 0;      ///< the HTTP status (0: no response)
  std::string message;  ///< libcurl's error text when code is not CURLE_OK
};

/// Performs the transfer set up on `h`, with `headers` (freed here, whatever happens) and an
/// error buffer attached for its duration only, so that `h` can be reused afterwards.
inline curl_outcome curl_perform(CURL* h, curl_slist* headers) {
  char errbuf[CURL_ERROR_SIZE] = {};
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_outcome out;
  out.code = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out.status);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, nullptr);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, nullptr);
  curl_slist_free_all(headers);
  if (out.code != CURLE_OK) {
    out.message = errbuf[0] != '\0' ? std::string(errbuf) : std::string(curl_easy_strerror(out.code));
    while (!out.message.empty() && out.message.back() == '\n') out.message.pop_back();
  }
  return out;
}

}  // namespace dcr::detail
