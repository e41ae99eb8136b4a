// Zero-filled bytes for large, long-lived copies the engine makes at load (packed weights, widened
// tensors). A buffer of at least kHugePageBytes is an anonymous mapping of its own, aligned to
// 2 MiB and advised MADV_HUGEPAGE before anything touches it: with transparent huge pages in
// "madvise" mode (Debian's default) its memory is then 2 MiB pages from the first fault, where a
// heap vector advised after it was filled stayed on 4 KiB pages until khugepaged's slow scan
// (10 MB of 333 MB were huge during a decode run). The LM head product, a decode step's largest
// read, streamed 10-25 % faster on huge pages (README, performance). Smaller buffers come from
// the heap. Move-only; the bytes never move, so pointers into them stay valid.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ds41 {

class ByteBuffer {
 public:
  static constexpr size_t kHugePageBytes = size_t{2} << 20;

  ByteBuffer() = default;
  // Throws ds41::Error ("out of memory: ...", with the size) when a mapping cannot be had, and
  // std::bad_alloc when the heap cannot serve a small buffer.
  explicit ByteBuffer(size_t bytes);
  ~ByteBuffer();
  ByteBuffer(ByteBuffer&& other) noexcept;
  ByteBuffer& operator=(ByteBuffer&& other) noexcept;
  ByteBuffer(const ByteBuffer&) = delete;
  ByteBuffer& operator=(const ByteBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Whether the bytes are a mapping of their own (2 MiB-aligned, huge pages advised).
  bool mapped() const { return mapping_ != nullptr; }

 private:
  void release();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  void* mapping_ = nullptr;  // the whole mapping (data_ is its first 2 MiB boundary)
  size_t mapping_bytes_ = 0;
};

// Under AddressSanitizer, bytes of a buffer that its user carves into pieces (the loader's slabs,
// model/weights.cpp) can be marked unaddressable between the pieces, so a read past one piece is
// still reported as it was when each piece was a heap allocation of its own. No-ops otherwise.
// (A ByteBuffer clears the marks of its bytes when it releases them.)
#if defined(__SANITIZE_ADDRESS__)
#define DS41_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DS41_ADDRESS_SANITIZER 1
#endif
#endif
#ifndef DS41_ADDRESS_SANITIZER
#define DS41_ADDRESS_SANITIZER 0
#endif
inline constexpr bool kAddressSanitizer = DS41_ADDRESS_SANITIZER;
void poison_bytes(const void* p, size_t n);
void unpoison_bytes(const void* p, size_t n);

}  // namespace ds41
