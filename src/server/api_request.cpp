#include "server/api_request.h"

#include "runtime/logprobs.h"

#include "text/prompt_encoder.h"

#include <cmath>

#include "base/error.h"
#include "server/api_error.h"

namespace ds41 {

using json = nlohmann::ordered_json;

namespace {

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "an unsupported value";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const char* want, const json& got) {
  throw bad_request(param + " must be " + want + ", not " + type_name(got), param);
}

const json* field(const json& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::string get_string(const json& obj, const char* name, const std::string& param, bool required = false) {
  const json* v = field(obj, name);
  if (!v) {
    if (required) throw bad_request(param + " is required", param);
    return {};
  }
  if (!v->is_string()) wrong_type(param, "a string", *v);
  return v->get<std::string>();
}

double get_number(const json& obj, const char* name, double fallback, double lo, double hi) {
  const json* v = field(obj, name);
  if (!v) return fallback;
  if (!v->is_number()) wrong_type(name, "a number", *v);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw bad_request(std::string(name) + " must be between " + json(lo).dump() + " and " + json(hi).dump(), name);
  return x;
}

int64_t get_int(const json& obj, const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const json* v = field(obj, name);
  if (!v) return fallback;
  if (!v->is_number_integer() && !v->is_number_unsigned()) wrong_type(name, "an integer", *v);
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))
    throw bad_request(std::string(name) + " is too large", name);
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    throw bad_request(std::string(name) + " must be between " + std::to_string(lo) + " and " + std::to_string(hi), name);
  return x;
}

bool get_bool(const json& obj, const char* name, bool fallback) {
  const json* v = field(obj, name);
  if (!v) return fallback;
  if (!v->is_boolean()) wrong_type(name, "a boolean", *v);
  return v->get<bool>();
}

void require_object(const json& body) {
  if (!body.is_object()) throw bad_request(std::string("the request body must be a JSON object, not ") + type_name(body));
}

std::vector<std::string> get_stop(const json& obj, const char* name) {
  std::vector<std::string> out;
  const json* v = field(obj, name);
  if (!v) return out;
  if (v->is_string()) out.push_back(v->get<std::string>());
  else if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) wrong_type(std::string(name) + "[" + std::to_string(i) + "]", "a string", (*v)[i]);
      out.push_back((*v)[i].get<std::string>());
    }
  } else {
    wrong_type(name, "a string or an array of strings", *v);
  }
  if (out.size() > 16) throw bad_request(std::string(name) + ": at most 16 stop sequences", name);
  for (const auto& s : out)
    if (s.empty()) throw bad_request(std::string(name) + ": stop sequences must not be empty", name);
  return out;
}

