// Shape checks and the quantization block shared by the linear-layer files (gemm.cpp,
// gemm_packed.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "base/error.h"

namespace ds41::gemm_detail {

inline constexpr int64_t kBlock = 32;  // K block of the FP8/FP4 GEMM and of act_quant (§3.3)

inline void check_dims(const char* what, int64_t M, int64_t N, int64_t K) {
  if (M < 0 || N < 0 || K < 0)
    throw Error(std::string(what) + ": negative shape M=" + std::to_string(M) + " N=" + std::to_string(N) +
                " K=" + std::to_string(K));
}

inline void check_quantized_dims(const char* what, int64_t M, int64_t N, int64_t K) {
  check_dims(what, M, N, K);
  if (K % kBlock != 0)
    throw Error(std::string(what) + ": K=" + std::to_string(K) +
                " is not a multiple of the 32-element quantization block (spec §3.3)");
}

}  // namespace ds41::gemm_detail
