// The transport engine: one device's QPs, run to completion on one thread.
//
//   poll():  rx_burst -> parse -> dispatch by QPN -> responder / completer
//            -> timers (by elapsed time on the Clock) -> responder output
//            (read responses, ACK/NAK) -> requester -> tx_burst
//
// Control-path calls (create_*, modify_qp, post_*) are made on the engine's
// thread too. Nothing on the packet path allocates, locks, throws or logs.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "io/packet_io.h"
#include "transport/qp.h"
#include "wire/icrc.h"
#include "verbs/mr.h"
#include "verbs/mw.h"
#include "verbs/queues.h"

namespace droce::transport {

// The general services QP (GSI, IBTA 13.4.6): QPN 1, a UD QP whose Q_Key is
// fixed (the CM's MADs travel on it). cm/mad.h has the same values.
inline constexpr uint32_t kGsiQpn = 1;
inline constexpr uint32_t kGsiQkey = 0x80010000;

// Engine counters: enum + name table (engine.cc).
enum class Ctr : uint16_t {
  RxFrames,
  RxParseErr,    // not RoCEv2 or malformed
  RxIcrcErr,     // ICRC mismatch (corruption)
  RxNoQp,        // unknown destination QPN
  RxBadState,    // QP cannot receive in its state
  RxBadTransport,  // opcode of another service type than the QP's
  RxBadPkey,       // P_Key does not match the port's (full or limited default)
  TxFrames,
  TxNoBuf,       // no TX buffer; packet not sent (retried later or lost)
  ReqPackets,    // request packets sent (new and retransmitted)
  ReqRetransmits,
  ReqGatherErr,  // a source MR vanished while its WQE was in flight (LOC_PROT_ERR, nothing sent)
  AckTimeouts,
  RetryExceeded,
  RnrRetryExceeded,
  AcksSent,
  AcksReceived,
  SeqNakSent,
  SeqNakReceived,
  RnrNakSent,
  RnrNakReceived,
  ErrNakSent,     // invalid request / remote access / remote operational
  ErrNakReceived,
  ReadRespSent,
  ReadRespReceived,
  AtomicExecuted,
  AtomicReplayed,
  ReadReplayed,
  DupRequest,
  OutOfSeqRequest,
  GhostResponse,   // response for nothing outstanding / duplicate response
  UcMsgDropped,
  UdQkeyDrop,
  UdNoRecvDrop,
  UdLenDrop,
  CeReceived,
  CnpSent,
  CnpSuppressed,  // rate limit
  CnpReceived,
  CqOverrun,
  TxZeroCopy,    // payload packets sent by reference (PktBuf::ext, registered memory read in place)
  TxCopied,      // payload packets whose payload was copied into the TX buffer
  AckLostOnDestroy,  // a QP destroyed with its ACK/NAK still unsent (TX full throughout)
  WindowCuts,        // RC congestion window reductions (ACK timeout, NAK sequence error, lost response)
  RxBadRkey,    // RC/UC request refused: R_Key unknown, invalidated, of another PD, or lacking the access right
  RxBadVa,      // RC/UC request refused: VA/length outside the MR, misaligned atomic
  RxBadLength,  // RC/UC request refused: payload length does not fit the opcode, the MTU, the RETH or the receive
  RespMrGone,        // an MR deregistered while a WRITE was arriving or a READ was being answered (NAK, QP to error)
  RxBadSrcAddr,      // RC/UC packet from another address than the QP's remote one, or to another of ours
  RxMcast,           // frames to QPN 0xFFFFFF (a multicast group), before fan-out
  RxMcastNoGroup,    // multicast frame dropped: not a multicast address, or no QP of ours attached to it
  McastDelivered,    // copies of multicast frames handed to attached QPs (Q_Key checked after: ud_qkey_drop)
  // Selective repeat (README: Selective repeat between droce peers).
  SrOooPlaced,       // responder: marked WRITE ONLY packets placed ahead of the expected PSN
  SrDup,             // responder: a held PSN arriving again (not placed twice)
  SrSackSent,        // responder: SACKs sent
  SrGbnNakSent,      // responder: marked go-back NAKs (an out-of-order packet it could not hold)
  SrSackReceived,    // requester: SACKs taken
  SrResent,          // requester: packets resent selectively
  SrFallbacks,       // requester: a listed peer answered a marked request with a plain NAK: marks stop
  SrLearned,         // a QP saw a marked request from its peer and marks its own from then on
  TailRetransmits,   // requester: early resends of a lost tail (EngineConfig::tail_timeout_ns)
  kCount
};
const char* ctr_name(Ctr c) noexcept;

struct EngineConfig {
  wire::MacAddr mac{};
  wire::Gid gid{};  // source address (usually IPv4-mapped, GID index 1 as rxe)
  // Source addresses for IPv6 destinations: a packet never carries an IPv4-mapped
  // source with an IPv6 destination (a peer such as rxe matches the source against
  // the QP's address and drops it). fe80::/10 destinations get gid6_link_local,
  // others gid6_global (else the link-local one); zero: fall back to `gid`.
  wire::Gid gid6_link_local{};
  wire::Gid gid6_global{};
  uint32_t max_qps = 1024;  // QPNs 2 .. max_qps-1
  // QPN partition (several engines, one per core, sharing a port): this engine
  // hands out only QPNs with qpn % qpn_stride == qpn_offset.
  uint32_t qpn_stride = 1;
  uint32_t qpn_offset = 0;
  // Seeds (0 = random from getrandom): key_seed drives the MR key tags (engines
  // sharing a port's replicated MR table must share it), qpn_seed the order in
  // which QPNs are handed out (not a predictable sequence; tests may fix both).
  uint64_t key_seed = 0;
  uint64_t qpn_seed = 0;
  // MR table storage: caller's block (e.g. hugepages); nullptr = engine allocates.
  void* mr_mem = nullptr;
  size_t mr_mem_bytes = 0;
  uint32_t max_mrs = 4096;
  // Memory windows (verbs::MwTable, allocated at construction; shares key_seed).
  uint32_t max_mws = 1024;
  verbs::Mtu port_mtu = verbs::Mtu::M1024;  // active MTU of the port: UD QPs use it (no PATH_MTU on UD)
  // The largest path MTU the port's link carries (verbs::max_mtu_for_link):
  // modify_qp refuses a larger one with EINVAL (a QP could never send its packets).
  verbs::Mtu max_mtu = verbs::Mtu::M4096;
  uint32_t max_inflight_pkts = 1024;  // go-back-N window (PSNs) per QP
  // RC congestion window (packets) per QP, between min_inflight_pkts and
  // max_inflight_pkts: starts at initial_inflight_pkts, is halved on a NAK sequence error
  // or a lost READ response and drops to the minimum on a local ACK timeout,
  // grows back on ACK progress (slow start to half the window before the last
  // timeout, then one packet per window). min >= max: a fixed window.
  uint32_t min_inflight_pkts = 8;
  // The window a QP starts with when it enters RTS; it grows by slow start
  // (one PSN per PSN acknowledged) up to max_inflight_pkts. 0: start at the
  // maximum (nothing lost on a clean network). A small first window keeps
  // many QPs that start at once from overflowing a shallow switch queue
  // before any congestion signal (ECN/CNP) can reach them, as TCP's initial
  // window does; a CNP (DCQCN on) ends slow start. Ignored with a fixed
  // window (min >= max).
  uint32_t initial_inflight_pkts = 0;
  uint32_t ack_req_every = 32;        // AckReq at least every N packets of a long message
  // Tail-loss probe (TCP's TLP, RFC 8985; IRN's short RTO_low, Mittal et
  // al. 2018): an RC QP with packets unacknowledged and no acknowledgment for
  // tail_timeout_ns resends its last packet sent, again after 3x, 7x and 15x
  // that while nothing comes back (tail_deadline), without spending
  // retry_cnt, cutting the window or moving the ACK deadline. A lost last
  // packet of a burst or its lost ACK, which no later packet can reveal by a
  // NAK, then costs this instead of the local ACK timeout (4.096 us x
  // 2^timeout; 2.1 s for the timeout of 19 Linux's RDMA CM asks for on RoCE):
  // the responder ACKs the probe as a duplicate (IBTA 9.7.5.1.2) when it had
  // everything, takes it when it was the one lost, or NAKs it when earlier
  // ones were. A probe that was not needed costs one frame. 0: off (only the
  // ACK timeout); probes that would fall at or after the ACK deadline are not sent.
  uint64_t tail_timeout_ns = 0;
  uint32_t pkts_per_turn = 32;        // requester packets per QP before moving on (fairness)
  // ECN. Reaction side: data packets (requests and responses) leave ECT(0)
  // when `ecn` is set, Not-ECT otherwise (a switch then never marks them).
  // Notification point (IBTA annex A17.9.2; NVIDIA's roce_np defaults): a
  // CE-marked packet makes a CNP to its sender when `cnp` is set, at most one
  // per QP per cnp_interval_ns (min_time_between_cnps), with DSCP cnp_dscp and,
  // when the CNP carries a VLAN tag, priority (PCP) cnp_prio; CNPs are Not-ECT.
  bool ecn = true;
  bool cnp = true;
  uint64_t cnp_interval_ns = 4'000;
  uint8_t cnp_dscp = 48;  // 0..63
  uint8_t cnp_prio = 6;   // 0..7
  // DCQCN reaction point per RC/UC QP (lib/transport/dcqcn.h): a CNP lowers
  // the QP's rate and the requester paces its packets at it. Off by default
  // until the bottleneck tests of issue 13 set the defaults.
  bool dcqcn = false;
  dcqcn::Params dcqcn_params;
  // Selective repeat between droce peers (README): off by default. When on, an
  // RC QP marks its requests (BTH resv7 bit 0x40) and repairs losses
  // selectively toward a peer whose GID is in sr_peers, or that marked a request
  // to it first; it accepts out-of-order WRITE packets of marked requests and
  // answers them with SACKs. Toward any other peer nothing changes on the wire.
  bool selective_repeat = false;
  std::vector<wire::Gid> sr_peers;
  // Timers (ACK timeout, RNR wait) sit on a wheel of 32768 slots whose tick is
  // the power of two at or below timer_scan_ns: a poll visits only the QPs whose
  // timer is due, each within one tick of its time. A backstop sweep also looks
  // at timer_scan_batch QPs (round robin) every timer_sweep_ns.
  uint64_t timer_scan_ns = 2'000;
  uint32_t timer_scan_batch = 64;
  uint64_t timer_sweep_ns = 1'000'000;
  // Zero-copy TX: payloads of at least this many bytes from an MR with a
  // zero-copy handle (MrTable::set_dma) go by reference when the backend can
  // (PacketIo::zero_copy_tx); smaller ones are copied. 0: always copy.
  // Default 4096: with the ICRC computed in software the CPU reads the payload
  // anyway, and attaching costs two more mbufs and atomic refcounts, which a
  // memcpy of 1-2 KB beats (test/bench/bench_zero_copy: 0.9x at MTU 1024 and
  // 2048, 1.1x at 4096).
  uint32_t zero_copy_min = 4096;
  // Multicast (attach_mcast): groups this engine's QPs may join, and QPs per
  // group; both tables are allocated at construction (Linux rxe: 8192 x 56).
  uint32_t max_mcast_groups = 64;
  uint32_t max_mcast_qps_per_group = 16;
  // post_send on the engine's own thread, outside poll(), while the engine is
  // quiet (nothing queued, the last poll's requester sent nothing): the
  // requester runs at once and the packet leaves in that call instead of at the
  // next poll (README: The fast path). A burst of posts still leaves as one TX
  // burst: only the first of them goes at once.
  bool send_inline = true;
};

class Engine {
 public:
  static constexpr uint16_t kBurst = 32;

