"""A schedule's RECOMPUTE decisions under torch.compile, as selective
activation checkpointing (SAC, PyTorch >= 2.4).

    model = mutwo.apply(model, schedule, mode="compile")
    step_model = torch.compile(model)

(`mode="compile"` calls `apply_compiled(model, schedule, ...)` here.)

`mutwo.apply` works through saved-tensor hooks, which Dynamo does not
trace (it breaks the graph at them). Here each recompute *frame* (the
module whose forward encloses a recompute segment, found as mutwo.apply
finds it; an nn.Sequential child range widens to the Sequential, nested
frames join the outermost) runs its forward inside
`torch.utils.checkpoint.checkpoint(use_reentrant=False, context_fn=...)`
with a policy built from the schedule. The policy sees every op the frame
runs (an OpOverload such as `torch.ops.aten.convolution.default`) in
order, with the module running it, and answers per op:

- MUST_SAVE for the op producing an activation the schedule RETAINs (and,
  with swaps="ignore", one it SWAPs: kept on the device);
- MUST_RECOMPUTE (or PREFER_RECOMPUTE, `recompute="prefer"`) for the op
  producing an activation the schedule RECOMPUTEs;
- PREFER_RECOMPUTE for ops no decision names (views, ops whose outputs
  autograd does not save: checkpoint's default; the compiler's partitioner
  may still save them); PREFER_SAVE inside a control-flow decision
  (prim::If / prim::Loop) the schedule retains.

A decision is matched to an op by the decision's module path and op kind:
`aten::conv2d` is the dispatcher's `convolution`, `aten::linear` its
`addmm`/`mm`/`bmm`, `aten::batch_norm` `native_batch_norm` and its
training variants (`_DISPATCH_OPS`); the n-th decision of one kind in one
module (in graph order) is the n-th such op that module runs. Where the
running module cannot be told (neither the eager module hooks nor
torch.compile's `nn_module_stack` metadata say), the n-th decision of a
kind in the frame is the n-th such op of the frame.

Limits: ops of a module's own forward that are not activations but share
a kind with one that is (two `add`s, one of them saved) can shift the
count; `report()` says which decisions no op matched. Run without
torch.compile (eager SAC) a recomputed batch norm updates its running
statistics twice, as torch.utils.checkpoint does, and an op the policy
saves whose output a later op changes in place (ResNet's `out += identity`)
raises torch's "cached ... has been mutated"; under torch.compile
functionalization removes both. SWAP decisions have no equivalent here and
are refused unless swaps="ignore".
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

from torch import nn

from mutwo._planned_inputs import PlannedInputs
from mutwo._types import Decision, Schedule

__all__ = ["apply_compiled", "CompiledSchedule", "PolicyRow",
           "UnsupportedScheduleError", "policy_table", "dispatch_ops",
           "compiled_schedule_of"]

MUST_SAVE = "MUST_SAVE"
PREFER_SAVE = "PREFER_SAVE"
MUST_RECOMPUTE = "MUST_RECOMPUTE"
PREFER_RECOMPUTE = "PREFER_RECOMPUTE"

_CONTROL_FLOW = ("prim::If", "prim::Loop")

# TorchScript op kinds (as the schedule names them) -> the names of the
# dispatcher ops (OpOverloadPacket names) that compute the activation, as
# SAC's policy sees them: below autograd, after CompositeImplicitAutograd
# ops decompose. Kinds not listed map to their own name and, for an in-place
# op, the out-of-place one (functionalization turns relu_ into relu).
_BATCH_NORM = ("native_batch_norm", "_native_batch_norm_legit",
               "_native_batch_norm_legit_functional",
               "_native_batch_norm_legit_no_training", "cudnn_batch_norm",
               "miopen_batch_norm", "_batch_norm_with_update",
               "_batch_norm_with_update_functional", "batch_norm")
_CONV = ("convolution",)
_MATMUL = ("addmm", "mm", "bmm", "baddbmm")
_SDPA = ("_scaled_dot_product_flash_attention",
         "_scaled_dot_product_efficient_attention",
         "_scaled_dot_product_cudnn_attention",
         "_scaled_dot_product_flash_attention_for_cpu",
         "_scaled_dot_product_attention_math")
_DISPATCH_OPS: Dict[str, Tuple[str, ...]] = {
    "aten::conv1d": _CONV, "aten::conv2d": _CONV, "aten::conv3d": _CONV,
    "aten::_convolution": _CONV, "aten::convolution": _CONV,
    "aten::conv_transpose1d": _CONV, "aten::conv_transpose2d": _CONV,
    "aten::conv_transpose3d": _CONV,
    "aten::linear": _MATMUL, "aten::matmul": _MATMUL, "aten::mm": ("mm",),
    "aten::bmm": ("bmm",), "aten::addmm": ("addmm",),
    "aten::einsum": _MATMUL,
    "aten::batch_norm": _BATCH_NORM,
    "aten::layer_norm": ("native_layer_norm",),
    "aten::group_norm": ("native_group_norm",),
    "aten::dropout": ("native_dropout",),
    "aten::dropout_": ("native_dropout",),
    "aten::feature_dropout": ("bernoulli_", "bernoulli"),
    "aten::max_pool1d": ("max_pool1d_with_indices", "max_pool1d"),
    "aten::max_pool2d": ("max_pool2d_with_indices",),
    "aten::max_pool3d": ("max_pool3d_with_indices",),
    "aten::adaptive_avg_pool1d": ("_adaptive_avg_pool1d", "mean"),
    "aten::adaptive_avg_pool2d": ("_adaptive_avg_pool2d", "mean"),
    "aten::adaptive_avg_pool3d": ("_adaptive_avg_pool3d", "mean"),
    "aten::softmax": ("_softmax",), "aten::log_softmax": ("_log_softmax",),
    "aten::scaled_dot_product_attention": _SDPA,
    "aten::contiguous": ("clone",),
    "aten::flatten": ("view", "_unsafe_view", "clone"),
    "aten::reshape": ("view", "_unsafe_view", "clone"),
}


class UnsupportedScheduleError(ValueError):
    """The schedule asks for something SAC cannot do (SWAP decisions)."""


def dispatch_ops(op_kind: str) -> Tuple[str, ...]:
    """The dispatcher op names (OpOverloadPacket names) that compute an
    activation of TorchScript kind `op_kind`: ("convolution",) for
    aten::conv2d; ("relu_", "relu") for aten::relu_."""
    if op_kind in _DISPATCH_OPS:
        return _DISPATCH_OPS[op_kind]
    name = op_kind.split("::", 1)[-1]
    if name.endswith("_") and not name.startswith("_"):
        return (name, name[:-1])
    return (name,)


@dataclasses.dataclass(frozen=True)
class PolicyRow:
    """One decision as the policy applies it: the `occurrence`-th op named
    one of `ops` that `module_path` itself runs (its own forward, not a
    submodule's) gets `policy`; `frame_occurrence` is the same op counted
    over the whole frame (used when the running module cannot be told)."""
    frame: str
    module_path: str
    ops: Tuple[str, ...]
    occurrence: int
    frame_occurrence: int
    policy: str
    decision: Decision


@dataclasses.dataclass
class FramePolicy:
    """What one checkpointed frame does: rows by (module, op, occurrence)
    and by (op, frame occurrence); control-flow subtrees."""
    path: str  # module path of the checkpointed module ("" the model)
    label: str  # the frame as mutwo.apply names it ("features[0:3]")
    rows: List[PolicyRow]
    subtrees: Dict[str, str]  # module path -> policy for every op inside

    def by_module(self) -> Dict[Tuple[str, str, int], PolicyRow]:
        return {(r.module_path, op, r.occurrence): r
                for r in self.rows for op in r.ops}

    def by_frame(self) -> Dict[Tuple[str, int], PolicyRow]:
        return {(op, r.frame_occurrence): r for r in self.rows
                for op in r.ops}

    def subtree_policy(self, module_path: Optional[str]) -> Optional[str]:
        if module_path is None:
            return None
        for root, policy in self.subtrees.items():
            if (module_path == root or not root or
                    module_path.startswith(root + ".")):
                return policy
        return None


def _inside(path: str, root: str) -> bool:
    return not root or path == root or path.startswith(root + ".")


def policy_table(model: nn.Module, schedule: Union[Schedule, str, Dict[str, Any]],
                 *, swaps: str = "refuse",
                 recompute: str = "must") -> List[FramePolicy]:
    """The frames to checkpoint and each one's decision -> (module, op,
    occurrence, policy) rows. Pure: runs nothing. Raises
    ScheduleMismatchError (another model's schedule) and
    UnsupportedScheduleError (SWAP decisions without swaps="ignore")."""
    from mutwo import _apply
    if swaps not in ("refuse", "ignore"):
        raise ValueError(f'swaps="{swaps}": use "refuse" (the default) or '
                         '"ignore" (swapped activations stay on the device)')
    if recompute not in ("must", "prefer"):
        raise ValueError(f'recompute="{recompute}": use "must" or "prefer"')
    if not isinstance(schedule, Schedule):
        schedule = Schedule.from_json(schedule)
    _apply._check(model, schedule)
    swapped = schedule.swapped
    if swapped and swaps != "ignore":
        total = sum(d.size_bytes for d in swapped)
        from mutwo._specs import format_bytes
        shown = ", ".join(repr(d.module_path or "(model)")
                          for d in swapped[:3])
        raise UnsupportedScheduleError(
            f"the schedule swaps {len(swapped)} activations "
            f"({format_bytes(total)}: {shown}"
            f"{' ...' if len(swapped) > 3 else ''}) and torch.compile's "
            "selective checkpointing cannot move tensors to the host: plan "
            "without swapping (a recompute-only schedule), use mutwo.apply "
            "(eager), or pass swaps=\"ignore\" to keep them on the device "
            "(the peak then exceeds the plan by up to that much)")
    notes: List[str] = []
    # A shared module's decisions name it by each path it is called
    # through; frames and rows use its named_modules() path, as the eager
    # hooks see it.
    canonical = _apply._canonical_paths(model)
    specs = _apply._frame_specs(model, schedule, canonical, notes)
    modules = dict(model.named_modules())
    # Frames nest as modules do: only the outermost is checkpointed, its
    # policy covers the inner ones. A Sequential child range widens to the
    # Sequential (the policy keeps everything outside the range's
    # activations).
    #
    # torch's checkpoint keeps a region's outputs (the modules after it save
    # them as usual), where mutwo.apply drops a frame output saved later: a
    # frame whose last activation (the highest producer node inside it,
    # normally its output) is recomputed reaches one module further up
    # (a leaf module's frame reaches its parent).
    def parent(path: str) -> str:
        up = path.rsplit(".", 1)[0] if "." in path else ""
        while up and isinstance(modules[up], (nn.ModuleList, nn.ModuleDict)):
            up = up.rsplit(".", 1)[0] if "." in up else ""
        return up

    def last_recomputed(path: str) -> bool:
        inside = [d for d in schedule.decisions
                  if _inside(canonical.get(d.module_path, d.module_path),
                             path)]
        return bool(inside) and max(
            inside, key=lambda d: d.producer_node).action == "RECOMPUTE"

    roots: List[Tuple[str, str]] = []
    for spec in specs:
        path, label = spec.path, spec.label()
        while path and last_recomputed(path):
            path = parent(path)
        if path != spec.path:
            label = f"{path or '(model)'} (for {label})"
        outer = [k for k, (r, _) in enumerate(roots) if _inside(path, r)]
        if outer:
            r, l = roots[outer[0]]
            roots[outer[0]] = (r, f"{l}, {label}")
            continue
        inner = [l for r, l in roots if _inside(r, path)]
        roots = [(r, l) for r, l in roots if not _inside(r, path)]
        roots.append((path, ", ".join([label] + inner)))
    order = {path: k for k, path in enumerate(modules)}
    roots.sort(key=lambda r: order[r[0]])
    rec = MUST_RECOMPUTE if recompute == "must" else PREFER_RECOMPUTE
    frames: List[FramePolicy] = []
    decisions = sorted(
        (dataclasses.replace(d, module_path=canonical.get(d.module_path,
                                                          d.module_path))
         for d in schedule.decisions),
        key=lambda d: (d.producer_node, d.output_index))
    for root, label in roots:
        rows: List[PolicyRow] = []
        subtrees: Dict[str, str] = {}
        per_module: Dict[Tuple[str, str], int] = {}
        per_frame: Dict[str, int] = {}
        seen_values: Set[Tuple[int, str]] = set()
        for d in decisions:
            if not _inside(d.module_path, root):
                continue
            policy = rec if d.action == "RECOMPUTE" else MUST_SAVE
            if d.op_kind in _CONTROL_FLOW:
                subtrees[d.module_path] = (PREFER_RECOMPUTE if policy == rec
                                           else PREFER_SAVE)
                continue
            # One op per producer node: several outputs of one op are one
            # decision for the policy (RECOMPUTE wins, as in mutwo.apply).
            key = (d.producer_node, d.module_path)
            if key in seen_values:
                for k, r in enumerate(rows):
                    if (r.decision.producer_node, r.module_path) == key and \
                            policy == rec:
                        rows[k] = dataclasses.replace(r, policy=rec,
                                                      decision=d)
                continue
            seen_values.add(key)
            ops = dispatch_ops(d.op_kind)
            n = per_module.get((d.module_path, ops[0]), 0)
            m = per_frame.get(ops[0], 0)
            for op in ops:
                per_module[(d.module_path, op)] = n + 1
                per_frame[op] = m + 1
            rows.append(PolicyRow(root, d.module_path, ops, n, m, policy, d))
        frames.append(FramePolicy(root, label, rows, subtrees))
    return frames


def _normalize_module_path(text: str) -> str:
    """A module path as torch.compile's nn_module_stack spells it
    ("L['self'].layer1[0].conv1", "L['self']._modules['fc']",
    "getattr(L['self'].layer1, '0')", "L__self___layer1_0") -> the
    named_modules() path ("layer1.0.conv1"); plain paths pass through."""
    import re
    s = text.strip()
    while True:
        t = re.sub(r"getattr\(([^()]*), '([^']*)'\)", r"\1.\2", s)
        if t == s:
            break
        s = t
    s = re.sub(r"\._modules\['([^']*)'\]", r".\1", s)
    s = re.sub(r"\[['\"]?([^\]'\"]*)['\"]?\]", r".\1", s)
    for prefix in ("L.self", "L['self']", "self", "L.mod", "L['mod']",
                   "L.model", "L['model']"):
        if s == prefix:
            return ""
        if s.startswith(prefix + "."):
            s = s[len(prefix) + 1:]
            break
    return s


def _is_compiling() -> bool:
    import torch
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        return bool(compiler.is_compiling())
    dynamo = getattr(torch, "_dynamo", None)
    return bool(dynamo is not None and dynamo.is_compiling())


class _Runtime:
    """The eager module stack and what the policies matched."""

    def __init__(self, paths: Set[str]):
        self.stack: List[str] = []
        self.paths = paths
        self.matched: Set[Tuple[str, str, int]] = set()
        self.calls = 0
        self.unattributed = 0
        # A module path torch.compile gave that names no module (the
        # report shows it).
        self.unknown: Optional[str] = None

    def module_now(self, frame: Optional[str] = None) -> Optional[str]:
        """The innermost running module: torch.compile's nn_module_stack
        while tracing, else the eager hooks' stack. `frame`: the path of
        the checkpointed module whose policy asks."""
        try:
            from torch.fx import traceback as fx_traceback
            meta = getattr(fx_traceback, "current_meta", None) or {}
        except ImportError:
            meta = {}
        stack = meta.get("nn_module_stack") if isinstance(meta, dict) else None
        if stack:
            value = list(stack.values())[-1]
            raw = value[0] if isinstance(value, tuple) else str(value)
            path = _normalize_module_path(str(raw))
            if path in self.paths:
                return path
            # Reached through the checkpointed function itself (the frame's
            # forward, bound to the frame's module: "L['forward'].__closure__
            # [2].cell_contents.__self__.encoder.layers[0]" when the frame
            # is the whole model): relative to the frame's module.
            parts = path.split(".")
            if frame is not None and "__self__" in parts:
                k = len(parts) - 1 - parts[::-1].index("__self__")
                full = ".".join(p for p in [frame] + parts[k + 1:] if p)
                if full in self.paths:
                    return full
            if self.unknown is None:
                self.unknown = str(raw)
            return None
        return self.stack[-1] if self.stack else None


class _Policy:
    """One checkpoint call's policy: counts ops per (module, name) and per
    name in the frame; forward and recompute counted apart (PyTorch 2.4
    asks the policy again during recompute)."""

    def __init__(self, frame: FramePolicy, rt: _Runtime,
                 by_module: Dict[Tuple[str, str, int], PolicyRow],
                 by_frame: Dict[Tuple[str, int], PolicyRow]):
        self.frame = frame
        self.rt = rt
        self.by_module = by_module
        self.by_frame = by_frame
        self.counts: Dict[bool, Dict[Tuple[Optional[str], str], int]] = {
            False: {}, True: {}}

    def decide(self, name: str, module: Optional[str],
               is_recompute: bool) -> str:
        counts = self.counts[is_recompute]
        row = None
        if module is not None:
            k = counts.get((module, name), 0)
            counts[(module, name)] = k + 1
            row = self.by_module.get((module, name, k))
        else:
            k = counts.get((None, name), 0)
            counts[(None, name)] = k + 1
            row = self.by_frame.get((name, k))
            if not is_recompute:
                self.rt.unattributed += 1
        if row is not None:
            if not is_recompute:
                self.rt.matched.add((row.frame, row.module_path,
                                     row.decision.producer_node))
            return row.policy
        return self.frame.subtree_policy(module) or PREFER_RECOMPUTE

    def __call__(self, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import CheckpointPolicy
        packet = getattr(func, "overloadpacket", None)
        name = getattr(packet, "__name__", None) or getattr(
            func, "__name__", str(func))
        self.rt.calls += 1
        policy = self.decide(name, self.rt.module_now(self.frame.path),
                             bool(getattr(ctx, "is_recompute", False)))
        return getattr(CheckpointPolicy, policy)


def _require_sac() -> None:
    import torch
    import torch.utils.checkpoint as ckpt
    if not (hasattr(ckpt, "create_selective_checkpoint_contexts") and
            hasattr(ckpt, "CheckpointPolicy")):
        raise RuntimeError(
            "mutwo._compile.apply_compiled needs PyTorch >= 2.4 "
            "(torch.utils.checkpoint.create_selective_checkpoint_contexts "
            f"and CheckpointPolicy); this is torch {torch.__version__}. "
            "Upgrade PyTorch, or train without torch.compile using "
            "mutwo.apply(model, schedule)")


class _PeakCheck:
    """Compile mode's check of the budget where the device reports a peak
    (CUDA): torch.cuda.max_memory_allocated from the second forward with
    gradients to the third, that is the second training step with its
    backward and optimizer step (the first one compiles), against the
    schedule's budget. Warns once (BudgetWarning), with the figures, when
    the peak is over the budget. Called outside the compiled graph at each
    forward with gradients, with the model (off CUDA nothing is
    measured)."""

    def __init__(self, budget_bytes: int, predicted_peak_bytes: int):
        self.budget_bytes = budget_bytes
        self.predicted_peak_bytes = predicted_peak_bytes
        self.forwards = 0
        self.peak_bytes: Optional[int] = None
        # False: nothing measured (`mutwo verify` measures the steps itself
        # and resets the statistics between them).
        self.active = True

    def over_budget(self) -> bool:
        return (self.peak_bytes is not None and self.budget_bytes > 0
                and self.peak_bytes > self.budget_bytes)

    def __call__(self, model: nn.Module) -> None:
        if self.peak_bytes is not None or not self.active:
            return  # measured, or not to be: no work per forward
        device = _cuda_device(model)
        if device is None:
            return
        import torch
        self.forwards += 1
        if self.forwards == 2:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        elif self.forwards == 3:
            torch.cuda.synchronize(device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(device))
            if self.over_budget():
                import warnings
                from mutwo._apply import BudgetWarning, peak_over_budget_text
                warnings.warn(peak_over_budget_text(
                    'mutwo.apply(mode="compile")', "second training step",
                    self.peak_bytes, self.budget_bytes,
                    self.predicted_peak_bytes) +
                    ": under torch.compile the partitioner decides the ops "
                    "the schedule does not name; eager mutwo.apply holds "
                    "the budget", BudgetWarning, stacklevel=2)

    def report_line(self) -> Optional[str]:
        if self.peak_bytes is None:
            return None
        from mutwo._specs import format_bytes
        return (f"  second step: peak {format_bytes(self.peak_bytes)} "
                "(torch.cuda.max_memory_allocated), budget "
                f"{format_bytes(self.budget_bytes)}: "
                f"{'OVER' if self.over_budget() else 'within'}")


def _cuda_device(model: nn.Module) -> Any:
    """The device of the model's first parameter when it is a CUDA one."""
    param = next(model.parameters(), None)
    return param.device if param is not None and param.is_cuda else None


class CompiledSchedule:
    """A schedule applied for torch.compile: the frames checkpointed, the
    policy rows, what matched; `remove()` restores the forwards."""

    def __init__(self, model: nn.Module, schedule: Schedule,
                 frames: List[FramePolicy], rt: _Runtime,
                 undo: List[Callable[[], None]], swaps: str,
                 step_check: Any, peak_check: _PeakCheck):
        self.model = model
        self.step_check = step_check
        self.peak_check = peak_check
        self.schedule = schedule
        self.frames = frames
        self._rt = rt
        self._undo = undo
        self.swaps = swaps

    def unmatched(self) -> List[PolicyRow]:
        """Rows (decisions inside a frame) no op matched at the last
        forwards (eager, or the trace torch.compile made)."""
        return [r for f in self.frames for r in f.rows
                if (r.frame, r.module_path, r.decision.producer_node)
                not in self._rt.matched]

    def report(self) -> str:
        rows = [r for f in self.frames for r in f.rows]
        rec = sum(r.policy in (MUST_RECOMPUTE, PREFER_RECOMPUTE)
                  for r in rows)
        trees = [p for f in self.frames for p in f.subtrees.values()]
        tree_rec = sum(p == PREFER_RECOMPUTE for p in trees)
        lines = [f"mutwo torch.compile policy: {len(self.frames)} "
                 f"checkpointed frames ({', '.join(f.label for f in self.frames) or 'none'}); "
                 f"{rec} recompute and {len(rows) - rec} save rows" + (
                     f", {len(trees)} control-flow subtrees ({tree_rec} "
                     "recomputed)" if trees else ""),
                 f"  policy calls {self._rt.calls}, without a known module "
                 f"{self._rt.unattributed}" + (
                     " (e.g. torch.compile's module path "
                     f"{self._rt.unknown!r})" if self._rt.unknown else "")]
        if self.schedule.swapped:
            lines.append(f"  note: {len(self.schedule.swapped)} SWAP "
                         "decisions ignored (kept on the device)")
        if not self.step_check.planned_inputs.recorded:
            lines.append("  note: the schedule records no inputs (planned "
                         "before schedules recorded their step): forward's "
                         "inputs are not checked against its batch "
                         f"{self.schedule.batch_size}")
        lines += self.step_check.report_lines()
        peak = self.peak_check.report_line()
        if peak:
            lines.append(peak)
        if self._rt.calls:
            for r in self.unmatched():
                lines.append(f"  not matched: {r.policy} "
                             f"{r.module_path or '(model)'} "
                             f"{r.decision.op_kind} (looked for "
                             f"{'/'.join(r.ops)} #{r.occurrence})")
        return "\n".join(lines)

    @property
    def measured_peak_bytes(self) -> Optional[int]:
        """The second training step's peak on a CUDA device (None before
        three forwards with gradients ran, or off CUDA)."""
        return self.peak_check.peak_bytes

    def remove(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        if getattr(self.model, "_mutwo_compiled", None) is self:
            del self.model._mutwo_compiled


def _check_inputs_first(model: nn.Module, step_check: Any,
                        peak_check: _PeakCheck,
                        undo: List[Callable[[], None]]) -> None:
    """Wraps the model's forward (outermost, around any frame) to check a
    forward with gradients against the planned step before it runs, and
    to measure the second step's peak (`_PeakCheck`)."""
    import torch
    from mutwo import _apply
    # torch.compile runs the checks in Python (a graph break before the
    # model's graph) rather than tracing inspect's argument binding or the
    # allocator's statistics.
    disable = getattr(getattr(torch, "compiler", None), "disable", None)

    def checks(args: Any, kwargs: Any) -> None:
        step_check(args, kwargs)
        peak_check(model)

    check = disable(checks) if disable is not None else checks

    def make(forward: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(forward)
        def run(*args: Any, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():
                check(args, kwargs)
            return forward(*args, **kwargs)
        return run

    _apply._wrap_forward(model, make, undo)


def compiled_schedule_of(model: nn.Module) -> Optional[CompiledSchedule]:
    """The CompiledSchedule apply_compiled attached to `model`, if any."""
    return getattr(model, "_mutwo_compiled", None)


def apply_compiled(model: nn.Module,
                   schedule: Union[Schedule, str, Dict[str, Any]], *,
                   swaps: str = "refuse", recompute: str = "must",
                   allow_cache_entry_mutation: bool = False,
                   force: bool = False, strict: bool = True) -> nn.Module:
    """Makes `model` run the schedule's recompute decisions as selective
    activation checkpointing; returns `model` itself (changed in place) to
    be compiled: `torch.compile(apply_compiled(model, schedule))`.
    `mutwo.apply(model, schedule, mode="compile")` calls this.
    `compiled_schedule_of(model)` gives the handle (`report()`,
    `unmatched()`, `remove()`).

    swaps="ignore" keeps SWAP decisions' activations on the device instead
    of refusing the schedule; recompute="prefer" lets the compiler keep a
    recomputed activation (PREFER_RECOMPUTE) instead of MUST_RECOMPUTE.
    Raises InfeasibleScheduleError for a schedule the planner marked
    infeasible unless force=True (as mutwo.apply), RuntimeError on PyTorch
    < 2.4, TypeError for a compiled or scripted module,
    ScheduleMismatchError for another model's schedule,
    UnsupportedScheduleError for SWAP decisions.

    A forward with gradients whose tensor inputs are not the step the
    schedule was planned for (another batch, shape, dtype or input count)
    raises ScheduleMismatchError before it runs, as mutwo.apply's eager
    mode does (its budget and decisions were priced for that step);
    strict=False runs it, warns once (BudgetWarning) and report() counts
    the calls.
    """
    import torch
    from mutwo import _apply
    if not isinstance(schedule, Schedule):
        schedule = Schedule.from_json(schedule)
    if not schedule.feasible and not force:
        _apply._refuse_infeasible(schedule)
    _require_sac()
    from torch.utils.checkpoint import (checkpoint,
                                        create_selective_checkpoint_contexts)
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("apply_compiled needs the eager nn.Module the "
                        "TorchScript came from, not a ScriptModule")
    if type(model).__name__ == "OptimizedModule" and hasattr(model,
                                                             "_orig_mod"):
        raise TypeError("apply_compiled needs the module before "
                        "torch.compile: torch.compile(apply_compiled(model, "
                        "schedule))")
    if compiled_schedule_of(model) is not None:
        raise ValueError("a schedule is already applied to this model; "
                         "remove() it first")
    frames = policy_table(model, schedule, swaps=swaps, recompute=recompute)
    modules = dict(model.named_modules())
    rt = _Runtime(set(modules))
    undo: List[Callable[[], None]] = []

    # The eager module stack (torch.compile reads nn_module_stack instead;
    # the hooks do nothing while it traces).
    path_of = {id(m): p for p, m in modules.items()}

    def pre_hook(m: nn.Module, _: Any) -> None:
        if not _is_compiling():
            rt.stack.append(path_of.get(id(m), ""))

    def post_hook(m: nn.Module, _: Any, __: Any) -> None:
        if not _is_compiling() and rt.stack:
            rt.stack.pop()

    covered = [p for p in modules
               if any(_inside(p, f.path) for f in frames)]
    for p in covered:
        h1 = modules[p].register_forward_pre_hook(pre_hook)
        h2 = modules[p].register_forward_hook(post_hook)
        undo += [h1.remove, h2.remove]

    for frame in frames:
        module = modules[frame.path]
        by_module, by_frame = frame.by_module(), frame.by_frame()

        def context_fn(frame: FramePolicy = frame,
                       by_module: Any = by_module,
                       by_frame: Any = by_frame) -> Any:
            policy = _Policy(frame, rt, by_module, by_frame)
            return create_selective_checkpoint_contexts(
                policy, allow_cache_entry_mutation=allow_cache_entry_mutation)

        def make(forward: Callable[..., Any],
                 _context_fn: Any = context_fn) -> Callable[..., Any]:
            @functools.wraps(forward)
            def run(*args: Any, **kwargs: Any) -> Any:
                if not torch.is_grad_enabled():
                    return forward(*args, **kwargs)
                return checkpoint(forward, *args, use_reentrant=False,
                                  context_fn=_context_fn, **kwargs)
            return run

        _apply._wrap_forward(module, make, undo)
    step_check = _apply.StepCheck(
        PlannedInputs(schedule.proto.inputs if schedule.proto is not None
                      else (), schedule.batch_size, model.forward),
        strict, "compiled_schedule_of(model).report()")
    peak_check = _PeakCheck(schedule.budget_bytes,
                            schedule.predicted_peak_bytes)
    _check_inputs_first(model, step_check, peak_check, undo)
    handle = CompiledSchedule(model, schedule, frames, rt, undo, swaps,
                              step_check, peak_check)
    model._mutwo_compiled = handle  # type: ignore[assignment]
    return model
