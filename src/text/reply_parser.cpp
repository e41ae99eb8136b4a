#include "text/reply_parser.h"

#include <algorithm>

#include "base/error.h"
#include "text/dsml_tokens.h"

namespace ds41 {

namespace {

using namespace dsml;

// The tokens the reference rejects inside reasoning or content, in its order.
constexpr std::string_view kSpecialTokens[] = {kBos, kEos, kThinkStart, kThinkEnd, kDsml};
constexpr size_t kLongestSpecial = kBos.size();

struct Found {
  size_t pos = std::string::npos;
  std::string_view stop;
};

Found find_first(const std::string& text, std::initializer_list<std::string_view> stops) {
  Found f;
  for (std::string_view s : stops) {
    const size_t p = text.find(s);
    if (p < f.pos) f = {p, s};
  }
  return f;
}

// Length of the longest suffix of `text` that is a proper prefix of one of `stops`: text that a
// later piece may turn into markup.
size_t partial_stop_suffix(std::string_view text, std::initializer_list<std::string_view> stops) {
  size_t best = 0;
  for (std::string_view s : stops) {
    for (size_t k = std::min(text.size(), s.size() - 1); k > best; --k) {
      if (text.substr(text.size() - k) == s.substr(0, k)) {
        best = k;
        break;
      }
    }
  }
  return best;
}

// Largest cut <= n that does not split a UTF-8 sequence (invalid bytes are not held).
size_t utf8_safe_cut(std::string_view s, size_t n) {
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    const auto c = static_cast<unsigned char>(s[n - k]);
    if ((c & 0xC0) == 0x80) continue;
    if (c < 0xC0 || c >= 0xF8) return n;
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    return k < need ? n - k : n;
  }
  return n;
}

}  // namespace

ReplyParser::ReplyParser(ReplyParserOptions options)
    : options_(std::move(options)),
      state_(options_.thinking_mode == ThinkingMode::thinking ? State::reasoning : State::content) {}

void ReplyParser::warn(std::string message) { warnings_.push_back(std::move(message)); }

void ReplyParser::emit(std::vector<ReplyEvent>& out, ReplyEvent::Kind kind, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind) {
    out.back().text += text;
  } else {
    out.push_back(ReplyEvent{kind, std::string(text), {}});
  }
  std::string& tail = kind == ReplyEvent::Kind::reasoning ? reasoning_tail_ : content_tail_;
  auto& found = kind == ReplyEvent::Kind::reasoning ? tokens_in_reasoning_ : tokens_in_content_;
  tail += text;
  for (std::string_view t : kSpecialTokens)
    if (tail.find(t) != std::string::npos && std::find(found.begin(), found.end(), t) == found.end()) found.push_back(t);
  if (tail.size() >= kLongestSpecial) tail.erase(0, tail.size() - (kLongestSpecial - 1));
}

void ReplyParser::flush_text(std::vector<ReplyEvent>& out, ReplyEvent::Kind kind,
                             std::initializer_list<std::string_view> stops, bool at_end) {
  size_t n = pending_.size();
  if (!at_end) n = utf8_safe_cut(pending_, n - partial_stop_suffix(pending_, stops));
  // A reply cut off by a limit in the middle of markup ("\n\n<｜DS"): that start is dropped, not
  // emitted as text (the model ended its reply itself: it is text).
  else if (cut_off_) n -= partial_stop_suffix(pending_, stops);
  emit(out, kind, std::string_view(pending_).substr(0, n));
  pending_.erase(0, pending_.size() == n || !at_end ? n : pending_.size());
}

