// What droced implements for the RDMA CM ops of the shim protocol
// (protocol.h, Cm*): the per-port cm::Agent behind each client's CM ids.
// Control path. Every call runs on the ShimServer's thread and returns 0 or
// -errno; devices are the ShimBackend's device indexes. The ShimServer keeps
// the ids, channels, port bindings and event queues of each client (handles
// per connection) and calls these with the (dev, ConnId) of an id.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "cm/agent.h"
#include "wire/headers.h"

namespace droce::shim {

class CmBackend {
 public:
  virtual ~CmBackend() = default;

  // Events of every agent, called on any thread (the engine core running the
  // agent); the server queues them and wakes its own thread. Installed once,
  // before the first call below; events carry the cookie given at listen/connect.
  using Sink = std::function<void(uint32_t dev, const cm::Event&)>;
  virtual void cm_set_sink(Sink sink) = 0;

  // The device that owns local address ip. -EADDRNOTAVAIL.
  virtual int cm_local_dev(const wire::Gid& ip, uint32_t* dev) = 0;
  // The device to reach dst and our source address there (same family).
  // -ENETUNREACH.
  virtual int cm_route(const wire::Gid& dst, uint32_t* dev, wire::Gid* src) = 0;
  // One non-blocking step of resolving dst's MAC on dev: 0 (known),
  // -EINPROGRESS (asked; call again), -EHOSTUNREACH.
  virtual int cm_resolve(uint32_t dev, const wire::Gid& dst) = 0;
  // The GID index of our address ip on dev (ah_attr.grh.sgid_index). -ENOENT.
  virtual int cm_gid_index(uint32_t dev, const wire::Gid& ip) = 0;

  // cm::Agent's calls on dev's agent.
  virtual int cm_listen(uint32_t dev, cm::PortSpace ps, const cm::Endpoint& bound, cm::QpKind kind, uint64_t user,
                        cm::ConnId* out) = 0;
  virtual int cm_connect(uint32_t dev, const cm::ConnectArgs& a, uint64_t user, cm::ConnId* out) = 0;
  virtual int cm_accept(uint32_t dev, cm::ConnId id, const cm::ConnParam& p) = 0;
  virtual int cm_reject(uint32_t dev, cm::ConnId id, std::span<const uint8_t> private_data) = 0;
  virtual int cm_establish(uint32_t dev, cm::ConnId id) = 0;
  virtual int cm_disconnect(uint32_t dev, cm::ConnId id) = 0;
  virtual void cm_destroy(uint32_t dev, cm::ConnId id) = 0;
  virtual int cm_qp_params(uint32_t dev, cm::ConnId id, cm::QpParams* out) = 0;
  virtual int cm_set_user(uint32_t dev, cm::ConnId id, uint64_t user) = 0;
};

}  // namespace droce::shim
