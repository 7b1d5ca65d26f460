// Loads a TorchScript module from bytes, refusing bad files with a clear
// error instead of crashing: empty or oversized input, not a zip archive,
// a truncated or corrupt archive, an archive that inflates far beyond its
// size (a zip bomb), or a module without `forward`. The archive checks are
// common/model_archive.h's (mutwo-server makes them at submit too). Internal
// to the worker (includes LibTorch).
#ifndef MUTWO_WORKER_MODEL_LOADER_H_
#define MUTWO_WORKER_MODEL_LOADER_H_

#include <torch/script.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace mutwo::worker {

inline constexpr int64_t kMaxModelBytes = int64_t{16} << 30;  // 16 GiB

// `what` names the model in errors (a file path or a sha256). The module is
// put in training mode on `device`, its code's device constants retargeted
// to it (worker/device_constants.h; logged at info). Errors are InvalidArgument
// and name `what` and the problem.
[[nodiscard]] absl::StatusOr<torch::jit::Module> LoadModule(
    const std::string& bytes, const std::string& what,
    const torch::Device& device, int64_t max_bytes = kMaxModelBytes);

// Reads `path` (size checked before reading) and calls LoadModule.
[[nodiscard]] absl::StatusOr<torch::jit::Module> LoadModuleFile(
    const std::string& path, const torch::Device& device,
    int64_t max_bytes = kMaxModelBytes);

// First line of a LibTorch error without the C++ backtrace.
std::string FirstLine(const std::string& text);

// True for the messages of LibTorch's out-of-memory errors (CUDA caching
// allocator, CPU allocator, the counting allocator's limit) and of a CUDA
// library that could not allocate its workspace or handle on a full card
// (cuBLAS's `CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)`,
// cuDNN's and cuSOLVER's *_STATUS_ALLOC_FAILED).
bool IsOutOfMemoryMessage(const std::string& text);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_MODEL_LOADER_H_
