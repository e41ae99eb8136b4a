// Engram hash-bucket layout (spec engram_dspark_vision.md §A.3): for each Engram layer, each
// n-gram order n = 2..max and each head h, a distinct prime bucket count, handed out as the
// smallest unused primes above engram_vocab_size - 1 in (layer, order, head) order; a layer's
// table rows are the sum of its primes and each column's rows start at the running offset.
#pragma once

#include <cstdint>
#include <vector>

namespace ds41 {

struct ModelConfig;

struct EngramLayout {
  int columns_per_layer = 0;                   // (max_ngram_size - 1) * n_heads
  std::vector<std::vector<int64_t>> primes;    // [engram layer][column], column = (n-2)*heads + h
  std::vector<std::vector<int64_t>> offsets;   // exclusive prefix sums of primes, same indexing
  std::vector<int64_t> rows;                   // per engram layer: sum of its primes
};

bool is_prime_u64(uint64_t n);
EngramLayout compute_engram_layout(const ModelConfig& c);

}  // namespace ds41
