// Token-level constraints: a byte automaton (what the answer may still become) turned into a mask
// over the vocabulary before each token is chosen. Used by structured output (JSON documents,
// text/json_constraint.h) and by forced tool calls (DSML parameters, text/dsml_args_constraint.h).
//
// A mask is found by walking a trie of the vocabulary's byte strings with the automaton: a token is
// allowed when the automaton takes all its bytes. The end of sequence is allowed only once the
// automaton is complete, and then alone. A token budget is kept: a token is allowed only if the
// automaton can still be completed after it within the tokens left (one byte a token at worst,
// plus the end of sequence); once its shortest completion takes all that is left, it is written
// with its longest tokens.
//
// The automaton type (State) provides: bool step(uint8_t), bool step(std::string_view),
// bool complete(), std::string shortest_completion(), size_t completion_length(), std::string
// key() (equal keys: equal futures), bool plain_byte(uint8_t) (the byte leaves the state as it
// is), int64_t growth() (a bound on what one token's structure adds to the completion beyond its
// own bytes).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ds41 {

class Tokenizer;

// The vocabulary's byte strings as a trie, built once per tokenizer.
class TokenTrie {
 public:
  // Every id of `tok` below `vocab` that is not an added (special) token.
  TokenTrie(const Tokenizer& tok, int64_t vocab);
  int64_t vocab() const { return vocab_; }
  struct Node {
    std::vector<std::pair<uint8_t, int>> children;  // sorted by byte
    std::vector<int32_t> tokens;                   // ids whose bytes end here
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<std::string>& token_bytes() const { return bytes_; }
  int64_t longest_token() const { return longest_; }

 private:
  int64_t vocab_;
  int64_t longest_ = 0;
  std::vector<Node> nodes_;
  std::vector<std::string> bytes_;  // per id ("" for special and missing ids)
};

// One request's constraint: masks logits before each choice and follows the chosen tokens.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets every logit the automaton cannot take to -inf; `tokens_left` counts this token.
  virtual void mask(float* logits, int64_t vocab, int64_t tokens_left) = 0;
  // The chosen token (after mask). False if it does not fit (a token from outside): the constraint
  // then stops applying.
  virtual bool advance(int32_t token) = 0;
  virtual bool complete() const = 0;
  // An independent copy at the same point (the choices of one request).
  virtual std::shared_ptr<TokenConstraint> clone() const = 0;
  double mask_seconds() const { return mask_seconds_; }  // time spent in mask()
  int64_t masks() const { return masks_; }

 protected:
  double mask_seconds_ = 0;
  int64_t masks_ = 0;
};

template <class State>
class AutomatonConstraint final : public TokenConstraint {
 public:
  AutomatonConstraint(State initial, std::shared_ptr<const TokenTrie> trie, int32_t eos)
      : trie_(std::move(trie)), state_(std::move(initial)), eos_(eos) {}

  void mask(float* logits, int64_t vocab, int64_t tokens_left) override {
    if (!active_) return;
    const auto t0 = std::chrono::steady_clock::now();
    constexpr float kNeg = -std::numeric_limits<float>::infinity();
    const std::string closing = state_.shortest_completion();
    // Beyond this distance from the end of the budget no token can make completion impossible.
    const int64_t reach = int64_t(closing.size()) + 2 * trie_->longest_token() + state_.growth() + 2;
    const int64_t limit = tokens_left < reach ? tokens_left - 2 : -1;
    if (state_.complete()) {
      allowed_.assign(size_t(vocab), 0);
    } else if (tokens_left - 2 < int64_t(closing.size())) {
      // The shortest completion takes the rest of the budget: it, by its longest tokens.
      allowed_.assign(size_t(vocab), 0);
      int node = 0, longest = -1;
      for (const char c : closing) {
        const int next = child(node, uint8_t(c));
        if (next < 0) break;
        node = next;
        if (!trie_->nodes()[size_t(node)].tokens.empty()) longest = node;
      }
      if (longest >= 0)
        for (int32_t t : trie_->nodes()[size_t(longest)].tokens) allowed_[size_t(t)] = 1;
    } else {
      allowed_tokens(limit);
    }
    const bool eos_ok = state_.complete();
    for (int64_t i = 0; i < vocab; ++i)
      if (!(i < int64_t(allowed_.size()) && allowed_[size_t(i)]) && !(i == eos_ && eos_ok)) logits[i] = kNeg;
    mask_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++masks_;
  }

