// Writes a random-weight checkpoint in exactly the released layout (`ds41 mkmodel`): sharded
// safetensors + model.safetensors.index.json + HF config.json + inference/config.json, FP8 linear
// weights with 32x32 E8M0 block scales, FP4 experts packed in I8 with per-32 E8M0 scales, Engram
// tables with per-32 scales, BF16/F32 where the release has them.
//
// Values are a pure function of (seed, tensor name, element index) — a counter-based generator —
// so files are byte-identical for the same seed whatever the thread count, and every tensor can
// be filled independently. Weight scales are chosen so that activations keep a realistic range
// through all layers (each linear roughly preserves the RMS of its input).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "model/config.h"

namespace ds41 {

class ThreadPool;

struct RandomCheckpointOptions {
  uint64_t seed = 0;
  uint64_t max_shard_bytes = 0;   // 0: split into `min_shards` roughly equal shards
  int min_shards = 3;
  std::string tokenizer_path;     // optional tokenizer.json to copy (with its tokenizer_config.json)
  ThreadPool* pool = nullptr;
  std::function<void(const std::string& what, uint64_t done, uint64_t total)> progress;
};

void write_random_checkpoint(const ModelConfig& c, const std::string& dir, const RandomCheckpointOptions& opt);

// Deterministic standard normal for (stream key, index): exposed for tests.
float random_normal(uint64_t key, uint64_t index);
uint64_t tensor_stream_key(uint64_t seed, const std::string& name);

}  // namespace ds41
