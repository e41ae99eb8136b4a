// base/byte_buffer.h: zero-filled, writable to the last byte, large buffers on a 2 MiB boundary
// of their own mapping, and the bytes stay put when buffers move (the weights keep pointers).
#include "base/byte_buffer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"

namespace ds41 {
namespace {

bool all_zero(const ByteBuffer& b) {
  return std::all_of(b.data(), b.data() + b.size(), [](uint8_t v) { return v == 0; });
}

TEST(ByteBuffer, EmptyHoldsNothing) {
  ByteBuffer b(0);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_FALSE(b.mapped());
}

TEST(ByteBuffer, SmallComesFromTheHeapZeroFilled) {
  ByteBuffer b(1000);
  EXPECT_EQ(b.size(), 1000u);
  EXPECT_FALSE(b.mapped());
  EXPECT_TRUE(all_zero(b));
  b.data()[999] = 7;
  EXPECT_EQ(b.data()[999], 7);
}

TEST(ByteBuffer, LargeIsItsOwnAlignedMappingZeroFilled) {
  for (size_t n : {ByteBuffer::kHugePageBytes, 3 * ByteBuffer::kHugePageBytes + 5}) {
    ByteBuffer b(n);
    EXPECT_EQ(b.size(), n);
    EXPECT_TRUE(b.mapped());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % ByteBuffer::kHugePageBytes, 0u);
    EXPECT_TRUE(all_zero(b));
    b.data()[0] = 1;
    b.data()[n - 1] = 2;
    EXPECT_EQ(b.data()[0] + b.data()[n - 1], 3);
  }
}

TEST(ByteBuffer, ImpossibleSizesAreClearErrors) {
  for (size_t n : {SIZE_MAX / 2, SIZE_MAX - 1}) {
    try {
      ByteBuffer b(n);
      ADD_FAILURE() << n << " bytes were mapped";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("out of memory: could not map " + std::to_string(n >> 20) + " MiB"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(ByteBuffer, MovesKeepTheBytesWhereTheyAre) {
  ByteBuffer a(3 * ByteBuffer::kHugePageBytes), small(64);
  a.data()[123] = 42;
  const uint8_t* where = a.data();
  ByteBuffer b(std::move(a));
  EXPECT_EQ(b.data(), where);
  EXPECT_EQ(b.data()[123], 42);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  small = std::move(b);    // releases small's heap bytes, takes the mapping
  EXPECT_EQ(small.data(), where);
  EXPECT_TRUE(small.mapped());
  // In a growing vector (how the weights hold them) the elements move, the bytes do not.
  std::vector<ByteBuffer> owned;
  std::vector<const uint8_t*> data;
  for (int i = 0; i < 40; ++i) {
    owned.emplace_back(i % 2 ? size_t(100 + i) : ByteBuffer::kHugePageBytes + size_t(i));
    owned.back().data()[0] = uint8_t(i);
    data.push_back(owned.back().data());
  }
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(owned[size_t(i)].data(), data[size_t(i)]);
    EXPECT_EQ(owned[size_t(i)].data()[0], uint8_t(i));
  }
}

}  // namespace
}  // namespace ds41
