// The S3 payload store's pieces that need no server: the s3:// URL syntax, options checks, the
// canonical query and URI encoding SigV4 signs, the XML extractor, manifests; and the sources
// and the fan-out store over local stores (prefetch_source, fanout_store, directory_claims); the
// sources' deadlines and cancellation; the fan-out's check before sharing; credentials from a
// shared credentials file.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "dcr/protocol/store/fanout_store.hpp"
#include "dcr/protocol/payload_source.hpp"
#include "dcr/protocol/store/s3_payload_store.hpp"
#include "s3_test_support.hpp"

namespace {

using namespace std::chrono_literals;

using dcr_test::bytes_of;
using dcr_test::error_of;
using dcr_test::payload_of;

struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    char tmpl[] = "/tmp/dcr-s3-offline-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

/// A memory store that counts gets and can hold payloads back (not visible yet).
/// Puts, manifests, listings and cleanup are the memory store's own.
class counting_store : public dcr::memory_payload_store {
 public:
  dcr::get_status get(const dcr::payload_id& id, std::vector<std::byte>& out) const {
    {
      std::lock_guard lock(mutex_);
      ++gets_[id];
      if (hidden_.contains(id)) return dcr::get_status::absent;
    }
    const auto in_flight = ++in_flight_;
    int seen = max_in_flight_.load();
    while (in_flight > seen && !max_in_flight_.compare_exchange_weak(seen, in_flight)) {
    }
    std::this_thread::sleep_for(delay_);
    const auto s = memory_payload_store::get(id, out);
    --in_flight_;
    return s;
  }

  void hide(const dcr::payload_id& id) {
    std::lock_guard lock(mutex_);
    hidden_.insert(id);
  }
  void reveal(const dcr::payload_id& id) {
    std::lock_guard lock(mutex_);
    hidden_.erase(id);
  }
  std::size_t gets_of(const dcr::payload_id& id) const {
    std::lock_guard lock(mutex_);
    auto it = gets_.find(id);
    return it == gets_.end() ? 0 : it->second;
  }
  int max_in_flight() const { return max_in_flight_.load(); }
  std::chrono::milliseconds delay_{0};

 private:
  mutable std::mutex mutex_;
  mutable std::map<dcr::payload_id, std::size_t> gets_;
  std::set<dcr::payload_id> hidden_;
  mutable std::atomic<int> in_flight_{0}, max_in_flight_{0};
};

dcr::payload_id pid(std::uint32_t owner, std::uint32_t seq, std::uint32_t attempt = 0) {
  return {1, 2, attempt, owner, seq};
}

/// Puts `n` payloads of each owner (bytes naming the id) and, when `manifest`, the manifests.
template <class Store>
std::vector<dcr::payload_id> fill(Store& s, std::vector<std::uint32_t> owners, std::uint32_t n, bool manifest = true) {
  std::vector<dcr::payload_id> all;
  for (auto o : owners) {
    std::vector<dcr::payload_id> ids;
    for (std::uint32_t q = 0; q < n; ++q) {
      const auto id = pid(o, q);
      s.put(id, bytes_of("payload o" + std::to_string(o) + " p" + std::to_string(q) + std::string(100 + q, 'x')));
      ids.push_back(id);
    }
    if (manifest) s.put_manifest(ids.front().attempt, o, ids);
    all.insert(all.end(), ids.begin(), ids.end());
  }
  return all;
}

/// Drains `src` for the attempt of `owners`; returns the delivered ids (each must come once).
template <class Source>
std::multiset<dcr::payload_id> drain(Source& src, std::vector<std::uint32_t> owners, std::chrono::milliseconds limit = 10s) {
  src.open(dcr::attempt_key{1, 2, 0}, owners);
  std::multiset<dcr::payload_id> got;
  const auto deadline = dcr::protocol_clock::now() + limit;
  for (;;) {
    dcr::delivery d;
    const auto s = src.next(d, std::min(deadline, dcr::protocol_clock::now() + 100ms));
    if (s == dcr::source_status::complete) return got;
    if (s == dcr::source_status::delivered) got.insert(d.id);
    REQUIRE(dcr::protocol_clock::now() < deadline);
  }
}

}  // namespace

TEST_CASE("parse_s3_url: bucket and prefix, and clear errors") {
  auto l = dcr::parse_s3_url("s3://my-bucket/runs/exp1");
  CHECK(l.bucket == "my-bucket");
  CHECK(l.prefix == "runs/exp1/");
  CHECK(dcr::parse_s3_url("s3://my-bucket/runs/exp1///").prefix == "runs/exp1/");
  CHECK(dcr::parse_s3_url("s3://my-bucket").prefix.empty());
  CHECK(dcr::parse_s3_url("s3://my-bucket/").prefix.empty());
  CHECK(dcr::parse_s3_url("s3://a.b-c/x").bucket == "a.b-c");
  for (const char* bad : {"http://b/x", "s3://", "s3://ab/x", "s3://Upper/x", "s3://-bucket/x", "s3://bucket-/x",
                          "s3://bu_cket/x", "s3://bucket//x", "s3://bucket/a//b", "s3://bucket/a/../b",
                          "s3://bucket/./b"}) {
    CAPTURE(bad);
    const auto what = error_of([&] { dcr::parse_s3_url(bad); }, dcr::errc::invalid_argument);
    CHECK(what.find(std::string("'") + bad + "'") != std::string::npos);
    CHECK(what.find("s3://BUCKET[/PREFIX]") != std::string::npos);
  }
}

