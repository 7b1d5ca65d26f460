#include "client/schedule_text.h"

#include <algorithm>
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
// fields (schedules since issue 14), else the profile's node.
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
    double ms = 0;
    for (const v1::Decision* d : recompute) {
      segments = std::max(segments, d->segment() + 1);
      bytes += d->size_bytes();
      ms += d->recompute_ms();
    }
    absl::StrAppendFormat(
        &out, "%srecomputed: %d activations (%s) in %d segments, %.3f ms\n",
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

}  // namespace mutwo
