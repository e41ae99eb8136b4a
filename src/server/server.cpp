#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <cstdio>
#include <sstream>

#include "base/error.h"
#include "server/api_error.h"
#include "server/data_url.h"
#include "runtime/engine.h"
#include "server/http_server.h"
#include "server/response_writer.h"
#include "server/text_side.h"
#include "text/dsml_args_constraint.h"
#include "text/json_constraint.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include "vision/image_decode.h"
#include "vision/image_grid.h"

namespace ds41 {

using json = nlohmann::json;

namespace {

// The chat page (src/server/chat_page/index.html), embedded at build time.
constexpr char kChatPage[] =
#include "server/chat_page.inc"
    ;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One generation as the HTTP layer sees it: engine events in, wire text out. It reads the engine
// without blocking (the HTTP layer polls it when the engine says there is news).
struct Job : HttpResponder {
  // One choice of the answer (a request may ask for several: n).
  struct Choice {
    std::unique_ptr<ReplyDecoder> decoder;
    std::unique_ptr<ResponseWriter> writer;
    bool done = false, saw_tool_calls = false;
    std::string stop_sequence;
  };
  ApiRequest req;
  RenderedPrompt prompt;
  std::shared_ptr<RequestHandle> handle;
  std::vector<Choice> choices;
  Usage usage;  // completion tokens: every choice's
  bool started = false, done = false, head_given = false;
  std::string failure;       // the engine's error, if the generation failed
  std::string abort_reason;  // why the server cancelled it (shutting down)
  std::atomic<int64_t>* errors = nullptr;  // the server's error counter
  std::vector<int32_t> stop_ids;           // end-of-sequence ids (no logprobs entry)
  std::string label;                       // the response id, for the log

  void start(std::function<void()> wake) override { handle->set_listener(std::move(wake)); }

  void cancel(const std::string& reason) override {
    handle->cancel();
    if (reason.empty()) {
      handle->set_listener(nullptr);  // nobody will read the rest
      done = true;
    } else if (abort_reason.empty()) {
      abort_reason = reason;
    }
  }

  ResponseWriter& first_writer() { return *choices[0].writer; }