// Sampling fields shared by the OpenAI endpoints.
void read_openai_sampling(const json& b, ApiRequest& r) {
  SamplerOptions& s = r.sampling;
  s.temperature = get_number(b, "temperature", s.temperature, 0, 2);
  s.top_p = get_number(b, "top_p", s.top_p, 0, 1);
  if (s.top_p == 0) throw bad_request("top_p must be greater than 0", "top_p");
  s.top_k = get_int(b, "top_k", s.top_k, 0, 1 << 20);
  s.min_p = get_number(b, "min_p", s.min_p, 0, 1);
  s.presence_penalty = get_number(b, "presence_penalty", s.presence_penalty, -2, 2);
  s.frequency_penalty = get_number(b, "frequency_penalty", s.frequency_penalty, -2, 2);
  s.repetition_penalty = get_number(b, "repetition_penalty", s.repetition_penalty, 0.01, 10);
  if (const json* seed = field(b, "seed")) {
    if (!seed->is_number_integer() && !seed->is_number_unsigned()) wrong_type("seed", "an integer", *seed);
    s.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : uint64_t(seed->get<int64_t>());
  }
  r.n = int(get_int(b, "n", 1, 1, 8));
  r.stop = get_stop(b, "stop");
  r.stream = get_bool(b, "stream", false);
  if (const json* so = field(b, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    r.include_usage = get_bool(*so, "include_usage", false);
  }
  int64_t max_tokens = get_int(b, "max_tokens", r.max_tokens, 1, INT64_MAX);  // 0 asks for nothing: a client error
  max_tokens = get_int(b, "max_completion_tokens", max_tokens, 1, INT64_MAX);
  r.max_tokens = max_tokens;
}

// The thinking switch as clients send it: reasoning_effort (OpenAI), thinking (bool or the
// Anthropic-style {"type": "enabled"|"disabled"}), or chat_template_kwargs.thinking (vLLM).
void read_thinking(const json& b, ApiRequest& r) {
  if (const json* e = field(b, "reasoning_effort")) {
    r.reasoning_effort = api_reasoning_effort(*e, "reasoning_effort");
    r.thinking = true;
  }
  auto read_switch = [&](const json& v, const std::string& param) {
    if (v.is_boolean()) r.thinking = v.get<bool>();
    else if (v.is_object()) {
      const std::string t = get_string(v, "type", param + ".type", true);
      if (t == "enabled") r.thinking = true;
      else if (t == "disabled") r.thinking = false;
      else throw bad_request(param + ".type must be \"enabled\" or \"disabled\"", param + ".type");
    } else {
      wrong_type(param, "a boolean or an object", v);
    }
  };
  if (const json* t = field(b, "thinking")) read_switch(*t, "thinking");
  if (const json* k = field(b, "chat_template_kwargs")) {
    if (!k->is_object()) wrong_type("chat_template_kwargs", "an object", *k);
    if (const json* t = field(*k, "thinking")) read_switch(*t, "chat_template_kwargs.thinking");
  }
}

void check_model(const json& b, ApiRequest& r) {
  r.model = get_string(b, "model", "model");
}

// OpenAI content: a string or an array of parts (text, image_url); returns the normalised form.
json normalise_openai_content(const json& c, const std::string& param, int& images, int max_images) {
  if (c.is_string()) return c;
  if (!c.is_array()) wrong_type(param, "a string or an array of content parts", c);
  json out = json::array();
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    const json& part = c[i];
    if (!part.is_object()) wrong_type(p, "an object", part);
    const std::string type = get_string(part, "type", p + ".type", true);
    if (type == "text") {
      out.push_back({{"type", "text"}, {"text", get_string(part, "text", p + ".text", true)}});
    } else if (type == "image_url") {
      const json* iu = field(part, "image_url");
      if (!iu) throw bad_request(p + ".image_url is required", p + ".image_url");
      std::string url;
      if (iu->is_string()) url = iu->get<std::string>();
      else if (iu->is_object()) url = get_string(*iu, "url", p + ".image_url.url", true);
      else wrong_type(p + ".image_url", "an object", *iu);
      if (url.rfind("data:image/", 0) != 0)
        throw bad_request(p + ": only data: URLs with an image media type are accepted (the server fetches nothing)",
                          p + ".image_url.url");
      if (++images > max_images)
        throw bad_request("too many images: at most " + std::to_string(max_images) + " per request", p);
      out.push_back({{"type", "image_url"}, {"image_url", {{"url", url}}}});
    } else {
      throw bad_request(p + ".type \"" + type + "\" is not supported (text, image_url)", p + ".type");
    }
  }
  return out;
}

