// The SIMD levels this CPU supports above Scalar, for tests that compare each with the scalar twin.
#pragma once

#include <vector>

#include "kernels/simd_level.h"

namespace ds41 {

inline std::vector<SimdLevel> supported_simd_levels() {
  std::vector<SimdLevel> out;
  for (SimdLevel l : {SimdLevel::Avx2, SimdLevel::Avx2Vnni, SimdLevel::Avx512, SimdLevel::Avx512Vbmi, SimdLevel::Amx})
    if (simd_level_available(l)) out.push_back(l);
  return out;
}

}  // namespace ds41
