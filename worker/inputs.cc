#include "worker/inputs.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/parse.h"
#include "common/status_macros.h"
#include "worker/chunked_cross_entropy.h"
#include "worker/foreach_optimizer.h"
#include "worker/model_loader.h"

namespace mutwo::worker {
namespace {

// The spec dtypes and the scalar types they make, both ways.
constexpr std::pair<v1::DType, torch::ScalarType> kDTypes[] = {
    {v1::FLOAT32, torch::kFloat32}, {v1::FLOAT64, torch::kFloat64},
    {v1::FLOAT16, torch::kFloat16}, {v1::BFLOAT16, torch::kBFloat16},
    {v1::INT64, torch::kInt64},     {v1::INT32, torch::kInt32},
    {v1::INT8, torch::kInt8},       {v1::UINT8, torch::kUInt8},
    {v1::BOOL, torch::kBool}};

absl::StatusOr<torch::ScalarType> ScalarTypeOf(const v1::TensorSpec& spec) {
  for (const auto& [dtype, type] : kDTypes) {
    if (dtype == spec.dtype()) return type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("input \"", spec.name(), "\": no dtype"));
}

void Flatten(const c10::IValue& value, std::vector<torch::Tensor>* out) {
  if (value.isTensor()) {
    out->push_back(value.toTensor());
  } else if (value.isTuple()) {
    for (const auto& element : value.toTuple()->elements()) {
      Flatten(element, out);
    }
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) Flatten(element, out);
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) Flatten(entry.value(), out);
  }
}

}  // namespace

std::optional<v1::DType> DTypeOf(torch::ScalarType type) {
  for (const auto& [dtype, scalar_type] : kDTypes) {
    if (scalar_type == type) return dtype;
  }
  return std::nullopt;
}

absl::StatusOr<torch::Tensor> MakeTensor(const v1::TensorSpec& spec,
                                         int64_t batch_size,
                                         const torch::Device& device) {
  auto type = ScalarTypeOf(spec);
  if (!type.ok()) return type.status();
  const std::vector<int64_t> dims = ConcreteDims(spec, batch_size);
  auto options = torch::TensorOptions().dtype(*type).device(device);
  if (IsFloatingDType(spec.dtype())) return torch::randn(dims, options);
  if (spec.dtype() == v1::BOOL) {
    return torch::randint(0, 2, dims, options.dtype(torch::kInt64))
        .to(torch::kBool);
  }
  if (!spec.has_range() || spec.range().high() <= spec.range().low()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input \"", spec.name(),
        "\": integer inputs need a value range {low,high} with low < high"));
  }
  return torch::randint(static_cast<int64_t>(spec.range().low()),
                        static_cast<int64_t>(spec.range().high()), dims,
                        options);
}

absl::StatusOr<std::vector<torch::Tensor>> MakeInputs(
    const std::vector<v1::TensorSpec>& specs, int64_t batch_size,
    const torch::Device& device, uint64_t seed) {
  if (batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size must be positive, got ", batch_size));
  }
  torch::manual_seed(seed);
  std::vector<torch::Tensor> out;
  for (const v1::TensorSpec& spec : specs) {
    auto tensor = MakeTensor(spec, batch_size, device);
    if (!tensor.ok()) return tensor.status();
    out.push_back(*std::move(tensor));
  }
  return out;
}

absl::StatusOr<std::vector<torch::Tensor>> MakeTargets(
    const v1::LossSpec& loss, int64_t batch_size, const torch::Device& device) {
  MUTWO_RETURN_IF_ERROR(ValidateLossSpec(loss));
  std::vector<torch::Tensor> targets;
  for (const v1::TensorSpec& spec : LossTargets(loss)) {
    MUTWO_ASSIGN_OR_RETURN(torch::Tensor target,
                           MakeTensor(spec, batch_size, device));
    targets.push_back(std::move(target));
  }
  return targets;
}

std::vector<torch::Tensor> FlattenTensors(const c10::IValue& outputs) {
  std::vector<torch::Tensor> out;
  Flatten(outputs, &out);
  return out;
}

