#include "kernels/simd_kernels.h"

namespace ds41::simd {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
namespace avx2 {
extern const KernelTable kTable;
}
namespace avx2vnni {
extern const KernelTable kTable;
}
namespace avx512 {
extern const KernelTable kTable, kTableVbmi, kTableAmx;
}
#endif

const KernelTable* kernel_table(SimdLevel level) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  switch (level) {
    case SimdLevel::Avx2: return &avx2::kTable;
    case SimdLevel::Avx2Vnni: return &avx2vnni::kTable;
    case SimdLevel::Avx512: return &avx512::kTable;
    case SimdLevel::Avx512Vbmi: return &avx512::kTableVbmi;
    case SimdLevel::Amx: return &avx512::kTableAmx;
    case SimdLevel::Scalar: return nullptr;
  }
#endif
  return nullptr;
}

}  // namespace ds41::simd
