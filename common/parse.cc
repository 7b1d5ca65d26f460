#include "common/parse.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace mutwo {
namespace {

struct Unit {
  const char* name;
  double factor;
};

constexpr Unit kUnits[] = {
    {"B", 1.0},
    {"KB", 1e3},
    {"MB", 1e6},
    {"GB", 1e9},
    {"TB", 1e12},
    {"KiB", 1024.0},
    {"MiB", 1024.0 * 1024},
    {"GiB", 1024.0 * 1024 * 1024},
    {"TiB", 1024.0 * 1024 * 1024 * 1024},
};

struct DTypeName_ {
  v1::DType dtype;
  const char* name;
  int64_t size;
};

constexpr DTypeName_ kDTypes[] = {
    {v1::FLOAT32, "float32", 4}, {v1::FLOAT64, "float64", 8},
    {v1::FLOAT16, "float16", 2}, {v1::BFLOAT16, "bfloat16", 2},
    {v1::INT64, "int64", 8},     {v1::INT32, "int32", 4},
    {v1::INT8, "int8", 1},       {v1::UINT8, "uint8", 1},
    {v1::BOOL, "bool", 1},
};

struct OptimizerName {
  v1::OptimizerSpec::Kind kind;
  const char* name;
};

constexpr OptimizerName kOptimizers[] = {
    {v1::OptimizerSpec::NONE, "none"},
    {v1::OptimizerSpec::SGD, "sgd"},
    {v1::OptimizerSpec::SGD_MOMENTUM, "sgd_momentum"},
    {v1::OptimizerSpec::ADAM, "adam"},
    {v1::OptimizerSpec::ADAMW, "adamw"},
};

std::string Quote(absl::string_view text) {
  return absl::StrCat("\"", text, "\"");
}

absl::StatusOr<int64_t> ParsePositiveInt(absl::string_view text,
                                         absl::string_view what) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a positive integer, got ", Quote(text)));
  }
  return value;
}

}  // namespace

absl::StatusOr<int64_t> ParseBytes(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t split = 0;
  while (split < s.size() &&
         (absl::ascii_isdigit(s[split]) || s[split] == '.')) {
    ++split;
  }
  absl::string_view number = s.substr(0, split);
  absl::string_view unit = absl::StripLeadingAsciiWhitespace(s.substr(split));
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("size ", Quote(text),
                     ": expected a number with an optional unit, like 4GiB, "
                     "4000MB or 123456"));
  }
  double factor = 0;
  if (unit.empty()) {
    factor = 1.0;
  } else {
    for (const Unit& u : kUnits) {
      if (unit == u.name) factor = u.factor;
    }
  }
  if (factor == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("size ", Quote(text), ": unknown unit ", Quote(unit),
                     "; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"));
  }
  double bytes = value * factor;
  if (bytes > static_cast<double>(std::numeric_limits<int64_t>::max()) / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("size ", Quote(text), ": too large"));
  }
  if (bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("size ", Quote(text), ": must be at least 1 byte"));
  }
  return static_cast<int64_t>(std::llround(bytes));
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  const double ab = std::fabs(b);
  if (ab >= 1024.0 * 1024 * 1024) {
    return absl::StrFormat("%.2f GiB", b / (1024.0 * 1024 * 1024));
  }
  if (ab >= 1024.0 * 1024) {
    return absl::StrFormat("%.2f MiB", b / (1024.0 * 1024));
  }
  if (ab >= 1024.0) return absl::StrFormat("%.2f KiB", b / 1024.0);
  return absl::StrCat(bytes, " B");
}

