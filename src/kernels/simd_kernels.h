// Internal to src/kernels: the table of SIMD kernels behind the public kernel functions (gemm.h,
// ...). Each ISA level (simd_level.h) has one table, built from the same source
// (simd_gemm.inc) compiled for that ISA; the public functions fall back to their portable scalar
// paths when simd_level() is Scalar. Every kernel here computes each output element with exactly
// the arithmetic its scalar twin documents, so results are bit-identical at every level.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/gemm.h"
#include "kernels/gumbel_draw.h"
#include "kernels/int8_dot.h"
#include "kernels/simd_level.h"

namespace ds41::simd {

// Activation rows up to which the one-row decode kernels run row by row (FP8; FP4 below 4 rows,
// where its prefill tile takes over): batched decoding and speculative verification run 2-6
// rows, where the prefill tiles, which decode a weight tile once for many rows, were up to 2x
// slower (measured).
constexpr int64_t kDecodeRowsMax = 4;
// FP8 on AMX tiles from this many rows (the amx level; FP4 from kDecodeRowsMax + 1): once the
// tiles carry only a call's rows, 4 rows ran faster there than on the one-row kernel (two cores,
// 1024 x 1024 from L3: 4.6 -> 5.8-6.1 GB/s of weights; 3 rows even, FP4 4 rows slower: 4.7 ->
// 4.0-4.3).
constexpr int64_t kAmxFp8MinRows = 4;

// The avx512vbmi FP8 decode reads 16 weight rows side by side, rows s apart (simd_fp8_decode.inc):
// s the least power of two with s K >= 4096, so that each of the 16 is a forward stream through
// pages of its own (the L2 streamer follows one per 4 KiB page), but at most 16 (a run of 16 s
// rows then spans at most 8 scale bands) and no more than lets `rows` rows hold two runs of
// 16 s. The decode tiles are multiples of 16 s rows.
inline int64_t fp8_decode_row_step(int64_t K, int64_t rows) {
  int64_t s = 1;
  while (s < 16 && s * K < 4096 && 32 * s <= rows) s *= 2;
  return s;
}

// The AVX-512 FP4 decode reads 16 rows side by side the same way (simd_gemm.inc fp4_rows16), its
// rows K / 2 bytes long: rows under 1 KiB (K < 2048) as the FP8 decode; longer ones (the released
// experts: K = 5120 and 2304) up to 8 apart. Measured (two Xeon cores, weights from memory,
// interleaved): 2304 x 5120 and 5120 x 2304 at s = 8 19-24 GB/s against 17-19 on the row kernel,
// at the FP8 rule's s = 2 and 4 15.5-23 (there, likely, two lanes' runs share pages).
inline int64_t fp4_decode_row_step(int64_t K, int64_t rows) {
  if (K / 2 < 1024) return fp8_decode_row_step(K / 2, rows);
  int64_t s = 1;
  while (s < 8 && 32 * s <= rows) s *= 2;  // as there: a run of 16 s fits in `rows`
  return s;
}

// One activation block of Fp8Activations::narrow: a9 = value * 2^9 (an integer below 2^18) is
// stored as a9 >> sh, sh the block's common trailing zero bits, which fits int16 for most blocks
// of real activations (their values share low zero bits; the spread of a block is what counts).
// `factor` = 2^sh * the block's act_quant scale, exact, or 0 where the block does not fit int16
// (or that product would not be finite): then the tiles take the block's double products.
// `l1` = sum |a9 >> sh| and `max` = max |a9 >> sh| bound the tiles' int32 sums.
struct Fp8NarrowBlock {
  float factor;
  int32_t l1, max;
};
// The same bounds over the rows of one register tile of the int16 prefill tile (the tiles
// for_row_blocks makes of kFp8NarrowTileRows rows: row m in tile m / kFp8NarrowTileRows, the last
// one shorter) and one block; `ok`: every row fits.
struct Fp8NarrowRows {
  int32_t l1, max;
  bool ok;
};
constexpr int64_t kFp8NarrowTileRows = 6;
// Fp8NarrowRows of every register tile and block of `rows` rows of Fp8NarrowBlock ([rows][KB]),
// out: [ceil(rows / kFp8NarrowTileRows)][KB]. Once per GEMM, not per column tile.
inline void fp8_narrow_row_tiles(const Fp8NarrowBlock* blocks, int64_t rows, int64_t KB, Fp8NarrowRows* out) {
  for (int64_t t = 0; t * kFp8NarrowTileRows < rows; ++t)
    for (int64_t b = 0; b < KB; ++b) {
      Fp8NarrowRows s{0, 0, true};
      for (int64_t r = t * kFp8NarrowTileRows; r < std::min(rows, (t + 1) * kFp8NarrowTileRows); ++r) {
        const Fp8NarrowBlock& e = blocks[r * KB + b];
        s.ok = s.ok && e.factor != 0.0f;
        s.l1 = std::max(s.l1, e.l1);
        s.max = std::max(s.max, e.max);
      }
      out[t * KB + b] = s;
    }
}

// Activations of an FP8-weight GEMM after act_quant (§3.1), for `rows` rows of K.
struct Fp8Activations {
  // The decode kernels' operand: the E4M3 activation values as fp32 times a power of two fixed
  // per level (1 with AVX-512, whose kernels decode weights as w * 2^-8; 2^112 with AVX2, whose
  // kernel decodes them as w * 2^-120; products are exact either way), in the order that level's
  // kernel meets the weights (AVX2: in each block of 32, element 4l + s at position 8s + l).
  const float* values;     // [rows][K]
  const float* scales;     // [rows][K/32] act_quant scales (powers of two)
  const uint8_t* codes;    // [rows][K] the E4M3 codes (for the scalar fallback)
  const uint8_t* special;  // [rows] 1 = the row holds a NaN code or a non-finite scale
  int64_t K;
  // Decode kernels of the avx512vbmi level only (M <= kDecodeRowsMax): the values times 2^9 as
  // integers a9 split into int8 planes [rows][3][K], a9 = c0 + 2^7 c1 + 2^14 c2 with c0, c1 in
  // [0, 127], c2 in [-14, 14] (prepare_fp8_digits); nullptr elsewhere.
  const int8_t* digits = nullptr;
  // Several rows (prefill): the values times 2^8 as doubles, [rows][K] (the FMA operands of the
  // prefill tiles, widened once per call instead of once per tile); nullptr up to
  // kDecodeRowsMax rows.
  const double* wide = nullptr;
  // Several rows at the amx level (instead of `wide`): per row and 32-block the 128 bytes
  // [c0 | c1 | c2 | 0] of the digit planes above (prepare_fp8_amx), by tiles of 16 rows (the
  // last one padded with zero rows), each tile block by block so that an AMX tile's operand is
  // one contiguous run: [ceil(rows / 16)][K / 32][16][128] (fp8_amx_row_offset).
  const int8_t* amx = nullptr;
  // Several rows at the AVX2 and AVX-512 levels without AMX (beside `wide`): each block's
  // a9 = value * 2^9 without the block's common power of two, as int16, [rows][K], per row and
  // block how (Fp8NarrowBlock), and per register tile and block their bounds (fp8_narrow_row_tiles):
  // the int16 prefill tile's operands (prepare_fp8_narrow). nullptr elsewhere.
  const int16_t* narrow = nullptr;
  const Fp8NarrowBlock* narrow_blocks = nullptr;  // [rows][K / 32]
  const Fp8NarrowRows* narrow_tiles = nullptr;    // [ceil(rows / kFp8NarrowTileRows)][K / 32]
  // Row r alone (for the one-row kernels).
  Fp8Activations row(int64_t r) const {
    const int64_t KB = K / 32;
    return {values + r * K, scales + r * KB, codes + r * K, special + r, K, digits ? digits + r * 3 * K : nullptr,
            wide ? wide + r * K : nullptr, nullptr};
  }
};

// Where row r of Fp8Activations::amx starts (its block b is 16 * 128 * b bytes further on).
inline int64_t fp8_amx_row_offset(int64_t r, int64_t K) { return r / 16 * (K / 32) * 2048 + r % 16 * 128; }
inline int64_t fp8_amx_bytes(int64_t rows, int64_t K) { return (rows + 15) / 16 * (K / 32) * 2048; }

// Activations of an FP4-weight GEMM, prepared for 8-bit integer dot products: each E4M3 value
// times 2^9 is an integer a9 with |a9| <= 448 * 2^9 < 2^18, split as a9 = c0 + 2^7 c1 + 2^14 c2
// with c0, c1 in [0, 127] and c2 in [-15, 14] (all int8) - or, in a block prepared narrow
// (prepare_fp4_row), a9 >> sh = c0 + 2^7 c1 with c1 in [-128, 127] and c2 = 0, the block's offset
// 12 * sum(a9 >> sh) and its scale times 2^sh, which gives every kernel the same terms while
// those that find the plane zero skip it. The chunk planes follow the weight
// bytes' nibbles: a block's even k (low nibbles of its 16 bytes) and its odd k (high nibbles)
// are 16-byte halves, and 4 consecutive blocks (a quad, zero-padded past K/32) keep each plane's
// halves together - [plane][even: block 0..3][odd: block 0..3] - so that one load of 64 (or 32)
// weight bytes meets its activations in two contiguous vectors per plane.
constexpr int64_t kFp4QuadBytes = 4 * 3 * 32;
inline int64_t fp4_chunk_row_bytes(int64_t K) { return (K / 32 + 3) / 4 * kFp4QuadBytes; }
// Where block b's plane c, half h (0: even k, 1: odd k), 16 bytes, starts in a row's chunks.
inline int64_t fp4_chunk_offset(int64_t b, int64_t c, int64_t h) {
  return b / 4 * kFp4QuadBytes + c * 128 + h * 64 + b % 4 * 16;
}
struct Fp4Activations {
  const int8_t* chunks;    // [rows][fp4_chunk_row_bytes(K)]
  const int32_t* offsets;  // [rows][K/32] 12 * sum of the block's a9 (weights carry +12, below), >> sh if narrow
  const float* scales;     // [rows][K/32] act_quant scale * 2^-10 (exact: scales are >= 2^-22), * 2^sh if narrow
  const uint8_t* codes;    // [rows][K]
  const float* raw_scales; // [rows][K/32] act_quant scales (for the scalar fallback)
  const uint8_t* special;  // [rows]
  int64_t K;
  // Several rows at the amx level: the digit rows of Fp8Activations::amx (prepare_fp8_amx).
  const int8_t* amx = nullptr;
  // Row r alone (for the one-row kernels).
  Fp4Activations row(int64_t r) const {
    const int64_t KB = K / 32;
    return {chunks + r * fp4_chunk_row_bytes(K), offsets + r * KB, scales + r * KB, codes + r * K,
            raw_scales + r * KB, special + r, K, nullptr};
  }
};

// Where a dense kernel writes y[m, n] (one of the two is set).
struct DenseOutput {
  float* f32;
  uint16_t* bf16;
  int64_t stride;
};

struct KernelTable {
  SimdLevel level;
  // Dense linears (gemm.h, "BF16 / FP32 linears"): y[m, n] for m < M, n in [n0, n1), x the
  // activations widened to fp32, [M][K].
  void (*dense_bf16w)(const float* x, int64_t M, const uint16_t* W, int64_t K, int64_t n0,
                      int64_t n1, const DenseOutput& y);
  void (*dense_f32w)(const float* x, int64_t M, const float* W, int64_t K, int64_t n0, int64_t n1,
                     const DenseOutput& y);
  // Packed bf16 dense (gemm.h PackedBf16Matrix): `groups` consecutive groups of `width` blocks
  // (1-8; more than one group only of full ones, at most kPackedStreamGroups) starting at
  // `group`: y[m * y_stride + 16 i + j] for i < groups * width, j < 16, m < M; x [M][K] fp32.
  void (*dense_packed_bf16)(const float* x, int64_t M, const uint16_t* group, int64_t K, int width, int groups,
                            float* y, int64_t y_stride);
  // Block-scaled GEMMs (gemm.h, §3.3): bf16 y[m * y_stride + n] for m < M, n in [n0, n1).
  void (*fp8)(const Fp8Activations& x, int64_t M, const Fp8Matrix& W, int64_t n0, int64_t n1,
              uint16_t* y, int64_t y_stride);
  void (*fp4)(const Fp4Activations& x, int64_t M, const Fp4Matrix& W, int64_t n0, int64_t n1,
              uint16_t* y, int64_t y_stride);
  // act_quant_row (quant.h) for K % 32 == 0, bit for bit; returns false if a block was not
  // finite (such blocks are computed by the scalar act_quant_row).
  bool (*act_quant_row)(const uint16_t* x, int64_t K, uint8_t* codes, float* scales);
  // One row of Fp8Activations / Fp4Activations from bf16 x (K % 32 == 0); `wide` (optional):
  // the prefill tiles' doubles, value * 2^8.
  void (*prepare_fp8_row)(const uint16_t* x, int64_t K, uint8_t* codes, float* scales, float* values,
                          double* wide, uint8_t* special);
  // `narrow`: blocks that can drop their third digit plane do (fp4_narrow_shift in
  // simd_gemm_fp4.inc; the same products, fewer of them where a kernel skips a zero plane).
  void (*prepare_fp4_row)(const uint16_t* x, int64_t K, uint8_t* codes, float* raw_scales, int8_t* chunks,
                          int32_t* offsets, float* scales, uint8_t* special, bool narrow);
  // sparse_attention_row (sparse_attention.h) without the caller's scratch (the kernel keeps its
  // own per thread).
  void (*sparse_attention_row)(const uint16_t* q, int H, int64_t Dh, const uint16_t* const* kv_rows, int n,
                               const float* attn_sink, float softmax_scale, uint16_t* out);
  // indexer_scores (indexer_score.h).
  void (*indexer_scores)(const uint16_t* q, const uint16_t* w, int n_heads, int64_t head_dim, const uint16_t* keys,
                         int64_t count, float* scores);
  // indexer_scores_mxfp4 (indexer_score.h).
  void (*indexer_scores_mxfp4)(const uint16_t* q, const uint16_t* w, int n_heads, int64_t head_dim,
                               const uint8_t* codes, const uint8_t* scales, int64_t count, float* scores);
  // The dot products of hc_mixes (hyper_connection.h) before the rms factor, for mixes [k0, k1)
  // from the projection transposed in blocks of mixes (hyper_connection.h): dots[k - k0] =
  // sum_t fn[k][t] * X[t] as the twin's sequential fp32 chain.
  void (*hc_mix_dots)(const uint16_t* X, int64_t n, const float* fn_t, int k0, int k1, float* dots);
  // `iterations` rounds of independent fp32 FMA chains at the widest vectors of the level;
  // returns the flops done (2 per lane per FMA). The result lands in *sink (keeps it live).
  double (*fma_peak)(int64_t iterations, float* sink);
  // Cache rows to bf16 (quant.h), K already validated.
  void (*mxfp4_dequant_row)(const uint8_t* packed, const uint8_t* e8m0, int64_t K, uint16_t* out);
  void (*nvfp4_dequant_row)(const uint8_t* packed, const uint8_t* e4m3_scales, int64_t K, uint16_t* out);
  void (*fp8_dequant_row)(const uint8_t* codes, const uint8_t* e8m0, int64_t K, uint16_t* out);
  // Fp8Activations::digits of one row from its E4M3 codes (K % 32 == 0); nullptr on levels whose
  // fp8 kernel does not read them.
  void (*prepare_fp8_digits)(const uint8_t* codes, int64_t K, int8_t* digits);
  // hc_post_columns (hyper_connection.h) for whole groups of 8 columns from d0, hc <= kMaxHc
  // already checked; returns the first column not done.
  int64_t (*hc_post_columns)(const uint16_t* y, const uint16_t* Xres, const float* post, const float* comb, int hc,
                             int64_t D, int64_t d0, int64_t d1, uint16_t* Xout);
  // hc_pre (hyper_connection.h) for whole groups of 8 columns, hc <= kMaxHc already checked;
  // returns the first column not done.
  int64_t (*hc_pre_columns)(const uint16_t* X, const float* a, int hc, int64_t D, uint16_t* y);
  // rmsnorm_row's (rmsnorm.h) y = bf16(w * (x * r)) for whole groups of 8 elements; returns the
  // first element not done.
  int64_t (*rmsnorm_apply)(const uint16_t* x, const uint16_t* w, int64_t n, float r, uint16_t* y);
  // int8_row_dots (int8_dot.h), shape already validated.
  void (*int8_row_dots)(const int8_t* x, int64_t x_count, const int8_t* rows, const int32_t* row_sums, int64_t n_rows,
                        int64_t K, int32_t* out);
  // scaled_exp_sum (softmax_exp.h).
  double (*scaled_exp_sum)(const float* x, int64_t n, float scale, float shift, float* out);
  // torch_vec_expf_in_place (vector_exp.h).
  void (*exp_in_place)(float* x, int64_t n);
  // dst[c * dst_stride + r] = src[r * src_stride + c] for r < rows, c < cols (pack_bf16_rows).
  void (*transpose_u16)(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t cols, uint16_t* dst,
                        int64_t dst_stride);
  // int8_quantize_bf16_row (int8_dot.h), K already validated.
  bool (*int8_quantize_bf16_row)(const uint16_t* w, int64_t K, int8_t* q, Int8RowQuant* out);
  // Packed FP8 dense (gemm.h PackedFp8Matrix): one group of `width` blocks (an even number, 2-8)
  // starting at `group`, its scales from `scale` (the group's first scale row, K / 32 per row):
  // y[m * y_stride + 16 i + j] for i < width, j < 16, m < M; x [M][K] fp32.
  void (*dense_packed_fp8)(const float* x, int64_t M, const uint8_t* group, const uint8_t* scale, int64_t K,
                           int width, float* y, int64_t y_stride);
  // Row r of Fp8Activations::amx (at fp8_amx_row_offset) from its E4M3 codes (K % 32 == 0);
  // nullptr on levels whose fp8 kernel does not read it.
  void (*prepare_fp8_amx)(const uint8_t* codes, int64_t K, int8_t* out);
  // Row r of Fp8Activations::narrow / narrow_blocks from its E4M3 codes and act_quant scales
  // (K % 32 == 0). Every level whose fp8 kernel runs the prefill tile (all but AMX) needs it.
  void (*prepare_fp8_narrow)(const uint8_t* codes, const float* scales, int64_t K, int16_t* narrow,
                             Fp8NarrowBlock* blocks);
  // gumbel_argmax (gumbel_draw.h), simd_draw.inc (AVX2: 64-bit multiplies from 32-bit ones).
  GumbelBest (*gumbel_argmax)(const float* p, int64_t n, uint64_t key);
  // Whether the fp4 kernel's one-row decode reads runs of 16 s rows (fp4_decode_row_step): its
  // decode tiles are then multiples of 16 s rows.
  bool fp4_decode_runs;
  // Whether the fp8 / fp4 kernels' one-row decodes read a rows16 copy (gemm.h) when the matrix
  // has one.
  bool fp8_decode_rows16;
  bool fp4_decode_rows16;
  // Whether the fp4 kernel's prefill tiles skip a block's zero third digit plane (then every
  // row is prepared `narrow`; elsewhere only decode rows, up to kDecodeRowsMax, whose kernels
  // all skip it: narrowing the rows of a tile that cannot use it cost up to 6 % at 64 rows).
  bool fp4_prefill_narrow;
};

// The table of a level; nullptr for Scalar (or a level this build does not carry).
const KernelTable* kernel_table(SimdLevel level);
inline const KernelTable* active_kernels() { return kernel_table(simd_level()); }

// Scalar arithmetic of one output element, shared by every level for the rows the SIMD paths
// leave to it (NaN codes, non-finite scales): exactly the twins' §3.3 order.
uint16_t fp8_element_scalar(const uint8_t* codes, const float* scales, const Fp8Matrix& W, int64_t n);
uint16_t fp4_element_scalar(const uint8_t* codes, const float* scales, const Fp4Matrix& W, int64_t n);

}  // namespace ds41::simd
