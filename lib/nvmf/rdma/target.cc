#include "nvmf/rdma/target.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <system_error>

#include "netstack/gid_table.h"

namespace droce::nvmf::rdma {

namespace {

constexpr uint64_t kKeepAliveCheckNs = 100'000'000;
constexpr uint32_t kCqeStride = 16;

// Send-side work request id: the Queue's slot and the action kind.
constexpr uint64_t wr_id(uint16_t slot, Action::Kind k) noexcept { return uint64_t{slot} | (uint64_t{k} << 16); }

uint32_t os_tid() noexcept { return static_cast<uint32_t>(::gettid()); }

enum MsgKind : int { kAdopt, kRelease, kReport };

}  // namespace

// A report() request to a loop's thread: it fills `out` and sets done.
struct ReportReq {
  std::vector<QueueReport> out;
  LoopReport ring;  // has_ring, ring_in_flight, ring
  std::atomic<bool> done{false};
};

// One core loop of the target. `conns`, `closing` and everything of their
// queues are touched only by the thread that drives the loop; the box is the
// home loop's way in (threads mode): a mutex taken once per message, and
// an atomic count the loop reads once per pass.
struct RdmaTarget::Loop {
  std::vector<Conn*> conns;    // live queues of this loop (the home thread's conns_ owns them)
  std::vector<Conn*> closing;  // released, file commands still in the ring (threads mode, loop >= 1)
  struct Msg {
    int kind = 0;
    Conn* c = nullptr;
    std::shared_ptr<void> req;
  };
  std::mutex mu;
  std::vector<Msg> box, work;
  std::atomic<uint32_t> pending{0};
  std::atomic<uint32_t> tid{0};
  uint64_t poller = 0;  // its Dataplane poller (threads mode)
};

struct RdmaTarget::Conn {
  enum class State : uint8_t { WaitMac, Live, Closing };
  State state = State::WaitMac;
  cm::ConnId id = 0;
  CmRequest req;
  wire::Gid remote{};
  wire::MacAddr mac{};
  uint64_t mac_deadline = 0;
  uint16_t loop = 0;  // core loop of its QP, requests and IoRing (set when accepted)
  uint16_t depth = 0, slots = 0;
  uint32_t recv_size = 0;
  bool has_qp = false;
  engine::QpHandle qp;
  uint8_t* mem = nullptr;
  size_t mem_len = 0;
  uint32_t lkey = 0;
  uint8_t* recv_base = nullptr;
  uint8_t* cqe_base = nullptr;
  std::unique_ptr<Queue> q;
  // Set by the queue's loop after Connect, read by the home loop (keep alive).
  std::atomic<uint16_t> cntlid{0};
  bool failed = false;
  bool parked = false;  // gone from the CM, its file commands still in the IoRing (-> closing_)
  uint64_t recv_errors = 0, post_errors = 0, wc_errors = 0;
  uint32_t tid = 0;  // the thread that last received a capsule of it
  // Threads mode, a queue of loop >= 1: its loop asks the home loop to
  // disconnect it (failed); released: its loop has dropped the Queue (last
  // counters in `final`), the home loop destroys the rest.
  std::atomic<bool> close_req{false};
  std::atomic<bool> released{false};
  bool handed = false;  // its loop has it (adopt sent)
  QueueReport final;
};

RdmaTarget::RdmaTarget(engine::Embedded& node, Target& target, const RdmaOptions& o)
    : node_(node), target_(target), opt_(o) {
  const TargetConfig& tc = target_.config();
  limits_.max_qid = tc.max_io_queues;
  limits_.max_admin_depth = tc.admin_queue_depth;
  limits_.max_io_depth = tc.max_queue_depth;
  rings_.resize(std::max<size_t>(1, node_.loops()));
  for (size_t l = 0; l < rings_.size(); ++l) loops_.push_back(std::make_unique<Loop>());
  if (target_.has_file_namespace()) {
    try {
      for (auto& r : rings_) r = std::make_unique<IoRing>(opt_.ring_entries, opt_.file_timeout_ms);
    } catch (const std::system_error& e) {
      throw std::runtime_error(std::string("nvmf rdma: the target has a file namespace but io_uring is unavailable (") +
                               e.what() + "; kernel.io_uring_disabled, seccomp or an old kernel?)");
    }
  }
  pd_ = node_.alloc_pd();
  events_.reserve(64);
  work_.reserve(64);
  node_.set_cm_sink([this](const cm::Event& e) { events_.push_back(e); });
  cm::Agent& agent = node_.cm();
  std::vector<std::string> addrs = opt_.listen;
  const bool any = addrs.empty();
  if (any) addrs.push_back("");
  for (const auto& a : addrs) {
    cm::Endpoint ep;
    ep.port = opt_.port;
    if (!any) {
      auto g = netstack::parse_ip(a);
      if (!g) throw std::runtime_error("nvmf rdma: listen address " + a + " is not an IP address");
      if (node_.gids().index_of(*g) < 0) throw std::runtime_error("nvmf rdma: listen address " + a + " is not one of the node's");
      ep.ip = *g;
    }
    cm::ConnId id = 0;
    if (int rc = agent.listen(cm::PortSpace::Tcp, ep, cm::QpKind::Rc, 0, &id))
      throw std::runtime_error("nvmf rdma: cannot listen on " + (any ? std::string("*") : a) + ":" +
                               std::to_string(opt_.port) + ": " + std::strerror(rc));
    listeners_.push_back(id);
    listening_.push_back((any ? std::string("*") : a) + ":" + std::to_string(opt_.port));
  }
  if (opt_.threads && loops_.size() > 1) {
    // Each loop >= 1 runs its share as a poller of its core, on its thread.
    engine::Dataplane& dp = node_.dataplane();
    for (size_t l = 1; l < loops_.size(); ++l)
      loops_[l]->poller = dp.add_poller(dp.port_cores(0)[l], [this, l] { return poll_remote(l); });
    threaded_ = true;
    node_.start_loop_threads();
  }
}

RdmaTarget::~RdmaTarget() {
  if (threaded_) {
    // Back to one thread: every queue is the caller's again.
    node_.stop_loop_threads();
    engine::Dataplane& dp = node_.dataplane();
    for (size_t l = 1; l < loops_.size(); ++l) dp.remove_poller(dp.port_cores(0)[l], loops_[l]->poller);
    threaded_ = false;
  }
  for (auto& c : conns_) {
    if (c->id) node_.cm().destroy(c->id);
    destroy(*c);
  }
  conns_.clear();
  // Their file commands are cancelled and waited for by ~Queue (bounded):
  // teardown only; the loop itself never waits (poll() retires them).
  for (auto& c : closing_) destroy(*c);
  closing_.clear();
  for (cm::ConnId l : listeners_) node_.cm().destroy(l);
  node_.set_cm_sink({});
  // Memory the kernel may still write into stays allocated (to the process's end).
  for (const Kept& k : kept_)
    if (rings_[k.loop] && rings_[k.loop]->orphans() == 0) node_.free_dma(k.mem);
  kept_.clear();
}

size_t RdmaTarget::queues() const noexcept { return conns_.size() + closing_.size(); }

void RdmaTarget::reject(cm::ConnId id, CmStatus s) {
  std::array<uint8_t, kCmRejectSize> rej{};
  encode_cm_reject(rej, s);
  node_.cm().reject(id, rej);
  ++ctr_.rejected;
}

void RdmaTarget::on_connect_request(const cm::Event& e) {
  ++ctr_.connect_requests;
  CmRequest req;
  const CmStatus st =
      decode_cm_request(std::span<const uint8_t>(e.param.private_data, e.param.private_data_len), limits_, req);
  if (st != CmStatus::Ok) {
    ++ctr_.rejected_private;
    return reject(e.id, st);
  }
  auto c = std::make_unique<Conn>();
  c->id = e.id;
  c->req = req;
  c->remote = e.remote.ip;
  c->mac_deadline = node_.dataplane().clock().now_ns() + uint64_t{opt_.mac_wait_ms} * 1'000'000;
  conns_.push_back(std::move(c));
  Conn& cr = *conns_.back();
  if (!try_accept(cr) && cr.state != Conn::State::WaitMac) {
    conns_.pop_back();
  }
}

// WaitMac -> Live: the peer's MAC (without blocking the loop), memory, QP,
// receives, REP, RTR/RTS. False when it could not (still waiting for the
// MAC: state stays WaitMac; otherwise rejected and destroyed by the caller).
bool RdmaTarget::try_accept(Conn& c) {
  const uint64_t now = node_.dataplane().clock().now_ns();
  switch (node_.dataplane().resolve_step_st(0, c.remote, c.mac)) {
    case engine::Dataplane::ResolveStep::Ready:
      break;
    case engine::Dataplane::ResolveStep::Pending:
      if (now < c.mac_deadline) return false;
      [[fallthrough]];
    case engine::Dataplane::ResolveStep::Failed:
      c.state = Conn::State::Closing;
      ++ctr_.rejected_resources;
      reject(c.id, CmStatus::NoResources);
      return false;
  }
  const TargetConfig& tc = target_.config();
  c.depth = static_cast<uint16_t>(c.req.hsqsize + 1);
  c.slots = static_cast<uint16_t>(2 * c.depth);
  c.recv_size = kSqeSize + tc.in_capsule_data;
  const uint32_t slot_buffer = std::max({tc.max_transfer(), tc.in_capsule_data, 4096u});
  const size_t recv_len = size_t{c.depth} * c.recv_size;
  const size_t cqe_len = (size_t{c.slots} * kCqeStride + 63) & ~size_t{63};
  const size_t data_len = size_t{c.slots} * slot_buffer;
  auto fail = [&](const char*) {
    c.state = Conn::State::Closing;
    ++ctr_.rejected_resources;
    reject(c.id, CmStatus::NoResources);
    destroy(c);
    return false;
  };
  c.mem_len = recv_len + cqe_len + data_len;
  c.mem = static_cast<uint8_t*>(node_.alloc_dma(c.mem_len));
  if (!c.mem) return fail("no hugepage memory");
  if (node_.reg_mr(pd_, c.mem, c.mem_len, verbs::kAccessLocalWrite, &c.lkey)) {
    c.lkey = 0;
    return fail("reg_mr");
  }
  c.recv_base = c.mem;
  c.cqe_base = c.mem + recv_len;
  engine::QpOptions qo;
  qo.cap.max_send_wr = 2u * c.slots + 4;
  qo.cap.max_recv_wr = c.depth;
  qo.cap.max_send_sge = 1;
  qo.cap.max_recv_sge = 1;
  qo.cqe = qo.cap.max_send_wr + c.depth;
  c.loop = static_cast<uint16_t>(loop_of(c.req.qid, loops()));
  qo.loop = c.loop;
  try {
    c.qp = node_.create_qp(pd_, qo);
    c.has_qp = true;
  } catch (const std::exception&) {
    return fail("create_qp");
  }
  {
    // On the QP's loop (through its command ring when a thread drives it).
    auto rc = std::make_shared<int>(ETIMEDOUT);
    node_.dataplane().run_on(c.qp.core, [rc, eng = c.qp.eng, qpn = c.qp.qpn, base = c.recv_base, size = c.recv_size,
                                         lkey = c.lkey, depth = c.depth](engine::CoreLoop&) {
      for (uint16_t i = 0; i < depth; ++i) {
        verbs::RecvWr r;
        r.wr_id = i;
        r.num_sge = 1;
        r.sg_list[0] = {reinterpret_cast<uint64_t>(base + size_t{i} * size), size, lkey};
        if ((*rc = eng->post_recv(qpn, r)) != 0) return;
      }
      *rc = 0;
    });
    if (*rc) return fail("post_recv");
  }
  QueueConfig qc;
  qc.qid = c.req.qid;
  qc.depth = c.depth;
  qc.slots = c.slots;
  qc.slot_buffer = slot_buffer;
  qc.ring = c.req.qid != 0 ? rings_[c.loop].get() : nullptr;  // I/O queues: file namespaces through their loop's ring
  c.q = std::make_unique<Queue>(target_, qc, std::span<uint8_t>(c.mem + recv_len + cqe_len, data_len));

  cm::ConnParam p;
  encode_cm_accept(std::span<uint8_t, kCmAcceptSize>(p.private_data, kCmAcceptSize), c.depth);
  p.private_data_len = kCmAcceptSize;
  p.qpn = c.qp.qpn;
  p.initiator_depth = opt_.initiator_depth;
  p.responder_resources = 1;  // hosts do not read from a target; one resource answers a stray READ cleanly
  p.flow_control = 1;
  p.rnr_retry_count = 7;
  cm::Agent& agent = node_.cm();
  if (agent.accept(c.id, p)) return fail("accept");
  cm::QpParams qp{};
  // REP and RTR/RTS in one go, before the loop sends anything: the host's
  // first capsule finds the QP ready.
  if (agent.qp_params(c.id, qp) || node_.connect(c.qp, qp, c.mac)) {
    agent.destroy(c.id);
    c.state = Conn::State::Closing;
    ++ctr_.rejected_resources;
    destroy(c);
    return false;
  }
  c.state = Conn::State::Live;
  ++ctr_.accepted;
  home_adopt(c);
  return true;
}

void RdmaTarget::destroy(Conn& c) {
  home_drop(c);  // out of its loop's list (the home loop's; other loops have released it before)
  if (c.mem) {  // not yet reported: keep its last counters
    const bool have = c.q || c.released.load(std::memory_order_acquire);
    QueueReport r = c.q ? report_of(c) : c.final;
    r.closed = true;
    if (have) {
      if (closed_.size() >= 1024) closed_.erase(closed_.begin());  // a long run keeps the newest
      closed_.push_back(std::move(r));
    }
  }
  IoRing* ring = c.q && c.req.qid != 0 ? rings_[c.loop].get() : nullptr;
  const size_t orphans = ring ? ring->orphans() : 0;
  c.q.reset();  // admin queue: its controller goes; I/O queue: detached
  const bool keep = ring && ring->orphans() > orphans;  // the kernel may still write into c.mem
  if (c.has_qp) {
    node_.destroy_qp(c.qp);
    c.has_qp = false;
  }
  if (c.lkey) {
    node_.dereg_mr(c.lkey);
    c.lkey = 0;
  }
  if (c.mem) {
    if (keep) {
      kept_.push_back(Kept{c.mem, c.loop});
      ++ctr_.memory_kept;
    } else {
      node_.free_dma(c.mem);
    }
    c.mem = nullptr;
  }
  ++ctr_.queues_destroyed;
}

// A queue the CM is done with: destroyed now, or, while file commands of it
// are still in the IoRing (the kernel may write into its buffers), parked
// for closing_ and destroyed by a later poll once they are done.
bool RdmaTarget::release(Conn& c) {
  if (remote(c) && c.handed) {  // its loop drops the Queue, then the home loop the rest
    home_drop(c);
    c.parked = true;
    return false;
  }
  if (c.q && c.q->backend_busy() > 0) {
    home_drop(c);  // no longer polled: the closing sweep below retires it
    c.parked = true;
    ++ctr_.destroy_deferred;
    return false;
  }
  destroy(c);
  return true;
}

void RdmaTarget::sweep() {
  for (auto& c : conns_)
    if (c->id == 0 && c->parked) closing_.push_back(std::move(c));
  std::erase_if(conns_, [](const std::unique_ptr<Conn>& c) { return !c || c->id == 0; });
}

void RdmaTarget::disconnect(Conn& c) {
  if (c.state != Conn::State::Live) return;
  c.state = Conn::State::Closing;
  ++ctr_.disconnects_sent;
  if (node_.cm().disconnect(c.id)) {  // not established yet (REP sent, no RTU): REJ, gone now
    node_.cm().destroy(c.id);
    release(c);
    c.id = 0;
  }
}

void RdmaTarget::disconnect_all() {
  for (auto& c : conns_) {
    if (c->state == Conn::State::WaitMac) {
      reject(c->id, CmStatus::NoResources);
      c->state = Conn::State::Closing;
      c->id = 0;
    }
    disconnect(*c);
  }
  sweep();
}

void RdmaTarget::on_event(const cm::Event& e) {
  if (e.type == cm::EventType::ConnectRequest) return on_connect_request(e);
  auto it = std::find_if(conns_.begin(), conns_.end(), [&](const auto& c) { return c->id == e.id; });
  if (it == conns_.end()) return;
  switch (e.type) {
    case cm::EventType::Disconnected:
    case cm::EventType::Rejected:
    case cm::EventType::Unreachable:
      if (!release(**it)) closing_.push_back(std::move(*it));
      conns_.erase(it);
      break;
    default:
      break;
  }
}

uint32_t RdmaTarget::poll_queue(Conn& c, uint64_t now) {
  uint32_t work = 0;
  std::array<verbs::Wc, 32> wc;
  // Send side first: a SEND completion frees its slot before new capsules look for one.
  int n = c.qp.scq->poll(wc.data(), static_cast<int>(wc.size()));
  for (int i = 0; i < n; ++i) {
    const bool ok = wc[i].status == verbs::WcStatus::Success;
    if (!ok) ++c.wc_errors;
    c.q->on_complete(static_cast<uint16_t>(wc[i].wr_id & 0xffff), static_cast<Action::Kind>(wc[i].wr_id >> 16), ok,
                     now);
  }
  work += static_cast<uint32_t>(n);
  n = c.qp.rcq->poll(wc.data(), static_cast<int>(wc.size()));
  if (n > 0) c.tid = loops_[c.loop]->tid.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) {
    const uint64_t idx = wc[i].wr_id;
    if (wc[i].status != verbs::WcStatus::Success || idx >= c.depth) {
      ++c.recv_errors;
      c.failed = true;
      continue;
    }
    uint8_t* buf = c.recv_base + idx * c.recv_size;
    c.q->on_capsule(std::span<const uint8_t>(buf, std::min(wc[i].byte_len, c.recv_size)), now);
    verbs::RecvWr r;  // the buffer is free again: the host's credit comes back at once
    r.wr_id = idx;
    r.num_sge = 1;
    r.sg_list[0] = {reinterpret_cast<uint64_t>(buf), c.recv_size, c.lkey};
    if (node_.post_recv(c.qp, r)) {
      ++c.post_errors;
      c.failed = true;
    }
  }
  work += static_cast<uint32_t>(n);
  c.q->poll();
  return work;
}