absl::StatusOr<v1::MemoryBudget> ParseBudget(absl::string_view text) {
  v1::MemoryBudget budget;
  budget.set_text(std::string(absl::StripAsciiWhitespace(text)));
  absl::string_view s = budget.text();
  if (absl::EqualsIgnoreCase(s, "auto")) {
    budget.set_text("auto");
    budget.set_knee(true);
    return budget;
  }
  if (absl::EqualsIgnoreCase(s, "floor")) {
    budget.set_text("floor");
    budget.set_floor(true);
    return budget;
  }
  // Any case, as auto and floor: `80%DEV` is what a user shouting means.
  const bool of_device = absl::EndsWithIgnoreCase(s, "%dev");
  if (of_device) s.remove_suffix(4);
  const bool of_baseline = !of_device && absl::ConsumeSuffix(&s, "%");
  if (of_device || of_baseline) {
    double percent = 0;
    if (!absl::SimpleAtod(s, &percent) || !(percent > 0) || percent > 100) {
      return absl::InvalidArgumentError(absl::StrCat(
          "budget ", Quote(text),
          ": a percentage must be a number in (0, 100], like 60%"));
    }
    if (of_device) {
      budget.set_fraction_of_device(percent / 100.0);
    } else {
      budget.set_fraction_of_baseline(percent / 100.0);
    }
    return budget;
  }
  // A bare number could mean a percentage or any unit (users typed 60 for
  // 60%, and got 60 bytes): the unit must be said.
  double bare = 0;
  if (absl::SimpleAtod(s, &bare)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget ", Quote(text), ": a bare number is ambiguous; say ", s,
        "% or ", s, "MiB or ", s, "B"));
  }
  auto bytes = ParseBytes(s);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget ", Quote(text),
        ": expected bytes (4GiB, 4000MB), a percentage of the baseline peak "
        "(60%), of the device (80%dev), auto (the knee of the Pareto "
        "curve) or floor (the lowest budget that fits)"));
  }
  budget.set_bytes(*bytes);
  return budget;
}

absl::Status ValidateBudget(const v1::MemoryBudget& b) {
  switch (b.kind_case()) {
    case v1::MemoryBudget::kBytes:
      if (b.bytes() > 0) return absl::OkStatus();
      break;
    case v1::MemoryBudget::kFractionOfBaseline:
      if (b.fraction_of_baseline() > 0 && b.fraction_of_baseline() <= 1) {
        return absl::OkStatus();
      }
      break;
    case v1::MemoryBudget::kFractionOfDevice:
      if (b.fraction_of_device() > 0 && b.fraction_of_device() <= 1) {
        return absl::OkStatus();
      }
      break;
    case v1::MemoryBudget::kKnee:
      if (b.knee()) return absl::OkStatus();
      break;
    case v1::MemoryBudget::kFloor:
      if (b.floor()) return absl::OkStatus();
      break;
    case v1::MemoryBudget::KIND_NOT_SET:
      return absl::InvalidArgumentError(
          "a budget has no kind: set bytes, fraction_of_baseline, "
          "fraction_of_device, knee or floor");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("budget ", Quote(FormatBudget(b)),
                   ": bytes must be positive, fractions in (0, 1] and "
                   "knee or floor true"));
}

std::string FormatBudget(const v1::MemoryBudget& budget) {
  switch (budget.kind_case()) {
    case v1::MemoryBudget::kBytes:
      return FormatBytes(budget.bytes());
    case v1::MemoryBudget::kFractionOfBaseline:
      return absl::StrFormat("%g%%", budget.fraction_of_baseline() * 100);
    case v1::MemoryBudget::kFractionOfDevice:
      return absl::StrFormat("%g%%dev", budget.fraction_of_device() * 100);
    case v1::MemoryBudget::kKnee:
      return "auto";
    case v1::MemoryBudget::kFloor:
      return "floor";
    case v1::MemoryBudget::KIND_NOT_SET:
      break;
  }
  return "unset";
}

absl::StatusOr<v1::DType> ParseDType(absl::string_view text) {
  for (const auto& d : kDTypes) {
    if (absl::EqualsIgnoreCase(text, d.name)) return d.dtype;
  }
  std::vector<std::string> names;
  for (const auto& d : kDTypes) names.push_back(d.name);
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", Quote(text),
                                                 "; use one of ",
                                                 absl::StrJoin(names, ", ")));
}

std::string DTypeName(v1::DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "unspecified";
}

int64_t DTypeSize(v1::DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.size;
  }
  return 0;
}

bool IsFloatingDType(v1::DType dtype) {
  return dtype == v1::FLOAT32 || dtype == v1::FLOAT64 || dtype == v1::FLOAT16 ||
         dtype == v1::BFLOAT16;
}

