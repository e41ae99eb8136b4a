#include "cli/run_dspark.h"

#include "cli/progress.h"

#include <chrono>
#include <cstdio>

#include "base/error.h"
#include "base/thread_pool.h"
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

// Plain decoding of the same request on a copy of the sequence, for --compare.
struct PlainRun {
  std::vector<int32_t> tokens;
  GenerationStats stats;
};
PlainRun plain_decode(const Model& model, SequenceState st, const RunSettings& s, ThreadPool& pool) {
  Generation gen(model, std::move(st), Sampler(s.sampling), &pool, s.forward);
  gen.feed(s.prompt, s.chunk, PrefillProgress(int64_t(s.prompt.size())), s.inputs);
  GenerationLimits lim;
  lim.max_tokens = s.max_tokens;
  lim.stop_ids = {int32_t(model.config().eos_token_id)};
  PlainRun r;
  r.stats = gen.generate(lim, [&](int32_t t) {
    r.tokens.push_back(t);
    return true;
  });
  return r;
}

}  // namespace

bool dspark_requested(const Args& args) {
  if (args.flag("dspark")) return true;
  for (const char* o : {"draft-tokens", "dspark-confidence", "compare"})
    if (args.flag(o)) throw Error("ds41 run: --" + std::string(o) + " only applies with --dspark");
  return false;
}

DsparkRunResult run_dspark(const Args& args, const Model& model, SequenceState& st, const RunSettings& s, ThreadPool& pool,
                           const std::function<bool(int32_t, const float*)>& on_token) {
  const ModelConfig& c = model.config();
  if (s.max_tokens < 0) throw Error("--max-tokens must be >= 0");
  if (st.pos + int64_t(s.prompt.size()) > c.max_seq_len)
    throw Error("the sequence would be " + std::to_string(st.pos + int64_t(s.prompt.size())) +
                " tokens long, more than the model's max_seq_len " + std::to_string(c.max_seq_len));
  SpeculativeOptions so;
  so.draft_tokens = int(args.get_int("draft-tokens", 0));
  so.confidence_threshold = args.get_double("dspark-confidence", 0.0);
  so.sampling = s.sampling;
  so.forward = s.forward;
  const bool compare = args.flag("compare");
  // A restored session has no draft rings: they restart at its end (only acceptance suffers).
  if (st.dspark_pos != st.pos) st.dspark_start = st.dspark_pos = st.pos;
  const SequenceState before = compare ? st : SequenceState{};

  SpeculativeDecoder dec(model, st, so, &pool);
  DsparkRunResult r;
  GenerationStats& gs = r.stats;
  gs.prompt_tokens = int64_t(s.prompt.size());
  gs.finish = FinishReason::Length;
  const auto t0 = Clock::now();
  std::vector<float> logits = dec.prefill(s.prompt, s.chunk, s.inputs);
  gs.prefill_s = since(t0);
  Clock::time_point t_first{};
  std::vector<int32_t> generated;
  bool stopped = false;
  auto emit = [&](int32_t tok, const float* row) {
    generated.push_back(tok);
    if (generated.size() == 1) {
      t_first = Clock::now();
      gs.time_to_first_token_s = since(t0);
    }
    gs.decode_s = since(t_first);
    const bool go_on = on_token ? on_token(tok, row) : true;
    if (tok == c.eos_token_id || !go_on) {
      gs.finish = FinishReason::Stop;
      stopped = true;
    }
  };
  if (s.max_tokens > 0) {
    if (st.pos >= c.max_seq_len) {
      gs.finish = FinishReason::ContextFull;
    } else {
      // The first token comes from the prefill's logits exactly as without --dspark: keyed by its
      // position, penalties seeing the sequence.
      int32_t tok = Sampler(s.sampling).sample(logits.data(), c.vocab_size, uint64_t(st.pos), st.token_history);
      emit(tok, logits.data());
      std::vector<float> rows;
      std::vector<int32_t> out;
      while (!stopped && int64_t(generated.size()) < s.max_tokens) {
        dec.step_into(out, tok, s.max_tokens - int64_t(generated.size()), &rows);
        if (out.empty()) {
          gs.finish = FinishReason::ContextFull;
          break;
        }
        for (size_t i = 0; i < out.size() && !stopped; ++i) emit(out[i], rows.data() + i * size_t(c.vocab_size));
        tok = out.back();
      }
      // As without --dspark: a saved sequence holds every printed token.
      if (s.commit_last && !generated.empty() && st.pos < c.max_seq_len)
        model.forward(st, {generated.back()}, s.forward, &pool);
    }
  }
  gs.generated_tokens = int64_t(generated.size());

  const SpeculativeStats& ss = dec.stats();
  const double tps = gs.decode_tokens_per_s();
  json& d = r.dspark;
  d = {{"draft_tokens", so.draft_tokens ? so.draft_tokens : c.dspark_block_size},
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
  if (compare) {
    const PlainRun plain = plain_decode(model, before, s, pool);
    const double plain_tps = plain.stats.decode_tokens_per_s();
    d["plain_decode_tokens_per_s"] = plain_tps;
    d["speedup"] = plain_tps > 0 ? tps / plain_tps : 0.0;
    d["same_tokens_as_plain"] = plain.tokens == generated;
  }
  return r;
}

void print_dspark_summary(const json& d) {
  std::fprintf(stderr, "dspark: %lld cycles, %lld drafted, %lld accepted (%.1f%%), mean accepted length %.2f, %.2f tokens/cycle\n",
               d["cycles"].get<long long>(), d["drafted"].get<long long>(), d["accepted"].get<long long>(),
               100.0 * d["acceptance_rate"].get<double>(), d["mean_accepted_length"].get<double>(),
               d["tokens_per_cycle"].get<double>());
  if (d.contains("speedup"))
    std::fprintf(stderr, "plain decoding: %.1f tok/s -> speed-up %.2fx, %s tokens\n", d["plain_decode_tokens_per_s"].get<double>(),
                 d["speedup"].get<double>(), d["same_tokens_as_plain"].get<bool>() ? "same" : "DIFFERENT");
}

}  // namespace ds41::cli