  Engine(const EngineConfig& cfg, io::PacketIo& io, const io::Clock& clock);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // ---- control path (verbs) ----
  verbs::Pd alloc_pd() noexcept { return verbs::Pd{++pd_seq_}; }
  verbs::MrTable& mrs() noexcept { return *mrs_; }
  int reg_mr(verbs::Pd pd, void* addr, uint64_t len, uint32_t access, uint32_t* key) noexcept {
    return mrs_->reg(pd, addr, len, access, key);
  }
  // 0, EINVAL, EBUSY (memory windows are bound to it).
  int dereg_mr(uint32_t key) noexcept { return mrs_->dereg(key); }
  // Deregisters even with windows bound: they become unbound first (what a
  // dying client's cleanup needs; the windows' keys then give remote access errors).
  int dereg_mr_force(uint32_t key) noexcept {
    mws_->unbind_mr(key);
    return mrs_->dereg(key);
  }
  // Memory windows: ibv_alloc_mw / ibv_dealloc_mw (0, EINVAL, ENOMEM). Binding
  // is a BIND_MW work request (post_send); LOCAL_INV and SEND with Invalidate
  // invalidate type 2 windows.
  verbs::MwTable& mws() noexcept { return *mws_; }
  int alloc_mw(verbs::Pd pd, verbs::MwType type, uint32_t* key) noexcept { return mws_->alloc(pd, type, key); }
  int dealloc_mw(uint32_t key) noexcept { return mws_->dealloc(key); }
  // The same naming the window by the key alloc_mw gave (whatever binds did since).
  int dealloc_mw_any_key(uint32_t key) noexcept { return mws_->dealloc(mws_->current_key(key)); }
  // Remote access through an rkey arriving on QP q: an MR or a window (O(1)).
  uint8_t* rkey_lookup(uint32_t key, const Qp& q, uint64_t va, uint64_t len, uint32_t access, verbs::MrError* err,
                       void** dma = nullptr) const noexcept {
    return mws_->lookup_remote(key, q.pd, q.qpn, va, len, access, err, dma);
  }
  // SEND with Invalidate / LOCAL_INV: a type 2 window or a kMrRemoteInvalidate MR of pd.
  bool can_invalidate(uint32_t key, uint32_t pd) const noexcept {
    return verbs::is_mw_key(key) ? mws_->can_invalidate(key, pd) : mrs_->can_invalidate(key, pd);
  }
  bool invalidate(uint32_t key, uint32_t pd) noexcept {
    return verbs::is_mw_key(key) ? mws_->invalidate(key, pd) : mrs_->invalidate(key, pd);
  }
  verbs::Cq* create_cq(uint32_t cqe);
  verbs::Srq* create_srq(verbs::Pd pd, uint32_t max_wr);
  // ibv_create_ah: an address handle for UD work requests (owned by the engine).
  const verbs::Ah* create_ah(verbs::Pd pd, const verbs::Ah& attr);
  // Frees a CQ / SRQ no QP uses any more: 0, EINVAL (not this engine's), EBUSY (a QP uses it).
  int destroy_cq(verbs::Cq* cq);
  int destroy_srq(verbs::Srq* srq);
  int create_qp(const verbs::QpInitAttr& init, uint32_t* qpn);
  // The GSI QP: QPN 1 (kGsiQpn), UD, whatever this engine's QPN partition;
  // its Q_Key is kGsiQkey (modify_qp refuses another: EINVAL). It takes
  // packets from any source, like every UD QP, checked by Q_Key. Only one per
  // engine: EEXIST when QPN 1 exists; EINVAL for another QP type. QP0 (SMI)
  // does not exist on RoCE and stays unreachable.
  int create_gsi_qp(const verbs::QpInitAttr& init, uint32_t* qpn);
  int destroy_qp(uint32_t qpn);
  int modify_qp(uint32_t qpn, const verbs::QpAttr& attr, uint32_t mask) noexcept;
  int query_qp(uint32_t qpn, verbs::QpAttr* attr) const noexcept;
  // ibv_attach_mcast / ibv_detach_mcast: a UD QP joins (leaves) the multicast
  // group `mgid` (wire::gid_is_multicast); packets to QPN 0xFFFFFF for that
  // address are delivered to every attached QP whose Q_Key matches. Attach:
  // 0 (also when already attached), EINVAL (no such QP, not UD, not a multicast
  // GID), ENOMEM (no free group slot or the group is full). Detach: 0, EINVAL
  // (not attached). destroy_qp detaches the QP from every group.
  int attach_mcast(uint32_t qpn, const wire::Gid& mgid) noexcept;
  int detach_mcast(uint32_t qpn, const wire::Gid& mgid) noexcept;
  // Number of QPs attached to mgid (0 when no such group).
  uint32_t mcast_members(const wire::Gid& mgid) const noexcept;
  // Memberships (QP, group) of this engine in total. Written by the engine's
  // thread, readable from any thread (relaxed): the dataplane's classifier
  // sends multicast frames only to the cores whose engine has members.
  uint32_t mcast_memberships() const noexcept { return mcast_memberships_.load(std::memory_order_relaxed); }
  // The groups with at least one member (control path).
  std::vector<wire::Gid> mcast_groups() const;
  int post_send(uint32_t qpn, const verbs::SendWr& wr) noexcept;
  int post_recv(uint32_t qpn, const verbs::RecvWr& wr) noexcept;
  // The same on a QP the caller holds (qp(qpn), valid until destroy_qp): no
  // lookup in the QP table, which with many QPs is a cache miss of its own.
  int post_send(Qp& q, const verbs::SendWr& wr) noexcept;
  int post_recv(Qp& q, const verbs::RecvWr& wr) noexcept;
  // For a caller that posts to many QPs in an order it knows ahead (README:
  // The fast path, thirteenth session): prefetch_post(q) a few posts before
  // posting to q asks for the QP lines a post reads and writes;
  // prefetch_post_wqe(q) one post before, for the send queue entry the post
  // will write (its address is on a line prefetch_post asked for).
  static void prefetch_post(const Qp& q) noexcept { q.prefetch_post(); }
  static void prefetch_post_wqe(const Qp& q) noexcept { q.prefetch_post_wqe(); }
  // With at least this many QPs the poll loop prefetches the QPs of a burst
  // (prefetch_rx, requester order); with fewer they stay in the caches anyway.
  // A caller's own hints (above) pay from the same count.
  static constexpr size_t kPrefetchMinQps = 64;
  int post_srq_recv(verbs::Srq* srq, const verbs::RecvWr& wr) noexcept { return srq->post(wr); }