absl::StatusOr<v1::TensorSpec> ParseTensorSpec(absl::string_view text) {
  const std::string where = absl::StrCat("input spec ", Quote(text));
  const auto fail = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", why,
        "; expected NAME:DTYPE[DIMS]{LOW,HIGH}, like x:float32[B,3,224,224] "
        "or tokens:int64[B,128]{0,30000}"));
  };
  absl::string_view s = absl::StripAsciiWhitespace(text);
  const size_t colon = s.find(':');
  if (colon == absl::string_view::npos) {
    return fail("missing ':' after the name");
  }
  v1::TensorSpec spec;
  absl::string_view name = s.substr(0, colon);
  if (name.empty()) return fail("empty name");
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.') {
      return fail(absl::StrCat("name ", Quote(name),
                               " may hold only letters, digits, '_' and '.'"));
    }
  }
  spec.set_name(std::string(name));
  s.remove_prefix(colon + 1);
  const size_t open = s.find('[');
  if (open == absl::string_view::npos) {
    return fail("missing '[' before the dims");
  }
  auto dtype = ParseDType(s.substr(0, open));
  if (!dtype.ok()) return fail(dtype.status().message());
  spec.set_dtype(*dtype);
  s.remove_prefix(open + 1);
  const size_t close = s.find(']');
  if (close == absl::string_view::npos) {
    return fail("missing ']' after the dims");
  }
  absl::string_view dims = s.substr(0, close);
  s.remove_prefix(close + 1);
  if (absl::StripAsciiWhitespace(dims).empty()) {
    // A scalar input: no dimensions.
  } else {
    for (absl::string_view d : absl::StrSplit(dims, ',')) {
      d = absl::StripAsciiWhitespace(d);
      if (d == "B") {
        spec.add_dims(kBatchDim);
        continue;
      }
      // Digits only: SimpleAtoi takes `+3`, which the Python client refuses.
      int64_t size = 0;
      if (d.empty() || !std::all_of(d.begin(), d.end(), absl::ascii_isdigit) ||
          !absl::SimpleAtoi(d, &size) || size <= 0) {
        return fail(absl::StrCat("dimension ", Quote(d),
                                 " must be a positive integer or B"));
      }
      spec.add_dims(size);
    }
  }
  if (!s.empty()) {
    if (s.front() != '{' || s.back() != '}') {
      return fail(absl::StrCat("unexpected ", Quote(s), " after the dims"));
    }
    std::vector<absl::string_view> bounds =
        absl::StrSplit(s.substr(1, s.size() - 2), ',');
    double low = 0, high = 0;
    if (bounds.size() != 2 ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(bounds[0]), &low) ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(bounds[1]), &high)) {
      return fail(absl::StrCat("value range ", Quote(s),
                               " must be two numbers, {LOW,HIGH}"));
    }
    if (!(low < high)) {
      return fail(
          absl::StrCat("value range ", Quote(s), " must have LOW < HIGH"));
    }
    spec.mutable_range()->set_low(low);
    spec.mutable_range()->set_high(high);
  }
  if (!IsFloatingDType(spec.dtype()) && spec.dtype() != v1::BOOL &&
      !spec.has_range()) {
    return fail(absl::StrCat("integer input ", Quote(spec.name()),
                             " needs a value range {LOW,HIGH}"));
  }
  return spec;
}

std::string FormatTensorSpec(const v1::TensorSpec& spec) {
  std::vector<std::string> dims;
  for (int64_t d : spec.dims()) {
    dims.push_back(d == kBatchDim ? "B" : absl::StrCat(d));
  }
  std::string out = absl::StrCat(spec.name(), ":", DTypeName(spec.dtype()), "[",
                                 absl::StrJoin(dims, ","), "]");
  if (spec.has_range()) {
    absl::StrAppend(&out, "{", spec.range().low(), ",", spec.range().high(),
                    "}");
  }
  return out;
}

