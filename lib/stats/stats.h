// droce/stats: per-core counters declared once, read by the control thread.
//
// A counter group is an enum plus a name table, declared together with
// DROCE_COUNTERS (an X-macro list, so the two cannot drift apart):
//
//   #define MY_QP_COUNTERS(X) X(tx_packets) X(retransmits) X(naks_psn_seq)
//   DROCE_COUNTERS(QpCounter, "qp", MY_QP_COUNTERS)
//
// gives `enum class QpCounter { tx_packets, retransmits, naks_psn_seq, kCount }`,
// `QpCounter_names` and `QpCounter_group` (a GroupDesc).
//
// Storage: a CounterBlock<E> is one writer's counters for one object (a port as
// seen by one core, one core, one QP), cache-line aligned so two cores never
// share a line. Only its owning core writes it, with a relaxed load + relaxed
// store (a plain add on x86, no lock prefix); the control thread reads it with
// relaxed loads. A value is therefore never torn, and a snapshot is exact per
// counter but not atomic across counters.
//
// Registry: the control side. Each counted object registers its blocks (one per
// writing core) under a group and an instance name; snapshot() sums the blocks
// of every instance. The transport registers its own groups the same way.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace droce::stats {

inline constexpr size_t kCacheLine = 64;

struct GroupDesc {
  std::string_view name;                    // "port", "core", "qp", ...
  std::span<const std::string_view> names;  // one per counter, in enum order
};

#define DROCE_COUNTER_ENUM_ENTRY_(n) n,
#define DROCE_COUNTER_NAME_ENTRY_(n) #n,
#define DROCE_COUNTERS(Enum, group_name, LIST)                                          \
  enum class Enum : uint32_t { LIST(DROCE_COUNTER_ENUM_ENTRY_) kCount };               \
  inline constexpr std::string_view Enum##_names[] = {LIST(DROCE_COUNTER_NAME_ENTRY_)}; \
  inline constexpr ::droce::stats::GroupDesc Enum##_group{group_name, Enum##_names};    \
  static_assert(std::size(Enum##_names) == static_cast<size_t>(Enum::kCount))

// One writer's counters for one object. E is a DROCE_COUNTERS enum.
template <class E>
struct alignas(kCacheLine) CounterBlock {
  static constexpr size_t kSize = static_cast<size_t>(E::kCount);
  std::atomic<uint64_t> v[kSize] = {};

  // Owning core only.
  void add(E e, uint64_t n = 1) noexcept {
    std::atomic<uint64_t>& c = v[static_cast<size_t>(e)];
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  // Owning core only; for gauges (ring occupancy, ...).
  void set(E e, uint64_t n) noexcept { v[static_cast<size_t>(e)].store(n, std::memory_order_relaxed); }
  // Any thread.
  uint64_t get(E e) const noexcept { return v[static_cast<size_t>(e)].load(std::memory_order_relaxed); }
  const std::atomic<uint64_t>* data() const noexcept { return v; }
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// n blocks (one per core), each on its own cache lines.
template <class E>
class PerCore {
 public:
  explicit PerCore(size_t cores) : n_(cores), blocks_(std::make_unique<CounterBlock<E>[]>(cores)) {}
  CounterBlock<E>& operator[](size_t core) noexcept { return blocks_[core]; }
  const CounterBlock<E>& operator[](size_t core) const noexcept { return blocks_[core]; }
  size_t size() const noexcept { return n_; }
  uint64_t sum(E e) const noexcept {
    uint64_t s = 0;
    for (size_t i = 0; i < n_; ++i) s += blocks_[i].get(e);
    return s;
  }
  std::vector<const std::atomic<uint64_t>*> shards() const {
    std::vector<const std::atomic<uint64_t>*> out;
    for (size_t i = 0; i < n_; ++i) out.push_back(blocks_[i].data());
    return out;
  }

 private:
  size_t n_;
  std::unique_ptr<CounterBlock<E>[]> blocks_;
};

struct InstanceSnapshot {
  std::string name;
  std::vector<uint64_t> values;               // summed over the instance's shards, in name order
  std::vector<std::vector<uint64_t>> shards;  // per shard (writer core), only when asked for
  std::vector<std::string> shard_labels;      // with shards: label_shards() names, else "0", "1", ...
};

struct GroupSnapshot {
  std::string group;
  std::vector<std::string> names;
  std::vector<InstanceSnapshot> instances;  // in registration order
};

using Snapshot = std::vector<GroupSnapshot>;  // groups in order of first registration

class Registry {
 public:
  using Id = uint64_t;

  // Registers `instance` of group `g`; its counters are the sum of `shards`,
  // each an array of g.names.size() counters. The group descriptor and the
  // shards must stay alive until remove(). Throws std::invalid_argument when a
  // different descriptor with the same group name was registered before, or
  // the instance name is taken in that group.
  Id add(const GroupDesc& g, std::string instance, std::vector<const std::atomic<uint64_t>*> shards);

  // The same for counters kept as plain uint64_t arrays (or structs of
  // uint64_t fields) by a single writer, e.g. an engine's own counter block.
  // They are read with relaxed atomic loads (__atomic_load_n): an aligned
  // 64-bit value is never torn on the targets droce runs on; a value may lag
  // while the writer keeps it in a register.
  Id add_plain(const GroupDesc& g, std::string instance, std::vector<const uint64_t*> shards);

  template <class E>
  Id add(const GroupDesc& g, std::string instance, const PerCore<E>& blocks) {
    check_size(g, CounterBlock<E>::kSize);
    return add(g, std::move(instance), blocks.shards());
  }
  template <class E>
  Id add(const GroupDesc& g, std::string instance, const CounterBlock<E>& block) {
    check_size(g, CounterBlock<E>::kSize);
    return add(g, std::move(instance), {block.data()});
  }

  // Names the shards of an instance (e.g. by lcore) for per-shard snapshots.
  // False when the id is unknown or the count differs.
  bool label_shards(Id id, std::vector<std::string> labels);

  // Unregisters; false when the id is unknown.
  bool remove(Id id);

  // Sums every instance (of `group` only, when not empty). With nonzero, drops
  // counters that are zero in every instance of a group and groups left empty.
  // With per_shard, also gives each shard's own values.
  Snapshot snapshot(std::string_view group = {}, bool nonzero = false, bool per_shard = false) const;

  std::vector<std::string> groups() const;

 private:
  static void check_size(const GroupDesc& g, size_t n);
  struct Entry {
    Id id;
    const GroupDesc* group;
    std::string instance;
    std::vector<const std::atomic<uint64_t>*> shards;
    std::vector<const uint64_t*> plain;  // add_plain(): read with __atomic_load_n
    std::vector<std::string> labels;
  };
  Id add_entry(const GroupDesc& g, std::string instance, std::vector<const std::atomic<uint64_t>*> shards,
               std::vector<const uint64_t*> plain);
  mutable std::mutex mu_;
  std::vector<const GroupDesc*> groups_;
  std::vector<Entry> entries_;
  Id next_id_ = 1;
};

}  // namespace droce::stats
