// TEST DOUBLE, not shipped: a ShimBackend that records every call and, with
// its engine thread started, executes work requests between the QPs of its
// own clients in memory (a loopback "wire"), so the shim's control path,
// rings, memory scheme and the libibverbs front can be tested end to end
// without the transport engine or DPDK. It is deliberately simple: one lock
// around everything, one engine thread, RC/UC/UD semantics reduced to what
// the tests check (rkey/PD/access checks, RNR waits, immediate data,
// READ, atomics, GRH on UD receives).
#pragma once

#include <arpa/inet.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shim/backend.h"
#include "shim/ring.h"

namespace droce::shim::test {

class LoopbackBackend : public ShimBackend {
 public:
  LoopbackBackend() = default;
  ~LoopbackBackend() override { stop_engine(); }

  // ---- what the tests inspect ----
  std::vector<std::string> calls() {
    std::lock_guard<std::mutex> g(mu_);
    return calls_;
  }
  size_t live_objects() {
    std::lock_guard<std::mutex> g(mu_);
    return pds_.size() + mrs_.size() + cqs_.size() + srqs_.size() + qps_.size() + ahs_.size();
  }
  uint64_t wqes_executed() const { return executed_.load(); }
  uint64_t bad_wqes() const { return bad_wqes_.load(); }

  void start_engine() {
    run_ = true;
    engine_ = std::thread([this] { engine_loop(); });
  }
  void stop_engine() {
    run_ = false;
    if (engine_.joinable()) engine_.join();
  }

  // ---- device ----
  uint32_t device_count() override { return 1; }
  int device_info(uint32_t dev, proto::DeviceInfo& out) override {
    if (dev != 0) return -ENODEV;
    std::snprintf(out.name, sizeof(out.name), "droce0");
    out.node_guid = htobe64(0x020203fffe040506ull);
    out.phys_port_cnt = 1;
    return 0;
  }
  int query_device(uint32_t dev, ibv_device_attr& a) override {
    if (dev != 0) return -ENODEV;
    a = ibv_device_attr{};
    std::snprintf(a.fw_ver, sizeof(a.fw_ver), "0.1.0");
    a.node_guid = htobe64(0x020203fffe040506ull);
    a.sys_image_guid = a.node_guid;
    a.max_mr_size = 1ull << 40;
    a.page_size_cap = 0xfffff000;
    a.vendor_id = 0xffffff;
    a.vendor_part_id = 0;
    a.hw_ver = 0;
    a.max_qp = 1024;
    a.max_qp_wr = 4096;
    a.device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID;
    a.max_sge = DROCE_SHM_MAX_SGE;
    a.max_sge_rd = DROCE_SHM_MAX_SGE;
    a.max_cq = 1024;
    a.max_cqe = 32768;
    a.max_mr = 4096;
    a.max_pd = 1024;
    a.max_qp_rd_atom = 16;
    a.max_res_rd_atom = 16 * 1024;
    a.max_qp_init_rd_atom = 16;
    a.atomic_cap = IBV_ATOMIC_HCA;
    a.max_ah = 1024;
    a.max_srq = 1024;
    a.max_srq_wr = 4096;
    a.max_srq_sge = DROCE_SHM_MAX_SGE;
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
    return 0;
  }
  int query_port(uint32_t dev, uint32_t port, ibv_port_attr& p) override {
    if (dev != 0 || port != 1) return -EINVAL;
    p = ibv_port_attr{};
    p.state = IBV_PORT_ACTIVE;
    p.max_mtu = IBV_MTU_4096;
    p.active_mtu = IBV_MTU_1024;
    p.gid_tbl_len = 2;
    p.max_msg_sz = 1u << 31;
    p.pkey_tbl_len = 1;
    p.max_vl_num = 1;
    p.active_width = 1;   // 1X
    p.active_speed = 32;  // 25 Gb/s per lane
    p.phys_state = 5;     // LinkUp
    p.link_layer = IBV_LINK_LAYER_ETHERNET;
    return 0;
  }
  int query_gid_table(uint32_t dev, uint32_t port, ibv_gid_entry* out, uint32_t max) override {
    if (dev != 0 || port != 1) return -EINVAL;
    static const uint8_t g0[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0x03, 0xff, 0xfe, 0x04, 0x05, 0x06};
    static const uint8_t g1[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 99, 0, 1};
    const uint8_t* gids[2] = {g0, g1};
    uint32_t n = std::min<uint32_t>(2, max);
    for (uint32_t i = 0; i < n; i++) {
      out[i] = ibv_gid_entry{};
      std::memcpy(out[i].gid.raw, gids[i], 16);
      out[i].gid_index = i;
      out[i].port_num = 1;
      out[i].gid_type = IBV_GID_TYPE_ROCE_V2;
    }
    return static_cast<int>(n);
  }

