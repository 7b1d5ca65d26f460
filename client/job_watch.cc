#include "client/job_watch.h"

#include <chrono>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/args.h"
#include "common/grpc_status.h"
#include "common/parse.h"

namespace mutwo {
namespace {

bool IsFinal(v1::Job::State s) {
  return s == v1::Job::SUCCEEDED || s == v1::Job::FAILED ||
         s == v1::Job::CANCELLED;
}

std::string Elapsed(int64_t ms) {
  const int64_t s = ms / 1000;
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm%02ds", s / 3600, (s / 60) % 60, s % 60);
}

bool SameBudget(const v1::MemoryBudget& a, const v1::MemoryBudget& b) {
  if (a.kind_case() != b.kind_case()) return false;
  switch (a.kind_case()) {
    case v1::MemoryBudget::kBytes:
      return a.bytes() == b.bytes();
    case v1::MemoryBudget::kFractionOfBaseline:
      return a.fraction_of_baseline() == b.fraction_of_baseline();
    case v1::MemoryBudget::kFractionOfDevice:
      return a.fraction_of_device() == b.fraction_of_device();
    case v1::MemoryBudget::kKnee:
      return a.knee() == b.knee();
    case v1::MemoryBudget::kFloor:
      return a.floor() == b.floor();
    case v1::MemoryBudget::KIND_NOT_SET:
      break;
  }
  return true;
}

std::string BudgetText(const v1::MemoryBudget& b) {
  return b.text().empty() ? FormatBudget(b) : b.text();
}

}  // namespace

void FollowCancel::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

bool FollowCancel::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool FollowCancel::Attach(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  context_ = context;
  return !cancelled_;
}

std::optional<int64_t> RawTimeLeftMs(const v1::JobEvent& event,
                                     int64_t created_unix_ms) {
  // The time so far per unit of work (a batch size profiled, a budget
  // decided), times the units left.
  const int64_t total = event.batch_sizes_total() + event.budgets_total();
  const int64_t done = event.batch_sizes_profiled() + event.budgets_decided();
  if (created_unix_ms <= 0 || event.unix_ms() <= created_unix_ms || done <= 0 ||
      done >= total || IsFinal(event.state())) {
    return std::nullopt;
  }
  return (event.unix_ms() - created_unix_ms) * (total - done) / done;
}

std::string ProgressLine(const v1::JobEvent& event, int64_t created_unix_ms,
                         std::optional<int64_t> left_ms) {
  const absl::Time at = absl::FromUnixMillis(event.unix_ms());
  std::string line = absl::FormatTime("%H:%M:%S", at, absl::LocalTimeZone());
  if (created_unix_ms > 0 && event.unix_ms() >= created_unix_ms) {
    absl::StrAppend(&line, " +", Elapsed(event.unix_ms() - created_unix_ms));
  }
  absl::StrAppend(&line, "  ",
                  absl::StrFormat("%-10s", v1::Job::State_Name(event.state())));
  if (event.batch_sizes_total() == 0) {
    // A server from before the fixed denominators: its own message.
    absl::StrAppend(&line, "  ", event.message());
    return line;
  }
  absl::StrAppend(&line, "  profiled ", event.batch_sizes_profiled(), "/",
                  event.batch_sizes_total(), " batch sizes");
  // A job without budgets answers the memory question only.
  if (event.budgets_total() > 0) {
    absl::StrAppend(&line, ", ", event.budgets_decided(), "/",
                    event.budgets_total(), " budgets decided");
  }
  if (left_ms.has_value()) {
    absl::StrAppend(&line,
                    *left_ms == kLongerThanEstimated
                        ? ", longer than estimated"
                        : absl::StrCat(", ~", Elapsed(*left_ms), " left"));
  }
  if (!event.running().empty()) {
    absl::StrAppend(&line, "; running ", event.running());
  }
  if (!event.waiting().empty()) {
    absl::StrAppend(&line, "; waiting: ", event.waiting());
  }
  return line;
}

std::string ProgressLine(const v1::JobEvent& event, int64_t created_unix_ms) {
  return ProgressLine(event, created_unix_ms,
                      RawTimeLeftMs(event, created_unix_ms));
}

ProgressPrinter::ProgressPrinter(int64_t created_unix_ms, std::ostream& out)
    : created_unix_ms_(created_unix_ms), out_(out) {}

void ProgressPrinter::Add(const v1::JobEvent& event) {
  // What follows the time stamps; a change of time alone is no news.
  v1::JobEvent timeless = event;
  timeless.set_unix_ms(0);
  const std::string what = ProgressLine(timeless, 0);
  if (what == last_) return;
  // Between one task's report and the next lease the job is in a working
  // state with nothing running; the next event, a moment later, names the
  // next task. Hold that line and print the next in its place (same state
  // and counts), instead of two lines for one step.
  if (held_.has_value()) {
    const bool same_step =
        held_->state() == event.state() &&
        held_->batch_sizes_profiled() == event.batch_sizes_profiled() &&
        held_->budgets_decided() == event.budgets_decided();
    if (!same_step) Print(*held_);
    held_.reset();
  }
  const bool working = event.state() == v1::Job::PROFILING ||
                       event.state() == v1::Job::VALIDATING;
  if (working && event.running().empty() && event.waiting().empty()) {
    held_ = event;
    return;
  }
  Print(event);
}

void ProgressPrinter::Flush() {
  if (held_.has_value()) Print(*held_);
  held_.reset();
}

void ProgressPrinter::Print(const v1::JobEvent& event) {
  v1::JobEvent timeless = event;
  timeless.set_unix_ms(0);
  last_ = ProgressLine(timeless, 0);
  out_ << ProgressLine(event, created_unix_ms_, TimeLeft(event)) << "\n"
       << std::flush;
}

std::optional<int64_t> ProgressPrinter::TimeLeft(const v1::JobEvent& event) {
  std::optional<int64_t> left = RawTimeLeftMs(event, created_unix_ms_);
  if (!left.has_value()) return std::nullopt;
  if (shown_left_ms_.has_value()) {
    // The last estimate, counted down to this event: never shown higher.
    const int64_t counted_down =
        *shown_left_ms_ - (event.unix_ms() - shown_at_unix_ms_);
    if (*left > counted_down) {
      if (counted_down <= 0) {
        // Overrun: say so once; the next line starts a fresh estimate.
        shown_left_ms_.reset();
        return kLongerThanEstimated;
      }
      left = counted_down;
    }
  }
  shown_left_ms_ = *left;
  shown_at_unix_ms_ = event.unix_ms();
  return left;
}

absl::StatusOr<v1::Job> FollowJob(v1::Planner::Stub& stub,
                                  const std::string& job_id,
                                  int64_t created_unix_ms, int timeout_s,
                                  std::ostream& progress,
                                  FollowCancel* cancel) {
  const absl::Status interrupted =
      absl::CancelledError("stopped following the job; it goes on");
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::seconds(timeout_s);
  std::optional<v1::Job> final_job;
  ProgressPrinter printer(created_unix_ms, progress);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    if (cancel != nullptr && !cancel->Attach(&context)) return interrupted;
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    auto reader = stub.WatchJob(&context, request);
    v1::JobEvent event;
    while (reader->Read(&event)) {
      if (event.has_job()) final_job = event.job();
      printer.Add(event);
    }
    printer.Flush();
    grpc::Status status = reader->Finish();
    if (cancel != nullptr) {
      cancel->Attach(nullptr);
      // A job that ended as the user pressed Ctrl-C is reported.
      if (cancel->cancelled() &&
          !(final_job.has_value() && IsFinal(final_job->state()))) {
        return interrupted;
      }
    }
    // Too many watches open: the server says when to come back; come back
    // then if the time allowed lasts that long.
    if (std::optional<int64_t> hint = RetryPushbackMs(context);
        status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
        hint.has_value() &&
        std::chrono::system_clock::now() + std::chrono::milliseconds(*hint) <
            deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(*hint));
      continue;
    }
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    break;
  }
  if (!final_job.has_value() || !IsFinal(final_job->state())) {
    return absl::UnavailableError("the watch ended before the job finished");
  }
  return *final_job;
}

std::vector<std::string> BudgetsFittingNowhere(const v1::Job& job) {
  std::vector<std::string> nowhere;
  for (const v1::MemoryBudget& budget : job.spec().budgets()) {
    bool fits = false;
    for (const v1::BatchResult& r : job.results()) {
      for (const v1::BudgetOutcome& o : r.outcomes()) {
        fits |= o.state() == v1::BudgetOutcome::FITS &&
                SameBudget(o.budget(), budget);
      }
    }
    if (!fits) nowhere.push_back(BudgetText(budget));
  }
  return nowhere;
}

int FinishedJobExitCode(const v1::Job& job, std::ostream& err) {
  if (job.state() != v1::Job::SUCCEEDED) return kExitFailure;
  const std::vector<std::string> nowhere = BudgetsFittingNowhere(job);
  for (const std::string& budget : nowhere) {
    err << "mutwo: job " << job.job_id() << ": budget " << budget
        << " fits at no batch size ("
        << absl::StrJoin(job.spec().batch_sizes(), ", ")
        << "); see the table for why\n";
  }
  return nowhere.empty() ? kExitOk : kExitInfeasible;
}

}  // namespace mutwo