void ReplyParser::run(std::vector<ReplyEvent>& out, bool at_end) {
  using Kind = ReplyEvent::Kind;
  for (;;) {
    switch (state_) {
      case State::reasoning: {
        const Found f = find_first(pending_, {kThinkEnd, kEos, kCallsStart});
        if (f.pos == std::string::npos) {
          flush_text(out, Kind::reasoning, {kThinkEnd, kEos, kCallsStart}, at_end);
          if (at_end) warn("the reasoning is not closed by </think>");
          return;
        }
        emit(out, Kind::reasoning, std::string_view(pending_).substr(0, f.pos));
        if (f.stop == kCallsStart) {  // tool calls inside the reasoning: parsed, then the reasoning goes on
          warn("tool calls inside the reasoning (the reference parser rejects them) parsed as tool calls");
          block_ = pending_.substr(f.pos);
          pending_.clear();
          block_in_reasoning_ = true;
          state_ = State::tool_block;
          break;
        }
        pending_.erase(0, f.pos + f.stop.size());
        if (f.stop == kEos) {
          warn("the reasoning is not closed by </think>");
          state_ = State::after_eos;
        } else {
          state_ = State::content;
        }
        break;
      }
      case State::content: {
        const Found f = find_first(pending_, {kCallsStart, kEos});
        if (f.pos == std::string::npos) {
          flush_text(out, Kind::content, {kCallsStart, kEos}, at_end);
          return;
        }
        emit(out, Kind::content, std::string_view(pending_).substr(0, f.pos));
        if (f.stop == kEos) {
          pending_.erase(0, f.pos + f.stop.size());
          state_ = State::after_eos;
        } else {
          block_ = pending_.substr(f.pos);
          pending_.clear();
          state_ = State::tool_block;
        }
        break;
      }
      case State::tool_block: {
        block_ += pending_;
        pending_.clear();
        // A reply cut off by a limit gets none of the reference's end-of-text leniencies (which
        // accept a call cut right after its header): only calls that closed are complete.
        const auto status = calls_parser_.advance(std::string_view(block_).substr(kCallsStart.size()), at_end && !cut_off_);
        if (status == DsmlCallsParser::Status::need_more && !at_end) return;
        if ((status == DsmlCallsParser::Status::failed || status == DsmlCallsParser::Status::need_more) && at_end) {
          // Cut off by the end of the reply (every earlier advance wanted more): the calls it
          // completed are reported, the unfinished rest only in a warning.
          report_calls(out);
          warn("tool-call block cut off at the end of the reply (" + calls_parser_.error() + "); " +
               std::to_string(calls_parser_.calls().size()) + " complete call(s) reported, the rest left out: " + block_);
          block_.clear();
          state_ = State::after_eos;
          break;
        }
        if (status == DsmlCallsParser::Status::failed) {
          // Malformed: no call of it is reported and none of it is content; its text, up to the
          // end-of-sentence token, goes into a warning.
          block_error_ = calls_parser_.error();
          pending_ = std::move(block_);  // re-read from the block's start: where does the message end?
          block_.clear();
          state_ = State::invalid_block;
          break;
        }
        report_calls(out);
        pending_ = block_.substr(kCallsStart.size() + calls_parser_.end());
        block_.clear();
        if (block_in_reasoning_) {
          block_in_reasoning_ = false;
          calls_parser_ = DsmlCallsParser();  // another block may follow in the reasoning or the content
          state_ = State::reasoning;
        } else {
          state_ = State::after_tool_calls;
        }
        break;
      }
      case State::invalid_block: {
        const size_t p = pending_.find(kEos);
        if (p == std::string::npos && !at_end) {  // all but what may be the start of the EOS token
          const size_t keep = partial_stop_suffix(pending_, {kEos});
          block_ += pending_.substr(0, pending_.size() - keep);
          pending_.erase(0, pending_.size() - keep);
          return;
        }
        block_ += pending_.substr(0, p);
        pending_.erase(0, p == std::string::npos ? pending_.size() : p + kEos.size());
        warn("malformed tool-call block left out of the reply (" + block_error_ + "): " + block_);
        block_.clear();
        state_ = State::after_eos;
        break;
      }
      case State::after_tool_calls: {
        // Only the end-of-sentence token may follow the calls.
        if (pending_.compare(0, kEos.size(), kEos) == 0) {
          pending_.erase(0, kEos.size());
          state_ = State::after_eos;
          break;
        }
        const bool could_be_eos = kEos.substr(0, pending_.size()) == pending_;
        if (could_be_eos && (!at_end || pending_.empty())) return;
        warn("text after the tool calls returned as content");
        state_ = State::plain_content;
        break;
      }
      case State::plain_content: {
        const size_t p = pending_.find(kEos);
        if (p == std::string::npos) {
          flush_text(out, Kind::content, {kEos}, at_end);
          return;
        }
        emit(out, Kind::content, std::string_view(pending_).substr(0, p));
        pending_.erase(0, p + kEos.size());
        state_ = State::after_eos;
        break;
      }
      case State::after_eos: {
        if (!pending_.empty() &&
            std::find(warnings_.begin(), warnings_.end(), "text after the end-of-sentence token returned as content") ==
                warnings_.end())
          warn("text after the end-of-sentence token returned as content");
        flush_text(out, Kind::content, {}, at_end);
        return;
      }
    }
  }
}

