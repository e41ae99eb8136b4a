// Token walks for the constraint tests: the V3 vocabulary and its trie, and one walk that draws
// the likeliest allowed token of cheap pseudo-random logits every step until the end of sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "test_tokenizer_files.h"
#include "text/token_constraint.h"
#include "text/tokenizer.h"

namespace ds41::test {

struct V3Vocabulary {
  Tokenizer tok = Tokenizer::load(v3_tokenizer_path());
  int64_t vocab = tok.vocab_size();
  int32_t eos = *tok.token_to_id("<｜end▁of▁sentence｜>");
  std::shared_ptr<const TokenTrie> trie = std::make_shared<const TokenTrie>(tok, vocab);
};

struct Walk {
  std::string text;   // the bytes written
  bool ended = false; // the end of sequence was drawn within the budget
  bool stuck = false; // a mask allowed nothing
};

inline Walk walk_constraint(TokenConstraint& c, const V3Vocabulary& v, int64_t budget, std::mt19937& rng) {
  Walk w;
  std::vector<float> logits(static_cast<size_t>(v.vocab));
  for (int64_t left = budget; left > 0 && !w.ended; --left) {
    uint32_t x = uint32_t(rng());
    for (float& l : logits) {
      x = x * 1664525u + 1013904223u;
      l = float(x >> 8) * (8.f / 16777216.f);  // uniform in [0, 8)
    }
    logits[size_t(v.eos)] += 4.f;  // a model that wants to stop early: the mask must hold it
    c.mask(logits.data(), v.vocab, left);
    int32_t best = -1;
    for (int64_t i = 0; i < v.vocab; ++i)
      if (logits[size_t(i)] > -1e30f && (best < 0 || logits[size_t(i)] > logits[size_t(best)])) best = int32_t(i);
    if (best < 0 || !c.advance(best)) {
      w.stuck = true;
      return w;
    }
    if (best == v.eos) w.ended = true;
    else w.text += v.tok.token_bytes(best);
  }
  return w;
}

}  // namespace ds41::test
