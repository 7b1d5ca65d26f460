// Retargets the device constants a TorchScript file carries to the device
// the worker runs it on. torch.jit.trace records `device=` arguments (and
// `x.device` it met) as constants of the device it traced on, so a model
// traced on the CPU and trained on cuda:0 makes its tensors on the CPU and
// fails in the first op that mixes them ("Expected all tensors to be on the
// same device"). Tensors in the archive are already mapped by
// torch::jit::load(..., device); only the Device constants of the code are
// left. Internal to the worker (includes LibTorch); a pure function over
// the module's compilation unit, not thread-safe against a running module.
#ifndef MUTWO_WORKER_DEVICE_CONSTANTS_H_
#define MUTWO_WORKER_DEVICE_CONSTANTS_H_

#include <torch/script.h>

#include <string>
#include <vector>

namespace mutwo::worker {

struct RetargetedDevices {
  int constants = 0;              // Device constants rewritten
  std::vector<std::string> from;  // the devices they named, sorted, unique
  // 0-dim tensor constants of shape arithmetic put back on the CPU.
  int shape_constants = 0;
};

// An input of a node: node->input(input).
struct ConstantUse {
  torch::jit::Node* node = nullptr;
  size_t input = 0;
};

// torch.jit.trace records shape arithmetic (`b *= 4` on a batch size read
// from x.shape, as timm's hiera does) as ops on 0-dim tensors:
// prim::NumToTensor makes them on the CPU, and the number the trace met
// becomes a 0-dim tensor constant, which torch::jit::load(..., device)
// moves to the device; an in-place op then mixes the two and fails
// ("Expected all tensors to be on the same device"). These are the reads of
// 0-dim tensor constants by ops on values computed from shapes
// (NumToTensor's outputs, and the outputs of an op whose tensor inputs are
// all such values or 0-dim constants), in `block` and the blocks in it.
std::vector<ConstantUse> ShapeArithmeticConstants(torch::jit::Block* block);

// Rewrites every `prim::Constant` of Device type in every function of
// `module`'s compilation unit (forward, submodules' methods, called
// functions) that names a device other than `device` to `device`. Run once,
// right after loading and before any graph is copied or run. A model that
// means to put work on another device than the one it trains on is not
// supported by the worker (the step runs on one device), so nothing is
// lost. The constants of a trace's shape arithmetic (ShapeArithmeticConstants)
// go to the CPU instead, where the shapes are.
RetargetedDevices RetargetDeviceConstants(torch::jit::Module& module,
                                          const torch::Device& device);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_DEVICE_CONSTANTS_H_