void ReplyParser::report_calls(std::vector<ReplyEvent>& out) {
  for (const DsmlCall& c : calls_parser_.calls()) {
    ToolCall call{options_.tool_call_id_prefix + std::to_string(next_call_++), c.name, c.arguments_json()};
    if (!nlohmann::json::accept(call.arguments))
      warn("tool call " + call.id + " (" + call.name + "): the arguments are not valid JSON: " + call.arguments);
    out.push_back(ReplyEvent{ReplyEvent::Kind::tool_call, {}, std::move(call)});
  }
}

std::vector<ReplyEvent> ReplyParser::feed(std::string_view piece) {
  if (finished_) throw Error("ReplyParser: text fed after finish()");
  std::vector<ReplyEvent> out;
  pending_.append(piece);
  run(out, false);
  return out;
}

std::vector<ReplyEvent> ReplyParser::finish(bool cut_off) {
  if (finished_) throw Error("ReplyParser: finish() called twice");
  finished_ = true;
  cut_off_ = cut_off;
  std::vector<ReplyEvent> out;
  run(out, true);
  for (std::string_view t : kSpecialTokens) {
    for (auto [found, what] : {std::pair{&tokens_in_content_, "content"}, std::pair{&tokens_in_reasoning_, "reasoning"}})
      if (std::find(found->begin(), found->end(), t) != found->end())
        warn(std::string("the ") + what + " contains the special token " + std::string(t));
  }
  for (std::string& w : warnings_) out.push_back(ReplyEvent{ReplyEvent::Kind::warning, std::move(w), {}});
  warnings_.clear();
  return out;
}

void collect_reply_events(ParsedReply& reply, const std::vector<ReplyEvent>& events) {
  for (const ReplyEvent& e : events) {
    switch (e.kind) {
      case ReplyEvent::Kind::reasoning: reply.reasoning += e.text; break;
      case ReplyEvent::Kind::content: reply.content += e.text; break;
      case ReplyEvent::Kind::tool_call: reply.tool_calls.push_back(e.tool_call); break;
      case ReplyEvent::Kind::warning: reply.warnings.push_back(e.text); break;
    }
  }
}

ParsedReply parse_reply(std::string_view text, const ReplyParserOptions& options) {
  ReplyParser parser(options);
  ParsedReply reply;
  collect_reply_events(reply, parser.feed(text));
  collect_reply_events(reply, parser.finish());
  return reply;
}

nlohmann::ordered_json reply_to_message(const ParsedReply& reply) {
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  for (const ToolCall& c : reply.tool_calls)
    calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return {{"role", "assistant"}, {"content", reply.content}, {"reasoning_content", reply.reasoning}, {"tool_calls", calls}};
}

}  // namespace ds41
