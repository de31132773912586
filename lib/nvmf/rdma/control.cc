#include "nvmf/rdma/control.h"

#include <chrono>

namespace droce::nvmf::rdma {

namespace {

double us(uint64_t ns) { return static_cast<double>(ns) / 1e3; }

control::json queue_json(const QueueReport& q, bool histogram) {
  control::json j;
  j["loop"] = q.loop;
  j["qid"] = q.qid;
  j["cntlid"] = q.cntlid;
  j["state"] = q.closed ? "closed" : "live";
  j["peer"] = q.peer;
  j["qpn"] = q.qpn;
  j["depth"] = q.depth;
  j["commands"] = q.q.commands;
  j["bytes_in"] = q.q.bytes_in;
  j["bytes_out"] = q.q.bytes_out;
  j["errors"] = q.q.errors;
  j["file_commands"] = q.q.file_commands;
  j["short"] = q.q.short_capsules;
  j["overflow"] = q.q.overflow;
  j["bad_completions"] = q.q.bad_completions;
  j["recv_errors"] = q.recv_errors;
  j["post_errors"] = q.post_errors;
  j["wc_errors"] = q.wc_errors;
  const QueueLatency& l = q.q.latency;
  j["lat_n"] = l.count;
  j["mean_us"] = us(l.mean());
  j["p50_us"] = us(l.percentile(0.5));
  j["p99_us"] = us(l.percentile(0.99));
  j["p999_us"] = us(l.percentile(0.999));
  j["max_us"] = us(l.max_ns);
  if (histogram) {
    control::json h = control::json::array();
    for (size_t b = 0; b < QueueLatency::kBuckets; ++b)
      if (l.bucket[b]) h.push_back(control::json::array({QueueLatency::upper_edge(b), l.bucket[b]}));
    j["latency_hist"] = std::move(h);
  }
  return j;
}

}  // namespace

control::json snapshot_json(const RdmaTarget& t, bool histogram) {
  control::json out;
  const TargetCounters& c = t.counters();
  out["target"] = {{"connect_requests", c.connect_requests}, {"accepted", c.accepted},
                   {"rejected", c.rejected},                 {"rejected_private", c.rejected_private},
                   {"rejected_resources", c.rejected_resources}, {"disconnects_sent", c.disconnects_sent},
                   {"keep_alive_expired", c.keep_alive_expired}, {"queues_destroyed", c.queues_destroyed},
                   {"destroy_deferred", c.destroy_deferred},     {"live_queues", t.queues()},
                   {"loop_messages", c.loop_messages},           {"report_timeouts", c.report_timeouts},
                   {"threads", t.threaded() ? t.loops() : size_t{1}}};
  control::json loops = control::json::array();
  for (const LoopReport& l : t.loop_report()) {
    control::json j = {{"loop", l.loop},         {"tid", l.tid},             {"live_queues", l.live_queues},
                       {"commands", l.commands}, {"bytes_in", l.bytes_in}, {"bytes_out", l.bytes_out},
                       {"errors", l.errors},     {"file_commands", l.file_commands}};
    if (l.has_ring) {  // copied by the loop's own thread
      const IoRingCounters& rc = l.ring;
      j["ring_in_flight"] = l.ring_in_flight;
      j["ring_completed"] = rc.completed;
      j["ring_errors"] = rc.errors;
      j["ring_full"] = rc.ring_full;
      j["ring_orphaned"] = rc.orphaned;
    }
    loops.push_back(std::move(j));
  }
  out["loops"] = std::move(loops);
  control::json qs = control::json::array();
  for (const QueueReport& q : t.report()) qs.push_back(queue_json(q, histogram));
  out["queues"] = std::move(qs);
  return out;
}

ControlPort::ControlPort(const RdmaTarget& t, const std::string& path, int answer_timeout_ms)
    : t_(t), timeout_ms_(answer_timeout_ms) {
  control::ServerOptions so;
  so.path = path;
  server_ = std::make_unique<control::Server>(so);
  server_->add("nvmf",
               "NVMe-oF target counters: target, per core loop, per queue (commands, bytes, latency); "
               "args {\"histogram\": true} adds each queue's latency buckets",
               [this](const control::json& args) {
                 bool hist = false;
                 if (args.contains("histogram")) {
                   if (!args["histogram"].is_boolean()) throw control::CommandError("histogram: expected true or false");
                   hist = args["histogram"].get<bool>();
                 }
                 return ask(hist);
               });
  server_->start();
}

ControlPort::~ControlPort() { server_->stop(); }

control::json ControlPort::ask(bool histogram) {
  std::unique_lock lk(mu_);
  want_hist_.store(histogram, std::memory_order_relaxed);
  const uint64_t seq = asked_.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms_), [&] { return ready_seq_ >= seq; }))
    throw control::CommandError("the target's poll loop did not answer in " + std::to_string(timeout_ms_) + " ms");
  return answer_;
}

void ControlPort::serve() {
  const uint64_t seq = asked_.load(std::memory_order_acquire);
  control::json j = snapshot_json(t_, want_hist_.load(std::memory_order_relaxed));
  answered_ = seq;
  {
    std::lock_guard lk(mu_);
    answer_ = std::move(j);
    ready_seq_ = seq;
  }
  cv_.notify_all();
}

}  // namespace droce::nvmf::rdma
