// DPDK Environment Abstraction Layer: one Eal object per process.
//
// Arguments pass through to rte_eal_init unchanged. Unless the caller already
// chose, the defaults that work on this kind of machine are added (see
// /work/shared/DPDK-NOTES.md): --in-memory (no hugepage files left behind,
// several DPDK processes at once), --no-pci (do not probe the VM's own NIC),
// and "-l 0" when no core list is given. Pass allow_pci = true for real NICs.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace droce::dpdk {

struct EalOptions {
  std::vector<std::string> args;  // EAL arguments, without argv[0]
  std::string program = "droce";
  bool in_memory = true;          // add --in-memory unless --file-prefix/--in-memory given
  bool allow_pci = false;         // false: add --no-pci unless -a/--allow/-b given
  // With no free hugepages EAL fails with a misleading "Permission denied".
  // true: then run on ordinary memory (--no-huge -m no_huge_mb) with a warning,
  // unless the arguments already choose the memory (--no-huge, -m, --socket-mem).
  bool hugepage_fallback = true;
  unsigned no_huge_mb = 256;
};

class EalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Eal {
 public:
  // Initialises the EAL; throws EalError with rte_strerror's text on failure.
  explicit Eal(const EalOptions& opt);
  ~Eal();  // rte_eal_cleanup
  Eal(const Eal&) = delete;
  Eal& operator=(const Eal&) = delete;

  // The argument vector actually given to rte_eal_init (defaults included).
  const std::vector<std::string>& effective_args() const noexcept { return args_; }
  // Number of arguments rte_eal_init consumed (argv[0] included).
  int consumed() const noexcept { return consumed_; }

  // Builds the argument vector rte_eal_init gets (pure; unit-testable).
  // free_hugepages: what /proc/meminfo reports (see free_hugepages()).
  static std::vector<std::string> build_args(const EalOptions& opt, long free_hugepages = 1);
  // HugePages_Free from /proc/meminfo (default page size); -1 if unreadable.
  static long free_hugepages();

 private:
  std::vector<std::string> args_;
  int consumed_ = 0;
};

}  // namespace droce::dpdk
