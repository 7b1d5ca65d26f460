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
};

// Rewrites every `prim::Constant` of Device type in every function of
// `module`'s compilation unit (forward, submodules' methods, called
// functions) that names a device other than `device` to `device`. Run once,
// right after loading and before any graph is copied or run. A model that
// means to put work on another device than the one it trains on is not
// supported by the worker (the step runs on one device), so nothing is
// lost.
RetargetedDevices RetargetDeviceConstants(torch::jit::Module& module,
                                          const torch::Device& device);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_DEVICE_CONSTANTS_H_
