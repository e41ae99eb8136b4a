// Top-k selection with the reference's tie behaviour. The official reference runs torch.topk on
// CPU, which puts (value, index) pairs in index order and then uses std::partial_sort when
// k * 64 <= n, else std::nth_element (plus std::sort of the first k-1 when sorted=true), with a
// comparator on the value alone (NaN counts as largest). Exact ties are common in the bf16
// indexer scores, so the *set* that survives a tie matters; running the same standard-library
// algorithms on the same input order gives the same set, deterministically. (This is the
// libstdc++ behaviour the reference was built with; the algorithms have been stable for years.)
#pragma once

#include <cstdint>
#include <vector>

namespace ds41 {

// Indices of the k largest of values[0..n), in the order torch.topk(largest=True) returns them
// (sorted=false: whatever order the selection leaves).
std::vector<int32_t> torch_topk_largest(const float* values, int64_t n, int64_t k, bool sorted);
// Same into `out` (its capacity is reused: no allocation once it has held k indices).
void torch_topk_largest(const float* values, int64_t n, int64_t k, bool sorted, std::vector<int32_t>& out);
// Makes the calling thread's selection buffer hold n values without reallocating (rows that grow
// with the context are planned up front).
void torch_topk_reserve(int64_t n);

}  // namespace ds41
