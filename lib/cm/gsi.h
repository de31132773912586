// cm::Gsi: QP1 (the GSI QP) on one transport::Engine, the wire side of a
// port's cm::Agent (README.md). It owns the QP, its two CQs and a block of
// registered memory cut into N receive buffers (40-byte GRH + 256-byte MAD,
// reposted after each completion) and M send buffers (one MAD each). poll()
// hands each MAD received to the handler (the Agent's on_mad) with the sender's
// address from the GRH; send_mad() sends one to a peer's QP1.
//
// Engine thread only (the port's home core in droced, the application's poll
// loop when embedded). Control path: MADs, not data packets; poll() and
// send_mad() do not allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "cm/agent.h"
#include "cm/mad.h"
#include "transport/engine.h"
#include "wire/headers.h"

namespace droce::cm {

constexpr size_t kGsiRecvBytes = verbs::kGrhBytes + kMadSize;  // 296

struct GsiConfig {
  verbs::Pd pd;               // of the engine (or, in a Dataplane, one alloc_pd() of it)
  uint32_t recv_bufs = 64;    // N: MADs that can wait in the receive queue
  uint32_t send_bufs = 64;    // M: MADs in flight on the send queue
  uint8_t hop_limit = 64;
  // Registered memory of at least bytes_for(recv_bufs, send_bufs) bytes: with
  // lkey != 0 the caller registered it (e.g. Dataplane::reg_mr on every core of
  // the port); with lkey 0 the Gsi registers it on the engine (and deregisters
  // it when destroyed). Empty: the Gsi allocates and registers its own.
  std::span<uint8_t> mem;
  uint32_t lkey = 0;
};

enum class GsiCtr : uint8_t {
  RxMads,     // MADs handed to the handler
  RxShort,    // a receive of fewer than GRH + 256 bytes (not a MAD): dropped
  RxBadGrh,   // a GRH that is neither IPv4 nor IPv6: dropped
  RxErr,      // a receive completion with an error status (e.g. a datagram larger than a MAD)
  TxMads,     // MADs posted to the send queue
  TxDone,     // their send completions (success)
  TxErr,      // send completions with an error (the QP recovers from SQE)
  TxNoMac,    // send_mad refused: the peer's MAC is not known yet (asked)
  TxNoBuf,    // send_mad refused: every send buffer in flight
  TxBadArg,   // send_mad refused: not 256 bytes, or the engine refused the WR
  Recoveries, // QP1 moved back from SQE/ERR to RTS
  kCount
};
const char* gsi_ctr_name(GsiCtr c) noexcept;

class Gsi final : public Agent::Io {
 public:
  // The peer's MAC on this port: true with mac set when known; false while it
  // is not (the resolver asks ARP/ND once, without blocking; the Agent's
  // retry timer sends the MAD again).
  using Resolver = std::function<bool(const wire::Gid& ip, wire::MacAddr& mac)>;
  using IsLocal = std::function<bool(const wire::Gid& ip)>;
  using Handler = std::function<void(const wire::Gid& src, const wire::Gid& dst, uint32_t src_qp,
                                     std::span<const uint8_t> mad)>;

  static constexpr size_t bytes_for(uint32_t recv_bufs, uint32_t send_bufs) noexcept {
    return size_t{recv_bufs} * kGsiRecvBytes + size_t{send_bufs} * kMadSize;
  }

  Gsi(transport::Engine& eng, const GsiConfig& cfg, Resolver resolve, IsLocal is_local);
  ~Gsi() override;  // destroys QP1, its CQs and its own registration
  Gsi(const Gsi&) = delete;
  Gsi& operator=(const Gsi&) = delete;

  // Creates QP1 (Engine::create_gsi_qp), brings it to RTS and posts the
  // receive buffers. 0 or an errno (EEXIST: the engine has a QP1 already;
  // EINVAL: bad config or memory too small; ENOMEM).
  int open();
  bool is_open() const noexcept { return open_; }

  // Where received MADs go (before the first poll()).
  void set_handler(Handler h) { handler_ = std::move(h); }
  void attach(Agent& a) {
    set_handler([&a](const wire::Gid& src, const wire::Gid& dst, uint32_t src_qp, std::span<const uint8_t> mad) {
      a.on_mad(src, dst, src_qp, mad);
    });
  }

  // Reaps both CQs: each MAD received goes to the handler, its buffer is
  // reposted; each send completion frees its buffer. Returns completions seen.
  uint32_t poll() noexcept;
  // True when poll() has nothing to do (no completion on either CQ): a check
  // of two ring indexes, for a caller that polls on every turn of a busy loop.
  bool idle() const noexcept { return !open_ || (rcq_->pending() == 0 && scq_->pending() == 0); }

  // Agent::Io. `local` is where the peer's answer should go; the engine sends
  // from its source address for `remote`'s family (Engine::source_gid), which
  // is the port's address for that family.
  bool send_mad(const wire::Gid& local, const wire::Gid& remote, uint8_t traffic_class,
                std::span<const uint8_t> mad) override;
  bool is_local(const wire::Gid& ip) const override { return is_local_ && is_local_(ip); }

  uint64_t counter(GsiCtr c) const noexcept { return ctr_[static_cast<size_t>(c)]; }
  template <typename F>
  void for_each_counter(F&& f) const {
    for (size_t i = 0; i < static_cast<size_t>(GsiCtr::kCount); ++i) f(gsi_ctr_name(static_cast<GsiCtr>(i)), ctr_[i]);
  }
  uint32_t sends_in_flight() const noexcept { return cfg_.send_bufs - static_cast<uint32_t>(free_send_.size()); }

 private:
  void count(GsiCtr c) noexcept { ++ctr_[static_cast<size_t>(c)]; }
  bool post_recv(uint32_t i) noexcept;
  void recover() noexcept;
  uint8_t* recv_buf(uint32_t i) noexcept { return mem_ + size_t{i} * kGsiRecvBytes; }
  uint8_t* send_buf(uint32_t i) noexcept {
    return mem_ + size_t{cfg_.recv_bufs} * kGsiRecvBytes + size_t{i} * kMadSize;
  }

  transport::Engine& eng_;
  GsiConfig cfg_;
  Resolver resolve_;
  IsLocal is_local_;
  Handler handler_;
  std::unique_ptr<uint8_t[]> own_mem_;
  uint8_t* mem_ = nullptr;
  uint32_t lkey_ = 0;
  bool own_mr_ = false;
  bool open_ = false;
  verbs::Cq* scq_ = nullptr;
  verbs::Cq* rcq_ = nullptr;
  std::vector<uint32_t> free_send_;  // indexes of idle send buffers (capacity M, never grows)
  uint64_t ctr_[static_cast<size_t>(GsiCtr::kCount)]{};
};

}  // namespace droce::cm
