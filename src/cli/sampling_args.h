// The sampling options every generating subcommand accepts (run, chat; serve uses them as its
// defaults), with the model card's recommendation (T 1.0, top-p 0.95) as the default.
#pragma once

#include <vector>

#include "cli/args.h"
#include "runtime/sampler.h"

namespace ds41::cli {

std::vector<OptionSpec> sampling_option_specs();
// Reads them back; throws ds41::Error naming every invalid value.
SamplerOptions sampler_options_from(const Args& args);

}  // namespace ds41::cli
