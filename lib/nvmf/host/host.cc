// NVMe-oF RDMA initiator (README.md).
#include "nvmf/host/host.h"

#include <arpa/inet.h>
#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "netstack/gid_table.h"
#include "nvmf/cm_private.h"
#include "nvmf/le.h"

namespace droce::nvmf::host {

namespace {
constexpr uint32_t kCmdStride = 64;   // one SQE per slot (in-capsule data goes as a second SGE)
constexpr uint32_t kRspStride = 16;   // one CQE per receive
constexpr uint16_t kAdminSize = 32;   // NVME_AQ_DEPTH, as Linux
constexpr uint64_t kKaUser = ~uint64_t{0};
constexpr size_t kAdminBuf = 64 * 1024;
constexpr uint8_t kPsdtSgl = 0x40;    // SQE flags: SGL, metadata contiguous (NVME_CMD_SGL_METABUF)
constexpr uint8_t kSlotBusy = 1, kSlotSent = 2, kSlotResp = 4, kSlotDone = 8;

std::string hex_id(const std::array<uint8_t, 16>& id) {
  char b[40];
  std::snprintf(b, sizeof b, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", id[0], id[1],
                id[2], id[3], id[4], id[5], id[6], id[7], id[8], id[9], id[10], id[11], id[12], id[13], id[14], id[15]);
  return b;
}

std::string status_str(Status s) {
  char b[64];
  std::snprintf(b, sizeof b, "status sct %u sc 0x%02x%s", static_cast<unsigned>(s.sct()), s.sc(), s.dnr() ? " dnr" : "");
  return b;
}
}  // namespace

struct Host::Queue {
  uint16_t qid = 0;
  uint16_t size = 0;     // entries (hsqsize + 1); slots = size - 1
  uint32_t nslots = 0;
  engine::QpHandle qp;
  cm::ConnId conn = 0;
  enum class Cm : uint8_t { Idle, Connecting, Response, Rejected, Unreachable, Established, Closed } cm = Cm::Idle;
  std::string reject_why;
  uint8_t* cmd = nullptr;   // nslots * kCmdStride
  uint8_t* rsp = nullptr;   // size * kRspStride
  struct Slot {
    uint64_t user = 0;
    uint8_t flags = 0;
    Cqe cqe;
  };
  std::array<Slot, kMaxQueueSize> slots{};
  std::array<uint16_t, kMaxQueueSize> free_list{};
  uint32_t nfree = 0;
  uint64_t stray = 0;  // responses naming no command in flight
  bool sync = false;   // a control command (command_sync) is waited for on this queue
};

Host::Host(engine::Embedded& node, const HostOptions& o) : node_(node), opt_(o) {
  in_addr a{};
  if (inet_pton(AF_INET, opt_.target_ip.c_str(), &a) != 1) throw HostError("target address " + opt_.target_ip + " is not IPv4");
  target_ip_ = wire::gid_from_ipv4(ntohl(a.s_addr));
  bool found = false;
  for (size_t i = 0; i < node_.gids().size(); ++i)
    if (wire::gid_is_ipv4_mapped(node_.gids().at(i))) {
      local_ip_ = node_.gids().at(i);
      found = true;
      break;
    }
  if (!found) throw HostError("the node has no IPv4 address");
  if (opt_.io_queues == 0 || opt_.io_queues > 64) throw HostError("io_queues must be 1..64");
  if (opt_.queue_size < 2 || opt_.queue_size > kMaxQueueSize) throw HostError("queue_size must be 2..128");
  if (std::all_of(opt_.hostid.begin(), opt_.hostid.end(), [](uint8_t b) { return b == 0; })) {
    if (getrandom(opt_.hostid.data(), opt_.hostid.size(), 0) != 16) throw HostError("getrandom failed");
    opt_.hostid[6] = (opt_.hostid[6] & 0x0f) | 0x40;  // UUID version 4
    opt_.hostid[8] = (opt_.hostid[8] & 0x3f) | 0x80;
  }
  if (opt_.hostnqn.empty()) opt_.hostnqn = "nqn.2014-08.org.nvmexpress:uuid:" + hex_id(opt_.hostid);
  if (!valid_nqn(opt_.hostnqn)) throw HostError("bad host NQN " + opt_.hostnqn);
  uint16_t r = 0;
  getrandom(&r, sizeof r, 0);
  next_sport_ = static_cast<uint16_t>(32768 + (r % 16384));
  setup_memory();
  node_.set_cm_sink([this](const cm::Event& e) { on_cm(e); });
}

Host::~Host() {
  try {
    shutdown();
  } catch (const std::exception&) {
  }
  for (Queue* q : queues_) {
    if (q->qp.eng) node_.destroy_qp(q->qp);
    delete q;
  }
  node_.set_cm_sink(nullptr);
  if (key_) node_.dereg_mr(key_);
  if (mem_) node_.free_dma(mem_);
}

void Host::setup_memory() {
  const size_t nq = size_t{opt_.io_queues} + 1;
  const size_t per_q = size_t{kMaxQueueSize} * (kCmdStride + kRspStride);
  const size_t data = (opt_.data_bytes + 4095) & ~size_t{4095};
  mem_len_ = kAdminBuf + nq * per_q + data;
  mem_ = static_cast<uint8_t*>(node_.alloc_dma(mem_len_));
  if (!mem_) throw HostError("cannot allocate " + std::to_string(mem_len_) + " bytes of hugepage memory");
  std::memset(mem_, 0, mem_len_);
  if (int rc = node_.reg_mr(pd_ = node_.alloc_pd(), mem_, mem_len_, verbs::kAccessAll, &key_))
    throw HostError("reg_mr failed: errno " + std::to_string(rc));
  admin_buf_ = mem_;
  admin_buf_len_ = kAdminBuf;
  data_ = mem_ + kAdminBuf + nq * per_q;
  for (size_t i = 0; i < nq; ++i) {
    auto* q = new Queue;
    q->qid = static_cast<uint16_t>(i);
    q->cmd = mem_ + kAdminBuf + i * per_q;
    q->rsp = q->cmd + size_t{kMaxQueueSize} * kCmdStride;
    queues_.push_back(q);
  }
}

void Host::on_cm(const cm::Event& e) { events_.push_back(e); }

void Host::fail(std::string why) noexcept {
  if (failed_) return;
  failed_ = true;
  failure_ = std::move(why);
}

void Host::wait_for(const char* what, uint32_t timeout_ms, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  uint32_t spins = 0;
  Completion sink[16];
  for (;;) {
    // Drives the node, the CM events and every queue (completions of I/O
    // queues are not expected during control waits).
    poll(sink, 16);
    if (done()) return;
    if (failed_) throw HostError(std::string(what) + ": " + failure_);
    if ((++spins & 255) == 0 && std::chrono::steady_clock::now() > deadline)
      throw HostError(std::string(what) + ": no answer within " + std::to_string(timeout_ms) + " ms");
  }
}

// ---------------------------------------------------------------- CM + queue
void Host::connect_queue(uint16_t qid, uint16_t size) {
  Queue& q = *queues_.at(qid);
  q.size = size;
  q.nslots = size - 1u;
  q.nfree = 0;
  for (uint32_t i = q.nslots; i-- > 0;) {
    q.slots[i] = {};
    q.free_list[q.nfree++] = static_cast<uint16_t>(i);
  }
  engine::QpOptions qo;
  qo.type = verbs::QpType::RC;
  qo.cap.max_send_wr = size + 2u;
  qo.cap.max_recv_wr = size;
  qo.cap.max_send_sge = 2;
  qo.cap.max_recv_sge = 1;
  qo.cap.max_inline_data = 0;
  qo.cqe = 2u * size + 16u;
  q.qp = node_.create_qp(pd_, qo);
  for (uint32_t i = 0; i < size; ++i) {
    verbs::RecvWr r;
    r.wr_id = i;
    r.num_sge = 1;
    r.sg_list[0] = {reinterpret_cast<uint64_t>(q.rsp + size_t{i} * kRspStride), kRspStride, key_};
    if (int rc = node_.post_recv(q.qp, r)) throw HostError("post_recv: errno " + std::to_string(rc));
  }
  cm::ConnectArgs a;
  a.local = {local_ip_, next_sport_++};
  if (next_sport_ < 32768) next_sport_ = 32768;
  a.remote = {target_ip_, opt_.port};
  a.ps = cm::PortSpace::Tcp;
  a.kind = cm::QpKind::Rc;
  CmRequest req;
  req.qid = qid;
  req.hrqsize = size;
  req.hsqsize = static_cast<uint16_t>(size - 1);
  encode_cm_request(std::span<uint8_t, kCmRequestSize>(a.param.private_data, kCmRequestSize), req);
  a.param.private_data_len = kCmRequestSize;
  a.param.responder_resources = verbs::kMaxRdAtomic;  // the target RDMA READs our writes' data
  a.param.initiator_depth = verbs::kMaxRdAtomic;
  a.param.qpn = q.qp.qpn;
  a.path_mtu = static_cast<uint8_t>(verbs::max_mtu_for_link(node_.port().mtu()));
  a.traffic_class = opt_.traffic_class;
  q.cm = Queue::Cm::Connecting;
  if (int rc = node_.cm().connect(a, qid + 1u, &q.conn))
    throw HostError("queue " + std::to_string(qid) + ": RDMA CM connect: errno " + std::to_string(rc));
  const std::string what = "queue " + std::to_string(qid) + ": RDMA CM connection to " + opt_.target_ip + ":" +
                           std::to_string(opt_.port);
  wait_for(what.c_str(), opt_.timeout_ms, [&] { return q.cm != Queue::Cm::Connecting; });
  if (q.cm == Queue::Cm::Rejected) throw HostError(what + ": rejected (" + q.reject_why + ")");
  if (q.cm == Queue::Cm::Unreachable) throw HostError(what + ": unreachable (no answer to the CM REQ)");
  if (q.cm != Queue::Cm::Response) throw HostError(what + ": closed during setup");
  cm::QpParams p;
  if (int rc = node_.cm().qp_params(q.conn, p)) throw HostError(what + ": qp_params: errno " + std::to_string(rc));
  q.qp.opt.mtu = static_cast<verbs::Mtu>(p.path_mtu);
  q.qp.opt.psn = p.sq_psn;
  q.qp.opt.timeout = p.timeout;
  q.qp.opt.retry_cnt = p.retry_cnt;
  q.qp.opt.rnr_retry = p.rnr_retry;
  q.qp.opt.min_rnr_timer = p.min_rnr_timer;
  q.qp.opt.max_rd_atomic = std::max<uint8_t>(p.max_rd_atomic, 1);
  engine::QpPeer peer;
  peer.qpn = p.dest_qpn;
  peer.psn = p.rq_psn;
  peer.gid = p.dgid;
  if (int rc = node_.connect(q.qp, peer)) throw HostError(what + ": QP to RTS: errno " + std::to_string(rc));
  if (int rc = node_.cm().establish(q.conn)) throw HostError(what + ": RTU: errno " + std::to_string(rc));
  q.cm = Queue::Cm::Established;

  // Fabrics Connect (its 1024 bytes of data by keyed SGL from the admin buffer).
  ConnectData d;
  d.hostid = opt_.hostid;
  d.cntlid = qid == 0 ? kCntlidDynamic : info_.cntlid;
  d.subnqn = opt_.subnqn;
  d.hostnqn = opt_.hostnqn;
  encode_connect_data(std::span<uint8_t, kConnectDataSize>(admin_buf_, kConnectDataSize), d);
  Sqe s;
  ConnectCmd c;
  c.qid = qid;
  c.sqsize = static_cast<uint16_t>(size - 1);
  c.kato_ms = qid == 0 ? opt_.kato_ms : 0;
  encode_connect(s, c);
  // The Connect of an I/O queue travels on that queue.
  const Cqe r = command_sync(q, s, kConnectDataSize, "Fabrics Connect");
  if (!r.status.ok()) {
    char b[64];
    std::snprintf(b, sizeof b, " (IATTR/IPO 0x%x)", static_cast<unsigned>(r.result));
    throw HostError("queue " + std::to_string(qid) + ": Fabrics Connect refused: " + status_str(r.status) + b);
  }
  if (qid == 0) info_.cntlid = static_cast<uint16_t>(r.result & 0xffff);
}

void Host::disconnect_queue(Queue& q) {
  if (q.cm == Queue::Cm::Idle || q.conn == 0) return;
  if (q.cm == Queue::Cm::Established) {
    node_.cm().disconnect(q.conn);
    try {
      wait_for("CM disconnect", 2000, [&] { return q.cm == Queue::Cm::Closed; });
    } catch (const HostError&) {
    }
  }
  node_.cm().destroy(q.conn);
  q.conn = 0;
  q.cm = Queue::Cm::Idle;
  if (q.qp.eng) node_.destroy_qp(q.qp);
}

// ---------------------------------------------------------------- admin
Cqe Host::admin_sync(Sqe& s, uint32_t data_len, IoDir dir, const char* what) {
  (void)dir;
  return command_sync(*queues_[0], s, data_len, what);
}

Cqe Host::command_sync(Queue& q, Sqe& s, uint32_t data_len, const char* what) {
  if (q.nfree == 0) throw HostError(std::string(what) + ": queue full");
  q.sync = true;
  const uint32_t slot = q.free_list[--q.nfree];
  q.slots[slot].flags = kSlotBusy;
  q.slots[slot].user = 0;
  s.cid = static_cast<uint16_t>(slot);
  s.flags = kPsdtSgl;
  Sgl g;
  g.kind = SglKind::Keyed;
  g.addr = data_len ? reinterpret_cast<uint64_t>(admin_buf_) : 0;
  g.length = data_len;
  g.key = data_len ? key_ : 0;
  encode_sgl(s.dptr, g);
  encode_sqe(std::span<uint8_t, kSqeSize>(q.cmd + size_t{slot} * kCmdStride, kSqeSize), s);
  if (int rc = post_command(q, slot, 0, nullptr)) throw HostError(std::string(what) + ": post_send errno " + std::to_string(rc));
  wait_for(what, opt_.timeout_ms, [&] { return (q.slots[slot].flags & kSlotDone) != 0; });
  const Cqe r = q.slots[slot].cqe;
  q.sync = false;
  q.slots[slot].flags = 0;
  q.free_list[q.nfree++] = static_cast<uint16_t>(slot);
  return r;
}

namespace {
uint64_t prop_get(Host& h, Prop p, bool eight, const std::function<Cqe(Sqe&, const char*)>& run, const char* what) {
  (void)h;
  Sqe s;
  PropertyCmd c;
  c.eight_bytes = eight;
  c.offset = static_cast<uint32_t>(p);
  encode_property(s, FabricsType::PropertyGet, c);
  const Cqe r = run(s, what);
  if (!r.status.ok()) throw HostError(std::string(what) + ": " + status_str(r.status));
  return r.result;
}
}  // namespace

void Host::enable_controller() {
  auto run = [this](Sqe& s, const char* what) { return admin_sync(s, 0, IoDir::Read, what); };
  info_.cap = prop_get(*this, Prop::Cap, true, run, "Property Get CAP");
  info_.vs = static_cast<uint32_t>(prop_get(*this, Prop::Vs, false, run, "Property Get VS"));
  Sqe s;
  PropertyCmd c;
  c.offset = static_cast<uint32_t>(Prop::Cc);
  c.value = (6u << 16) | (4u << 20) | cc::kEn;  // IOSQES 64 B, IOCQES 16 B, MPS 4 KiB, NVM command set
  encode_property(s, FabricsType::PropertySet, c);
  const Cqe r = admin_sync(s, 0, IoDir::Write, "Property Set CC.EN");
  if (!r.status.ok()) throw HostError("Property Set CC.EN: " + status_str(r.status));
  // CSTS.RDY within CAP.TO (500 ms units; at least a second).
  const uint64_t to_ms = std::max<uint64_t>(cap::to(info_.cap) * 500, 1000);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(to_ms);
  for (;;) {
    const uint32_t csts = static_cast<uint32_t>(prop_get(*this, Prop::Csts, false, run, "Property Get CSTS"));
    if (csts & csts::kCfs) throw HostError("controller fatal status (CSTS.CFS) after CC.EN");
    if (csts & csts::kRdy) break;
    if (std::chrono::steady_clock::now() > deadline)
      throw HostError("CSTS.RDY not set within CAP.TO (" + std::to_string(to_ms) + " ms)");
  }
}

void Host::identify() {
  Sqe s;
  s.opcode = static_cast<uint8_t>(AdminOp::Identify);
  s.cdw10 = static_cast<uint8_t>(Cns::Controller);
  Cqe r = admin_sync(s, kIdentifySize, IoDir::Read, "Identify Controller");
  if (!r.status.ok()) throw HostError("Identify Controller: " + status_str(r.status));
  const uint8_t* p = admin_buf_;
  auto str = [&](size_t off, size_t n) {
    std::string v(le::get_str(p + off, n));
    while (!v.empty() && v.back() == ' ') v.pop_back();
    return v;
  };
  info_.sn = str(idctrl::kSn, 20);
  info_.mn = str(idctrl::kMn, 40);
  info_.fr = str(idctrl::kFr, 8);
  info_.subnqn = std::string(le::get_str(p + idctrl::kSubnqn, 256));
  const uint8_t mdts = p[idctrl::kMdts];
  const uint32_t mps = 4096u << cap::mpsmin(info_.cap);
  info_.mdts_bytes = mdts == 0 ? 0 : (mdts >= 20 ? 0 : mps << mdts);
  const uint16_t cntlid = le::get16(p + idctrl::kCntlid);
  if (cntlid != info_.cntlid)
    throw HostError("Identify Controller: CNTLID " + std::to_string(cntlid) + " is not the " +
                    std::to_string(info_.cntlid) + " that Connect returned");
  info_.kas = le::get16(p + idctrl::kKas);
  info_.cntrltype = p[idctrl::kCntrltype];
  info_.maxcmd = le::get16(p + idctrl::kMaxcmd);
  info_.nn = le::get32(p + idctrl::kNn);
  info_.sgls = le::get32(p + idctrl::kSgls);
  info_.ioccsz = le::get32(p + idctrl::kIoccsz);
  if (!(info_.sgls & sgls::kKeyed)) throw HostError("Identify Controller: SGLS has no keyed SGL data block");
  if (le::get16(p + idctrl::kIcdoff) != 0) throw HostError("Identify Controller: ICDOFF is not 0");
  info_.inline_bytes = 0;
  if ((info_.sgls & sgls::kOffset) && info_.ioccsz > 4)
    info_.inline_bytes = std::min<uint32_t>(opt_.max_inline, (info_.ioccsz - 4) * 16);
  if (info_.cntrltype == 2) return;  // discovery controller: no namespaces

  s = Sqe{};
  s.opcode = static_cast<uint8_t>(AdminOp::Identify);
  s.nsid = info_.nsid;
  s.cdw10 = static_cast<uint8_t>(Cns::Namespace);
  r = admin_sync(s, kIdentifySize, IoDir::Read, "Identify Namespace");
  if (!r.status.ok()) throw HostError("Identify Namespace " + std::to_string(info_.nsid) + ": " + status_str(r.status));
  info_.blocks = le::get64(p + idns::kNsze);
  const uint8_t flbas = p[idns::kFlbas];
  const uint32_t fmt = (flbas & 0xf) | ((flbas >> 1) & 0x30);
  const uint8_t lbads = p[idns::kLbaf0 + 4 * fmt + 2];
  if (info_.blocks == 0) throw HostError("namespace " + std::to_string(info_.nsid) + " is inactive (NSZE 0)");
  if (lbads < 9 || lbads > 16) throw HostError("namespace LBA data size 2^" + std::to_string(lbads) + " not supported");
  info_.block_size = 1u << lbads;
}

void Host::connect() {
  if (connected_) return;
  if (!valid_nqn(opt_.subnqn)) throw HostError("bad subsystem NQN '" + opt_.subnqn + "'");
  connect_queue(0, kAdminSize);
  connected_ = true;
  enable_controller();
  identify();
  if (info_.cntrltype == 2) throw HostError(opt_.subnqn + " is a discovery controller (use discover)");
  // Number of Queues.
  Sqe s;
  s.opcode = static_cast<uint8_t>(AdminOp::SetFeatures);
  s.cdw10 = static_cast<uint8_t>(Feature::NumQueues);
  s.cdw11 = (opt_.io_queues - 1u) | ((opt_.io_queues - 1u) << 16);
  Cqe r = admin_sync(s, 0, IoDir::Write, "Set Features Number of Queues");
  if (!r.status.ok()) throw HostError("Set Features Number of Queues: " + status_str(r.status));
  const uint32_t nsqa = (r.result & 0xffff) + 1, ncqa = ((r.result >> 16) & 0xffff) + 1;
  info_.io_queues = static_cast<uint16_t>(std::min<uint32_t>({opt_.io_queues, nsqa, ncqa}));
  uint32_t qs = std::min<uint32_t>(opt_.queue_size, cap::mqes(info_.cap) + 1);
  if (info_.maxcmd) qs = std::min<uint32_t>(qs, info_.maxcmd);
  qs = std::min<uint32_t>(qs, kMaxQueueSize);
  if (qs < 2) throw HostError("the controller's queues are too small (MQES/MAXCMD)");
  info_.queue_size = static_cast<uint16_t>(qs);
  for (uint16_t i = 1; i <= info_.io_queues; ++i) connect_queue(i, info_.queue_size);
  ka_interval_ns_ = uint64_t{opt_.kato_ms} * 1'000'000 / 2;
  ka_due_ns_ = node_.dataplane().clock().now_ns() + ka_interval_ns_;
}

std::vector<DiscEntry> Host::discover() {
  opt_.subnqn = kDiscoveryNqn;
  opt_.kato_ms = 0;
  connect_queue(0, kAdminSize);
  connected_ = true;
  enable_controller();
  identify();
  auto get_log = [&](uint32_t len, const char* what) {
    Sqe s;
    s.opcode = static_cast<uint8_t>(AdminOp::GetLogPage);
    const uint32_t numd = len / 4 - 1;
    s.cdw10 = static_cast<uint8_t>(LogPage::Discovery) | ((numd & 0xffff) << 16);
    s.cdw11 = numd >> 16;
    const Cqe r = admin_sync(s, len, IoDir::Read, what);
    if (!r.status.ok()) throw HostError(std::string(what) + ": " + status_str(r.status));
  };
  get_log(kDiscHeaderSize, "Get Log Page discovery (header)");
  const uint64_t numrec = le::get64(admin_buf_ + disclog::kNumrec);
  const uint64_t n = std::min<uint64_t>(numrec, (admin_buf_len_ - kDiscHeaderSize) / kDiscEntrySize);
  if (n) get_log(static_cast<uint32_t>(kDiscHeaderSize + n * kDiscEntrySize), "Get Log Page discovery");
  std::vector<DiscEntry> out;
  for (uint64_t i = 0; i < n; ++i) {
    DiscEntry e;
    if (decode_disc_entry(std::span<const uint8_t>(admin_buf_ + kDiscHeaderSize + i * kDiscEntrySize, kDiscEntrySize), e))
      out.push_back(e);
  }
  shutdown();
  return out;
}

void Host::shutdown() {
  if (!connected_) return;
  connected_ = false;
  ka_interval_ns_ = 0;
  std::string err;
  if (!failed_ && queues_[0]->cm == Queue::Cm::Established) {
    try {
      // I/O queues first (as Linux tears them down before the admin queue).
      for (size_t i = 1; i < queues_.size(); ++i) disconnect_queue(*queues_[i]);
      auto run = [this](Sqe& s, const char* what) { return admin_sync(s, 0, IoDir::Read, what); };
      Sqe s;
      PropertyCmd c;
      c.offset = static_cast<uint32_t>(Prop::Cc);
      c.value = (6u << 16) | (4u << 20) | cc::kEn | (1u << 14);  // SHN normal
      encode_property(s, FabricsType::PropertySet, c);
      const Cqe r = admin_sync(s, 0, IoDir::Write, "Property Set CC.SHN");
      if (r.status.ok()) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opt_.timeout_ms);
        for (;;) {
          const uint32_t csts = static_cast<uint32_t>(prop_get(*this, Prop::Csts, false, run, "Property Get CSTS"));
          if ((csts & csts::kShstMask) == csts::kShstComplete) break;
          if (std::chrono::steady_clock::now() > deadline) {
            err = "CSTS.SHST not complete in time";
            break;
          }
        }
      } else {
        err = "Property Set CC.SHN: " + status_str(r.status);
      }
    } catch (const HostError& e) {
      err = e.what();
    }
  }
  for (size_t i = queues_.size(); i-- > 0;) {
    try {
      disconnect_queue(*queues_[i]);
    } catch (const std::exception&) {
    }
  }
  if (!err.empty()) throw HostError("shutdown: " + err);
}