uint32_t RdmaTarget::post_actions(Conn& c) {
  uint32_t work = 0;
  std::array<Action, 32> acts;
  for (size_t k = 0; (k = c.q->take_actions(acts)) > 0;) {
    work += static_cast<uint32_t>(k);
    for (size_t i = 0; i < k; ++i) {
      const Action& a = acts[i];
      verbs::SendWr w;
      w.wr_id = wr_id(a.slot, a.kind);
      w.num_sge = 1;
      switch (a.kind) {
        case Action::RdmaRead:
          w.opcode = wire::WrOpcode::RdmaRead;
          w.sg_list[0] = {reinterpret_cast<uint64_t>(a.local), a.len, c.lkey};
          w.rdma = {a.remote_addr, a.rkey};
          break;
        case Action::RdmaWrite:  // unsignalled: the response SEND behind it completes both
          w.opcode = wire::WrOpcode::RdmaWrite;
          w.send_flags = 0;
          w.sg_list[0] = {reinterpret_cast<uint64_t>(a.local), a.len, c.lkey};
          w.rdma = {a.remote_addr, a.rkey};
          break;
        case Action::Send: {  // the CQE into the slot's registered 16 bytes
          uint8_t* cqe = c.cqe_base + size_t{a.slot} * kCqeStride;
          std::memcpy(cqe, a.local, kCqeSize);
          const bool inv = a.invalidate && opt_.remote_invalidate;
          w.opcode = inv ? wire::WrOpcode::SendInv : wire::WrOpcode::Send;
          w.invalidate_rkey = inv ? a.rkey : 0;
          w.sg_list[0] = {reinterpret_cast<uint64_t>(cqe), kCqeSize, c.lkey};
          break;
        }
      }
      if (node_.post_send(c.qp, w)) {
        ++c.post_errors;
        c.failed = true;
      }
    }
  }
  if (c.cntlid.load(std::memory_order_relaxed) == 0)
    if (Controller* ctl = c.q->controller()) c.cntlid.store(ctl->cntlid(), std::memory_order_release);
  return work;
}

