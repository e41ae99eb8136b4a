// ds41: command-line entry point. Dispatches to the subcommands; every error reaches the user as
// one message on stderr and a non-zero exit code.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "base/error.h"
#include "cli/commands.h"
#include "dist/mpi_job.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};

const Command kCommands[] = {
    {"run", ds41::cli::cmd_run, "generate tokens (default: the built-in demo model)"},
    {"dump", ds41::cli::cmd_dump, "write every block's stream and all logits after a prefill"},
    {"inspect", ds41::cli::cmd_inspect, "describe a checkpoint or config (layer plan, tensors, KV bytes, validation)"},
    {"mkmodel", ds41::cli::cmd_mkmodel, "write a random-weight checkpoint in the released layout"},
    {"engram", ds41::cli::cmd_engram, "print the Engram hash rows of a sequence"},
    {"prompt", ds41::cli::cmd_prompt, "print the prompt text of an OpenAI-style conversation"},
    {"chat", ds41::cli::cmd_chat, "talk with the model in the terminal"},
    {"serve", ds41::cli::cmd_serve, "serve an OpenAI- and Anthropic-compatible HTTP API"},
    {"tokenize", ds41::cli::cmd_tokenize, "print the token ids of a text (tokenizer.json)"},
    {"detokenize", ds41::cli::cmd_detokenize, "print the text of token ids"},
    {"conform", ds41::cli::cmd_conform, "compare the engine with a golden case from the official reference"},
    {"bench", ds41::cli::cmd_bench, "measure bandwidth, FMA peak, prefill/decode speed and their efficiencies"},
    {"split", ds41::cli::cmd_split, "write the part of a checkpoint one rank of an MPI job reads (per-host copies)"},
    {"bench-prefill", ds41::cli::cmd_prefill_compare, "compare full and CED prefill (speed, next-token divergence)"},
};

void print_usage(FILE* f) {
  std::fprintf(f, "ds41 %s - inference engine for DeepSeek-V4.1-Flash\n\nusage: ds41 COMMAND [options]\n\ncommands:\n",
               DS41_VERSION);
  for (const Command& c : kCommands) std::fprintf(f, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(f, "\nRun 'ds41 COMMAND --help' for the options of a command.\n");
  // Switches for speed comparisons and tuning; none changes a result (docs/performance.md,
  // docs/memory.md). An unknown value is an error.
  std::fprintf(f,
               "\nenvironment:\n"
               "  DS41_SIMD=scalar|avx2|avx2vnni|avx512|avx512vbmi|amx|auto\n"
               "                      CPU kernel level (default auto: the best this CPU runs; a level it\n"
               "                      cannot run gives the best one below it)\n"
               "  DS41_SUBNORMAL_INPUTS=slow|fast|auto\n"
               "                      whether fp32 subnormal inputs are slow here (auto: unless AMD)\n"
               "  DS41_DECODE_COPIES=auto|fp8|none\n"
               "                      which lane-ordered weight copies load makes for the decode kernels\n"
               "  DS41_EXPERT_POLICY=frequency|lru\n"
               "                      which routed experts a disk-streamed model keeps in memory\n"
               "  DS41_EXPERT_PREFETCH=on|off\n"
               "                      read a disk-streamed model's likely next experts ahead\n");
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun: the follower ranks serve rank 0 here until the job ends (dist/mpi_job.h).
  if (const int follower_status = ds41::dist::start_job(argc, argv); follower_status >= 0) return follower_status;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("ds41 %s\n", DS41_VERSION);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    try {
      return c.run(argc - 1, argv + 1);
    } catch (const ds41::Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "error: out of memory\n");
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: internal: %s\n", e.what());
      return 70;
    }
  }
  std::fprintf(stderr, "ds41: unknown command '%s'\n\n", argv[1]);
  print_usage(stderr);
  return 2;
}
