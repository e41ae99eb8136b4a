#include "text/json_constraint.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "base/error.h"
#include "text/tokenizer.h"

namespace ds41 {

using json = nlohmann::ordered_json;
using Kind = JsonGrammar::Node::Kind;

namespace {

const std::vector<std::string> kTrue = {"true"}, kFalse = {"false"}, kNull = {"null"};

bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

// Keywords that only describe: accepted, nothing to enforce.
bool descriptive(const std::string& k) {
  static const char* names[] = {"title", "description", "$schema", "default", "examples", "additionalProperties",
                                "$comment", "strict", "name"};
  for (const char* n : names)
    if (k == n) return true;
  return false;
}

}  // namespace

// ---- the grammar -------------------------------------------------------------------------------

std::shared_ptr<const JsonGrammar> JsonGrammar::any_object() {
  auto g = std::make_shared<JsonGrammar>();
  Node n;
  n.kind = Kind::Object;
  n.free_keys = true;
  g->nodes_.push_back(n);
  g->measure();
  return g;
}

void JsonGrammar::measure() {
  min_values_.assign(nodes_.size(), std::string());
  measured_.assign(nodes_.size(), 0);
  longest_min_ = 1;
  for (size_t i = 0; i < nodes_.size(); ++i) longest_min_ = std::max(longest_min_, int(measure_node(int(i)).size()));
}

const std::string& JsonGrammar::minimal_value(int node) const {
  static const std::string kAny = "0";
  return node < 0 ? kAny : min_values_[size_t(node)];
}

// The shortest value of a node, from its children's (each measured once; schemas are trees).
const std::string& JsonGrammar::measure_node(int node) {
  if (node < 0 || measured_[size_t(node)]) return minimal_value(node);
  const Node& n = nodes_[size_t(node)];
  std::string v;
  switch (n.kind) {
    case Kind::Any:
    case Kind::Integer:
    case Kind::Number: v = "0"; break;
    case Kind::String: v = "\"\""; break;
    case Kind::Boolean: v = "true"; break;
    case Kind::Null: v = "null"; break;
    case Kind::Array: v = "[]"; break;
    case Kind::Literals:
      v = n.literals[0];
      for (const std::string& l : n.literals)
        if (l.size() < v.size()) v = l;
      break;
    case Kind::Union:
      for (int alt : n.values) {
        const std::string& a = measure_node(alt);
        if (v.empty() || a.size() < v.size()) v = a;
      }
      break;
    case Kind::Object:
      v = "{";
      for (size_t i = 0; i < n.keys.size(); ++i)
        if (n.required[i]) v += (v.size() > 1 ? "," : "") + n.keys[i] + ":" + measure_node(n.values[i]);
      v += "}";
      break;
  }
  measured_[size_t(node)] = 1;
  return min_values_[size_t(node)] = std::move(v);
}

std::shared_ptr<const JsonGrammar> JsonGrammar::from_schema(const json& schema) {
  auto g = std::make_shared<JsonGrammar>();
  g->nodes_.emplace_back();  // the root's slot
  const int root = g->compile(schema, 0);
  g->nodes_[0] = g->nodes_[size_t(root)];
  g->measure();
  return g;
}

int JsonGrammar::compile(const json& s, int depth) {
  if (depth > 32) throw Error("json_schema: nested deeper than 32 levels");
  if (s.is_boolean() && s.get<bool>()) {  // `true`: anything
    nodes_.emplace_back();
    return int(nodes_.size()) - 1;
  }
  if (!s.is_object()) throw Error("json_schema: a schema must be an object (got " + s.dump() + ")");
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (k != "type" && k != "properties" && k != "required" && k != "items" && k != "enum" && k != "const" &&
        k != "anyOf" && !descriptive(k))
      throw Error("json_schema: '" + k + "' is not supported (supported: type, properties, required, items, enum, const, anyOf)");
  }
  Node n;
  if (s.contains("enum") || s.contains("const")) {
    n.kind = Kind::Literals;
    const json values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
    if (!values.is_array() || values.empty()) throw Error("json_schema: 'enum' must be a non-empty array");
    if (values.size() > kMaxAlternatives)
      throw Error("json_schema: 'enum' has " + std::to_string(values.size()) + " values (at most " +
                  std::to_string(kMaxAlternatives) + ")");
    for (const json& v : values) {
      std::string text = v.dump();
      if (std::find(n.literals.begin(), n.literals.end(), text) == n.literals.end()) n.literals.push_back(std::move(text));
    }
    nodes_.push_back(n);
    return int(nodes_.size()) - 1;
  }
  if (s.contains("anyOf")) {
    if (!s["anyOf"].is_array() || s["anyOf"].empty()) throw Error("json_schema: 'anyOf' must be a non-empty array");
    n.kind = Kind::Union;
    for (const json& alt : s["anyOf"]) n.values.push_back(compile(alt, depth + 1));
  } else if (s.contains("type") && s["type"].is_array()) {
    n.kind = Kind::Union;
    for (const json& t : s["type"]) {
      json one = s;
      one["type"] = t;
      n.values.push_back(compile(one, depth + 1));
    }
  } else {
    const std::string type = s.contains("type") ? (s["type"].is_string() ? s["type"].get<std::string>() : "?")
                             : s.contains("properties")                 ? "object"
                             : s.contains("items")                      ? "array"
                                                                        : "";
    if (type == "object") {
      n.kind = Kind::Object;
      if (!s.contains("properties")) {
        n.free_keys = true;
      } else {
        const json& props = s["properties"];
        if (!props.is_object()) throw Error("json_schema: 'properties' must be an object");
        if (props.size() > kMaxAlternatives)
          throw Error("json_schema: an object with " + std::to_string(props.size()) + " properties (at most " +
                      std::to_string(kMaxAlternatives) + ")");
        std::vector<std::string> required;
        if (s.contains("required")) {
          if (!s["required"].is_array()) throw Error("json_schema: 'required' must be an array of names");
          for (const json& r : s["required"])
            if (r.is_string()) required.push_back(r.get<std::string>());
        }
        for (auto it = props.begin(); it != props.end(); ++it) {
          n.keys.push_back(json(it.key()).dump());
          n.required.push_back(std::find(required.begin(), required.end(), it.key()) != required.end());
          n.values.push_back(-1);  // compiled below (nodes_ may move)
        }
        size_t i = 0;
        std::vector<int> values;
        for (auto it = props.begin(); it != props.end(); ++it, ++i) values.push_back(compile(it.value(), depth + 1));
        n.values = values;
      }
    } else if (type == "array") {
      n.kind = Kind::Array;
      if (s.contains("items")) n.items = compile(s["items"], depth + 1);
    } else if (type == "string") {
      n.kind = Kind::String;
    } else if (type == "integer") {
      n.kind = Kind::Integer;
    } else if (type == "number") {
      n.kind = Kind::Number;
    } else if (type == "boolean") {
      n.kind = Kind::Boolean;
    } else if (type == "null") {
      n.kind = Kind::Null;
    } else if (type.empty()) {
      n.kind = Kind::Any;
    } else {
      throw Error("json_schema: unknown type " + s["type"].dump());
    }
  }
  if (n.kind == Kind::Union) {
    // The first byte picks the alternative: two of one kind could not be told apart.
    std::vector<Kind> kinds;
    for (int v : n.values) {
      Kind k = nodes_[size_t(v)].kind;
      if (k == Kind::Integer) k = Kind::Number;
      if (k == Kind::Any || k == Kind::Union || k == Kind::Literals ||
          std::find(kinds.begin(), kinds.end(), k) != kinds.end())
        throw Error("json_schema: anyOf / a type list needs alternatives of different types (object, array, string, "
                    "number, boolean, null)");
      kinds.push_back(k);
    }
  }
  nodes_.push_back(n);
  return int(nodes_.size()) - 1;
}

