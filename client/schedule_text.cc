#include "client/schedule_text.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/text_table.h"
#include "common/parse.h"

namespace mutwo {
namespace {

struct NodeNames {
  std::string kind = "?";
  std::string scope;
};

// The module path and op of a decision's producer: the decision's own
// fields (schedules that carry module paths), else the profile's node.
NodeNames NamesOf(const v1::Profile* profile, const v1::Decision& d) {
  NodeNames n;
  if (!d.op_kind().empty()) return {d.op_kind(), d.module_path()};
  const int node = d.producer_node();
  if (profile == nullptr) return n;
  if (node >= 0 && node < profile->nodes_size() &&
      profile->nodes(node).id() == node) {
    n.kind = profile->nodes(node).kind();
    n.scope = profile->nodes(node).scope();
    return n;
  }
  for (const v1::ProfileNode& p : profile->nodes()) {
    if (p.id() == node) return {p.kind(), p.scope()};
  }
  return n;
}

// The producer's output holding the activation; "-" when none does, "?" in a
// schedule from before the field (no op_kind either).
std::string OutputText(const v1::Decision& d) {
  if (d.op_kind().empty()) return "?";
  return d.output_index() >= 0 ? absl::StrCat(d.output_index()) : "-";
}

std::string Indented(const std::string& text, int indent) {
  const std::string pad(indent, ' ');
  std::string out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&out, pad, line, "\n");
  }
  return out;
}

}  // namespace

std::string DecisionsText(const v1::Schedule& s, const v1::Profile* profile,
                          int indent) {
  std::vector<const v1::Decision*> recompute, swap;
  for (const v1::Decision& d : s.decisions()) {
    if (d.action() == v1::Decision::RECOMPUTE) recompute.push_back(&d);
    if (d.action() == v1::Decision::SWAP) swap.push_back(&d);
  }
  const auto by_node = [](const v1::Decision* a, const v1::Decision* b) {
    return std::make_pair(a->producer_node(), a->value_id()) <
           std::make_pair(b->producer_node(), b->value_id());
  };
  std::sort(recompute.begin(), recompute.end(), by_node);
  std::sort(swap.begin(), swap.end(), by_node);
  std::string out;
  const std::string pad(indent, ' ');
  if (!recompute.empty()) {
    int segments = 0;
    int64_t bytes = 0;
    // A decision's recompute_ms is its segment's replay, shared by every
    // decision of the segment: counted once per segment.
    std::map<int, double> segment_ms;
    for (const v1::Decision* d : recompute) {
      segments = std::max(segments, d->segment() + 1);
      bytes += d->size_bytes();
      segment_ms[d->segment()] =
          std::max(segment_ms[d->segment()], d->recompute_ms());
    }
    double ms = 0;
    for (const auto& [segment, segment_replay_ms] : segment_ms) {
      ms += segment_replay_ms;
    }
    if (s.predicted_recompute_ms() > 0) ms = s.predicted_recompute_ms();
    absl::StrAppendFormat(
        &out,
        "%srecomputed: %d activations (%s) in %d segments, %.3f ms (each "
        "segment's replay once; ms below: the decision's segment)\n",
        pad, recompute.size(), FormatBytes(bytes), segments, ms);
    TextTable table({"module", "op", "out", "value", "node", "size", "segment",
                     "replayed before", "ms"},
                    {false, false, true, true, true, true, true, true, true});
    for (const v1::Decision* d : recompute) {
      const NodeNames n = NamesOf(profile, *d);
      table.AddRow({n.scope.empty() ? "(model)" : n.scope, n.kind,
                    OutputText(*d), absl::StrCat(d->value_id()),
                    absl::StrCat(d->producer_node()),
                    FormatBytes(d->size_bytes()), absl::StrCat(d->segment()),
                    absl::StrCat(d->needed_at()),
                    absl::StrFormat("%.3f", d->recompute_ms())});
    }
    absl::StrAppend(&out, Indented(table.Render(), indent + 2));
  }
  if (!swap.empty()) {
    int64_t bytes = 0;
    double stall = 0;
    for (const v1::Decision* d : swap) {
      bytes += d->size_bytes();
      stall += d->stall_ms();
    }
    absl::StrAppendFormat(&out,
                          "%sswapped: %d activations (%s), %.3f ms stalls\n",
                          pad, swap.size(), FormatBytes(bytes), stall);
    TextTable table({"module", "op", "out", "value", "node", "size",
                     "offload after", "prefetch at", "stall ms"},
                    {false, false, true, true, true, true, true, true, true});
    for (const v1::Decision* d : swap) {
      const NodeNames n = NamesOf(profile, *d);
      table.AddRow(
          {n.scope.empty() ? "(model)" : n.scope, n.kind, OutputText(*d),
           absl::StrCat(d->value_id()), absl::StrCat(d->producer_node()),
           FormatBytes(d->size_bytes()), absl::StrCat(d->offload_after()),
           absl::StrCat(d->prefetch_at()),
           absl::StrFormat("%.3f", d->stall_ms())});
    }
    absl::StrAppend(&out, Indented(table.Render(), indent + 2));
  }
  return out;
}

