// The weight catalogue: the declared specification of every tensor a checkpoint for a given
// config must hold (name, dtype, shape), in the released layout (spec backbone.md §2.2,
// engram_dspark_vision.md §A.11, §B.2, §C.7). Opening a checkpoint checks it against this list,
// and `ds41 mkmodel` writes exactly this list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/dtype.h"
#include "model/config.h"

namespace ds41 {

class TensorStore;

enum class TensorGroup { EmbedHead, Attention, HyperConnection, Norm, MoE, Engram, DSpark, Vision };
const char* tensor_group_name(TensorGroup g);
inline constexpr TensorGroup kAllTensorGroups[] = {
    TensorGroup::EmbedHead, TensorGroup::Attention, TensorGroup::HyperConnection, TensorGroup::Norm,
    TensorGroup::MoE, TensorGroup::Engram, TensorGroup::DSpark, TensorGroup::Vision};

// How the values of a tensor are encoded (what mkmodel must generate, how the loader decodes).
enum class TensorRole {
  Plain,        // BF16 / F32 values
  Fp8Weight,    // F8_E4M3 [N, K], scale tensor "<base>.scale" E8M0 [ceil(N/32), ceil(K/32)]
  Fp4Weight,    // I8 [N, K/2] packed E2M1, scale "<base>.scale" E8M0 [N, K/32]
  BlockScale,   // an E8M0 scale tensor of one of the above
  EngramTable,  // F8_E4M3 [rows, head_dim], scale [rows, head_dim/32] E8M0 per 32 of a row
};

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  TensorGroup group;
  TensorRole role = TensorRole::Plain;
  // False for tensors the release always ships but this config does not use (ffn.gate.bias_vl
  // when vision is off): accepted when present, not an error when absent.
  bool required = true;
  int64_t numel() const;
  int64_t nbytes() const;
  // Logical parameters: scale tensors count 0, packed FP4 bytes count 2.
  int64_t params() const;
};

std::vector<TensorSpec> build_weight_catalogue(const ModelConfig& c);

// Checks that `store` holds exactly the catalogue: every problem (missing, unexpected, wrong
// shape, wrong dtype) is collected and reported together in one ds41::Error.
void check_checkpoint_against_catalogue(const TensorStore& store, const std::vector<TensorSpec>& catalogue);
std::vector<std::string> catalogue_problems(const TensorStore& store, const std::vector<TensorSpec>& catalogue);

}  // namespace ds41
