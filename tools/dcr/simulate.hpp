// tools/dcr/simulate.hpp: `dcr simulate`, the main job: an end-to-end refit of a synthetic MoE
// model from a sharded trainer to differently sharded receivers, several steps, each verified
// bit for bit against a dense refit through the same engine loader.
#pragma once

#include <string>
#include <vector>

namespace dcr_tool {

/// Runs `dcr simulate` with the arguments after the subcommand; returns the exit code.
int simulate_main(const std::vector<std::string>& args);

}  // namespace dcr_tool
