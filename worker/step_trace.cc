#include "worker/step_trace.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <filesystem>
#include <memory>
#include <set>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace mutwo::worker {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

absl::Status TraceStep(const std::string& path, const torch::Device& device,
                       const std::function<absl::Status()>& step,
                       const std::function<void()>& synchronize) {
  std::set<ActivityType> activities{ActivityType::CPU};
  if (device.is_cuda()) activities.insert(ActivityType::CUDA);
  const ProfilerConfig config(ProfilerState::KINETO);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  absl::Status status;
  try {
    status = step();
    synchronize();
  } catch (...) {
    profiler::disableProfiler();
    throw;
  }
  std::unique_ptr<profiler::ProfilerResult> result =
      profiler::disableProfiler();
  if (!status.ok()) return status;
  std::error_code ec;
  const std::filesystem::path parent =
      std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  try {
    result->save(path);
  } catch (const c10::Error& e) {
    const std::string why = e.what_without_backtrace();
    if (why.find("Kineto") != std::string::npos) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this LibTorch was built without the Kineto profiler "
          "(USE_KINETO), so it writes no trace; PyTorch's own builds (pip, "
          "the CUDA LibTorch) have it"));
    }
    return absl::InternalError(
        absl::StrCat("cannot write the step trace ", path, ": ", why));
  }
  if (!std::filesystem::exists(path, ec)) {
    return absl::InternalError(
        absl::StrCat("the profiler wrote no step trace at ", path));
  }
  return absl::OkStatus();
}

absl::Status ProbeStepTrace(const std::string& dir) {
  const std::string path =
      (std::filesystem::path(dir) / ".mutwo-trace-probe.json").string();
  const torch::Device cpu(torch::kCPU);
  const absl::Status status = TraceStep(
      path, cpu,
      []() {
        (void)torch::ones({2}).add(1);
        return absl::OkStatus();
      },
      []() {});
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return status;
}

}  // namespace mutwo::worker
