// Control-flow specialisation: the IR of a training step as it runs, not as
// it is written. A scripted model's forward keeps its `if`s and loops; a
// prim::If or prim::Loop is one opaque IR node (graph.h), so the planner
// could only keep or recompute it whole (a scripted nn.TransformerEncoderLayer
// is one prim::If: its fast-path check puts the whole layer in a branch).
//
// CreateSpecializedGraph builds the IR of Graph::Create and then
//  1. unrolls each prim::Loop whose trip count is a constant of at most
//     SpecializeOptions::max_unrolled_trips and whose body never breaks out
//     (the iteration index becomes a constant; side effects keep their
//     order, so the unrolled graph does what the loop did);
//  2. runs forward on the step's inputs (train mode, autograd on, as the
//     training step runs it; `recording_runs` times) and records the branch
//     each prim::If takes;
//  3. replaces each prim::If that is not inside a loop and took the same
//     branch every time by the nodes of that branch, inlined where the If
//     was, preceded by a guard node (kind kBranchGuardKind) that re-checks
//     the condition at run time and fails with
//       "mutwo: control flow at encoder.layers.0 took the other branch than
//        when the model was profiled; re-profile ..."
//     Ifs the inlining exposes are specialised the same way. Ifs inside a
//     loop left opaque, or whose branch differed between runs, stay as
//     they are. Then dead code is eliminated and the graph numbered as
//     Graph::Create numbers it.
// The same module and inputs always give the same graph and fingerprint,
// so the profiler and the executor (both through SetUpTraining, with the
// inputs generated from the same specs, batch size and seed) share ids.
//
// The recording runs update nothing the step could see: the module's
// buffers (batch-norm statistics) are restored afterwards, and the caller
// reseeds the RNG before its steps (MakeInputs does).
//
// Internal to the worker (includes LibTorch). Stateless functions; the
// module must not be used by another thread while they run.
#ifndef MUTWO_WORKER_SPECIALIZE_H_
#define MUTWO_WORKER_SPECIALIZE_H_

#include <torch/script.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "worker/graph.h"

namespace mutwo::worker {

struct SpecializeOptions {
  // Forward runs that record branches; an If must take the same branch in
  // every one (a condition on random numbers is then likely left alone).
  int recording_runs = 2;
  // Loops with a constant trip count up to this many are unrolled.
  int max_unrolled_trips = 64;
  // Unrolling stops adding nodes beyond this many (over the whole graph).
  int max_unrolled_nodes = 8192;
  // forward's arguments no input gives, constants of the graph
  // (worker/forward_inputs.h); the recording's inputs are the others.
  std::vector<OmittedArgument> omitted_arguments;
};

struct SpecializeStats {
  int loops_unrolled = 0;
  int ifs_specialized = 0;
  int ifs_kept = 0;  // top-level prim::If nodes left in the graph
  // Why no branch was recorded (the forward failed on the inputs); the
  // graph then has its loops unrolled but no If specialised. Empty if
  // recorded.
  std::string recording_error;
};

// See the file comment. `inputs` are forward's arguments after self, as the
// training step passes them. Errors: those of Graph::Create; a forward that
// fails on `inputs` is not an error (see SpecializeStats::recording_error:
// the step itself will report it).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Graph>> CreateSpecializedGraph(
    const torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
    const SpecializeOptions& options = {}, SpecializeStats* stats = nullptr);

// The passes, for tests and for callers with their own graph.

// Step 1 on `graph` (any depth). Returns the number of loops unrolled.
int UnrollConstantLoops(torch::jit::Graph& graph,
                        const SpecializeOptions& options = {});

// Branch taken per prim::If of `graph`'s torch graph (true: the "then"
// block) over `options.recording_runs` forward runs of `module` on
// `inputs`; only Ifs outside loops that took the same branch in every run.
// Errors: what the forward raises (InvalidArgument, ResourceExhausted).
[[nodiscard]] absl::StatusOr<absl::flat_hash_map<const torch::jit::Node*, bool>>
RecordBranches(const Graph& graph, const torch::jit::Module& module,
               const std::vector<c10::IValue>& inputs,
               const SpecializeOptions& options = {});

// Step 3: specialises the top-level Ifs of `graph` found in `taken` (and
// those their inlining exposes), naming scopes from `module`. Returns the
// number of Ifs specialised.
int SpecializeBranches(
    torch::jit::Graph& graph,
    const absl::flat_hash_map<const torch::jit::Node*, bool>& taken,
    const torch::jit::Module& module);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_SPECIALIZE_H_
