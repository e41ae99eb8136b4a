#include "cli/run_dspark.h"

#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/thread_pool.h"
#include "runtime/session.h"
#include "runtime/speculative.h"

namespace ds41::cli {

using json = nlohmann::json;

const std::vector<OptionSpec> kDsparkRunOptions = {
    {"dspark", "", "speculative decoding with the model's DSpark draft head (same tokens as without it when greedy)", ""},
    {"draft-tokens", "N", "with --dspark: drafts per cycle (1..block size; 0 = the block size)", "0"},
    {"dspark-confidence", "C", "with --dspark: stop a draft where its cumulative confidence falls below C (0 = off)", "0"},
    {"compare", "", "with --dspark: also decode without it on a copy of the sequence and report the speed-up", ""},
};

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

json top5(const float* logits, int64_t V) {
  std::vector<int32_t> idx(static_cast<size_t>(V));
  for (int32_t i = 0; i < V; ++i) idx[size_t(i)] = i;
  std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  json top = json::array();
  for (int i = 0; i < 5; ++i) top.push_back({{"id", idx[size_t(i)]}, {"logit", logits[idx[size_t(i)]]}});
  return top;
}

// Plain decoding of the same request on a copy of the sequence, for --compare.
struct PlainRun {
  std::vector<int32_t> tokens;
  double decode_s = 0;
};
PlainRun plain_decode(const Model& model, SequenceState st, const RunSettings& s, ThreadPool& pool) {
  const ModelConfig& c = model.config();
  Sampler sampler(s.sampling);
  std::vector<float> logits;
  const size_t step = s.chunk ? size_t(s.chunk) : s.prompt.size();
  for (size_t i = 0; i < s.prompt.size(); i += step)
    logits = model.forward(st, std::vector<int32_t>(s.prompt.begin() + long(i), s.prompt.begin() + long(std::min(s.prompt.size(), i + step))),
                           s.forward, &pool);
  PlainRun r;
  const auto t0 = Clock::now();
  for (int64_t n = 0; n < s.max_tokens && st.pos < c.max_seq_len; ++n) {
    const int32_t tok = sampler.sample(logits.data(), c.vocab_size, uint64_t(n));
    r.tokens.push_back(tok);
    if (tok == c.eos_token_id || n + 1 == s.max_tokens) break;
    logits = model.forward(st, {tok}, s.forward, &pool);
  }
  r.decode_s = since(t0);
  return r;
}

}  // namespace

bool dspark_requested(const Args& args) {
  if (args.flag("dspark")) return true;
  for (const char* o : {"draft-tokens", "dspark-confidence", "compare"})
    if (args.flag(o)) throw Error("ds41 run: --" + std::string(o) + " only applies with --dspark");
  return false;
}