// One core loop: its queues' completions and capsules, its IoRing, its
// queues' actions. Touches nothing of another loop's queues.
uint32_t RdmaTarget::poll_loop(size_t loop, uint64_t now, bool& gone) {
  uint32_t work = 0;
  const bool on_home = loop == 0 || !threaded_;
  auto& list = loops_[loop]->conns;  // live queues of this loop (state and id are the home loop's)
  // 1: completions and capsules into the queues (file commands go to the ring).
  for (Conn* cp : list) {
    Conn& c = *cp;
    if (!c.q || (on_home && c.id == 0)) continue;
    work += poll_queue(c, now);
  }
  // 2: the ring submits what they prepared and resumes what completed.
  if (IoRing* r = rings_[loop].get()) work += static_cast<uint32_t>(r->poll());
  // 3: what the queues want posted.
  for (size_t i = 0; i < list.size(); ++i) {
    Conn& c = *list[i];
    if (!c.q || (on_home && c.id == 0)) continue;
    work += post_actions(c);
    if (!(c.failed || c.q->failed())) continue;
    if (!on_home) {  // the CM is the home loop's: ask it
      if (!c.close_req.exchange(true, std::memory_order_acq_rel)) close_requests_.store(true, std::memory_order_release);
      continue;
    }
    if (c.state == Conn::State::Live) {
      const size_t before = list.size();
      disconnect(c);
      if (c.id == 0) gone = true;
      if (list.size() < before) --i;  // released at once: out of the list
    }
  }
  return work;
}

