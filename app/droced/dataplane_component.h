// The dataplane as one more droced Component: EAL (config + command line
// arguments), the [[port]]s, the [[core]]s, a lib/engine Dataplane over them,
// and the control commands `qps`, `mrs`, `arp`, `dcqcn get`, `dcqcn set`. Fault settings reach the
// cores' injectors through DaemonContext::faults (`fault set` at run time).
#pragma once

#include <memory>
#include <vector>

#include "daemon.h"
#include "dpdk/eal.h"
#include "dpdk/port.h"
#include "engine/dataplane.h"

namespace droce::daemon {

class DataplaneComponent : public Component {
 public:
  // Registers the commands on control (which must not be started yet).
  DataplaneComponent(DaemonContext& ctx, ControlComponent& control);
  ~DataplaneComponent() override;
  std::string_view name() const override { return "dataplane"; }
  void start() override;
  void stop() noexcept override;
  engine::Dataplane* dataplane() noexcept { return dp_.get(); }

 private:
  control::json qps() const;
  control::json mrs() const;
  control::json arp() const;
  control::json dcqcn_get(const control::json& args) const;
  control::json dcqcn_set(const control::json& args);
  control::json cc_json(uint32_t port) const;
  // The "port" argument as an index; UINT32_MAX when absent and not required.
  uint32_t port_arg(const control::json& args, const char* cmd, bool required) const;
  engine::Dataplane& dp() const;

  DaemonContext& ctx_;
  std::unique_ptr<dpdk::Eal> eal_;
  std::vector<std::unique_ptr<dpdk::Port>> ports_;
  std::unique_ptr<engine::Dataplane> dp_;
};

}  // namespace droce::daemon