namespace {

// The output `key` names: a dict entry (string key) or a tuple/list element
// (an integer index, negative from the end).
absl::StatusOr<c10::IValue> SelectOutput(const c10::IValue& outputs,
                                         const std::string& key) {
  if (outputs.isGenericDict()) {
    for (const auto& entry : outputs.toGenericDict()) {
      if (entry.key().isString() && entry.key().toStringRef() == key) {
        return entry.value();
      }
    }
    std::vector<std::string> keys;
    for (const auto& entry : outputs.toGenericDict()) {
      keys.push_back(entry.key().isString() ? entry.key().toStringRef()
                                            : entry.key().tagKind());
    }
    return absl::InvalidArgumentError(
        absl::StrCat("loss @", key, ": the model's output dict has no key \"",
                     key, "\" (keys: ", absl::StrJoin(keys, ", "), ")"));
  }
  std::vector<c10::IValue> elements;
  if (outputs.isTuple()) {
    const auto& e = outputs.toTupleRef().elements();
    elements.assign(e.begin(), e.end());
  } else if (outputs.isList()) {
    for (const c10::IValue& v : outputs.toListRef()) elements.push_back(v);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss @", key, ": the model returns a single ", outputs.tagKind(),
        ", not a dict, tuple or list to select from"));
  }
  int64_t index = 0;
  if (!absl::SimpleAtoi(key, &index)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss @", key, ": the model returns a ", outputs.tagKind(),
                     ": select an element by its index (like @0)"));
  }
  const int64_t size = static_cast<int64_t>(elements.size());
  if (index < 0) index += size;
  if (index < 0 || index >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss @", key, ": index out of range (the model returns ",
                     size, " outputs)"));
  }
  return elements[index];
}

// model, cross_entropy and mse read one output: a dict, tuple or list with
// candidates in more than one entry could mean any of them, so the loss
// must name it (`KIND@KEY`) rather than have the first taken silently.
// Candidates are the entries holding floating-point tensors; for model,
// those holding a one-element one (the loss a model returns beside its
// logits). Returns the only candidate's key, or "" when `outputs` is no
// container or has none; the error names the candidates.
absl::StatusOr<std::string> OnlyCandidate(const v1::LossSpec& loss,
                                          const c10::IValue& outputs) {
  std::vector<std::pair<std::string, c10::IValue>> entries;
  const char* what = outputs.isGenericDict() ? "dict"
                     : outputs.isTuple()     ? "tuple"
                                             : "list";
  if (outputs.isGenericDict()) {
    for (const auto& entry : outputs.toGenericDict()) {
      entries.emplace_back(entry.key().isString() ? entry.key().toStringRef()
                                                  : entry.key().tagKind(),
                           entry.value());
    }
  } else if (outputs.isTuple()) {
    const auto& e = outputs.toTupleRef().elements();
    for (size_t i = 0; i < e.size(); ++i) {
      entries.emplace_back(absl::StrCat(i), e[i]);
    }
  } else if (outputs.isList()) {
    int64_t i = 0;
    for (const c10::IValue& v : outputs.toListRef()) {
      entries.emplace_back(absl::StrCat(i++), v);
    }
  } else {
    return std::string();
  }
  std::vector<std::string> candidates;
  std::string first;
  for (const auto& [key, value] : entries) {
    for (const torch::Tensor& t : FlattenTensors(value)) {
      if (t.defined() && t.is_floating_point()) {
        if (loss.kind() == v1::LossSpec::MODEL && t.numel() != 1) break;
        if (first.empty()) first = key;
        candidates.push_back(
            absl::StrCat(key, " [", absl::StrJoin(t.sizes(), ","), "]"));
        break;
      }
    }
  }
  if (candidates.size() <= 1) return first;
  const std::string kind = LossKindName(loss.kind());
  const std::string example =
      loss.has_target() ? absl::StrCat(":", FormatTensorSpec(loss.target()))
                        : "";
  return absl::InvalidArgumentError(absl::StrCat(
      "loss ", kind, ": the model returns a ", what,
      loss.kind() == v1::LossSpec::MODEL ? " with one-element" : " with",
      " floating-point tensors in ", candidates.size(), " entries (",
      absl::StrJoin(candidates, ", "),
      "); name the output the loss reads with ", kind, "@OUTPUT, like ", kind,
      "@", first, example, " (terms over several outputs are joined by +)"));
}

