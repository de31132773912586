#include "dpdk/eal.h"

#include <rte_eal.h>
#include <rte_errno.h>

#include <algorithm>
#include <atomic>
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

std::vector<std::string> Eal::build_args(const EalOptions& opt) {
  std::vector<std::string> out;
  out.push_back(opt.program);
  out.insert(out.end(), opt.args.begin(), opt.args.end());
  if (opt.in_memory && !has_flag(opt.args, {"--in-memory", "--file-prefix"}))
    out.emplace_back("--in-memory");
  if (!opt.allow_pci && !has_flag(opt.args, {"--no-pci", "-a", "--allow", "-b", "--block"}))
    out.emplace_back("--no-pci");
  if (!has_flag(opt.args, {"-l", "-c", "--lcores"})) out.emplace_back("-l0");
  return out;
}

Eal::Eal(const EalOptions& opt) : args_(build_args(opt)) {
  if (g_eal_up.exchange(true)) throw EalError("EAL already initialised in this process");
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
    throw EalError("rte_eal_init failed: " + std::string(rte_strerror(err)) + " (args: " + cmd + ")");
  }
  consumed_ = rc;
}

Eal::~Eal() {
  rte_eal_cleanup();
  g_eal_up.store(false);
}

}  // namespace droce::dpdk
