#include "worker/daemon/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace mutwo {
namespace {

constexpr size_t kTailBytes = 2048;

std::string ReadTail(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string all = ss.str();
  if (all.size() > kTailBytes) all = all.substr(all.size() - kTailBytes);
  return std::string(absl::StripAsciiWhitespace(all));
}

}  // namespace

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_bytes <= 0) return 0;
  return static_cast<int64_t>(pages) * page_bytes;
}

ChildLimits DefaultTaskLimits() {
  ChildLimits limits;
  limits.memory_limit_bytes = PhysicalMemoryBytes() / 2;
  limits.wall_limit_ms = 10 * 60 * 1000;
  return limits;
}

std::string ChildResult::Describe() const {
  std::string what;
  if (timed_out) {
    what = absl::StrCat("task process exceeded its time limit (", wall_ms,
                        " ms) and was killed");
  } else if (stopped) {
    what = "task process stopped: lease lost or job cancelled";
  } else if (!exited) {
    what = absl::StrCat("task process killed by signal ", signal, " (",
                        strsignal(signal), ")");
  } else {
    what = absl::StrCat("task process exited with code ", exit_code);
  }
  if (!stderr_tail.empty()) {
    // Keep the last line: it names the error (the worker prints one line).
    std::string tail = stderr_tail;
    const size_t nl = tail.rfind('\n');
    if (nl != std::string::npos) tail = tail.substr(nl + 1);
    absl::StrAppend(&what, ": ", tail);
  }
  return what;
}

absl::StatusOr<ChildResult> RunChild(const std::vector<std::string>& argv,
                                     const std::string& stderr_path,
                                     const ChildLimits& limits) {
  if (argv.empty()) return absl::InvalidArgumentError("RunChild: empty argv");
  std::vector<char*> cargv;
  for (const std::string& a : argv)
    cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Child: dies with the daemon (even kill -9 of it: the kernel sends
    // SIGKILL when the parent thread exits), own process group, limits,
    // stderr to the file, then exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // the daemon died before prctl
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (limits.memory_limit_bytes > 0) {
      struct rlimit rl;
      rl.rlim_cur = rl.rlim_max =
          static_cast<rlim_t>(limits.memory_limit_bytes);
      setrlimit(RLIMIT_AS, &rl);
    }
    const int fd =
        open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    const int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, STDIN_FILENO);
      dup2(devnull, STDOUT_FILENO);
      close(devnull);
    }
    execv(cargv[0], cargv.data());
    const std::string msg =
        absl::StrCat("exec ", argv[0], ": ", std::strerror(errno), "\n");
    (void)!write(STDERR_FILENO, msg.data(), msg.size());
    _exit(127);
  }
  setpgid(pid, pid);
  ChildResult result;
  auto last_tick = start;
  int status = 0;
  while (true) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("waitpid: ", std::strerror(errno)));
    }
    const auto now = std::chrono::steady_clock::now();
    const int64_t elapsed_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - start)
            .count();
    bool kill_now = false;
    if (limits.wall_limit_ms > 0 && elapsed_ms > limits.wall_limit_ms) {
      result.timed_out = kill_now = true;
    } else if (limits.on_tick &&
               now - last_tick >=
                   std::chrono::milliseconds(limits.tick_interval_ms)) {
      last_tick = now;
      if (!limits.on_tick()) result.stopped = kill_now = true;
    }
    if (kill_now) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(
        std::chrono::milliseconds(limits.poll_interval_ms));
  }
  result.wall_ms = std::chrono::duration<double, std::milli>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  if (WIFEXITED(status)) {
    result.exited = true;
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  // Leave no grandchildren behind.
  kill(-pid, SIGKILL);
  result.stderr_tail = ReadTail(stderr_path);
  return result;
}

}  // namespace mutwo
