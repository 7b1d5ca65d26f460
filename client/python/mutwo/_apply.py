"""mutwo.apply: a schedule applied to the eager nn.Module it was planned for.

The schedule was planned on the TorchScript graph of the model; its
decisions name the module scope of the IR node that allocated each
activation. In eager PyTorch, autograd saves tensors through
`saved_tensors_hooks`; this module attributes each saved tensor to the
module that made its storage, whoever saves it (a module's output: the
innermost module returning it; a module's input nobody claimed: the
calling module; else the module running; views follow their base, in-place
ops make no storage) and applies the decision of that module path:

- RECOMPUTE: the segment's modules run inside a *frame*: the module
  enclosing every node the segment replays (or, inside an nn.Sequential, the
  run of children it spans). Saved tensors of the segment's modules are
  dropped in forward; the first backward use re-runs the frame's forward
  from its saved inputs (RNG state restored if the frame drew random
  numbers, so dropout draws the same mask; batch norms replayed with
  momentum 0, other modules' buffers copied back, so running statistics
  are updated once) up to the segment's last saved tensor,
  skipping module calls whose outputs are still held, and hands the re-made
  tensors to autograd. This is non-reentrant checkpointing
  (torch.utils.checkpoint(use_reentrant=False)) made selective; it nests
  with the swap hooks, which torch's own checkpoint would hide inside the
  checkpointed module.
- SWAP: the saved tensor is copied to pinned host memory on a side CUDA
  stream (on the CPU: a real copy into a separate tensor) and the device
  tensor released; it comes back in backward, prefetched a few tensors
  ahead in the reverse order of forward.

Decisions of one module path with different actions apply per op kind
where the saved tensor's autograd node names it, else the strongest
(RECOMPUTE over SWAP over RETAIN). Every RECOMPUTE/SWAP decision must match
a saved tensor in the first forward, or ScheduleMismatchError is raised
before any backward (strict=False: a BudgetWarning). `Applied.measurements()`
says what the first step measured.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import re
import time
import warnings
import weakref
from typing import (Any, Callable, Dict, Iterable, Iterator, List,
                    Optional, Sequence, Set, Tuple, Union)

import torch
from torch import nn

from mutwo._planned_inputs import PlannedInputs
from mutwo._specs import format_bytes
from mutwo._types import Decision, Schedule

__all__ = ["apply", "Applied", "ApplyMeasurements", "ApplyStats",
           "BudgetWarning", "InfeasibleScheduleError",
           "ScheduleMismatchError"]


class ScheduleMismatchError(ValueError):
    """The schedule does not fit this model or this step: it was planned
    for another model (module paths or op kinds differ), decisions it makes
    matched no tensor autograd saved in the first forward (`decisions`
    lists those; empty otherwise), or a forward's inputs are not the step
    it was planned for (another batch, shape, dtype or input count: the
    message names the input and both shapes)."""

    def __init__(self, message: str,
                 decisions: Sequence[Decision] = ()) -> None:
        super().__init__(message)
        self.decisions = list(decisions)


class InfeasibleScheduleError(ValueError):
    """The planner marked the schedule infeasible (`feasible == False`): its
    budget lies below what the model can be planned into, or a run measured
    it over its budget. `mutwo-worker execute` refuses it too."""


class BudgetWarning(UserWarning):
    """The applied schedule does not do what was planned: decisions were
    not applied (strict=False), or the first step measured more memory than
    the budget (CUDA) or less saving than planned (CPU)."""


# Op kinds a module of a known type can produce (checks that a schedule's
# decision fits the module at that path).
_KINDS_OF_TYPE: Tuple[Tuple[type, Tuple[str, ...]], ...] = (
    (nn.Conv1d, ("aten::conv1d", "aten::_convolution", "aten::convolution")),
    (nn.Conv2d, ("aten::conv2d", "aten::_convolution", "aten::convolution")),
    (nn.Conv3d, ("aten::conv3d", "aten::_convolution", "aten::convolution")),
    (nn.Linear, ("aten::linear", "aten::addmm", "aten::matmul")),
    (nn.modules.batchnorm._BatchNorm, ("aten::batch_norm",)),
    (nn.LayerNorm, ("aten::layer_norm",)),
    (nn.Embedding, ("aten::embedding",)),
)


def _storage_key(t: torch.Tensor) -> int:
    # The storage's address, from the tensor's own (no Storage object is
    # made: torch 1.13's t.storage() was most of the hooks' own time).
    return t.data_ptr() - t.storage_offset() * t.element_size()


def _storage_bytes(t: torch.Tensor) -> int:
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().nbytes()
    return t.storage().nbytes()


def _extent(t: torch.Tensor) -> Tuple[int, int]:
    """[first, last] element offsets of `t` in its storage."""
    first = t.storage_offset()
    span = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
    return first, first + span


def _normal_kind(name: str) -> str:
    """aten::layer_norm, aten::add_, NativeLayerNormBackward0 -> layernorm,
    add, layernorm: an op kind and an autograd node's name compared."""
    name = name.split("::")[-1].replace("_", "").lower()
    return name[len("native"):] if name.startswith("native") else name


_BACKWARD = re.compile(r"Backward\d*$")


@functools.lru_cache(maxsize=None)
def _node_type_kind(node_type: type) -> str:
    return _normal_kind(_BACKWARD.sub("", node_type.__name__))


def _grad_fn_kind(node: Any) -> str:
    # Per autograd node type, once: it ran for each saved tensor with a
    # decision of several op kinds (a regex and five string operations,
    # ~5% of apply's own Python in a MobileNetV2 step).
    return _node_type_kind(type(node))


class _Ident:
    """Which storage a tensor made in forward owns, without holding it: a
    weak reference to the tensor owning the storage (its base) and the
    autograd node that made that base. The base's Python object may go
    while views of it live on (a Linear's output split into q, k, v: only
    the views are referenced), and with it a weak reference; the node stays
    the views' graph's, so it still tells this storage from a later one at
    the same address. Holding the node holds no tensor once backward ran."""
    __slots__ = ("ref", "node")

    def __init__(self, t: torch.Tensor):
        base = t._base if t._base is not None else t
        self.ref = weakref.ref(base)
        self.node = base.grad_fn

    def matches(self, t: torch.Tensor) -> bool:
        base = t._base if t._base is not None else t
        if self.ref() is base:
            return True
        return self.node is not None and base.grad_fn is self.node

    def alive(self) -> bool:
        """Conservative: the node outlives the storage only while a graph
        holds it; with no node the weak reference says."""
        return self.ref() is not None or self.node is not None


def _swap_key(t: torch.Tensor) -> Tuple[Any, ...]:
    return (_storage_key(t), t.storage_offset(), tuple(t.shape),
            tuple(t.stride()), t.dtype)


def _flat_tensors(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flat_tensors(v)]
    return []


