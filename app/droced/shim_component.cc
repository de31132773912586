#include "shim_component.h"

#include <spdlog/spdlog.h>

#include <arpa/inet.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace droce::daemon {

using control::json;

ShimComponent::ShimComponent(DaemonContext& ctx, ControlComponent& control, DataplaneComponent& dp)
    : ctx_(ctx), dpc_(dp) {
  control.server().add("shim", "verbs shim: clients, objects, shared memory, data-path counters",
                       [this](const json&) { return status(); });
  control.server().add("cm",
                       "RDMA CM: each device's connections and listeners (state, service, addresses, QPNs, retries) "
                       "and counters; the shim's CM ids, channels and events",
                       [this](const json&) { return cm_status(); });
}

ShimComponent::~ShimComponent() { stop(); }

void ShimComponent::start() {
  engine::Dataplane* dp = dpc_.dataplane();
  if (!dp) throw std::runtime_error("shim: the dataplane is not running");
  backend_ = std::make_unique<shim::EngineShimBackend>(*dp, ctx_.cfg);
  backend_->start();
  shim::ShimServerConfig sc;
  sc.socket_path = ctx_.cfg.shim.socket;
  sc.socket_mode = ctx_.cfg.shim.mode;
  sc.max_clients = ctx_.cfg.shim.max_clients;
  const config::ShimConfig& q = ctx_.cfg.shim;
  sc.max_qps_per_client = q.max_qps_per_client;
  sc.max_cqs_per_client = q.max_cqs_per_client;
  sc.max_srqs_per_client = q.max_srqs_per_client;
  sc.max_mrs_per_client = q.max_mrs_per_client;
  sc.max_ahs_per_client = q.max_ahs_per_client;
  sc.max_mr_bytes_per_client = q.max_mr_mb_per_client << 20;
  sc.resolve_timeout_ms = q.resolve_timeout_ms;
  // The RDMA CM: QP1 and a cm::Agent per port on its home core.
  cm_ = std::make_unique<shim::EngineCmBackend>(*dp, ctx_.cfg);
  server_ = std::make_unique<shim::ShimServer>(*backend_, sc, cm_.get());
  if (int rc = server_->listen()) {
    server_.reset();
    cm_.reset();
    backend_.reset();
    throw std::runtime_error("shim: cannot listen on " + sc.socket_path + ": " + std::strerror(-rc));
  }
  if (int rc = server_->start()) {
    server_.reset();
    cm_.reset();
    backend_.reset();
    throw std::runtime_error(std::string("shim: cannot start the server thread: ") + std::strerror(-rc));
  }
  spdlog::info("shim: verbs socket {} (clients set DROCE_SOCKET={})", sc.socket_path, sc.socket_path);
}

void ShimComponent::stop() noexcept {
  if (server_) {
    server_->stop();
    server_.reset();  // destroys every client's objects (on their cores), unlinks the socket
  }
  cm_.reset();  // each port's agent (REJ/DREQ for what is left) and QP1, on their home cores
  if (backend_) {
    backend_->stop();
    backend_.reset();
  }
}

