// `ds41 engram`: the Engram hash rows of a sequence, for debugging against other implementations.
// Prints, for every Engram layer (keys = layer ids as strings), one list of
// (max_ngram_size - 1) * n_heads row ids per position.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "model/config.h"
#include "model/engram_hash.h"
#include "model/model.h"

namespace ds41::cli {

int cmd_engram(int argc, char** argv) {
  Args args("engram", "print the Engram hash rows of a sequence",
            "ds41 engram --config FILE --compressed-ids 5231,887,... [--pad-id N] [--json]\n"
            "       ds41 engram -m DIR --tokens 0,5,9,... [--json]",
            {{"config", "FILE", "model config (HF or flat); with --compressed-ids", ""},
             {"compressed-ids", "IDS", "compressed token ids, -1 marks an image position", ""},
             {"pad-id", "N", "compressed id of the pad token (with --config)", "2"},
             {"model", "DIR", "checkpoint directory (its compressed token map turns --tokens into ids)", ""},
             {"m", "DIR", "same as --model", ""},
             {"tokens", "IDS", "raw token ids (with -m)", ""},
             {"json", "", "JSON output (the only format; accepted for symmetry)", ""},
             {"threads", "N", "unused (hashing is cheap); accepted like every compute command", "0"}});
  if (!args.parse(argc, argv)) return 0;
  ModelConfig c;
  std::vector<int64_t> history;
  int64_t pad = args.get_int("pad-id", 2);
  const std::string dir = args.get_or("model", args.get_or("m", ""));
  if (!dir.empty()) {
    auto model = Model::load(dir);
    c = model->config();
    if (c.engram_layer_ids.empty()) throw Error(dir + ": this model has no Engram layers");
    const auto& map = model->compressed_vocab();
    pad = map[size_t(c.engram_pad_id)];
    for (int32_t t : parse_token_ids(args.get_or("tokens", ""), int64_t(map.size()))) history.push_back(map[size_t(t)]);
  } else {
    auto cfg = args.get("config");
    if (!cfg) throw Error("ds41 engram: give --config FILE with --compressed-ids, or -m DIR with --tokens");
    c = load_config_file(*cfg);
    validate_config(c);
    if (c.engram_layer_ids.empty()) throw Error(*cfg + ": this config has no Engram layers");
    const std::string ids = args.get_or("compressed-ids", "");
    if (ids.empty()) throw Error("--compressed-ids: no ids given");
    history = parse_int_list(ids, "--compressed-ids");
    for (auto& h : history)
      if (h == -1) h = kEngramDead;
  }
  EngramHashParams p = make_engram_hash_params(c, pad);
  std::vector<int64_t> out(history.size() * size_t(p.n_layers) * size_t(p.columns));
  engram_hash_positions(p, history.data(), 0, int(history.size()), out.data());
  nlohmann::json j = nlohmann::json::object();
  for (int l = 0; l < p.n_layers; ++l) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t s = 0; s < history.size(); ++s) {
      const int64_t* r = out.data() + (s * size_t(p.n_layers) + size_t(l)) * size_t(p.columns);
      rows.push_back(std::vector<int64_t>(r, r + p.columns));
    }
    j[std::to_string(c.engram_layer_ids[size_t(l)])] = rows;
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace ds41::cli
