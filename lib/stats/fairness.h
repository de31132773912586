// Jain's fairness index (Jain, Chiu, Hawe 1984) of per-flow throughputs:
// (sum x)^2 / (n * sum x^2), 1 when every flow gets the same, 1/n when one
// flow gets everything. Shared by the DCQCN bottleneck tests and droce-perf's
// multi-QP report.
#pragma once

#include <span>

namespace droce::stats {

// Empty input, or every flow at 0: 1 (nothing is unfair). Negative values are
// taken as given (callers pass rates, which are not negative).
inline double jain_index(std::span<const double> x) noexcept {
  double sum = 0, sq = 0;
  for (const double v : x) {
    sum += v;
    sq += v * v;
  }
  if (x.empty() || sq == 0) return 1.0;
  return sum * sum / (static_cast<double>(x.size()) * sq);
}

}  // namespace droce::stats
