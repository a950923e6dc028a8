#pragma once

// The resident set size of this process, for the benchmarks that report memory
// (manifest_bench, scale_sim): /proc/self/statm's resident pages times the
// page size; 0 when it cannot be read.

#include <unistd.h>

#include <cstddef>
#include <fstream>

namespace granary::bench {

inline size_t ProcessRssBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace granary::bench
