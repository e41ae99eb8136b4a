// A checkpoint cut for the ranks of an expert-parallel job (model/expert_parallel.h): each host
// keeps only what its rank reads. `ds41 split` writes rank r's copy: rank 0's holds every tensor
// but the other ranks' routed experts, a follower's only its own routed experts (1/N of the expert
// bytes: 69 GiB of the released 276 GiB at 4 ranks), beside the config and tokenizer files. A
// marker file says which rank of how many the copy is for and carries the whole checkpoint's
// fingerprint, so the ranks of a job still compare the same value and a copy given to the wrong
// rank is refused at load.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "io/safetensors.h"
#include "model/expert_parallel.h"
#include "model/layer_plan.h"

namespace ds41 {

inline constexpr const char* kSplitMarkerFileName = "ds41_split.json";

// A hash of the config files, every tensor's name, type, shape and size, and the first bytes of 16
// tensors spread over the list (a few page reads: milliseconds whatever the checkpoint's size).
uint64_t checkpoint_fingerprint(const std::string& dir, const TensorStore& store);

struct SplitMarker {
  int ranks = 1, rank = 0;
  uint64_t source_fingerprint = 0;  // checkpoint_fingerprint of the whole checkpoint
};
// DIR/ds41_split.json when the directory is a split copy; throws Error on an unreadable one.
std::optional<SplitMarker> read_split_marker(const std::string& dir);

// Which routed-expert tensors a rank does not hold ("layers.7.ffn.experts.3." prefixes).
class ForeignExperts {
 public:
  ForeignExperts(const ModelPlan& plan, const ExpertShare& share);
  bool foreign(const std::string& tensor_name) const;  // a routed expert of another rank
  // Whether the rank reads this tensor: its own experts; and on rank 0 everything that is not an
  // expert.
  bool needed(const std::string& tensor_name) const;

 private:
  ExpertShare share_;
  std::vector<std::string> prefixes_;  // sorted
};

// Writes rank `rank` of `ranks`'s copy of checkpoint `src` into `out` (created; must not hold a
// checkpoint already): its tensors in shards of at most `shard_bytes`, the other files of `src`
// (config, tokenizer, Engram map, the inference/ folder) copied, and the marker.
// `progress(bytes_done, bytes_total)` after each tensor. Returns the tensor bytes written.
int64_t write_split_checkpoint(const std::string& src, int ranks, int rank, const std::string& out,
                               uint64_t shard_bytes, const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace ds41
