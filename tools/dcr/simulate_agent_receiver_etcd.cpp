// tools/dcr/simulate_agent_receiver_etcd.cpp: the receiver process over the etcd control plane
// (simulate_agent_receiver.hpp; run_receiver in simulate_agent_receiver_file.cpp calls it).
#include "simulate_agent_receiver.hpp"

namespace dcr_tool {

int run_receiver_etcd(const simulate_settings& s) {
  const auto address = dcr::etcd_control_plane::parse_address(s.commit);
  dcr::etcd_control_plane plane(address.endpoint, address.options);
  return run_receiver_over(s, plane, dcr::protocol_keys{address.key_prefix});
}

}  // namespace dcr_tool