  // ---- data path ----
  // One pass of the loop at time now_ns (from the engine's clock when omitted).
  // Returns the number of packets received + sent.
  uint32_t poll(uint64_t now_ns) noexcept;
  uint32_t poll() noexcept { return poll(clock_.now_ns()); }
  // Earliest time a timer of this engine fires (ACK timeout, RNR wait), or UINT64_MAX.
  uint64_t next_timer_ns() const noexcept;
  bool idle() const noexcept;  // nothing queued to send

  uint64_t counter(Ctr c) const noexcept { return ctr_.v[static_cast<size_t>(c)]; }
  // Control path: f(name, value) for every counter, e.g. for a stats dump.
  template <typename F>
  void for_each_counter(F&& f) const {
    for (size_t i = 0; i < static_cast<size_t>(Ctr::kCount); ++i) f(ctr_name(static_cast<Ctr>(i)), ctr_.v[i]);
  }
  Qp* qp(uint32_t qpn) noexcept { return qpn < qps_.size() ? qps_[qpn].get() : nullptr; }
  const EngineConfig& config() const noexcept { return cfg_; }
  // Congestion control at run time, on the engine's thread between bursts
  // (Dataplane::set_cc runs it through the core's command ring): takes ecn,
  // cnp, cnp_interval_ns, cnp_dscp, cnp_prio, dcqcn and dcqcn_params from c. QPs
  // already connected switch their ECT marking, and their reaction points
  // restart at line rate with the new parameters.
  void set_cc(const EngineConfig& c) noexcept;
  // The source address for packets to `dst` (same family; link-local for link-local). O(1).
  const wire::Gid& source_gid(const wire::Gid& dst) const noexcept;
  uint64_t now() const noexcept { return now_; }

