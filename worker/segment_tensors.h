// Tensor plumbing shared by a segment's forward run (checkpoint.cc) and
// its replay and backward (segment_replay.cc). Internal to the worker
// (includes LibTorch). Thread-compatible.
#ifndef MUTWO_WORKER_SEGMENT_TENSORS_H_
#define MUTWO_WORKER_SEGMENT_TENSORS_H_

#include <torch/script.h>

#include <vector>

namespace mutwo::worker {

// Appends the tensors of `value` (a tensor, or lists, tuples and dict values
// of them at any depth), in order.
void AppendTensors(const c10::IValue& value, std::vector<torch::Tensor>* out);

// A DataPtr onto `owner`'s memory that keeps `owner` alive: a freed storage
// and the replay's output share one allocation.
c10::DataPtr SharedDataPtr(const c10::Storage& owner);

// Gives `copy` (a clone of `original`, same layout) `original`'s memory:
// its own is freed, and whoever saved `copy` reads `original`'s values.
void ShareMemory(const torch::Tensor& copy, const torch::Tensor& original);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_SEGMENT_TENSORS_H_