// ---------------------------------------------------------------- data path
int Host::post_command(Queue& q, uint32_t slot, uint32_t inline_len, uint8_t* inline_buf) noexcept {
  verbs::SendWr w;
  w.wr_id = slot;
  w.opcode = verbs::WrOpcode::Send;
  w.send_flags = verbs::kSendSignaled;
  w.num_sge = 1;
  w.sg_list[0] = {reinterpret_cast<uint64_t>(q.cmd + size_t{slot} * kCmdStride), kSqeSize, key_};
  if (inline_len) {
    w.num_sge = 2;
    w.sg_list[1] = {reinterpret_cast<uint64_t>(inline_buf), inline_len, key_};
  }
  return node_.post_send(q.qp, w);
}

int Host::submit(uint16_t qid, IoDir dir, uint64_t lba, uint32_t blocks, uint8_t* buf, uint64_t user) noexcept {
  if (failed_) return EIO;
  if (qid == 0 || qid > info_.io_queues || blocks == 0 || blocks > 0x10000) return EINVAL;
  Queue& q = *queues_[qid];
  if (q.cm != Queue::Cm::Established) return EINVAL;
  const uint64_t bytes = uint64_t{blocks} * info_.block_size;
  if (bytes >= (1u << 24) || (info_.mdts_bytes && bytes > info_.mdts_bytes)) return EINVAL;
  if (buf < data_ || static_cast<uint64_t>(buf - data_) + bytes > opt_.data_bytes) return EINVAL;
  if (q.nfree == 0) return EAGAIN;
  const uint32_t slot = q.free_list[--q.nfree];
  auto& sl = q.slots[slot];
  sl.flags = kSlotBusy;
  sl.user = user;
  Sqe s;
  s.opcode = static_cast<uint8_t>(dir == IoDir::Read ? IoOp::Read : IoOp::Write);
  s.flags = kPsdtSgl;
  s.cid = static_cast<uint16_t>(slot);
  s.nsid = info_.nsid;
  s.cdw10 = static_cast<uint32_t>(lba);
  s.cdw11 = static_cast<uint32_t>(lba >> 32);
  s.cdw12 = blocks - 1;
  Sgl g;
  uint32_t inline_len = 0;
  if (dir == IoDir::Write && bytes <= info_.inline_bytes) {
    g.kind = SglKind::InCapsule;
    g.addr = 0;
    inline_len = static_cast<uint32_t>(bytes);
  } else {
    g.kind = SglKind::Keyed;
    g.addr = reinterpret_cast<uint64_t>(buf);
    g.key = key_;
  }
  g.length = static_cast<uint32_t>(bytes);
  encode_sgl(s.dptr, g);
  encode_sqe(std::span<uint8_t, kSqeSize>(q.cmd + size_t{slot} * kCmdStride, kSqeSize), s);
  if (int rc = post_command(q, slot, inline_len, buf)) {
    sl.flags = 0;
    q.free_list[q.nfree++] = static_cast<uint16_t>(slot);
    return rc == ENOMEM ? EAGAIN : EIO;
  }
  return 0;
}

