// The shared-memory verbs shim as a droced Component: a ShimServer on the
// [shim] socket over EngineShimBackend (the real engine, one core per
// client) and EngineCmBackend (the RDMA CM: QP1 and a cm::Agent per port on
// its home core), and the control command `shim` (clients, objects, mapped
// bytes, data-path counters, per device the CM's counters under "cm"). Started after the dataplane, stopped before it: a
// stop destroys every client's objects on their cores while the loops run.
#pragma once

#include <memory>

#include "daemon.h"
#include "dataplane_component.h"
#include "shim/server.h"
#include "shim/engine/engine_backend.h"
#include "shim/engine/engine_cm.h"

namespace droce::daemon {

class ShimComponent : public Component {
 public:
  ShimComponent(DaemonContext& ctx, ControlComponent& control, DataplaneComponent& dp);
  ~ShimComponent() override;
  std::string_view name() const override { return "shim"; }
  void start() override;
  void stop() noexcept override;

 private:
  control::json status() const;
  control::json cm_status() const;

  DaemonContext& ctx_;
  DataplaneComponent& dpc_;
  std::unique_ptr<shim::EngineShimBackend> backend_;
  std::unique_ptr<shim::EngineCmBackend> cm_;
  std::unique_ptr<shim::ShimServer> server_;
};

}  // namespace droce::daemon
