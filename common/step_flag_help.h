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
    "KIND[@OUTPUT][:TARGET] (docs/loss.md). KIND: mean or sum (over every "
    "floating-point output), model (the model returns its loss, a "
    "one-element tensor), cross_entropy:TARGET (TARGET int64 class indices, "
    "e.g. cross_entropy:y:int64[B]{0,1000}), chunked_cross_entropy:TARGET "
    "(the same, classes last, without a log-softmax of the whole output "
    "held: one logits-sized tensor less) or mse:TARGET (TARGET floating "
    "point of the output's shape, e.g. mse:z:float32[B,4]); targets are "
    "generated from --seed like inputs. @OUTPUT reads one dict key or "
    "tuple index of the output (e.g. cross_entropy@logits:y:int64[B]{0,10}, "
    "mean@0): model, cross_entropy and mse need it when several entries "
    "could be meant. Several terms are summed: repeat --loss or join with +, "
    "e.g. --loss cross_entropy@logits:y:int64[B]{0,10} --loss "
    "mse@aux:z:float32[B,4] (default: mean)";

inline constexpr char kOptimizerFlagHelp[] =
    "none, sgd, sgd_momentum, adam or adamw, optionally "
    ":lr=...,momentum=...,weight_decay=...,foreach (foreach: the update's "
    "temporaries span all parameters at once, as torch.optim's default on "
    "CUDA; without: at most the largest parameter)";

}  // namespace mutwo

#endif  // MUTWO_COMMON_STEP_FLAG_HELP_H_
