#include "server/device_wait.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace mutwo {
namespace {

bool Live(const v1::WorkerInfo& w) {
  return w.state() == v1::WorkerInfo::IDLE || w.state() == v1::WorkerInfo::BUSY;
}

bool Serves(const v1::WorkerInfo& w, const std::string& kind) {
  return kind.empty() || absl::AsciiStrToLower(w.device().kind()) == kind;
}

}  // namespace

std::string DeviceKindLabel(absl::string_view device_kind) {
  return device_kind.empty() ? "any" : absl::AsciiStrToLower(device_kind);
}

std::string DeviceWaitReason(absl::string_view device_kind,
                             const std::vector<v1::WorkerInfo>& workers) {
  const std::string kind = absl::AsciiStrToLower(device_kind);
  int registered = 0;
  for (const v1::WorkerInfo& w : workers) {
    if (!Serves(w, kind)) continue;
    if (Live(w)) return "";
    ++registered;
  }
  const std::string what = kind.empty() ? "" : kind + " ";
  if (registered == 0) return absl::StrCat("no ", what, "worker registered");
  return absl::StrCat("no live ", what, "worker (", registered,
                      " registered, all lost: missed heartbeats)");
}

std::map<std::string, int64_t> JobsWaitingForDevice(
    const std::map<std::string, int64_t>& queued_jobs_by_device_kind,
    const std::vector<v1::WorkerInfo>& workers) {
  std::map<std::string, int64_t> waiting = {
      {"cpu", 0}, {"cuda", 0}, {"any", 0}};
  for (const auto& [kind, jobs] : queued_jobs_by_device_kind) {
    if (!DeviceWaitReason(kind, workers).empty()) {
      waiting[DeviceKindLabel(kind)] += jobs;
    }
  }
  return waiting;
}

}  // namespace mutwo