// "loss KIND: output shape [..] does not fit target shape [..] (RULE)".
absl::Status ClassesDoNotFit(const v1::LossSpec& loss,
                             const torch::Tensor& logits,
                             const torch::Tensor& target,
                             absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat(
      "loss ", LossKindName(loss.kind()), ": output shape [",
      absl::StrJoin(logits.sizes(), ","), "] does not fit target shape [",
      absl::StrJoin(target.sizes(), ","), "] (", rule, ")"));
}

}  // namespace

absl::StatusOr<torch::Tensor> ComputeLoss(
    const v1::LossSpec& loss, const c10::IValue& all_outputs,
    const std::vector<torch::Tensor>& targets) {
  if (!loss.terms().empty()) {
    MUTWO_RETURN_IF_ERROR(ValidateLossSpec(loss));
    torch::Tensor sum;
    size_t next_target = 0;
    for (const v1::LossSpec& term : loss.terms()) {
      std::vector<torch::Tensor> term_targets;
      if (term.has_target()) {
        if (next_target >= targets.size()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "loss ", FormatLossSpec(term), ": no target tensor for it"));
        }
        term_targets.push_back(targets[next_target++]);
      }
      auto value = ComputeLoss(term, all_outputs, term_targets);
      if (!value.ok()) {
        return absl::Status(value.status().code(),
                            absl::StrCat("term ", FormatLossSpec(term), ": ",
                                         value.status().message()));
      }
      sum = sum.defined() ? sum + *value : *value;
    }
    return sum;
  }
  const bool reads_one =
      LossKindTakesTarget(loss.kind()) || loss.kind() == v1::LossSpec::MODEL;
  std::string output = loss.output();
  if (reads_one && output.empty()) {
    MUTWO_ASSIGN_OR_RETURN(output, OnlyCandidate(loss, all_outputs));
  }
  torch::Tensor target;
  if (LossKindTakesTarget(loss.kind())) {
    if (targets.size() != 1 || !targets[0].defined()) {
      return absl::InvalidArgumentError(absl::StrCat("loss ",
                                                     FormatLossSpec(loss),
                                                     ": expected 1 target "
                                                     "tensor, got ",
                                                     targets.size()));
    }
    target = targets[0];
  }
  c10::IValue outputs = all_outputs;
  if (!output.empty()) {
    MUTWO_ASSIGN_OR_RETURN(outputs, SelectOutput(all_outputs, output));
  }
  std::vector<torch::Tensor> floats;
  for (const torch::Tensor& t : FlattenTensors(outputs)) {
    if (t.defined() && t.is_floating_point()) floats.push_back(t);
  }
  if (floats.empty()) {
    return absl::InvalidArgumentError(
        "loss: the model returns no floating-point tensor");
  }
  try {
    switch (loss.kind()) {
      case v1::LossSpec::SUM: {
        torch::Tensor sum = floats[0].sum();
        for (size_t i = 1; i < floats.size(); ++i) sum = sum + floats[i].sum();
        return sum;
      }
      case v1::LossSpec::MODEL:
        if (floats[0].numel() != 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "loss model: the output must be the scalar loss, got shape [",
              absl::StrJoin(floats[0].sizes(), ","), "]"));
        }
        return floats[0].reshape({});
      case v1::LossSpec::CROSS_ENTROPY: {
        torch::Tensor logits = floats[0];
        // Classes in the last dimension ([B,C], [B,T,V] with target [B,T]),
        // or in dimension 1 with a target shaped like the rest
        // ([B,C,H,W] with target [B,H,W], as PyTorch's cross_entropy).
        std::vector<int64_t> without_dim1(logits.sizes().begin(),
                                          logits.sizes().end());
        if (without_dim1.size() >= 3) {
          without_dim1.erase(without_dim1.begin() + 1);
        }
        const std::vector<int64_t> target_shape(target.sizes().begin(),
                                                target.sizes().end());
        if (ClassesLast(logits, target)) {
          return torch::nn::functional::cross_entropy(
              logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
        }
        if (logits.dim() >= 3 && target_shape == without_dim1) {
          return torch::nn::functional::cross_entropy(logits, target);
        }
        if (logits.dim() < 2 ||
            logits.numel() != target.numel() * logits.size(-1)) {
          return ClassesDoNotFit(loss, logits, target,
                                 "classes must be the last output dimension, "
                                 "or dimension 1 with a target shaped like "
                                 "the output without it");
        }
        return torch::nn::functional::cross_entropy(
            logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
      }
      case v1::LossSpec::CHUNKED_CROSS_ENTROPY: {
        const torch::Tensor& logits = floats[0];
        if (!ClassesLast(logits, target)) {
          return ClassesDoNotFit(
              loss, logits, target,
              "classes must be the last output dimension and the target "
              "shaped like the output without it; for classes in dimension "
              "1 use cross_entropy");
        }
        const int64_t classes = logits.size(-1);
        if (loss.target().has_range() &&
            (loss.target().range().low() < 0 ||
             loss.target().range().high() > static_cast<double>(classes))) {
          return absl::InvalidArgumentError(absl::StrCat(
              "loss chunked_cross_entropy: target \"",
              FormatTensorSpec(loss.target()), "\" draws classes outside [0,",
              classes, "), the output's last dimension"));
        }
        // The worker drops the model's outputs after the loss: the logits'
        // memory takes their gradient unless the graph holds them too.
        return ChunkedCrossEntropy(logits, target, LogitsReuse::kSoleHolder);
      }
      case v1::LossSpec::MSE: {
        const torch::Tensor& out = floats[0];
        if (out.sizes() != target.sizes()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "loss mse: output shape [", absl::StrJoin(out.sizes(), ","),
              "] differs from target \"", FormatTensorSpec(loss.target()),
              "\" shape [", absl::StrJoin(target.sizes(), ","),
              "]; give the target the output's shape"));
        }
        return torch::nn::functional::mse_loss(out, target.to(out.dtype()));
      }
      case v1::LossSpec::MEAN:
      case v1::LossSpec::KIND_UNSPECIFIED:
      default: {
        torch::Tensor sum = floats[0].mean();
        for (size_t i = 1; i < floats.size(); ++i) {
          sum = sum + floats[i].mean();
        }
        return sum;
      }
    }
  } catch (const c10::Error& e) {
    if (IsOutOfMemoryMessage(e.msg())) {
      return absl::ResourceExhaustedError(
          absl::StrCat("loss: ", FirstLine(e.msg())));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("loss: ", FirstLine(e.msg())));
  }
}