std::vector<int64_t> ConcreteDims(const v1::TensorSpec& spec,
                                  int64_t batch_size) {
  std::vector<int64_t> dims;
  dims.reserve(spec.dims_size());
  for (int64_t d : spec.dims()) dims.push_back(d == kBatchDim ? batch_size : d);
  return dims;
}

int64_t TensorBytes(const v1::TensorSpec& spec, int64_t batch_size) {
  int64_t n = DTypeSize(spec.dtype());
  for (int64_t d : ConcreteDims(spec, batch_size)) n *= d;
  return n;
}

namespace {

constexpr char kLossKinds[] =
    "use mean, sum, model, cross_entropy:TARGET (like "
    "cross_entropy:y:int64[B]{0,1000}), chunked_cross_entropy:TARGET (the "
    "same without a whole log-softmax held) or mse:TARGET (like "
    "mse:z:float32[B,4]), optionally KIND@OUTPUT to read one dict entry or "
    "tuple element (like cross_entropy@logits:y:int64[B]{0,1000}), terms "
    "joined by + (like cross_entropy@logits:y:int64[B]{0,10}+mse@aux:z:"
    "float32[B,4])";

// The `+`-separated terms of a loss text; a `+` inside the brackets of a
// target spec (`{0,1e+3}`) does not separate.
std::vector<absl::string_view> SplitLossTerms(absl::string_view s) {
  std::vector<absl::string_view> terms;
  int depth = 0;
  size_t begin = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '[' || s[i] == '{') ++depth;
    if ((s[i] == ']' || s[i] == '}') && depth > 0) --depth;
    if (s[i] == '+' && depth == 0) {
      terms.push_back(s.substr(begin, i - begin));
      begin = i + 1;
    }
  }
  terms.push_back(s.substr(begin));
  return terms;
}

// One term: KIND[@OUTPUT][:TARGET]. `text` is the whole loss, for messages.
absl::StatusOr<v1::LossSpec> ParseLossTerm(absl::string_view text,
                                           absl::string_view term) {
  v1::LossSpec loss;
  absl::string_view s = absl::StripAsciiWhitespace(term);
  const std::string where =
      s == absl::StripAsciiWhitespace(text)
          ? absl::StrCat("loss ", Quote(text))
          : absl::StrCat("loss ", Quote(text), ", term ", Quote(s));
  if (s.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": empty term; ", kLossKinds));
  }
  const size_t colon = s.find(':');
  absl::string_view head = s.substr(0, colon);
  absl::string_view rest =
      colon == absl::string_view::npos ? absl::string_view() : s.substr(colon);
  const size_t at = head.find('@');
  if (at != absl::string_view::npos) {
    absl::string_view output = head.substr(at + 1);
    if (output.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ": expected a dict key or tuple index after '@', like "
                       "cross_entropy@out:y:int64[B,64,64]{0,21}"));
    }
    loss.set_output(std::string(output));
    head = head.substr(0, at);
  }
  const std::string kind = absl::AsciiStrToLower(head);
  const bool with_target = absl::ConsumePrefix(&rest, ":");
  // The kind is looked up by LossKindName, the one spelling of each kind.
  std::optional<v1::LossSpec::Kind> parsed;
  for (v1::LossSpec::Kind k :
       {v1::LossSpec::MEAN, v1::LossSpec::SUM, v1::LossSpec::MODEL,
        v1::LossSpec::CROSS_ENTROPY, v1::LossSpec::CHUNKED_CROSS_ENTROPY,
        v1::LossSpec::MSE}) {
    if (kind == LossKindName(k)) parsed = k;
  }
  if (!parsed.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": unknown loss kind ", Quote(head), "; ", kLossKinds));
  }
  const bool takes_target = LossKindTakesTarget(*parsed);
  if (takes_target && !with_target) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", kind, " needs a target spec after ':', like ", kind,
        *parsed == v1::LossSpec::MSE ? ":z:float32[B,4]"
                                     : ":y:int64[B]{0,1000}"));
  }
  if (!takes_target && (with_target || !rest.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", kind,
        " takes no target (only cross_entropy, chunked_cross_entropy and mse "
        "do)"));
  }
  loss.set_kind(*parsed);
  if (takes_target) {
    auto target = ParseTensorSpec(rest);
    if (!target.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": target ", target.status().message()));
    }
    *loss.mutable_target() = *std::move(target);
  }
  absl::Status valid = ValidateLossSpec(loss);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", valid.message()));
  }
  return loss;
}

}  // namespace