bool RdmaTarget::remote(const Conn& c) const noexcept { return threaded_ && c.loop != 0; }
bool RdmaTarget::remote_loop(size_t l) const noexcept { return threaded_ && l != 0; }

uint32_t RdmaTarget::loop_tid(size_t l) const noexcept {
  return l < loops_.size() ? loops_[l]->tid.load(std::memory_order_relaxed) : 0;
}

void RdmaTarget::send(size_t loop, int kind, Conn* c, std::shared_ptr<void> req) {
  Loop& L = *loops_[loop];
  {
    std::lock_guard lk(L.mu);
    L.box.push_back(Loop::Msg{kind, c, std::move(req)});
  }
  L.pending.fetch_add(1, std::memory_order_release);
  ++ctr_.loop_messages;
}

// A queue just accepted: into its loop's list (the loop's thread takes it
// from its box in threads mode; the QP and receives were made through the
// loop's command ring before).
void RdmaTarget::home_adopt(Conn& c) {
  c.handed = true;
  if (remote(c))
    send(c.loop, kAdopt, &c, nullptr);
  else
    loops_[c.loop]->conns.push_back(&c);
}

// A queue leaving: out of its loop's list (home loop), or a release message
// to its loop, which drops the Queue once its file commands are back and
// sets `released` (threads mode).
void RdmaTarget::home_drop(Conn& c) {
  if (!c.handed) return;
  c.handed = false;
  if (remote(c)) {
    send(c.loop, kRelease, &c, nullptr);
    return;
  }
  auto& v = loops_[c.loop]->conns;
  std::erase(v, &c);
}