json ShimComponent::status() const {
  if (!server_ || !backend_) throw control::CommandError("the shim is not running");
  const shim::ShimServerStats s = server_->stats();
  json objs = json::object();
  for (int k = 0; k < static_cast<int>(shim::ObjKind::Count_); ++k)
    objs[shim::obj_kind_name(static_cast<shim::ObjKind>(k))] = s.objects[k];
  const shim::ShimBackendStats b = backend_->stats();
  json cm = json::object();  // per device: the agent's and QP1's counters
  for (uint32_t d = 0; d < backend_->device_count(); ++d) {
    std::vector<std::pair<std::string, uint64_t>> ctr;
    if (cm_ && cm_->counters(d, ctr) == 0) {
      json c = json::object();
      for (auto& [k, v] : ctr) c[k] = v;
      c["mr_key"] = cm_->mr_key(d);  // QP1's MAD buffers (droce-ctl mrs)
      cm["droce" + std::to_string(d)] = c;
    }
  }
  return json{{"socket", server_->socket_path()},
              {"clients", s.clients},
              {"clients_total", s.clients_total},
              {"requests", s.requests},
              {"errors", s.errors},
              {"dropped", s.dropped},
              {"objects", objs},
              {"mapped_bytes", s.mapped_bytes},
              {"quota_refused", s.quota_refused},
              {"parked", s.parked},
              {"parked_now", s.parked_now},
              {"sq_wqes", b.sq_wqes},
              {"rq_wqes", b.rq_wqes},
              {"cqes", b.cqes},
              {"bad_wqes", b.bad_wqes},
              {"corrupt_rings", b.corrupt_rings},
              {"events", b.events},
              {"async_events", b.async_events},
              {"ring_visits", b.ring_visits},
              {"doorbells", b.doorbells},
              {"ring_parks", b.parks},
              {"cm_ids", s.cm_ids},
              {"cm_channels", s.cm_channels},
              {"cm_events", s.cm_events},
              {"cm_events_dropped", s.cm_events_dropped},
              {"cm", cm}};
}

namespace {
// "10.0.0.1:7174" (IPv4-mapped GIDs) or "[fe80::1]:7174".
std::string endpoint(const cm::Endpoint& e) {
  char ip[INET6_ADDRSTRLEN] = "";
  char out[INET6_ADDRSTRLEN + 10];
  if (wire::gid_is_ipv4_mapped(e.ip)) {
    inet_ntop(AF_INET, e.ip.data() + 12, ip, sizeof(ip));
    std::snprintf(out, sizeof(out), "%s:%u", ip, e.port);
  } else {
    inet_ntop(AF_INET6, e.ip.data(), ip, sizeof(ip));
    std::snprintf(out, sizeof(out), "[%s]:%u", ip, e.port);
  }
  return out;
}
const char* kind_name(cm::QpKind k) { return k == cm::QpKind::Rc ? "rc" : k == cm::QpKind::Uc ? "uc" : "ud"; }
}  // namespace

json ShimComponent::cm_status() const {
  if (!server_ || !backend_ || !cm_) throw control::CommandError("the shim is not running");
  const shim::ShimServerStats s = server_->stats();
  json devs = json::object();
  for (uint32_t d = 0; d < backend_->device_count(); ++d) {
    std::vector<cm::ConnInfo> conns;
    std::vector<std::pair<std::string, uint64_t>> ctr;
    if (cm_->connections(d, conns) != 0 || cm_->counters(d, ctr) != 0) continue;
    json list = json::array();
    for (const cm::ConnInfo& c : conns) {
      char sid[24];
      std::snprintf(sid, sizeof(sid), "0x%llx", static_cast<unsigned long long>(c.service_id));
      list.push_back(json{{"id", c.id},
                          {"state", cm::state_name(c.state)},
                          {"kind", kind_name(c.kind)},
                          {"service_id", sid},
                          {"passive", c.passive},
                          {"local", endpoint(c.local)},
                          {"remote", c.state == cm::ConnState::Listen ? std::string() : endpoint(c.remote)},
                          {"local_qpn", c.local_qpn},
                          {"remote_qpn", c.remote_qpn},
                          {"remote_comm_id", c.remote_comm_id},
                          {"retries", c.retries}});
    }
    json counters = json::object();
    for (auto& [k, v] : ctr) counters[k] = v;
    devs["droce" + std::to_string(d)] = json{{"connections", list}, {"counters", counters}};
  }
  return json{{"ids", s.cm_ids},
              {"channels", s.cm_channels},
              {"listeners", s.cm_listeners},
              {"bindings", s.cm_bindings},
              {"resolving", s.cm_resolving},
              {"events", s.cm_events},
              {"events_dropped", s.cm_events_dropped},
              {"devices", devs}};
}

}  // namespace droce::daemon