// ---- the automaton -----------------------------------------------------------------------------

namespace {

// Object phases.
enum : uint8_t { kObjOpen = 0, kObjKey = 1, kObjColon = 2, kObjAfterValue = 3, kObjAfterComma = 4 };
// Array phases.
enum : uint8_t { kArrOpen = 0, kArrAfterValue = 1, kArrAfterComma = 2 };
// String phases: normal, after a backslash, then 4..1 hex digits left (phase = 10 + left).
enum : uint8_t { kStrNormal = 0, kStrEscape = 1, kStrHex = 10 };
// Number phases.
enum : uint8_t { kNumMinus = 1, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };
bool number_accepting(uint8_t p) { return p == kNumZero || p == kNumInt || p == kNumFrac || p == kNumExp; }

enum class Fed { Consumed, Rejected, PopAndRefeed };

}  // namespace

JsonState::JsonState(std::shared_ptr<const JsonGrammar> grammar) : g_(std::move(grammar)) {
  stack_.push_back(Frame{Frame::Kind::Done});
  Frame v;
  v.kind = Frame::Kind::Value;
  v.node = g_->root();
  stack_.push_back(v);
}

bool JsonState::step(std::string_view bytes) {
  for (const char c : bytes)
    if (!step(uint8_t(c))) return false;
  return true;
}