def _map_nested(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """`value` with `leaf` applied to everything inside its tuples, lists
    and dicts (a frame's stashed inputs)."""
    if isinstance(value, tuple):
        return tuple(_map_nested(v, leaf) for v in value)
    if isinstance(value, list):
        return [_map_nested(v, leaf) for v in value]
    if isinstance(value, dict):
        return {k: _map_nested(v, leaf) for k, v in value.items()}
    return leaf(value)


# torch.cat's autograd node type (release_cat_inputs).
_CAT_NODE = type(torch.cat([torch.zeros(1, requires_grad=True)]).grad_fn)


def _is_leaf(t: torch.Tensor) -> bool:
    # Parameters and inputs, and views of them (a layer scale's
    # `gamma.reshape(1, -1, 1, 1)`): alive anyway, nothing to drop or move.
    if t.grad_fn is None:
        return True
    base = t._base
    return base is not None and base.grad_fn is None


_STOP = "mutwo: replay complete"


class _Stop(Exception):
    """Ends a replay once every tensor it was asked for is re-made. Raised
    from a pack hook inside an op: torch 1.13 re-raises it as a
    RuntimeError carrying the message, newer versions as itself."""

    def __init__(self) -> None:
        super().__init__(_STOP)


@dataclasses.dataclass
class _FrameSpec:
    """Where one frame runs: a module (`children` None) or the children
    [first, last] of an nn.Sequential; what its modules' saved tensors do."""
    path: str
    children: Optional[Tuple[int, int]]
    drop: Dict[str, int]  # module path -> segment
    # Module path -> segment of a control-flow activation (prim::If,
    # prim::Loop: a scripted nn.TransformerEncoderLayer is one prim::If):
    # it stands for every tensor saved inside that module.
    subtree: Dict[str, int] = dataclasses.field(default_factory=dict)
    # Whether the frame's forward drew random numbers (dropout, stochastic
    # depth): None until its first run. A frame that draws none reads no
    # RNG state per module call in forward and restores none at replay.
    random: Optional[bool] = None
    # Plain batch norms inside the frame that carry no hooks: no pre-hook
    # tells a replay they run, so their statistics are guarded from its
    # start (updated once per step).
    unhooked_buffers: List[nn.Module] = dataclasses.field(
        default_factory=list)
    # Learned per training mode (see _Runtime.retire_learned): how many of
    # the frame's module calls had started when it last needed to count a
    # save (its last dropped save, or an output a later frame takes from
    # it); _NEVER_RETIRE when it needs every save to its end (its own
    # outputs are dropped, or it runs more than once a forward).
    retire: Dict[bool, int] = dataclasses.field(default_factory=dict)
    # Whether the frame may hold views of a kept concatenation in place of
    # its inputs (release_cat_inputs); False once its forward could not
    # read them (_Frame.replay).
    views: bool = True

    def dropping(self, path: str) -> Optional[Tuple[int, str]]:
        """(segment, decision's module path) if the frame drops tensors of
        module `path`, else None."""
        if path in self.drop:
            return self.drop[path], path
        for root, segment in self.subtree.items():
            if path == root or path.startswith(root + "."):
                return segment, root
        return None

    def label(self) -> str:
        if self.children is None:
            return self.path or "(model)"
        a, b = self.children
        return f"{self.path or '(model)'}[{a}:{b + 1}]"

    def covers(self, path: str, child_names: Sequence[str]) -> bool:
        """Whether a module path lies inside the frame."""
        if self.children is None:
            return (not self.path or path == self.path or
                    path.startswith(self.path + "."))
        prefix = self.path + "." if self.path else ""
        if not path.startswith(prefix) or path == self.path:
            return False
        head = path[len(prefix):].split(".", 1)[0]
        a, b = self.children
        return head in child_names[a:b + 1]


class _Frame:
    """One run of a frame's forward: its inputs, RNG state, the index of
    each tensor autograd saved inside it and which were dropped."""

    def __init__(self, rt: "_Runtime", spec: _FrameSpec,
                 call: Callable[..., Any], args: Tuple[Any, ...],
                 kwargs: Dict[str, Any], modules: Sequence[nn.Module]):
        self.rt = rt
        self.spec = spec
        self.call = call
        self.modules = modules
        self.count = 0
        # Module calls inside the frame, in forward order (a Sequential
        # range frame's first child is call 0): what a replay may skip.
        self.calls = 0
        self.last_ended: Optional[int] = None
        self.records: Dict[int, "_CallRecord"] = {}
        self.captured: List[torch.Tensor] = []
        self.dropped: Dict[int, int] = {}  # pack index -> segment
        self.ready: Dict[int, torch.Tensor] = {}
        self.ready_outputs: Dict[int, torch.Tensor] = {}
        # Saved references to each dropped output not yet unpacked: a
        # re-made output stays until the last of them is (a GELU output
        # saved as a view by the next Linear and by an add).
        self.output_uses: Dict[int, int] = {}
        tensors = _flat_tensors((args, kwargs))
        self.cuda_devices = sorted({t.device.index or 0 for t in tensors
                                    if t.is_cuda})
        # An input the schedule drops (the output of an earlier frame that
        # is recomputed, e.g. the previous block's) is not held here: the
        # replay asks its frame for it again, as the planner's replay
        # starts from what is retained. Holding it would keep it for the
        # whole step.
        # Weak: a held input is held by the stash; one the schedule swaps
        # is not held at all (release_swapped_inputs).
        self.input_versions: List[Tuple[Any, int]] = []
        # Concatenations saved (kept) inside the frame, with their version:
        # release_cat_inputs' candidates.
        self.kept_cats: List[Tuple[Any, int]] = []
        # Tensors made by an op inside the frame and saved (kept) there,
        # with their version: results a replay need not make again
        # (_held_result).
        self.kept_results: List[Tuple[Any, int]] = []
        # Inputs stashed as _Deferred, with what made them (the autograd
        # node and output number) and their version: also candidates.
        self.deferred_made: List[Tuple[Any, ...]] = []
        # Ids of the views of a kept concatenation held in place of inputs.
        self.views: Set[int] = set()
        self.args = _map_nested(args, self._stash)
        self.kwargs = _map_nested(kwargs, self._stash)
        self.cpu_rng = rt.cpu_rng()
        self.cuda_rng = [torch.cuda.get_rng_state(d)
                         for d in self.cuda_devices]
        # Module calls inside record the RNG state they leave unless the
        # frame is known to draw no random numbers; `drew`: this run did
        # (set when the frame closes), `untracked`: it did although its
        # calls recorded nothing (its replay then skips no call).
        self.tracked = spec.random is not False
        self.drew = True
        self.untracked = False
        # Module calls started (self.calls) at the last save this run
        # needed to count; the call count at which it retires (stops
        # counting saves and recording calls: its replay stops earlier),
        # None when it does not (not learned yet).
        self.last_needed = 0
        self.retire_at = rt.retire_point(spec)
        self.outputs_dropped = False

    def closed(self) -> None:
        """The frame's forward returned: did it draw random numbers?"""
        self.drew = (_cpu_rng() != self.cpu_rng or
                     any(not torch.equal(torch.cuda.get_rng_state(d), s)
                         for d, s in zip(self.cuda_devices, self.cuda_rng)))
        if self.drew:
            self.untracked = not self.tracked
            self.spec.random = True
        elif self.spec.random is None:
            self.spec.random = False

    def _stash(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            deferred = None
            dropped = self.rt.dropped_output(value, consume=False)
            if dropped is not None:
                deferred = _Deferred(dropped, value, self)
            else:
                inner = self.rt.inner_output(value)
                if inner is not None:
                    deferred = _Deferred(inner, value, self)
            if deferred is not None:
                if value.grad_fn is not None:
                    # Until the frame closes (release_cat_inputs).
                    self.deferred_made.append(
                        (deferred, value.grad_fn, value.output_nr,
                         weakref.ref(value), value._version))
                return deferred
            self.input_versions.append((weakref.ref(value), value._version))
        return value

    @staticmethod
    def _unstash(value: Any) -> Any:
        return _LazyInput(value) if isinstance(value, _Deferred) else value

    def held_inputs(self) -> List[torch.Tensor]:
        return [t for t in _flat_tensors((self.args, self.kwargs))]

    def release_swapped_inputs(self) -> None:
        """An input the schedule swaps (a convolution's output offloaded,
        the batch norm after it recomputed) is not held on the device by
        the frame: its replay copies it back from the host copy, as the
        planner's replay reads the swapped-in value."""
        if self.rt.swap_entries:
            self.args = _map_nested(self.args, self._release)
            self.kwargs = _map_nested(self.kwargs, self._release)

    def release_cat_inputs(self) -> None:
        """Inputs that a concatenation inside the frame read, all of them,
        when autograd keeps that concatenation (it saved it): the frame
        holds views of the concatenation instead, the same values, so the
        inputs themselves go where eager frees them. A DenseNet layer's
        input is the list of earlier features, which only its
        `torch.cat` reads and its first batch norm saves concatenated:
        held as a list, they stayed until the layer's backward (the
        block's end, in eager), the gap between planned and measured
        saving on DenseNet-121."""
        cats = [(ref(), v) for ref, v in self.kept_cats]
        deferred, self.deferred_made = self.deferred_made, []
        self.kept_cats = []
        cats = [(c, v) for c, v in cats if c is not None and c._version == v]
        if not cats or not self.spec.views:
            return
        versions = {id(r()): v for r, v in self.input_versions
                    if r() is not None}
        # (autograd node, output number) -> (the node, the stash entry,
        # its layout); the nodes are held here, so next_functions gives
        # the same objects. An input stashed as _Deferred (another
        # frame's replay would re-make it) counts when it is still the
        # value the frame saw.
        made: Dict[Tuple[int, int], Tuple[Any, Any, Any]] = {}
        for t in _flat_tensors((self.args, self.kwargs)):
            if t.grad_fn is not None and versions.get(id(t)) == t._version:
                made[(id(t.grad_fn), t.output_nr)] = (t.grad_fn, t, t)
        for entry, node, nr, ref, version in deferred:
            t = ref()
            if t is not None and t._version == version:
                made[(id(node), nr)] = (node, entry, t)
        views: Dict[int, torch.Tensor] = {}
        for c, _ in cats:
            node = c.grad_fn
            dim = getattr(node, "_saved_dim", None)
            if not isinstance(dim, int) or c.dim() == 0:
                continue
            dim %= c.dim()
            parts = [made.get((id(f), nr)) if f is not None else None
                     for f, nr in node.next_functions]
            if not parts or any(p is None for p in parts):
                continue
            inputs = [p[2] for p in parts]  # type: ignore[index]
            if any(t.dtype != c.dtype or t.device != c.device or
                   t.dim() != c.dim() or t.shape[:dim] != c.shape[:dim] or
                   t.shape[dim + 1:] != c.shape[dim + 1:] for t in inputs) \
                    or sum(t.shape[dim] for t in inputs) != c.shape[dim]:
                continue
            whole, offset = c.detach(), 0
            for part, t in zip(parts, inputs):
                view = whole.narrow(dim, offset, t.shape[dim])
                offset += t.shape[dim]
                views[id(part[1])] = view.requires_grad_(  # type: ignore
                    t.requires_grad)
        if views:
            def as_view(value: Any) -> Any:
                return views.get(id(value), value)
            self.args = _map_nested(self.args, as_view)
            self.kwargs = _map_nested(self.kwargs, as_view)
            self.views = {id(v) for v in views.values()}

    def _copy_view(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and id(value) in self.views:
            return value.detach().contiguous().requires_grad_(
                value.requires_grad)
        return value

    # A method, not a closure calling itself: such a closure is a reference
    # cycle holding the frame, and with it the frame's inputs on the
    # device, until Python's cyclic collector runs (0.3-0.8 GB held from
    # one step into the next on the GPU zoo's squeezenet1_1, resnet18 and
    # vgg11_bn).
    def _release(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            entry = self.rt.swap_entries.get(_swap_key(value))
            if entry is not None and entry.ident.matches(value) and \
                    entry.version == value._version:
                return _Deferred(_SwappedInput(entry, value.requires_grad),
                                 value, self)
            # A view of it was swapped that holds every element (a
            # LayerNorm2d saves its input permuted).
            for entry in self.rt.swapped_storages.get(
                    _storage_key(value), ()):
                if entry.ident.matches(value) and \
                        entry.version == value._version and \
                        entry.dtype == value.dtype and \
                        entry.host.numel() == value.numel() and \
                        entry.extent == _extent(value):
                    return _Deferred(_SwappedInput(entry,
                                                   value.requires_grad,
                                                   value), value, self)
        return value

    def tensor(self, index: int, segment: int) -> torch.Tensor:
        if index not in self.ready:
            self.replay(segment, outputs=())
        if index not in self.ready:
            raise RuntimeError(
                f"mutwo.apply: replaying {self.spec.label()} did not re-make "
                f"saved tensor #{index}: its forward saved {self.count} "
                f"tensors, the replay {self.replay_count} (data-dependent "
                "control flow?)")
        return self.ready.pop(index)

    def output(self, k: int, segment: int, consume: bool) -> torch.Tensor:
        t = self.ready_outputs.get(k)
        if t is None:
            self.replay(segment, outputs=(k,))
            t = self.ready_outputs[k]
        if consume:
            self.output_uses[k] = self.output_uses.get(k, 0) - 1
        if self.output_uses.get(k, 0) <= 0:
            self.ready_outputs.pop(k, None)
        return t

    replay_count = 0

    def call_output(self, call: int, k: int, segment: int) -> torch.Tensor:
        """Output k of module call `call` inside this frame, re-made by a
        replay that stops when that call returns."""
        self.replay(segment, outputs=(), capture=(call, k))
        if not self.captured:
            raise RuntimeError(
                f"mutwo.apply: replaying {self.spec.label()} did not reach "
                f"module call #{call}, whose output another frame needs: its "
                "forward ran differently the second time (data-dependent "
                "control flow?)")
        return self.captured.pop()

    def replay(self, segment: int, outputs: Sequence[int],
               capture: Optional[Tuple[int, int]] = None) -> None:
        try:
            self._replay(segment, outputs, capture)
        except RuntimeError:
            if not self.views:
                raise
            # Views of a kept concatenation stand for the frame's inputs
            # (release_cat_inputs): slices, not contiguous. A forward that
            # needs one contiguous (`.view(-1)`) cannot read them: the
            # frame holds contiguous copies from now on (what it held
            # before), its later runs hold their inputs, and it replays
            # again; an error that was not theirs comes again.
            self.args = _map_nested(self.args, self._copy_view)
            self.kwargs = _map_nested(self.kwargs, self._copy_view)
            self.views = set()
            self.spec.views = False
            replays = self.rt.stats.replays
            replays[self.spec.label()] -= 1  # the attempt that failed
            self._replay(segment, outputs, capture)

    def _replay(self, segment: int, outputs: Sequence[int],
                capture: Optional[Tuple[int, int]]) -> None:
        for ref, version in self.input_versions:
            t = ref()
            if t is not None and t._version != version:
                raise RuntimeError(
                    f"mutwo.apply: an input of {self.spec.label()} was "
                    "modified in place after the module ran; its replay "
                    "would see other values. Leave that module's inputs "
                    "unmodified, or plan without recomputing it.")
        # A replay made for another replay's input (outputs, inside a
        # replay) re-makes its segment's saved tensors too (kept until
        # backward reads them) only if that segment is the next one
        # backward reaches, the one before the running replay's in
        # forward order; else that output only, and the segment replays
        # again when backward reaches it, as the planner's replay of it
        # runs then. (EfficientNet-B1's floor on the CPU: a replay of
        # features.2[0:2] for an input re-made the stem's whole segment,
        # needed only at the end of backward: 8.7% over the worker.)
        running = self.rt.replays[-1] if self.rt.replays else None
        early = bool(outputs) and running is not None and \
            running.segment is not None and segment < running.segment - 1
        wanted = set() if capture is not None or early else {
            i for i, s in self.dropped.items()
            if s == segment and i not in self.ready}
        counter = [0]

        def pack(t: torch.Tensor) -> None:
            i = counter[0]
            counter[0] += 1
            if i in wanted:
                self.ready[i] = t
                wanted.discard(i)
                if not wanted and not outputs and capture is None:
                    raise _Stop()
            return None

        def unpack(_: Any) -> torch.Tensor:
            raise RuntimeError("mutwo.apply: a replay's own saved tensor "
                               "was used (internal error)")

        rt = self.rt
        previous = rt.mode
        depth = len(rt.stack)
        ctx = _ReplayContext(self, counter, set(wanted), (pack, unpack),
                             capture, segment)
        if self.spec.children is None:
            # A module frame calls its module's forward, not the module:
            # no pre-hook sees it.
            for m in self.modules:
                ctx.buffers.enter(m)
        for m in self.spec.unhooked_buffers:
            ctx.buffers.enter(m)
        rt.mode = "replay"
        rt.stats.replays[self.spec.label()] = (
            rt.stats.replays.get(self.spec.label(), 0) + 1)
        try:
            with (torch.random.fork_rng(devices=self.cuda_devices)
                  if self.drew else _NO_CONTEXT):
                if self.drew:
                    _set_cpu_rng(self.cpu_rng)
                    for d, state in zip(self.cuda_devices, self.cuda_rng):
                        torch.cuda.set_rng_state(state, d)
                with torch.enable_grad(), \
                        torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                    try:
                        args, kwargs = _map_nested((self.args, self.kwargs),
                                                   self._unstash)
                        rt.replays.append(ctx)
                        out = self.call(*args, **kwargs)
                        if outputs:
                            # A deferred call's output runs it here, with
                            # the replay's hooks and buffer guard.
                            out = _materialize(out)
                    except (_Stop, RuntimeError) as e:
                        if _STOP not in str(e):
                            raise
                        out = None
        finally:
            if rt.replays and rt.replays[-1] is ctx:
                rt.replays.pop()
            self.replay_count = counter[0]
            rt.mode = previous
            del rt.stack[depth:]  # modules a _Stop interrupted
            ctx.buffers.restore()
        if outputs:
            flat = _flat_tensors(out)
            for k in outputs:
                self.ready_outputs[k] = flat[k].detach()


class _CallRecord:
    """One module call inside a frame in forward: the frame's saved-tensor
    indices it made [pack_start, pack_end), the index after its own nested
    calls, its outputs (weak, with their versions) and the RNG state after
    it if it drew random numbers."""
    __slots__ = ("pack_start", "pack_end", "call_end", "outputs", "rng",
                 "overwritten_by")

    def __init__(self, pack_start: int, pack_end: int, call_end: int,
                 outputs: Any, rng: Optional[Tuple[Any, List[Any]]]):
        self.pack_start, self.pack_end = pack_start, pack_end
        self.call_end, self.outputs, self.rng = call_end, outputs, rng
        # The call right after this one, if it modified this call's one
        # output in place and nothing ran between them that saved a tensor
        # (a convolution or batch norm, then an in-place ReLU): a replay
        # that skips that call may skip this one too, with its result.
        self.overwritten_by: Optional[int] = None


class _Held:
    __slots__ = ("ref", "version", "node", "output_nr", "requires_grad",
                 "like")

    def __init__(self, t: torch.Tensor):
        self.ref, self.version = weakref.ref(t), t._version
        # The node that made it: a swapped output's host copy is found by
        # it once the tensor itself is gone.
        self.node = t.grad_fn
        self.output_nr = t.output_nr
        self.requires_grad = t.requires_grad
        # Its layout, for a replay that defers the call (_Deferred).
        self.like = (t.size(), t.stride(), t.dtype, t.device)


_NOT_HELD = object()


def _weak_outputs(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _Held(value)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_weak_outputs(v) for v in value)
    if isinstance(value, list):
        return [_weak_outputs(v) for v in value]
    if isinstance(value, (dict, set)) or (isinstance(value, tuple)):
        return _NOT_HELD  # named tuples, dicts: not rebuilt
    return value


def _held_outputs(value: Any,
                  restore: Optional[Callable[[_Held], Optional[torch.Tensor]]]
                  = None) -> Any:
    """The outputs again, if every tensor is alive and unmodified since
    the call returned, or (`restore`) copied back from the host copy the
    schedule swapped it to; else _NOT_HELD."""
    if value is _NOT_HELD:
        return _NOT_HELD
    if isinstance(value, _Held):
        t = value.ref()
        if t is None:
            t = restore(value) if restore is not None else None
            return _NOT_HELD if t is None else t
        if t._version != value.version:
            return _NOT_HELD
        return t
    if isinstance(value, (tuple, list)):
        out = [_held_outputs(v, restore) for v in value]
        if any(v is _NOT_HELD for v in out):
            return _NOT_HELD
        return type(value)(out)
    return value


_NO_CONTEXT = contextlib.nullcontext()


def _cpu_rng() -> bytes:
    """The CPU generator's state as bytes: held outside PyTorch's
    allocator, as the worker holds it (a std::string, worker/checkpoint.h),
    and compared without a kernel."""
    return torch.get_rng_state().numpy().tobytes()


def _set_cpu_rng(state: bytes) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))

# Batch norms whose forward is known: in a replay their running statistics
# are left as they are by momentum 0 (running * 1 + batch * 0, exact for
# finite statistics) and no num_batches_tracked to count, instead of a copy
# of every buffer before the replay and back after it.
_PLAIN_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class _BufferGuard:
    """Keeps a replay from changing the buffers of the modules it runs, so
    that batch-norm running statistics are updated once per step, as
    without the schedule. Plain batch norms in training mode run with
    momentum 0 and num_batches_tracked set aside; other modules' buffers
    are copied when the module starts and copied back after the replay
    (not by version counter: torch 1.13's batch_norm updates running
    statistics without moving it)."""
    __slots__ = ("norms", "saved", "seen")

    def __init__(self) -> None:
        self.norms: List[Tuple[nn.Module, Any, Any]] = []
        self.saved: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self.seen: Set[int] = set()

    def enter(self, m: nn.Module) -> None:
        buffers = m._buffers
        if not buffers or id(m) in self.seen:
            return
        self.seen.add(id(m))
        if type(m) in _PLAIN_BATCH_NORMS and m.training and \
                m.track_running_stats and m.momentum is not None:
            self.norms.append((m, m.momentum,
                               buffers.get("num_batches_tracked")))
            m.momentum = 0.0
            if "num_batches_tracked" in buffers:
                buffers["num_batches_tracked"] = None
            return
        for b in buffers.values():
            if b is not None:
                self.saved.append((b, b.detach().clone()))

    def restore(self) -> None:
        for m, momentum, tracked in self.norms:
            m.momentum = momentum
            if tracked is not None:
                m._buffers["num_batches_tracked"] = tracked
        if self.saved:
            with torch.no_grad():
                for b, saved in self.saved:
                    b.copy_(saved)
        self.norms, self.saved = [], []
        self.seen.clear()


class _ReplayContext:
    """A replay in progress: which forward call the next module call is
    and which saved-tensor indices it still wants."""

    def __init__(self, frame: _Frame, counter: List[int], wanted: Set[int],
                 hooks: Tuple[Callable[..., Any], Callable[..., Any]],
                 capture: Optional[Tuple[int, int]] = None,
                 segment: Optional[int] = None):
        self.frame, self.counter, self.wanted = frame, counter, wanted
        # The segment this replay re-makes (the schedule's numbering,
        # forward order).
        self.segment = segment
        self.calls = 0
        self.current: Optional[int] = None
        self.open: List[int] = []  # indices of the calls running now
        self.capture = capture
        self.buffers = _BufferGuard()
        self.restored: Dict[int, torch.Tensor] = {}
        # The replay's saved-tensor hooks (pack, unpack), for deferred
        # calls (run_deferred).
        self.hooks = hooks

    def started(self, module: nn.Module) -> None:
        self.buffers.enter(module)
        self.current = self.calls
        self.open.append(self.calls)
        self.calls += 1

    def ended(self, out: Any) -> None:
        index = self.open.pop() if self.open else None
        if self.capture is not None and index == self.capture[0]:
            self.frame.captured.append(
                _flat_tensors(out)[self.capture[1]].detach())
            raise _Stop()

    def skip(self, module: nn.Module, run: Callable[[], Any]) -> Any:
        """The outputs of the module call starting now, if it can be
        skipped: it makes none of the wanted saved tensors and its outputs
        are still held, unmodified (a convolution before the segment whose
        output the next batch norm saved), or it can be deferred
        (_defer); else _NOT_HELD. Skipping moves the saved-tensor index
        and the RNG past it as running it would."""
        index, self.current = self.current, None
        record = self.frame.records.get(index) if index is not None else None
        if record is None or self.frame.untracked:
            return _NOT_HELD
        out = self._outputs(index, record)
        if out is _NOT_HELD:
            out = self._defer(index, record, module, run)
        if out is _NOT_HELD:
            return out
        self.counter[0] += record.pack_end - record.pack_start
        self.calls = record.call_end
        if record.rng is not None:
            cpu, cuda = record.rng
            _set_cpu_rng(cpu)
            for d, state in zip(self.frame.cuda_devices, cuda):
                torch.cuda.set_rng_state(state, d)
        self.frame.rt.stats.skipped += 1
        return out

    def _outputs(self, index: int, record: "_CallRecord",
                 depth: int = 0) -> Any:
        """What call `index` returned, if the replay may skip it (see
        skip()); else _NOT_HELD. An output modified in place by the next
        call (a batch norm's, by an in-place ReLU) is no longer what this
        call returned, but if that next call is skipped too, what it
        returned is all the replay needs from both."""
        if any(record.pack_start <= w < record.pack_end
               for w in self.wanted):
            return _NOT_HELD
        if self.capture is not None and \
                index <= self.capture[0] < record.call_end:
            return _NOT_HELD  # the call to re-make runs inside it
        out = _held_outputs(record.outputs, self.restore)
        if out is _NOT_HELD and record.overwritten_by is not None and \
                depth < 16:
            nxt = self.frame.records.get(record.overwritten_by)
            if nxt is not None:
                out = self._outputs(record.overwritten_by, nxt, depth + 1)
        return out

    def _defer(self, index: int, record: "_CallRecord", module: nn.Module,
               run: Callable[[], Any]) -> Any:
        """A call whose one output is gone (dropped: its own frame re-makes
        it) and which makes none of the wanted saved tensors: not run now
        but when an op reads its output (a _LazyInput). The replay of a
        frame that starts at the model's first call skips every call whose
        output is held: a stem output the schedule drops or swaps is read
        by nobody when the next call is skipped too (resnet18's maxpool,
        then layer1 held: 154 MB re-made for nothing, and the swapped
        conv1 output copied back, 205 MB, at the peak of backward).
        Frames that draw random numbers run every such call in order
        (deferring those of their calls that draw nothing cut
        efficientnet_b0's replayed convolutions by a sixth, but raised
        efficientnet_b1's CPU floor peak to 1.086x the worker's, the
        apply tier's bar being 1.02x; why was not looked into)."""
        held = record.outputs
        # One tensor, or a tuple of tensors and Nones
        # (nn.MultiheadAttention's (output, None)).
        parts = held if isinstance(held, tuple) and all(
            isinstance(h, _Held) or h is None for h in held) else (held,)
        if not all(isinstance(h, _Held) or h is None for h in parts) or \
                not any(isinstance(h, _Held) for h in parts) or \
                self.frame.drew or \
                any(record.pack_start <= w < record.pack_end
                    for w in self.wanted) or \
                (self.capture is not None and
                 index <= self.capture[0] < record.call_end):
            return _NOT_HELD
        call = _DeferredCall(self, index, record, module, run)
        lazies = []
        for k, h in enumerate(parts):
            if h is None:
                lazies.append(None)
                continue
            size, stride, dtype, device = h.like
            lazies.append(_LazyInput(_Deferred.of(
                _DeferredPart(call, k if held is parts else None), size,
                stride, dtype, device, h.requires_grad,
                None if h.node is None else (h.node, h.output_nr),
                self.frame)))
        return tuple(lazies) if held is parts else lazies[0]

    def run_deferred(self, index: int, record: "_CallRecord",
                     run: Callable[[], Any]) -> Any:
        """A deferred call, run when an op reads its output: as if at its
        place in the replay (the saved-tensor index and module calls
        counted from its own, so its inner calls skip what is held), then
        the replay goes on where that op is."""
        rt = self.frame.rt
        if self not in rt.replays:
            raise RuntimeError(
                f"mutwo.apply: internal error: a deferred call of "
                f"{self.frame.spec.label()}'s replay was read after it")
        state = (self.counter[0], self.calls, self.current, self.open)
        depth = len(rt.replays)
        previous, rt.mode = rt.mode, "replay"
        self.counter[0], self.calls = record.pack_start, index + 1
        self.current, self.open = None, [index]
        rt.replays.append(self)
        try:
            with torch.enable_grad(), \
                    torch.autograd.graph.saved_tensors_hooks(*self.hooks):
                return run()
        finally:
            del rt.replays[depth:]
            rt.mode = previous
            self.counter[0], self.calls, self.current, self.open = state

    def restore(self, held: _Held) -> Optional[torch.Tensor]:
        """A call's output that is gone because the schedule swapped it
        (its saved reference was the last): copied back from its host copy
        when an op of the replay reads it (once per replay), as the
        planner's replay reads the swapped-in value instead of re-making it
        from further back. A replay that skips the next call too never
        reads it."""
        if held.node is None:
            return None
        entry = self.frame.rt.swap_nodes.get((held.node, held.output_nr))
        if entry is None or entry.version != held.version:
            return None
        t = self.restored.get(id(entry))
        if t is None:
            host = entry.host
            t = _LazyInput(_Deferred.of(
                _SwappedInput(entry, held.requires_grad), host.size(),
                host.stride(), entry.dtype, entry.device,
                held.requires_grad, (held.node, held.output_nr),
                self.frame))
            self.restored[id(entry)] = t
        return t


class _Dropped:
    __slots__ = ("frame", "index", "segment")

    def __init__(self, frame: _Frame, index: int, segment: int):
        self.frame, self.index, self.segment = frame, index, segment


class _DroppedOutput:
    """A frame output the schedule drops, or a view of one (what a later
    module saved: the next Linear saves a GELU output reshaped to 2-D),
    re-made by a replay of its frame when it is needed."""
    __slots__ = ("frame", "k", "segment", "view", "requires_grad",
                 "decision_path")

    def __init__(self, frame: _Frame, k: int, segment: int,
                 view: Optional[Tuple[Tuple[int, ...], Tuple[int, ...], int]],
                 requires_grad: bool, decision_path: str):
        self.frame, self.k, self.segment = frame, k, segment
        self.view = view
        self.requires_grad = requires_grad
        self.decision_path = decision_path

    def get(self, consume: bool) -> torch.Tensor:
        t = self.frame.output(self.k, self.segment, consume)
        if self.view is not None:
            size, stride, delta = self.view
            t = t.as_strided(size, stride, t.storage_offset() + delta)
        if not consume and self.requires_grad:
            # An input of another frame's replay: it must require grad as
            # it did in forward, or the ops of the replay save fewer
            # tensors than they did (a Linear on an input that needs no
            # gradient does not save its weight) and the saved indices no
            # longer match.
            t = t.detach().requires_grad_()
        return t


# Saved-tensor hook regions besides module calls' indices (>= 0): the
# model's own code (the whole forward), and the rest of a forward whose
# calls differ from the learned ones.
_MODEL_REGION = -1
_DIVERGED = -2
# _FrameSpec.retire: the frame counts every save to its end.
_NEVER_RETIRE = -1


class _HostPool:
    """Pinned host buffers for swapped tensors, reused from step to step.
    A new pinned buffer per swap went through PyTorch's caching host
    allocator, which still called cudaHostAlloc (about 10 ms each, on the
    host's critical path) several times a step on GPT's swaps. A buffer
    returns to the pool when its swap entry dies; the next step's copy into
    it is issued on the same side stream as the last copy out of it, so it
    runs after it."""

    def __init__(self) -> None:
        self.free: Dict[int, List[torch.Tensor]] = {}

    def take(self, owner: Any, t: torch.Tensor) -> torch.Tensor:
        nbytes = t.numel() * t.element_size()
        free = self.free.get(nbytes)
        buf = free.pop() if free else torch.empty(
            nbytes, dtype=torch.uint8, device="cpu", pin_memory=True)
        weakref.finalize(owner, self._give, weakref.ref(self), buf)
        return buf.view(t.dtype).view(t.shape)

    @staticmethod
    def _give(pool_ref: Any, buf: torch.Tensor) -> None:
        pool = pool_ref()
        if pool is not None:
            pool.free.setdefault(buf.numel(), []).append(buf)

    def clear(self) -> None:
        self.free.clear()


def _host_buffer(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of `t`'s shape and dtype whose memory is outside
    PyTorch's CPU allocator (a Python bytearray), so that on the CPU a
    swapped tensor's host copy is not counted as the device's memory, as
    the worker's HostStash keeps its host copies outside its counting
    allocator: the CPU rehearses the GPU's swap (device memory freed at
    offload, allocated again at the copy back)."""
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return torch.empty(t.shape, dtype=t.dtype, device="cpu")
    buf = torch.frombuffer(bytearray(nbytes), dtype=torch.uint8)
    return buf.view(t.dtype).view(t.shape)


class _SwapEntry:
    """One saved tensor held in host memory between forward and backward."""

    def __init__(self, rt: "_Runtime", t: torch.Tensor):
        self.rt = rt
        self.device = t.device
        self.shape = t.shape
        self.stride = t.stride()
        self.offset = t.storage_offset()
        self.version = t._version
        self.extent = _extent(t)
        self.dtype = t.dtype
        # What owns the storage (views keep it alive): tells this storage
        # from a later one at the same address.
        self.ident = _Ident(t)
        self.uses = 0
        self.position = len(rt.swap_order)
        self.restored: Optional[torch.Tensor] = None
        # Its version when made: a replay that borrowed it (borrow) and
        # wrote into it leaves a copy the unpacks must not take.
        self.restored_version = 0
        self.event: Any = None
        # Every saved reference of this backward read it: a prefetch for a
        # later entry's unpack must not copy it back again (backward does
        # not unpack in exactly the reverse order of forward's packs; such
        # copies stayed alive in swap_order through the optimizer step:
        # the Transformer encoder's floor, 0.69 GB over its budget).
        self.consumed = False
        if t.is_cuda:
            stream = rt.side_stream(t.device)
            self.host = rt.host_pool.take(self, t)
            stream.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(stream):
                self.host.copy_(t, non_blocking=True)
            t.record_stream(stream)
        else:
            self.host = _host_buffer(t)
            self.host.copy_(t)
        rt.stats.swapped_out += 1
        rt.stats.swapped_out_bytes += t.numel() * t.element_size()

    def prefetch(self) -> None:
        if self.restored is not None or self.event is not None or \
                self.consumed:
            return
        if self.device.type != "cuda":
            # The CPU rehearses the GPU's copy back: a tensor of the
            # device's allocator (the host copy is outside it).
            self.restored = self.host.clone()
            self.restored_version = self.restored._version
            self.rt.stats.swapped_in += 1
            return
        # No wait for the compute stream: the host copy was written on this
        # same stream (in order), and the new tensor comes from this
        # stream's memory. Waiting made every copy back start only once all
        # compute queued before it had run, so the copies did not overlap
        # backward (GPT, swaps only: 137 against eager's 83 ms a step).
        stream = self.rt.side_stream(self.device)
        with torch.cuda.stream(stream):
            self.restored = self.host.to(self.device, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(stream)
        self.restored_version = self.restored._version
        self.rt.stats.swapped_in += 1

    def _ready(self) -> torch.Tensor:
        """The copy back, usable on the current stream."""
        assert self.restored is not None
        if self.event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(self.event)
            self.restored.record_stream(current)
            self.event = None
        return self.restored

    def borrow(self) -> Optional[torch.Tensor]:
        """The value on its device for a replay that reads it (a frame's
        input, a call's swapped output) during a backward whose saved
        references have yet to read it: the copy back those unpacks will
        take (prefetched now if it is not yet), so the replay and the
        unpack share one device copy. None where there is none to share
        (every reference read already, outside a backward): the caller
        copies. A replay made a copy of its own before, beside the
        unpack's: on the GPU zoo's mobilenet_v2 (low) the replay of
        features.2.conv.0 reads a 154 MB swapped conv output that the
        batch norm's unpack copies back right after; that point peaked
        about that much over its prediction."""
        if self.consumed or self.uses <= 0:
            return None
        rt = self.rt
        if not rt.swap_backward_queued:
            rt.queue_swap_cleanup(rt.swap_order)
            if not rt.swap_backward_queued:
                return None
        self.prefetch()
        if self.restored is None:
            return None
        return self._ready()

    def get(self) -> torch.Tensor:
        if self.restored is not None and \
                self.restored._version != self.restored_version:
            # A replay that borrowed it wrote into it (an in-place op on
            # its input): copy back afresh.
            self.restored, self.event = None, None
        if self.restored is None:
            self.consumed = False  # read again (a second backward)
            self.prefetch()
        t = self._ready()
        self.uses -= 1
        if self.uses <= 0:
            self.restored = None  # a second backward copies again
            self.consumed = True
        return t

    def backward_done(self) -> None:
        """Its backward is over: a copy back that no unpack took goes."""
        self.restored = None
        self.event = None
        self.consumed = False


class _CallOutput:
    """A frame's input made inside an enclosing frame that drops it (GPT:
    the attention frame's input is ln1's output, which the model's frame
    drops): re-made by a replay of the enclosing frame up to that call."""
    __slots__ = ("frame", "call", "k", "segment", "requires_grad")

    def __init__(self, frame: _Frame, call: int, k: int, segment: int,
                 requires_grad: bool):
        self.frame, self.call, self.k = frame, call, k
        self.segment, self.requires_grad = segment, requires_grad

    def get(self, consume: bool) -> torch.Tensor:
        t = self.frame.call_output(self.call, self.k, self.segment)
        return t.detach().requires_grad_(self.requires_grad)


class _SwappedInput:
    """A frame's input held in host memory (its swap entry, or that of a
    view with the same elements): copied back for the replay without using
    up the entry's saved references."""
    __slots__ = ("entry", "requires_grad", "layout")

    def __init__(self, entry: "_SwapEntry", requires_grad: bool,
                 like: Optional[torch.Tensor] = None):
        self.entry, self.requires_grad = entry, requires_grad
        self.layout = None if like is None else (
            tuple(like.shape), tuple(like.stride()), like.storage_offset())

    def get(self, consume: bool) -> torch.Tensor:
        e = self.entry
        if self.layout is None:
            shared = e.borrow()
            if shared is not None:
                return shared.detach().requires_grad_(self.requires_grad)
        if e.device.type == "cuda":  # the copy to the host is complete
            torch.cuda.current_stream(e.device).wait_stream(
                e.rt.side_stream(e.device))
        if self.layout is None:
            # copy: on the CPU `.to` would return the host copy itself,
            # which an in-place op of the replay would then change.
            t = e.host.to(e.device, copy=True)
        else:
            # The swapped view's elements into a storage of the input's
            # extent, then the input's own view of it.
            lo, hi = e.extent
            flat = torch.empty(hi - lo + 1, dtype=e.dtype, device=e.device)
            flat.as_strided(e.shape, e.stride, e.offset - lo).copy_(e.host)
            size, stride, offset = self.layout
            t = flat.as_strided(size, stride, offset - lo)
        return t.detach().requires_grad_(self.requires_grad)


class _Deferred:
    """A frame input the frame does not hold (dropped: another frame's
    replay re-makes it; swapped: its host copy), with its layout: a replay
    passes a _LazyInput in its place."""
    __slots__ = ("handle", "size", "stride", "dtype", "device",
                 "requires_grad", "origin", "frame")

    def __init__(self, handle: Any, like: torch.Tensor,
                 frame: Optional[_Frame] = None):
        self.handle = handle
        self.size, self.stride = like.size(), like.stride()
        self.dtype, self.device = like.dtype, like.device
        self.requires_grad = like.requires_grad
        # What made the tensor it stands for in forward (autograd node,
        # output number) and the frame whose replay reads it: an op of
        # that replay whose result the frame still holds is not run
        # (_held_result).
        self.origin = None if like.grad_fn is None or like._base is not None \
            else (like.grad_fn, like.output_nr)
        # Weak: a frame's stashed inputs are _Deferred, and a reference
        # back would be a cycle holding the frame and its inputs until
        # the cyclic collector runs (_Frame._release).
        self.frame = None if frame is None else weakref.ref(frame)

    @classmethod
    def of(cls, handle: Any, size: Any, stride: Any, dtype: torch.dtype,
           device: torch.device, requires_grad: bool,
           origin: Optional[Tuple[Any, int]] = None,
           frame: Optional[_Frame] = None) -> "_Deferred":
        d = cls.__new__(cls)
        d.handle, d.size, d.stride = handle, size, stride
        d.dtype, d.device, d.requires_grad = dtype, device, requires_grad
        d.origin = origin
        d.frame = None if frame is None else weakref.ref(frame)
        return d


def _ran_already() -> Any:
    raise RuntimeError("mutwo.apply: internal error: a deferred call ran "
                       "twice")


class _DeferredCall:
    """A module call a replay deferred (_ReplayContext._defer): run by
    the first op that reads one of its outputs."""
    __slots__ = ("ctx", "index", "record", "module", "run", "out")

    def __init__(self, ctx: "_ReplayContext", index: int,
                 record: "_CallRecord", module: nn.Module,
                 run: Callable[[], Any]):
        self.ctx, self.index, self.record = ctx, index, record
        self.module, self.run = module, run
        self.out: Any = None

    def output(self, k: Optional[int]) -> torch.Tensor:
        """Its output (k None) or its tuple's k-th, the call run once (its
        inputs go with the closure; the stand-ins keep what it made)."""
        if self.run is not _ran_already:
            run, self.run = self.run, _ran_already
            self.out = self.ctx.run_deferred(self.index, self.record, run)
        out = self.out
        if k is not None and isinstance(out, tuple) and k < len(out):
            out = out[k]
        if not isinstance(out, torch.Tensor):
            raise RuntimeError(
                f"mutwo.apply: replaying {self.ctx.frame.spec.label()}: a "
                f"deferred {type(self.module).__name__} call returned "
                f"{type(out).__name__} where its forward returned a tensor "
                "(data-dependent control flow?)")
        return out


class _DeferredPart:
    """One output of a deferred call (k: its tuple's k-th; None: the
    call's one output)."""
    __slots__ = ("call", "k")

    def __init__(self, call: _DeferredCall, k: Optional[int]):
        self.call, self.k = call, k

    def get(self, consume: bool) -> torch.Tensor:
        return self.call.output(self.k)


def _tensor_attributes() -> Set[Any]:
    """What a forward may ask of its input without reading its elements."""
    methods = ("size", "dim", "ndimension", "numel", "nelement", "stride",
               "element_size", "is_floating_point", "is_complex",
               "get_device", "__len__", "is_contiguous")
    properties = ("shape", "dtype", "device", "ndim", "is_cuda",
                  "requires_grad", "layout", "grad_fn", "is_leaf",
                  "is_sparse", "is_quantized", "is_meta", "is_nested",
                  "is_mps")
    found: Set[Any] = set()
    for name in methods:
        if hasattr(torch.Tensor, name):
            found.add(getattr(torch.Tensor, name))
    for name in properties:
        attr = getattr(torch.Tensor, name, None)
        if attr is not None and hasattr(attr, "__get__"):
            found.add(attr.__get__)
    return found


_TENSOR_ATTRIBUTES = _tensor_attributes()


def _materialize(value: Any) -> Any:
    if isinstance(value, _LazyInput):
        return value.tensor()
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_materialize(v) for v in value)
    if isinstance(value, dict):
        return {k: _materialize(v) for k, v in value.items()}
    return value


