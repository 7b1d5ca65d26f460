// The worker's task child process: it dies with the daemon (kill
// -9 of the daemon included: PR_SET_PDEATHSIG), its process group is killed
// at the time limit, and a memory bomb ends at the address-space limit with
// a reason. Real processes (sh, sleep, python3), no LibTorch.
#include "worker/daemon/child_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) /
          absl::StrCat("child_", ::getpid(), "_", name))
      .string();
}

bool Alive(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  // "pid (comm) S ...": a zombie (Z) or dead (X) process is not running.
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() &&
         line[close + 2] != 'Z' && line[close + 2] != 'X';
}

TEST(ChildProcessTest, TaskProcessDiesWhenTheDaemonIsKilled) {
  const std::string pid_file = TempPath("pid");
  std::filesystem::remove(pid_file);
  const pid_t daemon = ::fork();
  ASSERT_GE(daemon, 0);
  if (daemon == 0) {
    // The "daemon": runs one endless task and is killed -9 meanwhile.
    ChildLimits limits;
    (void)RunChild({"/bin/sh", "-c",
                    absl::StrCat("echo $$ > ", pid_file, "; exec sleep 600")},
                   TempPath("stderr"), limits);
    ::_exit(0);
  }
  pid_t task = 0;
  for (int i = 0; i < 200 && task == 0; ++i) {
    std::ifstream in(pid_file);
    if (!(in >> task)) task = 0;
    if (task == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(task, 0) << "the task process never started";
  ASSERT_TRUE(Alive(task));
  ASSERT_EQ(::kill(daemon, SIGKILL), 0);
  ASSERT_EQ(::waitpid(daemon, nullptr, 0), daemon);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = !Alive(task);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << "task process " << task << " outlived its daemon";
  if (!gone) ::kill(task, SIGKILL);
}

TEST(ChildProcessTest, EndlessTaskIsKilledWithItsGroupAtTheTimeLimit) {
  const std::string pid_file = TempPath("grandchild");
  std::filesystem::remove(pid_file);
  ChildLimits limits;
  limits.wall_limit_ms = 300;
  limits.poll_interval_ms = 20;
  // An endless loop that also forked a helper: both must go.
  auto result = RunChild({"/bin/sh", "-c",
                          absl::StrCat("sleep 600 & echo $! > ", pid_file,
                                       "; while true; do :; done")},
                         TempPath("stderr2"), limits);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->timed_out);
  EXPECT_LT(result->wall_ms, 2000);
  EXPECT_THAT(result->Describe(), HasSubstr("time limit"));
  pid_t helper = 0;
  std::ifstream in(pid_file);
  ASSERT_TRUE(in >> helper);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(Alive(helper)) << "the task's own child outlived it";
}

TEST(ChildProcessTest, MemoryBombEndsAtTheMemoryLimitWithAReason) {
  ChildLimits limits;
  limits.memory_limit_bytes = int64_t{512} << 20;
  limits.wall_limit_ms = 20000;
  limits.poll_interval_ms = 20;
  auto result = RunChild({"/usr/bin/python3", "-c", "x = bytearray(4 << 30)"},
                         TempPath("stderr3"), limits);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->exited && result->exit_code == 0);
  EXPECT_FALSE(result->timed_out);
  EXPECT_THAT(result->Describe(), HasSubstr("MemoryError"));
}

TEST(ChildProcessTest, DefaultLimitsComeFromTheMachine) {
  const ChildLimits limits = DefaultTaskLimits();
  EXPECT_GT(limits.memory_limit_bytes, int64_t{256} << 20);
  EXPECT_LT(limits.memory_limit_bytes, PhysicalMemoryBytes());
  EXPECT_GT(limits.wall_limit_ms, 0);
  EXPECT_LE(limits.wall_limit_ms, 30 * 60 * 1000);
}

}  // namespace
}  // namespace mutwo
