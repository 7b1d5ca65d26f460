#include "server/training_loop.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/parse.h"
#include "common/validation_check.h"
#include "server/closed_loop.h"

namespace mutwo {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("report.", field, ": ", why));
}

bool SameBudgetKind(const v1::MemoryBudget& a, const v1::MemoryBudget& b) {
  v1::MemoryBudget x = a, y = b;
  x.clear_text();
  y.clear_text();
  return x.SerializeAsString() == y.SerializeAsString();
}

absl::Status CheckStats(const v1::StepStats& s, absl::string_view field) {
  if (s.peak_bytes() < 0) {
    return Bad(absl::StrCat(field, ".peak_bytes"),
               absl::StrCat(s.peak_bytes(), " is negative"));
  }
  if (!std::isfinite(s.iteration_ms()) || s.iteration_ms() < 0) {
    return Bad(absl::StrCat(field, ".iteration_ms"),
               absl::StrCat(s.iteration_ms(), " is not a time"));
  }
  return absl::OkStatus();
}

absl::Status CheckShape(const v1::TrainingLoopValidation& report) {
  if (report.path() == v1::TrainingLoopValidation::PATH_UNSPECIFIED) {
    return Bad("path", "not set; say EAGER, COMPILE or LIBTORCH");
  }
  if (report.budget().kind_case() == v1::MemoryBudget::KIND_NOT_SET) {
    return Bad("budget", "not set; the job's budget the schedule is for");
  }
  const v1::Validation& v = report.validation();
  if (v.batch_size() <= 0) {
    return Bad("validation.batch_size",
               absl::StrCat(v.batch_size(), " is not a batch size"));
  }
  if (report.decisions_planned() < 0 || report.decisions_applied() < 0 ||
      report.decisions_applied() > report.decisions_planned()) {
    return Bad("decisions_applied",
               absl::StrCat(report.decisions_applied(), " of ",
                            report.decisions_planned(),
                            " planned: must be between 0 and the planned"));
  }
  if (absl::Status s = CheckStats(v.baseline(), "validation.baseline");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckStats(v.scheduled(), "validation.scheduled");
      !s.ok()) {
    return s;
  }
  if (!v.oom() && v.scheduled().peak_bytes() == 0) {
    return Bad("validation.scheduled.peak_bytes",
               "0: the scheduled step's peak was not measured");
  }
  return absl::OkStatus();
}

std::string Budgets(const v1::BatchResult& r) {
  std::vector<std::string> names;
  for (const v1::BudgetOutcome& o : r.outcomes()) {
    names.push_back(o.budget().text().empty() ? FormatBudget(o.budget())
                                              : o.budget().text());
  }
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

}  // namespace

int64_t TrainingLoopCorrection(const v1::Schedule& ran,
                               const v1::TrainingLoopValidation& report,
                               double margin_fraction) {
  const v1::Validation& v = report.validation();
  const ValidationCheck check = CheckValidation(v);
  if (report.holds() || check.out_of_memory || check.within_budget ||
      !check.matches_baseline || !v.error().empty() ||
      report.decisions_applied() < report.decisions_planned()) {
    return 0;
  }
  return CorrectionAfter(ran, v.scheduled().peak_bytes(), margin_fraction);
}

absl::StatusOr<v1::BudgetOutcome> AddTrainingLoopReport(
    v1::Job& job, v1::TrainingLoopValidation& report, v1::Schedule* ran) {
  if (absl::Status s = CheckShape(report); !s.ok()) return s;
  const v1::Validation& v = report.validation();
  v1::BatchResult* result = nullptr;
  std::vector<std::string> sizes;
  for (v1::BatchResult& r : *job.mutable_results()) {
    sizes.push_back(absl::StrCat(r.batch_size()));
    if (r.batch_size() == v.batch_size()) result = &r;
  }
  if (result == nullptr) {
    return Bad(
        "validation.batch_size",
        absl::StrCat("job ", job.job_id(), " has no result at batch size ",
                     v.batch_size(), " (it has ",
                     sizes.empty() ? "none yet" : absl::StrJoin(sizes, ", "),
                     ")"));
  }
  const std::string budget_text = report.budget().text().empty()
                                      ? FormatBudget(report.budget())
                                      : report.budget().text();
  int index = -1;
  for (int i = 0; i < result->outcomes_size(); ++i) {
    if (SameBudgetKind(result->outcomes(i).budget(), report.budget())) {
      index = i;
    }
  }
  if (index < 0 || index >= result->schedules_size()) {
    return Bad("budget",
               absl::StrCat("job ", job.job_id(), " has no budget \"",
                            budget_text, "\" at batch size ", v.batch_size(),
                            " (its budgets: ", Budgets(*result), ")"));
  }
  const v1::Schedule& schedule = result->schedules(index);
  if (ran != nullptr) *ran = schedule;
  if (!schedule.graph_fingerprint().empty() &&
      v.graph_fingerprint() != schedule.graph_fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "report.validation.graph_fingerprint \"", v.graph_fingerprint(),
        "\" is not the graph of the job's schedule for budget \"", budget_text,
        "\" at batch size ", v.batch_size(), " (\"",
        schedule.graph_fingerprint(), "\"): a schedule of another model"));
  }
  if (v.budget_bytes() != schedule.budget_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "report.validation.budget_bytes ", v.budget_bytes(),
        " is not the budget of the job's schedule for \"", budget_text,
        "\" at batch size ", v.batch_size(), " (", schedule.budget_bytes(),
        " B = ", FormatBytes(schedule.budget_bytes()),
        "); fetch the schedule again (GetSchedule) and measure it"));
  }
  // The verdict: the worker's rules (common/validation_check.h) on the
  // measured figures, and every decision applied.
  std::vector<std::string> problems;
  if (const ValidationCheck check = CheckValidation(v); !check.ok()) {
    problems.push_back(check.problem);
  }
  if (!v.error().empty() && !v.oom()) problems.push_back(v.error());
  if (report.decisions_applied() < report.decisions_planned()) {
    problems.push_back(absl::StrCat(
        report.decisions_planned() - report.decisions_applied(), " of ",
        report.decisions_planned(), " decisions not applied"));
  }
  report.set_holds(problems.empty());
  report.set_problem(absl::StrJoin(problems, "; "));
  report.mutable_validation()->set_within_budget(
      !v.oom() && v.scheduled().peak_bytes() <= v.budget_bytes());

  v1::BudgetOutcome& outcome = *result->mutable_outcomes(index);
  outcome.set_validated_in_training_loop(report.holds());
  outcome.set_training_loop_peak_bytes(
      report.validation().oom() ? 0 : v.scheduled().peak_bytes());
  outcome.set_training_loop_reports(outcome.training_loop_reports() + 1);
  *result->add_training_loop() = report;
  auto* kept = result->mutable_training_loop();
  if (kept->size() > kTrainingLoopReportsKept) {
    kept->DeleteSubrange(0, kept->size() - kTrainingLoopReportsKept);
  }
  return outcome;
}

}  // namespace mutwo