  bool advance(int32_t token) override {
    if (!active_) return false;
    if (token == eos_) return state_.complete();
    const auto& bytes = trie_->token_bytes();
    if (token < 0 || size_t(token) >= bytes.size() || bytes[size_t(token)].empty() || !state_.step(bytes[size_t(token)])) {
      active_ = false;  // a token from outside: the constraint no longer knows where the answer is
      return false;
    }
    return true;
  }
  bool complete() const override { return state_.complete(); }
  std::shared_ptr<TokenConstraint> clone() const override { return std::make_shared<AutomatonConstraint>(*this); }
  const State& state() const { return state_; }

 private:
  int child(int node, uint8_t byte) const {
    const auto& ch = trie_->nodes()[size_t(node)].children;
    auto it = std::lower_bound(ch.begin(), ch.end(), std::pair<uint8_t, int>{byte, -1});
    return it == ch.end() || it->first != byte ? -1 : it->second;
  }

  // Marks the tokens `st` can take below trie node `node`. A byte that leaves the state as it is
  // (plain text) is not copied for. `limit` >= 0: only tokens after which the completion fits it.
  void walk(int node, const State& st, int64_t limit, std::vector<uint8_t>& allowed) const {
    const int64_t here = limit >= 0 ? int64_t(st.completion_length()) : -1;
    for (const auto& [byte, next_node] : trie_->nodes()[size_t(node)].children) {
      const auto& tokens = trie_->nodes()[size_t(next_node)].tokens;
      if (st.plain_byte(byte)) {
        if (limit < 0 || here <= limit)
          for (int32_t t : tokens) allowed[size_t(t)] = 1;
        walk(next_node, st, limit, allowed);
        continue;
      }
      State next = st;
      if (!next.step(byte)) continue;
      if (!tokens.empty() && (limit < 0 || int64_t(next.completion_length()) <= limit))
        for (int32_t t : tokens) allowed[size_t(t)] = 1;
      walk(next_node, next, limit, allowed);
    }
  }

  void allowed_tokens(int64_t limit) {
    if (limit >= 0) {
      // Near the budget: the unlimited mask, then the tokens with a byte that changes the state
      // checked one by one (the others change no completion).
      allowed_tokens(-1);
      const bool fits = int64_t(state_.completion_length()) <= limit;
      const auto& bytes = trie_->token_bytes();
      for (size_t t = 0; t < allowed_.size(); ++t) {
        if (!allowed_[t]) continue;
        const std::string& b = bytes[t];
        bool plain = true;
        for (const char c : b) plain = plain && state_.plain_byte(uint8_t(c));
        if (plain) {
          allowed_[t] = fits;
          continue;
        }
        State after = state_;
        allowed_[t] = after.step(b) && int64_t(after.completion_length()) <= limit;
      }
      return;
    }
    const std::string k = state_.key();
    for (auto& [key, mask] : cache_)
      if (key == k) {
        allowed_ = mask;
        return;
      }
    allowed_.assign(size_t(trie_->vocab()), 0);
    walk(0, state_, -1, allowed_);
    if (cache_.size() >= 8) cache_.erase(cache_.begin());
    cache_.emplace_back(k, allowed_);
  }

  std::shared_ptr<const TokenTrie> trie_;
  State state_;
  int32_t eos_;
  bool active_ = true;
  std::vector<uint8_t> allowed_;
  // Masks of recent states (inside a long string the state repeats token after token).
  std::vector<std::pair<std::string, std::vector<uint8_t>>> cache_;
};

}  // namespace ds41