uint32_t Host::in_flight(uint16_t qid) const noexcept {
  if (qid >= queues_.size()) return 0;
  const Queue& q = *queues_[qid];
  return q.nslots - q.nfree;
}

int Host::poll_queue(Queue& q, Completion* out, int max) noexcept {
  if (!q.qp.eng) return 0;
  int n = 0;
  verbs::Wc wc[32];
  auto finish = [&](uint32_t slot) {
    auto& sl = q.slots[slot];
    if (q.qid == 0 || q.sync) {
      if (sl.user == kKaUser) {
        if (!sl.cqe.status.ok()) fail("Keep Alive failed: " + status_str(sl.cqe.status));
        sl.flags = 0;
        q.free_list[q.nfree++] = static_cast<uint16_t>(slot);
      } else {
        sl.flags |= kSlotDone;
      }
      return;
    }
    out[n++] = {sl.user, sl.cqe.status, q.qid};
    sl.flags = 0;
    q.free_list[q.nfree++] = static_cast<uint16_t>(slot);
  };
  // Each work completion finishes at most one command: poll no more than there is room for.
  for (int pass = 0; pass < 2; ++pass) {
    const int room = std::min(32, max - n);
    if (room <= 0) break;
    verbs::Cq* cq = pass == 0 ? q.qp.rcq : q.qp.scq;
    const int k = cq->poll(wc, room);
    for (int i = 0; i < k; ++i) {
      const verbs::Wc& w = wc[i];
      if (w.status != verbs::WcStatus::Success) {
        if (!failed_) {
          fail("queue " + std::to_string(q.qid) + ": work completion " + verbs::wc_status_str(w.status));
        }
        continue;
      }
      uint32_t slot;
      if (pass == 0) {
        const uint32_t idx = static_cast<uint32_t>(w.wr_id);
        Cqe c;
        decode_cqe(std::span<const uint8_t, kCqeSize>(q.rsp + size_t{idx} * kRspStride, kCqeSize), c);
        verbs::RecvWr r;
        r.wr_id = idx;
        r.num_sge = 1;
        r.sg_list[0] = {reinterpret_cast<uint64_t>(q.rsp + size_t{idx} * kRspStride), kRspStride, key_};
        if (node_.post_recv(q.qp, r) != 0) fail("queue " + std::to_string(q.qid) + ": cannot repost a receive");
        slot = c.cid;
        if (w.byte_len < kCqeSize || slot >= q.nslots || !(q.slots[slot].flags & kSlotBusy) ||
            (q.slots[slot].flags & kSlotResp)) {
          ++q.stray;
          continue;
        }
        q.slots[slot].cqe = c;
        q.slots[slot].flags |= kSlotResp;
        if (!(q.slots[slot].flags & kSlotSent)) continue;
      } else {
        slot = static_cast<uint32_t>(w.wr_id);
        if (slot >= q.nslots) continue;
        q.slots[slot].flags |= kSlotSent;
        if (!(q.slots[slot].flags & kSlotResp)) continue;
      }
      finish(slot);
    }
  }
  return n;
}