TEST_CASE("s3_options: credentials and region from the environment; none of them in messages") {
  ::setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value", 1);
  ::unsetenv("AWS_SESSION_TOKEN");
  ::setenv("AWS_DEFAULT_REGION", "eu-west-3", 1);
  ::unsetenv("AWS_REGION");
  auto o = dcr::s3_options::from_environment("s3://bucket-x/p", "http://127.0.0.1:9");
  CHECK(o.credentials.access_key_id == "AKIDEXAMPLE");
  CHECK(o.credentials.secret_access_key == "very-secret-value");
  CHECK(o.region == "eu-west-3");
  CHECK(o.addressing == dcr::s3_addressing::path);
  CHECK(dcr::s3_options::from_environment("s3://bucket-x/p").addressing == dcr::s3_addressing::virtual_host);
  ::setenv("AWS_REGION", "ap-south-1", 1);
  CHECK(dcr::s3_region_from_environment() == "ap-south-1");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  const auto what = error_of([] { dcr::s3_credentials::from_environment(); }, dcr::errc::invalid_argument);
  CHECK(what.find("AWS_SECRET_ACCESS_KEY is not set") != std::string::npos);
  CHECK(what.find("AKIDEXAMPLE") == std::string::npos);
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_REGION");
  ::unsetenv("AWS_DEFAULT_REGION");
  CHECK(dcr::s3_region_from_environment() == "us-east-1");
}

TEST_CASE("s3_payload_store: the options are checked before anything is sent") {
  dcr::s3_options o;
  o.endpoint = "http://127.0.0.1:9";
  o.bucket = "bucket";
  o.prefix = "p/";
  o.credentials = {"AKID", "top-secret", ""};
  auto refused = [&](dcr::s3_options x, const char* needle) {
    const auto what = error_of([&] { dcr::s3_payload_store s(x); }, dcr::errc::invalid_argument);
    CHECK_MESSAGE(what.find(needle) != std::string::npos, what);
    CHECK(what.find("top-secret") == std::string::npos);
  };
  { auto x = o; x.endpoint = "ftp://host"; refused(x, "not an http:// or https:// URL"); }
  { auto x = o; x.endpoint = "http://AKID:top-secret@host"; refused(x, "must not hold credentials"); }
  { auto x = o; x.endpoint = "http://host/path"; refused(x, "without a path"); }
  { auto x = o; x.prefix = "p"; refused(x, "must end in '/'"); }
  { auto x = o; x.part_size = 0; refused(x, "part_size"); }
  { auto x = o; x.credentials = {}; refused(x, "no credentials"); }
  { auto x = o; x.addressing = dcr::s3_addressing::virtual_host; refused(x, "needs a host name"); }
  { auto x = o; x.endpoint = "http://localhost:9/"; x.addressing = dcr::s3_addressing::virtual_host;
    dcr::s3_payload_store ok(x); CHECK(ok.url() == "s3://bucket/p/"); }
  dcr::s3_payload_store s(o);
  CHECK(s.payload_key(dcr::payload_id{{3, 4, 1}, 77, 12}) == "p/t3-4-a1/o77/p12");
  CHECK(s.manifest_key(dcr::attempt_key{4, 4, 2}, 5) == "p/t4-4-a2/o5/manifest");
}