  Output poll() override {
    Output o;
    std::string text;
    try {
      text = drain_events();
    } catch (const std::exception& e) {
      // Nothing the model emits may end the process: this answer ends with an error.
      handle->cancel();
      handle->set_listener(nullptr);
      done = true;
      failure = std::string("generation failed: ") + e.what();
      text = req.stream ? first_writer().stream_error(failure) : std::string();
    }
    if (req.stream) {
      if (!head_given) {
        head_given = true;
        o.head = HttpResponse{200, "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}}, {}};
        o.streamed = true;
      }
      o.data = std::move(text);
    } else if (done) {
      // A whole answer goes out at the end, with the status that says how it went.
      if (!abort_reason.empty()) o.head = json_response(503, error_body(req.kind, 503, "server_error", abort_reason, ""));
      else if (!failure.empty()) o.head = json_response(500, error_body(req.kind, 500, "server_error", failure, ""));
      else o.head = json_response(200, whole_body());
    }
    if ((!failure.empty() || !abort_reason.empty()) && done && errors) {
      ++*errors;
      errors = nullptr;
    }
    o.finished = done;
    return o;
  }

  // The body of a whole answer: the first choice's, with every choice in `choices` and the usage
  // of them all.
  json whole_body() {
    json body = first_writer().body();
    if (choices.size() > 1 && body.contains("choices")) {
      json all = json::array();
      for (Choice& c : choices) {
        const json b = c.writer->body();
        if (b.contains("choices"))
          for (const json& x : b["choices"]) all.push_back(x);
      }
      body["choices"] = all;
      if (body.contains("usage") && body["usage"].is_object()) {  // every choice's tokens, counted at the end
        body["usage"]["completion_tokens"] = usage.completion_tokens;
        body["usage"]["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
      }
    }
    return body;
  }

  static HttpResponse json_response(int status, const json& body) { return HttpResponse{status, "application/json", {}, wire_json(body)}; }

  // Every event queued now, as wire text (streaming) or into the writers (whole answers).
  std::string drain_events() {
    std::string out;
    if (!started) {
      started = true;
      for (Choice& c : choices) out += c.writer->start(usage);
    }
    EngineEvent ev;
    while (!done && handle->next(ev, 0)) {
      if (ev.kind == EngineEvent::Kind::Prompt) {
        for (Choice& c : choices) c.writer->prompt_logprobs(prompt.ids, ev.prompt);
        continue;
      }
      if (ev.kind == EngineEvent::Kind::Error) {
        failure = "generation failed: " + ev.error;
        out += first_writer().stream_error(failure);
        done = true;
        break;
      }
      if (ev.index < 0 || size_t(ev.index) >= choices.size()) continue;
      Choice& c = choices[size_t(ev.index)];
      if (c.done) continue;
      if (ev.kind == EngineEvent::Kind::Token) {
        ++usage.completion_tokens;
        // The end-of-sequence token is not part of the answer: no log-probability entry for it.
        if (ev.logprob.token >= 0 && std::find(stop_ids.begin(), stop_ids.end(), ev.token) == stop_ids.end())
          c.writer->token_logprob(ev.logprob);
        ReplyDelta d = c.decoder->feed(ev.token);
        c.saw_tool_calls |= !d.tool_calls.empty();
        out += c.writer->delta(d);
        if (d.stop_matched) {
          c.stop_sequence = d.stop_sequence;
          handle->cancel_choice(ev.index);
          out += end(c, EndReason::StopSequence);
        }
      } else {  // Done
        ReplyDelta d = c.decoder->finish();
        c.saw_tool_calls |= !d.tool_calls.empty();
        out += c.writer->delta(d);
        if (ev.finish == FinishReason::Cancelled && !abort_reason.empty()) {
          // Cut short by the server: the client reads why (an error event; [DONE] for OpenAI).
          out += c.writer->stream_error(abort_reason);
          done = true;
          break;
        }
        EndReason why = ev.finish == FinishReason::Length || ev.finish == FinishReason::ContextFull ? EndReason::Length
                        : ev.finish == FinishReason::Cancelled                                        ? EndReason::Cancelled
                                                                                                       : EndReason::Eos;
        if (d.stop_matched) {
          c.stop_sequence = d.stop_sequence;
          why = EndReason::StopSequence;
        }
        out += end(c, why);
      }
    }
    if (done) handle->set_listener(nullptr);
    return out;
  }

  // Choice `c` has ended; the last to end ends the answer (its finish carries the usage and the
  // stream's end).
  std::string end(Choice& c, EndReason why) {
    if (why == EndReason::Eos && c.saw_tool_calls) why = EndReason::ToolCalls;
    // What the reply parser could not place (a malformed or cut-off tool-call block, markup where
    // it does not belong) is kept out of the answer: the log keeps it.
    for (const std::string& w : c.decoder->warnings()) std::fprintf(stderr, "ds41 serve: %s: %s\n", label.c_str(), w.c_str());
    c.done = true;
    bool all = true;
    for (const Choice& x : choices) all = all && x.done;
    usage.cached_tokens = handle->cached_tokens;
    c.writer->set_ends_stream(all);
    if (all) done = true;
    return c.writer->finish(why, c.stop_sequence, usage);
  }
};

}  // namespace

struct Server::Impl {
  Engine& engine;
  const TextSide& text;
  ServerOptions opt;
  HttpServer http;
  std::atomic<int64_t> next_id{1};
  std::atomic<int64_t> http_requests{0}, http_errors{0};
  std::once_flag trie_once;                  // the vocabulary's trie, built for the first structured request
  std::shared_ptr<const TokenTrie> trie;

  Impl(Engine& e, const TextSide& t, ServerOptions o)
      : engine(e), text(t), opt(std::move(o)), http(http_options(opt), [this](const HttpRequest* req, int status, const std::string& msg) {
          return error_response(req, status, msg);
        }) {}

  static HttpServerOptions http_options(const ServerOptions& o) {
    HttpServerOptions h = o.http;
    h.host = o.host;
    h.port = o.port;
    h.max_body_bytes = o.max_body_bytes;
    return h;
  }

  static ApiKind kind_of(const HttpRequest* req) {
    return req && req->path == "/v1/messages" ? ApiKind::AnthropicMessages : ApiKind::ChatCompletions;
  }

