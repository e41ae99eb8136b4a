// Runs a golden conformance case (../shared/goldens/<case>/, produced by the official reference on
// a small checkpoint) through the engine and compares every recorded tensor with its tolerance
// (see the goldens README and each case.json).
//
// Modes:
//  teacher - block L of every call gets the golden input (stream/pre-mix of block L-1); each
//            block's outputs, the logits and the argmax rule are gated; decisions (indexer top-k,
//            candidate blocks, routed experts) are the engine's own and must equal the
//            reference's, except exact ties (golden margin 0), which are taken from the golden.
//  pinned  - no teacher forcing; the engine replays the reference's decisions end to end and is
//            gated by tolerance.end_to_end_pinned_decisions.
//  free    - the engine's own decisions end to end, ties included; everything before the first
//            exact tie the engine resolves otherwise (a call, or a row of the prefill) is gated
//            by the teacher-forced tolerances, and every untied decision must still agree.
#pragma once

#include <string>
#include <vector>

namespace ds41 {

class ThreadPool;

struct ConformCheck {
  std::string name;     // e.g. "prefill stream.layer3"
  double max_abs = 0;   // observed
  double tolerance = 0; // allowed (< 0: informational only)
  bool pass = true;
  std::string note;
};

struct ConformReport {
  std::string case_name, mode;
  bool ran = false;            // false: skipped (see skipped_reason)
  std::string skipped_reason;
  bool pass = false;
  std::vector<ConformCheck> checks;
  // Decisions (index lists, routed experts): those whose golden margin is not an exact tie are
  // compared; exact ties are counted apart (teacher and pinned take them from the golden).
  int decisions_compared = 0, decisions_matched = 0, decisions_tied = 0;
  std::string summary() const;  // one line
};

struct ConformOptions {
  std::string mode = "teacher";  // teacher | pinned | free
  std::string out_path;          // write the engine's tensors here (same names as expected)
  // Only the backbone checks: a DSpark case's draft-head checks (draft logits, ids, confidences
  // and the main_hidden capture) are left out.
  bool backbone_only = false;
};

ConformReport run_conformance(const std::string& case_dir, const ConformOptions& opt, ThreadPool* pool);

}  // namespace ds41
