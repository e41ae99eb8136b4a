// Linear layers y[m, n] = sum_k x[m, k] * W[n, k] for x [M, K] row-major and W [N, K] row-major
// (PyTorch Linear layout), spec backbone.md §2.3 (which linear uses which path) and §3.3.
//
// Summation order (the one thing the spec leaves free, §3.3 last sentence), chosen to reproduce
// the official golden cases bit for bit:
//  * FP8 / FP4 GEMM (§3.3): not lane-ordered. The products of E4M3 (or E2M1) weights and E4M3
//    activation codes are exact in fp32, and the sum of a 32-element K block of them is exact in
//    double, so each block partial is that exact sum rounded once to fp32 — order-free, and the
//    semantics the official golden generator uses. Blocks are then combined in increasing kb as
//        acc = 0; for kb: acc += (partial_kb * a_scale[m][kb]) * w_scale[.][kb];   y = bf16(acc)
//    (partial times the activation scale first, then the weight scale; both are powers of two).
//  * BF16 / FP32 linears (F.linear in the reference): one sequential fp32 sum per output, k
//    ascending from +0, each product rounded to fp32 before it is added (no FMA), then rounded to
//    bf16 where the output is bf16. This is what the golden generator's F.linear computes: with
//    it the head's logits and DSpark's draft logits and confidences of every golden case are
//    bit-identical to the reference's, where an exact (double) dot product differed by ~1e-6.
//
// Every output element is computed by that arithmetic alone, whichever thread runs it and
// however the work is tiled, so results are identical for any ThreadPool size (nullptr = inline).
// The same holds for the ISA level: the fast paths below run the AVX2/AVX-512 kernels of
// simd_gemm.inc when simd_level() (simd_level.h) is not Scalar, bit-identical to the twins.
// FP8/FP4 paths need K % 32 == 0 (all checkpoint shapes satisfy it); violations throw ds41::Error.
#pragma once

#include <cstdint>

#include "base/thread_pool.h"

