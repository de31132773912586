#include "dpdk/eal.h"

#include <rte_eal.h>
#include <rte_errno.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

namespace droce::dpdk {
namespace {

std::atomic<bool> g_eal_up{false};

bool has_flag(const std::vector<std::string>& args, std::initializer_list<const char*> names) {
  for (const auto& a : args)
    for (const char* n : names) {
      const size_t len = std::strlen(n);
      // "--flag", "--flag=value" and the short form "-aVALUE".
      if (a == n) return true;
      if (a.size() > len && a.compare(0, len, n) == 0 && (a[len] == '=' || n[1] != '-')) return true;
    }
  return false;
}

}  // namespace

long Eal::free_hugepages() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return -1;
  char line[256];
  long n = -1;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "HugePages_Free: %ld", &n) == 1) break;
  std::fclose(f);
  return n;
}

std::vector<std::string> Eal::build_args(const EalOptions& opt, long free_hugepages) {
  std::vector<std::string> out;
  out.push_back(opt.program);
  out.insert(out.end(), opt.args.begin(), opt.args.end());
  if (opt.in_memory && !has_flag(opt.args, {"--in-memory", "--file-prefix"}))
    out.emplace_back("--in-memory");
  if (!opt.allow_pci && !has_flag(opt.args, {"--no-pci", "-a", "--allow", "-b", "--block"}))
    out.emplace_back("--no-pci");
  if (!has_flag(opt.args, {"-l", "-c", "--lcores"})) out.emplace_back("-l0");
  if (opt.hugepage_fallback && free_hugepages == 0 && !has_flag(opt.args, {"--no-huge", "-m", "--socket-mem"})) {
    // EAL refuses --in-memory with --no-huge; --no-shconf keeps what matters
    // of it (no shared config file, so several processes can run at once).
    const auto it = std::find(out.begin(), out.end(), std::string("--in-memory"));
    if (it != out.end()) *it = "--no-shconf";
    out.emplace_back("--no-huge");
    out.emplace_back("-m");
    out.emplace_back(std::to_string(opt.no_huge_mb));
  }
  return out;
}

Eal::Eal(const EalOptions& opt) : args_(build_args(opt, free_hugepages())) {
  if (g_eal_up.exchange(true)) throw EalError("EAL already initialised in this process");
  if (std::find(args_.begin(), args_.end(), "--no-huge") != args_.end() &&
      std::find(opt.args.begin(), opt.args.end(), "--no-huge") == opt.args.end())
    std::fprintf(stderr, "droce: no free hugepages (scripts/setup.sh reserves them): running on ordinary memory\n");
  std::vector<char*> argv;
  argv.reserve(args_.size() + 1);
  for (auto& a : args_) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = rte_eal_init(static_cast<int>(args_.size()), argv.data());
  if (rc < 0) {
    const int err = rte_errno;
    std::string cmd;
    for (const auto& a : args_) cmd += (cmd.empty() ? "" : " ") + a;
    // rte_eal_init cannot be retried in the same process after most failures.
    g_eal_up.store(false);
    throw EalError("rte_eal_init failed: " + std::string(rte_strerror(err)) + " (args: " + cmd +
                   "; hugepages free: " + std::to_string(free_hugepages()) + ")");
  }
  consumed_ = rc;
}

Eal::~Eal() {
  rte_eal_cleanup();
  g_eal_up.store(false);
}

}  // namespace droce::dpdk