  static const char* error_type(int status) {
    switch (status) {
      case 401: return "authentication_error";
      case 404: return "not_found_error";
      case 500: return "server_error";
      case 503: return "server_error";
      default: return "invalid_request_error";
    }
  }

  HttpResponse error_response(const HttpRequest* req, int status, const std::string& msg, const std::string& param = {},
                              const char* type = nullptr) {
    ++http_errors;
    std::string message = msg;
    if (status == 404 && req && message.rfind("no such endpoint", 0) == 0)
      message += " (endpoints: POST /v1/chat/completions, /v1/completions, /v1/messages, /tokenize, /detokenize; GET "
                 "/ (chat page), /v1/models, /v1/models/{id}, /health, /metrics)";
    return HttpResponse{status, "application/json", {}, wire_json(error_body(kind_of(req), status, type ? type : error_type(status), message, param))};
  }

  // Compares in time that depends on the lengths only, so response timing does not reveal how
  // much of a guessed key was right.
  static bool same_secret(const std::string& given, const std::string& key) {
    unsigned char diff = given.size() == key.size() ? 0 : 1;
    for (size_t i = 0; i < given.size(); ++i) diff |= uint8_t(given[i] ^ key[i % std::max<size_t>(key.size(), 1)]);
    return diff == 0;
  }

  bool authorized(const HttpRequest& req) const {
    if (opt.api_key.empty()) return true;
    const std::string auth = req.header("Authorization");
    const bool bearer = auth.rfind("Bearer ", 0) == 0 && same_secret(auth.substr(7), opt.api_key);
    return same_secret(req.header("x-api-key"), opt.api_key) | bearer;
  }

  // Runs on a worker thread: parsing, rendering and image decoding take time a quick endpoint
  // must not wait for.
  HttpReply generate(const HttpRequest& http_req, ApiKind kind) {
    ++http_requests;
    try {
      // JSON only: a form or text/plain body is what a cross-site page can send without a CORS
      // preflight, so it is refused rather than parsed.
      const std::string type = http_req.header("Content-Type");
      if (type.rfind("application/json", 0) != 0)
        throw ApiError(415, "invalid_request_error",
                       "Content-Type must be application/json" + (type.empty() ? std::string() : " (got " + type + ")"));
      nlohmann::ordered_json body = nlohmann::ordered_json::parse(http_req.body, nullptr, false);
      if (body.is_discarded()) throw bad_request("the request body is not valid JSON");
      ApiRequest r = kind == ApiKind::ChatCompletions ? parse_chat_completions(body, opt.defaults)
                     : kind == ApiKind::Completions   ? parse_completions(body, opt.defaults)
                                                      : parse_anthropic_messages(body, opt.defaults);
      if (!r.model.empty() && r.model != opt.model_name)
        throw ApiError(404, "not_found_error", "the model \"" + r.model + "\" does not exist; this server serves \"" +
                                                   opt.model_name + "\"", "model");
      auto job = std::make_shared<Job>();
      job->req = r;
      job->errors = &http_errors;
      job->prompt = text.render(r);
      std::vector<RgbImage> images = decode_images(job->prompt);
      const int64_t ctx = engine.options().max_context;
      int64_t n_prompt = int64_t(job->prompt.ids.size());
      for (const RgbImage& im : images) n_prompt += plan_image_grid(im.width, im.height, engine.model().config()).span_length() - 1;
      if (n_prompt >= ctx)
        throw ApiError(400, "invalid_request_error",
                       "the prompt is " + std::to_string(n_prompt) + " tokens; this model's context is " + std::to_string(ctx) +
                           " tokens",
                       "messages");
      EngineRequest er;
      er.prompt = job->prompt.ids;
      er.cache_prefix_at = job->prompt.cache_prefix_at;
      er.images = std::move(images);
      TextSide::ForcedContinuation fc = text.forced_tool_call(r);
      er.force_trigger = std::move(fc.trigger);
      er.forced = std::move(fc.forced);
      er.sampling = r.sampling;
      er.max_tokens = r.max_tokens < 0 ? ctx - n_prompt : std::min(r.max_tokens, ctx - n_prompt);
      er.stop_ids = text.stop_ids();
      job->stop_ids = er.stop_ids;
      er.logprobs = r.logprobs;
      er.prompt_logprobs = r.echo && r.logprobs >= 0;
      if (er.forced.empty()) structured_output(r, er);
      else constrain_forced_call(r, er);
      er.arrived = http_req.arrived;
      job->usage.prompt_tokens = n_prompt;
      er.n = r.n;
      const std::string prefix = kind == ApiKind::ChatCompletions ? "chatcmpl-" : kind == ApiKind::Completions ? "cmpl-" : "msg_";
      const std::string id = prefix + std::to_string(unix_now()) + "-" + std::to_string(next_id++);
      for (int i = 0; i < r.n; ++i) {
        Job::Choice c;
        c.decoder = text.reply_decoder(r);
        c.writer = make_response_writer(r, id, opt.model_name, unix_now(), &text.tokenizer());
        c.writer->set_choice(i);
        job->choices.push_back(std::move(c));
      }
      er.label = id;
      job->label = id;
      job->handle = engine.submit(std::move(er));
      return std::shared_ptr<HttpResponder>(job);
    } catch (const ApiError& e) {
      return error_response(&http_req, e.status, e.what(), e.param, e.type.c_str());
    } catch (const Error& e) {
      // Engine/encoder validation (bad prompt content, context) is the client's problem.
      return error_response(&http_req, 400, e.what(), {}, "invalid_request_error");
    }
  }

