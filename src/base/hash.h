// Small non-cryptographic hashes shared across the engine: FNV-1a 64 for file checksums and
// config fingerprints, SplitMix64 as the finaliser of counter-based random streams.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ds41 {

inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;

inline uint64_t fnv1a64(const uint8_t* data, size_t n, uint64_t h = kFnv1a64Offset) {
  for (size_t i = 0; i < n; ++i) {
    h ^= data[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace ds41