json normalise_tool_calls(const json& tc, const std::string& param) {
  if (!tc.is_array()) wrong_type(param, "an array", tc);
  json out = json::array();
  for (size_t i = 0; i < tc.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    if (!tc[i].is_object()) wrong_type(p, "an object", tc[i]);
    const json* fn = field(tc[i], "function");
    if (!fn || !fn->is_object()) throw bad_request(p + ".function must be an object", p + ".function");
    const std::string name = get_string(*fn, "name", p + ".function.name", true);
    const json* args = field(*fn, "arguments");
    std::string arguments = "{}";
    if (args) {
      if (args->is_string()) {
        arguments = args->get<std::string>();
        if (!json::accept(arguments)) throw bad_request(p + ".function.arguments is not valid JSON", p + ".function.arguments");
      } else if (args->is_object()) {
        arguments = args->dump();
      } else {
        wrong_type(p + ".function.arguments", "a JSON string", *args);
      }
    }
    json call = {{"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
    call["id"] = get_string(tc[i], "id", p + ".id");
    out.push_back(call);
  }
  return out;
}

json normalise_openai_tools(const json& b) {
  json out = json::array();
  const json* t = field(b, "tools");
  if (!t) return out;
  if (!t->is_array()) wrong_type("tools", "an array", *t);
  for (size_t i = 0; i < t->size(); ++i) {
    const std::string p = "tools[" + std::to_string(i) + "]";
    const json& tool = (*t)[i];
    if (!tool.is_object()) wrong_type(p, "an object", tool);
    const std::string type = get_string(tool, "type", p + ".type");
    if (!type.empty() && type != "function") throw bad_request(p + ".type must be \"function\"", p + ".type");
    const json* fn = field(tool, "function");
    if (!fn || !fn->is_object()) throw bad_request(p + ".function must be an object", p + ".function");
    get_string(*fn, "name", p + ".function.name", true);
    if (const json* params = field(*fn, "parameters"))
      if (!params->is_object()) wrong_type(p + ".function.parameters", "an object (a JSON schema)", *params);
    out.push_back({{"type", "function"}, {"function", *fn}});
  }
  return out;
}

void read_tool_choice(const json& b, ApiRequest& r) {
  const json* tc = field(b, "tool_choice");
  if (!tc) return;
  if (tc->is_string()) {
    const std::string v = tc->get<std::string>();
    if (v != "auto" && v != "none" && v != "required")
      throw bad_request("tool_choice must be \"auto\", \"none\", \"required\" or a function", "tool_choice");
    r.tool_choice = v;
  } else if (tc->is_object()) {
    const json* fn = field(*tc, "function");
    if (!fn || !fn->is_object()) throw bad_request("tool_choice.function must be an object", "tool_choice.function");
    const std::string name = get_string(*fn, "name", "tool_choice.function.name", true);
    bool known = false;
    for (const json& t : r.tools) known |= t["function"]["name"] == name;
    if (!known) throw bad_request("tool_choice names a function that is not in tools: " + name, "tool_choice");
    r.tool_choice = "function:" + name;
  } else {
    wrong_type("tool_choice", "a string or an object", *tc);
  }
  if (r.tool_choice != "auto" && r.tool_choice != "none" && r.tools.empty())
    throw bad_request("tool_choice \"" + r.tool_choice + "\" needs tools", "tool_choice");
}

}  // namespace

int api_reasoning_effort(const json& v, const std::string& param) {
  if (v.is_string()) {  // the names `ds41 run --effort` takes (parse_reasoning_effort)
    try {
      return parse_reasoning_effort(v.get<std::string>());
    } catch (const Error&) {
      throw bad_request(param + " must be low, medium, high, max or an integer 1-100", param);
    }
  }
  if (v.is_number_integer() || v.is_number_unsigned()) {
    const int64_t x = v.get<int64_t>();
    if (x < 1 || x > 100) throw bad_request(param + " must be between 1 and 100", param);
    return int(x);
  }
  wrong_type(param, "a string or an integer", v);
}

ApiRequest parse_chat_completions(const json& b, const ApiDefaults& d) {
  require_object(b);
  ApiRequest r;
  r.kind = ApiKind::ChatCompletions;
  r.sampling = d.sampling;
  r.thinking = d.thinking;
  r.reasoning_effort = d.reasoning_effort;
  r.max_tokens = d.max_tokens;
  check_model(b, r);
  const json* msgs = field(b, "messages");
  if (!msgs) throw bad_request("messages is required", "messages");
  if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) throw bad_request("messages must not be empty", "messages");
  int images = 0;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    const json& m = (*msgs)[i];
    if (!m.is_object()) wrong_type(p, "an object", m);
    std::string role = get_string(m, "role", p + ".role", true);
    if (role == "developer") role = "system";
    json out = {{"role", role}};
    const json* content = field(m, "content");
    if (role == "system" || role == "user" || role == "latest_reminder") {
      if (!content) throw bad_request(p + ".content is required", p + ".content");
      if (role != "user" && !content->is_string()) {
        // System text may come as text parts; images only in user turns.
        if (!content->is_array()) wrong_type(p + ".content", "a string or an array of text parts", *content);
        std::string joined;
        for (size_t k = 0; k < content->size(); ++k) {
          const json& part = (*content)[k];
          const std::string pp = p + ".content[" + std::to_string(k) + "]";
          if (!part.is_object() || get_string(part, "type", pp + ".type", true) != "text")
            throw bad_request(pp + ": only text parts are allowed in a " + role + " message", pp);
          joined += (joined.empty() ? "" : "\n\n") + get_string(part, "text", pp + ".text", true);
        }
        out["content"] = joined;
      } else {
        out["content"] = normalise_openai_content(*content, p + ".content", images, d.max_images);
      }
    } else if (role == "assistant") {
      if (content) {
        if (content->is_string()) out["content"] = *content;
        else {
          int no_images = 0;
          json parts = normalise_openai_content(*content, p + ".content", no_images, 0);
          std::string joined;
          for (const json& part : parts) joined += part["text"].get<std::string>();
          out["content"] = joined;
        }
      } else {
        out["content"] = "";
      }
      if (const json* rc = field(m, "reasoning_content")) {
        if (!rc->is_string()) wrong_type(p + ".reasoning_content", "a string", *rc);
        out["reasoning_content"] = *rc;
      }
      if (const json* tc = field(m, "tool_calls")) out["tool_calls"] = normalise_tool_calls(*tc, p + ".tool_calls");
    } else if (role == "tool") {
      if (!content) throw bad_request(p + ".content is required", p + ".content");
      if (content->is_string()) out["content"] = *content;
      else {
        int no_images = 0;
        json parts = normalise_openai_content(*content, p + ".content", no_images, 0);
        std::string joined;
        for (const json& part : parts) joined += part["text"].get<std::string>();
        out["content"] = joined;
      }
      out["tool_call_id"] = get_string(m, "tool_call_id", p + ".tool_call_id");
    } else {
      throw bad_request(p + ".role \"" + role + "\" is not one of system, developer, user, assistant, tool",
                        p + ".role");
    }
    r.messages.push_back(out);
  }
  r.tools = normalise_openai_tools(b);
  read_tool_choice(b, r);
  read_openai_sampling(b, r);
  // logprobs: true adds each token's log-probability; top_logprobs (0-20) that many alternatives.
  const bool logprobs = get_bool(b, "logprobs", false);
  if (field(b, "top_logprobs")) {
    if (!logprobs) throw bad_request("top_logprobs needs logprobs: true", "top_logprobs");
    r.logprobs = int(get_int(b, "top_logprobs", 0, 0, kMaxTopLogprobs));
  } else {
    r.logprobs = logprobs ? 0 : -1;
  }
  read_thinking(b, r);
  if (const json* rf = field(b, "response_format")) {
    if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
    const std::string t = get_string(*rf, "type", "response_format.type", true);
    if (t != "text" && t != "json_object" && t != "json_schema")
      throw bad_request("response_format.type must be text, json_object or json_schema", "response_format.type");
    if (t == "json_schema") {
      const json* js = field(*rf, "json_schema");
      if (!js || !js->is_object()) throw bad_request("response_format.json_schema must be an object", "response_format.json_schema");
    }
    r.response_format = *rf;
  }
  return r;
}