absl::StatusOr<v1::LossSpec> ParseLossSpec(absl::string_view text) {
  const std::vector<absl::string_view> texts =
      SplitLossTerms(absl::StripAsciiWhitespace(text));
  if (texts.size() == 1) return ParseLossTerm(text, texts[0]);
  v1::LossSpec loss;
  for (absl::string_view term : texts) {
    MUTWO_ASSIGN_OR_RETURN(*loss.add_terms(), ParseLossTerm(text, term));
  }
  absl::Status valid = ValidateLossSpec(loss);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss ", Quote(text), ": ", valid.message()));
  }
  return loss;
}

absl::StatusOr<v1::LossSpec> ParseLossFlags(
    const std::vector<std::string>& values) {
  if (values.empty()) return ParseLossSpec("mean");
  return ParseLossSpec(absl::StrJoin(values, "+"));
}

const char* LossKindName(v1::LossSpec::Kind kind) {
  switch (kind) {
    case v1::LossSpec::SUM:
      return "sum";
    case v1::LossSpec::MODEL:
      return "model";
    case v1::LossSpec::CROSS_ENTROPY:
      return "cross_entropy";
    case v1::LossSpec::CHUNKED_CROSS_ENTROPY:
      return "chunked_cross_entropy";
    case v1::LossSpec::MSE:
      return "mse";
    default:  // KIND_UNSPECIFIED is treated as MEAN
      return "mean";
  }
}

bool LossKindTakesTarget(v1::LossSpec::Kind kind) {
  return kind == v1::LossSpec::CROSS_ENTROPY ||
         kind == v1::LossSpec::CHUNKED_CROSS_ENTROPY ||
         kind == v1::LossSpec::MSE;
}

std::string FormatLossSpec(const v1::LossSpec& loss) {
  if (!loss.terms().empty()) {
    std::vector<std::string> terms;
    for (const v1::LossSpec& term : loss.terms()) {
      terms.push_back(FormatLossSpec(term));
    }
    return absl::StrJoin(terms, "+");
  }
  std::string head = absl::StrCat(
      LossKindName(loss.kind()),
      loss.output().empty() ? "" : absl::StrCat("@", loss.output()));
  if (LossKindTakesTarget(loss.kind())) {
    return absl::StrCat(head, ":", FormatTensorSpec(loss.target()));
  }
  return head;
}

absl::Status ValidateLossSpec(const v1::LossSpec& loss) {
  if (!loss.terms().empty()) {
    if (loss.kind() != v1::LossSpec::KIND_UNSPECIFIED || loss.has_target() ||
        !loss.output().empty()) {
      return absl::InvalidArgumentError(
          "a loss with terms is their sum: give the kind, output and target "
          "in each term, not beside them");
    }
    std::set<std::string> names;
    for (const v1::LossSpec& term : loss.terms()) {
      if (!term.terms().empty()) {
        return absl::InvalidArgumentError(
            "a loss term cannot have terms of its own: join every term with "
            "+ at the top level");
      }
      MUTWO_RETURN_IF_ERROR(ValidateLossSpec(term));
      if (term.has_target() && !names.insert(term.target().name()).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "two loss terms name their target ", Quote(term.target().name()),
            ": give each term's target its own name"));
      }
    }
    return absl::OkStatus();
  }
  if (!LossKindTakesTarget(loss.kind())) {
    if (loss.has_target()) {
      return absl::InvalidArgumentError(
          "only cross_entropy, chunked_cross_entropy and mse take a target");
    }
    return absl::OkStatus();
  }
  const v1::TensorSpec& target = loss.target();
  const char* kind = LossKindName(loss.kind());
  if (!loss.has_target() || target.name().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, " needs a target spec, like ", kind,
                     loss.kind() == v1::LossSpec::MSE ? ":z:float32[B,4]"
                                                      : ":y:int64[B]{0,1000}"));
  }
  if (loss.kind() != v1::LossSpec::MSE && target.dtype() != v1::INT64) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", kind,
                     " target holds class indices and must be int64, like "
                     "y:int64[B]{0,1000}"));
  }
  if (loss.kind() == v1::LossSpec::MSE && !IsFloatingDType(target.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an mse target is compared with a floating-point output and must be "
        "float32, float64, float16 or bfloat16, like mse:",
        target.name(), ":float32[B,4]; got ", DTypeName(target.dtype())));
  }
  return ValidateInputs({target});
}

