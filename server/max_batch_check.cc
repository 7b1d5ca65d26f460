#include "server/max_batch_check.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/parse.h"

namespace mutwo {

std::string WhyNotVerified(const v1::JobSpec& spec,
                           const v1::DeviceInfo& device) {
  if (absl::AsciiStrToLower(device.kind()) == "cuda" || spec.has_capacity()) {
    return "";
  }
  return absl::StrCat(
      "on the ", device.kind().empty() ? "host" : device.kind(),
      " the capacity defaults to 95% of the machine's memory, too much to "
      "run a step at; submit with --capacity to verify by execution");
}

v1::MaxBatchCheck QueuedCheck(int64_t batch_size, int64_t capacity_bytes) {
  v1::MaxBatchCheck c;
  c.set_state(v1::MaxBatchCheck::VERIFYING);
  c.set_predicted_batch_size(batch_size);
  c.set_batch_size(batch_size);
  c.set_capacity_bytes(capacity_bytes);
  return c;
}

v1::MaxBatchCheck UnverifiedCheck(int64_t batch_size, int64_t capacity_bytes,
                                  const std::string& reason) {
  v1::MaxBatchCheck c;
  c.set_state(v1::MaxBatchCheck::NOT_VERIFIED);
  c.set_predicted_batch_size(batch_size);
  c.set_batch_size(batch_size);
  c.set_capacity_bytes(capacity_bytes);
  c.set_reason(reason);
  return c;
}

MaxBatchStep JudgeMaxBatchStep(const v1::MaxBatchCheck& check,
                               const v1::Validation& validation,
                               const MaxBatchCheckOptions& options) {
  MaxBatchStep step;
  step.check = check;
  v1::MaxBatchCheck& c = step.check;
  const int64_t batch = c.batch_size();
  const int64_t capacity = c.capacity_bytes();
  const int64_t measured = validation.scheduled().peak_bytes();
  c.set_rounds(c.rounds() + 1);
  c.set_oom(validation.oom());
  c.set_measured_peak_bytes(validation.oom() ? 0 : measured);
  c.clear_reason();
  if (!validation.oom() && !validation.error().empty()) {
    c.set_state(v1::MaxBatchCheck::FAILED);
    c.set_reason(absl::StrCat("the step at batch ", batch,
                              " failed: ", validation.error()));
    step.next = MaxBatchStep::Next::kFailed;
    return step;
  }
  const bool fits = !validation.oom() && measured <= capacity;
  const std::string moved =
      batch != c.predicted_batch_size()
          ? absl::StrCat(" (stepped down from the prediction ",
                         c.predicted_batch_size(), ")")
          : "";
  if (fits) {
    c.set_state(v1::MaxBatchCheck::VERIFIED);
    c.set_reason(absl::StrCat("measured ", FormatBytes(measured), " at batch ",
                              batch, " <= capacity ", FormatBytes(capacity),
                              moved));
    step.next = MaxBatchStep::Next::kVerified;
    return step;
  }
  const std::string what =
      validation.oom()
          ? absl::StrCat("batch ", batch, " ran out of memory")
          : absl::StrCat("batch ", batch, " measured ", FormatBytes(measured),
                         " > capacity ", FormatBytes(capacity));
  if (c.rounds() >= options.max_rounds || batch <= 1) {
    c.set_state(v1::MaxBatchCheck::FAILED);
    c.set_reason(absl::StrCat(what, moved, " after ", c.rounds(),
                              c.rounds() == 1 ? " step" : " steps"));
    step.next = MaxBatchStep::Next::kFailed;
    return step;
  }
  // Memory grows about linearly with the batch size: scale by what was
  // measured, 2% under; out of memory (no figure) a quarter down.
  double next = validation.oom() || measured <= 0
                    ? 0.75 * static_cast<double>(batch)
                    : 0.98 * static_cast<double>(batch) *
                          static_cast<double>(capacity) /
                          static_cast<double>(measured);
  step.next_batch =
      std::clamp<int64_t>(static_cast<int64_t>(std::floor(next)), 1, batch - 1);
  step.next = MaxBatchStep::Next::kStepDown;
  c.set_state(v1::MaxBatchCheck::VERIFYING);
  c.set_batch_size(step.next_batch);
  c.set_reason(absl::StrCat(what, "; stepped down to ", step.next_batch));
  return step;
}

v1::MaxBatchCheck* CheckForTask(v1::MaxBatchPrediction& prediction,
                                const v1::Task& task) {
  const bool unmodified = task.schedule().policy() == v1::NONE;
  v1::MaxBatchCheck* c = unmodified
                             ? prediction.mutable_without_checkpointing_check()
                             : prediction.mutable_with_schedule_check();
  if (c->state() != v1::MaxBatchCheck::VERIFYING ||
      c->batch_size() != task.batch_size()) {
    return nullptr;
  }
  return c;
}

}  // namespace mutwo