ApiRequest parse_completions(const json& b, const ApiDefaults& d) {
  require_object(b);
  ApiRequest r;
  r.kind = ApiKind::Completions;
  r.sampling = d.sampling;
  r.max_tokens = d.max_tokens >= 0 ? d.max_tokens : 16;  // the OpenAI default for completions
  check_model(b, r);
  const json* p = field(b, "prompt");
  if (!p) throw bad_request("prompt is required", "prompt");
  if (p->is_string()) r.prompt = p->get<std::string>();
  else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) r.prompt = (*p)[0].get<std::string>();
  else wrong_type("prompt", "a string", *p);
  if (r.prompt.empty()) throw bad_request("prompt must not be empty", "prompt");
  if (field(b, "suffix")) throw bad_request("suffix is not supported", "suffix");
  r.echo = get_bool(b, "echo", false);
  // logprobs: the number of alternatives per token (0-20; null or absent: none).
  if (field(b, "logprobs")) r.logprobs = int(get_int(b, "logprobs", 0, 0, kMaxTopLogprobs));
  read_openai_sampling(b, r);
  return r;
}

ApiRequest parse_anthropic_messages(const json& b, const ApiDefaults& d) {
  require_object(b);
  ApiRequest r;
  r.kind = ApiKind::AnthropicMessages;
  r.sampling = d.sampling;
  r.reasoning_effort = d.reasoning_effort;
  check_model(b, r);
  if (!field(b, "max_tokens")) throw bad_request("max_tokens is required", "max_tokens");
  r.max_tokens = get_int(b, "max_tokens", 0, 1, INT64_MAX);
  r.sampling.temperature = get_number(b, "temperature", r.sampling.temperature, 0, 1);
  r.sampling.top_p = get_number(b, "top_p", r.sampling.top_p, 0, 1);
  if (r.sampling.top_p == 0) throw bad_request("top_p must be greater than 0", "top_p");
  r.sampling.top_k = get_int(b, "top_k", r.sampling.top_k, 0, 1 << 20);
  r.stop = get_stop(b, "stop_sequences");
  r.stream = get_bool(b, "stream", false);
  r.include_usage = true;
  if (const json* t = field(b, "thinking")) {
    if (!t->is_object()) wrong_type("thinking", "an object", *t);
    const std::string type = get_string(*t, "type", "thinking.type", true);
    if (type == "enabled") r.thinking = true;
    else if (type != "disabled") throw bad_request("thinking.type must be \"enabled\" or \"disabled\"", "thinking.type");
  }
  // System prompt: a string or text blocks.
  if (const json* sys = field(b, "system")) {
    std::string text;
    if (sys->is_string()) text = sys->get<std::string>();
    else if (sys->is_array()) {
      for (size_t i = 0; i < sys->size(); ++i) {
        const std::string p = "system[" + std::to_string(i) + "]";
        if (!(*sys)[i].is_object() || get_string((*sys)[i], "type", p + ".type", true) != "text")
          throw bad_request(p + " must be a text block", p);
        text += (text.empty() ? "" : "\n\n") + get_string((*sys)[i], "text", p + ".text", true);
      }
    } else {
      wrong_type("system", "a string or an array of text blocks", *sys);
    }
    r.messages.push_back({{"role", "system"}, {"content", text}});
  }
  const json* msgs = field(b, "messages");
  if (!msgs) throw bad_request("messages is required", "messages");
  if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) throw bad_request("messages must not be empty", "messages");
  int images = 0;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    const json& m = (*msgs)[i];
    if (!m.is_object()) wrong_type(p, "an object", m);
    const std::string role = get_string(m, "role", p + ".role", true);
    if (role != "user" && role != "assistant") throw bad_request(p + ".role must be \"user\" or \"assistant\"", p + ".role");
    const json* content = field(m, "content");
    if (!content) throw bad_request(p + ".content is required", p + ".content");
    if (content->is_string()) {
      r.messages.push_back({{"role", role}, {"content", *content}});
      continue;
    }
    if (!content->is_array()) wrong_type(p + ".content", "a string or an array of content blocks", *content);
    json parts = json::array();
    json tool_calls = json::array();
    std::string text, reasoning;
    for (size_t k = 0; k < content->size(); ++k) {
      const std::string pp = p + ".content[" + std::to_string(k) + "]";
      const json& blk = (*content)[k];
      if (!blk.is_object()) wrong_type(pp, "an object", blk);
      const std::string type = get_string(blk, "type", pp + ".type", true);
      if (type == "text") {
        const std::string t = get_string(blk, "text", pp + ".text", true);
        if (role == "user") parts.push_back({{"type", "text"}, {"text", t}});
        else text += t;
      } else if (type == "image" && role == "user") {
        const json* src = field(blk, "source");
        if (!src || !src->is_object()) throw bad_request(pp + ".source must be an object", pp + ".source");
        if (get_string(*src, "type", pp + ".source.type", true) != "base64")
          throw bad_request(pp + ".source.type must be \"base64\" (the server fetches nothing)", pp + ".source.type");
        const std::string mt = get_string(*src, "media_type", pp + ".source.media_type", true);
        if (mt.rfind("image/", 0) != 0) throw bad_request(pp + ".source.media_type must be an image type", pp + ".source.media_type");
        const std::string data = get_string(*src, "data", pp + ".source.data", true);
        if (++images > d.max_images) throw bad_request("too many images: at most " + std::to_string(d.max_images) + " per request", pp);
        parts.push_back({{"type", "image_url"}, {"image_url", {{"url", "data:" + mt + ";base64," + data}}}});
      } else if (type == "tool_use" && role == "assistant") {
        const json* input = field(blk, "input");
        if (input && !input->is_object()) wrong_type(pp + ".input", "an object", *input);
        tool_calls.push_back({{"id", get_string(blk, "id", pp + ".id", true)},
                              {"type", "function"},
                              {"function", {{"name", get_string(blk, "name", pp + ".name", true)},
                                            {"arguments", input ? input->dump() : "{}"}}}});
      } else if (type == "tool_result" && role == "user") {
        std::string result;
        if (const json* c = field(blk, "content")) {
          if (c->is_string()) result = c->get<std::string>();
          else if (c->is_array()) {
            for (size_t q = 0; q < c->size(); ++q) {
              const json& cb = (*c)[q];
              const std::string cp = pp + ".content[" + std::to_string(q) + "]";
              if (!cb.is_object() || get_string(cb, "type", cp + ".type", true) != "text")
                throw bad_request(cp + ": only text blocks are supported in tool results", cp);
              result += get_string(cb, "text", cp + ".text", true);
            }
          } else {
            wrong_type(pp + ".content", "a string or an array of text blocks", *c);
          }
        }
        // Tool results become OpenAI tool messages (the encoder merges them into the user turn).
        r.messages.push_back({{"role", "tool"}, {"tool_call_id", get_string(blk, "tool_use_id", pp + ".tool_use_id", true)},
                              {"content", result}});
      } else if ((type == "thinking" || type == "redacted_thinking") && role == "assistant") {
        if (type == "thinking") reasoning += get_string(blk, "thinking", pp + ".thinking");
      } else {
        throw bad_request(pp + ".type \"" + type + "\" is not supported in a " + role + " message", pp + ".type");
      }
    }
    if (role == "user") {
      if (!parts.empty()) r.messages.push_back({{"role", "user"}, {"content", parts}});
    } else {
      json a = {{"role", "assistant"}, {"content", text}};
      if (!reasoning.empty()) a["reasoning_content"] = reasoning;
      if (!tool_calls.empty()) a["tool_calls"] = tool_calls;
      r.messages.push_back(a);
    }
  }
  // Tools: Anthropic {name, description, input_schema} -> OpenAI function objects.
  if (const json* t = field(b, "tools")) {
    if (!t->is_array()) wrong_type("tools", "an array", *t);
    for (size_t i = 0; i < t->size(); ++i) {
      const std::string p = "tools[" + std::to_string(i) + "]";
      const json& tool = (*t)[i];
      if (!tool.is_object()) wrong_type(p, "an object", tool);
      json fn = {{"name", get_string(tool, "name", p + ".name", true)}};
      const std::string desc = get_string(tool, "description", p + ".description");
      if (!desc.empty()) fn["description"] = desc;
      if (const json* s = field(tool, "input_schema")) {
        if (!s->is_object()) wrong_type(p + ".input_schema", "an object", *s);
        fn["parameters"] = *s;
      }
      r.tools.push_back({{"type", "function"}, {"function", fn}});
    }
  }
  if (const json* tc = field(b, "tool_choice")) {
    if (!tc->is_object()) wrong_type("tool_choice", "an object", *tc);
    const std::string type = get_string(*tc, "type", "tool_choice.type", true);
    if (type == "auto") r.tool_choice = "auto";
    else if (type == "any") r.tool_choice = "required";
    else if (type == "none") r.tool_choice = "none";
    else if (type == "tool") r.tool_choice = "function:" + get_string(*tc, "name", "tool_choice.name", true);
    else throw bad_request("tool_choice.type must be auto, any, tool or none", "tool_choice.type");
  }
  return r;
}

}  // namespace ds41
