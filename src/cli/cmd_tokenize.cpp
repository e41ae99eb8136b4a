// `ds41 tokenize`: text -> token ids with the model's tokenizer.json (plus an encode benchmark),
// and `ds41 detokenize`: ids -> text. Both take the model directory (-m DIR, which must hold
// tokenizer.json) or the file itself (--tokenizer FILE).
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_files.h"
#include "text/tokenizer.h"

namespace ds41::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const OptionSpec kModelOption = {"model", "DIR", "model directory; must contain tokenizer.json", ""};
const OptionSpec kTokenizerOption = {"tokenizer", "FILE", "a tokenizer.json file (instead of -m DIR)", ""};

Tokenizer load_tokenizer(const Args& args) {
  const std::string file = args.get_or("tokenizer", "");
  const std::string dir = model_dir_arg(args);
  if (!file.empty() && !dir.empty()) throw Error("give either -m DIR or --tokenizer FILE, not both");
  if (!file.empty()) {
    std::error_code ec;
    if (fs::is_directory(file, ec)) throw Error("--tokenizer " + file + " is a directory; use -m DIR for that");
    return Tokenizer::load(file);
  }
  if (dir.empty()) throw Error("no tokenizer: give -m DIR (a model directory with tokenizer.json) or --tokenizer FILE");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error("-m " + dir + ": not a directory");
  return Tokenizer::load(dir);
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("--file " + path + ": cannot open: " + std::strerror(errno));
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw Error("--file " + path + ": cannot read");
  return data;
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

// Encode throughput on this thread: the first pass with an empty BPE cache (cold), then repeated
// passes (warm) for at least a second. CPU time of the calling thread, so other load on the
// machine does not count against it; wall time is reported beside it.
int run_bench(const Tokenizer& tok, const std::string& text, double load_seconds, bool as_json) {
  if (text.empty()) throw Error("--bench: the text is empty");
  const double c0 = thread_cpu_seconds();
  const auto w0 = std::chrono::steady_clock::now();
  const size_t n_ids = tok.encode(text).size();
  const double cold = thread_cpu_seconds() - c0;
  const double cold_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  int passes = 0;
  const double c1 = thread_cpu_seconds();
  const auto w1 = std::chrono::steady_clock::now();
  while ((thread_cpu_seconds() - c1 < 1.0 || passes < 3) && passes < 1000) {
    if (tok.encode(text).size() != n_ids) throw Error("--bench: encoding the same text gave different lengths");
    ++passes;
  }
  const double warm = (thread_cpu_seconds() - c1) / passes;
  const double warm_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w1).count() / passes;
  const double mb = double(text.size()) / 1e6;
  if (as_json) {
    json j = {{"bytes", text.size()},           {"ids", n_ids},
              {"load_seconds", load_seconds},   {"cold_mb_per_s", mb / cold},
              {"warm_mb_per_s", mb / warm},     {"cold_wall_mb_per_s", mb / cold_wall},
              {"warm_wall_mb_per_s", mb / warm_wall}, {"warm_passes", passes}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%zu bytes -> %zu ids (%.3f bytes/id); tokenizer load %.2f s\n", text.size(), n_ids,
                double(text.size()) / double(std::max<size_t>(n_ids, 1)), load_seconds);
    std::printf("encode, one thread, CPU time: cold %.1f MB/s (empty BPE cache), warm %.1f MB/s (%d passes)\n",
                mb / cold, mb / warm, passes);
    std::printf("                   wall time: cold %.1f MB/s, warm %.1f MB/s\n", mb / cold_wall, mb / warm_wall);
  }
  return 0;
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  Args args("tokenize", "print the token ids of a text",
            "ds41 tokenize -m DIR (-p TEXT | --file F) [--json] [--bench]\n"
            "       ds41 tokenize --tokenizer tokenizer.json -p TEXT",
            {kModelOption, kTokenizerOption,
             {"prompt", "TEXT", "the text (UTF-8); special-token strings in it become their ids", ""},
             {"file", "F", "read the text from a file instead", ""},
             {"bench", "", "measure encode throughput on the text instead of printing ids", ""},
             {"json", "", "print {\"ids\": [...]} (with --bench: the measurements)", ""},
             {"threads", "N", "accepted for symmetry; encoding uses one thread", "0"}});
  if (!args.parse(argc, argv)) return 0;
  resolve_threads(args.get_int("threads", 0));
  const auto prompt = args.get("prompt") ? args.get("prompt") : args.get("p");
  const auto file = args.get("file");
  if (prompt.has_value() == file.has_value()) throw Error("ds41 tokenize: give the text with -p TEXT or --file F (one of them)");
  const auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tok = load_tokenizer(args);
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string text = prompt ? *prompt : read_text_file(*file);
  if (args.flag("bench")) return run_bench(tok, text, load_seconds, args.flag("json"));
  const std::vector<int32_t> ids = tok.encode(text);
  if (args.flag("json")) {
    std::printf("%s\n", json({{"ids", ids}}).dump().c_str());
  } else {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) line += ',';
      line += std::to_string(ids[i]);
    }
    std::printf("%s\n", line.c_str());  // ready for `ds41 run --tokens`
  }
  return 0;
}

int cmd_detokenize(int argc, char** argv) {
  Args args("detokenize", "print the text of token ids",
            "ds41 detokenize -m DIR --tokens 1,2,3 [--skip-special] [--json]",
            {kModelOption, kTokenizerOption,
             {"tokens", "IDS", "comma-separated token ids", ""},
             {"skip-special", "", "leave out special tokens (BOS, EOS, ...)", ""},
             {"json", "", "print {\"text\": \"...\"}", ""},
             {"threads", "N", "accepted for symmetry; decoding uses one thread", "0"}});
  if (!args.parse(argc, argv)) return 0;
  resolve_threads(args.get_int("threads", 0));
  const Tokenizer tok = load_tokenizer(args);
  const auto ids = parse_token_ids(args.get_or("tokens", ""), tok.vocab_size());
  const std::string text = tok.decode(ids, args.flag("skip-special"));
  if (args.flag("json")) {
    std::printf("%s\n", json({{"text", text}}).dump().c_str());
  } else {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
  }
  return 0;
}

}  // namespace ds41::cli
