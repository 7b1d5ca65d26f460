"""The step a schedule was planned for, against the inputs of a call.

A schedule records the inputs of the step it was planned for (the
profile's `--input` specs, `Schedule.proto.inputs`) at its batch size. Its
budget, its decisions and their bytes were priced for that step: at
another batch, shape or dtype they say nothing. `mutwo.apply` compares a
forward's tensor inputs with them, as `mutwo::ScheduledStep::Run` does in
C++ (worker/scheduled_step.cc), and refuses another step with a message
naming the input and both shapes.

The call's arguments are matched to the specs as the worker matches them
(common/forward_binding.h): by name when any spec names one of forward's
parameters, else by position. Only tensors are inputs: None is an argument
left out, and other non-tensor arguments (flags, sizes) are not compared,
since a spec describes a tensor.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from mutwo._specs import _DTYPES, BATCH_DIM

_SPEC_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
_TORCH_DTYPE_NAMES = {
    torch.float32: "float32", torch.float64: "float64",
    torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int64", torch.int32: "int32", torch.int8: "int8",
    torch.uint8: "uint8", torch.bool: "bool",
}

_MISSING = object()


def _dims_text(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _spec_text(spec: Any) -> str:
    """As --input takes it: x:float32[B,3,224,224]."""
    dims = ",".join("B" if d == BATCH_DIM else str(d) for d in spec.dims)
    return (f"{spec.name}:{_SPEC_DTYPE_NAMES.get(spec.dtype, '?')}"
            f"[{dims}]")


def _tensor_text(t: torch.Tensor) -> str:
    dtype = _TORCH_DTYPE_NAMES.get(t.dtype,
                                   str(t.dtype).replace("torch.", ""))
    return dtype + _dims_text(t.shape)


def _shape_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape))
    return type(value)


class PlannedInputs:
    """The schedule's recorded inputs at its batch size, checked against
    the calls of `forward` (the model's own, before apply wrapped it).

    `mismatch(args, kwargs)` is None when the call makes the planned step,
    else the reason, naming the input and both shapes. The last call's
    shapes are remembered, so a loop of equal batches binds its arguments
    once. Not thread-safe (one model's forwards run on one thread)."""

    def __init__(self, specs: Sequence[Any], batch_size: int,
                 forward: Callable[..., Any]) -> None:
        self.specs = list(specs)
        self.batch_size = batch_size
        try:
            self._signature: Optional[inspect.Signature] = \
                inspect.signature(forward)
        except (TypeError, ValueError):
            self._signature = None
        self._last_key: Any = None
        self._last_result: Optional[str] = None

    @property
    def recorded(self) -> bool:
        return bool(self.specs)

    def planned_text(self) -> str:
        return " ".join(_spec_text(s) for s in self.specs)

    def mismatch(self, args: Tuple[Any, ...],
                 kwargs: Dict[str, Any]) -> Optional[str]:
        if not self.specs:
            return None
        key = (tuple(_shape_key(a) for a in args),
               tuple(sorted((k, _shape_key(v)) for k, v in kwargs.items())))
        if key != self._last_key:
            self._last_result = self._check(args, kwargs)
            self._last_key = key
        return self._last_result

    # forward's parameters in order, each with the value the call gives it
    # (_MISSING when left out); *args expanded to one slot per element.
    def _slots(self, args: Tuple[Any, ...],
               kwargs: Dict[str, Any]) -> Optional[List[Tuple[str, Any]]]:
        if self._signature is None:
            return ([(f"argument {i}", a) for i, a in enumerate(args)] +
                    list(kwargs.items()))
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError:
            return None  # forward raises its own error for this call
        slots: List[Tuple[str, Any]] = []
        for name, p in self._signature.parameters.items():
            value = bound.arguments.get(name, _MISSING)
            if p.kind == inspect.Parameter.VAR_POSITIONAL:
                slots += [(f"{name}[{i}]", v)
                          for i, v in enumerate(() if value is _MISSING
                                                else value)]
            elif p.kind == inspect.Parameter.VAR_KEYWORD:
                slots += list(({} if value is _MISSING else value).items())
            else:
                slots.append((name, value))
        return slots

    def _check(self, args: Tuple[Any, ...],
               kwargs: Dict[str, Any]) -> Optional[str]:
        slots = self._slots(args, kwargs)
        if slots is None:
            return None
        names = [name for name, _ in slots]
        by_name = any(s.name in names for s in self.specs)
        # The slot each spec binds to (-1: a spec naming no argument).
        slot_of = [names.index(s.name) if s.name in names else -1
                   for s in self.specs] if by_name else \
            [i if i < len(slots) else -1 for i in range(len(self.specs))]

        def given(value: Any) -> bool:
            return value is not _MISSING and value is not None

        tensors = [name for name, v in slots if isinstance(v, torch.Tensor)]
        bound = {k for k in slot_of if k >= 0}
        unplanned = [names[k] for k, (_, v) in enumerate(slots)
                     if isinstance(v, torch.Tensor) and k not in bound]
        missing = [s for s, k in zip(self.specs, slot_of)
                   if k < 0 or not given(slots[k][1])]
        if unplanned or missing:
            what = []
            if unplanned:
                what.append("not planned: " + ", ".join(unplanned))
            if missing:
                what.append("not given: " + ", ".join(s.name
                                                      for s in missing))
            return (f"{len(tensors)} tensor inputs given "
                    f"({'; '.join(what)}); the schedule was planned for "
                    f"{len(self.specs)} at batch {self.batch_size}: "
                    f"{self.planned_text()}")
        for i, (spec, k) in enumerate(zip(self.specs, slot_of)):
            value = slots[k][1]
            want = [self.batch_size if d == BATCH_DIM else d
                    for d in spec.dims]
            want_text = (_SPEC_DTYPE_NAMES.get(spec.dtype, "?") +
                         _dims_text(want))
            which = f'input {i} ("{spec.name}")'
            if not isinstance(value, torch.Tensor):
                return (f"{which} is a {type(value).__name__}, the schedule "
                        f"was planned for a tensor {want_text}")
            got_text = _tensor_text(value)
            if got_text == want_text:
                continue
            got = list(value.shape)
            only_batch = (len(got) == len(want) and got and
                          got_text.split("[")[0] == want_text.split("[")[0]
                          and got[1:] == want[1:] and
                          spec.dims[0] == BATCH_DIM)
            if only_batch:
                hint = (f": batch {got[0]} is not the planned batch "
                        f"{self.batch_size}, and the schedule's budget holds "
                        "only for the step it was planned for; plan one at "
                        f"batch {got[0]} (mutwo submit/plan) or pass batches "
                        f"of {self.batch_size}")
            else:
                hint = (": the schedule's budget holds only for the step it "
                        "was planned for; plan one for these inputs")
            return (f"{which} is {got_text}, the schedule was planned for "
                    f"{want_text} (batch {self.batch_size}){hint}")
        return None
