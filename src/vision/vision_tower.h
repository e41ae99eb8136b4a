// The vision tower: ViT over one image's patches, then the aligner into LLM-width rows (spec
// engram_dspark_vision.md §C.4, §C.5, pitfalls 13-14; vision.py). Everything is per image (a batch
// of one, full bidirectional attention, no class token, no absolute position embedding), bf16
// activations between ops as in the reference:
//   x = patch_embed(pixels)                                   Linear 3p^2 -> vision_dim, bias
//   per block: x = x + wo(attn(rope(q), rope(k), v)) ;  x = x + w2(silu(gate) * up)
//     with the pre-norms RMSNorm (eps 1e-6, fp32 weight), wqkv with bias split q | k | v,
//     2D RoPE half-split (below), attention in fp32 with one bf16 rounding of its output
//   out = RMSNorm(x)
//   aligner: the [vision_dim, h, w] grid zero-padded at the bottom/right to multiples of r,
//     r x r cells unfolded channel-major (ch * r^2 + ky * r + kx), w1 + bias, exact GELU,
//     w2 + bias, one row per cell in reading order.
//
// Numerics (the golden vision-a's arithmetic; its tolerances are in case.json ->
// vision.tolerance): every Linear is a dot product exact in double rounded once to fp32 (gemm.h),
// plus its bf16 bias in fp32, rounded to bf16 — as torch's bf16 addmm accumulates in fp32 and adds
// the bias before its one rounding. Attention follows torch's math path for these 3-D bf16 inputs
// (fp32 upcast): q and k each scaled by sqrt(1/sqrt(head_dim)) in fp32, scores and P @ V exact in
// double rounded to fp32, softmax as max / exp / sum / times the reciprocal of the sum. SiLU is
// evaluated op by op in bf16 as torch 1.13 (the golden's) does; with that, every stage of the
// golden is reproduced bit for bit.
//
// 2D RoPE (vision.py get_vision_cos_sin / apply_rotary): rope_dim = head_dim / 2 angle slots,
// f_j = 1 / theta^(2j / rope_dim) for j < rope_dim / 2 (the LLM's fp32 formula, rope.h); patch at
// grid row r, column c gets angles [r f_0 .. r f_{rope_dim/2-1}, c f_0 .. c f_{rope_dim/2-1}]; a
// head vector is split in halves x1 = x[0, hd/2), x2 = x[hd/2, hd) and rotated pairwise
// (x1[d], x2[d]) by angle d: y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin, each product rounded in
// fp32 (not interleaved pairs as in the LLM).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace ds41 {

class ThreadPool;

// cos/sin of every patch of an n_h x n_w grid: [n_h * n_w][rope_dim], rope_dim = head_dim / 2.
struct VisionRope {
  int rope_dim = 0;
  std::vector<float> cos, sin;
};
VisionRope make_vision_rope(const ModelConfig& c, int64_t n_h, int64_t n_w);

// Stages of the tower, each on bf16 rows [rows][cols] (for teacher-forced checks and tests).
std::vector<uint16_t> vit_patch_embed(const VisionWeights& w, const ModelConfig& c, const uint16_t* patches,
                                      int64_t n_patches, ThreadPool* pool);
// One block, x [n][vision_dim] updated in place.
void vit_block(const VisionBlockWeights& w, const ModelConfig& c, const VisionRope& rope, uint16_t* x, int64_t n,
               ThreadPool* pool);
std::vector<uint16_t> vit_final_norm(const VisionWeights& w, const ModelConfig& c, const uint16_t* x, int64_t n);
// ViT output [n_h * n_w][vision_dim] -> [ceil(n_h/r) * ceil(n_w/r)][dim].
std::vector<uint16_t> aligner_forward(const VisionWeights& w, const ModelConfig& c, const uint16_t* vit_out,
                                      int64_t n_h, int64_t n_w, ThreadPool* pool);

// The whole tower for one image's patches [n_h * n_w][3 p^2] -> aligner rows. `observe`, when
// given, sees the ViT hidden states after the patch embedding (stage 0) and after each block
// (stage j + 1), then the ViT output (stage -1).
using VitObserver = std::function<void(int stage, const uint16_t* x, int64_t rows)>;
std::vector<uint16_t> encode_image_patches(const VisionWeights& w, const ModelConfig& c, const uint16_t* patches,
                                           int64_t n_h, int64_t n_w, ThreadPool* pool,
                                           const VitObserver* observe = nullptr);

}  // namespace ds41
