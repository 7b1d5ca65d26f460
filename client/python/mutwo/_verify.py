"""`python3 -m mutwo verify`: a schedule measured on the user's own eager
model, the way `mutwo-worker execute` measures it on the TorchScript step.

    python3 -m mutwo verify model.py:make_model --schedule s.json --batch 8 \
        --device cuda:0 [--inputs x:float32[B,3,224,224]] \
        [--loss cross_entropy:y:int64[B]{0,1000}] [--optimizer adam] \
        [--steps 3] [--output text|json]

MODEL_PY:FACTORY names a Python file and a function in it:

- `FACTORY()` returns the `nn.Module` (built on the CPU or anywhere; it is
  moved to --device), or a pair `(module, batch_fn)`.
- The batch comes from, in this order: --inputs (tensor specs as the worker
  takes them, filled with seeded random values; a `cross_entropy:SPEC` loss
  draws its target the same way), the pair's `batch_fn`, or a function
  `batch(batch_size, device)` defined in MODEL_PY. A batch function returns
  `(inputs, target)`: `inputs` a tensor or a tuple of tensors passed to the
  model positionally, `target` a tensor or None.
- The loss: a function `loss(output, target)` defined in MODEL_PY if there
  is one and --loss is not given; else --loss as the worker takes it (`mean`
  and `sum` over the floating outputs, `model`: the model returns its loss,
  `cross_entropy[:SPEC]`, `chunked_cross_entropy[:SPEC]`, `mse[:SPEC]`:
  against the target; terms joined
  by `+` are summed, each with its own target; docs/loss.md); default
  `cross_entropy` when there is an integer target, `mean` otherwise.

Both steps run in one process on --device, from the same weights, seed and
data: the UNMODIFIED step and the step with `mutwo.apply(model, schedule)`.
First one step each with deterministic kernels and TF32 off (on CUDA a
second unmodified step measures the kernels' own noise, as the worker does),
comparing gradients (largest |difference| against the largest gradient
element), the loss and buffers such as batch-norm running statistics after
the step. Then the timed steps (1 warm-up, then --steps; median time) of the
unmodified model, then of the applied one, one model on the device at a
time. Peak memory on CUDA: `torch.cuda.max_memory_allocated` over the timed
steps after `reset_peak_memory_stats` (the caching allocator's bytes, the
worker's measure). On the CPU there is no such statistic: one extra step
runs under `torch.profiler` with `profile_memory`, and the peak is the bytes
of the tensors alive when that step starts (parameters, buffers, optimizer
state, batch) plus the highest running sum of the CPU allocator's
allocations minus frees during the step. The output names the measure.
It also gives mutwo.apply's own measurements of the first scheduled step
(`Applied.measurements()`: saved-tensor bytes held at the end of forward
with and without the schedule, against the planned saving) and any
BudgetWarning apply raised.

Exit codes as `mutwo-worker execute`: 0 the schedule holds (within its
budget, gradients, loss and buffers equal to the unmodified step); 1 it does
not (over budget, out of memory, or something differs; the table is printed
either way and stderr says why); 2 bad arguments or input (the model file,
the factory, the schedule file, a schedule of another model, or one whose
RECOMPUTE/SWAP decisions match no tensor autograd saves in this model's
forward: mutwo.apply's ScheduleMismatchError, raised before any backward);
3 the planner marked the schedule infeasible (nothing run; --force runs it
anyway, passing force=True to mutwo.apply).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3

# Gradient tolerance, as client/python/tests/test_apply.py compares steps:
# |difference| <= ATOL + RTOL * (largest gradient element of the step).
GRAD_RTOL = 1e-5
GRAD_ATOL = 1e-6
# The worker's kMaxLossDiff (common/validation_check.h).
MAX_LOSS_DIFF = 1e-4

CPU_PEAK_MEASURE = ("cpu: tensors alive at the step's start + highest "
                    "running sum of CPU allocator allocations minus frees "
                    "during one step (torch.profiler profile_memory)")
CUDA_PEAK_MEASURE = ("cuda: torch.cuda.max_memory_allocated over the timed "
                     "steps (after reset_peak_memory_stats)")


class UsageError(Exception):
    """Bad arguments or input: exit code 2, the message says what to fix."""


@dataclasses.dataclass
class UserModel:
    """What MODEL_PY:FACTORY gave: the module and how to feed it."""
    model: Any
    batch_fn: Optional[Callable[[int, Any], Any]]
    loss_fn: Optional[Callable[[Any, Any], Any]]
    source: str


def load_user_model(spec: str) -> UserModel:
    """Imports MODEL_PY and calls FACTORY(); raises UsageError naming what
    was wrong (the file, the import, the function, what it returned)."""
    from torch import nn
    path, sep, factory_name = spec.rpartition(":")
    if not sep or not path or not factory_name:
        raise UsageError(
            f'model "{spec}": expected MODEL_PY:FACTORY, like '
            "model.py:make_model (a Python file and a function in it that "
            "returns the nn.Module)")
    if not factory_name.isidentifier():
        raise UsageError(f'model "{spec}": FACTORY "{factory_name}" is not a '
                         "Python function name")
    if not os.path.isfile(path):
        raise UsageError(f'model "{spec}": MODEL_PY "{path}": no such file')
    name = "mutwo_verify_user_model"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f'model "{spec}": "{path}" is not a Python file '
                         "(use a .py file)")
    module = importlib.util.module_from_spec(module_spec)
    # The model file may import its neighbours.
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # the user's code: any error is bad input
        raise UsageError(f'model "{spec}": importing "{path}" failed: '
                         f"{type(e).__name__}: {e}") from e
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        functions = sorted(n for n, v in vars(module).items()
                           if callable(v) and not n.startswith("_") and
                           getattr(v, "__module__", None) == name)
        raise UsageError(
            f'model "{spec}": "{path}" has no function "{factory_name}"'
            + (f"; it defines {', '.join(functions)}" if functions else ""))
    try:
        made = factory()
    except Exception as e:
        raise UsageError(f'model "{spec}": {factory_name}() raised '
                         f"{type(e).__name__}: {e}") from e
    batch_fn = getattr(module, "batch", None)
    if isinstance(made, tuple) and len(made) == 2 and callable(made[1]):
        made, batch_fn = made
    if not isinstance(made, nn.Module):
        raise UsageError(
            f'model "{spec}": {factory_name}() returned '
            f"{type(made).__name__}, expected an nn.Module or a pair "
            "(nn.Module, batch_fn)")
    loss_fn = getattr(module, "loss", None)
    return UserModel(made, batch_fn if callable(batch_fn) else None,
                     loss_fn if callable(loss_fn) else None, spec)


def _tensor_from_spec(spec: Any, batch: int, device: Any,
                      generator: Any) -> Any:
    import torch
    from mutwo._specs import BATCH_DIM
    from mutwo.v1 import types_pb2
    dtypes = {types_pb2.FLOAT32: torch.float32,
              types_pb2.FLOAT64: torch.float64,
              types_pb2.FLOAT16: torch.float16,
              types_pb2.BFLOAT16: torch.bfloat16,
              types_pb2.INT64: torch.int64, types_pb2.INT32: torch.int32,
              types_pb2.INT8: torch.int8, types_pb2.UINT8: torch.uint8,
              types_pb2.BOOL: torch.bool}
    shape = [batch if d == BATCH_DIM else d for d in spec.dims]
    dtype = dtypes[spec.dtype]
    if spec.HasField("range"):
        low, high = int(spec.range.low), int(spec.range.high)
        if dtype.is_floating_point:
            t = torch.rand(shape, generator=generator) * (high - low) + low
        else:
            t = torch.randint(low, high, shape, generator=generator)
    elif dtype == torch.bool:
        t = torch.rand(shape, generator=generator) < 0.5
    else:
        t = torch.randn(shape, generator=generator)
    return t.to(dtype).to(device)


def make_batch(user: UserModel, inputs: Sequence[str], loss: str,
               batch: int, device: Any, seed: int
               ) -> Tuple[Tuple[Any, ...], Any]:
    """(inputs tuple, target or None) on `device`; with --inputs and a
    loss of several terms with targets, a tuple of their targets."""
    import torch
    from mutwo._specs import parse_loss, parse_tensor_spec
    if inputs:
        generator = torch.Generator().manual_seed(seed)
        try:
            specs = [parse_tensor_spec(s) for s in inputs]
            target_specs = []
            if loss:
                loss_spec = parse_loss(loss)
                target_specs = [t.target for t in
                                (loss_spec.terms or [loss_spec])
                                if t.HasField("target")]
        except ValueError as e:
            raise UsageError(str(e)) from None
        xs = tuple(_tensor_from_spec(s, batch, device, generator)
                   for s in specs)
        # One target per term that has one, in order, after the inputs.
        targets = tuple(_tensor_from_spec(t, batch, device, generator)
                        for t in target_specs)
        return xs, (targets[0] if len(targets) == 1 else targets or None)
    if user.batch_fn is None:
        raise UsageError(
            f'model "{user.source}": no batch to run: pass --inputs '
            "(x:float32[B,3,224,224]) or define batch(batch_size, device) "
            "returning (inputs, target) in the model file")
    torch.manual_seed(seed)
    try:
        made = user.batch_fn(batch, device)
    except Exception as e:
        raise UsageError(f'model "{user.source}": batch({batch}, {device}) '
                         f"raised {type(e).__name__}: {e}") from e
    if not (isinstance(made, (tuple, list)) and len(made) == 2):
        raise UsageError(f'model "{user.source}": batch() returned '
                         f"{type(made).__name__}; expected (inputs, target)")
    xs, target = made
    if isinstance(xs, torch.Tensor):
        xs = (xs,)
    xs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x
               for x in xs)
    if isinstance(target, torch.Tensor):
        target = target.to(device)
    return xs, target


def make_loss(user: UserModel, loss: str, target: Any
              ) -> Callable[[Any], Any]:
    """The scalar loss of the model's output (several terms: their sum,
    each term taking the next of `target`'s tensors)."""
    import torch
    from mutwo._specs import TARGET_LOSS_KINDS, parse_loss
    if not loss and user.loss_fn is not None:
        fn = user.loss_fn
        return lambda out: fn(out, target)
    text = loss or ("cross_entropy" if isinstance(target, torch.Tensor) and
                    not target.dtype.is_floating_point else "mean")
    head = text.partition(":")[0]
    name, at, output = head.partition("@")
    if (name.lower() in TARGET_LOSS_KINDS and ":" not in text
            and "+" not in text):
        # Against the batch function's target: no target spec to parse.
        if at and not output:
            raise UsageError(f'loss "{text}": expected a dict key or tuple '
                             "index after '@', like cross_entropy@logits")
        return _term_loss(TARGET_LOSS_KINDS[name.lower()], output, target)
    try:
        spec = parse_loss(text)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not len(spec.terms):
        return _term_loss(spec.kind, spec.output, target)
    # A sum of terms: each term with a target takes the next one.
    targets = list(target) if isinstance(target, (tuple, list)) else (
        [target] if target is not None else [])
    fns = []
    for term in spec.terms:
        term_target = None
        if term.HasField("target"):
            if not targets:
                raise UsageError(f'loss "{text}": no target for term '
                                 f'"{_specs_format_loss(term)}"')
            term_target = targets.pop(0)
        fns.append(_term_loss(term.kind, term.output, term_target))
    return lambda out: sum(fn(out) for fn in fns)