int OptimizerStatesPerParameter(v1::OptimizerSpec::Kind kind) {
  switch (kind) {
    case v1::OptimizerSpec::ADAM:
    case v1::OptimizerSpec::ADAMW:
      return 2;
    case v1::OptimizerSpec::SGD_MOMENTUM:
      return 1;
    default:
      return 0;
  }
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(
    const v1::OptimizerSpec& spec,
    const std::vector<torch::Tensor>& parameters) {
  const double lr = spec.learning_rate() > 0 ? spec.learning_rate() : 1e-3;
  if (spec.learning_rate() < 0 || spec.weight_decay() < 0 ||
      spec.momentum() < 0) {
    return absl::InvalidArgumentError(
        "optimizer: learning rate, momentum and weight decay must be >= 0");
  }
  // Multi-tensor updates with LibTorch's arithmetic (foreach_optimizer.h).
  ForeachOptions options;
  options.lr = lr;
  options.weight_decay = spec.weight_decay();
  options.all_at_once = spec.foreach_update();
  switch (spec.kind()) {
    case v1::OptimizerSpec::NONE:
      return std::unique_ptr<torch::optim::Optimizer>();
    case v1::OptimizerSpec::SGD_MOMENTUM:
      options.momentum = spec.momentum() > 0 ? spec.momentum() : 0.9;
      break;
    case v1::OptimizerSpec::ADAM:
      options.kind = ForeachOptions::Kind::kAdam;
      break;
    case v1::OptimizerSpec::ADAMW:
      options.kind = ForeachOptions::Kind::kAdamW;
      break;
    case v1::OptimizerSpec::SGD:
    case v1::OptimizerSpec::KIND_UNSPECIFIED:
    default:
      break;
  }
  return std::unique_ptr<torch::optim::Optimizer>(
      new ForeachOptimizer(parameters, options));
}

int64_t StorageBytes(const std::vector<torch::Tensor>& tensors) {
  absl::flat_hash_set<const void*> seen;
  int64_t bytes = 0;
  for (const torch::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const void* key = t.storage().unsafeGetStorageImpl();
    if (seen.insert(key).second) {
      bytes += static_cast<int64_t>(t.storage().nbytes());
    }
  }
  return bytes;
}

}  // namespace mutwo::worker