  // ---- used by requester/responder/completer (engine thread only) ----
  void count(Ctr c, uint64_t n = 1) noexcept { ctr_.v[static_cast<size_t>(c)] += n; }
  // Starts a frame for a payload of payload_len bytes: writes its headers into
  // a TX buffer and returns where the payload goes (nullptr: no buffer). From
  // whole headers (UD requests, CNPs), or from a connected QP's prebuilt
  // template and this packet's fields (the fast path).
  uint8_t* begin_frame(const wire::Headers& h, uint32_t payload_len) noexcept;
  uint8_t* begin_frame(const wire::TxTemplate& t, const wire::PacketFields& f, uint32_t payload_len) noexcept;
  // Writes pad + ICRC and queues the frame begun last for TX (its payload is in place).
  void end_frame() noexcept;
  // Ends the frame begun last (dst: what begin_frame returned) with its payload,
  // the payload_len bytes at src (inside an MR; dma: its zero-copy handle or
  // nullptr): by reference when the backend and the size allow, copied otherwise.
  void end_frame_with(uint8_t* dst, const uint8_t* src, void* dma) noexcept;
  // A connected QP's packet whose payload (len bytes at src, inside an MR) is
  // copied, in one call: header from the template, payload, pad and ICRC,
  // queued for TX (the same bytes as begin_frame + end_frame_with). False:
  // no TX buffer. by_reference says when end_frame_with would not copy.
  bool emit_copy(const wire::TxTemplate& t, const wire::PacketFields& f, const uint8_t* src, uint32_t len) noexcept;
  bool by_reference(const void* dma, uint32_t len) const noexcept {
    return dma && zero_copy_ && len >= cfg_.zero_copy_min;
  }
  // Drops the frame begun last (its buffer goes back to the spares).
  void abort_frame() noexcept {
    spare_[spare_len_++] = cur_;
    cur_ = nullptr;
  }
  bool tx_room() const noexcept { return !tx_blocked_; }
  void req_ready(Qp& qp) noexcept;
  // The QP's ACK or RNR timer was set (comp.deadline, comp.rnr_until): puts it on
  // the wheel for that time unless it is already on it for an earlier one (an
  // entry due early finds the later time and goes back on). O(1).
  void timer_arm(Qp& qp) noexcept;
  void resp_ready(Qp& qp) noexcept;
  // keep_responses: responses already owed (READ/atomic before a NAK) still go out, then the NAK.
  void qp_to_error(Qp& qp, bool keep_responses = false) noexcept;
  // UC/UD: a send error moves the QP to SQE (send queue flushed, receive side keeps working).
  void sq_to_error(Qp& qp) noexcept;
  void complete(verbs::Cq* cq, const verbs::Wc& wc) noexcept;
  void send_cnp(Qp& qp, const wire::PacketView& pkt) noexcept;