# Reflected operators: `x + lazy` calls lazy.__radd__(x), args (lazy, x).
_REFLECTED = {"__radd__": "add", "__rmul__": "mul", "__rsub__": "sub",
              "__rtruediv__": "div", "__rdiv__": "div"}


def _origin_of(t: torch.Tensor) -> Any:
    """How autograd's node of an op that read `t` names it in its
    next_functions: (node, output number), ("leaf", t) for a tensor that
    requires a gradient and has no node (AccumulateGrad), (None, 0) for
    one without a gradient; None if unknown (a stand-in for a tensor made
    in the replay)."""
    if isinstance(t, _LazyInput):
        return t._mutwo_deferred.origin
    if t.grad_fn is not None:
        return (t.grad_fn, t.output_nr)
    return ("leaf", t) if t.requires_grad else (None, 0)


def _same_edge(edge: Tuple[Any, int], origin: Any) -> bool:
    node, nr = edge
    if origin[0] == "leaf":
        return node is not None and getattr(node, "variable", None) is \
            origin[1]
    return node is origin[0] and (node is None or nr == origin[1])


_SAVES: Dict[type, bool] = {}


def _saves_tensors(node: Any) -> bool:
    """Whether ops of `node`'s kind save tensors for backward (a replay
    counts saves: one that skips such an op would miscount them)."""
    kind = type(node)
    saves = _SAVES.get(kind)
    if saves is None:
        saves = _SAVES[kind] = any(a.startswith("_raw_saved_")
                                   for a in dir(node))
    return saves


