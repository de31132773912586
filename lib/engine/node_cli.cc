#include "engine/node_cli.h"

#include "engine/embed.h"

namespace droce::engine {

void add_node_options(CLI::App& app, std::string& device, std::vector<std::string>& ipv4, std::string& mac) {
  app.add_option("--device", device, "DPDK device of this node (e.g. net_af_packet0,iface=veth0)")->required();
  app.add_option("--ip", ipv4, "IPv4 address of this node (repeatable)")->required();
  app.add_option("--mac", mac, "MAC address for the port");
}

std::optional<int> parse_node_command_line(CLI::App& app, int argc, char** argv, std::vector<std::string>& eal) {
  const int own = split_eal_args(argc, argv, eal);
  try {
    app.parse(own, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return std::nullopt;
}

}  // namespace droce::engine