namespace ds41 {

// E4M3 weight [N, K] with E8M0 block scales [ceil(N/32), ceil(K/32)] (§2.1).
struct Fp8Matrix {
  const uint8_t* w;
  const uint8_t* scale;
  int64_t N, K;
  // Optional: the codes of rows [0, N / 16 * 16) again in the one-row decode kernel's layout
  // (pack_fp8_rows16 below), or null. The avx512vbmi decode holds one row per 32-bit lane, 16 rows
  // a vector; from the checkpoint's row-major codes that costs a register transpose per block (32
  // shuffles and inserts per 512 weight bytes) and 16 read streams; from this copy no transpose
  // (one Xeon core, 1024 x 1024 from L2: 10.9-11.6 -> 14.8-15.3 GB/s of weights) and four
  // forward streams a thread (simd_fp8_decode.inc). The values, and so the outputs, are the same
  // either way.
  const uint8_t* rows16 = nullptr;
};

// The rows16 layout: for each group of 16 rows (g = 0, 16, ...) and each 32-column block b, 512
// bytes at (g / 16 * K / 32 + b) * 512 whose bytes 64 d + 4 l .. 64 d + 4 l + 3 are row g + l's codes
// 32 b + 4 d .. 32 b + 4 d + 3 (d < 8, l < 16): a group's blocks in k order, the groups in row order.
inline constexpr int64_t kFp8Rows16BlockBytes = 512;
// After the codes, one flag byte per group and block (same order): kFp8BlockSubnormal where the
// block holds an E4M3 subnormal code (magnitude 1..7), which the AVX2 decode sends down a path
// with no fp32 subnormal (subnormal_inputs_slow(), simd_level.h; realistic weights have few of
// them), and kFp8BlockNan where it holds a NaN code (0x7f, 0xff), whose rows take the scalar
// arithmetic (the decode then needs no NaN check of its own in the loop).
inline constexpr uint8_t kFp8BlockSubnormal = 1, kFp8BlockNan = 2;
inline int64_t fp8_rows16_code_bytes(const Fp8Matrix& W) { return W.N / 16 * 16 * W.K; }
inline const uint8_t* fp8_rows16_block_flags(const Fp8Matrix& W) { return W.rows16 + fp8_rows16_code_bytes(W); }
// Bytes of W's rows16 copy: the whole groups of 16 rows, (N / 16) * 16 * K, then the flags.
inline int64_t fp8_rows16_bytes(const Fp8Matrix& W) { return fp8_rows16_code_bytes(W) + W.N / 16 * (W.K / 32); }
// Writes W's rows16 copy into `out` (fp8_rows16_bytes(W) bytes); K must be a multiple of 32.
void pack_fp8_rows16(const Fp8Matrix& W, uint8_t* out);
// Whether the active kernels' one-row FP8 decode reads a rows16 copy (every SIMD level, not the
// scalar one): where it does not, a copy would only cost memory.
bool fp8_decode_reads_rows16();

// E2M1 weight packed [N, K/2] (low nibble = even k) with E8M0 scales [N, K/32] (§2.1).
struct Fp4Matrix {
  const uint8_t* w;
  const uint8_t* scale;
  int64_t N, K;
  // Optional: the bytes of rows [0, N / 16 * 16) again in the AVX-512 one-row decode's layout
  // (pack_fp4_rows16 below), or null. That decode holds one row per 32-bit lane, 16 rows a
  // vector; from the checkpoint's rows it reads 16 streams, one page apart, and transposes every
  // block in registers; from this copy it reads whole vectors, four forward streams a thread
  // (simd_gemm.inc). The values, and so the outputs, are the same either way.
  const uint8_t* rows16 = nullptr;
};

// The FP4 rows16 layout: pack_fp8_rows16's with the matrix's bytes for codes - for each group of
// 16 rows and each 32-column block b (16 bytes of a row), 256 bytes at (g / 16 * K / 32 + b) * 256
// whose bytes 64 d + 4 l .. 64 d + 4 l + 3 are row g + l's bytes 16 b + 4 d .. 16 b + 4 d + 3
// (d < 4, l < 16).
inline constexpr int64_t kFp4Rows16BlockBytes = 256;
// After the codes, the groups' block scales in the same order: 16 bytes at (g / 16 * K / 32 + b) *
// 16 whose byte l is row g + l's E8M0 code of block b. The decode then reads a block's 16 scales
// as one forward stream beside the codes; from the checkpoint's [N, K / 32] scales it gathered
// them from 16 rows per group, and on a Xeon at `avx2` those loads stalled on memory (each
// expert's scales are a small array of their own), a fifth of the time of the products (perf).
// Last, one byte per group: 1 where a scale code of the group is 0 (2^-127, an fp32 subnormal) or
// 255 (NaN), the two codes whose fp32 value is not the code shifted into the exponent field (the
// AVX2 decode widens the others with one shift), else 0.
inline constexpr int64_t kFp4Rows16ScaleBytes = 16;
inline int64_t fp4_rows16_code_bytes(const Fp4Matrix& W) { return W.N / 16 * 16 * (W.K / 2); }
inline const uint8_t* fp4_rows16_scales(const Fp4Matrix& W) { return W.rows16 + fp4_rows16_code_bytes(W); }
inline const uint8_t* fp4_rows16_special_scales(const Fp4Matrix& W) {
  return fp4_rows16_scales(W) + W.N / 16 * 16 * (W.K / 32);
}
// Bytes of W's rows16 copy: the whole groups of 16 rows, (N / 16) * 16 * K / 2, their scales, the
// groups' flags.
inline int64_t fp4_rows16_bytes(const Fp4Matrix& W) {
  return fp4_rows16_code_bytes(W) + W.N / 16 * 16 * (W.K / 32) + W.N / 16;
}
// Writes W's rows16 copy into `out` (fp4_rows16_bytes(W) bytes); K must be a multiple of 32.
void pack_fp4_rows16(const Fp4Matrix& W, uint8_t* out);
// Whether the active kernels' one-row FP4 decode reads a rows16 copy (every SIMD level, not the
// scalar one).
bool fp4_decode_reads_rows16();

// ---- fast paths ------------------------------------------------------------------------------
// act_quant(x) per row (block 32, §3.1), then the block-scaled GEMM of §3.3, bf16 out.
void linear_fp8(const uint16_t* x, int64_t M, const Fp8Matrix& W, uint16_t* y, ThreadPool* pool);
void linear_fp4(const uint16_t* x, int64_t M, const Fp4Matrix& W, uint16_t* y, ThreadPool* pool);
// Several independent block-scaled linears, each with its own activations x [M, K], weight (FP8
// or FP4: set exactly one) and output y [M, N], run as one parallel job. For decode-size calls (a
// few rows each, e.g. the experts of a MoE layer at one token) whose separate thread hand-offs and
// activation preparations cost as much as the small products themselves. Every output is
// bit-identical to linear_fp8 / linear_fp4 of that job alone.
struct QuantizedLinearJob {
  const uint16_t* x = nullptr;
  int64_t M = 0;
  const Fp8Matrix* fp8 = nullptr;
  const Fp4Matrix* fp4 = nullptr;
  uint16_t* y = nullptr;
};
void linear_quantized_batch(const QuantizedLinearJob* jobs, int count, ThreadPool* pool);
// Grows the calling thread's buffers of linear_quantized_batch to the most that any batch of at
// most `jobs` jobs and `rows` prepared activation rows in all (jobs with the same x and M share
// theirs), each K <= max_k and N <= max_n, can need. How a call's rows fall on its jobs can move
// from call to call (the routed experts of a multi-row decode call), so reserving for one shape
// is not enough: after this, such batches allocate nothing.
void reserve_quantized_batch(int jobs, int64_t rows, int64_t max_k, int64_t max_n);

// bf16 x, bf16 W, fp32 accumulation; bf16 or fp32 out.
void linear_bf16(const uint16_t* x, int64_t M, const uint16_t* W, int64_t N, int64_t K, uint16_t* y,
                 ThreadPool* pool);
void linear_bf16_f32out(const uint16_t* x, int64_t M, const uint16_t* W, int64_t N, int64_t K,
                        float* y, ThreadPool* pool);
// fp32 everything (ratio>1 compressor, §2.3).
void linear_f32(const float* x, int64_t M, const float* W, int64_t N, int64_t K, float* y,
                ThreadPool* pool);
// fp32 x, bf16 W widened exactly to fp32, fp32 out (router, head, hc projections; §2.3, §4).
void linear_f32_wbf16(const float* x, int64_t M, const uint16_t* W, int64_t N, int64_t K, float* y,
                      ThreadPool* pool);

// A bf16 weight [N, K] repacked for decode-speed dense products: the first N / 16 * 16 rows as
// groups of up to eight blocks of 16 rows (128 rows; the last group holds what is left), each
// group stored k-major ([k][16 * width]: all its outputs' weights at one k adjacent), so a vector
// lane is one output's sequential chain with no in-register transposes and a group is one memory
// stream. Every group but the last is full, so group g starts at value g * 128 * K. The last
// N % 16 rows are read from the original row-major matrix. Used for the LM head (most of a decode
// step's bytes on small models). Results are bit-identical to linear_f32_wbf16.
inline constexpr int64_t kPackedRows = 16;
inline constexpr int64_t kPackedGroupBlocks = 8;
// At one activation row (decode), full groups are read kPackedStreamGroups at a time,
// interleaved in one pass over k: one core keeps more lines in flight with several forward
// streams than with one (a 2-vCPU Xeon KVM guest, the small preset's 129280 x 1024 head: two
// cores 17.5-18.6 -> 22.8-24.2 GB/s, one core 9.4-10.7 -> 12.3-15.3; two groups at a time
// 17.1-23.0 and 11.8-15.2).
inline constexpr int kPackedStreamGroups = 3;
struct PackedBf16Matrix {
  const uint16_t* blocks = nullptr;  // (N / 16) * K * 16 values
  const uint16_t* rows = nullptr;    // the original row-major [N, K]
  int64_t N = 0, K = 0;
};
// Products of fewer activation rows than this (decode, speculative verification) read a packed
// copy where the model keeps one; more rows read the row-major matrix through the register tiles.
inline constexpr int64_t kPackedMaxRows = 4;
// Writes the (N / 16) * K * 16 packed values of row-major W into `out`.
void pack_bf16_rows(const uint16_t* W, int64_t N, int64_t K, uint16_t* out, ThreadPool* pool);
// y[m, n] = linear_f32_wbf16's value, from the packed layout.
void linear_f32_wbf16_packed(const float* x, int64_t M, const PackedBf16Matrix& W, float* y, ThreadPool* pool);
// The same values from the packed copy where W has one (blocks) and M < kPackedMaxRows, else from
// the row-major W.rows.
void linear_f32_wbf16_maybe_packed(const float* x, int64_t M, const PackedBf16Matrix& W, float* y, ThreadPool* pool);
// Several packed products of M rows each (x [M][W.K] -> y [M][W.N]) in one parallel call: the
// groups of all of them are shared out together (the grouped output projection's per-group
// products are too small to keep two threads busy one by one). The same values as one call each.
struct PackedLinearJob {
  const float* x;
  PackedBf16Matrix W;
  float* y;
};
void linear_f32_wbf16_packed_batch(const PackedLinearJob* jobs, int count, int64_t M, ThreadPool* pool);

// out[n, k] = bf16(e4m3(w[n, k]) * 2^(scale[n/32][k/32] - 127)): fp32 product, one rounding
// (convert.py's load-time dequantization of wo_a, §2.4 step 3, pitfall 15).
void dequant_fp8_to_bf16(const Fp8Matrix& W, uint16_t* out);

// The same products from the FP8 codes, for decode: wo_a is dequantized to bf16 (above) and used
// as bf16 weights, but each of those values, e4m3 * 2^t, has at most 4 significant bits, so it is
// exact in fp32 and in bf16 whenever t is in [-124, 7] and no code is NaN (fp8_packable): the FP8
// code and its scale give the bf16 value itself, from half the bytes. PackedFp8Matrix has
// PackedBf16Matrix's geometry (groups of up to eight blocks of 16 rows, each group k-major), one
// byte per value, N and K multiples of 32 (one scale per 32 rows at each k, so a pair of blocks
// shares it; no tail rows), and kPackedFp8Front readable bytes before the first code (the SIMD
// kernel's loads start up to 3 bytes early). The products are linear_f32_wbf16's of the
// dequantized matrix, bit for bit.
inline constexpr int64_t kPackedFp8Front = 32;
struct PackedFp8Matrix {
  const uint8_t* blocks = nullptr;  // (N / 16) * K * 16 codes
  const uint8_t* scale = nullptr;   // E8M0 [N / 32][K / 32], as in the checkpoint
  int64_t N = 0, K = 0;
};
// Whether W can be packed so (shape, scale range, no NaN code).
bool fp8_packable(const Fp8Matrix& W);
// Writes the N * K packed codes of W into `out` (N * K bytes); throws ds41::Error where W is not
// fp8_packable (the contents of `out` are then unspecified).
void pack_fp8_rows(const Fp8Matrix& W, uint8_t* out, ThreadPool* pool);
struct PackedFp8LinearJob {
  const float* x;
  PackedFp8Matrix W;
  float* y;
};
// y [M][W.N] = linear_f32_wbf16(x, dequant_fp8_to_bf16(W))'s values, every job in one parallel call.
void linear_f32_wfp8_packed_batch(const PackedFp8LinearJob* jobs, int count, int64_t M, ThreadPool* pool);

// ---- reference twins -------------------------------------------------------------------------
// Plain loops that follow §3.3 and the order above literally; the fast paths must match them bit
// for bit (tests/gemm_test.cpp).
void linear_fp8_reference(const uint16_t* x, int64_t M, const Fp8Matrix& W, uint16_t* y);
void linear_fp4_reference(const uint16_t* x, int64_t M, const Fp4Matrix& W, uint16_t* y);
void linear_bf16_reference(const uint16_t* x, int64_t M, const uint16_t* W, int64_t N, int64_t K,
                           uint16_t* y);
void linear_bf16_f32out_reference(const uint16_t* x, int64_t M, const uint16_t* W, int64_t N,
                                  int64_t K, float* y);
void linear_f32_reference(const float* x, int64_t M, const float* W, int64_t N, int64_t K,
                          float* y);
void linear_f32_wbf16_reference(const float* x, int64_t M, const uint16_t* W, int64_t N, int64_t K,
                                float* y);

}  // namespace ds41
