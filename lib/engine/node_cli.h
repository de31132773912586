// The command line shared by the programs that run one embedded node
// (app/droce-perf, app/droce-interop): "PROGRAM [options] -- [EAL args]",
// with the node's address options spelled the same in each. CLI11; kept out
// of embed.h so that the embedding API does not need CLI11.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

namespace droce::engine {

// Adds the node's options to app: --device (the DPDK device, required),
// --ip (an IPv4 address of the node, required, repeatable) and --mac (the
// port's MAC; not given: the port's own). Their values go to node_options().
void add_node_options(CLI::App& app, std::string& device, std::vector<std::string>& ipv4, std::string& mac);

// Parses argv: what follows the first "--" is appended to eal
// (split_eal_args), the rest goes to app. Returns nullopt when the program is
// to go on, else the exit status it is to return: 0 after --help, CLI11's
// error status after a usage error (both printed by CLI11).
std::optional<int> parse_node_command_line(CLI::App& app, int argc, char** argv, std::vector<std::string>& eal);

}  // namespace droce::engine
