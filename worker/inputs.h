// What a training step needs besides the model: generated inputs from
// v1::TensorSpec, the scalar loss from the outputs (v1::LossSpec), and the
// optimizer (v1::OptimizerSpec) with the memory its state takes.
// Internal to the worker (includes LibTorch). Stateless functions.
#ifndef MUTWO_WORKER_INPUTS_H_
#define MUTWO_WORKER_INPUTS_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo::worker {

// The spec dtype of tensors of `type`; nullopt for a type no spec names.
std::optional<v1::DType> DTypeOf(torch::ScalarType type);

// One tensor per spec, B replaced by `batch_size`: floating dtypes ~ N(0, 1),
// integer dtypes uniform in [low, high), bool uniform in {false, true}.
// Deterministic for a given seed. InvalidArgument names a bad spec.
[[nodiscard]] absl::StatusOr<torch::Tensor> MakeTensor(
    const v1::TensorSpec& spec, int64_t batch_size,
    const torch::Device& device);
[[nodiscard]] absl::StatusOr<std::vector<torch::Tensor>> MakeInputs(
    const std::vector<v1::TensorSpec>& specs, int64_t batch_size,
    const torch::Device& device, uint64_t seed);

// The loss targets, one per target spec of `loss` in order (LossTargets:
// its own, or one per term that has one): cross_entropy class indices,
// mse floating point. Call after MakeInputs: they continue its seeded
// random stream, so the same seed gives the same targets.
[[nodiscard]] absl::StatusOr<std::vector<torch::Tensor>> MakeTargets(
    const v1::LossSpec& loss, int64_t batch_size, const torch::Device& device);

// Every tensor in `outputs` (tensors, lists, tuples, dict values), in order.
std::vector<torch::Tensor> FlattenTensors(const c10::IValue& outputs);

// The scalar loss `loss` makes from `outputs` (docs/loss.md). MEAN
// (default): sum over floating outputs of their mean; SUM: sum of their
// sums; MODEL: the output, which must be a one-element floating tensor;
// CROSS_ENTROPY: cross entropy of the output (classes in the last
// dimension, or dimension 1) against its target; CHUNKED_CROSS_ENTROPY:
// the same with classes in the last dimension, computed by
// ChunkedCrossEntropy (no log-softmax of the whole output held, and the
// gradient written over the logits when nothing else holds them: outputs
// are not read after the loss's backward); MSE: mean squared error of the
// output against its target, of the same shape; terms: their sum.
// `@OUTPUT` selects a dict entry or tuple/list element; MODEL,
// CROSS_ENTROPY and MSE without one refuse a dict, tuple or list with
// floating-point tensors in several entries, naming them. `targets` as
// MakeTargets made them. InvalidArgument says what did not fit.
[[nodiscard]] absl::StatusOr<torch::Tensor> ComputeLoss(
    const v1::LossSpec& loss, const c10::IValue& outputs,
    const std::vector<torch::Tensor>& targets);

// State tensors per parameter: Adam/AdamW 2, SGD with momentum 1, else 0.
int OptimizerStatesPerParameter(v1::OptimizerSpec::Kind kind);

// A torch::optim optimizer over `parameters`; nullptr for NONE.
[[nodiscard]] absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>>
MakeOptimizer(const v1::OptimizerSpec& spec,
              const std::vector<torch::Tensor>& parameters);

// Distinct storages of `tensors`, in bytes.
int64_t StorageBytes(const std::vector<torch::Tensor>& tensors);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_INPUTS_H_
