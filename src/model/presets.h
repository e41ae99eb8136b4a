// Built-in model configurations for random-weight checkpoints (`ds41 mkmodel --preset`).
// All keep the released vocabulary (129,280) and special-token ids so a real tokenizer works.
//  tiny  - exercises every mechanism of the released model at toy width; loads in milliseconds.
//  small - ~1.5 GB, realistic head/latent widths, for benchmarks.
//  wide  - ~7.6 GB, the released widths at 6 layers and 24 routed experts: a released layer's cost.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace ds41 {

ModelConfig preset_config(const std::string& name);  // throws Error for unknown names
std::vector<std::string> preset_names();
// The released DeepSeek-V4.1-Flash configuration (as in the HF config.json).
ModelConfig released_config();

}  // namespace ds41