// Loop l >= 1, on its own thread (a poller of its core, run before the
// core's engine poll in each iteration): messages, then as poll_loop, then
// the queues released to it.
uint32_t RdmaTarget::poll_remote(size_t l) {
  Loop& L = *loops_[l];
  if (L.tid.load(std::memory_order_relaxed) == 0) L.tid.store(os_tid(), std::memory_order_relaxed);
  uint32_t work = 0;
  if (L.pending.load(std::memory_order_acquire) != 0) {
    {
      std::lock_guard lk(L.mu);
      L.work.swap(L.box);
      L.pending.store(0, std::memory_order_relaxed);
    }
    for (Loop::Msg& m : L.work) {
      switch (m.kind) {
        case kAdopt:
          L.conns.push_back(m.c);
          break;
        case kRelease:
          std::erase(L.conns, m.c);
          L.closing.push_back(m.c);
          break;
        case kReport: {
          auto* r = static_cast<ReportReq*>(m.req.get());
          for (Conn* c : L.conns) r->out.push_back(report_of(*c));
          for (Conn* c : L.closing) r->out.push_back(report_of(*c));
          if (const IoRing* ring = rings_[l].get()) {
            r->ring.has_ring = true;
            r->ring.ring_in_flight = ring->in_flight();
            r->ring.ring = ring->counters();
          }
          r->done.store(true, std::memory_order_release);
          break;
        }
      }
    }
    work += static_cast<uint32_t>(L.work.size());
    L.work.clear();
  }
  bool gone = false;
  work += poll_loop(l, node_.dataplane().clock().now_ns(), gone);
  if (!L.closing.empty()) {
    std::array<Action, 32> drop;
    std::erase_if(L.closing, [&](Conn* c) {
      if (c->q) {
        while (c->q->take_actions(drop) > 0) {
        }
        if (c->q->backend_busy() > 0) return false;
        c->final = report_of(*c);
        c->q.reset();  // here, on the loop that owns its ring and requests
      }
      c->released.store(true, std::memory_order_release);
      return true;
    });
  }
  return work;
}

