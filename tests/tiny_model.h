// A random-weight `tiny` checkpoint written once per test process (Engram can be switched off
// for the backbone-only tests).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "test_paths.h"

namespace ds41::test {

inline ModelConfig tiny_config(bool with_engram) {
  ModelConfig c = preset_config("tiny");
  if (!with_engram) {
    c.engram_layer_ids.clear();
    c.engram_num_embeddings.clear();
  }
  return c;
}

// Directory of a tiny checkpoint (written on first use, removed at exit).
inline const std::string& tiny_model_dir(bool with_engram) {
  static std::map<bool, std::unique_ptr<TempDir>> dirs;
  auto& d = dirs[with_engram];
  if (!d) {
    d = std::make_unique<TempDir>();
    RandomCheckpointOptions opt;
    opt.seed = 1234;
    write_random_checkpoint(tiny_config(with_engram), d->path(), opt);
  }
  return d->path();
}

// n deterministic token ids below `vocab` (distinct sequences for distinct seeds).
inline std::vector<int32_t> tokens_for(int n, int seed, int64_t vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((int64_t(i) * 7919 + seed * 104729 + 17) % vocab));
  return t;
}

}  // namespace ds41::test
