// The AVX2 + FMA + F16C kernel table: simd_gemm.inc compiled for this ISA. Only the functions defined below the
// target pragma carry the ISA; everything included above it (standard library, shared headers)
// is compiled for the baseline, so no out-of-line copy with avx2 instructions can be picked up
// by code that runs on other CPUs. Called only after simd_level_supported() checked the CPU.
#include "kernels/simd_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/hyper_connection.h"
#include "kernels/int8_dot.h"
#include "kernels/numeric_formats.h"
#include "kernels/quant.h"
#include "kernels/softmax_exp.h"
#include "kernels/sparse_attention.h"
#include "kernels/vector_exp.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi,bmi2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#endif

namespace ds41::simd::avx2 {
#define DS41_SIMD_LEVEL SimdLevel::Avx2
#define DS41_SIMD_AVX512 0
#define DS41_SIMD_VNNI 0
#define DS41_SIMD_REGS 16
#include "kernels/simd_avx2_table.inc"
#undef DS41_SIMD_REGS
#undef DS41_SIMD_VNNI
#undef DS41_SIMD_AVX512
#undef DS41_SIMD_LEVEL
}  // namespace ds41::simd::avx2

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