def _specs_format_loss(loss: Any) -> str:
    from mutwo._specs import format_loss
    return format_loss(loss)


def _term_loss(kind: int, output: str, target: Any) -> Callable[[Any], Any]:
    """One loss term (no terms of its own), as the worker computes it."""
    import torch
    import torch.nn.functional as F
    from mutwo.v1 import types_pb2
    name = types_pb2.LossSpec.Kind.Name(kind).lower()

    def floats(out: Any) -> List[Any]:
        from mutwo._apply import _flat_tensors
        return [t for t in _flat_tensors(out) if t.is_floating_point()]

    def selected(out: Any) -> Any:
        if output:
            return select_output(out, output)
        key = refuse_ambiguous_logits(out, name)
        return out if key is None else select_output(out, str(key))

    from mutwo._specs import TARGET_LOSS_KINDS
    if kind in TARGET_LOSS_KINDS.values():
        if target is None:
            raise UsageError(f"--loss {name} needs a target: the batch "
                             f"function's target or {name}:SPEC")

    if kind == types_pb2.LossSpec.CROSS_ENTROPY:
        def cross_entropy(out: Any) -> Any:
            out = selected(out)
            logits = out if isinstance(out, torch.Tensor) else floats(out)[0]
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   target.reshape(-1))
        return cross_entropy
    if kind == types_pb2.LossSpec.CHUNKED_CROSS_ENTROPY:
        def chunked(out: Any) -> Any:
            from mutwo._loss import chunked_cross_entropy
            out = selected(out)
            logits = out if isinstance(out, torch.Tensor) else floats(out)[0]
            try:
                # As the worker: the step reads no output after the
                # backward, so the logits take their gradient.
                return chunked_cross_entropy(logits, target,
                                             reuse_logits=True)
            except ValueError as e:
                raise UsageError(str(e)) from None
        return chunked
    if kind == types_pb2.LossSpec.MSE:
        def mse(out: Any) -> Any:
            out = selected(out)
            pred = out if isinstance(out, torch.Tensor) else floats(out)[0]
            if pred.shape != target.shape:
                raise UsageError(f"loss mse: output shape {list(pred.shape)} "
                                 f"differs from the target's "
                                 f"{list(target.shape)}; give the target the "
                                 "output's shape")
            return F.mse_loss(pred, target.to(pred.dtype))
        return mse
    if kind == types_pb2.LossSpec.MODEL:
        def model_loss(out: Any) -> Any:
            out = selected(out)
            return out if isinstance(out, torch.Tensor) else floats(out)[0]
        return model_loss
    if kind == types_pb2.LossSpec.SUM:
        return lambda out: sum(t.sum() for t in floats(
            select_output(out, output) if output else out))
    return lambda out: sum(t.mean() for t in floats(
        select_output(out, output) if output else out))