def _held_result(func: Any, args: Tuple[Any, ...]) -> Optional[torch.Tensor]:
    """The result of `func(*args)` in a replay, if the frame holds it from
    forward: a tensor saved (kept) inside the frame, unmodified, that an
    op of the same kind made from exactly these inputs (autograd's edges
    of its node, in order, name them), one such tensor only. A replay
    whose frame must re-make the second half of a block (the
    planner's segment starts at the second LayerNorm) runs the block's
    forward from its start, skipping the calls whose outputs are held;
    the attention's output is gone (the residual add read it), so the
    attention was deferred, and the add that reads it ran it: the whole
    attention again, for an add whose result the second LayerNorm had
    saved (the user's ViT on the CPU: 6% over its budget). Only ops that
    save no tensor (the replay counts saves) and whose arguments are all
    tensors (an `alpha`, a `dim` could differ unseen); None to run the
    op."""
    name = getattr(func, "__name__", "")
    flat: List[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            flat.append(a)
        elif isinstance(a, (list, tuple)) and a and \
                all(isinstance(v, torch.Tensor) for v in a):
            flat.extend(a)
        else:
            return None
    if name in _REFLECTED:
        flat, name = flat[::-1], _REFLECTED[name]
    kind = _normal_kind(name.strip("_"))
    frame = None
    origins = []
    for t in flat:
        if isinstance(t, _LazyInput) and frame is None:
            ref = t._mutwo_deferred.frame
            frame = None if ref is None else ref()
        origin = _origin_of(t)
        if origin is None:
            return None
        origins.append(origin)
    if frame is None or not frame.kept_results:
        return None
    found: Optional[torch.Tensor] = None
    for ref, version in frame.kept_results:
        t = ref()
        if t is None or t._version != version:
            continue
        node = t.grad_fn
        if node is None or _grad_fn_kind(node) != kind or \
                _saves_tensors(node):
            continue
        edges = node.next_functions
        if len(edges) != len(origins) or not all(
                _same_edge(e, o) for e, o in zip(edges, origins)):
            continue
        if found is not None and found is not t:
            return None  # two candidates: run the op
        found = t
    if found is not None:
        frame.rt.stats.held_results += 1
    return found


class _LazyInput(torch.Tensor):
    """A replay's input that the frame does not hold, made only when an op
    reads it. The planner replays a segment from what is retained: a
    replay whose first module calls are skipped (their outputs held) never
    reads the frame's input, and re-making it would replay the frame that
    made it, and the one before (squeezenet1_1's Fire modules: 0.4 GB over
    the budget). Its shape, dtype and device answer without making it."""

    @staticmethod
    def __new__(cls, deferred: _Deferred) -> "_LazyInput":
        r = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, deferred.size, strides=deferred.stride,
            dtype=deferred.dtype, device=deferred.device,
            requires_grad=deferred.requires_grad)
        r._mutwo_deferred = deferred
        r._mutwo_made = None
        return r

    def tensor(self) -> torch.Tensor:
        if self._mutwo_made is None:
            made = self._mutwo_deferred.handle.get(consume=False)
            # A deferred call run now may itself return a stand-in: its
            # last inner call deferred in turn (its output held). Made
            # here, while the replay that deferred it runs: read later,
            # after that replay, it could no longer be made
            # (efficientnet_b0 on an H100, torch 2.11: "a deferred call of
            # features.5.2.block[0:2]'s replay was read after it").
            while isinstance(made, _LazyInput):
                made = made.tensor()
            self._mutwo_made = made
        return self._mutwo_made

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _TENSOR_ATTRIBUTES:
            with torch._C.DisableTorchFunction():
                return func(*args, **kwargs)
        if not kwargs:
            held = _held_result(func, args)
            if held is not None:
                return held
        return func(*_materialize(args), **_materialize(kwargs))

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        raise RuntimeError(
            f"mutwo.apply: internal error: {func} reached a replay input "
            "that was not made")


class _Swapped:
    __slots__ = ("entry", "position")

    def __init__(self, entry: "_SwapEntry", position: int):
        self.entry, self.position = entry, position


@dataclasses.dataclass
class ApplyStats:
    """What the hooks did (cumulative; `Applied.reset_stats()`)."""
    dropped: int = 0           # saved tensors dropped for a replay
    # Saved tensors left to autograd that apply's hook saw: every save in
    # the first forward, later only those in calls that need the hook.
    kept: int = 0
    swapped_out: int = 0       # copies to host memory
    swapped_out_bytes: int = 0
    swapped_in: int = 0        # copies back from host memory
    replays: Dict[str, int] = dataclasses.field(default_factory=dict)
    # Module calls replays skipped (outputs still held, nothing wanted).
    skipped: int = 0
    # Ops of a replay not run because the frame held their result.
    held_results: int = 0
    # Decisions' module paths whose saved tensors were dropped / swapped.
    dropped_paths: Set[str] = dataclasses.field(default_factory=set)
    swapped_paths: Set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class ApplyMeasurements:
    """What `mutwo.apply` measured on the first training step under the
    schedule. The saved bytes are one method for both sides: the storages
    of the tensors autograd saved in that forward, counted once each, all of
    them (`unmodified_saved_bytes`: what the step without a schedule holds
    at the end of forward) or those still held at its end with the
    schedule (`saved_bytes`: kept by autograd, held as a frame's input, or
    dropped or swapped but still alive through another reference); swapped
    copies in host memory are `swapped_bytes`, not counted as held."""
    device: str
    saved_bytes: int
    # Of saved_bytes: inputs frames hold for their replays that no saved
    # tensor keeps (eager would free them; the planner did not hold them).
    frame_input_bytes: int
    unmodified_saved_bytes: int
    # Sum of size_bytes of the RECOMPUTE and SWAP decisions: the activation
    # memory the planner expects gone at the end of forward.
    planned_saving_bytes: int
    swapped_bytes: int
    forward_seconds: float
    budget_bytes: int
    predicted_peak_bytes: int
    baseline_peak_bytes: int
    # Forward start to the end of its backward; None until backward ran.
    step_seconds: Optional[float] = None
    # CUDA: torch.cuda.max_memory_allocated over that forward and backward
    # (peak statistics are reset when it starts); None on the CPU.
    peak_bytes: Optional[int] = None
    # CUDA: the same from that forward to the next forward with gradients
    # (the optimizer step and whatever else ran between the two); None
    # until that forward.
    step_peak_bytes: Optional[int] = None

    @property
    def saving_bytes(self) -> int:
        return self.unmodified_saved_bytes - self.saved_bytes

    @property
    def saving_fraction(self) -> Optional[float]:
        """Measured saving over planned saving (None: nothing planned)."""
        if self.planned_saving_bytes <= 0:
            return None
        return self.saving_bytes / self.planned_saving_bytes


class _StepRecord:
    """Per forward: what the hooks saw (attribution and saved bytes)."""

    def __init__(self) -> None:
        self.dropped_paths: Set[str] = set()
        self.swapped_paths: Set[str] = set()
        # Every storage saved: a dropped one is freed in forward and its
        # address may be reused, so a key counts again once the tensor it
        # was seen with is gone.
        self.saved: Dict[int, Tuple[Any, int]] = {}
        self.saved_bytes = 0
        self.kept: Dict[int, int] = {}   # left to autograd
        # Dropped or swapped: alive at the end of forward only if something
        # else holds them.
        self.released: List[Tuple[Any, int, int]] = []
        self.swapped_bytes = 0

    def note_saved(self, t: torch.Tensor, key: int, nbytes: int) -> None:
        seen = self.saved.get(key)
        if seen is not None and seen[0]() is not None:
            return
        base = t._base if t._base is not None else t
        self.saved[key] = (weakref.ref(base), nbytes)
        self.saved_bytes += nbytes

    def held_bytes(self, frames: Iterable[Any]) -> Tuple[int, int]:
        """Bytes held at the end of forward (saved tensors autograd keeps,
        dropped or swapped ones still referenced, frames' inputs), and the
        part of it only frames hold: inputs stashed for their replays that
        no saved tensor keeps, which eager frees (a DenseNet layer's list
        of earlier features, at its block's end)."""
        held = dict(self.kept)
        for ref, key, nbytes in self.released:
            if ref() is not None:
                held[key] = nbytes
        only_frames: Dict[int, int] = {}
        for ref in frames:
            frame = ref()
            for t in frame.held_inputs() if frame is not None else ():
                key = _storage_key(t)
                if not _is_leaf(t) and key not in held:
                    only_frames[key] = _storage_bytes(t)
        extra = sum(only_frames.values())
        return sum(held.values()) + extra, extra


