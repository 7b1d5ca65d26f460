// Parsing and formatting of the text forms users type: byte sizes (`4GiB`),
// budgets (`60%`, `80%dev`, `4000MB`), tensor specs
// (`tokens:int64[B,128]{0,30000}`), loss and optimizer kinds and batch-size
// ranges (`8:64:x2`). Every error names the text and says what was expected.
// Stateless and thread-safe.
#ifndef MUTWO_COMMON_PARSE_H_
#define MUTWO_COMMON_PARSE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo {

// The value of a TensorSpec dimension that stands for the batch size B.
inline constexpr int64_t kBatchDim = -1;

// `123`, `123B`, `4KB`/`4MB`/`4GB`/`4TB` (powers of 1000),
// `4KiB`/`4MiB`/`4GiB`/`4TiB` (powers of 1024), fractions allowed (`1.5GiB`).
[[nodiscard]] absl::StatusOr<int64_t> ParseBytes(absl::string_view text);
// `1.50 GiB`, `512 B`.
std::string FormatBytes(int64_t bytes);

// Bytes with a unit as in ParseBytes (`4GiB`, `512B`), `60%` of the
// baseline peak, `80%dev` of the device, `auto` (any case) the knee of the
// Pareto curve. A bare number (`60`) is refused as ambiguous.
[[nodiscard]] absl::StatusOr<v1::MemoryBudget> ParseBudget(
    absl::string_view text);
std::string FormatBudget(const v1::MemoryBudget& budget);
// The one rule for a budget however it arrived (text, RPC, file): bytes
// positive, a fraction of the baseline or the device in (0, 1], knee and
// floor true when set. ParseBudget's results always pass; the server checks
// what clients send and the planner what it is asked to resolve.
[[nodiscard]] absl::Status ValidateBudget(const v1::MemoryBudget& budget);

// `NAME:DTYPE[D0,D1,...]` with an optional `{LOW,HIGH}` value range; a
// dimension is a positive integer or `B` (the batch size).
[[nodiscard]] absl::StatusOr<v1::TensorSpec> ParseTensorSpec(
    absl::string_view text);
std::string FormatTensorSpec(const v1::TensorSpec& spec);
// The spec's dims with B replaced by `batch_size`.
std::vector<int64_t> ConcreteDims(const v1::TensorSpec& spec,
                                  int64_t batch_size);
// Bytes of one tensor of `spec` at `batch_size`.
int64_t TensorBytes(const v1::TensorSpec& spec, int64_t batch_size);
[[nodiscard]] absl::StatusOr<v1::DType> ParseDType(absl::string_view text);
std::string DTypeName(v1::DType dtype);
int64_t DTypeSize(v1::DType dtype);
bool IsFloatingDType(v1::DType dtype);

// A loss, docs/loss.md: `KIND[@OUTPUT][:TARGET]` with KIND `mean`, `sum`,
// `model`, `cross_entropy:TARGET_SPEC` (int64 class indices, e.g.
// `cross_entropy:y:int64[B]{0,1000}`) or `mse:TARGET_SPEC` (floating point,
// the output's shape, e.g. `mse@aux:z:float32[B,4]`); several terms joined
// by `+` are summed (LossSpec.terms). Errors name the bad term.
[[nodiscard]] absl::StatusOr<v1::LossSpec> ParseLossSpec(
    absl::string_view text);
// The values of a repeated --loss flag: their terms summed; none is `mean`.
[[nodiscard]] absl::StatusOr<v1::LossSpec> ParseLossFlags(
    const std::vector<std::string>& values);
// The one spelling of a loss kind: what ParseLossSpec reads, FormatLossSpec
// writes, error messages name and the schedule cache key stores (keys in
// SQLite depend on it, so it never changes). KIND_UNSPECIFIED is "mean".
const char* LossKindName(v1::LossSpec::Kind kind);
// Whether a loss of `kind` compares the output with a target tensor
// (cross_entropy and mse; the others take none).
bool LossKindTakesTarget(v1::LossSpec::Kind kind);
// The text ParseLossSpec reads back to `loss`.
std::string FormatLossSpec(const v1::LossSpec& loss);
// Checks a LossSpec from anywhere (a parsed flag, a submitted job): kinds
// with a target have one of the right dtype, terms have no terms, targets
// of the terms have distinct names.
[[nodiscard]] absl::Status ValidateLossSpec(const v1::LossSpec& loss);
// Every target spec of `loss` (its own, or its terms' in order).
std::vector<v1::TensorSpec> LossTargets(const v1::LossSpec& loss);

// `none`, `sgd`, `sgd_momentum`, `adam`, `adamw`, optionally followed by
// `:lr=0.01` (and `,momentum=0.9`, `,weight_decay=0.01`).
[[nodiscard]] absl::StatusOr<v1::OptimizerSpec> ParseOptimizerSpec(
    absl::string_view text);
std::string FormatOptimizerSpec(const v1::OptimizerSpec& optimizer);

// `16`, `8,16,32`, `8:64` (doubling), `8:64:x2`, `8:64:+8`.
[[nodiscard]] absl::StatusOr<std::vector<int64_t>> ParseBatchSizes(
    absl::string_view text);

// Checks that a spec makes sense before any work is done with it: names
// unique and non-empty, dims positive or B, integer inputs have a range.
[[nodiscard]] absl::Status ValidateInputs(
    const std::vector<v1::TensorSpec>& inputs);

// Refuses a spec without the batch dimension B (a fixed first dimension
// would stay the same at every --batch, and the step fails later, deep in
// the model), unless its name is in `unbatched`: the user's statement that
// it has none. Checks every input and the loss target (when `loss` has
// one); a name in `unbatched` that names no spec, or a spec with B, is an
// error too. Messages name the spec.
[[nodiscard]] absl::Status CheckBatchDims(
    const std::vector<v1::TensorSpec>& inputs, const v1::LossSpec* loss,
    const std::vector<std::string>& unbatched);

}  // namespace mutwo

#endif  // MUTWO_COMMON_PARSE_H_