uint32_t RdmaTarget::poll() {
  uint32_t work = node_.poll();
  if (loops_[0]->tid.load(std::memory_order_relaxed) == 0)  // one thread: every loop but the threaded ones
    for (size_t l = 0; l < loops_.size(); ++l)
      if (l == 0 || !threaded_) loops_[l]->tid.store(os_tid(), std::memory_order_relaxed);
  if (!events_.empty()) {
    work_.swap(events_);
    for (const cm::Event& e : work_) on_event(e);
    work += static_cast<uint32_t>(work_.size());
    work_.clear();
  }
  const uint64_t now = node_.dataplane().clock().now_ns();
  bool gone = false;
  // The home loop's part: REQs waiting for the peer's MAC.
  for (auto& cp : conns_) {
    Conn& c = *cp;
    if (c.state != Conn::State::WaitMac) continue;
    if (!try_accept(c) && c.state != Conn::State::WaitMac) {
      c.id = 0;
      gone = true;
    }
  }
  if (threaded_) {
    work += poll_loop(0, now, gone);
    // Queues of other loops that failed: their loops asked for a disconnect.
    if (close_requests_.exchange(false, std::memory_order_acq_rel))
      for (auto& c : conns_)
        if (c->close_req.load(std::memory_order_acquire) && c->state == Conn::State::Live) {
          disconnect(*c);
          if (c->id == 0) gone = true;
        }
  } else {
    for (size_t l = 0; l < rings_.size(); ++l) work += poll_loop(l, now, gone);
  }
  if (gone) sweep();
  // Queues gone from the CM whose file commands were in the ring: destroyed
  // once the ring has given all of them back (their responses are dropped);
  // a queue of another loop's thread once that loop has released it.
  if (!closing_.empty()) {
    std::array<Action, 32> drop;
    std::erase_if(closing_, [&](std::unique_ptr<Conn>& c) {
      if (remote(*c)) {
        if (!c->released.load(std::memory_order_acquire)) return false;
        destroy(*c);
        return true;
      }
      while (c->q->take_actions(drop) > 0) {
      }
      if (c->q->backend_busy() > 0) return false;
      destroy(*c);
      return true;
    });
  }
  if (!kept_.empty())
    std::erase_if(kept_, [&](const Kept& k) {
      if (remote_loop(k.loop) || (rings_[k.loop] && rings_[k.loop]->orphans() > 0)) return false;
      node_.free_dma(k.mem);
      return true;
    });
  if (now >= next_ka_check_) {
    next_ka_check_ = now + kKeepAliveCheckNs;
    for (uint16_t cntlid : target_.expired(now)) {
      ++ctr_.keep_alive_expired;
      for (auto& c : conns_)
        if (c->cntlid.load(std::memory_order_acquire) == cntlid) disconnect(*c);
    }
    sweep();
  }
  return work;
}