 private:
  void prefetch_rx(io::PktBuf* const* b, uint16_t n) noexcept;
  void rx(io::PktBuf* b) noexcept;
  void rx_mcast(const wire::PacketView& pkt) noexcept;
  // One multicast group: its MGID and the QPNs attached (count, then the slots).
  struct McastGroup {
    wire::Gid mgid{};
    uint32_t n = 0;  // 0: free slot
  };
  McastGroup* find_group(const wire::Gid& mgid) noexcept;
  uint32_t* group_qpns(size_t g) noexcept { return &mcast_qpns_[g * cfg_.max_mcast_qps_per_group]; }
  Qp& install_qp(uint32_t n, const verbs::QpInitAttr& init);
  void run_timers() noexcept;
  void fire_slot(uint32_t slot) noexcept;
  void timer_link(Qp& qp, uint64_t at) noexcept;
  void timer_unlink(Qp& qp) noexcept;
  void flush_tx() noexcept;
  // post_send's fast way out: runs the requester of q now when the engine is
  // quiet; false: q goes on the ready list as usual.
  bool send_inline(Qp& q) noexcept;
  void flush_queues(Qp& qp, bool send_only = false) noexcept;
  void build_template(Qp& qp) noexcept;
  void reset_transport(Qp& qp) noexcept;
  // An RC QP entering RTR or later gets max_dest_rd_atomic responder resources
  // (grown, never shrunk, while the QP lives; freed at RESET). False: no memory.
  bool reserve_resp_resources(Qp& qp, const verbs::QpAttr& attr, uint32_t mask) noexcept;
  // The responder's state back to its start, keeping the resource array.
  static void clear_resp(RespState& r) noexcept;

