// The AVX-512 (F/BW/DQ/VL/VNNI) kernel tables (avx512, avx512vbmi, amx; mostly 256-bit vectors, 512-bit where it paid): simd_gemm.inc compiled for this ISA. Only the functions defined below the
// target pragma carry the ISA; everything included above it (standard library, shared headers)
// is compiled for the baseline, so no out-of-line copy with avx512 instructions can be picked up
// by code that runs on other CPUs. Called only after simd_level_supported() checked the CPU.
#include "kernels/simd_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/gumbel_draw.h"
#include "kernels/hyper_connection.h"
#include "kernels/int8_dot.h"
#include "kernels/numeric_formats.h"
#include "kernels/quant.h"
#include "kernels/softmax_exp.h"
#include "kernels/sparse_attention.h"
#include "kernels/vector_exp.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi,bmi2,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#endif

namespace ds41::simd::avx512 {
#define DS41_SIMD_LEVEL SimdLevel::Avx512
#define DS41_SIMD_AVX512 1
#define DS41_SIMD_VNNI 1
#define DS41_SIMD_REGS 32
#include "kernels/simd_gemm.inc"
#include "kernels/simd_attention.inc"
#include "kernels/simd_dequant.inc"
#include "kernels/simd_peak.inc"
#include "kernels/simd_int8.inc"
#include "kernels/simd_softmax.inc"
#include "kernels/simd_draw.inc"
#include "kernels/simd_kernel_table.inc"
#include "kernels/simd_fp8_decode.inc"
#include "kernels/simd_amx.inc"

extern const KernelTable kTable, kTableVbmi, kTableAmx;
constexpr KernelTable kTable = [] {
  KernelTable t = common_kernel_table();
  t.fp4_decode_runs = true;              // the 16-row side-by-side FP4 decode
  return t;
}();
// The same kernels plus VBMI for the FP8 decode product (simd_fp8_decode.inc).
constexpr KernelTable kTableVbmi = [] {
  KernelTable t = kTable;
  t.level = SimdLevel::Avx512Vbmi;
  t.fp8 = fp8_kernel_vbmi;
  t.prepare_fp8_digits = prepare_fp8_digits;
  return t;
}();
// The VBMI kernels plus AMX tiles for the FP8 and FP4 prefill products (simd_amx.inc).
constexpr KernelTable kTableAmx = [] {
  KernelTable t = kTableVbmi;
  t.level = SimdLevel::Amx;
  t.fp8 = fp8_kernel_amx;
  t.fp4 = fp4_kernel_amx;
  t.prepare_fp8_amx = prepare_fp8_amx;
  return t;
}();
#undef DS41_SIMD_REGS
#undef DS41_SIMD_VNNI
#undef DS41_SIMD_AVX512
#undef DS41_SIMD_LEVEL
}  // namespace ds41::simd::avx512

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
