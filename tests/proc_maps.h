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
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

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

// The fraction of the pages under [p, p + bytes) that are in the page cache (mincore), or -1 when
// the kernel does not say.
inline double resident_fraction(const void* p, size_t bytes) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const size_t length = reinterpret_cast<uintptr_t>(p) + bytes - begin;
  std::vector<unsigned char> resident((length + page - 1) / page);
  if (resident.empty() || ::mincore(reinterpret_cast<void*>(begin), length, resident.data()) != 0) return -1;
  size_t n = 0;
  for (unsigned char r : resident) n += r & 1;
  return double(n) / double(resident.size());
}

// Asks the kernel to drop a file's clean, unmapped pages from the page cache (they are read from
// disk again when touched). Advisory: a file system that keeps files in memory ignores it.
inline void drop_page_cache(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace ds41::test