  // The request's images, decoded here (on the HTTP thread, in parallel with the engine) as the
  // reference's Pillow would; any failure is the client's: 400 naming the image.
  std::vector<RgbImage> decode_images(const RenderedPrompt& p) const {
    std::vector<RgbImage> out;
    if (p.images.empty()) return out;
    const ModelConfig& c = engine.model().config();
    if (!c.vision_enabled()) throw bad_request("this model has no vision encoder: images are not accepted", "messages");
    int64_t placeholders = 0;
    for (int32_t id : p.ids) placeholders += id == c.image_token_id;
    if (placeholders != int64_t(p.images.size()))
      throw ApiError(500, "server_error",
                     "the model's tokenizer does not encode the image placeholder <｜deepseek_image｜> as the image token id " +
                         std::to_string(c.image_token_id) + ": this model directory cannot serve images");
    for (size_t i = 0; i < p.images.size(); ++i) {
      const std::string label = "image " + std::to_string(i + 1);
      try {
        const DataUrl d = parse_data_url(p.images[i]);
        out.push_back(decode_image(d.bytes.data(), d.bytes.size(), label));
        plan_image_grid(out.back().width, out.back().height, c);  // an extreme aspect ratio fails here
      } catch (const Error& e) {
        const std::string what = e.what();
        throw bad_request(what.rfind(label, 0) == 0 ? what : label + ": " + what, "messages");
      }
    }
    return out;
  }

