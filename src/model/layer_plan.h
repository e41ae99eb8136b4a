// The layer plan: everything the forward pass needs to know about each layer, derived once from
// the config (spec backbone.md §1.2). Nothing else in the engine looks at layer numbers: the
// released 40 + 3 layers and a tiny 8 + 1 test model run through the same plan-driven code.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace ds41 {

// CSA² attention mode of a layer (tech report names).
enum class AttnMode {
  WindowOnly,  // ratio 0: sliding-window attention only
  Full,        // kv source: own compressor + index keys + indexer
  Reindex,     // index source that is not a kv source: own indexer over the source's keys
  Reuse,       // compressed layer reusing the most recent index source's top-k
};
const char* attn_mode_name(AttnMode m);

struct RopeSpec {
  double theta = 10000.0;
  bool yarn = false;            // YaRN frequency correction (compressed layers only)
  int64_t original_seq_len = 0;
  double factor = 1.0, beta_fast = 32, beta_slow = 1;
  int dim = 0;                  // rotated dims (the last `dim` of a head)
};

struct LayerPlan {
  int id = 0;
  bool is_dspark = false;       // a DSpark draft stage (mtp.<stage>)
  int dspark_stage = -1;
  std::string prefix;           // checkpoint name prefix: "layers.7." or "mtp.0."
  int ratio = 0;                // compress ratio m (0 = window only)
  AttnMode mode = AttnMode::WindowOnly;
  bool kv_source = false;       // owns a compressor, publishes compressed KV + index K
  bool index_source = false;    // owns an indexer (query side), publishes top-k
  bool owns_index_k = false;    // indexer has wk/k_norm (kv sources)
  bool candidate_source = false;   // builds the candidate-block pool
  bool uses_candidates = false;    // index source restricted to the pool
  int kv_source_layer = -1;     // whose compressed KV this layer reads
  int index_source_layer = -1;  // whose top-k this layer uses
  RopeSpec rope;
  bool decoder = false;         // CED side: false = encoder, true = decoder
  bool engram = false;
  int engram_index = -1;        // position in engram_layer_ids
  bool dspark_target = false;   // its attention input feeds the DSpark drafter
  int routed_experts = 0, activated_experts = 0;
};

struct ModelPlan {
  std::vector<LayerPlan> layers;  // backbone layers then DSpark stages
  int n_layers = 0;               // backbone layers
  int decoder_start = 0;          // first decoder layer (the last kv source), n_layers if none
  // Packed per-token bytes of the length-proportional caches (main KV FP4 + E4M3/16 and index K
  // FP4 + E8M0/32 for every kv source, divided by its ratio), spec §11.
  double kv_bytes_per_token = 0;
  int64_t swa_bytes_per_sequence = 0;   // FP8 ring + E8M0 scales, every layer with attention
  int64_t compressor_state_bytes = 0;   // fp32 partial-group state of ratio>1 compressors
};

ModelPlan build_model_plan(const ModelConfig& c);

}  // namespace ds41
