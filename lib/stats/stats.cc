#include "stats/stats.h"

#include <algorithm>
#include <stdexcept>

namespace droce::stats {

void Registry::check_size(const GroupDesc& g, size_t n) {
  if (g.names.size() != n) {
    throw std::invalid_argument("stats: group " + std::string(g.name) + " has " + std::to_string(g.names.size()) +
                                " names but its blocks hold " + std::to_string(n) + " counters");
  }
}

Registry::Id Registry::add(const GroupDesc& g, std::string instance,
                           std::vector<const std::atomic<uint64_t>*> shards) {
  return add_entry(g, std::move(instance), std::move(shards), {});
}

Registry::Id Registry::add_plain(const GroupDesc& g, std::string instance, std::vector<const uint64_t*> shards) {
  return add_entry(g, std::move(instance), {}, std::move(shards));
}

Registry::Id Registry::add_entry(const GroupDesc& g, std::string instance,
                                 std::vector<const std::atomic<uint64_t>*> shards, std::vector<const uint64_t*> plain) {
  std::lock_guard lock(mu_);
  const GroupDesc* known = nullptr;
  for (const GroupDesc* d : groups_) {
    if (d->name == g.name) known = d;
  }
  if (known != nullptr && known != &g &&
      !std::equal(known->names.begin(), known->names.end(), g.names.begin(), g.names.end())) {
    throw std::invalid_argument("stats: group " + std::string(g.name) + " is already registered with other counters");
  }
  for (const Entry& e : entries_) {
    if (e.group->name == g.name && e.instance == instance) {
      throw std::invalid_argument("stats: " + std::string(g.name) + " " + instance + " is already registered");
    }
  }
  if (known == nullptr) {
    groups_.push_back(&g);
    known = &g;
  }
  Id id = next_id_++;
  entries_.push_back(Entry{id, known, std::move(instance), std::move(shards), std::move(plain), {}});
  return id;
}

bool Registry::label_shards(Id id, std::vector<std::string> labels) {
  std::lock_guard lock(mu_);
  for (Entry& e : entries_) {
    if (e.id != id) continue;
    if (labels.size() != e.shards.size() + e.plain.size()) return false;
    e.labels = std::move(labels);
    return true;
  }
  return false;
}

bool Registry::remove(Id id) {
  std::lock_guard lock(mu_);
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.id == id; });
  if (it == entries_.end()) return false;
  entries_.erase(it);
  return true;
}

std::vector<std::string> Registry::groups() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const GroupDesc* g : groups_) out.emplace_back(g->name);
  return out;
}

Snapshot Registry::snapshot(std::string_view group, bool nonzero, bool per_shard) const {
  std::lock_guard lock(mu_);
  Snapshot out;
  for (const GroupDesc* g : groups_) {
    if (!group.empty() && g->name != group) continue;
    GroupSnapshot gs;
    gs.group = std::string(g->name);
    const size_t n = g->names.size();
    for (const Entry& e : entries_) {
      if (e.group != g) continue;
      InstanceSnapshot is{e.instance, std::vector<uint64_t>(n, 0), {}, {}};
      auto take = [&](auto load) {
        std::vector<uint64_t> own(per_shard ? n : 0);
        for (size_t i = 0; i < n; ++i) {
          uint64_t v = load(i);
          is.values[i] += v;
          if (per_shard) own[i] = v;
        }
        if (per_shard) {
          is.shard_labels.push_back(e.labels.empty() ? std::to_string(is.shards.size()) : e.labels[is.shards.size()]);
          is.shards.push_back(std::move(own));
        }
      };
      for (const std::atomic<uint64_t>* shard : e.shards) {
        take([shard](size_t i) { return shard[i].load(std::memory_order_relaxed); });
      }
      for (const uint64_t* shard : e.plain) {
        take([shard](size_t i) { return __atomic_load_n(shard + i, __ATOMIC_RELAXED); });
      }
      gs.instances.push_back(std::move(is));
    }
    std::vector<bool> keep(n, !nonzero);
    if (nonzero) {
      for (const InstanceSnapshot& is : gs.instances) {
        for (size_t i = 0; i < n; ++i) keep[i] = keep[i] || is.values[i] != 0;
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (keep[i]) gs.names.emplace_back(g->names[i]);
    }
    if (nonzero) {
      auto filter = [&](std::vector<uint64_t>& values) {
        std::vector<uint64_t> v;
        for (size_t i = 0; i < n; ++i) {
          if (keep[i]) v.push_back(values[i]);
        }
        values = std::move(v);
      };
      for (InstanceSnapshot& is : gs.instances) {
        filter(is.values);
        for (auto& sh : is.shards) filter(sh);
      }
      if (gs.names.empty()) continue;
    }
    out.push_back(std::move(gs));
  }
  return out;
}

}  // namespace droce::stats
