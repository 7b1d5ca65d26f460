"""Hand-written schedules for the apply tests: the decisions a planner would
make, named by module path as the server names them."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from torch import nn

from mutwo import Schedule
from mutwo.v1 import types_pb2

_KIND = (
    (nn.Conv2d, "aten::conv2d"), (nn.Linear, "aten::linear"),
    (nn.BatchNorm2d, "aten::batch_norm"), (nn.BatchNorm1d, "aten::batch_norm"),
    (nn.LayerNorm, "aten::layer_norm"), (nn.ReLU, "aten::relu_"),
    (nn.Dropout, "aten::dropout"), (nn.MaxPool2d, "aten::max_pool2d"),
    (nn.GELU, "aten::gelu"),
)


def kind_of(module: nn.Module) -> str:
    for cls, kind in _KIND:
        if isinstance(module, cls):
            return kind
    return "aten::add"  # a module's own forward (functional ops)


def make_schedule(model: nn.Module,
                  recompute: Sequence[Tuple[int, Sequence[str],
                                            Sequence[str]]] = (),
                  swap: Sequence[str] = (),
                  sha: str = "f" * 64, size_bytes: int = 0,
                  op_kinds: Optional[Dict[str, str]] = None,
                  budget_bytes: int = 0) -> Schedule:
    """One decision per module of `model` (RETAIN unless named).
    `recompute`: (segment, member module paths, extra replayed module paths).
    `size_bytes` of every decision (0: no planned saving to measure
    against); `op_kinds`: module path -> op kind, instead of the module
    type's (a module's own forward: its functional ops); `budget_bytes`
    the schedule's budget (0: none to check a peak against).
    """
    s = types_pb2.Schedule(policy=types_pb2.MUTWO, model_sha256=sha,
                           graph_fingerprint="test", batch_size=2,
                           feasible=True, budget_bytes=budget_bytes)
    action: Dict[str, Tuple[int, int, List[str]]] = {}
    for segment, members, extra in recompute:
        for m in members:
            action[m] = (types_pb2.Decision.RECOMPUTE, segment,
                         list(extra) + list(members))
    for m in swap:
        action[m] = (types_pb2.Decision.SWAP, 0, [])
    node = 0
    for path, module in model.named_modules():
        if path == "":
            continue
        a, segment, replay = action.get(path,
                                        (types_pb2.Decision.RETAIN, 0, []))
        d = s.decisions.add(value_id=node, producer_node=node,
                            size_bytes=size_bytes, action=a,
                            module_path=path,
                            op_kind=(op_kinds or {}).get(path,
                                                         kind_of(module)),
                            output_index=0)
        if a == types_pb2.Decision.RECOMPUTE:
            d.segment = segment
            d.recompute_nodes.extend(range(len(replay)))
            d.recompute_module_paths.extend(replay)
        node += 1
    return Schedule.from_proto(s)