  std::string metrics_text() const {
    const EngineMetrics& m = engine.metrics();
    std::ostringstream o;
    auto counter = [&](const char* name, const char* help, int64_t v, const char* type = "counter") {
      o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << v << "\n";
    };
    counter("ds41_http_requests_total", "Generation requests received", http_requests);
    counter("ds41_http_errors_total", "Requests answered with an error status", http_errors);
    const HttpServerStats hs = http.stats();
    counter("ds41_client_disconnects_total", "Answers cancelled because the client went away", hs.disconnects);
    counter("ds41_http_connections_total", "Connections accepted", hs.connections);
    counter("ds41_http_open_connections", "Connections open", hs.open_connections, "gauge");
    counter("ds41_http_refused_connections_total", "Connections refused at the connection limit", hs.refused_connections);
    counter("ds41_http_evicted_connections_total", "Connections waiting for a request closed to make room", hs.evicted_connections);
    counter("ds41_http_protocol_errors_total", "Malformed, oversized or ill-framed requests", hs.protocol_errors);
    counter("ds41_http_request_timeouts_total", "Requests not received within the request timeout", hs.timeouts);
    counter("ds41_requests_total", "Requests queued in the engine", m.requests);
    counter("ds41_requests_finished_total", "Requests that finished", m.requests_finished);
    counter("ds41_requests_cancelled_total", "Requests cancelled", m.requests_cancelled);
    counter("ds41_requests_failed_total", "Requests that failed in the engine", m.requests_failed);
    counter("ds41_prompt_tokens_total", "Prompt tokens", m.prompt_tokens);
    counter("ds41_generated_tokens_total", "Generated tokens", m.generated_tokens);
    counter("ds41_images_total", "Images encoded by the vision tower", m.images);
    o << "# HELP ds41_vision_seconds_total Vision tower time\n# TYPE ds41_vision_seconds_total counter\nds41_vision_seconds_total "
      << m.vision_s.load() << "\n";
    counter("ds41_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache", m.cached_prompt_tokens);
    counter("ds41_prefix_cache_lookups_total", "Prefix cache lookups", m.prefix_lookups);
    counter("ds41_prefix_cache_hits_total", "Prefix cache hits", m.prefix_hits);
    counter("ds41_prefix_cache_disk_hits_total", "Prefix cache hits loaded back from the disk tier", m.prefix_disk_hits);
    counter("ds41_active_requests", "Requests being processed", m.active, "gauge");
    counter("ds41_waiting_requests", "Requests waiting for a slot", m.waiting, "gauge");
    counter("ds41_engine_steps_total", "Engine scheduling steps", m.steps);
    counter("ds41_engine_step_requests_total", "Sum over steps of the requests served in the step (batch size)", m.step_rows);
    counter("ds41_batched_decode_passes_total", "Forward passes that decoded several requests together", m.batched_steps);
    counter("ds41_batched_decode_rows_total", "Tokens decoded in those passes", m.batched_rows);
    counter("ds41_dspark_cycles_total", "DSpark draft + verify cycles (finished requests)", m.dspark_cycles);
    counter("ds41_dspark_drafted_tokens_total", "Draft tokens verified", m.dspark_drafted);
    counter("ds41_dspark_accepted_tokens_total", "Draft tokens accepted", m.dspark_accepted);
    counter("ds41_structured_output_masks_total", "Token masks computed for structured output", m.constraint_masks);
    o << "# HELP ds41_structured_output_mask_seconds_total Time spent computing them\n"
         "# TYPE ds41_structured_output_mask_seconds_total counter\nds41_structured_output_mask_seconds_total "
      << m.constraint_seconds.load() << "\n";
    auto histogram = [&](const char* name, const char* help, const std::atomic<int64_t>* counts, double sum, int64_t n) {
      o << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
      for (int i = 0; i < EngineMetrics::kBuckets; ++i)
        o << name << "_bucket{le=\"" << EngineMetrics::kBounds[i] << "\"} " << counts[i] << "\n";
      o << name << "_bucket{le=\"+Inf\"} " << counts[EngineMetrics::kBuckets] << "\n";
      o << name << "_sum " << sum << "\n" << name << "_count " << n << "\n";
    };
    histogram("ds41_time_to_first_token_seconds", "Arrival of the request to its first token", m.ttft_counts, m.ttft_sum, m.ttft_n);
    histogram("ds41_time_per_output_token_seconds", "Time between consecutive tokens", m.tpot_counts, m.tpot_sum, m.tpot_n);
    return o.str();
  }

  // response_format json_object / json_schema: the answer's content constrained token by token
  // (text/json_constraint.h); in thinking mode from the end of the reasoning on.
  void structured_output(const ApiRequest& r, EngineRequest& er) {
    if (!r.response_format.is_object()) return;
    const std::string type = r.response_format.value("type", "");
    std::shared_ptr<const JsonGrammar> grammar;
    if (type == "json_object") {
      grammar = JsonGrammar::any_object();
    } else if (type == "json_schema") {
      const auto& js = r.response_format["json_schema"];
      if (!js.contains("schema")) return;  // a name only: nothing to enforce beyond the prompt
      try {
        grammar = JsonGrammar::from_schema(js["schema"]);
      } catch (const Error& e) {
        throw ApiError(400, "invalid_request_error", std::string("response_format: ") + e.what(),
                       "response_format.json_schema.schema");
      }
    } else {
      return;
    }
    er.constraint = make_json_constraint(grammar, token_trie(), text.stop_ids().at(0));
    if (r.thinking) er.constraint_trigger = text.tokenizer().encode("</think>");
  }