def select_output(out: Any, key: str) -> Any:
    """The model output `key` names (--loss KIND@KEY): a dict entry, or a
    tuple or list element by its index (negative from the end), as the
    worker selects it."""
    if isinstance(out, dict):
        if key in out:
            return out[key]
        raise UsageError(f'loss @{key}: the model\'s output dict has no key '
                         f'"{key}" (keys: {", ".join(map(str, out))})')
    if isinstance(out, (tuple, list)):
        try:
            index = int(key)
        except ValueError:
            raise UsageError(f"loss @{key}: the model returns a "
                             f"{type(out).__name__}: select an element by "
                             "its index (like @0)") from None
        if not -len(out) <= index < len(out):
            raise UsageError(f"loss @{key}: index out of range (the model "
                             f"returns {len(out)} outputs)")
        return out[index]
    raise UsageError(f"loss @{key}: the model returns a single "
                     f"{type(out).__name__}, not a dict, tuple or list to "
                     "select from")


def refuse_ambiguous_logits(out: Any, kind: str) -> Any:
    """model, cross_entropy and mse read one output; a dict, tuple or list
    holding candidates in more than one entry could mean any of them, so
    the loss must name it (`KIND@OUTPUT`), as the worker requires.
    Candidates hold floating-point tensors (for model, one-element ones).
    Returns the only candidate's key, None for no container or none."""
    from mutwo._apply import _flat_tensors
    if isinstance(out, dict):
        entries = list(out.items())
    elif isinstance(out, (tuple, list)):
        entries = list(enumerate(out))
    else:
        return None
    candidates, keys = [], []
    for key, value in entries:
        tensors = [t for t in _flat_tensors(value) if t.is_floating_point()]
        if tensors and (kind != "model" or tensors[0].numel() == 1):
            candidates.append(f"{key} {list(tensors[0].shape)}")
            keys.append(key)
    if len(candidates) > 1:
        what = " one-element" if kind == "model" else ""
        raise UsageError(
            f"loss {kind}: the model returns a {type(out).__name__} with"
            f"{what} floating-point tensors in {len(candidates)} entries "
            f"({', '.join(candidates)}); name the output the loss reads "
            f"with {kind}@OUTPUT, like {kind}@{keys[0]} (terms over "
            "several outputs are joined by +)")
    return keys[0] if keys else None


def make_optimizer(text: str, params: Any) -> Any:
    import torch
    from mutwo._specs import parse_optimizer
    from mutwo.v1 import types_pb2
    try:
        spec = parse_optimizer(text)
    except ValueError as e:
        raise UsageError(str(e)) from None
    lr = spec.learning_rate or 1e-3
    kind = spec.kind
    if kind == types_pb2.OptimizerSpec.NONE:
        return None
    params = list(params)
    # The update's temporaries as planned: `:foreach`, all parameters at
    # once (torch.optim's foreach); else at most the largest parameter:
    # Adam's fused kernel on CUDA holds none, its single-tensor update
    # elsewhere one parameter's (torch.optim's default on CUDA, foreach,
    # would hold them all: over the plan where the step sets the peak).
    update: Dict[str, Any] = {"foreach": bool(spec.foreach_update)}
    if kind in (types_pb2.OptimizerSpec.ADAM, types_pb2.OptimizerSpec.ADAMW) \
            and not spec.foreach_update and params and \
            all(p.is_cuda for p in params):
        update = {"fused": True}
    if kind == types_pb2.OptimizerSpec.ADAM:
        return torch.optim.Adam(params, lr=lr,
                                weight_decay=spec.weight_decay, **update)
    if kind == types_pb2.OptimizerSpec.ADAMW:
        # The worker's AdamW decays by the spec's weight_decay, 0 unset
        # (worker/inputs.cc), not torch.optim's default 0.01.
        return torch.optim.AdamW(params, lr=lr,
                                 weight_decay=spec.weight_decay, **update)
    momentum = (spec.momentum or 0.9) if kind == \
        types_pb2.OptimizerSpec.SGD_MOMENTUM else 0.0
    return torch.optim.SGD(params, lr=lr, momentum=momentum,
                           weight_decay=spec.weight_decay,
                           foreach=bool(spec.foreach_update))


