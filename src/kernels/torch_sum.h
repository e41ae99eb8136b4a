// The fp32 sum of a contiguous row in the exact order PyTorch's CPU reduction takes it.
//
// The official reference computes every RMS statistic as x.square().mean(-1) and Engram's gate dot
// product as (...).sum(-1): fp32 tensor reductions over the last, contiguous dim. Their result is
// not the exact sum: PyTorch adds 8-wide vectors in four interleaved accumulators (with a
// multi-level cascade for long rows), folds the accumulators, then adds the 8 lanes in order. The
// exact sum rounds differently in a few percent of rows, and one flipped last bit of a norm
// statistic re-rounds a bf16 output, which the FP8/FP4 quantizers downstream grow into visible
// differences (see the goldens' README). Reproducing the order makes those rows bit-identical.
//
// Order (ATen SumKernel: vectorized_inner_sum -> row_sum -> multi_row_sum, fp32 accumulation,
// vector width 8 (rows shorter than 8: the same 4-accumulator sum over scalars), 4 ILP accumulators, 4 cascade levels of 2^max(4, ceil(log2(rows))/4) rows):
//   vectors v[0..n/8), grouped in rows of 4; accumulator k adds v[4r+k] for r ascending, cascading
//   into higher levels every level_step rows; leftover vectors go into accumulator 0; then
//   acc0 += acc1, += acc2, += acc3; finally a scalar from +0 adds the tail elements past the last
//   whole vector and then the 8 lanes in order.
// Checked bit for bit against torch.sum on random rows of many lengths (tests/torch_sum_test.cpp).
#pragma once

#include <cstdint>

namespace ds41 {

float torch_sum_f32(const float* x, int64_t n);

// torch's x.square().sum(-1) of a bf16 row (squares of bf16 values are exact in fp32).
float torch_sum_squares_bf16(const uint16_t* x, int64_t n);

// torch's x.square().sum(-1) of an fp32 row (each square rounded to fp32 first).
float torch_sum_squares_f32(const float* x, int64_t n);

}  // namespace ds41
