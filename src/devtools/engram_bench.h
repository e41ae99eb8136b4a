// Engram lookup micro-benchmark: what one token's Engram costs, split into hashing, the table-row
// reads (cold page cache vs warm) and the whole Engram step (rows + wkv projection + gates), next
// to the cost of a whole decode step of the same model.
#pragma once

#include <cstdint>
#include <string>

namespace ds41 {

class Model;
class ThreadPool;

struct EngramBenchResult {
  int engram_layers = 0;
  int64_t rows_per_token = 0;         // over all Engram layers
  int64_t row_bytes = 0;              // FP8 codes + E8M0 scales of one row
  int64_t table_bytes = 0;            // all Engram tables (codes + scales)
  int64_t positions = 0;              // tokens timed
  double hash_us_per_token = 0;
  double gather_cold_us_per_token = 0;  // rows read after dropping the checkpoint from the page cache
  double gather_warm_us_per_token = 0;  // the same rows again
  double engram_step_us_per_token = 0;  // warm: rows + wkv + gate for every Engram layer
  double decode_step_us = 0;            // one whole single-token forward call of the model
  bool cold_cache_dropped = false;      // posix_fadvise accepted for every shard
};

// `dir` = the model's checkpoint directory (its shards are dropped from the page cache for the
// cold measurement). Throws ds41::Error for a model without Engram.
EngramBenchResult engram_lookup_benchmark(const Model& model, const std::string& dir, int64_t positions,
                                          ThreadPool* pool, uint64_t seed);

}  // namespace ds41