@contextlib.contextmanager
def deterministic_kernels(cuda: bool) -> Any:
    """Deterministic kernels and full fp32 for the comparison steps, as the
    worker's DeterministicKernels (TF32 rounds operands to 10 bits)."""
    import torch
    saved = (torch.backends.cudnn.deterministic,
             torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    algorithms = (torch.are_deterministic_algorithms_enabled(),
                  torch.is_deterministic_algorithms_warn_only_enabled())
    if cuda:
        torch.backends.cudnn.deterministic = True
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        # warn_only: an op without a deterministic kernel runs as it is;
        # the second unmodified step measures that noise.
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        (torch.backends.cudnn.deterministic,
         torch.backends.cuda.matmul.allow_tf32,
         torch.backends.cudnn.allow_tf32) = saved
        if cuda:
            torch.use_deterministic_algorithms(algorithms[0],
                                               warn_only=algorithms[1])


@dataclasses.dataclass
class StepResult:
    loss: float
    grads: Dict[str, Any]
    buffers: Dict[str, Any]


def _storage_bytes(tensors: Sequence[Any]) -> int:
    seen: Dict[int, int] = {}
    for t in tensors:
        try:
            s = t.untyped_storage() if hasattr(t, "untyped_storage") \
                else t.storage()
            n = s.nbytes() if hasattr(s, "nbytes") else s.size() * \
                t.element_size()
            seen[s.data_ptr()] = n
        except RuntimeError:
            continue
    return sum(seen.values())


def _live_tensors(model: Any, optimizer: Any, batch: Sequence[Any]) -> List[Any]:
    import torch
    from mutwo._apply import _flat_tensors
    out = list(model.parameters()) + list(model.buffers())
    out += [p.grad for p in model.parameters() if p.grad is not None]
    if optimizer is not None:
        for state in optimizer.state.values():
            out += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return out + _flat_tensors(list(batch))


def cpu_step_peak_bytes(step: Callable[[], None], model: Any, optimizer: Any,
                        batch: Sequence[Any]) -> int:
    """The peak of one CPU step (CPU_PEAK_MEASURE)."""
    from torch.profiler import ProfilerActivity, profile
    # Gradients are dropped before the profile starts: a free of a block
    # allocated before profiling is not reported, so the step's own
    # zero_grad would leave them counted.
    model.zero_grad(set_to_none=True)
    base = _storage_bytes(_live_tensors(model, optimizer, batch))
    with profile(activities=[ProfilerActivity.CPU],
                 profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() ==
              _cpu_device_type()]
    # start_ns on newer PyTorch, start_us on 1.13.
    events.sort(key=lambda e: e.start_ns() if hasattr(e, "start_ns")
                else e.start_us() * 1000)
    running = peak = 0
    for e in events:
        running += e.nbytes()
        peak = max(peak, running)
    return base + peak


def _cpu_device_type() -> Any:
    import torch
    try:
        return torch._C._autograd.DeviceType.CPU
    except AttributeError:
        return torch.device("cpu").type


class Session:
    """One verify run: the model on its device, its initial state, the
    batch and the loss; runs the comparison and the timed steps."""

    def __init__(self, user: UserModel, device: Any, batch: Tuple[Any, ...],
                 target: Any, loss_fn: Callable[[Any], Any], optimizer: str,
                 seed: int):
        import torch
        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.model = user.model.to(device).train()
        # What a step calls: the model, or torch.compile's module of it.
        self.forward: Callable[..., Any] = self.model
        self.batch = batch
        self.target = target
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.seed = seed
        # The weights every run starts from (kept off the device).
        self.state0 = {k: v.detach().to("cpu", copy=True)
                       for k, v in self.model.state_dict().items()}

    def reset(self) -> None:
        self.model.load_state_dict(self.state0)
        self.model.zero_grad(set_to_none=True)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def seeded(self) -> None:
        self.torch.manual_seed(self.seed)
        if self.cuda:
            self.torch.cuda.manual_seed_all(self.seed)

    def compare_step(self) -> StepResult:
        """One forward and backward from the initial state: loss, gradients
        and buffers, copied to the CPU."""
        self.reset()
        self.seeded()
        loss = self.loss_fn(self.forward(*self.batch))
        loss.backward()
        value = float(loss.detach())
        del loss
        grads = {n: p.grad.detach().to("cpu", copy=True)
                 for n, p in self.model.named_parameters()
                 if p.grad is not None}
        buffers = {n: b.detach().to("cpu", copy=True)
                   for n, b in self.model.named_buffers()
                   if b.is_floating_point()}
        self.model.zero_grad(set_to_none=True)
        return StepResult(value, grads, buffers)

    def timed(self, steps: int) -> Tuple[int, float, str]:
        """(peak bytes, median step ms, measure) of warm-up + `steps` steps
        from the initial state with a fresh optimizer."""
        torch = self.torch
        self.reset()
        opt = make_optimizer(self.optimizer, self.model.parameters())

        def step() -> None:
            if opt is not None:
                opt.zero_grad(set_to_none=True)
            else:
                self.model.zero_grad(set_to_none=True)
            self.loss_fn(self.forward(*self.batch)).backward()
            if opt is not None:
                opt.step()

        self.seeded()
        step()  # warm-up: optimizer state, allocator caches
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        times = []
        for _ in range(steps):
            self.sync()
            t0 = time.perf_counter()
            step()
            self.sync()
            times.append((time.perf_counter() - t0) * 1e3)
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
            measure = CUDA_PEAK_MEASURE
        else:
            peak = cpu_step_peak_bytes(step, self.model, opt, self.batch)
            measure = CPU_PEAK_MEASURE
        del opt
        self.model.zero_grad(set_to_none=True)
        if self.cuda:
            torch.cuda.empty_cache()
        return peak, statistics.median(times), measure


def compare(base: StepResult, sched: StepResult,
            again: Optional[StepResult], rtol: float, atol: float
            ) -> Dict[str, Any]:
    """Gradients, loss and buffers of the scheduled step against the
    unmodified one; `again` (a second unmodified step) measures noise."""
    scale = max((float(g.abs().max()) for g in base.grads.values()
                 if g.numel()), default=0.0)
    max_diff = 0.0
    worst, worst_excess = "", 0.0
    match = base.grads.keys() == sched.grads.keys()
    missing = sorted(set(base.grads) ^ set(sched.grads))
    for name, g in base.grads.items():
        if name not in sched.grads or not g.numel():
            continue
        diff = float((sched.grads[name] - g).abs().max())
        max_diff = max(max_diff, diff)
        noise = (float((again.grads[name] - g).abs().max())
                 if again is not None else 0.0)
        excess = diff - (atol + rtol * scale + 2 * noise)
        # Written so that NaN counts as differing.
        if not excess <= 0:
            match = False
            if not excess <= worst_excess:
                worst, worst_excess = name, excess
    buffers_match = base.buffers.keys() == sched.buffers.keys()
    for name, b in base.buffers.items():
        if name not in sched.buffers or not b.numel():
            continue
        diff = float((sched.buffers[name] - b).abs().max())
        if not diff <= atol + rtol * float(b.abs().max()):
            buffers_match = False
    return {"gradients_match": match, "max_abs_grad_diff": max_diff,
            "largest_gradient": scale, "worst_gradient_parameter": worst or
            (missing[0] if missing else ""),
            "loss_diff": abs(sched.loss - base.loss),
            "batchnorm_stats_match": buffers_match}


@contextlib.contextmanager
def _budget_warnings(into: List[Any]) -> Any:
    """Collects mutwo.apply's BudgetWarnings (reported in the output);
    other warnings are warned again once the recording is over (warned
    inside it, each was recorded again, forever: verify hung at the first
    warning from PyTorch, such as a CUDA kernel without a deterministic
    implementation)."""
    import warnings
    from mutwo._apply import BudgetWarning
    log: List[Any] = []
    try:
        with warnings.catch_warnings(record=True) as log:
            warnings.simplefilter("always", BudgetWarning)
            yield
    finally:
        for w in log:
            if issubclass(w.category, BudgetWarning):
                into.append(w)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename,
                                       w.lineno)