TEST_CASE("SigV4 canonical forms: URI encoding and the sorted query") {
  using dcr::detail::s3::canonical_query;
  using dcr::detail::s3::uri_encode;
  CHECK(uri_encode("a/b c+d~e_f.g-h", true) == "a/b%20c%2Bd~e_f.g-h");
  CHECK(uri_encode("a/b", false) == "a%2Fb");
  CHECK(uri_encode("\xc3\xa9", false) == "%C3%A9");
  CHECK(canonical_query({{"uploads", ""}}) == "uploads=");
  CHECK(canonical_query({{"uploadId", "x/y=="}, {"partNumber", "1"}}) == "partNumber=1&uploadId=x%2Fy%3D%3D");
  CHECK(canonical_query({{"prefix", "a/b/"}, {"max-keys", "2"}, {"list-type", "2"}, {"continuation-token", "1+2/3="}}) ==
        "continuation-token=1%2B2%2F3%3D&list-type=2&max-keys=2&prefix=a%2Fb%2F");
  CHECK(canonical_query({}).empty());
  std::string abc = "abc";
  CHECK(dcr::detail::s3::sha256_hex(std::as_bytes(std::span(abc))) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(dcr::detail::s3::sha256_hex({}) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("S3 XML: the elements dcr reads, entities decoded, malformed documents refused") {
  namespace x = dcr::detail::s3;
  const std::string list =
      R"(<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">)"
      R"(<Name>b</Name><Prefix>p/</Prefix><KeyCount>2</KeyCount><IsTruncated>true</IsTruncated>)"
      R"(<Contents><Key>p/a&amp;b</Key><ETag>&#34;abc&#x22;</ETag><Size>5</Size></Contents>)"
      R"(<Contents><Key>p/c&lt;d&gt;</Key><ETag>&quot;def&quot;</ETag></Contents>)"
      R"(<CommonPrefixes><Prefix>p/t1-2/</Prefix></CommonPrefixes><CommonPrefixes><Prefix/></CommonPrefixes>)"
      R"(<NextContinuationToken><![CDATA[tok<en]]></NextContinuationToken></ListBucketResult>)";
  CHECK(x::root_name(list) == "ListBucketResult");
  const auto contents = x::elements(list, "Contents");
  REQUIRE(contents.size() == 2);
  CHECK(x::first_text(contents[0], "Key") == "p/a&b");
  CHECK(x::first_text(contents[0], "ETag") == "\"abc\"");
  CHECK(x::first_text(contents[1], "Key") == "p/c<d>");
  CHECK(x::first_text(contents[1], "ETag") == "\"def\"");
  CHECK(x::first_text(list, "Key") == "p/a&b");  // never <KeyCount>
  CHECK(x::first_text(list, "KeyCount") == "2");
  const auto prefixes = x::elements(list, "CommonPrefixes");
  REQUIRE(prefixes.size() == 2);
  CHECK(x::first_text(prefixes[0], "Prefix") == "p/t1-2/");
  CHECK(x::first_text(prefixes[1], "Prefix") == "");
  CHECK(x::first_text(list, "NextContinuationToken") == "tok<en");
  CHECK_FALSE(x::first_text(list, "UploadId").has_value());
  CHECK(x::decode_text("&#233;&#x20AC;&apos;") == "\xc3\xa9\xe2\x82\xac'");
  CHECK(x::root_name("<?xml version=\"1.0\"?>\n<!-- c --><Error><Code>X</Code></Error>") == "Error");
  for (const char* bad : {"<Key>a&bogus;</Key>", "<Key>a&amp</Key>", "<Key>a<b/></Key>", "<Key>&#0;</Key>",
                          "<Key>&#xD800;</Key>", "<Key>&#x110000;</Key>", "<Key>open", "<Key>&#;</Key>"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(x::first_text(bad, "Key"), std::invalid_argument);
  }
  CHECK(x::escape("<a&\"'>") == "&lt;a&amp;&quot;&apos;&gt;");
}

TEST_CASE("manifests: one text format for every store, with sizes; damaged ones refused") {
  const dcr::attempt_key key{1, 2, 0};
  std::vector<dcr::payload_id> ids{pid(7, 2), pid(7, 0), pid(7, 1)};
  const std::vector<std::uint64_t> sizes{30, 10, 20};
  const auto text = dcr::detail::manifest_text(ids, sizes);
  CHECK(text == "dcr-manifest 2 3\n2 30\n0 10\n1 20\n");
  const auto back = dcr::detail::parse_manifest(text, key, 7, "m");
  CHECK(back.owner == 7);
  CHECK(back.complete);
  CHECK(back.ids == std::vector<dcr::payload_id>{pid(7, 0), pid(7, 1), pid(7, 2)});
  CHECK(back.sizes == std::vector<std::uint64_t>{10, 20, 30});  // sorted with their ids
  CHECK(dcr::detail::parse_manifest("dcr-manifest 2 0\n", key, 7, "m").ids.empty());
  CHECK(dcr::detail::parse_manifest("dcr-manifest 2 1\n4 0\n", key, 7, "m").sizes ==
        std::vector<std::uint64_t>{0});  // an empty payload is a payload too
  // The earlier format without sizes is still read: complete, sizes unknown.
  const auto old = dcr::detail::parse_manifest("dcr-manifest 1 2\n1\n0\n", key, 7, "m");
  CHECK(old.complete);
  CHECK(old.ids == std::vector<dcr::payload_id>{pid(7, 0), pid(7, 1)});
  CHECK(old.sizes.empty());
  CHECK_THROWS_AS(dcr::detail::manifest_text(ids, std::vector<std::uint64_t>{1}), dcr::error);
  for (const char* bad : {"", "dcr-manifest 3 1\n0 1\n", "dcr-manifest 2 1\n0\n", "dcr-manifest 2 2\n0 1\n",
                          "dcr-manifest 2 1\nx 1\n", "dcr-manifest 2 1\n0 1",
                          "dcr-manifest 2 1\n0 x\n", "dcr-manifest 2 1\n0 -1\n", "dcr-manifest 2 1\n0  1\n",
                          "dcr-manifest 2 1\n0 99999999999999999999999\n", "dcr-manifest 2 2\n0 1\n0 1\n",
                          "dcr-manifest 1 1\n0 1\n", "dcr-manifest 1 2\n0\n", "dcr-manifest 1 1\nx\n",
                          "dcr-manifest 1 1\n0", "dcr-manifest 1 1\n99999999999\n", "dcr-manifest 1 \n",
                          "dcr-manifest 1 1\n01\n", "dcr-manifest 1 01\n0\n", "dcr-manifest 1 1\n+1\n"}) {
    CAPTURE(bad);
    const auto what = error_of([&] { dcr::detail::parse_manifest(bad, key, 7, "manifest 'm'"); },
                               dcr::errc::transport_failure);
    CHECK(what.find("manifest 'm' is damaged") != std::string::npos);
  }
}

TEST_CASE("the file and memory stores record each payload's size in its manifest") {
  temp_dir dir;
  dcr::file_payload_store files(dir.path);
  dcr::memory_payload_store memory;
  const dcr::attempt_key key{1, 2, 0};
  const auto check = [&](auto& store) {
    store.put(pid(2, 0), std::vector<std::byte>(5, std::byte{1}));
    store.put(pid(2, 1), std::vector<std::byte>(9, std::byte{2}));
    auto before = store.list(key);
    REQUIRE(before.size() == 1);
    CHECK(before[0].sizes.empty());  // no manifest yet: sizes unknown
    store.put_manifest(key, 2, std::vector<dcr::payload_id>{pid(2, 1), pid(2, 0)});
    const auto after = store.list(key);
    REQUIRE(after.size() == 1);
    CHECK(after[0].complete);
    CHECK(after[0].ids == std::vector<dcr::payload_id>{pid(2, 0), pid(2, 1)});
    CHECK(after[0].sizes == std::vector<std::uint64_t>{5, 9});
    // A manifest naming a payload that was not put is refused, whatever the store.
    error_of([&] { store.put_manifest(key, 2, std::vector<dcr::payload_id>{pid(2, 7)}); },
             dcr::errc::transport_failure);
  };
  check(files);
  check(memory);
}

TEST_CASE("payload sources hold a payload to its manifest's size: longer or shorter bodies are refused") {
  // A store whose object changed after its owner's manifest was written (or a body cut short or
  // padded on the way): the sources never deliver it, and say which payload and both sizes.
  class resized_store : public dcr::memory_payload_store {
   public:
    using memory_payload_store::get;
    dcr::get_status get(const dcr::payload_id& id, std::vector<std::byte>& out,
                        const dcr::get_control& control) const {
      caps.push_back(control.max_bytes);
      const auto s = memory_payload_store::get(id, out);
      if (s == dcr::get_status::found && id == victim) out.resize(out.size() + delta);
      return s;
    }
    dcr::payload_id victim{};
    std::int64_t delta = 0;
    mutable std::vector<std::uint64_t> caps;
  };
  const dcr::attempt_key key{1, 2, 0};
  for (const std::int64_t delta : {-1, 1}) {
    CAPTURE(delta);
    resized_store store;
    store.put(pid(3, 0), std::vector<std::byte>(6, std::byte{1}));
    store.put(pid(3, 1), std::vector<std::byte>(8, std::byte{2}));
    store.put_manifest(key, 3, std::vector<dcr::payload_id>{pid(3, 0), pid(3, 1)});
    store.victim = pid(3, 1);
    store.delta = delta;
    const std::string expected = "payload " + dcr::to_string(pid(3, 1)) + ": got " +
                                 std::to_string(8 + delta) + " bytes, its owner's manifest says 8";
    // What the source throws once it reaches the resized payload (the other one is delivered).
    const auto failure_of = [&](auto& src) {
      src.open(key, std::vector<std::uint32_t>{3});
      dcr::delivery d;
      return error_of(
          [&] {
            while (src.next(d, dcr::protocol_clock::now() + 2s) == dcr::source_status::delivered) {}
          },
          dcr::errc::transport_failure);
    };
    {
      dcr::store_source src(store, 1ms);
      CHECK(failure_of(src).find(expected) != std::string::npos);
      std::vector<std::byte> again;
      CHECK(error_of([&] { src.refetch(pid(3, 1), again); }, dcr::errc::transport_failure).find(expected) !=
            std::string::npos);
    }
    {
      dcr::prefetch_source src(store, dcr::prefetch_options{2, 0, 1ms});
      CHECK(failure_of(src).find(expected) != std::string::npos);
    }
    // Every get was capped at the manifest's size of the payload it asked for.
    CHECK(!store.caps.empty());
    for (const auto cap : store.caps) CHECK((cap == 6 || cap == 8));
  }
}

TEST_CASE("file_payload_store lists only the names it writes; other entries are not payloads") {
  temp_dir dir;
  dcr::file_payload_store store(dir.path);
  const std::vector<std::byte> bytes(3, std::byte{7});
  store.put(pid(2, 0), bytes);
  store.put(pid(2, 1), bytes);
  // Entries another tool (or a damaged copy) left beside them, spelled almost like ours.
  const auto attempt = dir.path / dcr::to_string(dcr::attempt_key{1, 2, 0});
  for (const char* d : {"ofoo", "o1x", "o007", "o", "o99999999999"})
    std::filesystem::create_directories(attempt / d);
  for (const char* f : {"pbar", "p01", "p", "p2x", "q3"}) std::ofstream(attempt / "o2" / f) << "x";
  std::vector<dcr::owner_listing> listed;
  REQUIRE_NOTHROW(listed = store.list({1, 2, 0}));
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].owner == 2);
  CHECK(listed[0].ids == std::vector<dcr::payload_id>{pid(2, 0), pid(2, 1)});
  CHECK_FALSE(listed[0].complete);
}

TEST_CASE("prefetch_source: gets in parallel, each listed payload once, complete when the manifests are") {
  counting_store store;
  store.delay_ = 20ms;
  const auto ids = fill(store, {3, 9}, 6);
  dcr::prefetch_source src(store, dcr::prefetch_options{4, 0, 5ms});
  const auto t0 = dcr::protocol_clock::now();
  const auto got = drain(src, {3, 9});
  const double seconds = std::chrono::duration<double>(dcr::protocol_clock::now() - t0).count();
  CHECK(got == std::multiset<dcr::payload_id>(ids.begin(), ids.end()));
  CHECK(store.max_in_flight() >= 3);
  CHECK(store.max_in_flight() <= 4);
  CHECK_MESSAGE(seconds < 12 * 0.020 * 0.75, "12 gets of 20 ms took " << seconds << " s");
  for (const auto& id : ids) CHECK(store.gets_of(id) == 1);
  // An owner outside the attempt's owners is not delivered; a missing owner keeps it open.
  counting_store partial;
  fill(partial, {3}, 2);
  fill(partial, {4}, 2, false);
  dcr::prefetch_source src2(partial, dcr::prefetch_options{2, 0, 5ms});
  src2.open(dcr::attempt_key{1, 2, 0}, std::vector<std::uint32_t>{3, 4});
  dcr::delivery d;
  int delivered = 0;
  const auto until = dcr::protocol_clock::now() + 200ms;
  dcr::source_status s{};
  while ((s = src2.next(d, until)) == dcr::source_status::delivered) ++delivered;
  CHECK(s == dcr::source_status::timed_out);
  CHECK(delivered == 4);
  partial.put_manifest(dcr::attempt_key{1, 2, 0}, 4, std::vector<dcr::payload_id>{pid(4, 0), pid(4, 1)});
  CHECK(src2.next(d, dcr::protocol_clock::now() + 2s) == dcr::source_status::complete);
}

TEST_CASE("prefetch_source: a listed payload that is absent is asked for again; errors reach next()") {
  counting_store store;
  const auto ids = fill(store, {1}, 3);
  store.hide(ids[1]);
  dcr::prefetch_source src(store, dcr::prefetch_options{2, 0, 5ms});
  src.open(dcr::attempt_key{1, 2, 0}, std::vector<std::uint32_t>{1});
  std::set<dcr::payload_id> got;
  dcr::delivery d;
  const auto until = dcr::protocol_clock::now() + 150ms;
  while (src.next(d, until) == dcr::source_status::delivered) got.insert(d.id);
  CHECK(got.size() == 2);
  CHECK(store.gets_of(ids[1]) >= 3);  // asked again every poll interval
  store.reveal(ids[1]);
  REQUIRE(src.next(d, dcr::protocol_clock::now() + 2s) == dcr::source_status::delivered);
  CHECK(d.id == ids[1]);
  CHECK(src.next(d, dcr::protocol_clock::now() + 2s) == dcr::source_status::complete);

  // A store that throws: the error comes out of next() with its message.
  struct failing {
    using payload_store_concept = dcr::payload_store_tag;
    void put(const dcr::payload_id&, std::span<const std::byte>) {}
    void put_manifest(const dcr::attempt_key&, std::uint32_t, std::span<const dcr::payload_id>) {}
    std::vector<dcr::owner_listing> list(const dcr::attempt_key&) const { return {{1, {pid(1, 0)}, true, {}}}; }
    dcr::get_status get(const dcr::payload_id&, std::vector<std::byte>&) const {
      throw dcr::error(dcr::errc::transport_failure, "S3 GET s3://b/k: HTTP 403 AccessDenied");
    }
    void erase_through(std::uint64_t) {}
  } bad;
  dcr::prefetch_source fsrc(bad, dcr::prefetch_options{2, 0, 5ms});
  fsrc.open(dcr::attempt_key{1, 2, 0}, std::vector<std::uint32_t>{1});
  const auto what = error_of([&] { fsrc.next(d, dcr::protocol_clock::now() + 2s); }, dcr::errc::transport_failure);
  CHECK(what.find("HTTP 403 AccessDenied") != std::string::npos);
}

TEST_CASE("store_source: a listed payload that stays absent is asked for once per poll, until the deadline") {
  // An eventually consistent store that lists a payload it never returns: next() must wait
  // between gets and give up at its deadline (it used to re-list and get in a busy loop,
  // never reaching the deadline check).
  counting_store store;
  const auto ids = fill(store, {1}, 2);
  store.hide(ids[1]);
  dcr::store_source<counting_store> src(store, 20ms);
  src.open(dcr::attempt_key{1, 2, 0}, std::vector<std::uint32_t>{1});
  dcr::delivery d;
  REQUIRE(src.next(d, dcr::protocol_clock::now() + 2s) == dcr::source_status::delivered);
  CHECK(d.id == ids[0]);
  const auto t0 = dcr::protocol_clock::now();
  CHECK(src.next(d, t0 + 200ms) == dcr::source_status::timed_out);
  CHECK(dcr::protocol_clock::now() - t0 < 2s);
  CHECK(store.gets_of(ids[1]) >= 2);
  CHECK(store.gets_of(ids[1]) <= 15);  // about one per 20 ms poll, not thousands
  store.reveal(ids[1]);
  REQUIRE(src.next(d, dcr::protocol_clock::now() + 2s) == dcr::source_status::delivered);
  CHECK(d.id == ids[1]);
  CHECK(src.next(d, dcr::protocol_clock::now() + 2s) == dcr::source_status::complete);
}

TEST_CASE("directory_claims: one holder at a time, released on destruction") {
  temp_dir dir;
  dcr::directory_claims claims(dir.path / "claims");
  const auto id = pid(1, 0);
  {
    auto a = claims.try_claim(id);
    CHECK(a.held());
    CHECK_FALSE(claims.try_claim(id).held());
    CHECK(claims.try_claim(pid(1, 1)).held());
  }
  CHECK(claims.try_claim(id).held());
  claims.erase_through(1);
  CHECK(std::filesystem::exists(dir.path / "claims" / "t1-2-a0-o1-p0"));
  claims.erase_through(2);
  CHECK_FALSE(std::filesystem::exists(dir.path / "claims" / "t1-2-a0-o1-p0"));
}

TEST_CASE("share_of: disjoint shares within one payload per owner of each other") {
  for (std::uint32_t nodes : {1u, 2u, 3u, 4u, 7u}) {
    std::vector<int> count(nodes);
    for (std::uint32_t owner : {11u, 4000000007u, 12345u})
      for (std::uint32_t q = 0; q < 10; ++q) ++count.at(dcr::share_of(pid(owner, q), nodes));
    const auto [lo, hi] = std::minmax_element(count.begin(), count.end());
    CHECK(*hi - *lo <= 3);
  }
}

TEST_CASE("fanout_store: every payload crosses once, nodes read the rest locally, a dead node's share is taken over") {
  temp_dir dir;
  counting_store remote;
  const auto ids = fill(remote, {5, 6}, 5);
  dcr::file_payload_store local(dir.path / "local");
  dcr::directory_claims claims(dir.path / "claims");
  constexpr std::uint32_t nodes = 3;
  // Nodes 0 and 1 run (two receivers on node 0); node 2 is dead: its share is taken over.
  using fan = dcr::fanout_store<counting_store, dcr::file_payload_store>;
  std::vector<std::unique_ptr<fan>> views;
  for (std::uint32_t n : {0u, 0u, 1u})
    views.push_back(std::make_unique<fan>(remote, local, claims,
                                           dcr::fanout_options{n, nodes, 100ms, dcr::fanout_check::none}));
  std::vector<std::multiset<dcr::payload_id>> got(views.size());
  {
    std::vector<std::jthread> threads;
    for (std::size_t v = 0; v < views.size(); ++v)
      threads.emplace_back([&, v] {
        dcr::prefetch_source src(*views[v], dcr::prefetch_options{2, 0, 5ms});
        got[v] = drain(src, {5, 6});
      });
  }
  for (const auto& g : got) CHECK(g == std::multiset<dcr::payload_id>(ids.begin(), ids.end()));
  std::uint64_t remote_gets = 0, takeovers = 0;
  for (const auto& v : views) {
    remote_gets += v->stats().remote_gets;
    takeovers += v->stats().takeovers;
  }
  CHECK(remote_gets == ids.size());
  std::size_t dead_share = 0;
  for (const auto& id : ids) {
    CHECK(remote.gets_of(id) == 1);
    if (dcr::share_of(id, nodes) == 2) ++dead_share;
  }
  CHECK(dead_share > 0);
  CHECK(takeovers >= dead_share);
  CHECK(views[2]->stats().local_hits > 0);
  // erase_through reaches the remote store, the local copies and the claims.
  views[0]->erase_through(2);
  std::vector<std::byte> out;
  CHECK(local.get(ids[0], out) == dcr::get_status::absent);
  CHECK(remote.get(ids[0], out) == dcr::get_status::absent);
  CHECK(std::filesystem::is_empty(dir.path / "claims"));
  CHECK_THROWS_AS(fan(remote, local, claims, dcr::fanout_options{3, 3, 1s}), dcr::error);
}

// ---- the fan-out checks what it shares; the sources cancel what the receiver left

namespace {

/// A memory store whose next `damaged` gets return the payload with one byte flipped.
/// Puts, manifests, listings and cleanup are the memory store's own.
class damaging_store : public dcr::memory_payload_store {
 public:
  dcr::get_status get(const dcr::payload_id& id, std::vector<std::byte>& out) const {
    ++gets;
    const auto s = memory_payload_store::get(id, out);
    if (s == dcr::get_status::found && damaged > 0) {
      --damaged;
      out[out.size() / 2] ^= std::byte{0x40};
    }
    return s;
  }
  mutable std::atomic<int> damaged{0}, gets{0};
};

/// A store whose gets take `delay` unless cancelled through their get_control.
/// Puts, manifests, listings and cleanup are the memory store's own.
class slow_store : public dcr::memory_payload_store {
 public:
  dcr::get_status get(const dcr::payload_id& id, std::vector<std::byte>& out) const {
    return get(id, out, dcr::get_control{});
  }
  dcr::get_status get(const dcr::payload_id& id, std::vector<std::byte>& out, const dcr::get_control& c) const {
    const auto until = std::chrono::steady_clock::now() + delay;
    while (std::chrono::steady_clock::now() < until) {
      if (c.cancel != nullptr && c.cancel->load()) {
        ++cancelled;
        throw dcr::error(dcr::errc::transport_failure, "slow_store: cancelled");
      }
      std::this_thread::sleep_for(5ms);
    }
    return memory_payload_store::get(id, out);
  }
  std::chrono::milliseconds delay{5000};
  mutable std::atomic<int> cancelled{0};
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// One rollout node's fan-out store over a remote that can damage its downloads, sharing into a
/// local file store; the remote holds payload `id` and a manifest naming it.
struct fanout_node {
  temp_dir dir;
  damaging_store remote;
  dcr::payload_id id = pid(1, 0);
  dcr::file_payload_store local{dir.path / "local"};
  dcr::directory_claims claims{dir.path / "claims"};
  using store_type = dcr::fanout_store<damaging_store, dcr::file_payload_store>;
  store_type node{
      remote, local, claims, dcr::fanout_options{0, 1, std::chrono::milliseconds(100)}};
  fanout_node() {
    remote.put(id, payload_of(id));
    remote.put_manifest(id.attempt, 1, std::vector<dcr::payload_id>{id});
  }
};

}  // namespace

TEST_CASE("fanout_store: a download that fails the payload check is downloaded again and never shared") {
  fanout_node f;
  auto& [dir, remote, id, local, claims, node] = f;
  std::vector<std::byte> out, shared;
  // One damaged download: caught by the check, downloaded again; only the good copy is shared.
  remote.damaged = 1;
  REQUIRE(node.get(id, out) == dcr::get_status::found);
  CHECK(out == payload_of(id));
  CHECK(remote.gets == 2);
  CHECK(node.stats().rejected == 1);
  REQUIRE(local.get(id, shared) == dcr::get_status::found);
  CHECK(shared == payload_of(id));
  // Every download damaged: an error naming the payload; nothing shared.
  const auto id2 = pid(1, 1);
  remote.put(id2, payload_of(id2));
  remote.damaged = 2;
  const auto what = error_of([&] { (void)node.get(id2, out); }, dcr::errc::corrupt_payload);
  CHECK(what.find(dcr::to_string(id2)) != std::string::npos);
  CHECK(what.find("not shared") != std::string::npos);
  CHECK(local.get(id2, shared) == dcr::get_status::absent);
  // A payload under another id is refused as well (the check reads the header's id).
  const auto id3 = pid(1, 2);
  remote.put(id3, payload_of(pid(1, 7)));
  CHECK(error_of([&] { (void)node.get(id3, out); }, dcr::errc::corrupt_payload).find("are payload") !=
        std::string::npos);
  CHECK(local.get(id3, shared) == dcr::get_status::absent);
}

TEST_CASE("fanout_store: a refetch downloads again instead of serving the shared copy") {
  fanout_node f;
  auto& [dir, remote, id, local, claims, node] = f;
  std::vector<std::byte> out;
  REQUIRE(node.get(id, out) == dcr::get_status::found);
  REQUIRE(remote.gets == 1);
  REQUIRE(node.get(id, out) == dcr::get_status::found);  // the local copy
  CHECK(remote.gets == 1);
  // The sources' refetch asks for a fresh copy: downloaded again.
  dcr::store_source<fanout_node::store_type> src(node);
  src.open(id.attempt, std::vector<std::uint32_t>{1});
  CHECK(src.refetch(id, out));
  CHECK(remote.gets == 2);
  CHECK(out == payload_of(id));
  dcr::prefetch_source<fanout_node::store_type> pre(node, dcr::prefetch_options{1, 0, 5ms});
  pre.open(id.attempt, std::vector<std::uint32_t>{1});
  CHECK(pre.refetch(id, out));
  CHECK(remote.gets == 3);
  CHECK(node.stats().fresh_gets == 2);
}

TEST_CASE("store_source: next() keeps its deadline while a get is slow; close() cancels the get") {
  slow_store store;
  const auto ids = fill(store, {1}, 1);
  dcr::store_source<slow_store> src(store, 2ms);
  const dcr::attempt_key key{1, 2, 0};
  src.open(key, std::vector<std::uint32_t>{1});
  dcr::delivery d;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(src.next(d, dcr::protocol_clock::now() + 100ms) == dcr::source_status::timed_out);
  CHECK(seconds_since(t0) < 1.0);
  const auto t1 = std::chrono::steady_clock::now();
  src.close(key);  // the receiver left the attempt (fenced, or past its deadline)
  CHECK(seconds_since(t1) < 1.0);
  CHECK(store.cancelled == 1);
  // A fast get is delivered as before.
  store.delay = 0ms;
  src.open(key, std::vector<std::uint32_t>{1});
  REQUIRE(src.next(d, dcr::protocol_clock::now() + 5s) == dcr::source_status::delivered);
  CHECK(d.id == ids[0]);
  CHECK(src.next(d, dcr::protocol_clock::now() + 5s) == dcr::source_status::complete);
}

TEST_CASE("prefetch_source: close() and open() cancel the gets in flight") {
  slow_store store;
  fill(store, {1}, 3);
  const dcr::attempt_key key{1, 2, 0};
  {
    dcr::prefetch_source<slow_store> src(store, dcr::prefetch_options{2, 0, 5ms});
    src.open(key, std::vector<std::uint32_t>{1});
    dcr::delivery d;
    CHECK(src.next(d, dcr::protocol_clock::now() + 100ms) == dcr::source_status::timed_out);
    src.close(key);
    const auto t0 = std::chrono::steady_clock::now();
    while (store.cancelled < 2 && seconds_since(t0) < 2.0) std::this_thread::sleep_for(5ms);
    CHECK(store.cancelled == 2);
    CHECK(seconds_since(t0) < 1.0);
    src.open(key, std::vector<std::uint32_t>{1});
    CHECK(src.next(d, dcr::protocol_clock::now() + 100ms) == dcr::source_status::timed_out);
    // the destructor cancels what is in flight rather than waiting 5 s for it
  }
  CHECK(store.cancelled == 4);
}

TEST_CASE("s3_credentials: the shared credentials file, AWS_PROFILE and AWS_SHARED_CREDENTIALS_FILE") {
  temp_dir dir;
  const auto file = dir.path / "credentials";
  std::ofstream(file) << "# a comment\n[default]\naws_access_key_id = AKIDDEFAULT\n"
                         "aws_secret_access_key=default-secret\n\n; another\n[ci]\n"
                         "aws_access_key_id=AKIDCI\r\naws_secret_access_key = ci-secret \n"
                         "aws_session_token = ci-token\nregion = eu-west-1\n[half]\naws_access_key_id=AKIDHALF\n";
  auto c = dcr::s3_credentials::from_profile(file.string(), "ci");
  CHECK(c.access_key_id == "AKIDCI");
  CHECK(c.secret_access_key == "ci-secret");
  CHECK(c.session_token == "ci-token");
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  ::unsetenv("AWS_SESSION_TOKEN");
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", file.c_str(), 1);
  ::unsetenv("AWS_PROFILE");
  c = dcr::s3_credentials::from_environment();
  CHECK(c.access_key_id == "AKIDDEFAULT");
  CHECK(c.session_token.empty());
  ::setenv("AWS_PROFILE", "ci", 1);
  CHECK(dcr::s3_credentials::from_environment().secret_access_key == "ci-secret");
  // The environment's keys come first, with their session token.
  ::setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "env-secret", 1);
  ::setenv("AWS_SESSION_TOKEN", "env-token", 1);
  c = dcr::s3_credentials::from_environment();
  CHECK(c.access_key_id == "AKIDENV");
  CHECK(c.session_token == "env-token");
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  ::unsetenv("AWS_SESSION_TOKEN");
  // Clear refusals, naming the file and profile, never a value.
  ::setenv("AWS_PROFILE", "nope", 1);
  auto what = error_of([] { dcr::s3_credentials::from_environment(); }, dcr::errc::invalid_argument);
  CHECK(what.find("profile 'nope'") != std::string::npos);
  CHECK(what.find(file.string()) != std::string::npos);
  ::setenv("AWS_PROFILE", "half", 1);
  what = error_of([] { dcr::s3_credentials::from_environment(); }, dcr::errc::invalid_argument);
  CHECK(what.find("no aws_secret_access_key") != std::string::npos);
  CHECK(what.find("AKIDHALF") == std::string::npos);
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", (dir.path / "missing").c_str(), 1);
  what = error_of([] { dcr::s3_credentials::from_environment(); }, dcr::errc::invalid_argument);
  CHECK(what.find("no credentials file") != std::string::npos);
  ::unsetenv("AWS_PROFILE");
  ::unsetenv("AWS_SHARED_CREDENTIALS_FILE");
  // AWS_CA_BUNDLE reaches the options.
  ::setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "env-secret", 1);
  ::setenv("AWS_CA_BUNDLE", file.c_str(), 1);
  CHECK(dcr::s3_options::from_environment("s3://bucket-x/p", "https://127.0.0.1:9").ca_file == file.string());
  ::unsetenv("AWS_CA_BUNDLE");
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
}

TEST_CASE("s3_options: requests are bounded by default; unbounded settings are refused") {
  const dcr::s3_options d;
  CHECK(d.request_timeout.count() > 0);
  CHECK(d.min_rate >= 1024);  // a trickle of a few bytes a second is cut
  CHECK(d.max_object_size < (std::uint64_t{1} << 40));
  dcr::s3_options o;
  o.endpoint = "http://127.0.0.1:9";
  o.bucket = "bucket";
  o.credentials = {"AKID", "top-secret", ""};
  for (int i = 0; i < 4; ++i) {
    auto x = o;
    if (i == 0) x.request_timeout = 0ms;
    if (i == 1) x.min_rate = 0;
    if (i == 2) x.max_object_size = 0;
    if (i == 3) x.stall_timeout = 0s;
    CHECK(error_of([&] { dcr::s3_payload_store s(x); }, dcr::errc::invalid_argument).find("must be > 0") !=
          std::string::npos);
  }
  auto x = o;
  x.ca_file = "/nonexistent/ca.pem";
  CHECK(error_of([&] { dcr::s3_payload_store s(x); }, dcr::errc::invalid_argument).find("/nonexistent/ca.pem") !=
        std::string::npos);
}
