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
  std::atomic<uint64_t> seed{1};
  std::atomic<uint64_t> generation{0};

  uint32_t get(FaultDir d, FaultKind k) const noexcept {
    return threshold[static_cast<size_t>(d)][static_cast<size_t>(k)].load(std::memory_order_relaxed);
  }
  bool active(FaultDir d) const noexcept {
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
  }
  void publish() noexcept { generation.fetch_add(1, std::memory_order_release); }
  FaultRates rates(FaultDir d) const noexcept {
    return FaultRates{fault_probability(get(d, FaultKind::drop)), fault_probability(get(d, FaultKind::duplicate)),
                      fault_probability(get(d, FaultKind::reorder)), fault_probability(get(d, FaultKind::corrupt))};
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
