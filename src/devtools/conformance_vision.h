// The vision stages of a golden case (case.json -> `vision`, expected.safetensors vision.*),
// used by run_conformance (conformance.h):
//  * preprocessing from the case's PNGs: the ViT inputs must equal vision.pixels.{i} exactly, the
//    expanded ids / token types / spans of vision.prompt_tokens_unexpanded must equal the golden's;
//  * the tower: teacher mode feeds every stage its recorded input (patch embedding <- pixels,
//    block j <- vit_hidden[j], final norm <- vit_hidden[last], aligner <- vit_out) and gates with
//    vision.tolerance.teacher_forced_max_abs; pinned/free run pixels -> aligner end to end and gate
//    with end_to_end_max_abs;
//  * the merged embedding vision.embed_merged: text and delimiter rows exact, IMAGE rows against
//    the engine's aligner rows of the mode.
// It returns the prefill call's InputEmbeddings: in teacher mode the golden merged rows (block 0's
// teacher-forced input), otherwise the engine's own.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/model.h"
#include "devtools/conformance.h"

namespace ds41 {

class SafetensorsFile;
class ThreadPool;

struct VisionConformance {
  std::vector<ConformCheck> checks;
  InputEmbeddings prefill_inputs;
};

VisionConformance run_vision_conformance(const std::string& case_dir, const nlohmann::json& case_json,
                                         const Model& model, const SafetensorsFile& expected, bool teacher,
                                         ThreadPool* pool);

}  // namespace ds41
