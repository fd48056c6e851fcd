// The safetensors reader and writer: round trips of every dtype, metadata, tensors listed out of
// offset order, and every way a header can be malformed.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "dcr/io/safetensors.hpp"
#include "io_test_util.hpp"

using dcr::dtype;
using dcr::errc;
using namespace dcr::io;
using io_test::thrown_error;

namespace {

constexpr dtype all_dtypes[] = {dtype::boolean, dtype::u8,  dtype::i8,  dtype::f8_e5m2,
                                dtype::f8_e4m3, dtype::i16, dtype::u16, dtype::f16,
                                dtype::bf16,    dtype::i32, dtype::u32, dtype::f32,
                                dtype::f64,     dtype::i64, dtype::u64};

// A file made of `json` (padded to 8 bytes unless told not to) and `buffer` bytes of data.
std::vector<std::byte> file_of(std::string json, std::size_t buffer, bool pad = true) {
  if (pad) json.append((8 - json.size() % 8) % 8, ' ');
  std::vector<std::byte> f(8 + json.size() + buffer, std::byte{0x5a});
  dcr::detail::store_le<std::uint64_t>(f.data(), json.size());
  std::memcpy(f.data() + 8, json.data(), json.size());
  return f;
}

dcr::error parse_error(const std::string& json, std::size_t buffer) {
  const auto f = file_of(json, buffer);
  return thrown_error([&] { (void)parse_safetensors(f, "t.safetensors"); });
}

}  // namespace

TEST_CASE("every dtype round-trips through the writer and reader bit for bit") {
  std::vector<std::vector<std::byte>> data;
  std::vector<safetensors_tensor> tensors;
  std::uint64_t seed = 1;
  for (dtype t : all_dtypes) {
    const std::vector<std::int64_t> shape = {3, 5};
    data.push_back(io_test::random_bytes(15 * dcr::dtype_size(t), seed++));
    tensors.push_back({"t." + std::string(dcr::dtype_name(t)), t, shape, data.back()});
  }
  data.push_back({});
  tensors.push_back({"empty", dtype::bf16, {0, 7}, data.back()});
  data.push_back(io_test::random_bytes(4, 99));
  tensors.push_back({"scalar", dtype::f32, {}, data.back()});

  const auto bytes = serialize_safetensors(tensors);
  const auto json_size = dcr::detail::load_le<std::uint64_t>(bytes.data());
  CHECK(json_size % 8 == 0);
  const auto h = parse_safetensors(bytes, "mem");
  CHECK_FALSE(h.metadata().has_value());
  REQUIRE(h.tensors().size() == tensors.size());
  std::uint64_t at = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& e = h.tensors()[i];  // offset order = the order written
    CHECK(e.name == tensors[i].name);
    CHECK(e.type == tensors[i].type);
    CHECK(e.shape == tensors[i].shape);
    CHECK(e.begin == at);
    at = e.end;
    if (!tensors[i].data.empty())  // memcmp of an empty span may see a null pointer
      CHECK(std::memcmp(bytes.data() + h.data_offset() + e.begin, tensors[i].data.data(),
                        tensors[i].data.size()) == 0);
  }
  CHECK(h.file_size() == bytes.size());

  io_test::scratch_dir dir;
  write_safetensors(dir / "all.safetensors", tensors);
  CHECK(io_test::read_file(dir / "all.safetensors") == bytes);
  CHECK(dir.files() == std::vector<std::string>{"all.safetensors"});
  const auto f = safetensors_file::open(dir / "all.safetensors");
  for (const auto& t : tensors) {
    const auto* e = f.find(t.name);
    REQUIRE(e != nullptr);
    const auto d = f.data(*e);
    CHECK(std::equal(d.begin(), d.end(), t.data.begin(), t.data.end()));
  }
  CHECK(f.find("missing") == nullptr);
}

