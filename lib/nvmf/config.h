// The [nvmf] section of droce-nvmf's config file (TOML, toml++): target
// limits, listen addresses, subsystems with host allow-lists and namespaces.
// Every key is typed and range-checked, unknown keys inside [nvmf] are
// errors; other top-level tables are left to their own parsers (the embedded
// node's). Errors throw NvmfConfigError naming the key:
//     nvmf config: nvmf.subsystem[0].namespace[1].size: 1000 is not a multiple of block_size 512
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "nvmf/controller.h"
#include "nvmf/namespace.h"

namespace droce::nvmf {

class NvmfConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct NamespaceSpec {
  NamespaceConfig ns;
  std::string backend = "ram";  // "ram" or "file"
  std::string path;             // file only
};

struct SubsystemSpec {
  std::string nqn;
  std::string serial;
  std::string model;            // empty: the target's
  bool allow_any_host = false;
  std::vector<std::string> hosts;
  std::vector<NamespaceSpec> namespaces;
};

struct NvmfConfig {
  TargetConfig target;               // traddr/ipv6 from listen[0]
  std::vector<std::string> listen;   // IPv4/IPv6 addresses
  uint16_t cores = 1;                // core loops (1..16): the port's RX/TX queues
  std::vector<SubsystemSpec> subsystems;
};

// Parses TOML text (source names it in messages). Throws NvmfConfigError.
// default_listen: the addresses when the file has no `listen` key (droce-nvmf
// gives its --ip addresses); empty: `listen` is required.
NvmfConfig parse_nvmf_config(std::string_view text, std::string_view source = "<string>",
                             const std::vector<std::string>& default_listen = {});
// Sizes: an integer (bytes) or a string "N", "NKiB", "NMiB", "NGiB", "NTiB".
// False on anything else or on overflow.
bool parse_size(std::string_view s, uint64_t& bytes) noexcept;
// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (hex, any case).
bool parse_uuid(std::string_view s, std::array<uint8_t, 16>& out) noexcept;
// Creates the subsystems and their namespaces in t: RAM disks, and files or
// block devices opened (created when absent and a size is given). Throws
// NvmfConfigError naming the namespace when a file cannot be used.
void build_target(const NvmfConfig& c, Target& t);

}  // namespace droce::nvmf
