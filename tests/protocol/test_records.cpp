// The records' JSON (dcr/protocol/records.hpp): the owner's figures, listed once in
// DCR_OWNER_STATS_FIELDS, reach the owner report and its JSON and are summed by the in-process
// driver, every one of them.
#include <doctest/doctest.h>

#include <string>

#include "dcr/protocol/in_process.hpp"
#include "dcr/protocol/records.hpp"

namespace {

// Distinct, non-zero values: the k-th figure gets k + offset.
dcr::owner_stats numbered_stats(int offset) {
  dcr::owner_stats s;
  int k = 0;
#define DCR_TEST_NUMBER(type, name) s.name = static_cast<type>(++k + offset);
  DCR_OWNER_STATS_FIELDS(DCR_TEST_NUMBER)
#undef DCR_TEST_NUMBER
  return s;
}

}  // namespace

TEST_CASE("owner_report: every owner figure survives its JSON, under its own name") {
  dcr::owner_report r;
  r.owner = 3;
  r.built = true;
  r.payloads = 7;
  r.stats = numbered_stats(100);
  const nlohmann::json j = r;
  int k = 0;
#define DCR_TEST_NAMED(type, name) CHECK(j.at("stats").at(#name).get<double>() == ++k + 100);
  DCR_OWNER_STATS_FIELDS(DCR_TEST_NAMED)
#undef DCR_TEST_NAMED
  const auto back = j.get<dcr::owner_report>();
  CHECK(back.stats == r.stats);
  CHECK(back.owner == 3);
  CHECK(back.payloads == 7);

  // A report written without the figures (or by an older agent) reads them as zero.
  nlohmann::json bare = j;
  bare.erase("stats");
  CHECK(bare.get<dcr::owner_report>().stats == dcr::owner_stats{});
  nlohmann::json partial = j;
  partial["stats"].erase("encode_seconds");
  const auto p = partial.get<dcr::owner_report>();
  CHECK(p.stats.encode_seconds == 0);
  CHECK(p.stats.compared_bytes == r.stats.compared_bytes);
}

TEST_CASE("owner_stats +=: sums every figure") {
  dcr::owner_stats sum = numbered_stats(0);
  sum += numbered_stats(10);
  int k = 0;
#define DCR_TEST_SUM(type, name) ++k; CHECK(sum.name == static_cast<type>(2 * k + 10));
  DCR_OWNER_STATS_FIELDS(DCR_TEST_SUM)
#undef DCR_TEST_SUM
}
