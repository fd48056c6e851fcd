// tests/core/test_concepts.cpp: one rule for every opt-in tag (docs/overview.md, "Extension
// points"): a type joins a kind when its nested tag is the kind's tag or derives from it, and is
// refused when it names another kind's tag or none. Checked for each kind dcr lets users extend:
// mapping classes, value encodings, execution policies, control planes, payload stores and
// payload sources.
#include <doctest/doctest.h>

#include "dcr/codec/values.hpp"
#include "dcr/exec/policy.hpp"
#include "dcr/mapping/concept.hpp"
#include "dcr/mapping/replicated.hpp"
#include "dcr/protocol/control_plane.hpp"
#include "dcr/protocol/plane/memory_control_plane.hpp"
#include "dcr/protocol/payload_source.hpp"
#include "dcr/protocol/payload_store.hpp"

namespace {

// A refined tag of each kind, as a third-party library would declare its own.
struct my_mapping_tag : dcr::mapping_tag {};
struct my_encoding_tag : dcr::value_encoding_tag {};
struct my_policy_tag : dcr::exec::policy_tag {};
struct my_plane_tag : dcr::control_plane_tag {};
struct my_store_tag : dcr::payload_store_tag {};
struct my_source_tag : dcr::payload_source_tag {};

struct refined_mapping : dcr::replicated {
  using dcr::replicated::replicated;
  using mapping_concept = my_mapping_tag;
};
struct refined_encoding : dcr::overwrite_encoding {
  using encoding_concept = my_encoding_tag;
};
struct refined_policy : dcr::exec::cpu_policy {
  using policy_concept = my_policy_tag;
};
struct refined_plane : dcr::memory_control_plane {
  using control_plane_concept = my_plane_tag;
};
struct refined_store : dcr::memory_payload_store {
  using payload_store_concept = my_store_tag;
};
struct refined_source : dcr::store_source<dcr::memory_payload_store> {
  using dcr::store_source<dcr::memory_payload_store>::store_source;
  using payload_source_concept = my_source_tag;
};

// The same types naming the wrong kind's tag.
struct mistagged_mapping : dcr::replicated {
  using dcr::replicated::replicated;
  using mapping_concept = dcr::value_encoding_tag;
};
struct mistagged_policy : dcr::exec::cpu_policy {
  using policy_concept = dcr::mapping_tag;
};
struct mistagged_plane : dcr::memory_control_plane {
  using control_plane_concept = dcr::payload_source_tag;
};
struct mistagged_store : dcr::memory_payload_store {
  using payload_store_concept = dcr::control_plane_tag;
};

TEST_CASE("a refined tag joins its kind") {
  CHECK(dcr::index_mapping<refined_mapping>);
  CHECK(dcr::value_encoding<refined_encoding>);
  CHECK(dcr::exec::execution_policy<refined_policy>);
  CHECK(dcr::control_plane<refined_plane>);
  CHECK(dcr::payload_store<refined_store>);
  CHECK(dcr::payload_sink<refined_store>);  // a store is a sink, through its tag's base
  CHECK(dcr::payload_source<refined_source>);
}

TEST_CASE("the kinds' own types still join") {
  CHECK(dcr::index_mapping<dcr::replicated>);
  CHECK(dcr::value_encoding<dcr::overwrite_encoding>);
  CHECK(dcr::exec::execution_policy<dcr::exec::cpu_policy>);
  CHECK(dcr::control_plane<dcr::memory_control_plane>);
  CHECK(dcr::payload_store<dcr::memory_payload_store>);
  CHECK(dcr::payload_source<dcr::store_source<dcr::memory_payload_store>>);
}

TEST_CASE("another kind's tag is refused") {
  CHECK_FALSE(dcr::index_mapping<mistagged_mapping>);
  CHECK_FALSE(dcr::exec::execution_policy<mistagged_policy>);
  CHECK_FALSE(dcr::control_plane<mistagged_plane>);
  CHECK_FALSE(dcr::payload_store<mistagged_store>);
  CHECK_FALSE(dcr::payload_sink<mistagged_store>);
}

}  // namespace
