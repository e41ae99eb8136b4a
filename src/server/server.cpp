#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <httplib.h>
#include <sstream>
#include <sys/socket.h>

#include "base/error.h"
#include "server/api_error.h"
#include "server/data_url.h"
#include "server/engine.h"
#include "server/response_writer.h"
#include "server/text_side.h"
#include "vision/image_decode.h"
#include "vision/image_grid.h"

namespace ds41 {

using json = nlohmann::json;

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// How often a non-streamed answer writes a JSON-insignificant space while it is made.
constexpr int kKeepAliveMs = 100;

// One generation as the HTTP layer sees it: engine events in, wire text out.
struct Job {
  ApiRequest req;
  RenderedPrompt prompt;
  std::shared_ptr<RequestHandle> handle;
  std::unique_ptr<ReplyDecoder> decoder;
  std::unique_ptr<ResponseWriter> writer;
  Usage usage;
  bool started = false, done = false, saw_tool_calls = false;
  std::chrono::steady_clock::time_point last_sent{};  // of the last bytes written to the client
  std::string failure;  // the engine's error, if the generation failed

  // Takes the engine's events for at most `timeout_ms` (returning early once it has text to send)
  // and returns the text to send (possibly empty). A non-streamed answer's events produce no text
  // until the end, so the time limit is what returns control to the HTTP layer while tokens flow.
  std::string pump(int timeout_ms) {
    std::string out;
    if (!started) {
      started = true;
      out += writer->start(usage);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    auto wait_ms = [&] {
      if (!out.empty()) return 0;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      return int(std::max<int64_t>(0, left.count()));
    };
    EngineEvent ev;
    while (!done && std::chrono::steady_clock::now() < deadline && handle->next(ev, wait_ms())) {
      if (ev.kind == EngineEvent::Kind::Token) {
        ++usage.completion_tokens;
        ReplyDelta d = decoder->feed(ev.token);
        saw_tool_calls |= !d.tool_calls.empty();
        out += writer->delta(d);
        if (d.stop_matched) {
          stop_sequence = d.stop_sequence;
          handle->cancel();
          out += end(EndReason::StopSequence);
        }
      } else if (ev.kind == EngineEvent::Kind::Done) {
        ReplyDelta d = decoder->finish();
        saw_tool_calls |= !d.tool_calls.empty();
        out += writer->delta(d);
        EndReason why = ev.finish == FinishReason::Length || ev.finish == FinishReason::ContextFull ? EndReason::Length
                        : ev.finish == FinishReason::Cancelled                                        ? EndReason::Cancelled
                                                                                                       : EndReason::Eos;
        if (d.stop_matched) {
          stop_sequence = d.stop_sequence;
          why = EndReason::StopSequence;
        }
        out += end(why);
      } else {
        out += writer->stream_error(ev.error);
        failure = ev.error;
        done = true;
      }
    }
    return out;
  }

  std::string end(EndReason why) {
    if (why == EndReason::Eos && saw_tool_calls) why = EndReason::ToolCalls;
    usage.cached_tokens = handle->cached_tokens;
    done = true;
    return writer->finish(why, stop_sequence, usage);
  }
  std::string stop_sequence;
};

}  // namespace

struct Server::Impl {
  Engine& engine;
  const TextSide& text;
  ServerOptions opt;
  httplib::Server http;
  std::atomic<int64_t> next_id{1};
  std::atomic<int64_t> http_requests{0}, http_errors{0}, disconnects{0};

  Impl(Engine& e, const TextSide& t, ServerOptions o) : engine(e), text(t), opt(std::move(o)) {}

  void send_error(httplib::Response& res, ApiKind kind, int status, const std::string& type, const std::string& msg,
                  const std::string& param = {}) {
    ++http_errors;
    res.status = status;
    res.set_content(error_body(kind, status, type, msg, param).dump(), "application/json");
  }

  // Compares in time that depends on the lengths only, so response timing does not reveal how
  // much of a guessed key was right.
  static bool same_secret(const std::string& given, const std::string& key) {
    unsigned char diff = given.size() == key.size() ? 0 : 1;
    for (size_t i = 0; i < given.size(); ++i) diff |= uint8_t(given[i] ^ key[i % std::max<size_t>(key.size(), 1)]);
    return diff == 0;
  }

  bool authorized(const httplib::Request& req) const {
    if (opt.api_key.empty()) return true;
    const std::string auth = req.get_header_value("Authorization");
    const bool bearer = auth.rfind("Bearer ", 0) == 0 && same_secret(auth.substr(7), opt.api_key);
    return same_secret(req.get_header_value("x-api-key"), opt.api_key) | bearer;
  }