  std::shared_ptr<const TokenTrie> token_trie() {
    std::call_once(trie_once, [this] {
      trie = std::make_shared<const TokenTrie>(text.tokenizer(), engine.model().config().vocab_size);
    });
    return trie;
  }

  // tool_choice naming a function: after the forced invoke header, its arguments are held to the
  // function's parameters schema in DSML (text/dsml_args_constraint.h); "required": one call of
  // any of the tools, held to its schema.
  void constrain_forced_call(const ApiRequest& r, EngineRequest& er) {
    if (er.forced.empty()) return;
    if (r.tool_choice == "required") {  // one call of any tool, its arguments held to that tool's schema
      try {
        er.constraint = make_dsml_call_constraint(DsmlToolSet::from_tools(r.tools), token_trie(), text.stop_ids().at(0));
      } catch (const Error& e) {
        throw ApiError(400, "invalid_request_error", std::string("tools: ") + e.what(), "tools");
      }
      er.constraint_trigger = er.forced;
      return;
    }
    if (r.tool_choice.rfind("function:", 0) != 0) return;
    const std::string name = r.tool_choice.substr(9);
    for (const auto& tool : r.tools) {
      if (!tool.contains("function") || tool["function"].value("name", "") != name) continue;
      const auto params = tool["function"].contains("parameters") ? tool["function"]["parameters"]
                                                                   : nlohmann::ordered_json::object();
      try {
        er.constraint = make_dsml_args_constraint(DsmlArgsSchema::from_parameters(params), token_trie(),
                                                  text.stop_ids().at(0));
      } catch (const Error& e) {
        throw ApiError(400, "invalid_request_error", "tools: function " + name + ": " + e.what(), "tools");
      }
      er.constraint_trigger = er.forced;
      return;
    }
  }

  json model_card() const {
    return {{"id", opt.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "ds41"},
            {"max_model_len", engine.options().max_context}};
  }

  // The request body as a JSON object, or the 400 to answer.
  std::optional<HttpResponse> parse_object(const HttpRequest& req, json& body) {
    body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) return error_response(&req, 400, "the body must be a JSON object");
    return std::nullopt;
  }

  HttpReply tokenize(const HttpRequest& req) {
    json body;
    if (auto bad = parse_object(req, body)) return *bad;
    if (!body.contains("content") || !body["content"].is_string())
      return error_response(&req, 400, "'content' must be a string", "content");
    for (const char* flag : {"add_special", "with_pieces"})
      if (body.contains(flag) && !body[flag].is_boolean())
        return error_response(&req, 400, std::string("'") + flag + "' must be true or false", flag);
    const Tokenizer& tok = text.tokenizer();
    std::vector<int32_t> ids;
    if (body.value("add_special", false))
      if (auto bos = tok.token_to_id("<｜begin▁of▁sentence｜>")) ids.push_back(*bos);
    tok.encode_append(body["content"].get<std::string>(), ids);
    json tokens = json::array();
    for (int32_t id : ids) {
      if (!body.value("with_pieces", false)) {
        tokens.push_back(id);
        continue;
      }
      // A piece that is not valid UTF-8 on its own (part of a character) is given as its bytes.
      const std::string_view bytes = tok.token_bytes(id);
      if (utf8_lossy(bytes) == bytes) tokens.push_back({{"id", id}, {"piece", std::string(bytes)}});
      else tokens.push_back({{"id", id}, {"piece", std::vector<uint8_t>(bytes.begin(), bytes.end())}});
    }
    return HttpResponse{200, "application/json", {}, json{{"tokens", tokens}}.dump()};
  }

  HttpReply detokenize(const HttpRequest& req) {
    json body;
    if (auto bad = parse_object(req, body)) return *bad;
    if (!body.contains("tokens") || !body["tokens"].is_array())
      return error_response(&req, 400, "'tokens' must be an array of token ids", "tokens");
    const Tokenizer& tok = text.tokenizer();
    std::vector<int32_t> ids;
    for (const json& v : body["tokens"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok.vocab_size())
        return error_response(&req, 400, "'tokens' must hold token ids in 0.." + std::to_string(tok.vocab_size() - 1) +
                                             " (got " + v.dump() + ")", "tokens");
      ids.push_back(int32_t(v.get<int64_t>()));
    }
    return HttpResponse{200, "application/json", {}, json{{"content", tok.decode(ids)}}.dump()};
  }

