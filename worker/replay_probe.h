// What one recompute segment's replay costs the host beyond the ops it
// runs again: the executor's autograd function, its nested backward
// (Engine::execute over the replay's graph) and the RNG state saved and
// restored around the replay (checkpoint.h). A segment's replay of small
// ops on a fast device is bound by the host, so the planner adds this per
// segment (MeasuredStep.replay_overhead_ms). Measured by running that
// mechanism over a one-element tensor on the profiled device, against the
// same op without it.
//
// Internal to the worker (includes LibTorch). Not thread-safe (runs
// autograd on the calling thread; the RNG state is put back).
#ifndef MUTWO_WORKER_REPLAY_PROBE_H_
#define MUTWO_WORKER_REPLAY_PROBE_H_

#include <torch/torch.h>

#include <functional>

namespace mutwo::worker {

// Median over `rounds` of the per-replay host time (ms, >= 0) of
// `per_round` probe steps minus as many plain steps. `synchronize` waits
// for the device (each round ends with it). Throws LibTorch errors.
double MeasureReplayOverheadMs(const torch::Device& device,
                               const std::function<void()>& synchronize,
                               int rounds = 5, int per_round = 64);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_REPLAY_PROBE_H_