int run_dspark(const Args& args, const Model& model, SequenceState& st, const RunSettings& s, ThreadPool& pool) {
  const ModelConfig& c = model.config();
  SpeculativeOptions so;
  so.draft_tokens = int(args.get_int("draft-tokens", 0));
  so.confidence_threshold = args.get_double("dspark-confidence", 0.0);
  so.sampling = s.sampling;
  so.forward = s.forward;
  const bool compare = args.flag("compare");
  // A restored session has no draft rings: they restart at its end (only acceptance suffers).
  if (st.dspark_pos != st.pos) st.dspark_start = st.dspark_pos = st.pos;
  const SequenceState before = st;

  SpeculativeDecoder dec(model, st, so, &pool);
  const auto t0 = Clock::now();
  std::vector<float> logits = dec.prefill(s.prompt, s.chunk);
  const double prefill_s = since(t0);
  const auto t1 = Clock::now();
  std::vector<int32_t> generated;
  json steps = json::array();
  auto emit = [&](int32_t tok, const float* row) {
    steps.push_back({{"top5", top5(row, c.vocab_size)}, {"token", tok}});
    if (!s.json) {
      std::printf("%s%d", generated.empty() ? "" : ",", tok);
      std::fflush(stdout);
    }
    generated.push_back(tok);
  };
  if (s.max_tokens > 0 && st.pos < c.max_seq_len) {
    // The first token comes from the prefill's logits exactly as without --dspark.
    int32_t tok = Sampler(s.sampling).sample(logits.data(), c.vocab_size, 0);
    emit(tok, logits.data());
    std::vector<float> rows;
    while (tok != c.eos_token_id && int64_t(generated.size()) < s.max_tokens) {
      const std::vector<int32_t> out = dec.step(tok, s.max_tokens - int64_t(generated.size()), &rows);
      if (out.empty()) break;  // max_seq_len
      for (size_t i = 0; i < out.size(); ++i) emit(out[i], rows.data() + i * size_t(c.vocab_size));
      tok = out.back();
    }
  }
  const double decode_s = since(t1);
  if (!s.save_path.empty()) {
    // As without --dspark: the saved sequence holds every printed token.
    if (!generated.empty() && st.pos < c.max_seq_len) model.forward(st, {generated.back()}, s.forward, &pool);
    save_session(s.save_path, model, st);
  }

  const SpeculativeStats& ss = dec.stats();
  const double tps = generated.size() > 1 ? double(generated.size() - 1) / decode_s : 0.0;
  json d = {{"draft_tokens", so.draft_tokens ? so.draft_tokens : c.dspark_block_size},
            {"confidence_threshold", so.confidence_threshold},
            {"cycles", ss.cycles},
            {"drafted", ss.drafted},
            {"accepted", ss.accepted},
            {"acceptance_rate", ss.acceptance_rate()},
            {"mean_accepted_length", ss.mean_accepted()},
            {"tokens_per_cycle", ss.tokens_per_cycle()},
            {"draft_s", ss.draft_s},
            {"verify_s", ss.verify_s},
            {"commit_s", ss.commit_s},
            {"decode_tokens_per_s", tps}};
  PlainRun plain;
  if (compare) {
    plain = plain_decode(model, before, s, pool);
    const double plain_tps = plain.tokens.size() > 1 ? double(plain.tokens.size() - 1) / plain.decode_s : 0.0;
    d["plain_decode_tokens_per_s"] = plain_tps;
    d["speedup"] = plain_tps > 0 ? tps / plain_tps : 0.0;
    d["same_tokens_as_plain"] = plain.tokens == generated;
  }
  if (s.json) {
    json j;
    j["model"] = s.model_dir;
    j["prompt"] = s.prompt;
    if (!s.load_path.empty()) j["session_start_pos"] = s.start_pos;
    j["generated"] = generated;
    j["steps"] = steps;
    j["timing"] = {{"load_s", s.load_s}, {"prefill_s", prefill_s}, {"prefill_tokens_per_s", double(s.prompt.size()) / prefill_s},
                   {"decode_s", decode_s}, {"decode_tokens_per_s", tps}, {"threads", pool.size()}};
    j["dspark"] = d;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("\n");
    std::fflush(stdout);
  }
  std::fprintf(stderr, "load %.2f s | prefill %zu tokens in %.3f s | decode %zu tokens in %.3f s (%.1f tok/s) | %d threads\n",
               s.load_s, s.prompt.size(), prefill_s, generated.size(), decode_s, tps, pool.size());
  std::fprintf(stderr, "dspark: %lld cycles, %lld drafted, %lld accepted (%.1f%%), mean accepted length %.2f, %.2f tokens/cycle\n",
               (long long)ss.cycles, (long long)ss.drafted, (long long)ss.accepted, 100.0 * ss.acceptance_rate(),
               ss.mean_accepted(), ss.tokens_per_cycle());
  if (compare)
    std::fprintf(stderr, "plain decoding: %.1f tok/s -> speed-up %.2fx, %s tokens\n", d["plain_decode_tokens_per_s"].get<double>(),
                 d["speedup"].get<double>(), plain.tokens == generated ? "same" : "DIFFERENT");
  return 0;
}

}  // namespace ds41::cli
