// Running the built ds41 binary as a user would: arguments through the shell, stdout captured,
// stderr captured through a temporary file, the exit status decoded.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "test_paths.h"

namespace ds41::test {

struct CommandResult {
  int status = -1;  // exit code; -1 if the command could not start or did not exit normally
  std::string out, err;
};

// `args` is appended to the binary's path as shell words (callers quote what needs quoting).
inline CommandResult run_ds41(const std::string& args) {
  TempDir tmp;
  const std::string err_file = tmp / "stderr";
  const std::string cmd = ds41_binary() + " " + args + " 2>" + err_file;
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream e(err_file);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  return r;
}

}  // namespace ds41::test