  void setup() {
    http.set_gate([this](const HttpRequest& req) -> std::optional<HttpResponse> {
      const bool protected_path = req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
      if (protected_path && !authorized(req))
        return error_response(&req, 401, "missing or wrong API key (Authorization: Bearer <key>)");
      return std::nullopt;
    });
    const std::pair<const char*, ApiKind> generators[] = {
        {"/v1/chat/completions", ApiKind::ChatCompletions}, {"/v1/completions", ApiKind::Completions}, {"/v1/messages", ApiKind::AnthropicMessages}};
    for (const auto& [path, kind] : generators)
      http.route("POST", path, [this, kind = kind](const HttpRequest& q) { return generate(q, kind); }, /*blocking=*/true);
    http.route("GET", "/v1/models", [this](const HttpRequest&) -> HttpReply {
      return HttpResponse{200, "application/json", {}, json{{"object", "list"}, {"data", json::array({model_card()})}}.dump()};
    });
    // One model by id (OpenAI's GET /v1/models/{model}): the served name, or 404 for any other.
    http.route("GET", "/v1/models/" + opt.model_name, [this](const HttpRequest&) -> HttpReply {
      return HttpResponse{200, "application/json", {}, model_card().dump()};
    });
    http.route_prefix("GET", "/v1/models/", [this](const HttpRequest& req) -> HttpReply {
      const std::string id = req.path.substr(std::string("/v1/models/").size());
      return error_response(&req, 404, "The model '" + id + "' does not exist (this server has '" + opt.model_name + "')",
                            "model", "model_not_found");
    });
    // llama-server's shapes: {"content", "add_special", "with_pieces"} -> {"tokens"}; {"tokens"} -> {"content"}.
    http.route("POST", "/tokenize", [this](const HttpRequest& req) { return tokenize(req); }, /*blocking=*/true);
    http.route("POST", "/detokenize", [this](const HttpRequest& req) { return detokenize(req); }, /*blocking=*/true);
    // The chat page: one self-contained file (its policy allows nothing from elsewhere).
    http.route("GET", "/", [](const HttpRequest&) -> HttpReply {
      return HttpResponse{200, "text/html; charset=utf-8",
                          {{"Cache-Control", "no-cache"},
                           {"Content-Security-Policy", "default-src 'self'; img-src 'self' data: blob:; "
                                                       "style-src 'unsafe-inline'; script-src 'unsafe-inline'"}},
                          std::string(kChatPage, sizeof kChatPage - 1)};
    });
    http.route("GET", "/health", [this](const HttpRequest&) -> HttpReply {
      const EngineMetrics& m = engine.metrics();
      const bool draining = http.draining();
      return HttpResponse{draining ? 503 : 200, "application/json", {},
                          json{{"status", draining ? "draining" : "ok"}, {"model", opt.model_name}, {"active", m.active.load()},
                               {"waiting", m.waiting.load()}}.dump()};
    });
    http.route("GET", "/metrics", [this](const HttpRequest&) -> HttpReply {
      return HttpResponse{200, "text/plain; version=0.0.4", {}, metrics_text()};
    });
  }
};

Server::Server(Engine& engine, const TextSide& text, ServerOptions opt) : impl_(std::make_unique<Impl>(engine, text, std::move(opt))) {
  impl_->setup();
}

Server::~Server() = default;

bool Server::bind(std::string& error) { return impl_->http.bind(error); }

bool Server::listen(std::string& error) {
  if (!bind(error)) return false;
  impl_->http.run();
  return true;
}

int Server::bind_any_port() {
  std::string error;
  return impl_->http.bind(error, 0) ? impl_->http.port() : -1;
}

int Server::port() const { return impl_->http.port(); }

bool Server::listen_after_bind() {
  impl_->http.run();
  return true;
}

void Server::drain(std::chrono::milliseconds grace) { impl_->http.drain(grace); }

void Server::stop() { impl_->http.stop(); }

}  // namespace ds41