std::vector<v1::TensorSpec> LossTargets(const v1::LossSpec& loss) {
  std::vector<v1::TensorSpec> targets;
  if (loss.has_target()) targets.push_back(loss.target());
  for (const v1::LossSpec& term : loss.terms()) {
    if (term.has_target()) targets.push_back(term.target());
  }
  return targets;
}

absl::StatusOr<v1::OptimizerSpec> ParseOptimizerSpec(absl::string_view text) {
  v1::OptimizerSpec opt;
  absl::string_view s = absl::StripAsciiWhitespace(text);
  std::pair<absl::string_view, absl::string_view> kind_args =
      absl::StrSplit(s, absl::MaxSplits(':', 1));
  bool found = false;
  for (const auto& o : kOptimizers) {
    if (absl::EqualsIgnoreCase(kind_args.first, o.name)) {
      opt.set_kind(o.kind);
      found = true;
    }
  }
  if (!found) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer ", Quote(text),
        ": use none, sgd, sgd_momentum, adam or adamw (optionally with "
        ":lr=0.01,momentum=0.9,weight_decay=0.01,foreach)"));
  }
  if (kind_args.second.empty()) return opt;
  for (absl::string_view kv : absl::StrSplit(kind_args.second, ',')) {
    if (absl::StripAsciiWhitespace(kv) == "foreach") {
      opt.set_foreach_update(true);
      continue;
    }
    std::pair<absl::string_view, absl::string_view> p =
        absl::StrSplit(kv, absl::MaxSplits('=', 1));
    using Setter = void (v1::OptimizerSpec::*)(double);
    static const std::pair<absl::string_view, Setter> kSettings[] = {
        {"lr", &v1::OptimizerSpec::set_learning_rate},
        {"momentum", &v1::OptimizerSpec::set_momentum},
        {"weight_decay", &v1::OptimizerSpec::set_weight_decay}};
    Setter set = nullptr;
    for (const auto& [name, setter] : kSettings) {
      if (p.first == name) set = setter;
    }
    if (set == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer ", Quote(text), ": unknown setting ", Quote(p.first),
          "; use lr, momentum, weight_decay or foreach"));
    }
    double value = 0;
    if (!absl::SimpleAtod(p.second, &value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer ", Quote(text), ": ", Quote(kv),
                       " must be NAME=NON_NEGATIVE_NUMBER"));
    }
    (opt.*set)(value);
  }
  return opt;
}

std::string FormatOptimizerSpec(const v1::OptimizerSpec& optimizer) {
  std::string name = "sgd";
  for (const auto& o : kOptimizers) {
    if (o.kind == optimizer.kind()) name = o.name;
  }
  return optimizer.foreach_update() ? name + ":foreach" : name;
}

