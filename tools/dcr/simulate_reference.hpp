// tools/dcr/simulate_reference.hpp: `dcr simulate --reference`, the paper's baseline for a
// refit: the full checkpoint through object storage. Each trainer node uploads its share of the
// checkpoint (canonical tensors, tensor id mod trainer nodes, in objects of at most
// --bucket-mb) through its cross-cluster flow; once every upload is in, each rollout node
// downloads all of it through its own flow. Nodes run as threads of the parent, on flows of
// their own ("reference-trainer-node-N", "reference-rollout-node-N") shaped like the refit's.
#pragma once

#include <cstdint>

#include "simulate_processes.hpp"

namespace dcr_tool {

struct reference_result {
  double seconds = 0;           ///< first upload byte to the last download's end
  double upload_seconds = 0;    ///< until every trainer node's share is in
  double download_seconds = 0;  ///< from then until every rollout node holds the checkpoint
  std::uint64_t checkpoint_bytes = 0;
  std::uint64_t bytes_crossing = 0;  ///< uploads plus every rollout node's download
  double transport_seconds = 0;      ///< the busiest upload flow's plus the busiest download flow's booked time
};

/// Runs the reference once, at version `version` of the synthetic model, in the work directory
/// (its objects are removed afterwards). Every download is compared with the upload's bytes.
reference_result run_reference(const simulate_settings& s, std::uint64_t version);

}  // namespace dcr_tool
