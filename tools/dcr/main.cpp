// tools/dcr/main.cpp: the `dcr` command-line tool.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include "args.hpp"
#include "checkpoint.hpp"
#include "dcr/version.hpp"
#include "dcr/error.hpp"
#include "dcr/error_text.hpp"
#include "dcr/io/checkpoint.hpp"
#include "simulate.hpp"

namespace {
constexpr const char* usage = R"(usage: dcr <command> [options]

commands:
  simulate    end-to-end refit of a synthetic MoE model, verified bit for bit each step
  diff        write a delta file between two safetensors checkpoints
  apply       apply a delta file to a checkpoint (to a new file or in place), verified
  inspect     validate a delta file and show its tensors, digests, payloads and items
  recover     finish an in-place apply that a crash interrupted

Run `dcr <command> --help` for a command's options, `dcr --version` for the version.
Exit status: 0 success, 2 usage, 4 wrong base, 5 corrupt delta, 6 bad input file, 7 I/O error,
8 unfinished or concurrent in-place apply, 1 any other error (docs/tool.md).
)";

// The exit status of each class of error (docs/tool.md, "Exit status and errors").
enum exit_status : int {
  exit_error = 1,          // any other error (e.g. a result that does not verify)
  exit_usage = 2,          // a command-line mistake
  exit_wrong_base = 4,     // BASE is not the delta's base
  exit_corrupt_delta = 5,  // the delta file is damaged or malformed
  exit_bad_input = 6,      // a checkpoint is malformed, or OLD and NEW do not match
  exit_io = 7,             // a file could not be read, written or renamed
  exit_not_ready = 8,      // an unfinished in-place apply, or (--no-wait) another one working
};

struct error_class {
  int status;
  const char* name;
};

error_class classify(const dcr::error& e) {
  if (e.dcr_code() == dcr::errc::io_error) return {exit_io, "io_error"};
  if (e.dcr_code() == dcr::errc::not_ready) return {exit_not_ready, "not_ready"};
  if (const auto* in = dynamic_cast<const dcr::io::input_error*>(&e)) {
    switch (in->fault()) {
      case dcr::io::input_fault::delta: return {exit_corrupt_delta, "corrupt_delta"};
      case dcr::io::input_fault::checkpoint: return {exit_bad_input, "bad_input"};
      case dcr::io::input_fault::wrong_base: return {exit_wrong_base, "wrong_base"};
    }
  }
  return {exit_error, "error"};
}

// With --json, an error is also a JSON object on stdout.
void print_json_error(const std::string& command, const error_class& c, const std::string& message,
                      const dcr::error* e) {
  nlohmann::ordered_json j;
  j["error"] = {{"command", command}, {"class", c.name}, {"status", c.status},
                {"message", message}};
  if (e != nullptr) {
    j["error"]["code"] = e->code().value();
    j["error"]["code_message"] = e->code().message();
  }
  fmt::print("{}\n", j.dump(2));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    fmt::print("{}", usage);
    return args.empty() ? exit_usage : 0;
  }
  if (args[0] == "--version" || args[0] == "-V") {
    fmt::print("dcr {}\n", DCR_VERSION_STRING);
    return 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  // simulate prints its own JSON report and errors.
  const bool json = command != "simulate" && std::find(args.begin(), args.end(), "--json") != args.end();
  try {
    if (command == "simulate") return dcr_tool::simulate_main(args);
    if (command == "diff") return dcr_tool::diff_main(args);
    if (command == "apply") return dcr_tool::apply_main(args);
    if (command == "inspect") return dcr_tool::inspect_main(args);
    if (command == "recover") return dcr_tool::recover_main(args);
    fmt::print(stderr, "dcr: unknown command '{}'\n{}", command, usage);
    return exit_usage;
  } catch (const dcr_tool::usage_error& e) {
    fmt::print(stderr, "dcr {}: {}\n(see `dcr {} --help`)\n", command, e.what(), command);
    if (json) print_json_error(command, {exit_usage, "usage"}, e.what(), nullptr);
    return exit_usage;
  } catch (const dcr::error& e) {
    const auto c = classify(e);
    fmt::print(stderr, "dcr {}: error [{}]: {}\n", command, e.code().message(), dcr::error_text(e));
    if (json) print_json_error(command, c, dcr::error_text(e), &e);
    return c.status;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dcr {}: {}\n", command, e.what());
    if (json) print_json_error(command, {exit_error, "error"}, e.what(), nullptr);
    return exit_error;
  }
}
