// Writing safetensors files and sharded checkpoints (ds41 mkmodel, tool dumps).
//
// Output is deterministic: the header lists tensors sorted by name, the data area holds them in
// that order with no gaps, and the header is padded with spaces to a multiple of 8 bytes like the
// reference library does, so the same input gives byte-identical files. Every file is written to
// "<path>.tmp" and renamed into place only when complete, so an error (disk full, a throwing fill
// callback) never leaves a half-written file under the final name.
//
// Note on alignment: data follows name order, so a tensor is aligned to its element size only if
// the tensors before it are (true for the usual even shapes); TensorInfo::as<T>() checks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/dtype.h"

namespace ds41 {

struct TensorToWrite {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  // Writes exactly nbytes (= numel * dtype_size) bytes of tensor data to dst. Called once per
  // tensor, with a buffer the writer owns (zeroed beforehand; an empty fill writes zeros).
  std::function<void(uint8_t* dst, size_t nbytes)> fill;
};

// A tensor whose bytes are already in memory (small dumps, tests).
struct TensorBuffer {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // must be exactly numel * dtype_size bytes
};

// Writes one .safetensors file. Peak memory is one buffer the size of the largest tensor.
// Throws Error (naming the file and the tensor) on bad input or any failed write.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

void write_safetensors_buffers(const std::string& path, const std::vector<TensorBuffer>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// How write_sharded_checkpoint splits tensors: shards[i] lists indices into the input, in input
// order. Greedy ("next fit"): a tensor starts a new shard when adding it to a non-empty shard would
// exceed the byte budget, so a tensor bigger than the budget sits alone. When that yields fewer
// than min_shards shards, the budget is lowered to the largest one that yields at least min_shards.
struct ShardPlan {
  std::vector<std::vector<size_t>> shards;
  std::vector<uint64_t> shard_bytes;
  uint64_t total_bytes = 0;
  uint64_t budget = 0;  // the per-shard byte budget actually used
};

ShardPlan plan_shards(const std::vector<TensorToWrite>& tensors, uint64_t max_shard_bytes,
                      int min_shards = 1);

// "model-00002-of-00048.safetensors" (1-based index, 5 digits, as Hugging Face names shards).
std::string shard_file_name(int index, int count);

// Writes model-0000i-of-0000N.safetensors shards (metadata {"format": "pt"}) and
// model.safetensors.index.json ({"metadata": {"total_size": N}, "weight_map": {...}}, sorted keys,
// 2-space indent) into `dir`, creating it if needed. Files already in `dir` are not removed.
void write_sharded_checkpoint(const std::string& dir, std::vector<TensorToWrite> tensors,
                              uint64_t max_shard_bytes, int min_shards = 1);

}  // namespace ds41
