// tools/dcr/main.cpp: the `dcr` command-line tool.
#include <fmt/core.h>

#include <exception>
#include <string>
#include <vector>

#include "args.hpp"
#include "checkpoint.hpp"
#include "dcr/error.hpp"
#include "simulate.hpp"

namespace {
constexpr const char* usage = R"(usage: dcr <command> [options]

commands:
  simulate    end-to-end refit of a synthetic MoE model, verified bit for bit each step
  diff        write a delta file between two safetensors checkpoints
  apply       apply a delta file to a checkpoint (to a new file or in place), verified
  inspect     validate a delta file and show its tensors, digests, payloads and items
  recover     finish an in-place apply that a crash interrupted

Run `dcr <command> --help` for a command's options.
)";
}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    fmt::print("{}", usage);
    return args.empty() ? 2 : 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  try {
    if (command == "simulate") return dcr_tool::simulate_main(args);
    if (command == "diff") return dcr_tool::diff_main(args);
    if (command == "apply") return dcr_tool::apply_main(args);
    if (command == "inspect") return dcr_tool::inspect_main(args);
    if (command == "recover") return dcr_tool::recover_main(args);
    fmt::print(stderr, "dcr: unknown command '{}'\n{}", command, usage);
    return 2;
  } catch (const dcr_tool::usage_error& e) {
    fmt::print(stderr, "dcr {}: {}\n(see `dcr {} --help`)\n", command, e.what(), command);
    return 2;
  } catch (const dcr::error& e) {
    fmt::print(stderr, "dcr {}: error [{}]: {}\n", command, e.code().message(), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dcr {}: {}\n", command, e.what());
    return 1;
  }
}
