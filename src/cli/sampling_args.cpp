#include "cli/sampling_args.h"

#include "base/error.h"

namespace ds41::cli {

std::vector<OptionSpec> sampling_option_specs(double temp, double top_p) {
  auto num = [](double v) {
    std::string s = std::to_string(v);
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.') s.pop_back();
    return s;
  };
  return {{"temp", "T", "sampling temperature (0 = greedy)", num(temp)},
          {"top-k", "K", "keep the K most probable tokens (0 = off)", "0"},
          {"top-p", "P", "nucleus sampling threshold (1 = off)", num(top_p)},
          {"min-p", "P", "drop tokens below P x the most probable one (0 = off)", "0"},
          {"repeat-penalty", "R", "repetition penalty on tokens already in the sequence (1 = off)", "1"},
          {"presence-penalty", "X", "subtracted once from the logit of every token already present", "0"},
          {"frequency-penalty", "X", "subtracted per occurrence of a token already present", "0"},
          {"penalty-last-n", "N", "how many recent tokens the penalties look at (0 = all)", "0"},
          {"seed", "N", "sampling seed (same seed + same input = same output)", "0"}};
}

SamplerOptions sampler_options_from(const Args& args, double temp, double top_p) {
  SamplerOptions o;
  o.temperature = args.get_double("temp", temp);
  o.top_k = args.get_int("top-k", 0);
  o.top_p = args.get_double("top-p", top_p);
  o.min_p = args.get_double("min-p", 0.0);
  o.repetition_penalty = args.get_double("repeat-penalty", 1.0);
  o.presence_penalty = args.get_double("presence-penalty", 0.0);
  o.frequency_penalty = args.get_double("frequency-penalty", 0.0);
  o.penalty_last_n = args.get_int("penalty-last-n", 0);
  o.seed = uint64_t(args.get_int("seed", 0));
  auto problems = sampler_option_problems(o);
  if (!problems.empty()) {
    std::string msg = "invalid sampling options:";
    for (auto& p : problems) msg += "\n  " + p;
    throw Error(msg);
  }
  return o;
}

}  // namespace ds41::cli
