// tools/dcr/simulate_agent_receiver_file.cpp: the receiver process over the file control plane,
// and run_receiver, which picks the plane the settings name (simulate_agent_receiver.hpp).
#include "simulate_agent_receiver.hpp"

namespace dcr_tool {

int run_receiver(const simulate_settings& s) {
  if (uses_etcd(s)) return run_receiver_etcd(s);
  dcr::file_control_plane plane(plane_dir(s));
  return run_receiver_over(s, plane, dcr::protocol_keys{});
}

}  // namespace dcr_tool
