#include "client/plot_render.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace mutwo {
namespace {

// Exit codes of mutwo_plot.py.
constexpr int kScriptBadInput = 2;
constexpr int kScriptNoMatplotlib = 3;
constexpr int kExecFailed = 127;

bool IsFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string SelfDirectory() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// Runs argv; returns its exit code (kExecFailed when it could not start).
int Run(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return kExecFailed;
  if (pid == 0) {
    execvp(args[0], args.data());
    _exit(kExecFailed);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return kExecFailed;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace

absl::StatusOr<std::string> FindPlotScript() {
  if (const char* env = std::getenv("MUTWO_PLOT_SCRIPT");
      env != nullptr && *env != '\0') {
    if (IsFile(env)) return std::string(env);
    return absl::NotFoundError(
        absl::StrCat("MUTWO_PLOT_SCRIPT=", env, ": no such file"));
  }
  const std::string candidate =
      absl::StrCat(SelfDirectory(), "/../share/mutwo/mutwo_plot.py");
  if (IsFile(candidate)) return candidate;
  return absl::NotFoundError(absl::StrCat(
      "the plot renderer mutwo_plot.py is not at ", candidate,
      " (installed next to the mutwo binary); set MUTWO_PLOT_SCRIPT to "
      "client/plot/mutwo_plot.py of the source tree"));
}

absl::Status RenderPlot(const std::string& json, const std::string& out_path,
                        const std::vector<std::string>& extra_args) {
  auto script = FindPlotScript();
  if (!script.ok()) return script.status();
  const char* tmpdir = std::getenv("TMPDIR");
  std::string data_path =
      absl::StrCat(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp",
                   "/mutwo-plot-XXXXXX.json");
  const int fd = mkstemps(data_path.data(), 5);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create a temporary file: ", std::strerror(errno)));
  }
  close(fd);
  {
    std::ofstream out(data_path, std::ios::binary | std::ios::trunc);
    out << json;
    if (!out) {
      std::remove(data_path.c_str());
      return absl::InternalError(
          absl::StrCat("cannot write ", data_path, ": ", std::strerror(errno)));
    }
  }
  std::vector<std::string> pythons;
  if (const char* env = std::getenv("MUTWO_PYTHON");
      env != nullptr && *env != '\0') {
    pythons = {env};
  } else {
    pythons = {"python3", "/usr/bin/python3"};
  }
  int code = kExecFailed;
  for (const std::string& python : pythons) {
    std::vector<std::string> argv = {python, *script, data_path, out_path};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    code = Run(argv);
    if (code != kScriptNoMatplotlib && code != kExecFailed) break;
  }
  std::remove(data_path.c_str());
  if (code == 0) return absl::OkStatus();
  if (code == kScriptNoMatplotlib || code == kExecFailed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rendering needs Python 3 with matplotlib (tried ",
        pythons.size() == 1 ? pythons[0] : "python3 and /usr/bin/python3",
        "): install it (Debian: apt install python3-matplotlib) or set "
        "MUTWO_PYTHON; or write the plot data with -o FILE.json and render "
        "it elsewhere with mutwo_plot.py"));
  }
  if (code == kScriptBadInput) {
    return absl::InvalidArgumentError(
        absl::StrCat("the renderer refused the plot (", *script, ")"));
  }
  return absl::InternalError(
      absl::StrCat(*script, " exited with status ", code));
}

}  // namespace mutwo