TEST_CASE("metadata is written first and read back; an empty map differs from none") {
  const auto d = io_test::random_bytes(8, 3);
  const std::vector<safetensors_tensor> t = {{"w", dtype::f16, {4}, d}};
  const safetensors_metadata m = {{"format", "pt"}, {"step", "1200"}, {"note", "\xc3\xa9t\xc3\xa9"}};
  const auto bytes = serialize_safetensors(t, m);
  const std::string json(reinterpret_cast<const char*>(bytes.data() + 8), 20);
  CHECK(json.rfind("{\"__metadata__\":{", 0) == 0);
  const auto h = parse_safetensors(bytes, "mem");
  REQUIRE(h.metadata().has_value());
  CHECK(*h.metadata() == m);
  const auto empty = parse_safetensors(serialize_safetensors(t, safetensors_metadata{}), "mem");
  REQUIRE(empty.metadata().has_value());
  CHECK(empty.metadata()->empty());
}

TEST_CASE("tensors may be listed in any order; the reader returns them in offset order") {
  const std::string json =
      R"({"c":{"dtype":"U8","shape":[1],"data_offsets":[6,7]},)"
      R"("__metadata__":{"a":"b"},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[2,6]},)"
      R"("b":{"data_offsets":[0,2],"shape":[1],"dtype":"BF16"}})";
  const auto f = file_of(json, 7);
  const auto h = parse_safetensors(f, "mem");
  REQUIRE(h.tensors().size() == 3);
  CHECK(h.tensors()[0].name == "b");
  CHECK(h.tensors()[1].name == "a");
  CHECK(h.tensors()[2].name == "c");
  CHECK(h.find("a")->type == dtype::f32);
  CHECK(h.metadata()->at("a") == "b");
  // Unpadded headers and headers padded with more spaces than needed are both valid.
  CHECK_NOTHROW((void)parse_safetensors(file_of(json, 7, false), "mem"));
  CHECK_NOTHROW((void)parse_safetensors(file_of(json + "        ", 7), "mem"));
  CHECK(parse_safetensors(file_of("{}", 0), "mem").tensors().empty());
}

