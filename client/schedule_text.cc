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

NodeNames NamesOf(const v1::Profile* profile, int node) {
  NodeNames n;
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
    TextTable table({"value", "node", "op", "scope", "size", "segment",
                     "replayed before", "ms"},
                    {true, true, false, false, true, true, true, true});
    for (const v1::Decision* d : recompute) {
      const NodeNames n = NamesOf(profile, d->producer_node());
      table.AddRow({absl::StrCat(d->value_id()),
                    absl::StrCat(d->producer_node()), n.kind, n.scope,
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
    TextTable table({"value", "node", "op", "scope", "size", "offload after",
                     "prefetch at", "stall ms"},
                    {true, true, false, false, true, true, true, true});
    for (const v1::Decision* d : swap) {
      const NodeNames n = NamesOf(profile, d->producer_node());
      table.AddRow(
          {absl::StrCat(d->value_id()), absl::StrCat(d->producer_node()),
           n.kind, n.scope, FormatBytes(d->size_bytes()),
           absl::StrCat(d->offload_after()), absl::StrCat(d->prefetch_at()),
           absl::StrFormat("%.3f", d->stall_ms())});
    }
    absl::StrAppend(&out, Indented(table.Render(), indent + 2));
  }
  return out;
}

}  // namespace mutwo