void Host::keep_alive(uint64_t now_ns) noexcept {
  if (ka_interval_ns_ == 0 || now_ns < ka_due_ns_) return;
  Queue& q = *queues_[0];
  if (q.cm != Queue::Cm::Established || q.nfree == 0) return;
  ka_due_ns_ = now_ns + ka_interval_ns_;
  const uint32_t slot = q.free_list[--q.nfree];
  q.slots[slot].flags = kSlotBusy;
  q.slots[slot].user = kKaUser;
  Sqe s;
  s.opcode = static_cast<uint8_t>(AdminOp::KeepAlive);
  s.cid = static_cast<uint16_t>(slot);
  s.flags = kPsdtSgl;
  encode_sgl(s.dptr, Sgl{SglKind::Keyed, 0, 0, 0});  // no data: a null keyed SGL, as Linux sends
  encode_sqe(std::span<uint8_t, kSqeSize>(q.cmd + size_t{slot} * kCmdStride, kSqeSize), s);
  if (post_command(q, slot, 0, nullptr) != 0) fail("Keep Alive: post_send failed");
}

int Host::poll(Completion* out, int max) noexcept {
  node_.poll();
  if (!events_.empty()) {
    // CM events (rare; control path).
    for (const cm::Event& e : events_) {
      const uint64_t qi = e.user - 1;
      if (qi >= queues_.size()) continue;
      Queue& q = *queues_[qi];
      if (e.id != q.conn) continue;
      switch (e.type) {
        case cm::EventType::ConnectResponse:
          if (q.cm == Queue::Cm::Connecting) {
            uint16_t recfmt = 0, crqsize = 0;
            if (!decode_cm_accept(std::span<const uint8_t>(e.param.private_data, e.param.private_data_len), recfmt, crqsize)) {
              q.cm = Queue::Cm::Rejected;
              q.reject_why = "REP without the NVMe-RDMA accept data";
            } else {
              q.cm = Queue::Cm::Response;
            }
          }
          break;
        case cm::EventType::Rejected: {
          uint16_t recfmt = 0;
          CmStatus st{};
          q.reject_why = "CM reason " + std::to_string(e.status);
          if (decode_cm_reject(std::span<const uint8_t>(e.param.private_data, e.param.private_data_len), recfmt, st))
            q.reject_why += std::string(", NVMe-RDMA status ") + cm_status_name(st);
          q.cm = Queue::Cm::Rejected;
          break;
        }
        case cm::EventType::Unreachable: q.cm = Queue::Cm::Unreachable; break;
        case cm::EventType::Disconnected:
          if (q.cm == Queue::Cm::Established && connected_) fail("queue " + std::to_string(q.qid) + ": the target disconnected");
          q.cm = Queue::Cm::Closed;
          break;
        default: break;
      }
    }
    events_.clear();
  }
  int n = 0;
  for (Queue* q : queues_) {
    if (n >= max) break;
    n += poll_queue(*q, out + n, max - n);
  }
  if (ka_interval_ns_ && (++poll_count_ & 255) == 0) keep_alive(node_.dataplane().clock().now_ns());
  if (failed_ && n == 0) return -EIO;
  return n;
}

}  // namespace droce::nvmf::host