std::string ScheduleText(const v1::Schedule& s, const v1::Profile* profile,
                         const std::string& floor_source, int indent) {
  const std::string pad(indent, ' ');
  const auto percent = [](double value, double base) {
    return base > 0 ? absl::StrFormat("%+.1f%%", (value / base - 1) * 100)
                    : std::string("-");
  };
  std::string out;
  absl::StrAppend(
      &out, pad, "budget          ",
      s.budget().text().empty() ? FormatBudget(s.budget()) : s.budget().text(),
      " = ", FormatBytes(s.budget_bytes()));
  if (s.floor_bytes() > 0) {
    absl::StrAppend(&out, "; floor ", FormatBytes(s.floor_bytes()),
                    " (the lowest budget that fits",
                    floor_source.empty() ? "" : "; ", floor_source, ")");
  }
  // Refused: the plan below is the floor's (the lowest the policy reaches),
  // not one for this budget, and its decisions are no answer to it.
  absl::StrAppend(&out, "\n", pad, "feasible        ",
                  s.feasible() ? "yes"
                  : s.budget_bytes() < s.floor_bytes()
                      ? "NO: the budget is below the floor; the peak and "
                        "time below are the floor's plan"
                      : "NO: planned below the floor (the note says why); the "
                        "peak and time below are the floor's plan",
                  "\n");
  absl::StrAppend(&out, pad, "peak            baseline ",
                  FormatBytes(s.baseline_peak_bytes()), " -> planned ",
                  FormatBytes(s.predicted_peak_bytes()), " (",
                  percent(static_cast<double>(s.predicted_peak_bytes()),
                          static_cast<double>(s.baseline_peak_bytes())),
                  s.peak_position() > 0
                      ? absl::StrCat(", at position ", s.peak_position(),
                                     " of the step's timeline")
                      : "",
                  ")\n");
  absl::StrAppend(
      &out, pad,
      absl::StrFormat(
          "iteration       baseline %.3f ms -> planned %.3f ms (%s: "
          "recompute %.3f ms, stalls %.3f ms)\n",
          s.baseline_iteration_ms(), s.predicted_iteration_ms(),
          percent(s.predicted_iteration_ms(), s.baseline_iteration_ms()),
          s.predicted_recompute_ms(), s.predicted_stall_ms()));
  int segments = 0;
  for (const v1::Decision& d : s.decisions()) {
    if (d.action() == v1::Decision::RECOMPUTE) {
      segments = std::max(segments, d.segment() + 1);
    }
  }
  absl::StrAppend(&out, pad, "decisions       ", s.recomputed(), " recompute (",
                  segments, " segments), ", s.swapped(), " swap, ",
                  s.decisions_size() - s.recomputed() - s.swapped(),
                  " retain\n");
  if (!s.reason().empty())
    absl::StrAppend(&out, pad, "note            ", s.reason(), "\n");
  if (s.feasible()) {
    absl::StrAppend(&out, DecisionsText(s, profile, indent));
  } else if (s.recomputed() + s.swapped() > 0) {
    absl::StrAppend(&out, pad,
                    "(the floor's decisions are listed for a budget at or "
                    "above the floor, e.g. --budget floor)\n");
  }
  if (s.pareto_size() > 0) {
    absl::StrAppend(&out, pad,
                    "pareto (budget -> planned peak, step time; the first "
                    "budget is the floor):\n");
    // The point this schedule is, so that a budget can be found on the
    // curve; its figure is repeated only where the row lists the point by
    // another budget (a schedule planned before the rows were listed by
    // the budget that plans them, or a budget between two points).
    bool marked = false;
    for (const v1::ParetoPoint& p : s.pareto()) {
      const bool this_one =
          !marked && s.feasible() &&
          p.predicted_peak_bytes() == s.predicted_peak_bytes() &&
          std::abs(p.predicted_iteration_ms() - s.predicted_iteration_ms()) <
              5e-4;
      marked = marked || this_one;
      absl::StrAppend(
          &out, pad,
          absl::StrFormat(
              "  budget %12s -> %12s  %10.3f ms  %7s  (%d "
              "recompute, %d swap)%s\n",
              FormatBytes(p.budget_bytes()),
              FormatBytes(p.predicted_peak_bytes()), p.predicted_iteration_ms(),
              percent(p.predicted_iteration_ms(), s.baseline_iteration_ms()),
              p.recomputed(), p.swapped(),
              this_one
                  ? absl::StrCat(
                        "  <- this schedule (budget ",
                        s.budget().text().empty() ? FormatBudget(s.budget())
                                                  : s.budget().text(),
                        p.budget_bytes() == s.budget_bytes()
                            ? ""
                            : absl::StrCat(" = ",
                                           FormatBytes(s.budget_bytes())),
                        ")")
                  : ""));
    }
  }
  return out;
}

}  // namespace mutwo
