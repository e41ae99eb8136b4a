// The avx2vnni kernel table: AVX2 + FMA + F16C + AVX-VNNI (simd_level.h), simd_gemm.inc compiled
// for this ISA - the avx2 kernels (simd_avx2.cpp) with the 8-bit dot products as vpdpbusd
// (DS41_SIMD_VNNI). As there, only the functions defined below the target pragma carry the ISA;
// called only after simd_level_available() checked the CPU.
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
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi,bmi2,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,avxvnni")
#endif

namespace ds41::simd::avx2vnni {
#define DS41_SIMD_LEVEL SimdLevel::Avx2Vnni
#define DS41_SIMD_AVX512 0
#define DS41_SIMD_VNNI 1
#define DS41_SIMD_REGS 16
#include "kernels/simd_avx2_table.inc"
#undef DS41_SIMD_REGS
#undef DS41_SIMD_VNNI
#undef DS41_SIMD_AVX512
#undef DS41_SIMD_LEVEL
}  // namespace ds41::simd::avx2vnni

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