TEST_CASE("every malformed file is refused with its code, naming file and tensor") {
  const auto code = [](const std::string& json, std::size_t buffer) {
    return parse_error(json, buffer).dcr_code();
  };
  const auto what = [](const std::string& json, std::size_t buffer) {
    return std::string(parse_error(json, buffer).what());
  };
  const std::string ok_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

  SUBCASE("file shorter than the length field") {
    const std::vector<std::byte> f(5);
    const auto e = thrown_error([&] { (void)parse_safetensors(f, "short.safetensors"); });
    CHECK(e.dcr_code() == errc::truncated_payload);
    CHECK(std::string(e.what()).find("short.safetensors") != std::string::npos);
  }
  SUBCASE("header length beyond the limit or beyond the file") {
    auto f = file_of("{}", 0);
    dcr::detail::store_le<std::uint64_t>(f.data(), safetensors_max_header_size + 1);
    CHECK(thrown_error([&] { (void)parse_safetensors(f, "x"); }).dcr_code() == errc::overflow);
    dcr::detail::store_le<std::uint64_t>(f.data(), f.size() - 7);
    CHECK(thrown_error([&] { (void)parse_safetensors(f, "x"); }).dcr_code() ==
          errc::truncated_payload);
    dcr::detail::store_le<std::uint64_t>(f.data(), ~std::uint64_t{0});
    CHECK(thrown_error([&] { (void)parse_safetensors(f, "x"); }).dcr_code() == errc::overflow);
  }
  SUBCASE("not JSON, not an object, trailing garbage, bad UTF-8") {
    CHECK(code(" {}", 0) == errc::corrupt_payload);
    CHECK(code("[]", 0) == errc::corrupt_payload);
    CHECK(code("{\"a\":", 0) == errc::corrupt_payload);
    CHECK(code("{} x", 0) == errc::corrupt_payload);
    CHECK(code("{\"\xff\":{}}", 0) == errc::corrupt_payload);
    CHECK(what("{\"a\":", 0).find("t.safetensors: the JSON header is malformed") !=
          std::string::npos);
  }
  SUBCASE("duplicate keys") {
    CHECK(what("{" + ok_a + "," + ok_a + "}", 8).find("'a' twice") != std::string::npos);
    CHECK(code(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8) ==
          errc::corrupt_payload);
    CHECK(code(R"({"__metadata__":{"k":"1","k":"2"}})", 0) == errc::corrupt_payload);
  }
  SUBCASE("entry fields") {
    CHECK(what(R"({"a":[1]})", 0).find("tensor 'a': entry is not an object") !=
          std::string::npos);
    CHECK(code(R"({"a":{"dtype":"F32","shape":[2]}})", 8) == errc::corrupt_payload);
    CHECK(what(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8)
              .find("unknown field 'x'") != std::string::npos);
    CHECK(code(R"({"":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", 0) ==
          errc::corrupt_payload);
  }
  SUBCASE("dtype") {
    CHECK(code(R"({"a":{"dtype":3,"shape":[2],"data_offsets":[0,8]}})", 8) ==
          errc::corrupt_payload);
    const auto e = parse_error(R"({"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", 8);
    CHECK(e.dcr_code() == errc::unsupported_version);
    CHECK(std::string(e.what()).find("tensor 'a': unknown dtype 'C64'") != std::string::npos);
  }
  SUBCASE("shape") {
    CHECK(code(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8) ==
          errc::corrupt_payload);
    CHECK(code(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8) ==
          errc::corrupt_payload);
    CHECK(code(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8) ==
          errc::corrupt_payload);
    CHECK(code(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
               8) == errc::overflow);
    // A zero extent makes any product empty, however large the others.
    const auto zero = file_of(
        R"({"a":{"dtype":"F32","shape":[4294967296,0,4294967296],"data_offsets":[0,0]}})", 0);
    CHECK(parse_safetensors(zero, "x").tensors()[0].numel() == 0);
  }
  SUBCASE("data offsets") {
    CHECK(code(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8) ==
          errc::corrupt_payload);
    CHECK(code(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", 8) ==
          errc::corrupt_payload);
    CHECK(code(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8) ==
          errc::corrupt_payload);
    const auto beyond = parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4);
    CHECK(beyond.dcr_code() == errc::truncated_payload);
    const auto size = parse_error(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
    CHECK(size.dcr_code() == errc::shape_mismatch);
    CHECK(std::string(size.what()).find("tensor 'a': 8 bytes, but 3 elements of F32 take 12") !=
          std::string::npos);
  }
  SUBCASE("layout: overlaps, holes and trailing bytes") {
    const auto overlap = parse_error(
        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
        8);
    CHECK(overlap.dcr_code() == errc::corrupt_payload);
    CHECK(std::string(overlap.what()).find("overlaps") != std::string::npos);
    const auto hole = parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
    CHECK(hole.dcr_code() == errc::corrupt_payload);
    CHECK(std::string(hole.what()).find("belong to no tensor") != std::string::npos);
    CHECK(code("{" + ok_a + "}", 9) == errc::corrupt_payload);
  }
  SUBCASE("metadata") {
    CHECK(code(R"({"__metadata__":[1]})", 0) == errc::corrupt_payload);
    CHECK(what(R"({"__metadata__":{"k":1}})", 0).find("value of 'k' is not a string") !=
          std::string::npos);
  }
}

TEST_CASE("the writer refuses what it cannot write, and writes nothing") {
  const auto d = io_test::random_bytes(8, 1);
  io_test::scratch_dir dir;
  const std::vector<safetensors_tensor> dup = {{"a", dtype::u8, {8}, d}, {"a", dtype::u8, {8}, d}};
  CHECK(thrown_error([&] { write_safetensors(dir / "x.safetensors", dup); }).dcr_code() ==
        errc::invalid_argument);
  const std::vector<safetensors_tensor> size = {{"a", dtype::f32, {3}, d}};
  CHECK(thrown_error([&] { write_safetensors(dir / "x.safetensors", size); }).dcr_code() ==
        errc::shape_mismatch);
  const std::vector<safetensors_tensor> meta = {{"__metadata__", dtype::u8, {8}, d}};
  CHECK(thrown_error([&] { write_safetensors(dir / "x.safetensors", meta); }).dcr_code() ==
        errc::invalid_argument);
  const std::vector<safetensors_tensor> utf = {{"\xff", dtype::u8, {8}, d}};
  CHECK(thrown_error([&] { (void)serialize_safetensors(utf); }).dcr_code() ==
        errc::invalid_argument);
  const std::vector<safetensors_tensor> huge = {
      {"a", dtype::u8, {std::int64_t{1} << 32, std::int64_t{1} << 32}, {}}};
  const auto overflow = thrown_error([&] { write_safetensors(dir / "x.safetensors", huge); });
  CHECK(overflow.dcr_code() == errc::overflow);
  CHECK(std::string(overflow.what()).find("'a'") != std::string::npos);
  CHECK(dir.files().empty());
  CHECK(thrown_error([&] { (void)safetensors_file::open(dir / "missing.safetensors"); })
            .dcr_code() == errc::io_error);
}

TEST_CASE("bytes after a NUL in the header are refused: only trailing spaces pad a header") {
  const std::string ok = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  // The parser would stop at the NUL and never see what follows it.
  for (const std::string& json : {ok + std::string("\0garbage", 8), ok + std::string(7, '\0'),
                                  ok + std::string("  \0     ", 8),
                                  std::string("{\0\"a\":1}", 8)}) {
    const auto e = parse_error(json, 1);
    CHECK(e.dcr_code() == errc::corrupt_payload);
    CHECK(std::string(e.what()).find("t.safetensors: NUL byte at byte ") != std::string::npos);
    CHECK(std::string(e.what()).find("padded only with trailing spaces") != std::string::npos);
  }
  CHECK_NOTHROW((void)parse_safetensors(file_of(ok + "       ", 1, false), "t.safetensors"));
}

TEST_CASE("a file that is not safetensors, or is truncated, says so") {
  const auto d = io_test::random_bytes(64, 5);
  const std::vector<safetensors_tensor> t = {{"w", dtype::f32, {16}, d}};
  const auto good = serialize_safetensors(t);
  const auto message = [](std::span<const std::byte> f) {
    return std::string(thrown_error([&] { (void)parse_safetensors(f, "x.bin"); }).what());
  };
  SUBCASE("a dcr delta file (or any other file) passed as a checkpoint") {
    std::vector<std::byte> delta(200, std::byte{0});
    std::memcpy(delta.data(), "DCRDELTA", 8);
    const auto e = thrown_error([&] { (void)parse_safetensors(delta, "x.bin"); });
    CHECK(e.dcr_code() == errc::overflow);
    const std::string what = e.what();
    CHECK(what.find("x.bin is not a safetensors file: its first 8 bytes \"DCRDELTA\"") !=
          std::string::npos);
    std::vector<std::byte> text(100, std::byte{' '});
    dcr::detail::store_le<std::uint64_t>(text.data(), 8);  // a small length, then no JSON
    CHECK(message(text).find("x.bin is not a safetensors file: its JSON header does not start") !=
          std::string::npos);
    CHECK(message(std::span(good).first(5)).find("x.bin is not a safetensors file: 5 bytes") !=
          std::string::npos);
  }
  SUBCASE("truncated in the data or in the header") {
    const auto n = dcr::detail::load_le<std::uint64_t>(good.data());
    const auto e = thrown_error([&] { (void)parse_safetensors(std::span(good).first(good.size() - 10), "x.bin"); });
    CHECK(e.dcr_code() == errc::truncated_payload);
    CHECK(std::string(e.what()).find("x.bin is truncated: its header says 64 bytes of tensor "
                                     "data follow the " + std::to_string(8 + n) +
                                     "-byte header, the file has 54") != std::string::npos);
    const auto in_header = message(std::span(good).first(8 + n / 2));
    CHECK(in_header.find("x.bin is truncated: its header length says " + std::to_string(n) +
                         " bytes of JSON, the file has " + std::to_string(n / 2)) !=
          std::string::npos);
    CHECK(message(std::span(good).first(8 + n)).find("x.bin is truncated") != std::string::npos);
  }
}
