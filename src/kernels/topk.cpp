#include "kernels/topk.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace ds41 {

std::vector<int32_t> torch_topk_largest(const float* values, int64_t n, int64_t k, bool sorted) {
  k = std::min(k, n);
  if (k <= 0) return {};
  using Elem = std::pair<float, int64_t>;
  std::vector<Elem> queue(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) queue[size_t(j)] = {values[j], j};
  auto larger = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || (x.first > y.first);
  };
  if (k * 64 <= n) {
    std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), larger);
  } else {
    std::nth_element(queue.begin(), queue.begin() + (k - 1), queue.end(), larger);
    if (sorted) std::sort(queue.begin(), queue.begin() + (k - 1), larger);
  }
  std::vector<int32_t> out(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) out[size_t(i)] = int32_t(queue[size_t(i)].second);
  return out;
}

}  // namespace ds41
