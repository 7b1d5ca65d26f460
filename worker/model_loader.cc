#include "worker/model_loader.h"

#include <algorithm>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "common/status_macros.h"
#include "worker/device_constants.h"
#include "worker/zip_archive.h"

namespace mutwo::worker {
namespace {

constexpr char kPickleNotTorchScript[] =
    "this is a torch.save pickle (a pickled module or state dict), not "
    "TorchScript: save the model with torch.jit.script(model).save(path), "
    "or torch.jit.trace(model, example_inputs).save(path) when it does not "
    "script";

}  // namespace

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
         absl::StrContains(text, "not enough memory");
}

absl::StatusOr<torch::jit::Module> LoadModule(const std::string& bytes,
                                              const std::string& what,
                                              const torch::Device& device,
                                              int64_t max_bytes) {
  // A zip archive starts with a local file header and ends with a 22-byte
  // end-of-central-directory record.
  constexpr int64_t kMinZipBytes = 22;
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", what, ": the file is empty"));
  }
  if (static_cast<int64_t>(bytes.size()) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", what, ": ", bytes.size(),
                     " bytes is over the limit of ", max_bytes, " bytes"));
  }
  // torch.save's legacy format is a bare pickle (protocol 2: 0x80 0x02).
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x80 &&
      static_cast<unsigned char>(bytes[1]) <= 5) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", what, ": ", kPickleNotTorchScript));
  }
  if (static_cast<int64_t>(bytes.size()) < kMinZipBytes ||
      bytes.compare(0, 4, "PK\x03\x04") != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", what,
        ": not a TorchScript archive (not a zip file; save it with "
        "torch.jit.script(model).save(path))"));
  }
  // torch::jit::load allocates and inflates every record whole: a few MiB
  // of deflated zeros become GiBs of memory before anything can check
  // them. torch.jit.save stores tensor records uncompressed, so a real
  // model inflates to about its own size.
  const absl::StatusOr<ZipInflation> inflation = ReadZipInflation(bytes);
  if (!inflation.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", what,
                     ": cannot load the TorchScript archive (truncated or "
                     "corrupt?): ",
                     inflation.status().message()));
  }
  if (inflation->has_data_pickle && !inflation->has_code) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", what, ": ", kPickleNotTorchScript));
  }
  const int64_t allowed =
      std::max<int64_t>(kMaxInflationRatio * static_cast<int64_t>(bytes.size()),
                        kMinInflationAllowanceBytes);
  if (inflation->uncompressed_bytes > allowed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", what, ": refused as a zip bomb: the archive inflates to ",
        FormatBytes(inflation->uncompressed_bytes), " from ",
        FormatBytes(static_cast<int64_t>(bytes.size())),
        " (torch.jit.save stores tensors uncompressed, so a model inflates "
        "to about its file size; at most ",
        kMaxInflationRatio, "x or ", FormatBytes(kMinInflationAllowanceBytes),
        " is loaded)"));
  }
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
