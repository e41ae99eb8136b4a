// One transcript of everything a model computes, for tests that compare two ways of running the
// same checkpoint bit for bit (streamed experts, experts split across ranks).
#pragma once

#include <algorithm>
#include <vector>

#include "base/thread_pool.h"
#include "model/model.h"
#include "tiny_model.h"

namespace ds41::test {

// Everything a model computes in one transcript: prefill logits of every position, a chunked
// prefill, decode steps, a batched step of three sequences and DSpark drafts after the prefill.
inline std::vector<std::vector<float>> transcript(const Model& m, ThreadPool* pool) {
  const ModelConfig& c = m.config();
  std::vector<std::vector<float>> out;
  ForwardOptions all;
  all.all_logits = true;
  SequenceState s = m.new_sequence();
  std::vector<uint16_t> hidden;
  ForwardOptions with_hidden = all;
  with_hidden.main_hidden_out = &hidden;
  const std::vector<int32_t> prompt = tokens_for(40, 1, c.vocab_size);
  out.push_back(m.forward(s, prompt, with_hidden, pool));
  // DSpark: the prefill's hidden rows committed, then a draft of the block after the last token.
  if (m.has_dspark()) {
    m.dspark_commit(s, hidden.data(), int64_t(prompt.size()), pool);
    SequenceState d = s;
    const DSparkDraft draft = m.dspark_draft(d, prompt.back(), int(c.dspark_block_size) - 1, {}, pool);
    out.push_back(draft.logits);
    out.push_back(draft.confidence);
  }
  for (int step = 0; step < 5; ++step) out.push_back(m.forward(s, {int32_t((step * 131 + 7) % c.vocab_size)}, {}, pool));
  // The same prompt in chunks of 13.
  SequenceState chunked = m.new_sequence();
  for (size_t i = 0; i < prompt.size(); i += 13) {
    const std::vector<int32_t> part(prompt.begin() + long(i), prompt.begin() + long(std::min(prompt.size(), i + 13)));
    out.push_back(m.forward(chunked, part, all, pool));
  }
  // A batched step: three sequences one token each.
  std::vector<SequenceState> seqs;
  for (int i = 0; i < 3; ++i) {
    seqs.push_back(m.new_sequence());
    m.forward(seqs.back(), tokens_for(5 + 9 * i, 10 + i, c.vocab_size), {}, pool);
  }
  std::vector<SequenceState*> ptrs;
  for (auto& q : seqs) ptrs.push_back(&q);
  std::vector<float> logits;
  m.forward_batch(logits, ptrs, {3, 500, 9000}, {}, pool);
  out.push_back(logits);
  return out;
}

}  // namespace ds41::test
