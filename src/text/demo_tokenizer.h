// A tokenizer for the built-in demo model, written as a real tokenizer.json (byte-level BPE, the
// format of the released tokenizer): the 256 byte tokens (ids 3-258, no merges, so a token is a
// byte) and the released special tokens at their ids (begin/end of sentence, User, Assistant,
// think tags, tool markup, the image placeholder). Text in, text out on random weights: it makes
// `-p`, `chat` and `serve` work on the demo without the real tokenizer, not meaningful answers.
#pragma once

#include <string>

namespace ds41 {

// Writes the demo tokenizer.json to `path` (throws ds41::Error when it cannot).
void write_demo_tokenizer(const std::string& path);

}  // namespace ds41
