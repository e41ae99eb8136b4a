// `ds41 conform CASE_DIR`: run a golden case from the official reference and print, per block
// and call, the max error against the case and pass/fail against its tolerances.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/thread_pool.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "devtools/conformance.h"

namespace ds41::cli {

int cmd_conform(int argc, char** argv) {
  Args args("conform", "compare the engine with a golden case produced by the official reference",
            "ds41 conform CASE_DIR [--mode teacher|pinned|free] [--out FILE.safetensors] [--json]",
            {{"mode", "MODE", "teacher (block-by-block teacher forcing), pinned (reference decisions replayed) or free", "teacher"},
             {"out", "FILE", "write the engine's tensors under the case's names (streams, pre-mixes, logits, decisions)", ""},
             {"json", "", "print the report as JSON", ""},
             {"backbone-only", "", "check only the backbone tensors (skip the DSpark draft checks of a DSpark case)", ""},
             {"threads", "N", "worker threads (0 = all cores)", "0"}});
  if (!args.parse(argc, argv)) return 0;
  if (args.positional().size() != 1) throw Error("ds41 conform: give exactly one case directory (see --help)");
  ThreadPool pool(resolve_threads(args.get_int("threads", 0)));
  ConformOptions opt;
  opt.mode = args.get_or("mode", "teacher");
  opt.out_path = args.get_or("out", "");
  opt.backbone_only = args.flag("backbone-only");
  ConformReport r = run_conformance(args.positional()[0], opt, &pool);
  if (args.flag("json")) {
    nlohmann::json j;
    j["case"] = r.case_name;
    j["mode"] = r.mode;
    j["ran"] = r.ran;
    j["pass"] = r.pass;
    if (!r.ran) j["skipped_reason"] = r.skipped_reason;
    j["decisions"] = {{"compared", r.decisions_compared}, {"matched", r.decisions_matched}, {"exact_ties", r.decisions_tied}};
    nlohmann::json checks = nlohmann::json::array();
    for (auto& c : r.checks)
      checks.push_back({{"name", c.name}, {"max_abs", c.max_abs}, {"tolerance", c.tolerance}, {"pass", c.pass}, {"note", c.note}});
    j["checks"] = checks;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    for (auto& c : r.checks) {
      if (c.tolerance >= 0)
        std::printf("  %-34s max|diff| %-10.5g tol %-8.4g %s %s\n", c.name.c_str(), c.max_abs, c.tolerance,
                    c.pass ? "ok" : "FAIL", c.note.c_str());
      else
        std::printf("  %-34s %-10.5g (info) %s\n", c.name.c_str(), c.max_abs, c.note.c_str());
    }
    std::printf("%s\n", r.summary().c_str());
  }
  if (!r.ran) return 0;
  return r.pass ? 0 : 1;
}

}  // namespace ds41::cli
