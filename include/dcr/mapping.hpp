// dcr/mapping.hpp: every mapping class, and `any_mapping`, the closed set a task may hold.
//
// Stages are templates over the mapping type; a model description holds tasks whose mapping is
// one of these, and the pipeline dispatches once per task (std::visit), never per element.
#pragma once

#include <variant>

#include "dcr/mapping/box.hpp"
#include "dcr/mapping/column_split.hpp"
#include "dcr/mapping/concept.hpp"
#include "dcr/mapping/replicated.hpp"
#include "dcr/mapping/row_split.hpp"
#include "dcr/mapping/stacked.hpp"

namespace dcr {

/// One of the built-in mapping classes.
using any_mapping = std::variant<replicated, row_split, column_split, stacked, box>;

/// Local element count of any mapping.
inline std::uint64_t local_size(const any_mapping& m) {
  return std::visit([](const auto& x) { return x.local_size(); }, m);
}

}  // namespace dcr
