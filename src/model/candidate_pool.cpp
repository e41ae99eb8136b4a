// Candidate-block pool (spec backbone.md §5.5, "Candidate pool"): the first level of the decoder's
// two-level top-k. The candidate-source layer scores blocks of `block_size` consecutive entries by
// their best entry, always keeps the block holding the query's newest visible entry (it may be
// partial, and would otherwise lose to older full blocks), keeps the best `topk_blocks` of the
// rest, and later index sources only score inside the kept blocks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "base/scratch.h"
#include "kernels/topk.h"
#include "model/forward_context.h"

namespace ds41 {

std::vector<uint8_t> candidate_pool_row(const float* scores, int64_t width, int64_t count, int topk_blocks,
                                        int block_size) {
  std::vector<uint8_t> keep;
  candidate_pool_row(scores, width, count, topk_blocks, block_size, keep);
  return keep;
}

void candidate_pool_row(const float* scores, int64_t width, int64_t count, int topk_blocks, int block_size,
                        std::vector<uint8_t>& keep, int64_t capacity_hint) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t n_blocks = (width + block_size - 1) / block_size;
  const int64_t max_blocks = (std::max(width, capacity_hint) + block_size - 1) / block_size;
  DS41_SCRATCH_CAP(float, block, 0, max_blocks);
  torch_topk_reserve(max_blocks);
  scratch_reserve(keep, size_t(std::max(width, capacity_hint)));
  block.assign(size_t(n_blocks), neg_inf);
  for (int64_t t = 0; t < width; ++t) block[t / block_size] = std::max(block[t / block_size], scores[t]);
  // Floor division: a query that sees nothing pins no block ((0 - 1) // block_size = -1).
  const int64_t newest = count > 0 ? (count - 1) / block_size : -1;
  if (newest >= 0 && newest < n_blocks) block[newest] = std::numeric_limits<float>::infinity();
  const int64_t k = std::min<int64_t>(topk_blocks, n_blocks);
  DS41_SCRATCH_EMPTY(int32_t, order);
  scratch_reserve(order, size_t(std::max(topk_blocks, 0)));
  torch_topk_largest(block.data(), n_blocks, k, /*sorted=*/true, order);
  keep.assign(size_t(width), 0);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t b = order[i];
    if (!(block[b] > neg_inf)) continue;  // unreachable block picked only to fill k: dropped
    for (int64_t t = b * block_size; t < std::min(width, (b + 1) * block_size); ++t) keep[t] = 1;
  }
}

}  // namespace ds41
