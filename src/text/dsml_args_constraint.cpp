#include "text/dsml_args_constraint.h"

#include <algorithm>

#include "base/error.h"
#include "text/dsml_tokens.h"

namespace ds41 {

using json = nlohmann::ordered_json;

namespace {

const std::string kParamHead = std::string(dsml::kParamOpen) + " name=\"";
const std::string kClose = std::string(dsml::kParamClose) + "\n";
const std::string kEnd = std::string(dsml::kInvokeClose) + ">\n" + std::string(dsml::kCallsClose);
const std::string kNewline = "\n";

}  // namespace

std::shared_ptr<const DsmlArgsSchema> DsmlArgsSchema::from_parameters(const json& parameters) {
  auto out = std::make_shared<DsmlArgsSchema>();
  if (!parameters.is_object()) throw Error("the function's parameters must be a JSON schema object");
  if (parameters.contains("type") && parameters["type"] != json("object"))
    throw Error("the function's parameters must be an object schema (type \"object\")");
  // The whole object schema through the JSON grammar's checks (every keyword, `properties` an
  // object within the bound, `required` an array of names), as response_format schemas are.
  JsonGrammar::from_schema(parameters);
  if (!parameters.contains("properties")) return out;  // no parameters
  const json& props = parameters["properties"];
  std::vector<std::string> required;
  if (parameters.contains("required"))
    for (const json& r : parameters["required"])
      if (r.is_string()) required.push_back(r.get<std::string>());
  for (auto it = props.begin(); it != props.end(); ++it) {
    if (it.key().find('"') != std::string::npos || it.key().find('<') != std::string::npos)
      throw Error("parameter name " + json(it.key()).dump() + " cannot be written in DSML");
    Param p;
    p.name = it.key();
    p.is_string = it.value().is_object() && it.value().value("type", json()) == json("string") &&
                  !it.value().contains("enum") && !it.value().contains("const");
    p.required = std::find(required.begin(), required.end(), p.name) != required.end();
    auto grammar = JsonGrammar::from_schema(it.value());  // every keyword checked, string values too
    if (!p.is_string) p.value = grammar;
    p.head = p.name + "\" string=\"" + (p.is_string ? "true" : "false") + "\">";
    p.minimal = kParamHead + p.head + (p.is_string ? std::string() : p.value->minimal_value(p.value->root())) + kClose;
    out->growth += int64_t(p.minimal.size());
    out->params.push_back(std::move(p));
  }
  out->growth += int64_t(kEnd.size());
  return out;
}

DsmlArgsState::DsmlArgsState(std::shared_ptr<const DsmlArgsSchema> schema) : s_(std::move(schema)) {
  written_.assign(s_->params.size(), 0);
  enter(Phase::Head);
}

void DsmlArgsState::enter(Phase p) {
  phase_ = p;
  index_ = 0;
  candidates_.clear();
  alive_.clear();
  if (p == Phase::Head) {
    bool open = false, all_required = true;
    for (size_t i = 0; i < s_->params.size(); ++i) {
      open = open || !written_[i];
      all_required = all_required && (written_[i] || !s_->params[i].required);
    }
    if (open) candidates_.push_back(&kParamHead);
    if (all_required) candidates_.push_back(&kEnd);
  } else if (p == Phase::Name) {
    for (size_t i = 0; i < s_->params.size(); ++i)
      candidates_.push_back(written_[i] ? nullptr : &s_->params[i].head);  // index = parameter
  } else if (p == Phase::Close) {
    candidates_.push_back(&kClose);
  }
  for (size_t i = 0; i < candidates_.size(); ++i)
    if (candidates_[i]) alive_.push_back(uint16_t(i));
}

bool DsmlArgsState::step(std::string_view bytes) {
  for (const char c : bytes)
    if (!step(uint8_t(c))) return false;
  return true;
}

bool DsmlArgsState::step(uint8_t byte) {
  switch (phase_) {
    case Phase::Done: return false;
    case Phase::Head:
    case Phase::Name:
    case Phase::Close: {
      std::vector<uint16_t> alive;
      for (uint16_t c : alive_)
        if (index_ < candidates_[c]->size() && uint8_t((*candidates_[c])[index_]) == byte) alive.push_back(c);
      if (alive.empty()) return false;
      alive_ = std::move(alive);
      ++index_;
      // The literals of a phase are prefix-free: the one that is whole decides.
      if (alive_.size() != 1 || candidates_[alive_[0]]->size() != index_) return true;
      const std::string& done = *candidates_[alive_[0]];
      if (phase_ == Phase::Close) {
        enter(Phase::Head);
      } else if (phase_ == Phase::Head) {
        if (done == kEnd) {
          phase_ = Phase::Done;
        } else {
          enter(Phase::Name);
        }
      } else {  // Name: the parameter chosen
        current_ = alive_[0];
        written_[size_t(current_)] = 1;
        const DsmlArgsSchema::Param& p = s_->params[size_t(current_)];
        phase_ = p.is_string ? Phase::Text : Phase::Json;
        index_ = 0;
        utf8_ = Utf8Stepper{};
        if (!p.is_string) json_ = std::make_shared<JsonState>(p.value);
      }
      return true;
    }
    case Phase::Text: {
      // Well-formed UTF-8 throughout, the closing tag's bytes included (a mismatch inside its
      // "｜" must not leave half a character).
      if (!utf8_.step(byte)) return false;
      // The closing tag ends the text ('<' does not occur inside the tag: a mismatch restarts at 0 or 1).
      const std::string_view tag = dsml::kParamClose;
      if (byte == uint8_t(tag[index_])) {
        if (++index_ == tag.size()) {
          enter(Phase::Close);
          candidates_ = {&kNewline};
        }
        return true;
      }
      index_ = byte == '<' ? 1 : 0;
      return true;
    }
    case Phase::Json: {
      JsonState next = *json_;
      if (next.step(byte)) {
        json_ = std::make_shared<JsonState>(std::move(next));
        return true;
      }
      if (!json_->complete()) return false;
      json_.reset();
      enter(Phase::Close);
      return step(byte);
    }
  }
  return false;
}

bool DsmlArgsState::plain_byte(uint8_t byte) const {
  if (phase_ == Phase::Json) return json_->plain_byte(byte);  // inside a JSON string of a value
  return phase_ == Phase::Text && utf8_.at_boundary() && index_ == 0 && byte != '<' && byte < 0x80 &&
         (byte >= 0x20 || byte == '\n' || byte == '\t');
}

int64_t DsmlArgsState::growth() const { return s_->growth + int64_t(kEnd.size()); }

std::string DsmlArgsState::rest_after(const std::vector<uint8_t>& written) const {
  std::string out;
  for (size_t i = 0; i < s_->params.size(); ++i)
    if (s_->params[i].required && !written[i]) out += s_->params[i].minimal;
  return out + kEnd;
}

size_t DsmlArgsState::rest_after_length(const std::vector<uint8_t>& written, int also) const {
  size_t n = kEnd.size();
  for (size_t i = 0; i < s_->params.size(); ++i)
    if (s_->params[i].required && !written[i] && int(i) != also) n += s_->params[i].minimal.size();
  return n;
}

// shortest_completion().size() without building it (the token walks ask it for every token).
size_t DsmlArgsState::completion_length() const {
  switch (phase_) {
    case Phase::Done: return 0;
    case Phase::Close: return candidates_[0]->size() - index_ + rest_after_length(written_);
    case Phase::Text:  // inside the closing tag its rest finishes the character too
      return size_t(index_ > 0 ? 0 : utf8_.due) + dsml::kParamClose.size() - index_ + 1 + rest_after_length(written_);
    case Phase::Json: return json_->completion_length() + kClose.size() + rest_after_length(written_);
    case Phase::Head:
    case Phase::Name: return shortest_completion().size();  // few tokens take these phases' paths
  }
  return 0;
}

std::string DsmlArgsState::shortest_completion() const {
  switch (phase_) {
    case Phase::Done: return "";
    case Phase::Close: return candidates_[0]->substr(index_) + rest_after(written_);
    case Phase::Text:
      return (index_ > 0 ? std::string() : utf8_.completion()) + std::string(dsml::kParamClose).substr(index_) + "\n" +
             rest_after(written_);
    case Phase::Json: return json_->shortest_completion() + kClose + rest_after(written_);
    case Phase::Head: {
      // The end if it is alive; else the parameter head, then the first required parameter left.
      std::string best;
      for (uint16_t c : alive_) {
        std::string option;
        if (candidates_[c] == &kEnd) {
          option = kEnd.substr(index_);
        } else {
          size_t pick = s_->params.size();
          for (size_t i = 0; i < s_->params.size() && pick == s_->params.size(); ++i)
            if (!written_[i] && s_->params[i].required) pick = i;
          for (size_t i = 0; i < s_->params.size() && pick == s_->params.size(); ++i)
            if (!written_[i]) pick = i;
          std::vector<uint8_t> w = written_;
          w[pick] = 1;
          option = s_->params[pick].minimal.substr(index_) + rest_after(w);
        }
        if (best.empty() || option.size() < best.size()) best = std::move(option);
      }
      return best;
    }
    case Phase::Name: {
      std::string best;
      for (uint16_t c : alive_) {
        std::vector<uint8_t> w = written_;
        w[c] = 1;
        std::string option = s_->params[c].minimal.substr(kParamHead.size() + index_) + rest_after(w);
        if (best.empty() || option.size() < best.size()) best = std::move(option);
      }
      return best;
    }
  }
  return "";
}

std::string DsmlArgsState::key() const {
  std::string k(1, char('A' + int(phase_)));
  k += std::to_string(index_) + ":" + std::to_string(current_) + ":" + std::to_string(utf8_.due) + ":" +
       std::to_string(utf8_.lead) + ":";
  for (uint8_t w : written_) k += char('0' + w);
  for (uint16_t a : alive_) k += "," + std::to_string(a);
  if (json_) k += "|" + json_->key();
  return k;
}

std::shared_ptr<const DsmlToolSet> DsmlToolSet::from_tools(const json& tools) {
  auto out = std::make_shared<DsmlToolSet>();
  for (const json& t : tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const std::string name = t["function"].value("name", "");
    if (name.empty() || name.find('"') != std::string::npos) throw Error("a tool name cannot be written in DSML");
    const json params = t["function"].contains("parameters") ? t["function"]["parameters"] : json::object();
    out->tools.push_back({std::string(dsml::kInvokeOpen) + " name=\"" + name + "\">\n", DsmlArgsSchema::from_parameters(params)});
  }
  if (out->tools.empty()) throw Error("tool_choice required: no tools");
  if (out->tools.size() > kMaxAlternatives)
    throw Error(std::to_string(out->tools.size()) + " tools (at most " + std::to_string(kMaxAlternatives) + ")");
  return out;
}

DsmlCallState::DsmlCallState(std::shared_ptr<const DsmlToolSet> tools) : t_(std::move(tools)) {
  for (size_t i = 0; i < t_->tools.size(); ++i) alive_.push_back(uint16_t(i));
}

bool DsmlCallState::step(std::string_view bytes) {
  for (const char c : bytes)
    if (!step(uint8_t(c))) return false;
  return true;
}

bool DsmlCallState::step(uint8_t byte) {
  if (args_) return args_->step(byte);
  std::vector<uint16_t> alive;
  for (uint16_t c : alive_) {
    const std::string& h = t_->tools[c].header;
    if (index_ < h.size() && uint8_t(h[index_]) == byte) alive.push_back(c);
  }
  if (alive.empty()) return false;
  alive_ = std::move(alive);
  ++index_;
  // Headers end with `">\n`: the one that is whole is the only one left.
  if (alive_.size() == 1 && t_->tools[alive_[0]].header.size() == index_) args_.emplace(t_->tools[alive_[0]].args);
  return true;
}

std::string DsmlCallState::shortest_completion() const {
  if (args_) return args_->shortest_completion();
  std::string best;
  for (uint16_t c : alive_) {
    std::string option = t_->tools[c].header.substr(index_) + DsmlArgsState(t_->tools[c].args).shortest_completion();
    if (best.empty() || option.size() < best.size()) best = std::move(option);
  }
  return best;
}

std::string DsmlCallState::key() const {
  if (args_) return "A" + std::to_string(alive_.empty() ? -1 : alive_[0]) + args_->key();
  std::string k = "H" + std::to_string(index_);
  for (uint16_t a : alive_) k += "," + std::to_string(a);
  return k;
}

int64_t DsmlCallState::growth() const {
  int64_t most = 0;
  for (const auto& t : t_->tools) most = std::max<int64_t>(most, int64_t(t.header.size()) + t.args->growth);
  return most + 64;
}

std::shared_ptr<TokenConstraint> make_dsml_call_constraint(std::shared_ptr<const DsmlToolSet> tools,
                                                           std::shared_ptr<const TokenTrie> trie, int32_t eos) {
  return std::make_shared<AutomatonConstraint<DsmlCallState>>(DsmlCallState(std::move(tools)), std::move(trie), eos);
}

std::shared_ptr<TokenConstraint> make_dsml_args_constraint(std::shared_ptr<const DsmlArgsSchema> schema,
                                                           std::shared_ptr<const TokenTrie> trie, int32_t eos) {
  return std::make_shared<AutomatonConstraint<DsmlArgsState>>(DsmlArgsState(std::move(schema)), std::move(trie), eos);
}

}  // namespace ds41
