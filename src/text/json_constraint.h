// Structured output: the answer forced to be JSON (an object, or a value of a JSON schema) at the
// token level. A byte-level pushdown automaton follows the answer as it is generated; before each
// token is chosen, every token whose bytes the automaton cannot take is given -inf (the token
// mask, found by walking a trie of the vocabulary's byte strings with the automaton). The
// end-of-sequence token is allowed only once the document is complete, and then alone.
//
// The JSON written is compact (no whitespace between tokens). Schemas: `type` (object, array,
// string, integer, number, boolean, null, or a list of them), `properties` (written in the
// schema's order; those not in `required` may be left out), `items`, `enum` and `const`;
// `additionalProperties`, `title`, `description`, `$schema` and `strict`-mode details are
// accepted and do not change the automaton (only the listed properties are written); any other
// keyword is refused with an error naming it, rather than silently not enforced.
//
// A token budget: a token is allowed only if the document can still be completed after it within
// the tokens left (one byte a token at worst, and the end of sequence); once the shortest
// completion takes all that is left, it is written with its longest tokens. So an answer cut by
// max_tokens is still a complete document, when max_tokens is at least the shortest document's
// bytes + 1 (a budget below that ends with finish_reason "length" and an incomplete document).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/token_constraint.h"
#include "text/utf8.h"

namespace ds41 {

// Most values of an enum, properties of an object or tools of a request a constraint takes (the
// automata index them in 16 bits; a schema beyond is refused, not truncated).
inline constexpr size_t kMaxAlternatives = 4096;

// A compiled schema: the tree of nodes the automaton walks.
class JsonGrammar {
 public:
  // Any JSON object (response_format json_object).
  static std::shared_ptr<const JsonGrammar> any_object();
  // A JSON schema (ordered: properties are written in the schema's order); throws ds41::Error
  // naming what is not supported.
  static std::shared_ptr<const JsonGrammar> from_schema(const nlohmann::ordered_json& schema);

  struct Node {
    enum class Kind { Any, Object, Array, String, Integer, Number, Boolean, Null, Union, Literals };
    Kind kind = Kind::Any;
    std::vector<std::string> keys;      // Object: the properties, in order (quoted JSON strings)
    std::vector<int> values;            // Object: each property's node; Union: the alternatives
    std::vector<uint8_t> required;      // Object: per property
    bool free_keys = false;             // Object: any keys with Any values (no properties given)
    int items = -1;                     // Array: the items' node (-1: Any)
    std::vector<std::string> literals;  // Literals: the compact JSON texts allowed (enum, const)
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  int root() const { return 0; }
  // Each node's shortest value (node < 0: any value), its length, and the longest of them.
  const std::string& minimal_value(int node) const;
  int min_length(int node) const { return int(minimal_value(node).size()); }
  int longest_min_length() const { return longest_min_; }

 private:
  int compile(const nlohmann::ordered_json& schema, int depth);
  void measure();  // fills min_values_
  const std::string& measure_node(int node);
  std::vector<Node> nodes_;
  std::vector<std::string> min_values_;
  std::vector<uint8_t> measured_;
  int longest_min_ = 1;
};

// Where the answer is in the document.
class JsonState {
 public:
  explicit JsonState(std::shared_ptr<const JsonGrammar> grammar);
  // Takes one byte; false (and the state unusable) when the document cannot continue with it.
  bool step(uint8_t byte);
  bool step(std::string_view bytes);
  bool complete() const;  // a whole document has been written
  // The shortest bytes that complete the document from here, and their count (cheap).
  std::string shortest_completion() const;
  size_t completion_length() const;
  // A compact key of the state (equal keys: the same future).
  std::string key() const;
  // Inside a string, between characters, not after a backslash: a plain ASCII byte changes nothing.
  bool in_plain_string() const {
    return !stack_.empty() && stack_.back().kind == Frame::Kind::String && stack_.back().phase == 0 &&
           stack_.back().utf8.at_boundary();
  }
  // Whether `byte` leaves the state as it is (the token walks skip copying it then).
  bool plain_byte(uint8_t byte) const {
    return byte >= 0x20 && byte < 0x80 && byte != '"' && byte != '\\' && in_plain_string();
  }
  // How much one token's structure can add to the completion beyond its own bytes.
  int64_t growth() const { return g_->longest_min_length() + 8; }

  struct Frame {
    enum class Kind : uint8_t { Value, Object, Array, String, Number, Literals, Done } kind = Kind::Value;
    uint8_t phase = 0;
    int node = -1;
    int index = 0;               // Object: the next property; Literals: bytes matched
    std::vector<uint16_t> alive; // Literals: candidates still matching (indices into the literal list)
    const std::vector<std::string>* list = nullptr;  // Literals: the candidates
    bool integer = false;        // Number
    bool free_object = false;    // Object: any keys, any values
    Utf8Stepper utf8;            // String: the character being read
  };

 private:
  bool feed(uint8_t byte);
  bool start_value(int node, uint8_t byte);
  void completion_of(size_t frame, std::string& out) const;
  std::shared_ptr<const JsonGrammar> g_;
  std::vector<Frame> stack_;
};

// What a request's tokens may be for structured output: any JSON object, or a schema's document.
std::shared_ptr<TokenConstraint> make_json_constraint(std::shared_ptr<const JsonGrammar> grammar,
                                                      std::shared_ptr<const TokenTrie> trie, int32_t eos);

}  // namespace ds41
