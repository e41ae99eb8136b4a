// What the kernel says about this process's mappings (/proc/self/smaps): where a mapping starts,
// which file offset it maps there, and its VmFlags ("hg" = MADV_HUGEPAGE, "rr" = MADV_RANDOM).
// For tests of the memory hints the loader gives (model/weights.h, io/safetensors.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <sys/mman.h>

namespace ds41::test {

struct MappedRegion {
  uintptr_t begin = 0, end = 0;
  uint64_t file_offset = 0;  // of the byte at `begin`
  std::string flags;         // the VmFlags line's two-letter flags, space-separated

  bool has_flag(const std::string& two_letters) const {
    std::istringstream in(flags);
    std::string f;
    while (in >> f)
      if (f == two_letters) return true;
    return false;
  }
};

// The mapping that holds address `p`, or nothing when no mapping does.
inline std::optional<MappedRegion> region_containing(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  std::optional<MappedRegion> hit;
  while (std::getline(smaps, line)) {
    unsigned long long begin = 0, end = 0, offset = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx", &begin, &end, perms, &offset) == 4) {
      if (hit) return hit;  // the held mapping's lines are over without a VmFlags line
      if (a >= begin && a < end) hit = MappedRegion{uintptr_t(begin), uintptr_t(end), offset, {}};
    } else if (hit && line.rfind("VmFlags:", 0) == 0) {
      hit->flags = line.substr(8);
      return hit;
    }
  }
  return hit;
}

// Whether this kernel honours MADV_HUGEPAGE at all (it fails with EINVAL without transparent
// huge page support).
inline bool kernel_has_transparent_huge_pages() {
  const size_t bytes = size_t(4) << 20;
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return false;
  const bool ok = ::madvise(m, bytes, MADV_HUGEPAGE) == 0;
  ::munmap(m, bytes);
  return ok;
}

}  // namespace ds41::test
