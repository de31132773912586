// Which of a port's n cores owns QPN q: q % n (QPN 1, the GSI QP, on the
// home core, index 0). The classifier asks it per frame, so the remainder is
// Lemire's "fastmod" (Lemire, Kaser, Kurz: "Faster remainder by direct
// computation", 2019): two multiplications instead of a division, exact for
// every 32-bit q and n >= 1 (test/engine/test_qpn_owner.cc checks it against
// %). Set once when the port's cores are known (control path).
#pragma once

#include <cstdint>

#include "transport/engine.h"

namespace droce::engine {

class QpnOwner {
 public:
  QpnOwner() = default;
  explicit QpnOwner(uint32_t n) noexcept : n_(n ? n : 1), m_(~uint64_t{0} / n_ + 1) {}
  uint32_t cores() const noexcept { return n_; }
  // q % n.
  uint32_t mod(uint32_t q) const noexcept {
    __extension__ using u128 = unsigned __int128;
    const uint64_t low = m_ * q;
    return static_cast<uint32_t>((static_cast<u128>(low) * n_) >> 64);
  }
  // The index (into the port's cores) of the core that owns QPN q.
  uint32_t of(uint32_t q) const noexcept { return n_ == 1 || q == transport::kGsiQpn ? 0 : mod(q); }

 private:
  uint32_t n_ = 1;
  uint64_t m_ = 0;  // ceil(2^64 / n); 0 for n == 1 (mod() is then 0 for every q)
};

}  // namespace droce::engine
