#include "worker/model_loader.h"

#include <algorithm>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/model_archive.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "common/status_macros.h"
#include "worker/device_constants.h"

namespace mutwo::worker {

std::string FirstLine(const std::string& text) {
  absl::string_view view = absl::StripAsciiWhitespace(text);
  // TorchScript's interpreter errors start with a generic sentence and a
  // traceback; the cause is the last "...Error: ..." line.
  if (absl::StartsWith(view, "The following operation failed")) {
    const size_t error = view.rfind("Error: ");
    if (error != absl::string_view::npos) {
      const size_t line_start = view.rfind('\n', error);
      view = view.substr(
          line_start == absl::string_view::npos ? 0 : line_start + 1);
    }
  }
  const size_t newline = view.find('\n');
  if (newline != absl::string_view::npos) view = view.substr(0, newline);
  return std::string(absl::StripAsciiWhitespace(view));
}

bool IsOutOfMemoryMessage(const std::string& text) {
  return absl::StrContains(text, "out of memory") ||
         absl::StrContains(text, "not enough memory") ||
         absl::StrContains(text, "_STATUS_ALLOC_FAILED");
}

absl::StatusOr<torch::jit::Module> LoadModule(const std::string& bytes,
                                              const std::string& what,
                                              const torch::Device& device,
                                              int64_t max_bytes) {
  if (static_cast<int64_t>(bytes.size()) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", what, ": ", bytes.size(),
                     " bytes is over the limit of ", max_bytes, " bytes"));
  }
  // Empty, a pickle, no zip, a corrupt directory or a zip bomb: refused as
  // mutwo-server refuses it at submit (common/model_archive.h), before
  // torch::jit::load allocates every record whole.
  MUTWO_RETURN_IF_ERROR(CheckModelArchive(bytes, what));
  torch::jit::Module module;
  try {
    std::istringstream stream(bytes);
    module = torch::jit::load(stream, device);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", what,
                     ": cannot load the TorchScript archive "
                     "(truncated or corrupt?): ",
                     FirstLine(e.msg())));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", what,
                     ": cannot load the TorchScript archive "
                     "(truncated or corrupt?): ",
                     FirstLine(e.what())));
  }
  if (!module.find_method("forward").has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", what, ": the module has no forward method"));
  }
  const RetargetedDevices moved = RetargetDeviceConstants(module, device);
  if (moved.constants > 0) {
    MUTWO_LOG(info,
              "model {}: {} device constant(s) naming {} now name {} (a "
              "torch.jit.trace records the device it traced on)",
              what, moved.constants, absl::StrJoin(moved.from, ", "),
              device.str());
  }
  if (moved.shape_constants > 0) {
    MUTWO_LOG(info,
              "model {}: {} number(s) of a trace's shape arithmetic stay on "
              "the CPU with the shapes",
              what, moved.shape_constants);
  }
  module.train();
  return module;
}

absl::StatusOr<torch::jit::Module> LoadModuleFile(const std::string& path,
                                                  const torch::Device& device,
                                                  int64_t max_bytes) {
  auto bytes = ReadFile(path, max_bytes);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", path, ": ", bytes.status().message()));
  }
  return LoadModule(*bytes, path, device, max_bytes);
}

}  // namespace mutwo::worker