  EngineConfig cfg_;
  io::PacketIo& io_;
  const io::Clock& clock_;
  uint64_t now_ = 0;
  uint64_t last_timer_sweep_ = 0;
  size_t timer_cursor_ = 0;
  // 2^17 ticks of 1024 ns (the default) span 134 ms: a QP armed with the default ACK
  // timeout (67 ms, timeout 14) waits one turn, not two (README: Known limits, Timers).
  static constexpr uint32_t kWheelSlots = 1u << 17;
  std::unique_ptr<Qp*[]> wheel_;  // slot heads (doubly linked through Qp::tw_prev/tw_next)
  uint32_t tick_shift_ = 0;       // a tick is 1 << tick_shift_ ns
  uint64_t wheel_tick_ = 0;       // the next tick whose slot is processed

  std::unique_ptr<uint8_t[]> mr_mem_owned_;
  std::unique_ptr<verbs::MrTable> mrs_;
  std::unique_ptr<verbs::MwTable> mws_;
  uint32_t pd_seq_ = 0;
  uint64_t qpn_rng_ = 0;  // xorshift state for the QPN search start
  std::vector<std::unique_ptr<Qp>> qps_;  // indexed by QPN
  std::vector<Qp*> live_qps_;
  std::vector<std::unique_ptr<verbs::Cq>> cqs_;
  std::vector<std::unique_ptr<verbs::Srq>> srqs_;
  std::vector<std::unique_ptr<verbs::Ah>> ahs_;
  std::vector<McastGroup> mcast_;      // max_mcast_groups slots
  std::vector<uint32_t> mcast_qpns_;   // max_mcast_groups x max_mcast_qps_per_group
  std::atomic<uint32_t> mcast_memberships_{0};

