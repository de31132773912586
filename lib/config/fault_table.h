// The run-time fault-injection settings of every port: initialised from the
// [port.fault] config, changed by the control thread (`droce-ctl fault set`),
// read by the poll-mode cores once per burst.
//
// Probabilities are stored as 32-bit thresholds (p * 2^32, saturated) so a core
// decides with one compare against a 32-bit random number. Each value is an
// independent relaxed atomic; `generation` is bumped (release) after a change
// so a core that caches the values re-reads them when it changes (acquire).
#pragma once

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "config/config.h"

namespace droce::config {

enum class FaultDir : uint8_t { rx = 0, tx = 1 };
enum class FaultKind : uint8_t { drop = 0, duplicate = 1, reorder = 2, corrupt = 3 };
inline constexpr size_t kFaultKinds = 4;

inline uint32_t fault_threshold(double p) {
  if (!(p > 0)) return 0;
  double v = std::round(p * 4294967296.0);
  return v >= 4294967295.0 ? UINT32_MAX : static_cast<uint32_t>(v);
}
inline double fault_probability(uint32_t t) { return t == UINT32_MAX ? 1.0 : static_cast<double>(t) / 4294967296.0; }

struct alignas(64) PortFaults {
  std::atomic<uint32_t> threshold[2][kFaultKinds] = {};
  // Bottleneck mode per direction (fault::Bottleneck): a core re-reads it when
  // generation changes, like the thresholds.
  std::atomic<uint64_t> bn_rate_bps[2] = {}, bn_rate_pps[2] = {}, bn_kmin[2] = {}, bn_kmax[2] = {}, bn_limit[2] = {};
  std::atomic<uint32_t> bn_pmax[2] = {};  // threshold, as the probabilities
  std::atomic<bool> bn_ecn[2] = {};
  std::atomic<bool> bn_mark_dequeue[2] = {};
  std::atomic<uint64_t> bn_pfc_xoff[2] = {}, bn_pfc_xon[2] = {};
  std::atomic<uint64_t> seed{1};
  std::atomic<uint64_t> generation{0};

  uint32_t get(FaultDir d, FaultKind k) const noexcept {
    return threshold[static_cast<size_t>(d)][static_cast<size_t>(k)].load(std::memory_order_relaxed);
  }
  bool active(FaultDir d) const noexcept {
    if (bn_rate_bps[static_cast<size_t>(d)].load(std::memory_order_relaxed) != 0 ||
        bn_rate_pps[static_cast<size_t>(d)].load(std::memory_order_relaxed) != 0)
      return true;
    for (size_t k = 0; k < kFaultKinds; ++k) {
      if (threshold[static_cast<size_t>(d)][k].load(std::memory_order_relaxed) != 0) return true;
    }
    return false;
  }
  // Control thread.
  void set(FaultDir d, FaultKind k, double p) noexcept {
    threshold[static_cast<size_t>(d)][static_cast<size_t>(k)].store(fault_threshold(p), std::memory_order_relaxed);
  }
  void set_rates(FaultDir d, const FaultRates& r) noexcept {
    set(d, FaultKind::drop, r.drop);
    set(d, FaultKind::duplicate, r.duplicate);
    set(d, FaultKind::reorder, r.reorder);
    set(d, FaultKind::corrupt, r.corrupt);
    set_bottleneck(d, r.bottleneck);
  }
  void set_bottleneck(FaultDir d, const fault::Bottleneck& b) noexcept {
    const size_t i = static_cast<size_t>(d);
    bn_rate_bps[i].store(b.rate_bps, std::memory_order_relaxed);
    bn_rate_pps[i].store(b.rate_pps, std::memory_order_relaxed);
    bn_kmin[i].store(b.kmin_bytes, std::memory_order_relaxed);
    bn_kmax[i].store(b.kmax_bytes, std::memory_order_relaxed);
    bn_limit[i].store(b.limit_bytes, std::memory_order_relaxed);
    bn_pmax[i].store(fault_threshold(b.pmax), std::memory_order_relaxed);
    bn_ecn[i].store(b.ecn, std::memory_order_relaxed);
    bn_mark_dequeue[i].store(b.mark_dequeue, std::memory_order_relaxed);
    bn_pfc_xoff[i].store(b.pfc_xoff_bytes, std::memory_order_relaxed);
    bn_pfc_xon[i].store(b.pfc_xon_bytes, std::memory_order_relaxed);
  }
  fault::Bottleneck bottleneck(FaultDir d) const noexcept {
    const size_t i = static_cast<size_t>(d);
    fault::Bottleneck b;
    b.rate_bps = bn_rate_bps[i].load(std::memory_order_relaxed);
    b.rate_pps = bn_rate_pps[i].load(std::memory_order_relaxed);
    b.kmin_bytes = bn_kmin[i].load(std::memory_order_relaxed);
    b.kmax_bytes = bn_kmax[i].load(std::memory_order_relaxed);
    b.limit_bytes = bn_limit[i].load(std::memory_order_relaxed);
    b.pmax = fault_probability(bn_pmax[i].load(std::memory_order_relaxed));
    b.ecn = bn_ecn[i].load(std::memory_order_relaxed);
    b.mark_dequeue = bn_mark_dequeue[i].load(std::memory_order_relaxed);
    b.pfc_xoff_bytes = bn_pfc_xoff[i].load(std::memory_order_relaxed);
    b.pfc_xon_bytes = bn_pfc_xon[i].load(std::memory_order_relaxed);
    return b;
  }
  void publish() noexcept { generation.fetch_add(1, std::memory_order_release); }
  FaultRates rates(FaultDir d) const noexcept {
    return FaultRates{fault_probability(get(d, FaultKind::drop)), fault_probability(get(d, FaultKind::duplicate)),
                      fault_probability(get(d, FaultKind::reorder)), fault_probability(get(d, FaultKind::corrupt)),
                      bottleneck(d)};
  }
};

class FaultTable {
 public:
  explicit FaultTable(const std::vector<PortConfig>& ports)
      : n_(ports.size()), ports_(std::make_unique<PortFaults[]>(ports.size())) {
    for (size_t i = 0; i < n_; ++i) {
      ports_[i].set_rates(FaultDir::rx, ports[i].fault.rx);
      ports_[i].set_rates(FaultDir::tx, ports[i].fault.tx);
      ports_[i].seed.store(ports[i].fault.seed, std::memory_order_relaxed);
      ports_[i].publish();
    }
  }
  size_t size() const noexcept { return n_; }
  PortFaults& operator[](size_t port) noexcept { return ports_[port]; }
  const PortFaults& operator[](size_t port) const noexcept { return ports_[port]; }

 private:
  size_t n_;
  std::unique_ptr<PortFaults[]> ports_;
};

}  // namespace droce::config
