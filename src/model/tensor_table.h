// Every tensor of a checkpoint, declared once: its name, format, shape and where its view goes.
// The catalogue (weight_catalogue.cpp: what a checkpoint must hold, what mkmodel writes) and the
// loader (weights.cpp: the typed views the forward pass reads) are both walks over these tables,
// so a tensor is added, renamed or reshaped in one row.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "model/config.h"
#include "model/layer_plan.h"
#include "model/weight_catalogue.h"
#include "model/weights.h"

namespace ds41 {

using Dims = std::vector<int64_t>;

// The output head, which the loader also repacks (weights.cpp).
inline constexpr const char* kHeadTensor = "head.weight";

// How a tensor is stored. Fp8 and Fp4 rows name a linear layer ("attn.wq_a"): the checkpoint
// holds "<name>.weight" and "<name>.scale" and `dims` is its [out, in]. EngramTable rows name a
// table the same way ([rows, head_dim], one scale per 32 of a row). The others name the tensor.
enum class TensorFormat { Bf16, F32, Fp8, Fp4, EngramTable };

// Which blocks (or, for model-level rows, which configs) hold a tensor.
enum class TensorWhen {
  Always,
  KvSource,         // the compressor of a kv source
  GatedKvSource,    // a kv source with ratio > 1 (its gate projection)
  IndexSource,      // the indexer's query side
  OwnsIndexK,       // the indexer's key side (kv sources)
  GateVisionBias,   // always shipped; read (and required) only with vision on, in backbone layers
  RoutedExpert,     // once per routed expert, named after expert_prefix()
  Engram,           // Engram layers
  DSparkFirst,      // the first DSpark stage (its input projection)
  DSparkLast,       // the last DSpark stage (the draft heads)
  Vision,           // model level: configs with a vision tower
};

// Where a block tensor's view goes: a member of the block, of one of its experts, of the shared
// expert, or of the draft head. A `const float*` slot of a Bf16 row is widened to fp32 at load.
using BlockSlot = std::variant<const uint16_t* BlockWeights::*, const float* BlockWeights::*, Fp8Matrix BlockWeights::*,
                               const uint8_t* BlockWeights::*, Fp4Matrix ExpertWeights::*,
                               Fp8Matrix SharedExpertWeights::*, const uint16_t* DSparkHeadWeights::*,
                               const float* DSparkHeadWeights::*, Fp8Matrix DSparkHeadWeights::*>;

struct BlockTensor {
  const char* name;  // after the block's prefix ("layers.7.", "mtp.0."); expert rows after expert_prefix()
  TensorFormat format;
  TensorGroup group;  // DSpark stages file every tensor under TensorGroup::DSpark
  TensorWhen when;
  Dims (*dims)(const ModelConfig&, const LayerPlan&);
  BlockSlot slot;
  // Fp8 rows: whether the one-row decode kernels read a rows16 copy (kernels/gemm.h). wo_a is
  // read as bf16 values instead (weights.h).
  bool decode_copy = true;
};

using ModelSlot = std::variant<const uint16_t* ModelWeights::*, const uint16_t* VisionWeights::*,
                               const float* VisionWeights::*>;
struct ModelTensor {
  const char* name;
  TensorGroup group;
  TensorWhen when;  // Always or Vision
  Dims (*dims)(const ModelConfig&);
  ModelSlot slot;  // all BF16
};

using VisionBlockSlot = std::variant<const uint16_t* VisionBlockWeights::*, const float* VisionBlockWeights::*>;
struct VisionBlockTensor {
  const char* name;  // after vision_block_prefix()
  Dims (*dims)(const ModelConfig&);
  VisionBlockSlot slot;  // all BF16
};

// In checkpoint order: the text model's own tensors, the blocks (backbone, then DSpark stages),
// then the vision tower's (vision_tensors: the model-level ones, vision_block_tensors per block).
std::span<const ModelTensor> text_model_tensors();
std::span<const BlockTensor> block_tensors();
std::span<const ModelTensor> vision_tensors();
std::span<const VisionBlockTensor> vision_block_tensors();

// Whether block `lp` of `c` holds the row (RoutedExpert rows: each of its experts does).
bool block_has(const BlockTensor& t, const ModelConfig& c, const LayerPlan& lp);
// Whether the checkpoint must hold it (rows that exist but are unused may be absent).
bool block_requires(const BlockTensor& t, const ModelConfig& c, const LayerPlan& lp);
std::string expert_prefix(const LayerPlan& lp, int expert);  // "layers.7.ffn.experts.3."
std::string vision_block_prefix(int block);                  // "vision.blocks.1."

}  // namespace ds41
