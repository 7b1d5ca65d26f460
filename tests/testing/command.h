// Test helper: run a shell command, capture stdout+stderr and the exit code.
#ifndef MUTWO_TESTS_TESTING_COMMAND_H_
#define MUTWO_TESTS_TESTING_COMMAND_H_

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace mutwo::testing {

struct CommandResult {
  int exit_code = -1;  // -1: did not exit normally
  std::string output;
};

inline CommandResult RunCommand(const std::string& command) {
  CommandResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) {
    r.output.append(buf.data(), n);
  }
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Path of a built binary (build/bin/NAME).
inline std::string BinPath(const std::string& name) {
  return std::string(MUTWO_BIN_DIR) + "/" + name;
}

}  // namespace mutwo::testing

#endif  // MUTWO_TESTS_TESTING_COMMAND_H_
