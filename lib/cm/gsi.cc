#include "cm/gsi.h"

#include <cerrno>
#include <cstring>

namespace droce::cm {

static_assert(transport::kGsiQpn == kGsiQpn && transport::kGsiQkey == kGsiQkey);

namespace {
constexpr const char* kNames[] = {"rx_mads", "rx_short",  "rx_bad_grh", "rx_err",  "tx_mads",   "tx_done",
                                  "tx_err",  "tx_no_mac", "tx_no_buf",  "tx_bad_arg", "recoveries"};
static_assert(std::size(kNames) == static_cast<size_t>(GsiCtr::kCount));

wire::Gid mapped(const uint8_t* v4) noexcept {
  wire::Gid g{};
  g[10] = g[11] = 0xFF;
  std::memcpy(g.data() + 12, v4, 4);
  return g;
}
}  // namespace

const char* gsi_ctr_name(GsiCtr c) noexcept {
  const auto i = static_cast<size_t>(c);
  return i < std::size(kNames) ? kNames[i] : "?";
}

Gsi::Gsi(transport::Engine& eng, const GsiConfig& cfg, Resolver resolve, IsLocal is_local)
    : eng_(eng), cfg_(cfg), resolve_(std::move(resolve)), is_local_(std::move(is_local)) {}

Gsi::~Gsi() {
  if (open_) eng_.destroy_qp(kGsiQpn);
  if (scq_) eng_.destroy_cq(scq_);
  if (rcq_) eng_.destroy_cq(rcq_);
  if (own_mr_) eng_.dereg_mr(lkey_);
}

int Gsi::open() {
  if (open_) return EEXIST;
  if (cfg_.pd.handle == 0 || cfg_.recv_bufs == 0 || cfg_.send_bufs == 0 || cfg_.recv_bufs > (1u << 16) ||
      cfg_.send_bufs > (1u << 16))
    return EINVAL;
  if (eng_.qp(kGsiQpn)) return EEXIST;
  const size_t need = bytes_for(cfg_.recv_bufs, cfg_.send_bufs);
  if (cfg_.mem.empty()) {
    own_mem_.reset(new uint8_t[need]());
    mem_ = own_mem_.get();
  } else {
    if (cfg_.mem.size() < need) return EINVAL;
    mem_ = cfg_.mem.data();
  }
  lkey_ = cfg_.lkey;
  if (lkey_ == 0) {
    if (int rc = eng_.reg_mr(cfg_.pd, mem_, need, verbs::kAccessLocalWrite, &lkey_)) return rc;
    own_mr_ = true;
  }
  scq_ = eng_.create_cq(cfg_.send_bufs);
  rcq_ = eng_.create_cq(cfg_.recv_bufs);
  if (!scq_ || !rcq_) return ENOMEM;
  verbs::QpInitAttr init;
  init.qp_type = verbs::QpType::UD;
  init.pd = cfg_.pd.handle;
  init.send_cq = scq_;
  init.recv_cq = rcq_;
  init.cap.max_send_wr = cfg_.send_bufs;
  init.cap.max_recv_wr = cfg_.recv_bufs;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  uint32_t qpn = 0;
  if (int rc = eng_.create_gsi_qp(init, &qpn)) return rc;
  open_ = true;
  verbs::QpAttr a;
  a.qp_state = verbs::QpState::Init;
  a.qkey = kGsiQkey;
  int rc = eng_.modify_qp(qpn, a, verbs::kQpState | verbs::kQpPkeyIndex | verbs::kQpPort | verbs::kQpQkey);
  a.qp_state = verbs::QpState::Rtr;
  if (!rc) rc = eng_.modify_qp(qpn, a, verbs::kQpState);
  a.qp_state = verbs::QpState::Rts;
  a.sq_psn = 0;
  if (!rc) rc = eng_.modify_qp(qpn, a, verbs::kQpState | verbs::kQpSqPsn);
  if (rc) return rc;
  for (uint32_t i = 0; i < cfg_.recv_bufs; ++i)
    if (!post_recv(i)) return ENOMEM;
  free_send_.reserve(cfg_.send_bufs);
  for (uint32_t i = cfg_.send_bufs; i > 0; --i) free_send_.push_back(i - 1);
  return 0;
}

bool Gsi::post_recv(uint32_t i) noexcept {
  verbs::RecvWr r;
  r.wr_id = i;
  r.num_sge = 1;
  r.sg_list[0] = {reinterpret_cast<uint64_t>(recv_buf(i)), static_cast<uint32_t>(kGsiRecvBytes), lkey_};
  return eng_.post_recv(kGsiQpn, r) == 0;
}

void Gsi::recover() noexcept {
  // A UD send error moves QP1 to SQE (the receive side keeps working): back
  // to RTS. ERR (the dataplane stopping) is left alone.
  transport::Qp* q = eng_.qp(kGsiQpn);
  if (!q) return;
  verbs::QpAttr a;
  if (q->state == verbs::QpState::Sqe) {
    a.qp_state = verbs::QpState::Rts;
    if (eng_.modify_qp(kGsiQpn, a, verbs::kQpState) == 0) count(GsiCtr::Recoveries);
  }
}

uint32_t Gsi::poll() noexcept {
  if (!open_) return 0;
  uint32_t seen = 0;
  verbs::Wc wc[16];
  int n;
  // Bounded: at most one CQ's worth per call.
  for (uint32_t budget = cfg_.recv_bufs; budget > 0 && (n = rcq_->poll(wc, 16)) > 0;
       budget = budget > static_cast<uint32_t>(n) ? budget - static_cast<uint32_t>(n) : 0) {
    for (int k = 0; k < n; ++k) {
      const verbs::Wc& c = wc[k];
      ++seen;
      const auto i = static_cast<uint32_t>(c.wr_id);
      if (i >= cfg_.recv_bufs) continue;  // not ours: cannot happen
      if (c.status == verbs::WcStatus::WrFlushErr) continue;  // QP1 went to ERR (stopping): not reposted
      if (c.status != verbs::WcStatus::Success) {
        count(GsiCtr::RxErr);
      } else if (c.byte_len < kGsiRecvBytes) {
        count(GsiCtr::RxShort);
      } else {
        const uint8_t* g = recv_buf(i);
        wire::Gid src, dst;
        bool ok = true;
        if ((g[0] >> 4) == 6) {  // IPv6 header as the GRH
          std::memcpy(src.data(), g + 8, 16);
          std::memcpy(dst.data(), g + 24, 16);
        } else if ((g[20] >> 4) == 4) {  // IPv4 header in the GRH's last 20 bytes
          src = mapped(g + 20 + 12);
          dst = mapped(g + 20 + 16);
        } else {
          ok = false;
          count(GsiCtr::RxBadGrh);
        }
        if (ok) {
          count(GsiCtr::RxMads);
          if (handler_) handler_(src, dst, c.src_qp, {g + verbs::kGrhBytes, kMadSize});
        }
      }
      post_recv(i);
    }
  }
  while ((n = scq_->poll(wc, 16)) > 0) {
    bool err = false;
    for (int k = 0; k < n; ++k) {
      ++seen;
      const auto i = static_cast<uint32_t>(wc[k].wr_id);
      if (wc[k].status == verbs::WcStatus::Success) {
        count(GsiCtr::TxDone);
      } else {
        count(GsiCtr::TxErr);
        err = true;
      }
      if (i < cfg_.send_bufs && free_send_.size() < cfg_.send_bufs) free_send_.push_back(i);
    }
    if (err) recover();
  }
  return seen;
}

bool Gsi::send_mad(const wire::Gid& /*local*/, const wire::Gid& remote, uint8_t traffic_class,
                   std::span<const uint8_t> mad) {
  if (!open_ || mad.size() != kMadSize) {
    count(GsiCtr::TxBadArg);
    return false;
  }
  if (free_send_.empty()) {
    count(GsiCtr::TxNoBuf);
    return false;
  }
  // The engine copies the address vector into the WQE at post time, so no
  // engine AH is created (Engine::create_ah has no destroy): nothing grows
  // with the number of peers.
  verbs::Ah ah;
  if (!resolve_ || !resolve_(remote, ah.dmac)) {
    count(GsiCtr::TxNoMac);
    return false;
  }
  ah.dgid = remote;
  ah.traffic_class = static_cast<uint8_t>(traffic_class & ~wire::kEcnMask);
  ah.hop_limit = cfg_.hop_limit;
  const uint32_t i = free_send_.back();
  std::memcpy(send_buf(i), mad.data(), kMadSize);
  verbs::SendWr w;
  w.wr_id = i;
  w.opcode = verbs::WrOpcode::Send;
  w.send_flags = verbs::kSendSignaled;
  w.num_sge = 1;
  w.sg_list[0] = {reinterpret_cast<uint64_t>(send_buf(i)), static_cast<uint32_t>(kMadSize), lkey_};
  w.ud.ah = &ah;
  w.ud.remote_qpn = kGsiQpn;
  w.ud.remote_qkey = kGsiQkey;
  if (eng_.post_send(kGsiQpn, w) != 0) {
    count(GsiCtr::TxBadArg);
    recover();
    return false;
  }
  free_send_.pop_back();
  count(GsiCtr::TxMads);
  return true;
}

}  // namespace droce::cm