  // Ready lists: FIFO rings of QPs with work (capacity max_qps, each QP at most once).
  std::unique_ptr<Qp*[]> req_q_, resp_q_;
  uint32_t req_head_ = 0, req_tail_ = 0, resp_head_ = 0, resp_tail_ = 0, q_mask_ = 0;

  // TX: buffers lent by the backend and the batch being filled.
  io::PktBuf* spare_[kBurst]{};
  uint16_t spare_len_ = 0;
  io::PktBuf* tx_[kBurst]{};
  uint16_t tx_len_ = 0;
  // Frames of the TX batch built by emit_copy whose ICRC is still to be
  // computed: flush_tx computes them for the batch at once (see
  // wire::icrc_compute_burst) just before the batch leaves.
  wire::IcrcPkt icrc_pend_[kBurst]{};
  uint16_t icrc_pend_len_ = 0;
  void finish_icrcs() noexcept;
  io::PktBuf* cur_ = nullptr;  // frame between begin_frame and end_frame
  wire::FrameShape cur_shape_;
  uint32_t cur_plen_ = 0;
  io::PktBuf* take_tx_buf(size_t frame_len) noexcept;
  bool tx_blocked_ = false;
  // send_inline: the thread that runs poll() (post_send on any other keeps to
  // the ready list), poll() running, and whether the last poll's requester sent
  // nothing (cleared by a packet sent inline until the next poll).
  pthread_t owner_{};
  bool in_poll_ = false;
  bool req_quiet_ = false;
  bool zero_copy_ = false;  // io_.zero_copy_tx() && zero_copy_min != 0

  struct alignas(64) Counters {
    uint64_t v[static_cast<size_t>(Ctr::kCount)]{};
  } ctr_;
};

// Modules (one file each, each an explicit state machine).
// requester.cc: turns SQ WQEs into request packets; returns true if the QP
// still has packets it could send now.
bool requester_run(Engine& e, Qp& qp, uint32_t budget) noexcept;
// Go-back-N: make the requester resend from psn.
void requester_rewind(Engine& e, Qp& qp, uint32_t psn) noexcept;
// responder.cc
void responder_rx(Engine& e, Qp& qp, const wire::PacketView& pkt) noexcept;
bool responder_tx(Engine& e, Qp& qp, uint32_t budget) noexcept;
// completer.cc
void completer_rx(Engine& e, Qp& qp, const wire::PacketView& pkt) noexcept;
void completer_timer(Engine& e, Qp& qp, uint64_t now) noexcept;
void completer_retire(Engine& e, Qp& qp) noexcept;

// When an RC QP's next tail-loss probe is due (EngineConfig::tail_timeout_ns):
// T, 3T, 7T and 15T after its last progress (T = tail_timeout_ns; the
// progress time is the ACK deadline minus the ACK timeout, the deadline the
// probes leave as it is) while anything is unacknowledged, and before the
// ACK deadline; 0 when none is. (completer.cc)
constexpr uint8_t kMaxTailResends = 4;
uint64_t tail_deadline(const EngineConfig& c, const Qp& q) noexcept;

// Helpers shared by the modules: wc_opcode_of (engine.cc), the SGE list
// access below (sge.cc).
verbs::WcOpcode wc_opcode_of(verbs::WrOpcode op) noexcept;
// The bytes [off, off+len) of a WQE's SGE list when they lie in one SGE: their
// address and the MR's zero-copy handle (dma). nullptr otherwise (inline data,
// spread over SGEs, bad key).
const uint8_t* gather_ref(const verbs::MrTable& mrs, uint32_t pd, const verbs::SendWqe& w, uint32_t off,
                          uint32_t len, void** dma) noexcept;
// Copies len bytes at byte offset off of a WQE's data (SGEs or inline) to dst.
bool gather(const verbs::MrTable& mrs, uint32_t pd, const verbs::SendWqe& w, uint32_t off, uint8_t* dst,
            uint32_t len) noexcept;
// Copies len bytes from src to byte offset off of an SGE list (LOCAL_WRITE checked).
bool scatter(const verbs::MrTable& mrs, uint32_t pd, const verbs::Sge* sge, uint32_t num_sge, uint32_t off,
             const uint8_t* src, uint32_t len) noexcept;

}  // namespace droce::transport