bool JsonState::step(uint8_t byte) {
  for (int guard = 0; guard < 64; ++guard) {
    if (stack_.empty()) return false;
    Frame& f = stack_.back();
    const auto& nodes = g_->nodes();
    switch (f.kind) {
      case Frame::Kind::Done: return false;
      case Frame::Kind::Value: {
        const int node = f.node;
        stack_.pop_back();
        return start_value(node, byte);
      }
      case Frame::Kind::String: {
        if (f.phase == kStrNormal) {
          // Strings are UTF-8 (a JSON parser refuses anything else): multi-byte characters are
          // followed byte by byte, overlong forms and surrogates refused as UTF-8 decoders do.
          if (!f.utf8.at_boundary() || byte >= 0x80) return f.utf8.step(byte);
          if (byte == '"') {
            stack_.pop_back();
            return true;
          }
          if (byte == '\\') f.phase = kStrEscape;
          else if (byte < 0x20) return false;
          return true;
        }
        if (f.phase == kStrEscape) {
          if (byte == 'u') f.phase = kStrHex + 4;
          else if (std::string_view("\"\\/bfnrt").find(char(byte)) != std::string_view::npos) f.phase = kStrNormal;
          else return false;
          return true;
        }
        if (!is_hex(byte)) return false;
        f.phase = f.phase == kStrHex + 1 ? kStrNormal : uint8_t(f.phase - 1);
        return true;
      }
      case Frame::Kind::Number: {
        const uint8_t p = f.phase;
        uint8_t next = 0;
        if (is_digit(byte)) {
          next = p == kNumMinus ? (byte == '0' ? kNumZero : kNumInt)
                 : p == kNumInt  ? kNumInt
                 : p == kNumDot || p == kNumFrac ? kNumFrac
                 : p == kNumE || p == kNumESign || p == kNumExp ? kNumExp
                                                                : 0;
        } else if (byte == '.' && !f.integer && (p == kNumZero || p == kNumInt)) {
          next = kNumDot;
        } else if ((byte == 'e' || byte == 'E') && !f.integer && (p == kNumZero || p == kNumInt || p == kNumFrac)) {
          next = kNumE;
        } else if ((byte == '+' || byte == '-') && p == kNumE) {
          next = kNumESign;
        }
        if (next) {
          // Digits per part bounded (16 integer, 16 fraction, 2 exponent: |x| < 1e116, inside a
          // double): a parser takes every number written, and a model cannot run on in one.
          f.index = next == p ? f.index + 1 : 1;
          const int most = next == kNumExp ? 2 : 16;
          if (is_digit(byte) && f.index > most) return false;
          f.phase = next;
          return true;
        }
        if (!number_accepting(p)) return false;
        stack_.pop_back();
        continue;  // the byte belongs to what follows the number
      }
      case Frame::Kind::Literals: {
        std::vector<uint16_t> alive;
        bool full = false;
        for (uint16_t c : f.alive) {
          const std::string& lit = (*f.list)[c];
          if (size_t(f.index) == lit.size()) full = true;
          else if (uint8_t(lit[size_t(f.index)]) == byte) alive.push_back(c);
        }
        if (!alive.empty()) {
          f.alive = std::move(alive);
          ++f.index;
          // A quoted key (or any literal no other extends) ends with its last byte.
          if (f.alive.size() == 1 && (*f.list)[f.alive[0]].size() == size_t(f.index) &&
              (*f.list)[f.alive[0]].back() == '"') {
            const int matched = f.alive[0];
            stack_.pop_back();
            if (!stack_.empty() && stack_.back().kind == Frame::Kind::Object && stack_.back().phase == kObjKey) {
              Frame& o = stack_.back();
              o.index = matched;  // the property (index into keys)
              o.phase = kObjColon;
            }
          }
          return true;
        }
        if (!full) return false;
        stack_.pop_back();
        continue;
      }
      case Frame::Kind::Object: {
        static const JsonGrammar::Node kFree = [] {
          JsonGrammar::Node o;
          o.kind = Kind::Object;
          o.free_keys = true;
          return o;
        }();
        const JsonGrammar::Node& n = f.free_object ? kFree : nodes[size_t(f.node)];
        if (f.phase == kObjColon) {
          if (byte != ':') return false;
          f.phase = kObjAfterValue;
          Frame v;
          v.kind = Frame::Kind::Value;
          v.node = n.free_keys ? -1 : n.values[size_t(f.index)];
          if (!n.free_keys) f.index += 1;  // properties after this one come next
          stack_.push_back(v);
          return true;
        }
        if (f.phase == kObjAfterValue) {
          if (byte == ',') {
            if (!n.free_keys && size_t(f.index) >= n.keys.size()) return false;
            f.phase = kObjAfterComma;
            return true;
          }
          if (byte != '}') return false;
          if (!n.free_keys)
            for (size_t i = size_t(f.index); i < n.keys.size(); ++i)
              if (n.required[i]) return false;
          stack_.pop_back();
          return true;
        }
        // kObjOpen or kObjAfterComma: a key (or '}' right after '{').
        if (byte == '}' && f.phase == kObjOpen) {
          if (!n.free_keys)
            for (uint8_t r : n.required)
              if (r) return false;
          stack_.pop_back();
          return true;
        }
        if (byte != '"') return false;
        if (n.free_keys) {
          f.phase = kObjColon;
          Frame k;
          k.kind = Frame::Kind::String;
          stack_.push_back(k);
          return true;
        }
        // The keys that may come next: from the next property up to the first required one.
        Frame k;
        k.kind = Frame::Kind::Literals;
        k.list = &n.keys;
        for (size_t i = size_t(f.index); i < n.keys.size(); ++i) {
          k.alive.push_back(uint16_t(i));
          if (n.required[i]) break;
        }
        if (k.alive.empty()) return false;
        k.index = 1;  // the opening quote, just read
        f.phase = kObjKey;
        stack_.push_back(std::move(k));
        return true;
      }
      case Frame::Kind::Array: {
        if (f.phase == kArrAfterValue) {
          if (byte == ',') {
            f.phase = kArrAfterComma;
            return true;
          }
          if (byte != ']') return false;
          stack_.pop_back();
          return true;
        }
        if (byte == ']' && f.phase == kArrOpen) {
          stack_.pop_back();
          return true;
        }
        const int items = f.node >= 0 ? nodes[size_t(f.node)].items : -1;
        f.phase = kArrAfterValue;
        return start_value(items, byte);
      }
    }
  }
  return false;
}

