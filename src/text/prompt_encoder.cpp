// Follows the reference encoder's pipeline step by step (spec D.4): validate, replace images by
// placeholders, merge tool messages into user turns, order tool results by call order, drop old
// reasoning, render each message. Each step works on JSON copies as the reference does on dicts,
// so the quirks of the format (which user turns merge, which metadata survives a merge) come out
// the same.
#include "text/prompt_encoder.h"

#include <algorithm>
#include <charconv>
#include <map>

#include "base/error.h"
#include "text/dsml_tokens.h"
#include "text/python_json.h"

namespace ds41 {

namespace {

using J = nlohmann::ordered_json;
using namespace dsml;

struct Task {
  std::string_view name, token;
};
constexpr Task kTasks[] = {{"action", "<｜action｜>"}, {"query", "<｜query｜>"},     {"authority", "<｜authority｜>"},
                           {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"},     {"read_url", "<｜read_url｜>"}};

const Task* find_task(std::string_view name) {
  for (const Task& t : kTasks)
    if (t.name == name) return &t;
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Validation: everything the later steps read must have the shape they assume, so that every
// bad input fails here with the message's position instead of producing Python-isms.

bool has(const J& obj, const char* key) { return obj.contains(key) && !obj[key].is_null(); }

void check_no_image_token(const std::string& text, const std::string& where) {
  if (text.find(kImage) != std::string::npos)
    throw Error(where + " contains the image token " + std::string(kImage) +
                "; give images as separate content blocks ({\"type\": \"image_url\", ...})");
}

void check_optional_string(const J& obj, const char* key, const std::string& where) {
  if (has(obj, key) && !obj[key].is_string()) throw Error(where + "." + key + " must be a string");
}

void validate_blocks(const J& blocks, const std::string& where);

void validate_block(const J& b, const std::string& where) {
  if (!b.is_object()) throw Error(where + " must be an object ({\"type\": ..., ...})");
  if (!b.contains("type") || !b["type"].is_string()) throw Error(where + ".type must be a string");
  const std::string& type = b["type"].get_ref<const std::string&>();
  if (type == "text") {
    if (b.contains("text")) {
      if (!b["text"].is_string()) throw Error(where + ".text must be a string");
      check_no_image_token(b["text"].get<std::string>(), where + ".text");
    }
  } else if (type == "image_url") {
    const J* url = nullptr;
    if (b.contains("image_url")) {
      const J& iu = b["image_url"];
      if (iu.is_string()) {
        url = &iu;
      } else if (iu.is_object()) {
        if (iu.contains("url")) url = &iu["url"];
      } else if (!iu.is_null()) {
        throw Error(where + ".image_url must be a URL string or {\"url\": ...}");
      }
    }
    if (url && !url->is_string()) throw Error(where + ".image_url.url must be a string");
    if (!url || url->get_ref<const std::string&>().empty())
      throw Error(where + ": image block without a source (image_url.url is missing or empty)");
  } else if (type == "image") {
    bool any = false;
    for (const char* k : {"source", "url", "data"})
      if (b.contains(k) && python_truthy(b[k])) any = true;
    if (!any) throw Error(where + ": image block without a source (give source, url or data)");
  } else if (type == "tool_result") {
    check_optional_string(b, "tool_use_id", where);
    if (b.contains("content")) {
      const J& c = b["content"];
      if (c.is_array()) {
        validate_blocks(c, where + ".content");
      } else if (!c.is_string()) {
        throw Error(where + ".content must be a string or an array of content blocks");
      }
    }
  }
}

void validate_blocks(const J& blocks, const std::string& where) {
  for (size_t i = 0; i < blocks.size(); ++i) validate_block(blocks[i], where + "[" + std::to_string(i) + "]");
}

void validate_message(const J& m, const std::string& where) {
  if (!m.is_object()) throw Error(where + " must be an object with a \"role\"");
  if (!m.contains("role") || !m["role"].is_string()) throw Error(where + ".role must be a string");
  const std::string& role = m["role"].get_ref<const std::string&>();
  if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "latest_reminder")
    throw Error(where + ": unknown role '" + role + "' (system, user, assistant, tool, latest_reminder)");
  const std::string at = where + " (" + role + ")";

  const bool null_content_ok = role == "system" || role == "assistant";
  if (m.contains("content")) {
    const J& c = m["content"];
    if (c.is_string()) {
      check_no_image_token(c.get<std::string>(), at + ".content");
    } else if (c.is_array()) {
      if (m.contains("content_blocks")) throw Error(at + ": give content_blocks or array content, not both");
      if (c.empty() && role == "latest_reminder") throw Error(at + ".content must not be empty");
      validate_blocks(c, at + ".content");
    } else if (!(c.is_null() && null_content_ok)) {
      throw Error(at + ".content must be a string or an array of content blocks");
    }
  } else if (role == "latest_reminder" && !(m.contains("content_blocks") && python_truthy(m["content_blocks"]))) {
    throw Error(at + " needs a content string");
  }
  if (m.contains("content_blocks")) {
    if (!m["content_blocks"].is_array()) throw Error(at + ".content_blocks must be an array");
    validate_blocks(m["content_blocks"], at + ".content_blocks");
  }
  check_optional_string(m, "reasoning_content", at);
  if (has(m, "reasoning_content")) check_no_image_token(m["reasoning_content"].get<std::string>(), at + ".reasoning_content");
  check_optional_string(m, "tool_call_id", at);

  if (has(m, "task")) {
    if (!m["task"].is_string() || !find_task(m["task"].get<std::string>()))
      throw Error(at + ".task must be one of action, query, authority, domain, title, read_url");
  }
  if (has(m, "tools")) {
    const J& tools = m["tools"];
    if (!tools.is_array()) throw Error(at + ".tools must be an array of {\"type\": \"function\", \"function\": {...}}");
    for (size_t i = 0; i < tools.size(); ++i)
      if (!tools[i].is_object() || !tools[i].contains("function"))
        throw Error(at + ".tools[" + std::to_string(i) + "] must be an object with a \"function\"");
  }
  if (role == "assistant" && has(m, "tool_calls")) {
    const J& calls = m["tool_calls"];
    if (!calls.is_array()) throw Error(at + ".tool_calls must be an array");
    for (size_t i = 0; i < calls.size(); ++i) {
      const std::string w = at + ".tool_calls[" + std::to_string(i) + "]";
      const J& tc = calls[i];
      if (!tc.is_object()) throw Error(w + " must be an object {\"id\", \"type\", \"function\"}");
      check_optional_string(tc, "id", w);
      if (!tc.contains("function") || !tc["function"].is_object()) throw Error(w + ".function must be an object");
      const J& f = tc["function"];
      if (!f.contains("name") || !f["name"].is_string()) throw Error(w + ".function.name must be a string");
      if (!f.contains("arguments")) throw Error(w + ".function.arguments is missing");
      check_optional_string(f, "id", w + ".function");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Images: replace image blocks by placeholder text blocks, collect their records in order.

bool is_image_block(const J& b) {
  return b.is_object() && b.contains("type") && (b["type"] == "image" || b["type"] == "image_url");
}

J image_record(const J& b) {
  J rec = J::object();
  rec["type"] = "image";
  if (b["type"] == "image_url") {
    const J& iu = b["image_url"];
    rec["url"] = iu.is_string() ? iu : iu["url"];
  } else {
    for (const char* k : {"source", "url", "data"})
      if (b.contains(k)) rec[k] = b[k];
  }
  return rec;
}

J replace_images(const J& blocks, std::vector<J>& images) {
  J out = J::array();
  for (const J& b : blocks) {
    if (is_image_block(b)) {
      out.push_back(J{{"type", "text"}, {"text", std::string(kImage)}});
      images.push_back(image_record(b));
    } else if (b["type"] == "tool_result" && b.contains("content") && b["content"].is_array()) {
      J copy = b;
      copy["content"] = replace_images(b["content"], images);
      out.push_back(std::move(copy));
    } else {
      out.push_back(b);
    }
  }
  return out;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::vector<J> process_images(const J& messages, std::vector<J>& images) {
  std::vector<J> out;
  for (J m : messages) {
    if (m.contains("content") && m["content"].is_array() && !m.contains("content_blocks")) {
      J blocks = std::move(m["content"]);
      m.erase("content");
      m["content_blocks"] = std::move(blocks);
    }
    if (m.contains("content_blocks") && python_truthy(m["content_blocks"])) {
      m["content_blocks"] = replace_images(m["content_blocks"], images);
      if (!(m.contains("content") && m["content"].is_string())) {
        // Array content of non-user messages is rendered as its text blocks.
        std::vector<std::string> texts;
        for (const J& b : m["content_blocks"])
          if (b["type"] == "text") texts.push_back(b.value("text", ""));
        m["content"] = join(texts, "\n\n");
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Tool results: the format has no tool role; results become <tool_result> blocks of user turns.

bool role_is(const J& m, std::string_view role) { return m["role"] == role; }

std::vector<J> merge_tool_messages(const std::vector<J>& messages) {
  std::vector<J> merged;
  for (const J& m : messages) {
    if (role_is(m, "tool")) {
      J block = J::object();
      block["type"] = "tool_result";
      block["tool_use_id"] = m.contains("tool_call_id") ? m["tool_call_id"] : J("");
      block["content"] = m.contains("content") ? m["content"] : J("");
      if (!merged.empty() && role_is(merged.back(), "user") && merged.back().contains("content_blocks")) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        merged.push_back(J{{"role", "user"}, {"content_blocks", J::array({std::move(block)})}});
      }
    } else if (role_is(m, "user")) {
      J blocks = has(m, "content_blocks")
                     ? m["content_blocks"]
                     : J::array({J{{"type", "text"}, {"text", m.contains("content") ? m["content"] : J("")}}});
      // Consecutive user turns merge into one (their blocks joined by a blank line) unless the
      // earlier one carries a task; the later turn's own fields are dropped, as in the reference.
      if (!merged.empty() && role_is(merged.back(), "user") && merged.back().contains("content_blocks") &&
          !has(merged.back(), "task")) {
        for (const J& b : blocks) merged.back()["content_blocks"].push_back(b);
      } else {
        J copy = m;
        copy["content_blocks"] = std::move(blocks);
        merged.push_back(std::move(copy));
      }
    } else {
      merged.push_back(m);
    }
  }
  return merged;
}

// Tool results of a user turn follow the order of the preceding assistant's tool_calls; results
// with an unknown id sort as if they answered the first call (stable), as in the reference.
void sort_tool_results(std::vector<J>& messages) {
  std::map<std::string, int> order;
  for (J& m : messages) {
    if (role_is(m, "assistant") && has(m, "tool_calls") && python_truthy(m["tool_calls"])) {
      order.clear();
      const J& calls = m["tool_calls"];
      for (size_t i = 0; i < calls.size(); ++i) {
        const J& tc = calls[i];
        std::string id;
        if (has(tc, "id") && python_truthy(tc["id"])) {
          id = tc["id"].get<std::string>();
        } else if (has(tc["function"], "id")) {
          id = tc["function"]["id"].get<std::string>();
        }
        if (!id.empty()) order[id] = static_cast<int>(i);
      }
    } else if (role_is(m, "user") && m.contains("content_blocks") && python_truthy(m["content_blocks"])) {
      J& blocks = m["content_blocks"];
      std::vector<J> results;
      for (const J& b : blocks)
        if (b["type"] == "tool_result") results.push_back(b);
      if (results.size() < 2 || order.empty()) continue;
      auto key = [&](const J& b) {
        if (!has(b, "tool_use_id")) return 0;
        auto it = order.find(b["tool_use_id"].get<std::string>());
        return it == order.end() ? 0 : it->second;
      };
      std::stable_sort(results.begin(), results.end(), [&](const J& a, const J& b) { return key(a) < key(b); });
      size_t next = 0;
      for (J& b : blocks)
        if (b["type"] == "tool_result") b = results[next++];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Rendering.

int find_last_user_index(const std::vector<J>& messages) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    const J& m = messages[static_cast<size_t>(i)];
    if (role_is(m, "user") || (role_is(m, "system") && i > 0)) return i;
  }
  return -1;
}

std::string string_or_empty(const J& m, const char* key) {
  return has(m, key) ? m[key].get<std::string>() : std::string();
}

// Client text in the rendered prompt is framed by two bytes that valid UTF-8 never holds (every
// string of a parsed JSON request is valid UTF-8), so encode_prompt can cut the frames out again
// and report where each piece of client text sits: message content is text, and the tokenizer
// must not turn a special-token string typed there into a control token (EncodedPrompt::text_spans).
constexpr char kTextOpen = '\xFE', kTextClose = '\xFF';
// The image placeholder is the encoder's own (validation refuses it in client strings; it stands
// where an image block was), so it stays outside the frames.
std::string client_text(const std::string& s) {
  std::string out(1, kTextOpen);
  for (size_t at = 0;;) {
    const size_t img = s.find(kImage, at);
    if (img == std::string::npos) {
      out.append(s, at, std::string::npos);
      break;
    }
    out.append(s, at, img - at);
    out += kTextClose;
    out += kImage;
    out += kTextOpen;
    at = img + std::string_view(kImage).size();
  }
  out += kTextClose;
  return out;
}

std::string render_tools(const J& tools) {
  std::vector<std::string> schemas;
  for (const J& t : tools) schemas.push_back(client_text(python_json_dumps(t["function"])));
  // Model input: the released template, byte for byte.
  std::string out =
      "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
      "writing a \"";
  out += kCallsOpen;
  out += "\" block like the following:\n\n";
  out += kCallsOpen;
  out += "\n";
  out += kInvokeOpen;
  out += " name=\"$TOOL_NAME\">\n";
  out += kParamOpen;
  out += " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE";
  out += kParamClose;
  out += "\n...\n";
  out += kInvokeClose;
  out += ">\n";
  out += kInvokeOpen;
  out += " name=\"$TOOL_NAME2\">\n...\n";
  out += kInvokeClose;
  out += ">\n";
  out += kCallsClose;
  out +=
      "\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
      "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
      "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
      "<think>...</think> BEFORE any tool calls or final response.\n\n"
      "Otherwise, output directly after </think> with tool calls or final response.\n\n"
      "### Available Tool Schemas\n\n";
  out += join(schemas, "\n");
  out += "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
  return out;
}

// Arguments may be an object, a JSON string of one (possibly encoded twice), or anything else,
// which becomes a single parameter named "arguments".
std::string render_arguments(const J& arguments) {
  J args = arguments;
  if (!args.is_object()) {
    for (int round = 0; round < 2 && args.is_string(); ++round) {
      J parsed = J::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) break;
      args = std::move(parsed);
    }
    if (!args.is_object()) args = J{{"arguments", arguments}};
  }
  std::vector<std::string> params;
  for (const auto& [key, value] : args.items()) {
    std::string p(kParamOpen);
    p += " name=\"" + client_text(key) + "\" string=\"" + (value.is_string() ? "true" : "false") + "\">";
    p += value.is_string() ? client_text(value.get<std::string>()) : python_json_dumps(value);
    p += kParamClose;
    params.push_back(std::move(p));
  }
  return join(params, "\n");
}

std::string render_tool_calls(const J& calls) {
  std::vector<std::string> invokes;
  for (const J& tc : calls) {
    std::string s(kInvokeOpen);
    s += " name=\"" + client_text(tc["function"]["name"].get<std::string>()) + "\">\n";
    s += render_arguments(tc["function"]["arguments"]);
    s += "\n";
    s += kInvokeClose;
    s += ">";
    invokes.push_back(std::move(s));
  }
  std::string out = "\n\n";
  out += kCallsOpen;
  out += '\n';
  out += join(invokes, "\n");
  out += '\n';
  out += kCallsClose;
  return out;
}

std::string render_user_blocks(const J& blocks) {
  std::vector<std::string> parts;
  for (const J& b : blocks) {
    const std::string& type = b["type"].get_ref<const std::string&>();
    if (type == "text") {
      parts.push_back(client_text(b.value("text", "")));
    } else if (type == "tool_result") {
      std::string content;
      if (b.contains("content") && b["content"].is_array()) {
        std::vector<std::string> texts;
        for (const J& c : b["content"]) {
          if (c["type"] == "text") {
            texts.push_back(client_text(c.value("text", "")));
          } else {
            texts.push_back("[Unsupported " + c["type"].get<std::string>() + "]");
          }
        }
        content = join(texts, "\n\n");
      } else if (b.contains("content")) {
        content = client_text(b["content"].get<std::string>());
      }
      parts.push_back("<tool_result>" + content + "</tool_result>");
    } else {
      parts.push_back("[Unsupported " + type + "]");
    }
  }
  return join(parts, "\n\n");
}

struct RenderContext {
  const std::vector<J>& messages;
  int last_user;
  bool thinking;
  bool drop_thinking;
  int effort;
};

std::string render_message(const RenderContext& rc, int index) {
  const J& m = rc.messages[static_cast<size_t>(index)];
  const std::string& role = m["role"].get_ref<const std::string&>();
  std::string out;
  // Thinking mode opens the conversation with the effort line, after a <｜System｜> token that the
  // first system message (if any) shares.
  const bool effort_line = index == 0 && rc.thinking;
  if (index == 0 && (effort_line || role == "system")) out += kSystem;
  if (effort_line)
    out += "Reasoning Effort: " + std::to_string(rc.effort) +
           " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

  if (role == "system") {
    if (index > 0) out += kSystem;
    out += client_text(string_or_empty(m, "content"));
    if (has(m, "tools") && python_truthy(m["tools"])) out += "\n\n" + render_tools(m["tools"]);
    if (m.contains("response_format") && python_truthy(m["response_format"]))
      out += "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
             client_text(python_json_dumps(m["response_format"]));
  } else if (role == "user") {
    out += kUser;
    if (m.contains("content_blocks") && python_truthy(m["content_blocks"])) {
      out += render_user_blocks(m["content_blocks"]);
    } else {
      out += client_text(string_or_empty(m, "content"));
    }
  } else if (role == "latest_reminder") {
    out += kLatestReminder;
    out += client_text(m["content"].get<std::string>());
  } else {  // assistant (tool messages were merged into user turns)
    const bool prev_has_task = index > 0 && has(rc.messages[static_cast<size_t>(index - 1)], "task");
    // The generation header already opened <think>, so a kept reasoning only needs the closing tag.
    if (rc.thinking && !prev_has_task && (!rc.drop_thinking || index > rc.last_user)) {
      out += client_text(string_or_empty(m, "reasoning_content"));
      out += kThinkEnd;
    }
    out += client_text(string_or_empty(m, "content"));
    if (has(m, "tool_calls") && python_truthy(m["tool_calls"])) out += render_tool_calls(m["tool_calls"]);
    if (!(m.contains("wo_eos") && python_truthy(m["wo_eos"]))) out += kEos;
  }

  // What follows the message: nothing when another turn (not an assistant reply or a reminder)
  // comes next; otherwise the task token or the assistant header that opens the reply.
  const size_t next = static_cast<size_t>(index) + 1;
  if (next < rc.messages.size() && !role_is(rc.messages[next], "assistant") &&
      !role_is(rc.messages[next], "latest_reminder"))
    return out;
  if (has(m, "task")) {
    const Task* task = find_task(m["task"].get<std::string>());
    if (task->name != "action") {
      out += task->token;
    } else {
      out += kAssistant;
      out += rc.thinking ? kThinkStart : kThinkEnd;
      out += task->token;
    }
  } else if (role == "user" || (role == "system" && index > 0)) {
    out += kAssistant;
    const bool open_thinking = rc.thinking && (!rc.drop_thinking || index >= rc.last_user);
    out += open_thinking ? kThinkStart : kThinkEnd;
  }
  return out;
}

void validate_list(const J& messages, const char* name) {
  if (!messages.is_array()) throw Error(std::string(name) + " must be an array of messages");
  for (size_t i = 0; i < messages.size(); ++i)
    validate_message(messages[i], std::string(name) + "[" + std::to_string(i) + "]");
}

}  // namespace

EncodedPrompt encode_prompt(const J& messages, const PromptOptions& options, const J& context) {
  validate_list(messages, "messages");
  const J ctx = context.is_null() ? J::array() : context;
  validate_list(ctx, "context");
  if (options.reasoning_effort < 1 || options.reasoning_effort > 100)
    throw Error("reasoning effort " + std::to_string(options.reasoning_effort) + " is outside 1..100");

  EncodedPrompt result;
  std::vector<J> context_images;  // the context is already in the sequence: its images are not returned
  std::vector<J> ctx_msgs = process_images(ctx, context_images);
  std::vector<J> new_msgs = merge_tool_messages(process_images(messages, result.images));

  // Tool results of the new turns may answer calls made in the context: order them over both.
  std::vector<J> all = ctx_msgs;
  all.insert(all.end(), new_msgs.begin(), new_msgs.end());
  sort_tool_results(all);
  ctx_msgs.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(ctx_msgs.size()));
  new_msgs.assign(all.begin() + static_cast<std::ptrdiff_t>(ctx_msgs.size()), all.end());
  if (!ctx_msgs.empty()) {
    ctx_msgs = merge_tool_messages(ctx_msgs);
    sort_tool_results(ctx_msgs);
  }

  std::vector<J> full = ctx_msgs;
  full.insert(full.end(), new_msgs.begin(), new_msgs.end());

  bool drop = options.drop_thinking;
  for (const J& m : full)
    if (m.contains("tools") && python_truthy(m["tools"])) drop = false;  // tool use keeps its reasoning
  const bool thinking = options.thinking_mode == ThinkingMode::thinking;
  const int last_user = find_last_user_index(full);
  if (thinking && drop) {
    for (int i = 0; i < last_user; ++i)
      if (role_is(full[static_cast<size_t>(i)], "assistant")) full[static_cast<size_t>(i)].erase("reasoning_content");
  }

  if (options.add_bos && ctx_msgs.empty()) result.text += kBos;
  const RenderContext rc{full, last_user, thinking, drop, options.reasoning_effort};
  std::string framed;
  for (size_t i = ctx_msgs.size(); i < full.size(); ++i) framed += render_message(rc, static_cast<int>(i));
  // The frames out, the client text's spans noted (frames may nest: the outermost counts).
  result.text.reserve(result.text.size() + framed.size());
  int depth = 0;
  for (char ch : framed) {
    if (ch == kTextOpen) {
      if (depth++ == 0) result.text_spans.push_back({result.text.size(), result.text.size()});
    } else if (ch == kTextClose) {
      if (--depth == 0) result.text_spans.back().second = result.text.size();
    } else {
      result.text += ch;
    }
  }
  std::erase_if(result.text_spans, [](const auto& sp) { return sp.first == sp.second; });
  return result;
}

int parse_reasoning_effort(std::string_view text) {
  // One set of names for the CLI and the server: OpenAI's medium is the reference's default (high).
  if (text == "low") return 50;
  if (text == "medium" || text == "high") return 75;
  if (text == "max" || text == "xhigh") return 100;
  int v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || v < 1 || v > 100)
    throw Error("reasoning effort '" + std::string(text) + "': use low (50), medium or high (75), max (100) or an integer 1..100");
  return v;
}

int reasoning_effort_from_json(const J& value) {
  if (value.is_string()) {
    const std::string& s = value.get_ref<const std::string&>();
    if (s == "low" || s == "high" || s == "max") return parse_reasoning_effort(s);
  } else if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 1 && v <= 100) return static_cast<int>(v);
  }
  throw Error("reasoning_effort " + value.dump() + ": use \"low\" (50), \"high\" (75), \"max\" (100) or an integer 1..100");
}

ThinkingMode parse_thinking_mode(std::string_view text) {
  if (text == "chat") return ThinkingMode::chat;
  if (text == "thinking") return ThinkingMode::thinking;
  throw Error("thinking mode '" + std::string(text) + "': use chat or thinking");
}

std::vector<PromptCase> load_prompt_cases(const J& file) {
  J cases;
  if (file.is_object()) {
    cases = J::array({file});
  } else if (file.is_array() && !file.empty() && file[0].is_object() && file[0].contains("role")) {
    cases = J::array({J{{"messages", file}}});
  } else if (file.is_array()) {
    cases = file;
  } else {
    throw Error("messages file: expected {\"messages\": [...]}, a message array or an array of cases");
  }
  std::vector<PromptCase> out;
  for (size_t i = 0; i < cases.size(); ++i) {
    const J& c = cases[i];
    const std::string where = "case " + std::to_string(i);
    if (!c.is_object() || !c.contains("messages") || !c["messages"].is_array())
      throw Error(where + ": needs a \"messages\" array");
    PromptCase pc;
    pc.messages = c["messages"];
    if (c.contains("tools")) {
      if (pc.messages.empty()) throw Error(where + ": a case with tools must contain at least one message");
      if (!pc.messages[0].is_object()) throw Error(where + ": messages[0] must be an object");
      pc.messages[0]["tools"] = c["tools"];
    }
    if (has(c, "context")) pc.context = c["context"];
    if (c.contains("thinking_mode") && python_truthy(c["thinking_mode"])) {
      if (!c["thinking_mode"].is_string()) throw Error(where + ": thinking_mode must be \"chat\" or \"thinking\"");
      pc.thinking_mode = parse_thinking_mode(c["thinking_mode"].get<std::string>());
    }
    if (has(c, "reasoning_effort")) pc.reasoning_effort = reasoning_effort_from_json(c["reasoning_effort"]);
    out.push_back(std::move(pc));
  }
  return out;
}

}  // namespace ds41