QueueReport RdmaTarget::report_of(const Conn& c) const {
  QueueReport r;
  r.loop = c.loop;
  r.qid = c.req.qid;
  r.cntlid = c.cntlid.load(std::memory_order_relaxed);
  r.tid = c.tid;
  r.depth = c.depth;
  r.qpn = c.has_qp ? c.qp.qpn : 0;
  r.peer = netstack::gid_to_string(c.remote);
  if (c.q) r.q = c.q->counters();
  r.recv_errors = c.recv_errors;
  r.post_errors = c.post_errors;
  r.wc_errors = c.wc_errors;
  return r;
}

std::vector<QueueReport> RdmaTarget::report() const { return collect(nullptr); }

std::vector<QueueReport> RdmaTarget::collect(std::vector<LoopReport>* rings) const {
  std::vector<QueueReport> out = closed_;
  if (rings)
    for (size_t l = 0; l < rings->size() && l < rings_.size(); ++l) {
      if (remote_loop(l) || !rings_[l]) continue;
      (*rings)[l].has_ring = true;
      (*rings)[l].ring_in_flight = rings_[l]->in_flight();
      (*rings)[l].ring = rings_[l]->counters();
    }
  for (const auto& c : conns_)
    if (!remote(*c) && c->q) out.push_back(report_of(*c));
  for (const auto& c : closing_) {
    if (!remote(*c))
      out.push_back(report_of(*c));
    else if (c->released.load(std::memory_order_acquire))
      out.push_back(c->final);
  }
  if (!threaded_) return out;
  // Queues of other loops: their threads copy their counters (a message each,
  // answered within a pass), so nothing of a queue is read by two threads.
  std::vector<std::shared_ptr<ReportReq>> reqs;
  auto* self = const_cast<RdmaTarget*>(this);
  for (size_t l = 1; l < loops_.size(); ++l) {
    reqs.push_back(std::make_shared<ReportReq>());
    self->send(l, kReport, nullptr, reqs.back());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto& r = reqs[i];
    while (!r->done.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    if (!r->done.load(std::memory_order_acquire)) {
      ++ctr_.report_timeouts;
      continue;
    }
    for (auto& q : r->out) out.push_back(std::move(q));
    if (rings && i + 1 < rings->size()) {
      LoopReport& lr = (*rings)[i + 1];
      lr.has_ring = r->ring.has_ring;
      lr.ring_in_flight = r->ring.ring_in_flight;
      lr.ring = r->ring.ring;
    }
  }
  return out;
}

std::vector<LoopReport> RdmaTarget::loop_report() const {
  std::vector<LoopReport> out(rings_.size());
  for (size_t l = 0; l < out.size(); ++l) {
    out[l].loop = static_cast<uint16_t>(l);
    out[l].tid = loop_tid(l);
  }
  for (const QueueReport& q : collect(&out)) {
    if (q.loop >= out.size()) continue;
    LoopReport& l = out[q.loop];
    if (!q.closed) ++l.live_queues;
    l.commands += q.q.commands;
    l.bytes_in += q.q.bytes_in;
    l.bytes_out += q.q.bytes_out;
    l.errors += q.q.errors;
    l.file_commands += q.q.file_commands;
  }
  return out;
}

}  // namespace droce::nvmf::rdma