bool JsonState::start_value(int node, uint8_t byte) {
  const auto& nodes = g_->nodes();
  const JsonGrammar::Node* n = node >= 0 ? &nodes[size_t(node)] : nullptr;
  const Kind kind = n ? n->kind : Kind::Any;
  if (kind == Kind::Union) {
    for (int alt : n->values) {
      const Kind k = nodes[size_t(alt)].kind;
      const bool fits = (k == Kind::Object && byte == '{') || (k == Kind::Array && byte == '[') ||
                        (k == Kind::String && byte == '"') || (k == Kind::Boolean && (byte == 't' || byte == 'f')) ||
                        (k == Kind::Null && byte == 'n') ||
                        ((k == Kind::Number || k == Kind::Integer) && (byte == '-' || is_digit(byte)));
      if (fits) return start_value(alt, byte);
    }
    return false;
  }
  Frame f;
  f.node = node;
  if (kind == Kind::Literals) {
    f.kind = Frame::Kind::Literals;
    f.list = &n->literals;
    for (size_t i = 0; i < n->literals.size(); ++i) f.alive.push_back(uint16_t(i));
    stack_.push_back(std::move(f));
    return step(byte);
  }
  const bool any = kind == Kind::Any;
  if (byte == '{' && (any || kind == Kind::Object)) {
    f.kind = Frame::Kind::Object;
    f.free_object = any || n->free_keys;  // an object of anything: any keys, any values
    f.phase = kObjOpen;
    stack_.push_back(f);
    return true;
  }
  if (byte == '[' && (any || kind == Kind::Array)) {
    f.kind = Frame::Kind::Array;
    f.phase = kArrOpen;
    stack_.push_back(f);
    return true;
  }
  if (byte == '"' && (any || kind == Kind::String)) {
    f.kind = Frame::Kind::String;
    stack_.push_back(f);
    return true;
  }
  if ((byte == '-' || is_digit(byte)) && (any || kind == Kind::Number || kind == Kind::Integer)) {
    f.kind = Frame::Kind::Number;
    f.integer = kind == Kind::Integer;
    f.phase = byte == '-' ? kNumMinus : byte == '0' ? kNumZero : kNumInt;
    stack_.push_back(f);
    return true;
  }
  const std::vector<std::string>* lit = nullptr;
  if ((any || kind == Kind::Boolean) && byte == 't') lit = &kTrue;
  if ((any || kind == Kind::Boolean) && byte == 'f') lit = &kFalse;
  if ((any || kind == Kind::Null) && byte == 'n') lit = &kNull;
  if (!lit) return false;
  f.kind = Frame::Kind::Literals;
  f.list = lit;
  f.alive = {0};
  f.index = 1;
  stack_.push_back(std::move(f));
  return true;
}

