// The help of the training-step flags that `mutwo` (submit) and
// `mutwo-worker` (profile, execute) both define: one text, so the two
// binaries describe --unbatched, --loss and --optimizer the same way.
#ifndef MUTWO_COMMON_STEP_FLAG_HELP_H_
#define MUTWO_COMMON_STEP_FLAG_HELP_H_

namespace mutwo {

inline constexpr char kUnbatchedFlagHelp[] =
    "NAME: input (or loss target) NAME has no batch dimension B on "
    "purpose; repeat per input";

inline constexpr char kLossFlagHelp[] =
    "mean or sum (over every floating-point output), model (the model "
    "returns its loss: the first floating-point output, a scalar) or "
    "cross_entropy:TARGET (e.g. cross_entropy:y:int64[B]{0,1000}); "
    "KIND@OUTPUT reads one dict entry or tuple index of the output, "
    "e.g. cross_entropy@logits:y:int64[B]{0,1000} or mean@0 (needed "
    "by cross_entropy when several entries hold floating-point "
    "tensors)";

inline constexpr char kOptimizerFlagHelp[] =
    "none, sgd, sgd_momentum, adam or adamw, optionally "
    ":lr=...,momentum=...,weight_decay=...";

}  // namespace mutwo

#endif  // MUTWO_COMMON_STEP_FLAG_HELP_H_