def measurements_dict(m: Any) -> Optional[Dict[str, Any]]:
    """mutwo.apply's measurements of the first scheduled step (the
    comparison step): saved-tensor bytes held at the end of forward with
    and without the schedule, against the planned saving."""
    if m is None:
        return None
    return {"saved_bytes": m.saved_bytes,
            "unmodified_saved_bytes": m.unmodified_saved_bytes,
            "saving_bytes": m.saving_bytes,
            "planned_saving_bytes": m.planned_saving_bytes,
            "saving_fraction": m.saving_fraction,
            "frame_input_bytes": m.frame_input_bytes,
            "swapped_bytes": m.swapped_bytes,
            "first_step_peak_bytes": m.peak_bytes,
            "forward_ms": m.forward_seconds * 1e3,
            "step_ms": (m.step_seconds * 1e3 if m.step_seconds is not None
                        else None)}


def format_bytes(n: float) -> str:
    from mutwo._specs import format_bytes as fmt
    return fmt(n)


def format_table(v: Dict[str, Any]) -> str:
    """The table `mutwo-worker execute` prints (FormatValidationText), plus
    the peak measure and what mutwo.apply reported."""
    out = [f"device          {v['device']['name']} ({v['device']['kind']})"]
    if v.get("mode") == "compile":
        out.append("mode            torch.compile (baseline: the model "
                   "compiled without the schedule)")
    out += [f"batch size      {v['batch_size']}",
           f"decisions       {v['recomputed']} recomputed, {v['swapped']} "
           "swapped"]
    if v["oom"]:
        out.append(f"OUT OF MEMORY   {v['error']}")
    out.append("%-15s %14s %12s" % ("", "peak", "iteration"))
    for name in ("baseline", "scheduled", "predicted"):
        s = v[name]
        out.append("%-15s %14s %10.1f ms" % (name, format_bytes(
            s["peak_bytes"]), s["iteration_ms"]))
    out.append(f"budget          {format_bytes(v['budget_bytes'])} "
               f"({'within' if v['within_budget'] else 'EXCEEDED'})")
    b, s, p = v["baseline"], v["scheduled"], v["predicted"]
    if b["peak_bytes"] > 0:
        out.append("memory saved    %s (%.1f%%), time paid %+.1f%%" % (
            format_bytes(b["peak_bytes"] - s["peak_bytes"]),
            100.0 * (b["peak_bytes"] - s["peak_bytes"]) / b["peak_bytes"],
            100.0 * (s["iteration_ms"] / b["iteration_ms"] - 1)
            if b["iteration_ms"] > 0 else 0.0))
    if p["peak_bytes"] > 0 and not v["oom"]:
        out.append("vs predicted    peak %+.1f%%, step time %+.1f%%" % (
            100.0 * (s["peak_bytes"] / p["peak_bytes"] - 1),
            100.0 * (s["iteration_ms"] / p["iteration_ms"] - 1)
            if p["iteration_ms"] > 0 else 0.0))
    if "gradients_match" in v:
        out.append("gradients       %s (max |diff| %g of largest %g), loss "
                   "diff %g, batch-norm statistics %s" % (
                       "match" if v["gradients_match"] else "DIFFER",
                       v["max_abs_grad_diff"], v["largest_gradient"],
                       v["loss_diff"],
                       "match" if v["batchnorm_stats_match"] else "DIFFER"))
    m = v.get("apply_measurements")
    if m:
        line = ("saved tensors   %s held at the end of forward (unmodified "
                "%s): saving %s of %s planned" % (
                    format_bytes(m["saved_bytes"]),
                    format_bytes(m["unmodified_saved_bytes"]),
                    format_bytes(m["saving_bytes"]),
                    format_bytes(m["planned_saving_bytes"])))
        if m["saving_fraction"] is not None:
            line += " (%.0f%%)" % (100.0 * m["saving_fraction"])
        if m["swapped_bytes"]:
            line += ", %s swapped to the host" % format_bytes(
                m["swapped_bytes"])
        out.append(line)
    out.append(f"peak measure    {v['peak_measure']}")
    if v.get("forced"):
        out.append("forced          the planner marked this schedule "
                   "infeasible; run with --force")
    out += ["  " + line for line in v.get("apply_report", "").splitlines()]
    out += ["  warning: " + w for w in v.get("apply_warnings", [])]
    return "\n".join(out) + "\n"


def problems_of(v: Dict[str, Any]) -> str:
    """Empty when the run proves the schedule, else every problem in one
    line (common/validation_check.cc's CheckValidation)."""
    problems = []
    if v["oom"]:
        problems.append(f"out of memory: {v['error']}")
    elif not v["within_budget"]:
        m, b = v["scheduled"]["peak_bytes"], v["budget_bytes"]
        problems.append("measured peak %s exceeds the budget %s by %.1f%%" % (
            format_bytes(m), format_bytes(b), 100.0 * (m - b) / b))
    if v.get("mode") == "compile" and v.get("decisions_unmatched"):
        problems.append(f"{v['decisions_unmatched']} recompute decisions "
                        "matched no op torch.compile traced (report lists "
                        "them)")
    if not v["oom"] and "gradients_match" in v:
        differ = []
        if not v["gradients_match"]:
            differ.append("gradients (max |diff| %g%s)" % (
                v["max_abs_grad_diff"],
                f", worst at {v['worst_gradient_parameter']}"
                if v["worst_gradient_parameter"] else ""))
        if not v["loss_diff"] <= MAX_LOSS_DIFF:
            differ.append("loss (diff %g)" % v["loss_diff"])
        if not v["batchnorm_stats_match"]:
            differ.append("batch-norm statistics")
        if differ:
            problems.append(", ".join(differ) +
                            " differ from the unmodified step")
    return "; ".join(problems)


def infeasible_message(schedule: Any) -> str:
    budget, floor = (format_bytes(schedule.budget_bytes),
                     format_bytes(schedule.floor_bytes))
    if schedule.budget_bytes < schedule.floor_bytes:
        return (f"infeasible: the budget {budget} is below the floor {floor}"
                " (the lowest budget the planner fits)")
    reason = schedule.reason.replace("\n", " ")
    return (f"infeasible for the budget {budget} (floor {floor})" +
            (f": {reason}" if reason else ""))


def _spec_text(spec: Any) -> str:
    """A TensorSpec as --inputs takes it: x:float32[B,3,224,224]{0,1}."""
    from mutwo import _specs
    dtype = {v: k for k, v in _specs._DTYPES.items()}.get(spec.dtype, "?")
    dims = ",".join("B" if d == _specs.BATCH_DIM else str(d)
                    for d in spec.dims)
    text = f"{spec.name}:{dtype}[{dims}]"
    if spec.HasField("range"):
        text += "{%g,%g}" % (spec.range.low, spec.range.high)
    return text


def _loss_text(loss: Any) -> str:
    from mutwo._specs import format_loss
    return format_loss(loss)


