// payload_ledger: each payload id is applied at most once per transition.
#include <doctest/doctest.h>

#include "dcr/apply/dedupe.hpp"

TEST_CASE("payload_ledger remembers applied ids for one transition") {
  dcr::payload_ledger ledger;
  ledger.reset_for(4, 5);
  CHECK(ledger.base_version() == 4);
  CHECK(ledger.target_version() == 5);
  const dcr::payload_id a{{4, 5, 0}, 1, 0}, b{{4, 5, 0}, 1, 1}, retry{{4, 5, 1}, 1, 0};
  CHECK_FALSE(ledger.seen(a));
  ledger.mark(a);
  CHECK(ledger.seen(a));
  CHECK_FALSE(ledger.seen(b));
  CHECK_FALSE(ledger.seen(retry));  // an overwrite retry is a distinct payload
  ledger.mark(b);
  ledger.mark(retry);
  CHECK(ledger.size() == 3);
  try {
    ledger.mark(a);
    FAIL("a payload was marked twice");
  } catch (const dcr::error& e) {
    CHECK(e.dcr_code() == dcr::errc::duplicate_payload);
  }
  ledger.reset_for(5, 6);
  CHECK(ledger.size() == 0);
  CHECK_FALSE(ledger.seen(a));
}
