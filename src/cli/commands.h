// Entry points of the `ds41` subcommands. Each takes argv starting at the subcommand name and
// returns the process exit code; errors are thrown as ds41::Error and printed by main().
#pragma once

namespace ds41::cli {

int cmd_inspect(int argc, char** argv);
int cmd_mkmodel(int argc, char** argv);
int cmd_conform(int argc, char** argv);
int cmd_run(int argc, char** argv);
int cmd_dump(int argc, char** argv);
int cmd_engram(int argc, char** argv);
int cmd_prompt(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_detokenize(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_prefill_compare(int argc, char** argv);
int cmd_split(int argc, char** argv);

}  // namespace ds41::cli
