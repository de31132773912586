// The benchmarks' positional arguments (seconds per case, sizes, counts): each
// must be a positive number, all of it. `-h` / `--help` prints the usage and
// exits 0; anything else (a word, 0, a negative number, too many arguments)
// prints it and exits 2, instead of running every case for 0 s and printing
// figures that mean nothing. test/bench/bench_args.sh checks every benchmark.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace droce::bench {

// A positive number, all of arg, or 0.
inline double positive_arg(const char* arg) noexcept {
  char* end = nullptr;
  const double v = std::strtod(arg, &end);
  return end != arg && *end == '\0' && v > 0 ? v : 0;
}

// Checks argv[1..argc-1] (at most max_args of them); on --help or a bad one
// prints "usage: <argv[0]> <usage>" and exits.
inline void check_args(int argc, char** argv, int max_args, const char* usage) {
  for (int i = 1; i < argc; ++i) {
    const bool help = std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0;
    if (help || i > max_args || positive_arg(argv[i]) == 0) {
      std::fprintf(help ? stdout : stderr, "usage: %s %s\n", argv[0], usage);
      std::exit(help ? 0 : 2);
    }
  }
}

// argv[i] as a number when given (check_args passed), else def.
inline double arg_or(int argc, char** argv, int i, double def) noexcept {
  return argc > i ? positive_arg(argv[i]) : def;
}

}  // namespace droce::bench
