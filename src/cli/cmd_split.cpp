// `ds41 split -m DIR --ranks N --rank R --out OUT`: the part of a checkpoint one rank of an
// expert-parallel job reads (model/split_checkpoint.h), for hosts that keep their own copy.
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_files.h"
#include "cli/progress.h"
#include "model/expert_cache.h"
#include "model/split_checkpoint.h"

namespace ds41::cli {

int cmd_split(int argc, char** argv) {
  Args args("split", "write the part of a checkpoint one rank of `mpirun -np N ds41 ...` reads",
            "ds41 split -m DIR --ranks N --rank R --out OUT [--shard-size BYTES] [--json]\n"
            "       (rank 0: every tensor but the other ranks' routed experts; rank R > 0: its routed experts only)",
            {{"model", "DIR", "the whole checkpoint", ""},
             {"ranks", "N", "ranks of the job (mpirun -np N)", ""},
             {"rank", "R", "the rank this copy is for (0 .. N-1)", ""},
             {"out", "DIR", "output directory (created; must not hold a checkpoint)", ""},
             {"shard-size", "BYTES", "maximum bytes per safetensors shard", "5368709120"},
             {"json", "", "print what was written as JSON", ""},
             {"quiet", "", "no progress output", ""}});
  if (!args.parse(argc, argv)) return 0;
  const std::string dir = model_dir_arg(args);
  const auto out = args.get("out");
  if (dir.empty() || !out || !args.get("ranks") || !args.get("rank"))
    throw Error("ds41 split: -m DIR, --ranks N, --rank R and --out OUT are required (see --help)");
  const int64_t ranks = args.get_int("ranks", 0), rank = args.get_int("rank", -1);
  const int64_t shard = args.get_int("shard-size", int64_t(5) << 30);
  if (ranks < 2 || ranks > 4096 || rank < 0 || rank >= ranks)
    throw Error("ds41 split: --ranks must be 2 or more and --rank in 0 .. ranks-1");
  if (shard < (int64_t(1) << 20)) throw Error("ds41 split: --shard-size must be at least 1 MiB");
  const bool quiet = args.flag("quiet") || args.flag("json");
  const auto t0 = std::chrono::steady_clock::now();
  int64_t bytes = 0;
  {
    ProgressBar bar("split");
    bytes = write_split_checkpoint(dir, int(ranks), int(rank), *out, uint64_t(shard), [&](int64_t done, int64_t total) {
      if (!quiet) bar.update("copying tensors (MiB)", done >> 20, total >> 20);
    });
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (args.flag("json")) {
    std::printf("%s\n", nlohmann::json{{"out", *out}, {"ranks", ranks}, {"rank", rank}, {"tensor_bytes", bytes},
                                       {"seconds", seconds}}.dump(2).c_str());
  } else {
    std::fprintf(stderr, "ds41 split: %s: rank %lld of %lld, %s of tensors in %.1f s\n", out->c_str(), (long long)rank,
                 (long long)ranks, format_gib(bytes).c_str(), seconds);
  }
  return 0;
}

}  // namespace ds41::cli
