// The budget, input-spec and loss strings of tests/golden/budgets.txt
// through ParseBudget, ParseTensorSpec and ParseLossSpec;
// client/python/tests/test_golden_parse.py reads the same file through the
// Python client's parsers, so the two cannot drift apart without one of them
// failing.
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/parse.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

struct GoldenCase {
  int line = 0;
  std::string kind;
  std::string text;
  std::string expected;
};

std::vector<GoldenCase> ReadCorpus() {
  const std::string path =
      absl::StrCat(MUTWO_SOURCE_DIR, "/tests/golden/budgets.txt");
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<GoldenCase> cases;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields = absl::StrSplit(line, " | ");
    EXPECT_EQ(fields.size(), 3u) << path << ":" << n << ": " << line;
    if (fields.size() != 3) continue;
    cases.push_back({n, fields[0], fields[1], fields[2]});
  }
  return cases;
}

// The outcome in the corpus's words: the budget's kind and value, or
// `error` when the parser refused the text (the message is checked apart).
std::string BudgetOutcome(const v1::MemoryBudget& b) {
  switch (b.kind_case()) {
    case v1::MemoryBudget::kBytes:
      return absl::StrCat("bytes=", b.bytes());
    case v1::MemoryBudget::kFractionOfBaseline:
      return absl::StrCat("fraction_of_baseline=", b.fraction_of_baseline());
    case v1::MemoryBudget::kFractionOfDevice:
      return absl::StrCat("fraction_of_device=", b.fraction_of_device());
    case v1::MemoryBudget::kKnee:
      return "knee";
    case v1::MemoryBudget::kFloor:
      return "floor";
    case v1::MemoryBudget::KIND_NOT_SET:
      break;
  }
  return "unset";
}

// Compares `got` (the parser's error or outcome) with the corpus's line.
void ExpectOutcome(const GoldenCase& c, const absl::Status& status,
                   const std::string& outcome) {
  SCOPED_TRACE(absl::StrCat("tests/golden/budgets.txt:", c.line, ": ", c.kind,
                            " \"", c.text, "\""));
  absl::string_view expected = c.expected;
  if (absl::ConsumePrefix(&expected, "error")) {
    ASSERT_FALSE(status.ok()) << "accepted as " << outcome;
    EXPECT_TRUE(absl::StrContains(status.message(),
                                  absl::StripAsciiWhitespace(expected)))
        << status.message();
    return;
  }
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(outcome, c.expected);
}

TEST(GoldenCorpus, HasBudgetsSpecsAndLosses) {
  int budgets = 0, specs = 0, losses = 0;
  for (const GoldenCase& c : ReadCorpus()) {
    budgets += c.kind == "budget";
    specs += c.kind == "spec";
    losses += c.kind == "loss";
    EXPECT_TRUE(c.kind == "budget" || c.kind == "spec" || c.kind == "loss")
        << "line " << c.line << ": unknown kind " << c.kind;
  }
  EXPECT_GE(budgets, 20);
  EXPECT_GE(specs, 20);
  EXPECT_GE(losses, 15);
}

TEST(GoldenCorpus, ParseLossSpecGivesTheExpectedOutcome) {
  for (const GoldenCase& c : ReadCorpus()) {
    if (c.kind != "loss") continue;
    auto loss = ParseLossSpec(c.text);
    ExpectOutcome(c, loss.status(), loss.ok() ? FormatLossSpec(*loss) : "");
    // What the parser accepts the server accepts too.
    if (loss.ok()) EXPECT_TRUE(ValidateLossSpec(*loss).ok()) << c.text;
  }
}

TEST(GoldenCorpus, ParseBudgetGivesTheExpectedOutcome) {
  for (const GoldenCase& c : ReadCorpus()) {
    if (c.kind != "budget") continue;
    auto budget = ParseBudget(c.text);
    ExpectOutcome(c, budget.status(),
                  budget.ok() ? BudgetOutcome(*budget) : "");
    // What the parser accepts the service and the planner accept too.
    if (budget.ok()) EXPECT_TRUE(ValidateBudget(*budget).ok()) << c.text;
  }
}

TEST(GoldenCorpus, ParseTensorSpecGivesTheExpectedOutcome) {
  for (const GoldenCase& c : ReadCorpus()) {
    if (c.kind != "spec") continue;
    auto spec = ParseTensorSpec(c.text);
    ExpectOutcome(c, spec.status(), spec.ok() ? FormatTensorSpec(*spec) : "");
  }
}

}  // namespace
}  // namespace mutwo
