// What the profiler's instrumented step records, and the peak windows it
// measures them with: per node and per backward step, times, allocated
// bytes and high-water marks. Plain data filled by Profiler::State's
// InterpretedStep and read by its Fill; not thread-safe.
#ifndef MUTWO_WORKER_PROFILER_RECORDS_H_
#define MUTWO_WORKER_PROFILER_RECORDS_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "worker/memory.h"

namespace mutwo::worker {

// Tracks contiguous peak windows: each window's high-water mark goes to its
// sink; the step peak is the maximum over all windows.
class PeakWindows {
 public:
  explicit PeakWindows(DeviceBackend* backend) : backend_(backend) {}
  void Open(std::function<void(int64_t)> sink) {
    Close();
    backend_->ResetPeak();
    sink_ = std::move(sink);
    open_ = true;
  }
  void Close() {
    if (!open_) return;
    const int64_t peak = backend_->PeakBytes();
    step_peak_ = std::max(step_peak_, peak);
    if (sink_) sink_(peak);
    open_ = false;
    sink_ = nullptr;
  }
  int64_t step_peak() const { return step_peak_; }

 private:
  DeviceBackend* backend_;
  std::function<void(int64_t)> sink_;
  bool open_ = false;
  int64_t step_peak_ = 0;
};

struct StepRecord {
  std::string name;
  int forward_node = -1;
  int start_mark = 0;
  int end_mark = 0;
  double ms = 0;
  int64_t allocated_after = 0;
  int64_t peak = 0;
};

// What one interpreted training step measured.
struct IterationRecord {
  std::vector<double> node_ms;
  std::vector<double> node_host_ms;  // host time of each node's run
  std::vector<int64_t> node_allocated_after;
  std::vector<int64_t> node_peak;
  std::vector<int64_t> node_before, node_transient;
  std::vector<StepRecord> steps;
  double forward_ms = 0, loss_ms = 0, backward_ms = 0, optimizer_ms = 0,
         iteration_ms = 0;
  int64_t peak_bytes = 0;
  int64_t loss_peak_bytes = 0;       // high-water mark while the loss ran
  int64_t optimizer_peak_bytes = 0;  // high-water mark of the optimizer step
  int64_t end_of_forward_bytes = 0;
  int64_t start_bytes = 0;  // allocated when the step began (fixed memory)
  std::vector<LiveBlock> live_at_end_of_forward;
  std::vector<FreeEvent> frees;
  // Per node: addresses of the storages of its tensor outputs, and whether
  // every one of them was alive at the end of forward.
  std::vector<std::vector<uintptr_t>> output_storages;
  std::vector<std::vector<int>> output_indices;  // parallel to the above
  std::vector<bool> outputs_alive;
};

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_PROFILER_RECORDS_H_
