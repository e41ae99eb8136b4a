// Turns a generation's deltas into each API's wire format: one JSON body at the end, or a
// stream of Server-Sent Events (OpenAI chunks ending in `data: [DONE]`; Anthropic's typed
// message_start / content_block_* / message_delta / message_stop events).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/logprobs.h"
#include "server/api_request.h"
#include "server/text_side.h"

namespace ds41 {

class Tokenizer;

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

// How the answer ended, in API-neutral terms.
enum class EndReason { Eos, StopSequence, Length, ToolCalls, Cancelled };

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // Streaming: the text to send now (may be empty). Non-streaming: accumulates, returns "".
  virtual std::string start(const Usage& u) = 0;
  virtual std::string delta(const ReplyDelta& d) = 0;
  // A generated token's log-probabilities (requests with logprobs), before the delta of that
  // token: they go out with the next text (streaming) or in the body.
  virtual void token_logprob(const TokenLogprob&) {}
  // The prompt's (completions' echo with logprobs): ids 1.. of the prompt; `prompt_ids` all of them.
  virtual void prompt_logprobs(const std::vector<int32_t>& prompt_ids, const std::vector<TokenLogprob>&) {}
  virtual std::string finish(EndReason why, const std::string& stop_sequence, const Usage& u) = 0;
  // Non-streaming: the whole JSON body (after finish).
  virtual nlohmann::json body() const = 0;
  // A failure after the stream started, as an event the client can read.
  virtual std::string stream_error(const std::string& message) = 0;

  // Requests with several choices (n): this writer's choice index, and whether its finish()
  // ends the stream (the usage chunk and [DONE]: the choice that finishes last).
  void set_choice(int index) { index_ = index; }
  void set_ends_stream(bool ends) { ends_stream_ = ends; }

 protected:
  int index_ = 0;
  bool ends_stream_ = true;
};

// `id` is the response id ("chatcmpl-…", "cmpl-…", "msg_…"), `created` seconds since the epoch.
// `tokenizer` spells the tokens of logprobs.
std::unique_ptr<ResponseWriter> make_response_writer(const ApiRequest& r, const std::string& id,
                                                     const std::string& model_name, int64_t created,
                                                     const Tokenizer* tokenizer = nullptr);

// JSON as sent to a client. Strings that came from outside (a request path, a header, model
// output) may hold bytes that are not UTF-8: they are sent as U+FFFD instead of failing the answer.
std::string wire_json(const nlohmann::json& j);

// The error body of each API for a non-streamed error.
nlohmann::json error_body(ApiKind kind, int status, const std::string& type, const std::string& message,
                          const std::string& param);

}  // namespace ds41
