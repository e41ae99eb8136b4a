// Every slot of the SIMD KernelTable (kernels/simd_kernels.h), at every level this CPU supports,
// gives the bytes the Scalar level gives: one table with a case per public op, each naming the
// slots it drives (in the style of llama.cpp's test-backend-ops). A slot added to or removed from
// KernelTable fails the static_assert below until it has a case here (and a name in kSlots).
// The kernels' own tests go further (ragged shapes, NaNs, extreme blocks); this one is the map.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/gumbel_draw.h"
#include "kernels/hyper_connection.h"
#include "kernels/indexer_score.h"
#include "kernels/int8_dot.h"
#include "kernels/quant.h"
#include "kernels/rmsnorm.h"
#include "kernels/simd_kernels.h"
#include "kernels/simd_level.h"
#include "kernels/softmax_exp.h"
#include "kernels/sparse_attention.h"
#include "kernels/vector_exp.h"
#include "simd_levels.h"
#include "simd_test_data.h"

namespace ds41 {
namespace {

using namespace simd_test;

// The level, 29 function pointers and three flags.
static_assert(sizeof(simd::KernelTable) == 8 + 29 * sizeof(void*) + 8,
              "KernelTable changed: give the new slot a case in kernel_slots_test.cpp");

const std::vector<std::string> kSlots = {
    "dense_bf16w", "dense_f32w", "dense_packed_bf16", "fp8", "fp4", "act_quant_row", "prepare_fp8_row",
    "prepare_fp4_row", "sparse_attention_row", "indexer_scores", "indexer_scores_mxfp4", "hc_mix_dots", "fma_peak",
    "mxfp4_dequant_row", "nvfp4_dequant_row", "fp8_dequant_row", "prepare_fp8_digits", "hc_post_columns",
    "hc_pre_columns", "rmsnorm_apply", "int8_row_dots", "scaled_exp_sum", "exp_in_place", "transpose_u16",
    "int8_quantize_bf16_row", "dense_packed_fp8", "prepare_fp8_amx", "prepare_fp8_narrow", "gumbel_argmax", "fp4_decode_runs", "fp8_decode_rows16", "fp4_decode_rows16"};

using Bytes = std::vector<uint8_t>;

template <class T>
void append(Bytes& out, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  out.insert(out.end(), p, p + v.size() * sizeof(T));
}
template <class T>
void append_value(Bytes& out, const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

struct SlotCase {
  std::vector<std::string> slots;  // the slots this op reaches (at the levels that have them)
  std::function<Bytes(std::mt19937&, ThreadPool&)> run;
};

// `normal`: checkpoint-like weights (normal_e4m3), most of whose blocks take the int16 prefill tile.
Bytes fp8_linear(std::mt19937& rng, ThreadPool& pool, int64_t M, int64_t N, int64_t K, bool rows16,
                 bool normal = false) {
  const std::vector<uint16_t> x = random_bf16(M * K, rng);
  const std::vector<uint8_t> w = normal ? normal_e4m3(N * K, rng) : random_e4m3(N * K, rng), scale = random_scales((N + 31) / 32 * (K / 32), rng);
  Fp8Matrix W{w.data(), scale.data(), N, K};
  std::vector<uint8_t> copy;
  if (rows16) {
    copy.resize(static_cast<size_t>(fp8_rows16_bytes(W)));
    pack_fp8_rows16(W, copy.data());
    W.rows16 = copy.data();
  }
  std::vector<uint16_t> y(static_cast<size_t>(M * N));
  linear_fp8(x.data(), M, W, y.data(), &pool);
  Bytes out;
  append(out, y);
  return out;
}

Bytes fp4_linear(std::mt19937& rng, ThreadPool& pool, int64_t M, int64_t N, int64_t K, bool rows16) {
  const std::vector<uint16_t> x = random_bf16(M * K, rng);
  const std::vector<uint8_t> w = random_bytes(N * K / 2, rng), scale = random_scales(N * (K / 32), rng);
  Fp4Matrix W{w.data(), scale.data(), N, K};
  std::vector<uint8_t> copy;
  if (rows16) {
    copy.resize(static_cast<size_t>(fp4_rows16_bytes(W)));
    pack_fp4_rows16(W, copy.data());
    W.rows16 = copy.data();
  }
  std::vector<uint16_t> y(static_cast<size_t>(M * N));
  linear_fp4(x.data(), M, W, y.data(), &pool);
  Bytes out;
  append(out, y);
  return out;
}

const std::vector<SlotCase>& slot_cases() {
  static const std::vector<SlotCase> cases = {
      {{"dense_bf16w"},
       [](std::mt19937& rng, ThreadPool& pool) {
         const int64_t M = 3, N = 37, K = 70;
         const std::vector<float> x = random_f32(M * K, rng);
         const std::vector<uint16_t> w = random_bf16(N * K, rng);
         std::vector<float> y(static_cast<size_t>(M * N));
         linear_f32_wbf16(x.data(), M, w.data(), N, K, y.data(), &pool);
         Bytes out;
         append(out, y);
         return out;
       }},
      {{"dense_f32w"},
       [](std::mt19937& rng, ThreadPool& pool) {
         const int64_t M = 2, N = 29, K = 45;
         const std::vector<float> x = random_f32(M * K, rng), w = random_f32(N * K, rng);
         std::vector<float> y(static_cast<size_t>(M * N));
         linear_f32(x.data(), M, w.data(), N, K, y.data(), &pool);
         Bytes out;
         append(out, y);
         return out;
       }},
      {{"dense_packed_bf16", "transpose_u16"},
       [](std::mt19937& rng, ThreadPool& pool) {
         const int64_t N = 100, K = 40;
         const std::vector<uint16_t> w = random_bf16(N * K, rng);
         std::vector<uint16_t> blocks(static_cast<size_t>(N / 16 * 16 * K));
         pack_bf16_rows(w.data(), N, K, blocks.data(), &pool);
         const PackedBf16Matrix W{blocks.data(), w.data(), N, K};
         Bytes out;
         append(out, blocks);
         for (int64_t M : {1, 2}) {
           const std::vector<float> x = random_f32(M * K, rng);
           std::vector<float> y(static_cast<size_t>(M * N));
           linear_f32_wbf16_packed(x.data(), M, W, y.data(), &pool);
           append(out, y);
         }
         return out;
       }},
      {{"fp8", "prepare_fp8_row", "prepare_fp8_digits", "prepare_fp8_amx", "fp8_decode_rows16", "prepare_fp8_narrow"},
       [](std::mt19937& rng, ThreadPool& pool) {
         Bytes out;
         for (int64_t M : {1, 5, 40}) {  // decode, prefill tiles, AMX panels
           const Bytes y = fp8_linear(rng, pool, M, 48, 256, /*rows16=*/M == 1);
           out.insert(out.end(), y.begin(), y.end());
         }
         const Bytes y = fp8_linear(rng, pool, 13, 48, 256, false, /*normal=*/true);  // int16 prefill tiles
         out.insert(out.end(), y.begin(), y.end());
         return out;
       }},
      {{"fp4", "prepare_fp4_row", "fp4_decode_runs", "fp4_decode_rows16"},
       [](std::mt19937& rng, ThreadPool& pool) {
         Bytes out;
         for (int64_t M : {1, 7, 40}) {
           const Bytes y = fp4_linear(rng, pool, M, 48, 256, /*rows16=*/M == 1);
           out.insert(out.end(), y.begin(), y.end());
         }
         return out;
       }},
      {{"act_quant_row"},
       [](std::mt19937& rng, ThreadPool&) {
         const int64_t K = 512;
         const std::vector<uint16_t> x = random_bf16(K, rng);
         std::vector<uint8_t> codes(static_cast<size_t>(K));
         std::vector<float> scales(static_cast<size_t>(K / 32));
         act_quant_row(x.data(), K, codes.data(), scales.data());
         Bytes out;
         append(out, codes);
         append(out, scales);
         return out;
       }},
      {{"sparse_attention_row"},
       [](std::mt19937& rng, ThreadPool&) {
         const int H = 4;
         const int64_t Dh = 64;
         const int n = 77;
         const std::vector<uint16_t> q = random_bf16(H * Dh, rng), kv = random_bf16(n * Dh, rng);
         std::vector<const uint16_t*> rows;
         for (int i = 0; i < n; ++i) rows.push_back(kv.data() + i * Dh);
         const std::vector<float> sink = random_f32(H, rng);
         std::vector<float> scratch(static_cast<size_t>(sparse_attention_scratch_floats(Dh)));
         std::vector<uint16_t> o(static_cast<size_t>(H * Dh));
         sparse_attention_row(q.data(), H, Dh, rows.data(), n, sink.data(), 0.125f, o.data(), scratch.data());
         Bytes out;
         append(out, o);
         return out;
       }},
      {{"indexer_scores", "indexer_scores_mxfp4"},
       [](std::mt19937& rng, ThreadPool&) {
         const int NH = 8;
         const int64_t IH = 64, count = 37;
         const std::vector<uint16_t> q = random_bf16(NH * IH, rng), w = random_bf16(NH, rng), keys = random_bf16(count * IH, rng);
         const std::vector<uint8_t> codes = random_bytes(count * IH / 2, rng), scales = random_scales(count * (IH / 32), rng);
         std::vector<float> a(static_cast<size_t>(count)), b(static_cast<size_t>(count));
         indexer_scores(q.data(), w.data(), NH, IH, keys.data(), count, a.data());
         indexer_scores_mxfp4(q.data(), w.data(), NH, IH, codes.data(), scales.data(), count, b.data());
         Bytes out;
         append(out, a);
         append(out, b);
         return out;
       }},
      {{"hc_mix_dots", "hc_pre_columns", "hc_post_columns"},
       [](std::mt19937& rng, ThreadPool&) {
         const int hc = 4;
         const int64_t D = 72;
         const int nmix = hc_mix_count(hc);
         const std::vector<uint16_t> X = random_bf16(hc * D, rng), y = random_bf16(D, rng);
         const std::vector<float> fn = random_f32(nmix * hc * D, rng), a = random_f32(hc, rng), post = random_f32(hc, rng),
                                  comb = random_f32(hc * hc, rng);
         std::vector<float> fn_t(static_cast<size_t>(transposed_hc_projection_size(nmix, hc * D)));
         transpose_hc_projection(fn.data(), nmix, hc * D, fn_t.data());
         std::vector<float> dots(static_cast<size_t>(nmix));
         hc_mix_dots(X.data(), hc, D, fn.data(), fn_t.data(), 0, nmix, dots.data());
         std::vector<uint16_t> pre(static_cast<size_t>(D)), next(static_cast<size_t>(hc * D));
         hc_pre(X.data(), a.data(), hc, D, pre.data());
         hc_post(y.data(), X.data(), post.data(), comb.data(), hc, D, next.data());
         Bytes out;
         append(out, dots);
         append(out, pre);
         append(out, next);
         return out;
       }},
      {{"rmsnorm_apply"},
       [](std::mt19937& rng, ThreadPool&) {
         const int64_t n = 203;
         const std::vector<uint16_t> x = random_bf16(n, rng), w = random_bf16(n, rng);
         std::vector<uint16_t> y(static_cast<size_t>(n));
         rmsnorm_row(x.data(), w.data(), n, 1e-6f, y.data());
         Bytes out;
         append(out, y);
         return out;
       }},
      {{"mxfp4_dequant_row", "nvfp4_dequant_row", "fp8_dequant_row"},
       [](std::mt19937& rng, ThreadPool&) {
         const int64_t K = 256;
         const std::vector<uint8_t> packed = random_bytes(K / 2, rng), e8m0 = random_scales(K / 32, rng),
                                    e4m3 = random_e4m3(K / 16, rng), codes = random_e4m3(K, rng);
         std::vector<uint16_t> a(static_cast<size_t>(K)), b(static_cast<size_t>(K)), c(static_cast<size_t>(K));
         mxfp4_dequant_row(packed.data(), e8m0.data(), K, a.data());
         nvfp4_dequant_row(packed.data(), e4m3.data(), K, b.data());
         fp8_dequant_row(codes.data(), e8m0.data(), K, c.data());
         Bytes out;
         append(out, a);
         append(out, b);
         append(out, c);
         return out;
       }},
      {{"int8_quantize_bf16_row", "int8_row_dots"},
       [](std::mt19937& rng, ThreadPool&) {
         const int64_t K = 320, n_rows = 21, x_count = 3;
         const std::vector<uint16_t> w = random_bf16(n_rows * K, rng);
         std::vector<int8_t> q(static_cast<size_t>(n_rows * K)), x(static_cast<size_t>(x_count * K));
         std::vector<int32_t> sums(static_cast<size_t>(n_rows));
         Bytes out;
         for (int64_t r = 0; r < n_rows; ++r) {
           Int8RowQuant rq;
           append_value(out, int8_quantize_bf16_row(w.data() + r * K, K, q.data() + r * K, &rq));
           append_value(out, rq.scale);
           append_value(out, rq.max_error);
           sums[size_t(r)] = rq.sum;
         }
         for (int8_t& v : x) v = int8_t(int(rng() % 255) - 127);
         std::vector<int32_t> dots(static_cast<size_t>(x_count * n_rows));
         int8_row_dots(x.data(), x_count, q.data(), sums.data(), n_rows, K, dots.data());
         append(out, q);
         append(out, dots);
         return out;
       }},
      {{"scaled_exp_sum", "exp_in_place"},
       [](std::mt19937& rng, ThreadPool&) {
         const int64_t n = 1001;
         std::vector<float> x = random_f32(n, rng), e(static_cast<size_t>(n));
         Bytes out;
         append_value(out, scaled_exp_sum(x.data(), n, 0.7f, 1.5f, e.data()));
         append(out, e);
         torch_vec_expf_in_place(x.data(), n);
         append(out, x);
         return out;
       }},
      {{"dense_packed_fp8"},
       [](std::mt19937& rng, ThreadPool& pool) {
         const int64_t N = 64, K = 128;
         const std::vector<uint8_t> w = random_e4m3(N * K, rng);
         std::vector<uint8_t> scale(static_cast<size_t>(N / 32 * (K / 32)));
         for (uint8_t& c : scale) c = uint8_t(117 + rng() % 21);  // 2^-10 .. 2^10: what the packed layout takes
         const Fp8Matrix W{w.data(), scale.data(), N, K};
         Bytes out;
         if (!fp8_packable(W)) return out;  // (then the test fails: the case must exercise the slot)
         // The packed codes with kPackedFp8Front readable bytes before them (gemm.h).
         std::vector<uint8_t> blocks(static_cast<size_t>(kPackedFp8Front + N * K), 0xff);
         pack_fp8_rows(W, blocks.data() + kPackedFp8Front, &pool);
         const std::vector<float> x = random_f32(K, rng);
         std::vector<float> y(static_cast<size_t>(N));
         const PackedFp8LinearJob job{x.data(), PackedFp8Matrix{blocks.data() + kPackedFp8Front, scale.data(), N, K}, y.data()};
         linear_f32_wfp8_packed_batch(&job, 1, 1, &pool);
         append(out, y);
         return out;
       }},
      {{"gumbel_argmax"},
       [](std::mt19937& rng, ThreadPool&) {
         std::vector<float> p = random_f32(5000, rng);
         for (float& v : p) v = v < 0 ? -v : v;
         Bytes out;
         for (uint64_t key : {1ull, 77ull, 123456789ull}) {
           const GumbelBest b = gumbel_argmax(p.data(), int64_t(p.size()), key);
           append_value(out, b.index);
           append_value(out, b.value);
         }
         return out;
       }},
  };
  return cases;
}

TEST(KernelSlots, EverySlotHasACaseOrASaidReason) {
  std::set<std::string> covered = {"fma_peak"};  // a measurement (`ds41 bench`), no numbers to compare
  for (const SlotCase& c : slot_cases()) covered.insert(c.slots.begin(), c.slots.end());
  for (const std::string& s : kSlots) EXPECT_TRUE(covered.count(s)) << s << " has no case";
  EXPECT_EQ(covered.size(), kSlots.size()) << "a case names a slot that KernelTable does not have";
}

TEST(KernelSlots, EveryLevelGivesTheScalarBytes) {
  const auto levels = supported_simd_levels();
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  ThreadPool pool(3);
  uint32_t seed = 1;
  for (const SlotCase& c : slot_cases()) {
    std::string name;
    for (const std::string& s : c.slots) name += (name.empty() ? "" : "+") + s;
    std::mt19937 rng(seed);
    Bytes scalar;
    {
      ScopedSimdLevel level(SimdLevel::Scalar);
      scalar = c.run(rng, pool);
    }
    EXPECT_FALSE(scalar.empty()) << name;
    for (SimdLevel l : levels) {
      std::mt19937 again(seed);
      ScopedSimdLevel level(l);
      const Bytes fast = c.run(again, pool);
      EXPECT_EQ(first_difference(fast, scalar), -1) << name << " at " << simd_level_name(l);
    }
    ++seed;
  }
}

}  // namespace
}  // namespace ds41
