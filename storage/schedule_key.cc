#include "storage/schedule_key.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/parse.h"
#include "common/version.h"

namespace mutwo::storage {
namespace {

// Percent-escapes the separators used by the canonical forms, so a value
// containing `|` or `;` cannot mimic another field.
std::string Escape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '%' || c == '|' || c == ';' || c == '=' || c == ',' || c == '@' ||
        c == '+' || c == '[' || c == ']' || c == '{' || c == '}' || c == ':' ||
        static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "%%%02X", static_cast<unsigned char>(c));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// The shortest of %.15g..%.17g that reads back as the same double: exact,
// and `0.6` stays `0.6`.
std::string Double(double value) {
  std::string text;
  for (int precision = 15; precision <= 17; ++precision) {
    text = absl::StrFormat("%.*g", precision, value);
    double back = 0;
    if (absl::SimpleAtod(text, &back) && back == value) {
      break;
    }
  }
  return text;
}

// Enum values by their proto names, lower case: the key never depends on
// how the CLI displays or parses them (common/parse.h), which may change.
// (Today both spell them the same, so the keys stored stay valid.)
std::string CanonicalDType(v1::DType dtype) {
  return absl::AsciiStrToLower(v1::DType_Name(dtype));
}

std::string CanonicalTensor(const v1::TensorSpec& spec) {
  std::vector<std::string> dims;
  for (int64_t d : spec.dims()) {
    dims.push_back(d == kBatchDim ? "B" : absl::StrCat(d));
  }
  std::string out =
      absl::StrCat(Escape(spec.name()), ":", CanonicalDType(spec.dtype()), "[",
                   absl::StrJoin(dims, ","), "]");
  if (spec.has_range()) {
    absl::StrAppend(&out, "{", Double(spec.range().low()), ",",
                    Double(spec.range().high()), "}");
  }
  return out;
}

std::string CanonicalLoss(const v1::LossSpec& loss) {
  // A sum of terms: each term's form joined by `+`. A term's `+` is escaped
  // (output and target names) or inside a range's braces (`1e+30`), where no
  // term can end, so the join reads back one way.
  if (!loss.terms().empty()) {
    std::vector<std::string> terms;
    for (const v1::LossSpec& term : loss.terms()) {
      terms.push_back(CanonicalLoss(term));
    }
    return absl::StrJoin(terms, "+");
  }
  std::string kind = LossKindName(loss.kind());
  // The output the loss reads changes the step (a key without one is what
  // it was before the selector counted). Escaped, so an output named like
  // `x|batch=1` or `a+mean` cannot mimic another field or term.
  if (!loss.output().empty()) {
    absl::StrAppend(&kind, "@", Escape(loss.output()));
  }
  if (LossKindTakesTarget(loss.kind())) {
    absl::StrAppend(&kind, ":", CanonicalTensor(loss.target()));
  }
  return kind;
}

std::string CanonicalOptimizer(const v1::OptimizerSpec& optimizer) {
  v1::OptimizerSpec o = optimizer;
  if (o.kind() == v1::OptimizerSpec::KIND_UNSPECIFIED) {
    o.set_kind(v1::OptimizerSpec::SGD);
  }
  if (o.kind() == v1::OptimizerSpec::NONE) {
    return "none";
  }
  std::string out = absl::StrCat(
      absl::AsciiStrToLower(v1::OptimizerSpec::Kind_Name(o.kind())),
      ",lr=", Double(o.learning_rate() == 0 ? 1e-3 : o.learning_rate()));
  if (o.kind() == v1::OptimizerSpec::SGD_MOMENTUM) {
    absl::StrAppend(
        &out, ",momentum=", Double(o.momentum() == 0 ? 0.9 : o.momentum()));
  }
  absl::StrAppend(&out, ",weight_decay=", Double(o.weight_decay()));
  if (o.foreach_update()) absl::StrAppend(&out, ",foreach");
  return out;
}

// The parts of a key that say whose entry it is: each only when set, so the
// keys of a server without authentication, and those stored before entries
// were bound to their profile, stay what they were.
std::string OwnerParts(const ScheduleCacheKey& key) {
  std::string out;
  if (!key.tenant.empty()) {
    absl::StrAppend(&out, "|tenant=", Escape(key.tenant));
  }
  if (!key.profile_sha256.empty()) {
    absl::StrAppend(&out, "|profile=", Escape(key.profile_sha256));
  }
  if (!key.measured_by.empty()) {
    absl::StrAppend(&out, "|worker=", Escape(key.measured_by));
  }
  return out;
}

}  // namespace

