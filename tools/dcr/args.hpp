// tools/dcr/args.hpp: a small command-line parser for the dcr subcommands: --name VALUE
// options, boolean flags, positionals, and a clear error for anything unknown or malformed.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace dcr_tool {

/// A command-line mistake; main() prints it with the usage hint and exits with status 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class arg_parser {
 public:
  explicit arg_parser(std::vector<std::string> args) : args_(std::move(args)), used_(args_.size()) {}

  /// Whether the flag is present (consumes it).
  bool flag(const std::string& name) {
    for (std::size_t i = 0; i < args_.size(); ++i)
      if (!used_[i] && args_[i] == name) {
        used_[i] = true;
        return true;
      }
    return false;
  }
  /// The value after `name` (or in `name=value`), or `fallback`.
  std::string value(const std::string& name, const std::string& fallback) {
    for (std::size_t i = 0; i < args_.size(); ++i) {
      if (used_[i]) continue;
      if (args_[i] == name) {
        if (i + 1 >= args_.size()) throw usage_error(name + " needs a value");
        used_[i] = used_[i + 1] = true;
        return args_[i + 1];
      }
      if (args_[i].rfind(name + "=", 0) == 0) {
        used_[i] = true;
        return args_[i].substr(name.size() + 1);
      }
    }
    return fallback;
  }
  std::int64_t integer(const std::string& name, std::int64_t fallback) {
    const std::string v = value(name, "");
    if (v.empty()) return fallback;
    std::size_t end = 0;
    std::int64_t x = 0;
    try {
      x = std::stoll(v, &end);
    } catch (const std::exception&) {
      end = 0;
    }
    if (end != v.size()) throw usage_error(name + ": '" + v + "' is not an integer");
    return x;
  }
  double real(const std::string& name, double fallback) {
    const std::string v = value(name, "");
    if (v.empty()) return fallback;
    std::size_t end = 0;
    double x = 0;
    try {
      x = std::stod(v, &end);
    } catch (const std::exception&) {
      end = 0;
    }
    if (end != v.size()) throw usage_error(name + ": '" + v + "' is not a number");
    return x;
  }
  /// Unconsumed arguments that do not start with '-', in order (consumes them).
  std::vector<std::string> positionals() {
    std::vector<std::string> p;
    for (std::size_t i = 0; i < args_.size(); ++i)
      if (!used_[i] && (args_[i].empty() || args_[i][0] != '-')) {
        used_[i] = true;
        p.push_back(args_[i]);
      }
    return p;
  }
  /// Throws usage_error for the first argument nothing consumed.
  void finish() const {
    for (std::size_t i = 0; i < args_.size(); ++i)
      if (!used_[i]) throw usage_error("unknown argument '" + args_[i] + "'");
  }

 private:
  std::vector<std::string> args_;
  std::vector<bool> used_;
};

/// Parses "1048576", "256K", "64M", "1G", "1GB" (powers of 1024).
inline std::uint64_t parse_size(const std::string& text) {
  std::size_t end = 0;
  double v = 0;
  try {
    v = std::stod(text, &end);
  } catch (const std::exception&) {
    throw usage_error("size '" + text + "' is not a number");
  }
  std::string unit = text.substr(end);
  if (unit.size() == 2 && (unit[1] == 'B' || unit[1] == 'b')) unit.pop_back();
  double scale = 1;
  if (unit == "K" || unit == "k") scale = 1024.0;
  else if (unit == "M" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) throw usage_error("size '" + text + "': unknown unit '" + unit + "'");
  if (v <= 0) throw usage_error("size '" + text + "' must be positive");
  return static_cast<std::uint64_t>(v * scale);
}

}  // namespace dcr_tool