bool JsonState::complete() const {
  if (stack_.size() == 1) return stack_[0].kind == Frame::Kind::Done;
  if (stack_.size() != 2) return false;
  const Frame& f = stack_.back();
  if (f.kind == Frame::Kind::Number) return number_accepting(f.phase);
  if (f.kind == Frame::Kind::Literals)
    for (uint16_t c : f.alive)
      if ((*f.list)[c].size() == size_t(f.index)) return true;
  return false;
}

void JsonState::completion_of(size_t i, std::string& out) const {
  const Frame& f = stack_[i];
  const auto& nodes = g_->nodes();
  // The properties from `from` on that must still be written, each as ,"key":value.
  const auto rest_of_object = [&](const JsonGrammar::Node& n, size_t from, bool first) {
    std::string s;
    for (size_t k = from; k < n.keys.size(); ++k)
      if (n.required[k]) {
        s += (first ? "" : ",") + n.keys[k] + ":" + g_->minimal_value(n.values[k]);
        first = false;
      }
    return s;
  };
  switch (f.kind) {
    case Frame::Kind::Done: return;
    case Frame::Kind::Value: out += g_->minimal_value(f.node); return;
    case Frame::Kind::String:
      out += f.utf8.completion();  // the rest of a multi-byte character, its smallest valid form
      if (f.phase == kStrEscape) out += "n";
      else if (f.phase > kStrHex) out += std::string(size_t(f.phase - kStrHex), '0');
      out += "\"";
      return;
    case Frame::Kind::Number:
      if (!number_accepting(f.phase)) out += "0";
      return;
    case Frame::Kind::Literals: {
      size_t best = std::string::npos;
      for (uint16_t c : f.alive) {
        const size_t left = (*f.list)[c].size() - size_t(f.index);
        if (best == std::string::npos || left < best) {
          best = left;
          if (left == 0) break;
        }
      }
      for (uint16_t c : f.alive)
        if ((*f.list)[c].size() - size_t(f.index) == best) {
          out += (*f.list)[c].substr(size_t(f.index));
          break;
        }
      return;
    }
    case Frame::Kind::Object: {
      if (f.free_object) {
        if (f.phase == kObjAfterComma) out += "\"\":0";
        else if (f.phase == kObjColon) out += ":0";
        out += "}";
        return;
      }
      const JsonGrammar::Node& n = nodes[size_t(f.node)];
      if (f.phase == kObjOpen) {
        out += rest_of_object(n, 0, true) + "}";
      } else if (f.phase == kObjAfterComma) {
        std::string s = rest_of_object(n, size_t(f.index), true);
        if (s.empty()) s = n.keys[size_t(f.index)] + ":" + g_->minimal_value(n.values[size_t(f.index)]);  // ',' promised one more
        out += s + "}";
      } else if (f.phase == kObjKey) {
        // The key in progress becomes the one that finishes the object shortest (the key frame
        // above wrote the shortest key rest: replaced by this key's).
        const Frame& key = stack_[i + 1];
        size_t chosen = key.alive[0], best = std::string::npos, written = std::string::npos;
        for (uint16_t c : key.alive) {
          const size_t rest = n.keys[c].size() - size_t(key.index);
          written = std::min(written, rest);
          const size_t len = rest + 1 + g_->minimal_value(n.values[c]).size() + rest_of_object(n, size_t(c) + 1, false).size();
          if (len < best) {
            best = len;
            chosen = c;
          }
        }
        out.resize(out.size() - written);
        out += n.keys[chosen].substr(size_t(key.index)) + ":" + g_->minimal_value(n.values[chosen]) +
               rest_of_object(n, chosen + 1, false) + "}";
      } else if (f.phase == kObjColon) {
        out += ":" + g_->minimal_value(n.values[size_t(f.index)]) + rest_of_object(n, size_t(f.index) + 1, false) + "}";
      } else {  // after a value
        out += rest_of_object(n, size_t(f.index), false) + "}";
      }
      return;
    }
    case Frame::Kind::Array:
      if (f.phase == kArrAfterComma) out += g_->minimal_value(f.node >= 0 ? nodes[size_t(f.node)].items : -1);
      out += "]";
      return;
  }
}

