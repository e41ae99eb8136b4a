#include "base/byte_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "base/error.h"

#if DS41_ADDRESS_SANITIZER
#include <sanitizer/asan_interface.h>
#endif

namespace ds41 {

ByteBuffer::ByteBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  if (bytes < kHugePageBytes) {
    data_ = new uint8_t[bytes]();
    return;
  }
  const auto fail = [&](const char* why) {
    throw Error("out of memory: could not map " + std::to_string(bytes >> 20) + " MiB (" + why + ")");
  };
  // The size rounded up to whole huge pages, plus one: a 2 MiB boundary with that many bytes
  // after it then lies inside the mapping, so the advice covers only this mapping and the last
  // huge page fits too. The slack is never touched: it costs address space only. Anonymous pages
  // read as zero.
  if (bytes > SIZE_MAX - 2 * kHugePageBytes) fail("larger than the address space");
  const size_t whole_pages = (bytes + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  const size_t mapping_bytes = whole_pages + kHugePageBytes;
  void* m = ::mmap(nullptr, mapping_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) fail(std::strerror(errno));
  mapping_ = m;
  mapping_bytes_ = mapping_bytes;
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(m) + kHugePageBytes - 1) & ~uintptr_t(kHugePageBytes - 1);
  data_ = reinterpret_cast<uint8_t*>(aligned);
#ifdef MADV_HUGEPAGE
  ::madvise(data_, whole_pages, MADV_HUGEPAGE);  // advisory
#endif
}

ByteBuffer::~ByteBuffer() { release(); }

ByteBuffer::ByteBuffer(ByteBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapping_bytes_(std::exchange(other.mapping_bytes_, 0)) {}

ByteBuffer& ByteBuffer::operator=(ByteBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = std::exchange(other.mapping_bytes_, 0);
  }
  return *this;
}

#if DS41_ADDRESS_SANITIZER
void poison_bytes(const void* p, size_t n) { __asan_poison_memory_region(p, n); }
void unpoison_bytes(const void* p, size_t n) { __asan_unpoison_memory_region(p, n); }
#else
void poison_bytes(const void*, size_t) {}
void unpoison_bytes(const void*, size_t) {}
#endif

void ByteBuffer::release() {
  if (mapping_) {
    unpoison_bytes(data_, size_);  // a later mapping here must not inherit a user's marks
    ::munmap(mapping_, mapping_bytes_);
  } else {
    delete[] data_;
  }
  data_ = nullptr;
  size_ = 0;
  mapping_ = nullptr;
  mapping_bytes_ = 0;
}

}  // namespace ds41