class _Runtime:
    def __init__(self, model: nn.Module, frames: List[_FrameSpec],
                 swap: Set[str], prefetch_ahead: int):
        self.model = model
        # Walked once: model.parameters() walks named_modules() again at
        # every forward, a third of an empty schedule's own cost (the
        # tensors themselves are read per forward: `p.data = ...` or
        # `.to()` give new storages).
        self.modules = list(model.modules())
        self.frames = frames
        self.last_cpu_rng = b""
        self.swap = swap
        # Any RECOMPUTE or SWAP decision applies: without one nothing is
        # attributed to modules, so no module hooks are installed and the
        # saved-tensor hook only counts (pack_plain).
        self.active = bool(frames) or bool(swap)
        # The first forward under the schedule measures saved bytes
        # (Applied.measurements()); later ones skip that bookkeeping.
        self.recording = True
        # Module path -> {op kind, normalised: action} for paths whose
        # decisions differ (a block's own ops: one add recomputed, another
        # retained); other paths take their decisions' one action.
        self.op_actions: Dict[str, Dict[str, str]] = {}
        # (module path, op kind) -> per op of that kind the module's
        # forward makes, in order: output index -> (action, segment)
        # (_op_sequences); which of them a saved tensor's producer is,
        # counted per forward (`occurrences`, the nodes held meanwhile).
        self.op_sequences: Dict[Tuple[str, str],
                                List[Dict[int, Tuple[str, int]]]] = {}
        self.occurrences: Dict[Tuple[str, str], Dict[int, int]] = {}
        self.occurrence_nodes: List[Any] = []
        # The learning forward's: per sequence, the hooked calls open when
        # each op was first seen saved; then (learned()) which of them a
        # forward with the hook on only where needed sees (an op whose
        # saves all lie where it is off, a RETAIN decision, is never
        # counted: GPT's block output, saved by the next block's norm).
        self.occurrence_stacks: Dict[Tuple[str, str],
                                     List[Tuple[int, ...]]] = {}
        self.occurrence_visible: Dict[Tuple[str, str], List[int]] = {}
        self.occurrences_sparse = False
        self.notes: List[str] = []  # Applied's (report())
        self.prefetch_ahead = prefetch_ahead
        self.mode = "off"  # off | forward | replay
        self.stack: List[str] = []
        # Storage -> (weakref of the tensor owning it, module path): the
        # module that made the storage. Views keep their base alive, so the
        # base is what is referenced.
        self.producers: Dict[int, Tuple[Any, str]] = {}
        self.frame_outputs: Dict[int, List[Tuple[Any, ...]]] = {}
        # Frames open now, outermost first (frames nest as modules do).
        self.open_frames: List[_Frame] = []
        # Weak: a frame nothing was dropped into goes when it closes.
        self.closed_frames: List[Any] = []
        # Frames still running that retired: past the last save their
        # replays re-make, they no longer count saves or record calls, so
        # that later saves need no hook (a frame spanning the model's
        # forward for a segment at its start kept every save of the
        # forward under the hook). Where a frame retires is learned by a
        # forward that runs it to its end (retire_learned, committed by
        # end_forward; the next forward then learns the hook regions
        # again, without the retired frames). `retiring`: off for the rest
        # of a forward whose module calls differ from the learned ones.
        # A forward that retired frames and dropped fewer saves than one
        # that did not (`full_drops`) forgets where frames retire.
        self.retired: List[_Frame] = []
        self.retiring = True
        self.retired_any = False
        self.training = True
        self.retire_learned: Dict[int, Tuple[_FrameSpec, int]] = {}
        self.forward_drops = 0
        self.full_drops: Dict[bool, int] = {}
        self.retire_warned = False
        self.swap_entries: Dict[Tuple[Any, ...], _SwapEntry] = {}
        self.swapped_storages: Dict[int, List[_SwapEntry]] = {}
        self.swap_order: List[_SwapEntry] = []
        self.swap_backward_queued = False
        # (autograd node, output number) of a swapped tensor that is no
        # view -> its entry, while a saved reference or a frame holds it:
        # a replay reads a swapped module output from here.
        self.swap_nodes: "weakref.WeakValueDictionary[Tuple[Any, int], _SwapEntry]" = \
            weakref.WeakValueDictionary()
        self.streams: Dict[Any, Any] = {}
        self.host_pool = _HostPool()
        # Saved-tensor hooks where they are needed. The first forward under
        # the schedule runs with the hooks on throughout and learns which
        # hooked module calls (by their index in forward's call sequence)
        # had a save that needed them: one inside an open frame, or one the
        # hook dropped or swapped. Later forwards with the same sequence of
        # calls turn the hooks on only from such a call's pre-hook to its
        # forward hook (its descendants included; _MODEL_REGION: the model's
        # own code, the whole forward). Every other save goes to autograd without a
        # Python call in forward or backward (two per saved tensor before).
        # A forward whose calls differ turns the hooks on for the rest of
        # it, and the next forward learns again.
        self.regions: Optional[Set[int]] = None
        self.region_paths: List[str] = []
        self.regions_training = True
        self.learning = False
        self.region_stack: List[int] = []
        self.ncalls = 0
        # The region that turned the hooks on in this forward (a call's
        # index, _MODEL_REGION or _DIVERGED), None while they are off.
        self.pushed: Optional[int] = None
        # learn | sparse | diverged | plain: how this forward ran the hook.
        self.forward_kind = "plain"
        # Weak references to the tensors this forward dropped or swapped;
        # how many the learning forward left alive at its end.
        self.released_refs: List[Any] = []
        self.learned_alive: Dict[bool, int] = {}
        self.missed_warned = False
        self.hooks_on = torch.autograd.graph.saved_tensors_hooks(
            self.pack, self.unpack)
        self.stats = ApplyStats()
        self.record = _StepRecord()
        self.alive_keys: Set[int] = set()
        self.skip_retained = True
        self.replays: List[_ReplayContext] = []
        self.inner_outputs: Dict[int, List[Tuple[Any, _Frame, int, int, int,
                                                 int]]] = {}
        # Per module call in forward while frames are open: (frame, call
        # index, pack index) for each, and the RNG state before it.
        self.calls: List[Optional[Tuple[List[Tuple[_Frame, int, int]],
                                        Any, List[Any]]]] = []
        # Per module call in forward (parallel to `calls`): the calls that
        # ended right before it whose output it takes (call_started).
        self.call_inputs: List[Optional[List[Tuple[Any, ...]]]] = []

    def side_stream(self, device: torch.device) -> Any:
        if device not in self.streams:
            self.streams[device] = torch.cuda.Stream(device)
        return self.streams[device]

    def rng_states(self, frames: Iterable[_Frame]) -> Tuple[Any, List[Any]]:
        devices = sorted({d for f in frames for d in f.cuda_devices})
        return (self.cpu_rng(),
                [torch.cuda.get_rng_state(d) for d in devices])

    def cpu_rng(self) -> bytes:
        """The CPU generator's state, the same object as the last one taken
        while no random number was drawn in between: frames and calls that
        open one after another share one (5 KB each: GPT's CPU floor held
        a dozen, 63 KB over the worker)."""
        state = _cpu_rng()
        if state == self.last_cpu_rng:
            return self.last_cpu_rng
        self.last_cpu_rng = state
        return state

    def retire_point(self, spec: _FrameSpec) -> Optional[int]:
        """The call count at which a new frame of `spec` retires, None
        when it runs counting to its end."""
        if not self.retiring:
            return None
        at = spec.retire.get(self.training)
        return at if at is not None and at >= 0 else None

    def retire_due(self) -> None:
        """Retires the open frames whose last needed save is behind them
        (a module call starts after it)."""
        frames = self.open_frames
        if not any(f.retire_at is not None and f.calls >= f.retire_at
                   for f in frames):
            return
        kept = []
        for f in frames:
            if f.retire_at is not None and f.calls >= f.retire_at:
                self.retired.append(f)
            else:
                kept.append(f)
        frames[:] = kept
        self.retired_any = True

    def learn_retire(self, frame: _Frame) -> None:
        """A frame closes: where its spec's frames can retire, if not known
        yet for this mode (committed by end_forward). A frame that retires
        had it known."""
        spec = frame.spec
        if self.training in spec.retire:
            return
        key = id(spec)
        value = (_NEVER_RETIRE if key in self.retire_learned or
                 frame.outputs_dropped else frame.last_needed)
        self.retire_learned[key] = (spec, value)

    def call_started(self, first_of: Optional[_Frame] = None,
                     inputs: Any = None,
                     module: Optional[nn.Module] = None) -> None:
        """A module call starts in forward (pre-hook); `first_of`: a range
        frame opened by this call's pre-hook, whose call 0 it is."""
        if first_of is not None:
            entry = self.calls[-1] if self.calls else None
            if entry is None or (entry[1] is None and first_of.tracked):
                marks = [] if entry is None else entry[0]
                entry = ((marks, *self.rng_states(self.open_frames))
                         if first_of.tracked else (marks, None, None))
                if self.calls:
                    self.calls[-1] = entry
            first_of.calls = 1
            entry[0].append((first_of, 0, 0))
            return
        if self.open_frames:
            self.retire_due()
        if not self.open_frames:
            self.calls.append(None)
            self.call_inputs.append(None)
            return
        marks = []
        tracked = False
        overwrite = None
        # Only a module that says it works in place (nn.ReLU(inplace=True),
        # timm's activations, dropout): the replay then hands the call
        # before it the in-place result, which code between the two calls
        # would read instead of the value before (`y = bn(x); z = y * 2;
        # relu(y)`); such modules are applied to the call's result at once.
        inplace = getattr(module, "inplace", False) is True
        for f in self.open_frames:
            # Takes the output of the call that ended right before it, with
            # nothing saved since: it may modify it in place (call_ended).
            r = f.records.get(f.last_ended) \
                if inplace and f.last_ended is not None else None
            if r is not None and r.call_end == f.calls and \
                    r.pack_end == f.count and isinstance(r.outputs, _Held):
                t = r.outputs.ref()
                if t is not None and t._version == r.outputs.version and \
                        any(t is x for x in _flat_tensors(inputs)):
                    overwrite = overwrite or []
                    overwrite.append((r, f.calls, t, t._version))
            marks.append((f, f.calls, f.count))
            f.calls += 1
            tracked = tracked or f.tracked
        self.call_inputs.append(overwrite)
        self.calls.append((marks, *self.rng_states(self.open_frames))
                          if tracked else (marks, None, None))

    def call_ended(self, out: Any) -> None:
        entry = self.calls.pop() if self.calls else None
        overwrite = self.call_inputs.pop() if self.call_inputs else None
        if overwrite and isinstance(out, torch.Tensor):
            for r, index, t, version in overwrite:
                if t is out and out._version != version:
                    r.overwritten_by = index
        if entry is None or not entry[0]:
            return
        marks, cpu, cuda = entry
        after: Any = None
        changed = False
        if cpu is not None:
            frames = [f for f, _, _ in marks]
            after = self.rng_states(frames)
            changed = after[0] != cpu or any(
                not torch.equal(a, b) for a, b in zip(after[1], cuda))
        outputs = _weak_outputs(out)
        for f, index, pack_start in marks:
            f.records[index] = _CallRecord(pack_start, f.count, f.calls,
                                           outputs,
                                           after if changed else None)
            f.last_ended = index
        # An output the innermost open frame drops: a frame opened later
        # inside it takes it as an input without holding it (its replay
        # asks this frame's replay for it, up to this call).
        for k, o in enumerate(_flat_tensors(out)):
            if _is_leaf(o):
                continue
            path = self.producer_of(o)
            for f, index, _ in reversed(marks):
                found = f.spec.dropping(path)
                if found is not None:
                    if self.refined(o, path) in (None, "RECOMPUTE"):
                        self.inner_outputs.setdefault(
                            _storage_key(o), []).append(
                                (weakref.ref(o), f, index, k, o._version,
                                 found[0]))
                        f.last_needed = max(f.last_needed, f.calls)
                    break

    def inner_output(self, t: torch.Tensor) -> Optional["_CallOutput"]:
        for ref, frame, index, k, version, segment in \
                self.inner_outputs.get(_storage_key(t), ()):
            if ref() is t and t._version == version:
                return _CallOutput(frame, index, k, segment, t.requires_grad)
        return None

    def begin_forward(self, inputs: Any) -> None:
        keys = {_storage_key(t) for t in _flat_tensors(inputs)}
        for m in self.modules:
            for t in m._parameters.values():
                if t is not None:
                    keys.add(_storage_key(t))
            for t in m._buffers.values():
                if t is not None:
                    keys.add(_storage_key(t))
        self.alive_keys = keys
        self.stack.clear()
        self.region_stack = []
        self.ncalls = 0
        self.pushed = None
        self.released_refs = []
        self.calls = []
        self.call_inputs = []
        self.inner_outputs.clear()
        self.producers.clear()
        self.frame_outputs.clear()
        self.open_frames = []
        self.closed_frames = []
        self.retired = []
        self.retiring = True
        self.retired_any = False
        self.training = self.model.training
        self.retire_learned = {}
        self.forward_drops = 0
        self.swap_entries.clear()
        self.swapped_storages.clear()
        self.swap_order = []
        self.swap_backward_queued = False
        self.swap_nodes = weakref.WeakValueDictionary()
        self.record = _StepRecord()

    def end_forward(self) -> None:
        """Forward is over: what only its packs and frames looked up goes.
        The frame-output and call-output tables hold their frames, and a
        frame holds its inputs: kept until the next forward they held every
        recompute frame's inputs through the whole backward and the
        optimizer step (vgg11_bn: a 411 MB ReLU output past its last use).
        Frames now live as long as the saved tensors dropped into them."""
        self.calls = []
        self.call_inputs = []
        self.inner_outputs.clear()
        self.producers.clear()
        self.frame_outputs.clear()
        self.swap_entries.clear()
        self.swapped_storages.clear()
        self.retired = []
        self.check_occurrences()
        self.check_released()
        self.check_retired()

    def forget_learned(self) -> None:
        """The next forward runs every frame to its end and the hook
        everywhere, and learns both again."""
        for spec in self.frames:
            spec.retire.pop(self.training, None)
        self.retire_learned = {}
        self.regions = None

    def check_retired(self) -> None:
        """Commits where frames retire (learned by this forward), and
        checks a forward that retired frames dropped as many saves as one
        that did not: fewer means a frame retired before a save it drops
        (the same module calls saving elsewhere than in the forward that
        learned it); then frames run to their end again and relearn."""
        kind = self.forward_kind
        training = self.training
        if kind in ("learn", "sparse"):
            if not self.retired_any:
                self.full_drops[training] = self.forward_drops
            elif self.forward_drops < self.full_drops.get(training, 0):
                self.forget_learned()
                if not self.retire_warned:
                    self.retire_warned = True
                    warnings.warn(
                        f"mutwo.apply: this forward dropped "
                        f"{self.full_drops[training] - self.forward_drops} "
                        "saved tensor(s) fewer than the last forward in "
                        "which every recompute frame counted to its end: a "
                        "frame stopped counting saves before one it drops "
                        "(code that saves later than in the forward that "
                        "learned where it stops?). Those stayed in memory "
                        "this step; frames count to their end again and "
                        "relearn. "
                        "This warning is shown once.", BudgetWarning,
                        stacklevel=4)
        if self.retire_learned:
            learned = False
            for spec, value in self.retire_learned.values():
                spec.retire[training] = value
                learned = learned or value >= 0
            self.retire_learned = {}
            if learned:
                # Hook regions as they are with these frames retiring.
                self.regions = None

    def check_released(self) -> None:
        """Dropped and swapped tensors still alive at the end of forward,
        against the learning forward's count: more means a save of one of
        them ran where the hook was off (code that saved it elsewhere than
        in the learning forward, with the same module calls). That step
        keeps it; the next forward learns again. A forward learning the
        hook regions with frames that retire is checked as a sparse one is
        (a save past a frame's retirement is kept as one where the hook was
        off), against the count of one with no frame retiring."""
        alive = sum(1 for r in self.released_refs if r() is not None)
        self.released_refs = []
        kind = self.forward_kind
        learned = self.learned_alive.get(self.training, 0)
        if kind == "learn" and not self.retired_any:
            self.learned_alive[self.training] = alive
        elif kind in ("learn", "sparse") and alive > learned:
            self.forget_learned()
            if not self.missed_warned:
                self.missed_warned = True
                warnings.warn(
                    f"mutwo.apply: {alive - learned} tensor(s) "
                    "the schedule drops or swaps stayed in memory after "
                    "this forward: code saved them where the first forward "
                    "did not (a branch inside a module's forward?), where "
                    "apply's saved-tensor hook was off or its recompute "
                    "frame had stopped counting saves. The next forward "
                    "runs the hook everywhere and frames to their end, and "
                    "learns again; this warning is shown once.",
                    BudgetWarning, stacklevel=4)

    def refined(self, t: torch.Tensor, path: str) -> Optional[str]:
        """For a module path with decisions of different actions, the
        action of the decision on the op that made `t` (its autograd node's
        name: SoftmaxBackward0 is aten::softmax); None: the path's
        strongest action applies (one action only, or an op that cannot be
        told: a tensor without gradient such as nonzero's indices, or an
        autograd name that is not the op's)."""
        return self.decision_of(t, path, count=False)[0]

    def decision_of(self, t: torch.Tensor, path: str, count: bool = True
                    ) -> Tuple[Optional[str], Optional[int]]:
        """(action, segment) of the decision on the op that made `t`:
        refined() by its kind, and where the module's forward makes that
        kind more than once with different decisions (a MoE layer's
        index_select and mul per expert) the one on that op, by the order
        the forward made them (`count`: a saved tensor's producer not
        seen yet in this forward is the next one). Segment None: the
        frame's."""
        base = t._base if t._base is not None else t
        node = base.grad_fn
        if node is None:
            return None, None
        kind = _grad_fn_kind(node)
        sequence = self.op_sequences.get((path, kind))
        if sequence is not None:
            seen = self.occurrences.get((path, kind))
            k = seen.get(id(node)) if seen is not None else None
            if k is None and count:
                if seen is None:
                    seen = self.occurrences[(path, kind)] = {}
                k = len(seen)
                if self.learning:
                    self.occurrence_stacks.setdefault(
                        (path, kind), []).append(tuple(self.region_stack))
                elif self.forward_kind == "sparse":
                    # Where the hook is on only where needed, the k-th op
                    # seen is the k-th the learning forward saw there.
                    self.occurrences_sparse = True
                    visible = self.occurrence_visible.get((path, kind))
                    if visible is not None and k < len(visible):
                        k = visible[k]
                seen[id(node)] = k
                self.occurrence_nodes.append(node)
            if k is not None and k < len(sequence):
                found = sequence[k].get(base.output_nr)
                if found is not None:
                    return found
        kinds = self.op_actions.get(path)
        return (kinds.get(kind) if kinds else None), None

    def check_occurrences(self) -> None:
        """End of a forward: a sequence whose ops this forward did not make
        one for one (control flow, a module called more or less often, a
        save that moved to where the hook is off) is not trusted again:
        the strongest decision of its kind applies from the next
        forward."""
        for key, seen in self.occurrences.items():
            sequence = self.op_sequences.get(key)
            if sequence is None:
                continue
            # A forward with the hook on only where needed sees the ops
            # the learning forward saw saved there.
            visible = self.occurrence_visible.get(key)
            expected = len(sequence)
            if self.occurrences_sparse and visible is not None:
                expected = len(visible)
            if len(seen) != expected:
                del self.op_sequences[key]
                self.notes.append(
                    f"{key[0] or '(model)'}'s forward made {len(seen)} "
                    f"{key[1]} op(s) with saved outputs where the schedule "
                    f"has decisions on {len(sequence)}: the strongest of "
                    "them applies to all from the next forward")
        self.occurrences = {}
        self.occurrence_nodes = []
        self.occurrences_sparse = False

    def alive_anyway(self, t: torch.Tensor) -> bool:
        """Parameters, buffers and the forward's inputs, and views of them
        (a layer scale's `gamma.reshape(1, -1, 1, 1)`): held whatever the
        schedule does. A tensor made in forward that needs no gradient (a
        dropout mask on the CPU, max-pool indices) is an activation."""
        base = t._base if t._base is not None else t
        if base.grad_fn is not None:
            return False
        return base.requires_grad or _storage_key(t) in self.alive_keys

    def produced(self, t: torch.Tensor, path: str) -> None:
        """Records `path` as the module that made t's storage, unless a
        live tensor already claimed it (the innermost module returning a
        tensor claims it first; an in-place op or a view after it does not
        make a new storage, so the planner counts it to the op that
        allocated it, as here)."""
        key = _storage_key(t)
        if key in self.alive_keys:
            return
        entry = self.producers.get(key)
        if entry is None or not entry[0].matches(t):
            self.producers[key] = (_Ident(t), path)

    def producer_of(self, t: torch.Tensor, key: Optional[int] = None) -> str:
        entry = self.producers.get(_storage_key(t) if key is None else key)
        if entry is not None and entry[0].matches(t):
            return entry[1]
        # Made by an op of the module running now (a functional op in its
        # forward): tensors made by a module that returned were claimed by
        # its forward hook, those a module received by its pre-hook.
        return self.stack[-1] if self.stack else ""

    def _released(self, t: torch.Tensor, key: int, nbytes: int) -> None:
        ref = weakref.ref(t)
        self.released_refs.append(ref)
        # Bookkeeping of the measured (first) forward only.
        if self.recording:
            self.record.released.append((ref, key, nbytes))

    # Where the saved-tensor hooks are on (see `regions`)
    def region_started(self, path: str) -> None:
        """A hooked module call starts in forward (its pre-hook)."""
        idx = self.ncalls
        self.ncalls = idx + 1
        self.region_stack.append(idx)
        if self.learning:
            self.region_paths.append(path)
            return
        regions = self.regions
        if regions is None:  # diverged in this forward: hooks are on
            return
        paths = self.region_paths
        if idx >= len(paths) or paths[idx] != path:
            # Not the learned sequence of calls: the hooks on for the rest
            # of this forward (saves so far were in calls that matched),
            # and the next forward learns again; frames opened from here
            # count to their end.
            self.regions = None
            self.forward_kind = "diverged"
            self.retiring = False
            if self.pushed is None:
                self.hooks_on.__enter__()
                self.pushed = _DIVERGED
            return
        if self.pushed is None and idx in regions:
            self.hooks_on.__enter__()
            self.pushed = idx

    def region_ended(self) -> None:
        """A hooked module call ends in forward (its forward hook)."""
        if not self.region_stack:
            return
        if self.pushed == self.region_stack.pop():
            self.hooks_on.__exit__()
            self.pushed = None

    def learn_regions(self, training: bool) -> None:
        self.regions = set()
        self.region_paths = []
        self.regions_training = training
        self.learning = True
        self.occurrence_stacks = {}
        self.occurrence_visible = {}

    def learned(self) -> None:
        """A learning forward ran to its end: which ops of each sequence a
        forward with the hook on only where needed will see saved (one
        saved inside a call whose hook region is on, or anywhere when the
        model's own code turns it on)."""
        self.learning = False
        regions = self.regions or set()
        everywhere = _MODEL_REGION in regions
        self.occurrence_visible = {
            key: [k for k, stack in enumerate(stacks)
                  if everywhere or any(r in regions for r in stack)]
            for key, stacks in self.occurrence_stacks.items()}

    def hooks_off(self) -> None:
        """End of a forward (or its exception): hooks this forward turned
        on come off; what was learned stays."""
        if self.pushed is not None:
            self.hooks_on.__exit__()
            self.pushed = None
        if self.learning:  # a forward that raised learned part of it
            self.regions = None
            self.learning = False
        self.region_stack = []

    def pack_learning(self, t: torch.Tensor) -> Any:
        """pack, noting the hooked call it ran in when the save needed the
        hook (the learning forward)."""
        needed = bool(self.open_frames)
        out = self.pack(t)
        if needed or out is not t:
            self.regions.add(  # type: ignore[union-attr]
                self.region_stack[-1] if self.region_stack
                else _MODEL_REGION)
        return out

    # saved_tensors_hooks of the forward pass
    def pack(self, t: torch.Tensor) -> Any:
        # Every open frame counts every save: its replay saves the same
        # sequence (inner frames included).
        open_frames = self.open_frames
        indices = []
        for frame in open_frames:
            indices.append(frame.count)
            frame.count += 1
        if t.numel() == 0 or self.alive_anyway(t):
            self.stats.kept += 1
            return t
        record = self.record
        recording = self.recording
        key, nbytes = _storage_key(t), 0
        if recording:
            nbytes = _storage_bytes(t)
            record.note_saved(t, key, nbytes)
        path = self.producer_of(t, key)
        refined, own_segment = self.decision_of(t, path)
        if refined not in ("RETAIN", "SWAP"):
            for k in range(len(open_frames) - 1, -1, -1):
                frame = open_frames[k]
                found = frame.spec.dropping(path)
                if found is not None:  # the innermost frame dropping it
                    segment, decision_path = found
                    if own_segment is not None:
                        segment = own_segment
                    index = indices[k]
                    frame.dropped[index] = segment
                    frame.last_needed = frame.calls
                    self.forward_drops += 1
                    self.stats.dropped += 1
                    self.stats.dropped_paths.add(decision_path)
                    record.dropped_paths.add(decision_path)
                    self._released(t, key, nbytes)
                    return _Dropped(frame, index, segment)
        dropped = (self.dropped_output(t, consume=True, key=key)
                   if key in self.frame_outputs else None)
        if dropped is not None:
            self.stats.dropped += 1
            self.forward_drops += 1
            self.stats.dropped_paths.add(dropped.decision_path)
            record.dropped_paths.add(dropped.decision_path)
            self._released(t, key, nbytes)
            return dropped
        if refined == "SWAP" or (refined is None and path in self.swap):
            skey = _swap_key(t)
            entry = self.swap_entries.get(skey)
            if entry is None or not entry.ident.matches(t) or \
                    entry.version != t._version:
                entry = _SwapEntry(self, t)
                self.swap_entries[skey] = entry
                if t._base is None and t.grad_fn is not None:
                    self.swap_nodes[(t.grad_fn, t.output_nr)] = entry
                self.swapped_storages.setdefault(key, []).append(entry)
                self.swap_order.append(entry)
                self.stats.swapped_paths.add(path)
                record.swapped_bytes += t.numel() * t.element_size()
            record.swapped_paths.add(path)
            self._released(t, key, nbytes)
            entry.uses += 1
            return _Swapped(entry, entry.position)
        self.stats.kept += 1
        if recording:
            record.kept[key] = nbytes
        if open_frames and t.grad_fn is not None:
            if type(t.grad_fn) is _CAT_NODE:
                open_frames[-1].kept_cats.append((weakref.ref(t),
                                                  t._version))
            if t._base is None:
                kept = (weakref.ref(t), t._version)
                for frame in open_frames:
                    frame.kept_results.append(kept)
        return t

    def pack_plain(self, t: torch.Tensor) -> Any:
        """pack for a schedule with no RECOMPUTE or SWAP decision: every
        saved tensor stays; the first forward notes its bytes."""
        self.stats.kept += 1
        if self.recording and t.numel() != 0 and not self.alive_anyway(t):
            key, nbytes = _storage_key(t), _storage_bytes(t)
            self.record.note_saved(t, key, nbytes)
            self.record.kept[key] = nbytes
        return t

    def dropped_output(self, t: torch.Tensor, consume: bool,
                       key: Optional[int] = None
                       ) -> Optional[_DroppedOutput]:
        """A reference to `t` if it is an output of a closed frame that the
        schedule drops, or a view into one (its frame re-makes it), else
        None. `consume`: a saved reference (counted until unpacked), not a
        frame's input."""
        entries = self.frame_outputs.get(_storage_key(t) if key is None
                                         else key)
        if not entries:
            return None
        for out in entries:
            ident, owner, k, version, segment, decision = out[:6]
            if t._version != version or not ident.matches(t):
                continue
            view = None
            if out[6]() is not t:
                # A view of it; the output's own Python object may be gone
                # (a Linear's output split into q, k, v), so its layout was
                # noted when the frame closed.
                lo, hi, offset, dtype, device = out[7:]
                if t.dtype != dtype or t.device != device:
                    continue
                first, last = _extent(t)
                if first < lo or last > hi:
                    continue
                view = (tuple(t.shape), tuple(t.stride()),
                        t.storage_offset() - offset)
            if consume:
                owner.output_uses[k] = owner.output_uses.get(k, 0) + 1
            return _DroppedOutput(owner, k, segment, view, t.requires_grad,
                                  decision)
        return None

    def unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, _Dropped):
            return packed.frame.tensor(packed.index, packed.segment)
        if isinstance(packed, _DroppedOutput):
            return packed.get(consume=True)
        if isinstance(packed, _Swapped):
            order = self.swap_order
            if not self.swap_backward_queued:
                self.queue_swap_cleanup(order)
            for p in range(packed.position - 1,
                           max(-1, packed.position - 1 - self.prefetch_ahead),
                           -1):
                if p < len(order):
                    order[p].prefetch()
            return packed.entry.get()
        return packed

    def queue_swap_cleanup(self, order: List[_SwapEntry]) -> None:
        """At the end of the backward now running, every copy back of
        `order` (this forward's swap entries) that no unpack took is
        dropped: a prefetch ahead of an unpack that never came would hold
        device memory until the next forward; and the forward's swap
        order and its table of swapped module outputs go. Outside a
        backward (a saved tensor read directly) nothing is queued."""
        def done() -> None:
            self.swap_backward_queued = False
            for entry in order:
                entry.backward_done()
            if order is self.swap_order:
                # Entries hold the autograd node that made their tensor,
                # and this table's keys hold nodes: a branch this backward
                # did not reach (an output outside the loss) would keep its
                # saved tensors until the next forward. A second backward
                # copies back without prefetch, and its replays re-make
                # swapped module outputs.
                self.swap_order = []
                self.swap_nodes = weakref.WeakValueDictionary()
        try:
            torch.autograd.Variable._execution_engine.queue_callback(done)
        except RuntimeError:
            return
        self.swap_backward_queued = True

    def close_frame(self, frame: _Frame, out: Any) -> None:
        frame.closed()
        if frame in self.open_frames:
            del self.open_frames[self.open_frames.index(frame):]
        elif frame in self.retired:
            self.retired.remove(frame)
        self.closed_frames.append(weakref.ref(frame))
        frame.release_swapped_inputs()
        frame.release_cat_inputs()
        for k, o in enumerate(_flat_tensors(out)):
            path = self.producer_of(o)
            found = frame.spec.dropping(path)
            if found is not None and not _is_leaf(o) and \
                    self.refined(o, path) in (None, "RECOMPUTE"):
                self.frame_outputs.setdefault(_storage_key(o), []).append(
                    (_Ident(o), frame, k, o._version, found[0], found[1],
                     weakref.ref(o), *_extent(o), o.storage_offset(),
                     o.dtype, o.device))
                frame.outputs_dropped = True
        self.learn_retire(frame)