absl::StatusOr<std::vector<int64_t>> ParseBatchSizes(absl::string_view text) {
  const std::string where = absl::StrCat("batch sizes ", Quote(text));
  absl::string_view s = absl::StripAsciiWhitespace(text);
  std::vector<int64_t> sizes;
  if (s.find(':') == absl::string_view::npos) {
    for (absl::string_view part : absl::StrSplit(s, ',')) {
      MUTWO_ASSIGN_OR_RETURN(
          int64_t b, ParsePositiveInt(absl::StripAsciiWhitespace(part), where));
      sizes.push_back(b);
    }
  } else {
    std::vector<absl::string_view> parts = absl::StrSplit(s, ':');
    if (parts.size() > 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": expected FROM:TO[:xFACTOR|:+STEP], like 8:64:x2"));
    }
    MUTWO_ASSIGN_OR_RETURN(int64_t from, ParsePositiveInt(parts[0], where));
    MUTWO_ASSIGN_OR_RETURN(int64_t to, ParsePositiveInt(parts[1], where));
    if (to < from) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": TO must not be below FROM"));
    }
    int64_t factor = 2, step = 0;
    if (parts.size() == 3) {
      absl::string_view p = parts[2];
      if (absl::ConsumePrefix(&p, "x")) {
        MUTWO_ASSIGN_OR_RETURN(factor, ParsePositiveInt(p, where));
        if (factor < 2) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": the factor must be at least 2"));
        }
      } else if (absl::ConsumePrefix(&p, "+")) {
        MUTWO_ASSIGN_OR_RETURN(step, ParsePositiveInt(p, where));
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": the third part must be xFACTOR or +STEP, like x2 or +8"));
      }
    }
    for (int64_t b = from; b <= to; b = step > 0 ? b + step : b * factor) {
      sizes.push_back(b);
      if (sizes.size() > 64) break;
    }
  }
  std::set<int64_t> seen;
  for (int64_t b : sizes) {
    if (!seen.insert(b).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": batch size ", b, " is listed twice"));
    }
  }
  if (sizes.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": at most 64 batch sizes per job"));
  }
  return sizes;
}

absl::Status ValidateInputs(const std::vector<v1::TensorSpec>& inputs) {
  if (inputs.empty()) {
    return absl::InvalidArgumentError(
        "no inputs: give at least one --input NAME:DTYPE[DIMS], like "
        "x:float32[B,3,224,224]");
  }
  std::set<std::string> names;
  for (const v1::TensorSpec& in : inputs) {
    if (in.name().empty()) {
      return absl::InvalidArgumentError("an input has an empty name");
    }
    if (!names.insert(in.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", Quote(in.name()), " is given twice"));
    }
    if (in.dtype() == v1::DTYPE_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", Quote(in.name()), ": dtype is not set"));
    }
    for (int64_t d : in.dims()) {
      if (d != kBatchDim && d <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("input ", Quote(in.name()), ": dimension ", d,
                         " must be positive or B"));
      }
    }
    if (!IsFloatingDType(in.dtype()) && in.dtype() != v1::BOOL &&
        !in.has_range()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", Quote(in.name()), ": integer inputs need a value range"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBatchDims(const std::vector<v1::TensorSpec>& inputs,
                            const v1::LossSpec* loss,
                            const std::vector<std::string>& unbatched) {
  std::vector<v1::TensorSpec> specs = inputs;
  if (loss != nullptr) {
    for (v1::TensorSpec& target : LossTargets(*loss)) {
      specs.push_back(std::move(target));
    }
  }
  const std::set<std::string> declared(unbatched.begin(), unbatched.end());
  std::set<std::string> names;
  for (const v1::TensorSpec& spec_value : specs) {
    const v1::TensorSpec* spec = &spec_value;
    names.insert(spec->name());
    bool has_batch = false;
    for (int64_t d : spec->dims()) has_batch |= d == kBatchDim;
    const bool is_declared = declared.count(spec->name()) > 0;
    if (has_batch && is_declared) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--unbatched ", spec->name(), ": input spec ",
          Quote(FormatTensorSpec(*spec)),
          " has the batch dimension B; leave --unbatched out for it"));
    }
    if (!has_batch && !is_declared) {
      // The likely fix: the first dimension was the batch size.
      v1::TensorSpec suggested = *spec;
      if (suggested.dims().empty()) {
        suggested.add_dims(kBatchDim);
      } else {
        suggested.set_dims(0, kBatchDim);
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "input spec ", Quote(FormatTensorSpec(*spec)),
          " has no batch dimension B, so --batch would not change it; write B "
          "where the batch size goes (like ",
          FormatTensorSpec(suggested), "), or pass --unbatched ", spec->name(),
          " if it really has no batch dimension"));
    }
  }
  for (const std::string& name : declared) {
    if (names.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--unbatched ", Quote(name),
                       ": no --input (or loss target) has "
                       "that name"));
    }
  }
  return absl::OkStatus();
}

}  // namespace mutwo