ScheduleCacheKey MakeScheduleCacheKey(const v1::JobSpec& spec,
                                      int64_t batch_size,
                                      const v1::DeviceInfo& device,
                                      const v1::MemoryBudget& budget,
                                      v1::Policy policy,
                                      const std::string& tenant) {
  ScheduleCacheKey key;
  key.model_sha256 = spec.model_sha256();
  key.inputs.assign(spec.inputs().begin(), spec.inputs().end());
  key.loss = spec.loss();
  key.optimizer = spec.optimizer();
  key.batch_size = batch_size;
  key.device_kind = device.kind();
  key.device_name = device.name();
  key.device_total_bytes = device.total_bytes();
  key.libtorch_version = device.libtorch_version();
  key.budget = budget;
  key.policy = policy;
  key.planner_version = kPlannerVersion;
  key.tenant = tenant;
  return key;
}

absl::Status ValidateScheduleCacheKey(const ScheduleCacheKey& key) {
  if (key.model_sha256.empty()) {
    return absl::InvalidArgumentError("schedule cache key: empty model sha256");
  }
  if (key.batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule cache key: batch size must be positive, got ",
                     key.batch_size));
  }
  if (key.device_kind.empty()) {
    return absl::InvalidArgumentError(
        "schedule cache key: empty device kind (expected cpu or cuda)");
  }
  if (key.libtorch_version.empty()) {
    return absl::InvalidArgumentError(
        "schedule cache key: empty LibTorch version");
  }
  if (key.planner_version.empty()) {
    return absl::InvalidArgumentError(
        "schedule cache key: empty planner version");
  }
  if (key.budget.kind_case() == v1::MemoryBudget::KIND_NOT_SET) {
    return absl::InvalidArgumentError("schedule cache key: budget not set");
  }
  if (key.budget.kind_case() == v1::MemoryBudget::kFractionOfDevice &&
      key.device_total_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule cache key: budget ", FormatBudget(key.budget),
        " is a fraction of the device but the device total bytes are ",
        key.device_total_bytes));
  }
  return absl::OkStatus();
}

std::string CanonicalSpecString(const std::vector<v1::TensorSpec>& inputs,
                                const v1::LossSpec& loss,
                                const v1::OptimizerSpec& optimizer) {
  std::vector<std::string> parts;
  parts.reserve(inputs.size());
  for (const v1::TensorSpec& input : inputs) {
    parts.push_back(CanonicalTensor(input));
  }
  return absl::StrCat("inputs=", absl::StrJoin(parts, ";"),
                      "|loss=", CanonicalLoss(loss),
                      "|optimizer=", CanonicalOptimizer(optimizer));
}

std::string CanonicalBudgetString(const v1::MemoryBudget& budget,
                                  int64_t device_total_bytes) {
  switch (budget.kind_case()) {
    case v1::MemoryBudget::kBytes:
      return absl::StrCat("bytes:", budget.bytes());
    case v1::MemoryBudget::kFractionOfBaseline:
      return absl::StrCat("baseline:", Double(budget.fraction_of_baseline()));
    case v1::MemoryBudget::kFractionOfDevice:
      return absl::StrCat("device:", Double(budget.fraction_of_device()), "@",
                          device_total_bytes);
    case v1::MemoryBudget::kKnee:
      return "knee";
    case v1::MemoryBudget::kFloor:
      return "floor";
    case v1::MemoryBudget::KIND_NOT_SET:
      break;
  }
  return "unset";
}

std::string CanonicalKeyString(const ScheduleCacheKey& key) {
  const v1::Policy policy =
      key.policy == v1::POLICY_UNSPECIFIED ? v1::MUTWO : key.policy;
  return absl::StrCat(
      "v1|model=", Escape(absl::AsciiStrToLower(key.model_sha256)), "|",
      CanonicalSpecString(key.inputs, key.loss, key.optimizer),
      "|batch=", key.batch_size,
      "|device=", Escape(absl::AsciiStrToLower(key.device_kind)), ",",
      Escape(key.device_name), "|libtorch=", Escape(key.libtorch_version),
      "|budget=", CanonicalBudgetString(key.budget, key.device_total_bytes),
      "|policy=", v1::Policy_Name(policy),
      "|planner=", Escape(key.planner_version),
      key.shared ? "|trust=shared" : OwnerParts(key));
}

std::string MeasurementKeyString(const v1::JobSpec& spec, int64_t batch_size,
                                 const v1::DeviceInfo& device) {
  const std::vector<v1::TensorSpec> inputs(spec.inputs().begin(),
                                           spec.inputs().end());
  return absl::StrCat(
      "v1|model=", Escape(absl::AsciiStrToLower(spec.model_sha256())), "|",
      CanonicalSpecString(inputs, spec.loss(), spec.optimizer()),
      "|batch=", batch_size,
      "|device=", Escape(absl::AsciiStrToLower(device.kind())), ",",
      Escape(device.name()), "|libtorch=", Escape(device.libtorch_version()));
}

}  // namespace mutwo::storage
