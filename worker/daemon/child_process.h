// Runs one task in a child process with limits, so a model that crashes,
// hangs or eats memory costs one task and not the worker daemon.
// The child dies with the daemon (PR_SET_PDEATHSIG: SIGKILL when the
// thread that forked it exits, kill -9 of the daemon included; the caller
// must keep that thread alive while the child runs, as RunChild does by
// waiting). The child gets its own process group (killed as a whole), an
// address-space
// limit (RLIMIT_AS, when memory_limit_bytes > 0; not for CUDA, whose driver
// reserves huge virtual ranges) and a wall-clock deadline. stderr goes to a
// file whose tail is returned as the failure reason.
#ifndef MUTWO_WORKER_DAEMON_CHILD_PROCESS_H_
#define MUTWO_WORKER_DAEMON_CHILD_PROCESS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mutwo {

struct ChildLimits {
  int64_t memory_limit_bytes = 0;  // 0: no limit
  int64_t wall_limit_ms = 0;       // 0: no limit
  int64_t poll_interval_ms = 100;
  // Called about every `tick_interval_ms` while the child runs; returning
  // false kills the child (e.g. the lease was lost or the job cancelled).
  std::function<bool()> on_tick;
  int64_t tick_interval_ms = 1000;
};

struct ChildResult {
  int exit_code = -1;       // valid when exited
  bool exited = false;      // normal exit
  int signal = 0;           // terminating signal, when not exited
  bool timed_out = false;   // killed at the wall-clock limit
  bool stopped = false;     // killed because on_tick returned false
  std::string stderr_tail;  // last ~2 KiB of stderr
  double wall_ms = 0;

  // One line for a FailTask reason.
  std::string Describe() const;
};

// The machine's physical memory (sysconf), 0 when unknown.
int64_t PhysicalMemoryBytes();
// Safe limits for a task process when none are given: half the machine's
// memory as its address-space limit (a model that allocates without bound
// fails its task instead of pushing the node into swap or the OOM killer),
// and 10 minutes of wall clock (an endless loop costs minutes per attempt,
// not half an hour). `mutwo-worker serve --task_memory_limit
// --task_time_limit_ms` override them.
ChildLimits DefaultTaskLimits();

// argv[0] is the executable path. stderr_path receives the child's stderr.
[[nodiscard]] absl::StatusOr<ChildResult> RunChild(
    const std::vector<std::string>& argv, const std::string& stderr_path,
    const ChildLimits& limits);

}  // namespace mutwo

#endif  // MUTWO_WORKER_DAEMON_CHILD_PROCESS_H_