def _optimizer_text(opt: Any) -> str:
    from mutwo import _specs
    text = {v: k for k, v in _specs._OPTIMIZERS.items()}.get(opt.kind, "?")
    settings = [f"{name}={value:g}" for name, value in
                (("lr", opt.learning_rate), ("momentum", opt.momentum),
                 ("weight_decay", opt.weight_decay)) if value]
    if opt.foreach_update:
        settings.append("foreach")
    return text + (":" + ",".join(settings) if settings else "")


def use_planned_step(args: argparse.Namespace, schedule: Any,
                     user: UserModel) -> None:
    """The step the schedule was planned for (its inputs, loss and
    optimizer, recorded from the profile) where the flags and the model
    file leave it open; a flag that contradicts it is refused naming both,
    as `mutwo-worker execute` refuses it: a peak measured for another step
    says nothing about the planned one."""
    from mutwo import _specs
    planned = schedule.proto
    if planned is None:
        return

    def parsed(flag: str, parse: Callable[[str], Any], text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise UsageError(f"{flag}: {e}") from None

    def refuse(flag: str, mine: str, theirs: str) -> None:
        raise UsageError(f"{flag} {mine} contradicts the schedule, planned "
                         f"for {flag} {theirs}")

    if len(planned.inputs):
        # Its inputs are recorded at its batch size: mutwo.apply refuses a
        # forward at another batch, so the flag is refused here, by name.
        if args.batch and args.batch != planned.batch_size:
            refuse("--batch", str(args.batch), str(planned.batch_size))
        theirs = sorted(planned.inputs, key=lambda t: t.name)
        if args.inputs:
            mine = sorted((parsed("--inputs", _specs.parse_tensor_spec, t)
                           for t in args.inputs), key=lambda t: t.name)
            if mine != theirs:
                refuse("--inputs", " ".join(_spec_text(t) for t in mine),
                       " ".join(_spec_text(t) for t in theirs))
        elif user.batch_fn is None:
            args.inputs = [_spec_text(t) for t in planned.inputs]
    if planned.HasField("loss"):
        theirs_text = _loss_text(planned.loss)
        if args.loss:
            kind = args.loss.partition(":")[0].partition("@")[0].lower()
            if (":" in args.loss or "+" in args.loss
                    or kind not in ("cross_entropy", "mse")):
                if parsed("--loss", _specs.parse_loss,
                          args.loss) != planned.loss:
                    refuse("--loss", args.loss, theirs_text)
            elif theirs_text.partition(":")[0].partition("@")[0] != kind:
                refuse("--loss", args.loss, theirs_text)
        elif user.loss_fn is None:
            args.loss = theirs_text
    if planned.HasField("optimizer"):
        theirs_text = _optimizer_text(planned.optimizer)
        if args.optimizer is not None:
            if parsed("--optimizer", _specs.parse_optimizer,
                      args.optimizer) != planned.optimizer:
                refuse("--optimizer", args.optimizer, theirs_text)
        else:
            args.optimizer = theirs_text
    if args.optimizer is None:
        args.optimizer = "sgd"


def _measure_eager(args: argparse.Namespace, v: Dict[str, Any],
                   session: Session, schedule: Any, warned: List[Any],
                   phase: List[str]) -> None:
    """The unmodified step beside eager mutwo.apply: comparison steps,
    then timed steps; fills `v`, `phase[0]` says where it is."""
    import mutwo._apply as apply_mod
    with deterministic_kernels(session.cuda):
        base = session.compare_step()
        again = session.compare_step() if session.cuda else None
        phase[0] = "scheduled comparison step"
        # The first step under the schedule: mutwo.apply checks every
        # decision matched a saved tensor (strict) and measures it.
        with _budget_warnings(warned), \
                apply_mod.apply(session.model, schedule,
                                force=args.force) as applied:
            sched = session.compare_step()
            m = applied.measurements()
            v["decisions_unmatched"] = len(applied.unmatched())
    v["apply_measurements"] = measurements_dict(m)
    v.update(compare(base, sched, again, args.grad_rtol, args.grad_atol))
    phase[0] = "unmodified timed steps"
    peak, ms, _ = session.timed(args.steps)
    v["baseline"] = {"peak_bytes": peak, "iteration_ms": ms}
    phase[0] = "scheduled timed steps"
    with _budget_warnings(warned), \
            apply_mod.apply(session.model, schedule,
                            force=args.force) as applied:
        peak, ms, _ = session.timed(args.steps)
        report = applied.report()
    v["scheduled"] = {"peak_bytes": peak, "iteration_ms": ms}
    v["apply_report"] = report


def _compile_precheck(model: Any, schedule: Any, force: bool) -> None:
    """--mode compile: what apply_compiled refuses (PyTorch < 2.4, SWAP
    decisions, another model's schedule) before anything runs; the model
    is left as it was."""
    from mutwo._compile import apply_compiled, compiled_schedule_of
    try:
        apply_compiled(model, schedule, force=force)
    except RuntimeError as e:
        raise UsageError(f"--mode compile: {e}") from None
    compiled_schedule_of(model).remove()


def _measure_compiled(args: argparse.Namespace, v: Dict[str, Any],
                      session: Session, schedule: Any, warned: List[Any],
                      phase: List[str]) -> None:
    """--mode compile: torch.compile of the unmodified model (the baseline:
    the compiler's own step), then torch.compile of the same model with
    the schedule's selective-checkpointing policy
    (mutwo._compile.apply_compiled): comparison steps (gradients against
    the compiled unmodified step; a second one measures its noise), then
    timed steps; fills `v`."""
    import torch
    from mutwo._compile import apply_compiled, compiled_schedule_of
    session.forward = torch.compile(session.model)
    base = session.compare_step()
    again = session.compare_step()
    phase[0] = "unmodified timed steps"
    peak, ms, _ = session.timed(args.steps)
    v["baseline"] = {"peak_bytes": peak, "iteration_ms": ms}
    phase[0] = "scheduled comparison step"
    # The same module object with the policy's frames: compiled afresh.
    torch.compiler.reset()
    apply_compiled(session.model, schedule, force=args.force)
    handle = compiled_schedule_of(session.model)
    handle.peak_check.active = False  # the session measures the steps
    session.forward = torch.compile(session.model)
    try:
        with _budget_warnings(warned):
            sched = session.compare_step()
            # RECOMPUTE decisions no op the compiler traced matched: the
            # partitioner decides those (SAVE rows left unmatched are
            # the partitioner's as well, but cost no planned saving).
            v["decisions_unmatched"] = sum(
                r.decision.action == "RECOMPUTE" for r in handle.unmatched())
            v.update(compare(base, sched, again, args.grad_rtol,
                             args.grad_atol))
            phase[0] = "scheduled timed steps"
            peak, ms, _ = session.timed(args.steps)
        v["scheduled"] = {"peak_bytes": peak, "iteration_ms": ms}
        v["apply_report"] = handle.report()
    finally:
        handle.remove()
        session.forward = session.model


def verify(args: argparse.Namespace, out: Any = None,
           err: Any = None) -> int:
    """Runs `verify`; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    prog = "mutwo verify"
    try:
        from mutwo._types import Schedule
        if not args.schedule:
            raise UsageError("--schedule: the schedule JSON file is required")
        try:
            schedule = Schedule.from_json(args.schedule)
        except (OSError, ValueError) as e:
            raise UsageError(f"--schedule {args.schedule}: {e}") from None
        path = args.model.rpartition(":")[0]
        if not path or not os.path.isfile(path):
            load_user_model(args.model)  # raises the message for it
        if args.steps < 1:
            raise UsageError("--steps: at least 1 timed step")
        batch_size = args.batch or schedule.batch_size
        if batch_size <= 0:
            raise UsageError("--batch: a positive batch size is required")
        if not schedule.feasible and not args.force:
            print(f"{prog}: {args.schedule} is {infeasible_message(schedule)}"
                  "; nothing run, --force runs it anyway", file=err)
            return EXIT_INFEASIBLE
        import torch
        try:
            device = torch.device(args.device)
        except RuntimeError as e:
            raise UsageError(f"--device {args.device}: {e}") from None
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise UsageError(f"--device {args.device}: CUDA is not "
                                 "available here; use --device cpu")
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(device)
        elif device.type != "cpu":
            raise UsageError(f"--device {args.device}: use cpu or cuda[:N]")
        user = load_user_model(args.model)
        use_planned_step(args, schedule, user)
        xs, target = make_batch(user, args.inputs, args.loss, batch_size,
                                device, args.seed)
        loss_fn = make_loss(user, args.loss, target)
        make_optimizer(args.optimizer, [torch.zeros(1, requires_grad=True)])
        import mutwo._apply as apply_mod
        session = Session(user, device, xs, target, loss_fn, args.optimizer,
                          args.seed)
        try:
            # Checks the schedule against the model before anything runs
            # (module paths and op kinds; infeasible was handled above).
            apply_mod.apply(session.model, schedule,
                            force=args.force).remove()
        except apply_mod.ScheduleMismatchError as e:
            raise UsageError(f"--schedule {args.schedule}: {e}") from None
        if args.mode == "compile":
            try:
                _compile_precheck(session.model, schedule, args.force)
            except ValueError as e:  # SWAP decisions, another model's
                raise UsageError(f"--schedule {args.schedule}: {e}") from None
    except UsageError as e:
        print(f"{prog}: {e}", file=err)
        return EXIT_BAD_INPUT

    v: Dict[str, Any] = {
        "device": {"name": (torch.cuda.get_device_name(device)
                            if device.type == "cuda" else "cpu"),
                   "kind": device.type},
        "batch_size": batch_size, "budget_bytes": schedule.budget_bytes,
        "recomputed": len(schedule.recomputed),
        "swapped": len(schedule.swapped),
        "decisions_unmatched": 0,
        "graph_fingerprint": schedule.graph_fingerprint,
        "predicted": {"peak_bytes": schedule.predicted_peak_bytes,
                      "iteration_ms": schedule.predicted_iteration_ms},
        "baseline": {"peak_bytes": 0, "iteration_ms": 0.0},
        "scheduled": {"peak_bytes": 0, "iteration_ms": 0.0},
        "oom": False, "error": "", "within_budget": False,
        "peak_measure": CUDA_PEAK_MEASURE if session.cuda
        else CPU_PEAK_MEASURE, "torch": torch.__version__,
        "feasible": schedule.feasible, "forced": bool(args.force and not schedule.feasible),
        "apply_measurements": None, "apply_warnings": [],
        "mode": args.mode,
    }
    oom_types: Tuple[type, ...] = tuple(
        t for t in (getattr(torch.cuda, "OutOfMemoryError", None),)
        if t is not None)
    phase = ["unmodified comparison step"]
    warned: List[Any] = []
    try:
        if args.mode == "compile":
            _measure_compiled(args, v, session, schedule, warned, phase)
        else:
            _measure_eager(args, v, session, schedule, warned, phase)
    except oom_types as e:  # type: ignore[misc]
        v["oom"] = True
        v["error"] = f"{phase[0]}: {str(e).splitlines()[0]}"
    except apply_mod.ScheduleMismatchError as e:
        # Raised by the first forward, before any backward: decisions that
        # matched no tensor autograd saved in this model's forward.
        print(f"{prog}: --schedule {args.schedule} does not fit the "
              f"forward of {args.model}: {e}", file=err)
        return EXIT_BAD_INPUT
    except Exception as e:
        print(f"{prog}: model {args.model}: {phase[0]} failed: "
              f"{type(e).__name__}: {e}", file=err)
        return EXIT_FAILURE
    v["apply_warnings"] = list(dict.fromkeys(
        str(w.message).replace("\n", " ") for w in warned))
    v["within_budget"] = (not v["oom"] and (
        schedule.budget_bytes <= 0 or
        v["scheduled"]["peak_bytes"] <= schedule.budget_bytes))
    if args.output == "json":
        print(json.dumps(v, indent=1), file=out)
    else:
        print(format_table(v), end="", file=out)
    problem = problems_of(v)
    if args.report:
        reported = report_to_server(args, v, schedule, out, err)
        if reported != EXIT_OK:
            return reported
    if problem:
        print(f"{prog}: {problem}", file=err)
        return EXIT_FAILURE
    return EXIT_OK


def training_loop_report(v: Dict[str, Any], schedule: Any,
                         path: str = "EAGER") -> Any:
    """verify's measurements `v` of `schedule` as the
    types_pb2.TrainingLoopValidation that ReportTrainingLoop takes."""
    from mutwo.v1 import types_pb2
    report = types_pb2.TrainingLoopValidation(
        path=types_pb2.TrainingLoopValidation.Path.Value(path.upper()),
        decisions_planned=v["recomputed"] + v["swapped"],
        decisions_applied=(v["recomputed"] + v["swapped"] -
                           v.get("decisions_unmatched", 0)),
        peak_measure=v["peak_measure"], framework=f"torch {v['torch']}")
    if schedule.proto is not None:
        report.budget.CopyFrom(schedule.proto.budget)
    val = report.validation
    val.batch_size = v["batch_size"]
    val.budget_bytes = v["budget_bytes"]
    val.graph_fingerprint = v["graph_fingerprint"]
    for field in ("baseline", "scheduled", "predicted"):
        stats = getattr(val, field)
        stats.peak_bytes = int(v[field]["peak_bytes"])
        stats.iteration_ms = float(v[field]["iteration_ms"])
    val.within_budget = bool(v["within_budget"])
    val.gradients_match = bool(v.get("gradients_match", False))
    val.max_abs_grad_diff = float(v.get("max_abs_grad_diff", 0.0))
    val.loss_diff = float(v.get("loss_diff", 0.0))
    val.batchnorm_stats_match = bool(v.get("batchnorm_stats_match", False))
    val.worst_gradient_parameter = v.get("worst_gradient_parameter", "")
    val.recomputed = v["recomputed"]
    val.swapped = v["swapped"]
    val.oom = bool(v["oom"])
    val.error = v["error"]
    val.device.name = v["device"]["name"]
    val.device.kind = v["device"]["kind"]
    return report


def report_to_server(args: argparse.Namespace, v: Dict[str, Any],
                     schedule: Any, out: Any, err: Any) -> int:
    """--report JOB: sends the measurements to mutwo-server
    (ReportTrainingLoop) and prints its verdict; EXIT_BAD_INPUT when the
    server refuses the report."""
    from mutwo._client import Client, MutwoError
    try:
        with Client(args.server, token=args.token or None,
                    token_file=args.token_file or None,
                    tls_ca=args.tls_ca or None) as client:
            answer = client.report_training_loop(
                args.report, training_loop_report(
                    v, schedule, "COMPILE" if v.get("mode") == "compile"
                    else "EAGER"))
        stored, outcome = answer.report, answer.outcome
    except (MutwoError, ValueError, OSError) as e:
        print(f"mutwo verify: --report {args.report}: {e}", file=err)
        return EXIT_BAD_INPUT
    verdict = "holds" if stored.holds else f"does not hold: {stored.problem}"
    print(f"reported to {args.server}: job {args.report} batch "
          f"{stored.batch_size} budget {stored.budget or stored.budget_bytes}"
          f": {verdict} (validated in the training loop: "
          f"{'yes' if outcome.validated_in_training_loop else 'no'}, "
          f"{outcome.training_loop_reports} report"
          f"{'' if outcome.training_loop_reports == 1 else 's'}; "
          f"worker: {outcome.state})",
          file=err if args.output == "json" else out)
    if answer.corrected is not None:
        path = args.corrected or (os.path.splitext(args.schedule)[0] +
                                  ".corrected.json")
        from google.protobuf import json_format
        with open(path, "w", encoding="utf-8") as f:
            f.write(json_format.MessageToJson(answer.corrected.proto))
        print(f"{answer.note}; wrote {path} (predicted peak "
              f"{format_bytes(answer.corrected.predicted_peak_bytes)}, "
              f"{len(answer.corrected.recomputed)} recompute, "
              f"{len(answer.corrected.swapped)} swap)",
              file=err if args.output == "json" else out)
    elif answer.note:
        print(answer.note, file=err if args.output == "json" else out)
    return EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL_PY:FACTORY",
                   help="a Python file and a function in it returning the "
                   "nn.Module (or (module, batch_fn)); the file may define "
                   "batch(batch_size, device) -> (inputs, target) and "
                   "loss(output, target)")
    p.add_argument("--schedule", required=True,
                   help="the Schedule JSON (`mutwo plan ... --output json`)")
    p.add_argument("--batch", type=int, default=0,
                   help="batch size (default: the schedule's)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--inputs", action="append", default=[],
                   metavar="SPEC", help="input tensor spec, repeatable, as "
                   "the worker's --input: x:float32[B,3,224,224], "
                   "tokens:int64[B,128]{0,30000} (default: the model file's "
                   "batch function, else the inputs the schedule was planned "
                   "for; given, they must be those)")
    p.add_argument("--loss", default="",
                   help="KIND[@OUTPUT][:TARGET] as the worker takes it "
                   "(docs/loss.md): mean, sum, model, cross_entropy[:y:"
                   "int64[B]{0,1000}], chunked_cross_entropy[:SPEC] or "
                   "mse[:z:float32[B,4]] (without "
                   "TARGET: the batch function's target); @OUTPUT reads one "
                   "dict key or tuple index; terms joined by + are summed, "
                   "e.g. cross_entropy@logits:y:int64[B]{0,10}+mse@aux:z:"
                   "float32[B,4] (default: the model "
                   "file's loss(output, target), else the schedule's loss, "
                   "else cross_entropy with an integer target, else mean; "
                   "given, it must be the schedule's)")
    p.add_argument("--optimizer", default=None,
                   help="none, sgd, sgd_momentum, adam, adamw "
                   "(optionally :lr=0.01,...; default: the schedule's "
                   "optimizer, else sgd)")
    p.add_argument("--mode", choices=("eager", "compile"), default="eager",
                   help="eager: mutwo.apply in an eager loop beside the "
                   "unmodified step; compile: torch.compile of the model "
                   "with the schedule's selective-checkpointing policy "
                   "(mutwo.apply(mode=\"compile\"), PyTorch >= 2.4, no "
                   "SWAP decisions) beside torch.compile of the unmodified "
                   "model")
    p.add_argument("--steps", type=int, default=3,
                   help="timed steps after one warm-up step (median time)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true",
                   help="run a schedule the planner marked infeasible "
                   "instead of refusing it with exit code 3")
    p.add_argument("--grad_rtol", type=float, default=GRAD_RTOL,
                   help="gradient tolerance relative to the largest "
                   "gradient element (default %(default)g)")
    p.add_argument("--grad_atol", type=float, default=GRAD_ATOL)
    p.add_argument("--output", choices=("text", "json"), default="text")
    p.add_argument("--report", default="", metavar="JOB_ID",
                   help="send the measurements to mutwo-server as a "
                   "training-loop report of this job's schedule "
                   "(ReportTrainingLoop); the schedule must be the job's "
                   "(`mutwo schedule JOB --batch N --budget B --output json`"
                   " or Client.schedule)")
    p.add_argument("--server", default=os.environ.get(
        "MUTWO_SERVER", "127.0.0.1:50051"),
        help="with --report: the server (default $MUTWO_SERVER or "
        "%(default)s)")
    p.add_argument("--token", default="", help="with --report: bearer "
                   "token (default: MUTWO_TOKEN_FILE, MUTWO_TOKEN)")
    p.add_argument("--token_file", default="")
    p.add_argument("--corrected", default="", metavar="FILE",
                   help="with --report: where the service's corrected "
                   "schedule goes when the peak alone was over the budget "
                   "(default: SCHEDULE.corrected.json)")
    p.add_argument("--tls_ca", default="")
