// The sampling options every generating subcommand accepts (run, chat; serve uses them as its
// defaults), with the model card's recommendation (T 1.0, top-p 0.95) as the default.
#pragma once

#include <vector>

#include "cli/args.h"
#include "runtime/sampler.h"

namespace ds41::cli {

// `temp`/`top_p`: the defaults (chat and serve use the model card's 1.0 / 0.95; `run` is greedy
// by default so that a bare `ds41 run` is reproducible token for token).
std::vector<OptionSpec> sampling_option_specs(double temp = 1.0, double top_p = 0.95);
// Reads them back; throws ds41::Error naming every invalid value.
SamplerOptions sampler_options_from(const Args& args, double temp = 1.0, double top_p = 0.95);

}  // namespace ds41::cli
