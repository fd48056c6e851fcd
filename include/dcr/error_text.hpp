// dcr/error_text.hpp: a dcr::error's message without the code's message.
//
// std::system_error's what() is "<message>: <code message>". Code that prints the code itself
// ("error [<code message>]: ...") or wraps the message in another dcr::error of the same code
// would repeat it; error_text gives the message alone.
#pragma once

#include <string>

#include "dcr/error.hpp"

namespace dcr {

/// The message `e` was constructed with: what() less the ": <code message>" suffix.
[[nodiscard]] inline std::string error_text(const error& e) {
  std::string m = e.what();
  const std::string suffix = ": " + e.code().message();
  if (m.size() >= suffix.size() && m.compare(m.size() - suffix.size(), suffix.size(), suffix) == 0)
    m.resize(m.size() - suffix.size());
  return m;
}

}  // namespace dcr
