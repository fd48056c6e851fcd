// tools/dcr/checkpoint.hpp: the whole-checkpoint commands `dcr diff`, `dcr apply`, `dcr inspect`
// and `dcr recover` (docs/tool.md), on safetensors files and on sharded checkpoint directories.
// They parse arguments and print; the work is in include/dcr/io/checkpoint.hpp and
// include/dcr/io/sharded_checkpoint.hpp.
#pragma once

#include <string>
#include <vector>

namespace dcr_tool {

/// `dcr diff OLD NEW -o DELTA [--encoding E] [--level N] [--payload-records N] [--json] [--quiet]`
int diff_main(const std::vector<std::string>& args);
/// `dcr apply DELTA BASE (-o OUT | --in-place) [--no-wait] [--json]`
int apply_main(const std::vector<std::string>& args);
/// `dcr inspect DELTA [--json]` (also reads in-place journals)
int inspect_main(const std::vector<std::string>& args);
/// `dcr recover BASE [--no-wait] [--json]`
int recover_main(const std::vector<std::string>& args);

}  // namespace dcr_tool