size_t JsonState::completion_length() const {
  const auto& nodes = g_->nodes();
  size_t total = 0;
  // Bytes of the required properties from `from` on, each ,"key":value (no comma before the first
  // when `first`).
  const auto rest_len = [&](const JsonGrammar::Node& n, size_t from, bool first) {
    size_t len = 0;
    for (size_t k = from; k < n.keys.size(); ++k)
      if (n.required[k]) {
        len += (first ? 0 : 1) + n.keys[k].size() + 1 + size_t(g_->min_length(n.values[k]));
        first = false;
      }
    return len;
  };
  for (size_t i = stack_.size(); i-- > 0;) {
    const Frame& f = stack_[i];
    switch (f.kind) {
      case Frame::Kind::Done: break;
      case Frame::Kind::Value: total += size_t(g_->min_length(f.node)); break;
      case Frame::Kind::String:
        total += size_t(f.utf8.due) + (f.phase == kStrEscape ? 1 : f.phase > kStrHex ? size_t(f.phase - kStrHex) : 0) + 1;
        break;
      case Frame::Kind::Number: total += number_accepting(f.phase) ? 0 : 1; break;
      case Frame::Kind::Literals: {
        size_t best = std::string::npos;
        for (uint16_t c : f.alive) best = std::min(best, (*f.list)[c].size() - size_t(f.index));
        total += best == std::string::npos ? 0 : best;
        break;
      }
      case Frame::Kind::Object: {
        if (f.free_object) {
          total += f.phase == kObjAfterComma ? 5 : f.phase == kObjColon ? 3 : 1;
          break;
        }
        const JsonGrammar::Node& n = nodes[size_t(f.node)];
        if (f.phase == kObjOpen) {
          total += rest_len(n, 0, true) + 1;
        } else if (f.phase == kObjAfterComma) {
          size_t r = rest_len(n, size_t(f.index), true);
          if (r == 0) r = n.keys[size_t(f.index)].size() + 1 + size_t(g_->min_length(n.values[size_t(f.index)]));
          total += r + 1;
        } else if (f.phase == kObjKey) {
          // The key in progress (its rest counted by the frame above) is the one that finishes
          // the object shortest; its frame counted the shortest key rest: remove that, add this one's.
          const Frame& key = stack_[i + 1];
          size_t best = std::string::npos, key_rest_counted = std::string::npos;
          for (uint16_t c : key.alive) {
            const size_t rest = n.keys[c].size() - size_t(key.index);
            key_rest_counted = std::min(key_rest_counted, rest);
            best = std::min(best, rest + 1 + size_t(g_->min_length(n.values[c])) + rest_len(n, size_t(c) + 1, false) + 1);
          }
          total = total - key_rest_counted + best;
        } else if (f.phase == kObjColon) {
          total += 1 + size_t(g_->min_length(n.values[size_t(f.index)])) + rest_len(n, size_t(f.index) + 1, false) + 1;
        } else {
          total += rest_len(n, size_t(f.index), false) + 1;
        }
        break;
      }
      case Frame::Kind::Array:
        total += (f.phase == kArrAfterComma ? size_t(g_->min_length(f.node >= 0 ? nodes[size_t(f.node)].items : -1)) : 0) + 1;
        break;
    }
  }
  return total;
}

