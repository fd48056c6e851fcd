// tools/dcr/simulate_agent_receiver.cpp: the receiver process of `dcr simulate` over the control
// plane the settings name (simulate_agent_receiver.hpp has the process itself).
#include "simulate_agent_receiver.hpp"

namespace dcr_tool {

int run_receiver(const simulate_settings& s) {
  return with_plane(s, [&](auto& plane, const dcr::protocol_keys& keys) {
    return run_receiver_over(s, plane, keys);
  });
}

}  // namespace dcr_tool