  // ---- objects ----
  int alloc_pd(const ClientInfo& c, ObjId& out) override {
    std::lock_guard<std::mutex> g(mu_);
    out = next_id_++;
    pds_[out] = c.id;
    log("alloc_pd", c, out);
    return 0;
  }
  int dealloc_pd(const ClientInfo& c, ObjId pd) override {
    std::lock_guard<std::mutex> g(mu_);
    log("dealloc_pd", c, pd);
    return pds_.erase(pd) ? 0 : -ENOENT;
  }
  int reg_mr(const ClientInfo& c, const MrSetup& s, MrResult& out) override {
    std::lock_guard<std::mutex> g(mu_);
    out.id = next_id_++;
    out.lkey = out.rkey = static_cast<uint32_t>(out.id * 0x100 + 0x5a);
    mrs_[out.id] = Mr{s, out.lkey};
    log("reg_mr", c, out.id);
    return 0;
  }
  int dereg_mr(const ClientInfo& c, ObjId mr) override {
    std::lock_guard<std::mutex> g(mu_);
    log("dereg_mr", c, mr);
    return mrs_.erase(mr) ? 0 : -ENOENT;
  }
  int create_cq(const ClientInfo& c, const CqSetup& s, CqResult& out) override {
    std::lock_guard<std::mutex> g(mu_);
    Cq cq;
    if (!cq.ring.attach(s.ring, s.ring_entries)) return -EINVAL;
    cq.efd = s.eventfd;
    out.id = next_id_++;
    out.cqn = static_cast<uint32_t>(out.id);
    cqs_[out.id] = cq;
    log("create_cq", c, out.id);
    return 0;
  }
  int resize_cq(const ClientInfo& c, ObjId cq, droce_shm_ring_hdr* ring, uint32_t entries) override {
    std::lock_guard<std::mutex> g(mu_);
    auto it = cqs_.find(cq);
    if (it == cqs_.end()) return -ENOENT;
    log("resize_cq", c, cq);
    return ring_move_unread(it->second.ring, ring, entries, 0);
  }
  int destroy_cq(const ClientInfo& c, ObjId cq) override {
    std::lock_guard<std::mutex> g(mu_);
    log("destroy_cq", c, cq);
    return cqs_.erase(cq) ? 0 : -ENOENT;
  }
  int create_srq(const ClientInfo& c, const SrqSetup& s, SrqResult& out) override {
    std::lock_guard<std::mutex> g(mu_);
    Srq q;
    q.pd = s.pd;
    q.attr = s.attr;
    if (!q.ring.attach(s.ring, s.ring_entries)) return -EINVAL;
    out.id = next_id_++;
    out.srqn = static_cast<uint32_t>(out.id);
    srqs_[out.id] = q;
    log("create_srq", c, out.id);
    return 0;
  }
  int modify_srq(const ClientInfo& c, ObjId srq, const ibv_srq_attr& a, uint32_t mask) override {
    std::lock_guard<std::mutex> g(mu_);
    auto it = srqs_.find(srq);
    if (it == srqs_.end()) return -ENOENT;
    if (mask & IBV_SRQ_MAX_WR) return -EOPNOTSUPP;  // no resize
    if (mask & IBV_SRQ_LIMIT) it->second.attr.srq_limit = a.srq_limit;
    log("modify_srq", c, srq);
    return 0;
  }
  int query_srq(const ClientInfo&, ObjId srq, ibv_srq_attr& out) override {
    std::lock_guard<std::mutex> g(mu_);
    auto it = srqs_.find(srq);
    if (it == srqs_.end()) return -ENOENT;
    out = it->second.attr;
    return 0;
  }
  int destroy_srq(const ClientInfo& c, ObjId srq) override {
    std::lock_guard<std::mutex> g(mu_);
    log("destroy_srq", c, srq);
    return srqs_.erase(srq) ? 0 : -ENOENT;
  }
  int create_qp(const ClientInfo& c, const QpSetup& s, QpResult& out) override {
    std::lock_guard<std::mutex> g(mu_);
    Qp q;
    q.setup = s;
    if (!q.sq.attach(s.sq, s.sq_entries)) return -EINVAL;
    if (s.rq != nullptr && !q.rq.attach(s.rq, s.rq_entries)) return -EINVAL;
    q.attr.qp_state = IBV_QPS_RESET;
    out.id = next_id_++;
    out.qpn = 0x100 + static_cast<uint32_t>(out.id);
    q.qpn = out.qpn;
    qps_[out.id] = q;
    qpn_[out.qpn] = out.id;
    log("create_qp", c, out.id);
    return 0;
  }
  int modify_qp(const ClientInfo& c, ObjId qp, const ibv_qp_attr& a, uint32_t mask) override {
    std::lock_guard<std::mutex> g(mu_);
    auto it = qps_.find(qp);
    if (it == qps_.end()) return -ENOENT;
    Qp& q = it->second;
    if (!(mask & IBV_QP_STATE)) return -EINVAL;
    // The transitions of IBTA 10.3.1 that the tests use.
    ibv_qp_state from = q.attr.qp_state, to = a.qp_state;
    bool ok = to == IBV_QPS_RESET || to == IBV_QPS_ERR || (from == IBV_QPS_RESET && to == IBV_QPS_INIT) ||
              (from == IBV_QPS_INIT && (to == IBV_QPS_INIT || to == IBV_QPS_RTR)) ||
              (from == IBV_QPS_RTR && to == IBV_QPS_RTS) || (from == IBV_QPS_RTS && to == IBV_QPS_RTS);
    if (!ok) return -EINVAL;
    if (mask & IBV_QP_DEST_QPN) q.attr.dest_qp_num = a.dest_qp_num;
    if (mask & IBV_QP_QKEY) q.attr.qkey = a.qkey;
    if (mask & IBV_QP_ACCESS_FLAGS) q.attr.qp_access_flags = a.qp_access_flags;
    if (mask & IBV_QP_PATH_MTU) q.attr.path_mtu = a.path_mtu;
    if (mask & IBV_QP_AV) q.attr.ah_attr = a.ah_attr;
    if (mask & IBV_QP_SQ_PSN) q.attr.sq_psn = a.sq_psn;
    if (mask & IBV_QP_RQ_PSN) q.attr.rq_psn = a.rq_psn;
    if (mask & IBV_QP_PKEY_INDEX) q.attr.pkey_index = a.pkey_index;
    if (mask & IBV_QP_PORT) q.attr.port_num = a.port_num;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) q.attr.max_rd_atomic = a.max_rd_atomic;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) q.attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
    if (mask & IBV_QP_TIMEOUT) q.attr.timeout = a.timeout;
    if (mask & IBV_QP_RETRY_CNT) q.attr.retry_cnt = a.retry_cnt;
    if (mask & IBV_QP_RNR_RETRY) q.attr.rnr_retry = a.rnr_retry;
    if (mask & IBV_QP_MIN_RNR_TIMER) q.attr.min_rnr_timer = a.min_rnr_timer;
    q.attr.qp_state = to;
    // ERR flushes the receive queue (IBTA 10.3.1): programs such as rping
    // wait for those completions before they tear down.
    if (to == IBV_QPS_ERR && from != IBV_QPS_ERR && q.setup.srq == 0) {
      droce_shm_recv_wqe r;
      for (uint32_t i = 0; i < (1u << 20) && q.rq.try_pop(&r); i++) {
        recv_ring_set_done(q.rq.hdr(), q.rq.cons());
        droce_shm_cqe fc{};
        fc.wr_id = r.wr_id;
        fc.qp_num = q.qpn;
        fc.status = IBV_WC_WR_FLUSH_ERR;
        fc.opcode = IBV_WC_RECV;
        complete(q.setup.recv_cq, fc, false);
      }
    }
    log("modify_qp", c, qp);
    return 0;
  }
  int query_qp(const ClientInfo&, ObjId qp, uint32_t, ibv_qp_attr& out) override {
    std::lock_guard<std::mutex> g(mu_);
    auto it = qps_.find(qp);
    if (it == qps_.end()) return -ENOENT;
    out = it->second.attr;
    out.cur_qp_state = out.qp_state;
    out.cap = it->second.setup.cap;
    return 0;
  }
  int destroy_qp(const ClientInfo& c, ObjId qp) override {
    std::lock_guard<std::mutex> g(mu_);
    log("destroy_qp", c, qp);
    auto it = qps_.find(qp);
    if (it == qps_.end()) return -ENOENT;
    qpn_.erase(it->second.qpn);
    qps_.erase(it);
    return 0;
  }
  int create_ah(const ClientInfo& c, ObjId pd, const ibv_ah_attr& a, AhResult& out) override {
    std::lock_guard<std::mutex> g(mu_);
    out.id = next_id_++;
    out.ah_num = static_cast<uint32_t>(out.id);
    ahs_[out.id] = Ah{pd, a};
    log("create_ah", c, out.id);
    return 0;
  }
  int destroy_ah(const ClientInfo& c, ObjId ah) override {
    std::lock_guard<std::mutex> g(mu_);
    log("destroy_ah", c, ah);
    return ahs_.erase(ah) ? 0 : -ENOENT;
  }
  void client_gone(const ClientInfo& c) override {
    std::lock_guard<std::mutex> g(mu_);
    log("client_gone", c, 0);
  }

 private:
  struct Mr {
    MrSetup s;
    uint32_t key;
  };
  struct Cq {
    RingProducer<droce_shm_cqe> ring;
    int efd = -1;
  };
  struct Srq {
    ObjId pd;
    ibv_srq_attr attr;
    RingConsumer<droce_shm_recv_wqe> ring;
  };
  struct Qp {
    QpSetup setup;
    uint32_t qpn;
    ibv_qp_attr attr{};
    RingConsumer<droce_shm_send_wqe> sq;
    RingConsumer<droce_shm_recv_wqe> rq;
    std::deque<droce_shm_send_wqe> taken;  // consumed from the ring, waiting (RNR)
  };
  struct Ah {
    ObjId pd;
    ibv_ah_attr attr;
  };

  void log(const char* what, const ClientInfo& c, ObjId id) {
    calls_.push_back(std::string(what) + " client=" + std::to_string(c.id) + " id=" + std::to_string(id));
  }

  // Finds [addr, addr+len) in an MR of `pd` with `key` and `access`; returns
  // the daemon-side pointer or nullptr.
  uint8_t* resolve(ObjId pd, uint32_t key, uint64_t addr, uint64_t len, uint32_t access) {
    for (auto& [id, m] : mrs_) {
      if (m.key != key) continue;
      if (m.s.pd != pd || (m.s.access & access) != access) return nullptr;
      if (addr < m.s.iova || len > m.s.length || addr - m.s.iova > m.s.length - len) return nullptr;
      return static_cast<uint8_t*>(m.s.addr) + (addr - m.s.iova);
    }
    return nullptr;
  }

  void complete(ObjId cqid, const droce_shm_cqe& e, bool solicited) {
    auto it = cqs_.find(cqid);
    if (it == cqs_.end()) return;
    Cq& cq = it->second;
    if (!cq.ring.try_push(e)) {
      std::atomic_ref<uint32_t>(cq.ring.hdr()->overflows).fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (cq_consume_arm(cq.ring.hdr(), solicited || e.status != IBV_WC_SUCCESS) && cq.efd >= 0) {
      uint64_t one = 1;
      if (write(cq.efd, &one, sizeof(one)) < 0) {
        // eventfd full (2^64-2 events): the client is not reading; nothing to do
      }
    }
  }

  // Takes one receive WQE for QP d (its RQ or SRQ); false if none.
  // A receive is finished as soon as it is taken (it completes at once):
  // the ring's `done` follows cons.
  bool take_recv(Qp& d, droce_shm_recv_wqe& out) {
    RingConsumer<droce_shm_recv_wqe>* ring = &d.rq;
    if (d.setup.srq != 0) {
      auto it = srqs_.find(d.setup.srq);
      if (it == srqs_.end()) return false;
      ring = &it->second.ring;
    }
    if (!ring->try_pop(&out)) return false;
    recv_ring_set_done(ring->hdr(), ring->cons());
    return true;
  }

  // Copies n bytes of src into the receive WQE's SGEs; false on a bad SGE.
  bool scatter(Qp& d, const droce_shm_recv_wqe& r, const uint8_t* src, uint64_t n) {
    if (r.num_sge > DROCE_SHM_MAX_SGE) return false;
    for (uint32_t i = 0; i < r.num_sge && n > 0; i++) {
      uint64_t k = std::min<uint64_t>(n, r.sge[i].length);
      uint8_t* p = resolve(d.setup.pd, r.sge[i].lkey, r.sge[i].addr, k, IBV_ACCESS_LOCAL_WRITE);
      if (p == nullptr) return false;
      std::memcpy(p, src, k);
      src += k;
      n -= k;
    }
    return n == 0;
  }

  enum class Exec { Done, Retry };

  Exec execute(Qp& q, const droce_shm_send_wqe& w) {
    droce_shm_cqe sc{};
    sc.wr_id = w.wr_id;
    sc.qp_num = q.qpn;
    bool signaled = q.setup.sq_sig_all || (w.send_flags & DROCE_SEND_SIGNALED);
    auto finish = [&](ibv_wc_status st, ibv_wc_opcode op, uint32_t len) {
      sc.status = st;
      sc.opcode = op;
      sc.byte_len = len;
      if (st != IBV_WC_SUCCESS) bad_wqes_++;
      if (signaled || st != IBV_WC_SUCCESS) complete(q.setup.send_cq, sc, false);
      executed_++;
      return Exec::Done;
    };
    // Gather the local payload.
    std::vector<uint8_t>& buf = scratch_;
    buf.clear();
    bool is_read_or_atomic = w.opcode == DROCE_WR_RDMA_READ || w.opcode == DROCE_WR_ATOMIC_CMP_AND_SWP ||
                             w.opcode == DROCE_WR_ATOMIC_FETCH_AND_ADD;
    if (w.num_sge > DROCE_SHM_MAX_SGE || w.inline_len > DROCE_SHM_MAX_INLINE)
      return finish(IBV_WC_LOC_LEN_ERR, IBV_WC_SEND, 0);
    if ((w.send_flags & DROCE_SEND_INLINE) && !is_read_or_atomic) {
      buf.assign(w.u.inline_data, w.u.inline_data + w.inline_len);
    } else if (!is_read_or_atomic) {
      for (uint32_t i = 0; i < w.num_sge; i++) {
        const uint8_t* p = resolve(q.setup.pd, w.u.sge[i].lkey, w.u.sge[i].addr, w.u.sge[i].length, 0);
        if (p == nullptr) return finish(IBV_WC_LOC_PROT_ERR, IBV_WC_SEND, 0);
        buf.insert(buf.end(), p, p + w.u.sge[i].length);
      }
    }
    // Find the destination QP.
    uint32_t dqpn = q.setup.type == IBV_QPT_UD ? w.remote_qpn : q.attr.dest_qp_num;
    auto dit = qpn_.find(dqpn);
    bool dest_ok = dit != qpn_.end() && (qps_[dit->second].attr.qp_state == IBV_QPS_RTR ||
                                         qps_[dit->second].attr.qp_state == IBV_QPS_RTS);
    if (!dest_ok) {
      if (q.setup.type == IBV_QPT_RC) return finish(IBV_WC_RETRY_EXC_ERR, IBV_WC_SEND, 0);
      return finish(IBV_WC_SUCCESS, IBV_WC_SEND, static_cast<uint32_t>(buf.size()));  // lost on the wire
    }
    Qp& d = qps_[dit->second];
    if (d.setup.type != q.setup.type) return finish(IBV_WC_SUCCESS, IBV_WC_SEND, 0);
    if (q.setup.type == IBV_QPT_UD) {
      auto ait = ahs_.find(w.ah);
      if (ait == ahs_.end() || ait->second.pd != q.setup.pd) return finish(IBV_WC_LOC_QP_OP_ERR, IBV_WC_SEND, 0);
      if (w.remote_qkey != d.attr.qkey) return finish(IBV_WC_SUCCESS, IBV_WC_SEND, 0);  // dropped by the peer
    }
    switch (w.opcode) {
      case DROCE_WR_SEND:
      case DROCE_WR_SEND_WITH_IMM:
      case DROCE_WR_RDMA_WRITE_WITH_IMM: {
        if (w.opcode == DROCE_WR_RDMA_WRITE_WITH_IMM) {
          uint8_t* p = resolve(d.setup.pd, w.rkey, w.remote_addr, buf.size(), IBV_ACCESS_REMOTE_WRITE);
          if (p == nullptr) return finish(IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE, 0);
        }
        droce_shm_recv_wqe r;
        if (!take_recv(d, r)) {
          if (q.setup.type == IBV_QPT_RC) return Exec::Retry;  // RNR: try again later
          return finish(IBV_WC_SUCCESS, IBV_WC_SEND, 0);
        }
        droce_shm_cqe rc{};
        rc.wr_id = r.wr_id;
        rc.qp_num = d.qpn;
        rc.src_qp = q.qpn;
        bool ok;
        if (w.opcode == DROCE_WR_RDMA_WRITE_WITH_IMM) {
          std::memcpy(resolve(d.setup.pd, w.rkey, w.remote_addr, buf.size(), IBV_ACCESS_REMOTE_WRITE), buf.data(),
                      buf.size());
          rc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
          ok = true;
        } else if (q.setup.type == IBV_QPT_UD) {
          std::vector<uint8_t> grh(40 + buf.size(), 0);
          grh[0] = 0x60;
          std::memcpy(grh.data() + 40, buf.data(), buf.size());
          ok = scatter(d, r, grh.data(), grh.size());
          rc.opcode = IBV_WC_RECV;
          rc.wc_flags |= IBV_WC_GRH;
        } else {
          ok = scatter(d, r, buf.data(), buf.size());
          rc.opcode = IBV_WC_RECV;
        }
        rc.byte_len = static_cast<uint32_t>(buf.size() + (q.setup.type == IBV_QPT_UD ? 40 : 0));
        if (w.opcode != DROCE_WR_SEND) {
          rc.imm_data = w.imm_data;
          rc.wc_flags |= IBV_WC_WITH_IMM;
        }
        rc.status = ok ? IBV_WC_SUCCESS : IBV_WC_LOC_LEN_ERR;
        complete(d.setup.recv_cq, rc, (w.send_flags & DROCE_SEND_SOLICITED) != 0);
        if (!ok && q.setup.type == IBV_QPT_RC) return finish(IBV_WC_REM_INV_REQ_ERR, IBV_WC_SEND, 0);
        return finish(IBV_WC_SUCCESS, w.opcode == DROCE_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RDMA_WRITE : IBV_WC_SEND,
                      static_cast<uint32_t>(buf.size()));
      }
      case DROCE_WR_RDMA_WRITE: {
        uint8_t* p = resolve(d.setup.pd, w.rkey, w.remote_addr, buf.size(), IBV_ACCESS_REMOTE_WRITE);
        if (p == nullptr) return finish(IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE, 0);
        std::memcpy(p, buf.data(), buf.size());
        return finish(IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, static_cast<uint32_t>(buf.size()));
      }
      case DROCE_WR_RDMA_READ: {
        uint64_t total = 0;
        for (uint32_t i = 0; i < w.num_sge; i++) total += w.u.sge[i].length;
        const uint8_t* src = resolve(d.setup.pd, w.rkey, w.remote_addr, total, IBV_ACCESS_REMOTE_READ);
        if (src == nullptr) return finish(IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_READ, 0);
        for (uint32_t i = 0; i < w.num_sge; i++) {
          uint8_t* p = resolve(q.setup.pd, w.u.sge[i].lkey, w.u.sge[i].addr, w.u.sge[i].length, IBV_ACCESS_LOCAL_WRITE);
          if (p == nullptr) return finish(IBV_WC_LOC_PROT_ERR, IBV_WC_RDMA_READ, 0);
          std::memmove(p, src, w.u.sge[i].length);
          src += w.u.sge[i].length;
        }
        return finish(IBV_WC_SUCCESS, IBV_WC_RDMA_READ, static_cast<uint32_t>(total));
      }
      case DROCE_WR_ATOMIC_CMP_AND_SWP:
      case DROCE_WR_ATOMIC_FETCH_AND_ADD: {
        auto op = w.opcode == DROCE_WR_ATOMIC_CMP_AND_SWP ? IBV_WC_COMP_SWAP : IBV_WC_FETCH_ADD;
        if (w.num_sge != 1 || w.u.sge[0].length != 8 || w.remote_addr % 8) return finish(IBV_WC_LOC_LEN_ERR, op, 0);
        uint8_t* r = resolve(d.setup.pd, w.rkey, w.remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC);
        uint8_t* l = resolve(q.setup.pd, w.u.sge[0].lkey, w.u.sge[0].addr, 8, IBV_ACCESS_LOCAL_WRITE);
        if (r == nullptr) return finish(IBV_WC_REM_ACCESS_ERR, op, 0);
        if (l == nullptr) return finish(IBV_WC_LOC_PROT_ERR, op, 0);
        uint64_t old;
        std::memcpy(&old, r, 8);
        uint64_t nv = w.opcode == DROCE_WR_ATOMIC_CMP_AND_SWP ? (old == w.compare_add ? w.swap : old)
                                                              : old + w.compare_add;
        std::memcpy(r, &nv, 8);
        std::memcpy(l, &old, 8);
        return finish(IBV_WC_SUCCESS, op, 8);
      }
      default:
        return finish(IBV_WC_LOC_QP_OP_ERR, IBV_WC_SEND, 0);
    }
  }

  void engine_loop() {
    uint32_t idle = 0;
    while (run_.load(std::memory_order_relaxed)) {
      bool any = false;
      {
        std::lock_guard<std::mutex> g(mu_);
        for (auto& [id, q] : qps_) {
          if (q.attr.qp_state != IBV_QPS_RTS) continue;
          // WQEs that waited for a receive (RNR) go first, in order.
          while (!q.taken.empty() && execute(q, q.taken.front()) == Exec::Done) {
            q.taken.pop_front();
            any = true;
          }
          if (!q.taken.empty()) continue;
          uint32_t n = q.sq.available();
          for (uint32_t i = 0; i < n; i++) {
            droce_shm_send_wqe w;
            q.sq.copy(0, &w);  // copy out: the client may still write the slot
            // The slot goes back before the WQE's completion can be seen
            // (droce_shm_abi.h: a reaped completion implies a free slot).
            q.sq.release(1);
            any = true;
            if (execute(q, w) == Exec::Retry) {
              q.taken.push_back(w);
              break;
            }
          }
        }
      }
      if (!any && ++idle > 64) {
        usleep(50);
        idle = 0;
      }
    }
  }

  std::mutex mu_;
  std::vector<std::string> calls_;
  ObjId next_id_ = 1;
  std::map<ObjId, uint64_t> pds_;
  std::map<ObjId, Mr> mrs_;
  std::map<ObjId, Cq> cqs_;
  std::map<ObjId, Srq> srqs_;
  std::map<ObjId, Qp> qps_;
  std::map<uint32_t, ObjId> qpn_;
  std::map<ObjId, Ah> ahs_;
  std::vector<uint8_t> scratch_;
  std::thread engine_;
  std::atomic<bool> run_{false};
  std::atomic<uint64_t> executed_{0}, bad_wqes_{0};
};

}  // namespace droce::shim::test