def _wrap_forward(module: nn.Module,
                  make: Callable[[Callable[..., Any]], Callable[..., Any]],
                  undo: List[Callable[[], None]]) -> None:
    """Replaces `module.forward` by `make(module.forward)` on the instance,
    and appends to `undo` what puts back the forward it had (an instance
    attribute of its own, or none: the class's)."""
    had = "forward" in module.__dict__
    previous = module.__dict__.get("forward")
    module.forward = make(module.forward)  # type: ignore[assignment]

    def restore() -> None:
        if had:
            module.forward = previous  # type: ignore[assignment]
        else:
            del module.forward

    undo.append(restore)


def _describe(d: Decision) -> str:
    return (f"{d.action} {d.module_path or '(model)'} {d.op_kind or '?'} "
            f"({format_bytes(d.size_bytes)})")


class _StatsAccessor:
    """`Applied.stats`: a method, as `report()` and `measurements()` are
    (`applied.stats()`). Reading a field without the call
    (`applied.stats.dropped`, the earlier property) still works, with a
    DeprecationWarning."""

    def __init__(self, runtime: "_Runtime"):
        self._runtime = runtime

    def __call__(self) -> ApplyStats:
        return self._runtime.stats

    def __getattr__(self, name: str) -> Any:
        warnings.warn("Applied.stats is a method, as report() and "
                      "measurements() are: call applied.stats()",
                      DeprecationWarning, stacklevel=2)
        return getattr(self._runtime.stats, name)


class StepCheck:
    """Whether a forward with gradients is the step the schedule was
    planned for (its recorded inputs at its batch size): the schedule's
    budget and decisions were priced for that step only. Called before
    anything of the forward runs, by mutwo.apply's wrapper and by
    mode="compile"'s: raises ScheduleMismatchError naming the input and
    both shapes, or with strict=False warns once (BudgetWarning) and counts
    the calls for `report_name` (the handle's report())."""

    def __init__(self, planned_inputs: PlannedInputs, strict: bool,
                 report_name: str) -> None:
        self.planned_inputs = planned_inputs
        self.strict = strict
        self.report_name = report_name
        # strict=False: forwards whose inputs were not the planned step's.
        self.mismatched_calls = 0
        self.first_mismatch = ""

    def __call__(self, args: Tuple[Any, ...],
                 kwargs: Dict[str, Any]) -> None:
        why = self.planned_inputs.mismatch(args, kwargs)
        if why is None:
            return
        if self.strict:
            raise ScheduleMismatchError(
                "mutwo.apply: this forward is not the step the schedule was "
                "planned for: " + why + ". Nothing was run; pass "
                "strict=False to train anyway (a BudgetWarning says so "
                f"once, {self.report_name} counts the calls)")
        if not self.mismatched_calls:
            self.first_mismatch = why
            warnings.warn("mutwo.apply (strict=False): this forward is not "
                          "the step the schedule was planned for: " + why,
                          BudgetWarning, stacklevel=3)
        self.mismatched_calls += 1

    def report_lines(self) -> List[str]:
        if not self.mismatched_calls:
            return []
        return [f"  not the planned step: {self.mismatched_calls} "
                "forward(s) with other inputs than the schedule was planned "
                f"for (first: {self.first_mismatch})"]