std::string JsonState::shortest_completion() const {
  std::string out;
  for (size_t i = stack_.size(); i-- > 0;) completion_of(i, out);
  return out;
}

std::string JsonState::key() const {
  std::string k;
  for (const Frame& f : stack_) {
    k += char('A' + int(f.kind));
    k += char(f.phase);
    k += std::to_string(f.node) + ":" + std::to_string(f.index) + (f.integer ? "i" : "") + (f.free_object ? "f" : "") + std::to_string(f.utf8.due) + "." + std::to_string(f.utf8.lead);
    for (uint16_t c : f.alive) k += "," + std::to_string(c);
    k += '|';
  }
  return k;
}

// ---- tokens ------------------------------------------------------------------------------------

TokenTrie::TokenTrie(const Tokenizer& tok, int64_t vocab) : vocab_(vocab) {
  nodes_.emplace_back();
  bytes_.resize(size_t(vocab));
  const int64_t n = std::min<int64_t>(vocab, tok.vocab_size());
  for (int64_t id = 0; id < n; ++id) {
    if (tok.is_added(int32_t(id))) continue;  // special tokens never write JSON
    const std::string_view b = tok.token_bytes(int32_t(id));
    if (b.empty()) continue;
    bytes_[size_t(id)] = std::string(b);
    longest_ = std::max<int64_t>(longest_, int64_t(b.size()));
    int node = 0;
    for (const char c : b) {
      auto& ch = nodes_[size_t(node)].children;
      auto it = std::lower_bound(ch.begin(), ch.end(), std::pair<uint8_t, int>{uint8_t(c), -1});
      if (it == ch.end() || it->first != uint8_t(c)) {
        const int fresh = int(nodes_.size());
        it = ch.insert(it, {uint8_t(c), fresh});
        nodes_.emplace_back();  // `ch` may dangle from here: not used again
        node = fresh;
      } else {
        node = it->second;
      }
    }
    nodes_[size_t(node)].tokens.push_back(int32_t(id));
  }
}

std::shared_ptr<TokenConstraint> make_json_constraint(std::shared_ptr<const JsonGrammar> grammar,
                                                      std::shared_ptr<const TokenTrie> trie, int32_t eos) {
  return std::make_shared<AutomatonConstraint<JsonState>>(JsonState(std::move(grammar)), std::move(trie), eos);
}

}  // namespace ds41