  void generate(const httplib::Request& req, httplib::Response& res, ApiKind kind) {
    ++http_requests;
    try {
      // JSON only: a form or text/plain body is what a cross-site page can send without a CORS
      // preflight, so it is refused rather than parsed.
      const std::string type = req.get_header_value("Content-Type");
      if (type.rfind("application/json", 0) != 0)
        throw ApiError(415, "invalid_request_error",
                       "Content-Type must be application/json" + (type.empty() ? std::string() : " (got " + type + ")"));
      nlohmann::ordered_json body = nlohmann::ordered_json::parse(req.body, nullptr, false);
      if (body.is_discarded()) throw bad_request("the request body is not valid JSON");
      ApiRequest r = kind == ApiKind::ChatCompletions ? parse_chat_completions(body, opt.defaults)
                     : kind == ApiKind::Completions   ? parse_completions(body, opt.defaults)
                                                      : parse_anthropic_messages(body, opt.defaults);
      if (!r.model.empty() && r.model != opt.model_name)
        throw ApiError(404, "not_found_error", "the model \"" + r.model + "\" does not exist; this server serves \"" +
                                                   opt.model_name + "\"", "model");
      auto job = std::make_shared<Job>();
      job->req = r;
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
      job->decoder = text.reply_decoder(r);
      job->usage.prompt_tokens = n_prompt;
      const std::string prefix = kind == ApiKind::ChatCompletions ? "chatcmpl-" : kind == ApiKind::Completions ? "cmpl-" : "msg_";
      job->writer = make_response_writer(r, prefix + std::to_string(unix_now()) + "-" + std::to_string(next_id++),
                                         opt.model_name, unix_now());
      job->handle = engine.submit(std::move(er));
      const bool stream = r.stream;
      // Both kinds are sent chunked so that a client that goes away is noticed (a failed write)
      // and its generation cancelled; a non-streamed answer sends JSON-insignificant spaces while
      // it waits.
      res.set_chunked_content_provider(
          stream ? "text/event-stream" : "application/json",
          [this, job, stream](size_t, httplib::DataSink& sink) {
            auto write = [&](const std::string& s) { return s.empty() || sink.write(s.data(), s.size()); };
            if (!job->done) {
              std::string out;
              try {
                out = job->pump(stream ? 100 : kKeepAliveMs);
                if (!stream) {
                  // A space at least every kKeepAliveMs while the answer is made: a client that
                  // went away makes a write fail within two of them, and its generation is
                  // cancelled (a space only when no event came would never be written while
                  // tokens flow).
                  const auto now = std::chrono::steady_clock::now();
                  // An engine failure is an error body (the status line has gone out as 200).
                  out = job->done && !job->failure.empty()
                            ? error_body(job->req.kind, 500, "server_error", "generation failed: " + job->failure, "").dump()
                        : job->done ? job->writer->body().dump()
                        : now - job->last_sent >= std::chrono::milliseconds(kKeepAliveMs) ? " " : "";
                }
              } catch (const std::exception& e) {
                // Nothing the model emits may end the process: this request ends with an error
                // (the status line has gone out: an error event, or an error body).
                job->handle->cancel();
                job->done = true;
                ++http_errors;
                const std::string msg = std::string("generation failed: ") + e.what();
                out = stream ? job->writer->stream_error(msg)
                             : error_body(job->req.kind, 500, "server_error", msg, "").dump();
              }
              if (!write(out)) {
                job->handle->cancel();
                ++disconnects;
                return false;
              }
              if (!out.empty()) job->last_sent = std::chrono::steady_clock::now();
              if (!job->done) return true;
            }
            sink.done();
            return true;
          },
          [job](bool) { job->handle->cancel(); });
      if (stream) {
        res.set_header("Cache-Control", "no-cache");
        res.set_header("X-Accel-Buffering", "no");
      }
    } catch (const ApiError& e) {
      send_error(res, kind, e.status, e.type, e.what(), e.param);
    } catch (const Error& e) {
      // Engine/encoder validation (bad prompt content, context) is the client's problem.
      send_error(res, kind, 400, "invalid_request_error", e.what());
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
    counter("ds41_client_disconnects_total", "Generations cancelled because the client went away", disconnects);
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
    auto histogram = [&](const char* name, const char* help, const std::atomic<int64_t>* counts, double sum, int64_t n) {
      o << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
      for (int i = 0; i < EngineMetrics::kBuckets; ++i)
        o << name << "_bucket{le=\"" << EngineMetrics::kBounds[i] << "\"} " << counts[i] << "\n";
      o << name << "_bucket{le=\"+Inf\"} " << counts[EngineMetrics::kBuckets] << "\n";
      o << name << "_sum " << sum << "\n" << name << "_count " << n << "\n";
    };
    histogram("ds41_time_to_first_token_seconds", "Submission to first token", m.ttft_counts, m.ttft_sum, m.ttft_n);
    histogram("ds41_time_per_output_token_seconds", "Time between consecutive tokens", m.tpot_counts, m.tpot_sum, m.tpot_n);
    return o.str();
  }

  // The listening socket, seen through httplib's socket-options hook (the last one it configured
  // is the one that got bound).
  int listen_fd = -1;
  void widen_backlog() const;

  void setup() {
    // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let a second server
    // bind the same port silently instead of failing with "address in use".
    http.set_socket_options([this](int fd) {
      int yes = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      listen_fd = fd;
    });
    http.new_task_queue = [n = opt.http_threads] { return new httplib::ThreadPool(size_t(n)); };
    http.set_payload_max_length(size_t(opt.max_body_bytes));
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (req.path.rfind("/v1/", 0) == 0 && !authorized(req)) {
        const ApiKind kind = req.path == "/v1/messages" ? ApiKind::AnthropicMessages : ApiKind::ChatCompletions;
        send_error(res, kind, 401, "authentication_error", "missing or wrong API key (Authorization: Bearer <key>)");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, ApiKind::ChatCompletions); });
    http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, ApiKind::Completions); });
    http.Post("/v1/messages", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, ApiKind::AnthropicMessages); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json m = {{"id", opt.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "ds41"},
                {"max_model_len", engine.options().max_context}};
      res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(), "application/json");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const EngineMetrics& m = engine.metrics();
      res.set_content(json{{"status", "ok"}, {"model", opt.model_name}, {"active", m.active.load()}, {"waiting", m.waiting.load()}}.dump(),
                      "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    // A known path with another method: 405 with the methods it has.
    auto wrong_method = [this](const char* allow) {
      return [this, allow](const httplib::Request& req, httplib::Response& res) {
        const ApiKind kind = req.path == "/v1/messages" ? ApiKind::AnthropicMessages : ApiKind::ChatCompletions;
        send_error(res, kind, 405, "invalid_request_error", req.method + " is not allowed on " + req.path + " (use " + allow + ")");
        res.set_header("Allow", allow);
      };
    };
    for (const char* path : {"/v1/chat/completions", "/v1/completions", "/v1/messages"}) {
      http.Get(path, wrong_method("POST"));
      http.Put(path, wrong_method("POST"));
      http.Delete(path, wrong_method("POST"));
      http.Patch(path, wrong_method("POST"));
    }
    for (const char* path : {"/v1/models", "/health", "/metrics"}) {
      http.Post(path, wrong_method("GET"));
      http.Put(path, wrong_method("GET"));
      http.Delete(path, wrong_method("GET"));
      http.Patch(path, wrong_method("GET"));
    }
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const ApiKind kind = req.path == "/v1/messages" ? ApiKind::AnthropicMessages : ApiKind::ChatCompletions;
      if (res.status == 404) send_error(res, kind, 404, "not_found_error", "no such endpoint: " + req.method + " " + req.path + " (endpoints: POST /v1/chat/completions, /v1/completions, /v1/messages; GET /v1/models, /health, /metrics)");
      else if (res.status == 413) send_error(res, kind, 413, "invalid_request_error", "the request body is too large");
      else send_error(res, kind, res.status, "invalid_request_error", "bad request");
    });
    http.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      const ApiKind kind = req.path == "/v1/messages" ? ApiKind::AnthropicMessages : ApiKind::ChatCompletions;
      send_error(res, kind, 500, "server_error", what);
    });
  }
};

Server::Server(Engine& engine, const TextSide& text, ServerOptions opt) : impl_(std::make_unique<Impl>(engine, text, std::move(opt))) {
  impl_->setup();
}

Server::~Server() = default;

// Debian's libcpp-httplib is compiled with a listen backlog of 5: a burst of clients overflows the
// accept queue and the kernel drops their handshakes (clients then fail or stall a second).
// listen() on a listening socket only updates its backlog.
void Server::Impl::widen_backlog() const {
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
}

bool Server::bind(std::string& error) {
  if (!impl_->http.bind_to_port(impl_->opt.host, impl_->opt.port)) {
    error = "cannot listen on " + impl_->opt.host + ":" + std::to_string(impl_->opt.port) + " (address in use or not available)";
    return false;
  }
  impl_->widen_backlog();
  return true;
}

bool Server::listen(std::string& error) { return bind(error) && impl_->http.listen_after_bind(); }

int Server::bind_any_port() {
  const int port = impl_->http.bind_to_any_port(impl_->opt.host);
  if (port > 0) impl_->widen_backlog();
  return port;
}
bool Server::listen_after_bind() { return impl_->http.listen_after_bind(); }
void Server::stop() { impl_->http.stop(); }

}  // namespace ds41