class Applied:
    """A schedule applied to a model; `remove()` takes it off again.

    What it did and found, each a method: `stats()` counts what the hooks
    did; `report()` says which decisions were applied and which matched no
    saved tensor; `measurements()` what the first step under the schedule
    measured; `unmatched()` the decisions no saved tensor matched.
    """

    def __init__(self, model: nn.Module, schedule: Schedule,
                 runtime: _Runtime, notes: List[str],
                 undo: List[Callable[[], None]], strict: bool,
                 canonical: Dict[str, str], planned_inputs: PlannedInputs):
        self.model = model
        self.schedule = schedule
        self.notes = notes
        self.strict = strict
        self._runtime = runtime
        self._undo = undo
        self._canonical = canonical
        self._measurements: Optional[ApplyMeasurements] = None
        self._checked = False
        # CUDA devices whose peak statistics the first step reset: read at
        # the next forward with gradients after its backward (the whole
        # step, optimizer included).
        self._peak_devices: List[torch.device] = []
        self._step_check = StepCheck(planned_inputs, strict,
                                     "Applied.report()")

    @property
    def stats(self) -> _StatsAccessor:
        """Call it: `applied.stats()` is the ApplyStats so far."""
        return _StatsAccessor(self._runtime)

    @property
    def frames(self) -> List[str]:
        """Where replays run: module paths or Sequential child ranges."""
        return [f.label() for f in self._runtime.frames]

    def reset_stats(self) -> None:
        self._runtime.stats = ApplyStats()

    def _unmatched(self, dropped: Set[str],
                   swapped: Set[str]) -> List[Decision]:
        out = []
        for d in self.schedule.decisions:
            path = self._canonical.get(d.module_path, d.module_path)
            if d.action == "RECOMPUTE" and path not in dropped:
                out.append(d)
            # A swapped module's tensors dropped for a replay are not held
            # either: the decision's memory is gone as planned.
            elif d.action == "SWAP" and path not in swapped | dropped:
                out.append(d)
        return out

    def unmatched(self) -> List[Decision]:
        """Non-RETAIN decisions whose module saved no tensor that the hooks
        dropped or swapped (after at least one training step)."""
        s = self.stats()
        return self._unmatched(s.dropped_paths, s.swapped_paths)

    def measurements(self) -> Optional[ApplyMeasurements]:
        """What the first training step under the schedule measured (None
        before a forward with gradients ran)."""
        return self._measurements

    def report(self) -> str:
        s = self.stats()
        lines = [f"mutwo.apply: {len(self.schedule.recomputed)} recompute and "
                 f"{len(self.schedule.swapped)} swap decisions; replays in "
                 f"{', '.join(self.frames) or 'no frame'}",
                 f"  last steps: {s.dropped} saved tensors dropped, "
                 f"{s.swapped_out} swapped out ({s.swapped_out_bytes} B), "
                 f"{s.swapped_in} back, {sum(s.replays.values())} replays"]
        m = self._measurements
        if m is not None:
            line = (f"  first step: saved tensors held at the end of forward "
                    f"{format_bytes(m.saved_bytes)} (without the schedule "
                    f"{format_bytes(m.unmodified_saved_bytes)}): saving "
                    f"{format_bytes(m.saving_bytes)}, planned "
                    f"{format_bytes(m.planned_saving_bytes)}")
            if m.frame_input_bytes:
                line += (f"; held only as frames' inputs for their replays "
                         f"{format_bytes(m.frame_input_bytes)}")
            if m.peak_bytes is not None:
                line += (f"; peak {format_bytes(m.peak_bytes)}, budget "
                         f"{format_bytes(m.budget_bytes)}")
            if m.step_peak_bytes is not None:
                line += (f"; with what ran until the next forward (the "
                         f"optimizer step) {format_bytes(m.step_peak_bytes)}")
            lines.append(line)
        lines += [f"  note: {n}" for n in self.notes]
        lines += self._step_check.report_lines()
        for d in self.unmatched():
            lines.append(f"  not applied: {d.action} {d.module_path or '(model)'}"
                         f" {d.op_kind}: no saved tensor of that module was "
                         "seen")
        return "\n".join(lines)

    # Called by the model's forward wrapper at the end of every forward
    # under the hooks; checks and measures the first one.
    def _forward_done(self, out: Any, started: float,
                      peak_reset: bool) -> None:
        if self._checked:
            return
        self._checked = True
        rt = self._runtime
        record = rt.record
        unmatched = self._unmatched(record.dropped_paths,
                                    record.swapped_paths)
        planned = sum(d.size_bytes for d in self.schedule.decisions
                      if d.action in ("RECOMPUTE", "SWAP"))
        if unmatched:
            lost = sum(d.size_bytes for d in unmatched)
            shown = "; ".join(_describe(d) for d in unmatched)
            decided = (len(self.schedule.recomputed) +
                       len(self.schedule.swapped))
            text = (f"{len(unmatched)} of the schedule's {decided}"
                    f" recompute/swap decisions matched no tensor autograd "
                    f"saved in this model's forward: {format_bytes(lost)} of "
                    f"the {format_bytes(planned)} planned saving would stay "
                    f"in memory: {shown}")
            if self.strict:
                raise ScheduleMismatchError(
                    "mutwo.apply: " + text + ". Nothing was trained; the "
                    "model's forward differs from the TorchScript that was "
                    "planned (control flow, another input?). Plan again "
                    "for this model, or pass strict=False to train with "
                    "the decisions that apply (Applied.report() lists "
                    "them)", unmatched)
            warnings.warn("mutwo.apply (strict=False): " + text,
                          BudgetWarning, stacklevel=3)
        device = "cpu"
        tensors = _flat_tensors(out)
        if tensors:
            device = str(tensors[0].device)
        s = self.schedule
        held, frame_inputs = record.held_bytes(rt.closed_frames)
        m = ApplyMeasurements(
            device=device,
            saved_bytes=held,
            frame_input_bytes=frame_inputs,
            unmodified_saved_bytes=record.saved_bytes,
            planned_saving_bytes=planned,
            swapped_bytes=record.swapped_bytes,
            forward_seconds=time.perf_counter() - started,
            budget_bytes=s.budget_bytes,
            predicted_peak_bytes=s.predicted_peak_bytes,
            baseline_peak_bytes=s.baseline_peak_bytes)
        self._measurements = m
        fraction = m.saving_fraction
        cuda = device.startswith("cuda")
        if not cuda and fraction is not None and fraction < _SAVING_BAR:
            frames = (f" ({format_bytes(m.frame_input_bytes)} of it held "
                      f"only as frames' inputs for their replays)"
                      if m.frame_input_bytes else "")
            warnings.warn(
                f"mutwo.apply: the first step held "
                f"{format_bytes(m.saved_bytes)} of saved tensors at the end "
                f"of forward{frames} against "
                f"{format_bytes(m.unmodified_saved_bytes)}"
                f" without the schedule: a saving of "
                f"{format_bytes(m.saving_bytes)}, {fraction:.0%} of the "
                f"{format_bytes(planned)} planned; the budget "
                f"{format_bytes(s.budget_bytes)} may not hold",
                BudgetWarning, stacklevel=3)

        def backward_done() -> None:
            if cuda:
                torch.cuda.synchronize()
            m.step_seconds = time.perf_counter() - started
            if not cuda:
                return
            if peak_reset:
                m.peak_bytes = int(torch.cuda.max_memory_allocated())
            if m.peak_bytes is not None and m.budget_bytes > 0 and \
                    m.peak_bytes > m.budget_bytes:
                warnings.warn(peak_over_budget_text(
                    "mutwo.apply", "first step", m.peak_bytes,
                    m.budget_bytes, m.predicted_peak_bytes), BudgetWarning)

        queued = [False]

        def on_grad(grad: torch.Tensor) -> torch.Tensor:
            if not queued[0]:
                queued[0] = True
                torch.autograd.Variable._execution_engine.queue_callback(
                    backward_done)
            return grad

        for t in tensors:
            if t.requires_grad:
                t.register_hook(on_grad)

    # Called by the forward wrapper at each forward with gradients after
    # the first; reads the first step's whole peak once its backward ran.
    def _next_forward(self) -> None:
        m = self._measurements
        if not self._peak_devices or m is None or m.step_seconds is None:
            return
        devices, self._peak_devices = self._peak_devices, []
        for d in devices:
            torch.cuda.synchronize(d)
        read = max(int(torch.cuda.max_memory_allocated(d)) for d in devices)
        if m.peak_bytes is not None and read < m.peak_bytes:
            # Below the peak read at the end of backward: someone reset
            # the statistics in between (verify does before its timed
            # steps); what ran after backward was not all seen.
            self.notes.append(
                "the first step's peak through the optimizer step was not "
                "measured: the CUDA peak statistics were reset before the "
                "next forward (torch.cuda.reset_peak_memory_stats)")
            return
        m.step_peak_bytes = read
        if m.budget_bytes > 0 and m.step_peak_bytes > m.budget_bytes and \
                m.peak_bytes is not None and m.peak_bytes <= m.budget_bytes:
            planned = self.schedule.proto
            warnings.warn(optimizer_peak_text(
                "mutwo.apply", "first step", m.step_peak_bytes, m.peak_bytes,
                m.budget_bytes, planned is not None and
                planned.optimizer.foreach_update), BudgetWarning, stacklevel=4)

    def remove(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        self._runtime.host_pool.clear()

    def __enter__(self) -> "Applied":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


# Below this share of the planned saving the first step warns (CPU).
_SAVING_BAR = 0.9


def _common_prefix(paths: Iterable[str]) -> str:
    parts: Optional[List[str]] = None
    for p in paths:
        q = p.split(".") if p else []
        if parts is None:
            parts = q
            continue
        k = 0
        while k < len(parts) and k < len(q) and parts[k] == q[k]:
            k += 1
        parts = parts[:k]
    return ".".join(parts or [])


def _all_modules(model: nn.Module) -> Dict[str, nn.Module]:
    """Every module path, a shared module's each path included (the
    TorchScript scope of a call names the attribute it was called through:
    `enc.b` for a module that is also `enc.a`)."""
    return dict(model.named_modules(remove_duplicate=False))


def _canonical_paths(model: nn.Module) -> Dict[str, str]:
    """Every module path (a shared module's each path) -> the path
    named_modules() gives that module (its first)."""
    path_of = {id(m): p for p, m in model.named_modules()}
    return {p: path_of[id(m)] for p, m in _all_modules(model).items()}


def _hooked_modules(model: nn.Module, schedule: Schedule,
                    specs: Sequence[_FrameSpec]) -> List[nn.Module]:
    """The modules that need the attribution hooks: those with a RECOMPUTE
    or SWAP decision, their ancestors (frames are ancestors too), the
    children of all of these, and where there are frames, modules with
    buffers other than plain batch norms; a schedule's every other module
    runs without hooks (two Python calls per module call were most of apply's
    host cost on a step with decisions).

    Why attribution stays the same: an unhooked module lies inside a
    hooked child of a decision's module or ancestor, one with no decision
    in it or below it. That boundary module's forward hook claims what it
    returns, and a tensor made and saved inside it is the innermost hooked
    module's, the boundary's own: before, the module inside it that made
    the tensor, equally without a decision. So each saved tensor is
    credited to a path with the same decision (or none) as with a hook on
    every module. Children of ancestors keep their hooks so that a replay
    still skips a sibling call whose outputs are held, and a Sequential
    range frame's first and last child still bound it."""
    modules = _all_modules(model)
    inner: Set[str] = {""}
    canonical = _canonical_paths(model)
    paths = [d.module_path for d in schedule.recomputed + schedule.swapped]
    # A shared module's ancestors at each of its paths.
    paths += [canonical[p] for p in paths]
    paths += [spec.path for spec in specs]
    for path in paths:
        parts = path.split(".") if path else []
        for k in range(1, len(parts) + 1):
            inner.add(".".join(parts[:k]))
    hooked: Dict[int, nn.Module] = {}
    for path in inner:
        module = modules.get(path)
        if module is None:
            continue
        hooked[id(module)] = module
        for child in module.children():
            hooked[id(child)] = child
    # A replay guards the buffers of each module it runs (_BufferGuard).
    # Unhooked plain batch norms are guarded from its start at no cost
    # (momentum 0); any other module with buffers keeps its hooks, so its
    # buffers are copied only when a replay reaches it, as before (copied
    # at every replay's start, a frame of the whole model would copy them
    # all, e.g. every attention mask).
    for m in modules.values() if specs else ():
        if id(m) not in hooked and type(m) not in _PLAIN_BATCH_NORMS and \
                any(b is not None for b in m._buffers.values()):
            hooked[id(m)] = m
    return list(hooked.values())


def _check(model: nn.Module, schedule: Schedule) -> None:
    modules = _all_modules(model)
    if not schedule.decisions:
        return
    if all(not d.op_kind for d in schedule.decisions):
        raise ScheduleMismatchError(
            "this schedule names no module paths (planned before mutwo "
            "recorded them); plan it again with the current server")
    missing = sorted({d.module_path for d in schedule.decisions
                      if d.module_path not in modules} |
                     {p for d in schedule.decisions
                      for p in d.recompute_module_paths if p not in modules})
    named = {d.module_path for d in schedule.decisions} | {
        p for d in schedule.decisions for p in d.recompute_module_paths}
    if missing:
        shown = ", ".join(repr(p) for p in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ScheduleMismatchError(
            f"the schedule was planned for another model: {len(missing)} of "
            f"the {len(named)} module paths it names are not in this "
            f"{type(model).__name__}: {shown}{more} (model "
            f"sha256 {schedule.model_sha256[:12]}, fingerprint "
            f"{schedule.graph_fingerprint[:12]}); get a schedule for this "
            "model")
    for d in schedule.decisions:
        m = modules[d.module_path]
        for cls, kinds in _KINDS_OF_TYPE:
            if isinstance(m, cls) and d.op_kind not in kinds:
                raise ScheduleMismatchError(
                    f"the schedule was planned for another model: it says "
                    f"{d.module_path!r} produces {d.op_kind}, but here it is "
                    f"a {type(m).__name__} (expects {', '.join(kinds)})")


# Ops whose activation is everything saved inside them (their blocks).
_CONTROL_FLOW = ("prim::If", "prim::Loop")


def _frame_specs(model: nn.Module, schedule: Schedule,
                 canonical: Dict[str, str],
                 notes: List[str]) -> List[_FrameSpec]:
    modules = dict(model.named_modules())
    segments: Dict[int, List[Decision]] = {}
    for d in schedule.recomputed:
        segments.setdefault(d.segment, []).append(
            dataclasses.replace(
                d, module_path=canonical[d.module_path],
                recompute_module_paths=tuple(
                    canonical[p] for p in d.recompute_module_paths)))
    specs: List[_FrameSpec] = []
    for segment, members in sorted(segments.items()):
        paths = [d.module_path for d in members]
        for d in members:
            paths += list(d.recompute_module_paths)
        root = _common_prefix(paths)
        # A ModuleList or ModuleDict is never called: its parent's forward
        # runs the elements (nn.TransformerEncoder's `layers`).
        while root and isinstance(modules[root], (nn.ModuleList,
                                                  nn.ModuleDict)):
            root = root.rsplit(".", 1)[0] if "." in root else ""
        drop = {d.module_path: segment for d in members
                if d.op_kind not in _CONTROL_FLOW}
        subtree = {d.module_path: segment for d in members
                   if d.op_kind in _CONTROL_FLOW}
        module = modules[root]
        children: Optional[Tuple[int, int]] = None
        if isinstance(module, nn.Sequential):
            names = [n for n, _ in module.named_children()]
            prefix = root + "." if root else ""
            heads = {p[len(prefix):].split(".", 1)[0] for p in paths
                     if p.startswith(prefix) and p != root}
            if heads and all(p != root for p in paths) and heads <= set(names):
                idx = sorted(names.index(h) for h in heads)
                first = idx[0]
                # A range must not start with an in-place op on its input
                # (ReLU(inplace=True)): the replay needs the input unchanged.
                while first > 0 and getattr(module[first], "inplace", False):
                    first -= 1
                children = (first, idx[-1])
        specs.append(_FrameSpec(root, children, drop, subtree))
    # Frames nest as modules do (an outer frame's replay stops early, after
    # its segment's tensors). Frames of one module join: a module frame
    # takes over child ranges of the same Sequential; overlapping ranges
    # become their union.
    merged: List[_FrameSpec] = []
    for spec in specs:
        for other in merged:
            if other.path != spec.path:
                continue
            a, b = other.children, spec.children
            if a is not None and b is not None and (b[1] < a[0] or
                                                    b[0] > a[1]):
                continue  # disjoint ranges of one Sequential
            other.children = (None if a is None or b is None else
                              (min(a[0], b[0]), max(a[1], b[1])))
            for path, seg in spec.drop.items():
                other.drop[path] = min(seg, other.drop.get(path, seg))
            for path, seg in spec.subtree.items():
                other.subtree[path] = min(seg, other.subtree.get(path, seg))
            break
        else:
            merged.append(spec)
    order = {path: k for k, path in enumerate(modules)}
    merged.sort(key=lambda s: (order[s.path], s.children or (-1, -1)))
    for spec in merged:
        if spec.children is None and spec.path == "" and len(modules) > 1:
            notes.append("recompute segments span the model's top-level "
                         "forward: their replays re-run the model's forward "
                         "from its start up to the segment (more compute "
                         "than planned for a segment far from the start)")
    return merged


_STRENGTH = {"RETAIN": 0, "SWAP": 1, "RECOMPUTE": 2}


def _op_decisions(schedule: Schedule, canonical: Dict[str, str]
                  ) -> Iterator[Tuple[str, Decision]]:
    """(canonical module path, decision) of the decisions on ops (not a
    control-flow block's) with an action apply knows."""
    for d in schedule.decisions:
        if d.op_kind not in _CONTROL_FLOW and d.action in _STRENGTH:
            yield canonical.get(d.module_path, d.module_path), d


def _op_actions(schedule: Schedule,
                canonical: Dict[str, str]) -> Dict[str, Dict[str, str]]:
    """Per module path whose decisions differ in action: op kind ->
    strongest action of the decisions on that kind."""
    by_path: Dict[str, List[Decision]] = {}
    for path, d in _op_decisions(schedule, canonical):
        by_path.setdefault(path, []).append(d)
    out: Dict[str, Dict[str, str]] = {}
    for path, decisions in by_path.items():
        if len({d.action for d in decisions}) < 2:
            continue
        kinds: Dict[str, str] = {}
        for d in decisions:
            k = _normal_kind(d.op_kind)
            if _STRENGTH[d.action] > _STRENGTH[kinds.get(k, "RETAIN")]:
                kinds[k] = d.action
            kinds.setdefault(k, d.action)
        out[path] = kinds
    return out


def _op_sequences(schedule: Schedule, canonical: Dict[str, str]
                  ) -> Dict[Tuple[str, str], List[Dict[int, Tuple[str, int]]]]:
    """Per (module path, op kind) whose decisions differ in action or
    segment (a MoE layer's own forward: per expert an index_select and a
    mul, one swapped, one retained, the others each its own segment), the
    decisions per op in node order: output index -> (action, segment)."""
    by_key: Dict[Tuple[str, str], List[Decision]] = {}
    for path, d in _op_decisions(schedule, canonical):
        by_key.setdefault((path, _normal_kind(d.op_kind)), []).append(d)
    out: Dict[Tuple[str, str], List[Dict[int, Tuple[str, int]]]] = {}
    for key, decisions in by_key.items():
        if len({(d.action, d.segment if d.action == "RECOMPUTE" else 0)
                for d in decisions}) < 2:
            continue
        nodes: Dict[int, Dict[int, Tuple[str, int]]] = {}
        for d in sorted(decisions, key=lambda d: d.producer_node):
            nodes.setdefault(d.producer_node, {})[max(d.output_index, 0)] = \
                (d.action, d.segment)
        out[key] = list(nodes.values())
    return out


def _refuse_infeasible(schedule: Schedule) -> None:
    figures = []
    if schedule.budget_bytes:
        figures.append(f"budget {schedule.budget or ''}"
                       f"{' = ' if schedule.budget else ''}"
                       f"{format_bytes(schedule.budget_bytes)}")
    if schedule.floor_bytes:
        figures.append(f"floor {format_bytes(schedule.floor_bytes)} (the "
                       "lowest budget this model plans into)")
    if schedule.measured_peak_bytes:
        figures.append(f"measured peak "
                       f"{format_bytes(schedule.measured_peak_bytes)}")
    raise InfeasibleScheduleError(
        "mutwo.apply: the planner marked this schedule infeasible"
        + (f" ({', '.join(figures)})" if figures else "")
        + (f": {schedule.reason}" if schedule.reason else "")
        + "; `mutwo-worker execute` refuses it too. Plan at a budget at "
        "or above the floor, or pass force=True to apply it anyway (the "
        "budget will not hold)")


def peak_over_budget_text(who: str, step: str, peak: int, budget: int,
                          predicted: int) -> str:
    """The BudgetWarning of a CUDA peak over the budget (eager apply's first
    step, compile mode's second)."""
    return (f"{who}: the {step} peaked at {format_bytes(peak)} "
            "(torch.cuda.max_memory_allocated), over the budget "
            f"{format_bytes(budget)} (predicted peak "
            f"{format_bytes(predicted)})")


def optimizer_peak_text(who: str, step: str, peak: int, fwd_bwd: int,
                        budget: int, planned_foreach: bool) -> str:
    """The BudgetWarning of a CUDA step whose peak came after its backward
    (forward and backward within the budget)."""
    text = (f"{who}: the {step} peaked at {format_bytes(peak)} "
            "(torch.cuda.max_memory_allocated) after its backward, over the "
            f"budget {format_bytes(budget)}; its forward and backward peaked "
            f"at {format_bytes(fwd_bwd)}, within it: what ran between the "
            "end of backward and the next forward (the optimizer step) holds "
            "more than the plan")
    if planned_foreach:
        return text
    return text + (
        ". The schedule was planned with the update's temporaries no "
        "larger than the largest parameter; torch.optim's foreach "
        "implementation (its default on CUDA) holds them for all "
        "parameters at once: construct the optimizer with fused=True, or "
        "plan with the optimizer adam:foreach (--optimizer; docs/apply.md)")


def _planned_with_chunked_loss(schedule: Schedule) -> bool:
    """Whether the schedule's loss (or a term of it) is
    chunked_cross_entropy."""
    if schedule.proto is None:
        return False
    loss = schedule.proto.loss
    kind = type(loss).CHUNKED_CROSS_ENTROPY
    return loss.kind == kind or any(t.kind == kind for t in loss.terms)


def apply(model: nn.Module, schedule: Union[Schedule, str, Dict[str, Any]],
          *, strict: bool = True, force: bool = False,
          prefetch_ahead: int = 2, skip_retained: bool = True,
          mode: str = "eager",
          **kwargs: Any) -> Union[Applied, nn.Module]:
    """Applies `schedule` to `model` (the eager nn.Module whose TorchScript
    was planned) for the user's own training loop: call the model as usual,
    then loss.backward() and the optimizer. Returns an Applied handle
    (`remove()` or use it as a context manager to take it off).

    `schedule` is a Schedule or a JSON file/text (`mutwo schedule ...
    --output json`). Every RECOMPUTE and SWAP decision is applied, or
    refused before the first backward:
      - ScheduleMismatchError here for a schedule planned for another
        model (module paths or op kinds differ), and from the first
        forward with gradients if any decision matched no tensor autograd
        saved (the error lists them with their bytes). `strict=False`
        trains with the decisions that apply instead and warns once
        (BudgetWarning) with the figures.
      - InfeasibleScheduleError for a schedule the planner marked
        infeasible, as `mutwo-worker execute` refuses it; `force=True`
        applies it anyway.
    A forward with gradients whose tensor inputs are not the step the
    schedule was planned for (its recorded inputs at its batch size:
    another batch, shape, dtype or input count) raises
    ScheduleMismatchError before it runs, naming the input and both
    shapes, as mutwo::ScheduledStep::Run refuses it; `strict=False` runs
    it and warns once (BudgetWarning). Checked at the first forward and
    whenever the shapes change.
    The first step is measured (`Applied.measurements()`): saved-tensor
    bytes at the end of forward with and without the schedule, and on CUDA
    the peak (peak statistics are reset at its start); a BudgetWarning
    says when it misses the plan.

    `mode="compile"` is for torch.compile (PyTorch >= 2.4): it calls
    `mutwo._compile.apply_compiled(model, schedule, force=force, **kwargs)`
    (kwargs: swaps, recompute, allow_cache_entry_mutation) and returns
    `model` itself, its recompute frames wrapped in selective activation
    checkpointing, to pass to torch.compile; `mutwo._compile.
    compiled_schedule_of(model)` is the handle (`report()`, `unmatched()`,
    `remove()`). SWAP decisions are refused there (UnsupportedScheduleError)
    unless swaps="ignore", and which decisions matched an op is known only
    after the first compiled step (`unmatched()`). A forward's inputs are
    checked against the planned step as in eager mode (same
    ScheduleMismatchError, same strict=False); prefetch_ahead and
    skip_retained are eager-mode options (TypeError).
    Earlier PyTorch raises RuntimeError naming the version.

    Not applied in eager mode: decisions of a TorchScript model (apply
    needs the eager module), of a module already compiled (TypeError; use
    mode="compile" on the module before compiling) or inside another
    saved_tensors_hooks context (the innermost hooks win). DDP wrapping the
    model after apply works as for torch.utils.checkpoint(use_reentrant=
    False).
    """
    if mode == "compile":
        ignored = [name for name, given, default in (
            ("prefetch_ahead", prefetch_ahead, 2),
            ("skip_retained", skip_retained, True)) if given != default]
        if ignored:
            raise TypeError(
                f"mutwo.apply(mode=\"compile\"): {', '.join(ignored)} "
                "apply to mode=\"eager\" only (under torch.compile there "
                "are no saved-tensor hooks: the compiler recomputes what "
                "the policy says)")
        from mutwo import _compile  # type: ignore[attr-defined]
        return _compile.apply_compiled(model, schedule, force=force,
                                       strict=strict, **kwargs)
    if mode != "eager":
        raise ValueError(f"mutwo.apply: mode {mode!r}: expected 'eager' or "
                         "'compile'")
    if kwargs:
        raise TypeError(f"mutwo.apply: unexpected arguments "
                        f"{', '.join(sorted(kwargs))}")
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("mutwo.apply needs the eager nn.Module the "
                        "TorchScript came from, not a ScriptModule")
    if type(model).__name__ == "OptimizedModule" and hasattr(model,
                                                             "_orig_mod"):
        raise TypeError(
            "mutwo.apply needs the eager nn.Module, not the result of "
            "torch.compile: apply the schedule to the module itself (its "
            "module paths are the schedule's), or for torch.compile use "
            "mutwo.apply(model, schedule, mode=\"compile\") before "
            "compiling (docs/apply.md)")
    if not isinstance(schedule, Schedule):
        schedule = Schedule.from_json(schedule)
    _check(model, schedule)
    notes: List[str] = []
    if not schedule.feasible:
        if not force:
            _refuse_infeasible(schedule)
        notes.append("the planner marked this schedule infeasible "
                     "(applied with force=True)" +
                     (f": {schedule.reason}" if schedule.reason else ""))
    modules = dict(model.named_modules())
    path_of = {id(m): p for p, m in modules.items()}
    # A shared module's paths all name the first (named_modules()) path.
    canonical = _canonical_paths(model)
    specs = _frame_specs(model, schedule, canonical, notes)
    recomputed = {canonical[d.module_path] for d in schedule.recomputed}
    swap = {canonical[d.module_path] for d in schedule.swapped} - recomputed
    rt = _Runtime(model, specs, swap, prefetch_ahead)
    rt.op_actions = _op_actions(schedule, canonical)
    rt.op_sequences = _op_sequences(schedule, canonical)
    rt.notes = notes
    undo: List[Callable[[], None]] = []

    # Module stack and producers: every hooked module, while it runs. A
    # module's inputs that no module claimed were made by the module
    # calling it (a functional op in its forward, as the TorchScript scope
    # says: a block's residual add saved by the next LayerNorm is the
    # block's). One pair of hooks per module, its path bound in: no
    # lookup by id per call.
    def hooks_for(path: str, is_model: bool
                  ) -> Tuple[Callable[..., None], Callable[..., None]]:
        stack = rt.stack
        produced = rt.produced

        def pre_hook(m: nn.Module, args: Any) -> None:
            mode = rt.mode
            if mode == "forward":
                if stack:
                    caller = stack[-1]
                    # Most calls take one tensor: no flattened list.
                    if len(args) == 1 and isinstance(args[0], torch.Tensor):
                        produced(args[0], caller)
                    else:
                        for t in _flat_tensors(args):
                            produced(t, caller)
                if not is_model:
                    rt.call_started(inputs=args, module=m)
                    rt.region_started(path)
            elif mode == "replay" and rt.replays:
                rt.replays[-1].started(m)
            stack.append(path)

        def post_hook(m: nn.Module, _: Any, out: Any) -> None:
            own = stack.pop() if stack else path
            mode = rt.mode
            if mode == "forward":
                if isinstance(out, torch.Tensor):
                    produced(out, own)
                else:
                    for t in _flat_tensors(out):
                        produced(t, own)
                if not is_model:
                    rt.call_ended(out)
                    rt.region_ended()
            elif mode == "replay" and rt.replays:
                rt.replays[-1].ended(out)
        return pre_hook, post_hook

    # No RECOMPUTE or SWAP decision: nothing to attribute, no hook (each
    # module call paid two Python hooks for nothing). With decisions, only
    # the modules on the way to one (_hooked_modules).
    hooked = _hooked_modules(model, schedule, specs) if rt.active else []
    hooked_ids = {id(m) for m in hooked}
    for m in hooked:
        pre_hook, post_hook = hooks_for(path_of.get(id(m), ""), m is model)
        h1 = m.register_forward_pre_hook(pre_hook)
        h2 = m.register_forward_hook(post_hook)
        undo += [h1.remove, h2.remove]
    for spec in specs:
        roots = ([modules[spec.path]] if spec.children is None else
                 list(modules[spec.path].children())[
                     spec.children[0]:spec.children[1] + 1])
        seen: Set[int] = set()
        for root in roots:
            for m in root.modules():
                if id(m) not in hooked_ids and id(m) not in seen and \
                        any(b is not None for b in m._buffers.values()):
                    seen.add(id(m))
                    spec.unhooked_buffers.append(m)

    def wrap_forward(m: nn.Module,
                     make: Callable[[Callable[..., Any]], Callable[..., Any]]
                     ) -> None:
        _wrap_forward(m, make, undo)

    def frame_wrapper(spec: _FrameSpec, module: nn.Module
                      ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(forward: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(forward)
            def run(*args: Any, **kwargs: Any) -> Any:
                if rt.mode != "forward":
                    return forward(*args, **kwargs)
                frame = _Frame(rt, spec, forward, args, kwargs, [module])
                rt.open_frames.append(frame)
                out = None
                try:
                    out = forward(*args, **kwargs)
                finally:
                    rt.close_frame(frame, out)
                return out
            return run
        return make

    root_spec = None
    for spec in specs:
        module = modules[spec.path]
        if spec.children is None:
            if spec.path == "":
                root_spec = spec
            else:
                wrap_forward(module, frame_wrapper(spec, module))
            continue
        children = list(module.children())
        first, last = spec.children
        span = children[first:last + 1]

        def open_hook(m: nn.Module, args: Any, spec: _FrameSpec = spec,
                      span: List[nn.Module] = span) -> None:
            if rt.mode != "forward":
                return

            def run(*x: Any) -> Any:
                for c in span:
                    x = c(*x) if isinstance(x, tuple) else c(x)
                return x

            frame = _Frame(rt, spec, run, args, {}, span)
            rt.open_frames.append(frame)
            rt.call_started(first_of=frame)

        def close_hook(m: nn.Module, _: Any, out: Any,
                       spec: _FrameSpec = spec) -> None:
            if rt.mode != "forward":
                return
            for frame in itertools.chain(reversed(rt.open_frames),
                                         reversed(rt.retired)):
                if frame.spec is spec:
                    rt.close_frame(frame, out)
                    break

        h1 = span[0].register_forward_pre_hook(open_hook)
        h2 = span[-1].register_forward_hook(close_hook)
        undo += [h1.remove, h2.remove]

    handle: List[Applied] = []

    def top_wrapper(forward: Callable[..., Any]) -> Callable[..., Any]:
        inner = (frame_wrapper(root_spec, model)(forward)
                 if root_spec is not None else forward)

        @functools.wraps(forward)
        def run(*args: Any, **kwargs: Any) -> Any:
            if rt.mode != "off" or not torch.is_grad_enabled():
                return inner(*args, **kwargs)
            applied = handle[0]
            applied._step_check(args, kwargs)
            first = not applied._checked
            peak_reset = False
            if first:
                devices = {t.device for t in _flat_tensors((args, kwargs))
                           if t.is_cuda}
                param = next(model.parameters(), None)
                if param is not None and param.is_cuda:
                    devices.add(param.device)
                for d in devices:
                    torch.cuda.synchronize(d)
                    torch.cuda.reset_peak_memory_stats(d)
                    peak_reset = True
                applied._peak_devices = sorted(devices, key=str)
            elif applied._peak_devices:
                applied._next_forward()
            started = time.perf_counter()
            rt.recording = first
            rt.begin_forward((args, kwargs))
            rt.mode = "forward"
            rt.stack.append(path_of.get(id(model), ""))
            try:
                rt.forward_kind = "plain"
                if not rt.active:
                    # Nothing to drop or swap: the hook only measures the
                    # first forward's saved bytes; later ones run without.
                    with (torch.autograd.graph.saved_tensors_hooks(
                            rt.pack_plain, rt.unpack) if first
                          else _NO_CONTEXT):
                        out = inner(*args, **kwargs)
                elif rt.regions is None or \
                        rt.regions_training != model.training:
                    rt.learn_regions(model.training)
                    rt.forward_kind = "learn"
                    with torch.autograd.graph.saved_tensors_hooks(
                            rt.pack_learning, rt.unpack):
                        out = inner(*args, **kwargs)
                    rt.learned()  # a whole forward ran
                else:
                    rt.forward_kind = "sparse"
                    if _MODEL_REGION in rt.regions:  # its own code saves
                        rt.hooks_on.__enter__()
                        rt.pushed = _MODEL_REGION
                    out = inner(*args, **kwargs)
            finally:
                rt.hooks_off()
                rt.mode = "off"
                rt.open_frames = []
                rt.stack.clear()
            if first:
                applied._forward_done(out, started, peak_reset)
            rt.end_forward()
            return out
        return run

    # Replays skip module calls whose outputs are still held (outermost
    # wrapper: a frame's own forward, which its replay calls, stays whole).
    def skip_wrapper(m: nn.Module
                     ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(forward: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(forward)
            def run(*args: Any, **kwargs: Any) -> Any:
                if rt.mode == "replay" and rt.replays:
                    out = rt.replays[-1].skip(
                        m, lambda: forward(*args, **kwargs))
                    if out is not _NOT_HELD:
                        return out
                return forward(*args, **kwargs)
            return run
        return make

    rt.skip_retained = skip_retained
    if skip_retained and specs:
        # Only hooked calls are recorded in forward and counted in a
        # replay: an unhooked one runs inside its hooked parent.
        for m in hooked:
            if m is not model:
                wrap_forward(m, skip_wrapper(m))
    planned_inputs = PlannedInputs(
        schedule.proto.inputs if schedule.proto is not None else (),
        schedule.batch_size, model.forward)
    if _planned_with_chunked_loss(schedule):
        notes.append("the schedule was planned with the loss "
                     "chunked_cross_entropy: compute it in your loop with "
                     "mutwo.chunked_cross_entropy(logits, target, "
                     "reuse_logits=True), or the step holds one to two "
                     "logits-sized tensors more than the plan "
                     "(docs/loss.md)")
    if not planned_inputs.recorded:
        notes.append("the schedule records no inputs (planned before "
                     "schedules recorded their step): forward's inputs are "
                     f"not checked against its batch {schedule.batch_size}")
    wrap_forward(model, top_wrapper)
    applied = Applied(model, schedule, rt, notes, undo, strict, canonical,
                      planned_inputs)
    handle.append(applied)
    return applied
