"""Typed views of mutwo's messages (proto/mutwo/v1/types.proto).

Each dataclass is built from its message by `from_proto` and keeps the
message in `proto` (left out of repr and comparisons) for anything not
mirrored here. Sizes are bytes, times milliseconds, as in the protos.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Optional, Tuple, Union

from google.protobuf import json_format

from mutwo._specs import format_bytes
from mutwo.v1 import planner_pb2, types_pb2

__all__ = [
    "Decision", "ParetoPoint", "Schedule", "Validation", "BudgetOutcome",
    "BatchResult", "MaxBatch", "Job", "JobProgress", "Model", "Worker",
]

_PROTO = dataclasses.field(default=None, repr=False, compare=False)


def _enum_name(enum: Any, value: int) -> str:
    try:
        return enum.Name(value)
    except ValueError:
        return str(value)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What to do with one activation: RETAIN, RECOMPUTE or SWAP.

    `module_path` ("layer3.4.conv2"; "" is the model's own forward),
    `op_kind` ("aten::conv2d") and `output_index` (which output of that op
    holds it; -1: only buffers the op saved internally) name it in the eager
    model; the ids are those of the profile's graph.
    """
    value_id: int
    action: str
    module_path: str
    op_kind: str
    output_index: int
    producer_node: int
    size_bytes: int
    segment: int = 0
    recompute_nodes: Tuple[int, ...] = ()
    recompute_module_paths: Tuple[str, ...] = ()
    recompute_ms: float = 0.0
    offload_after: int = 0
    prefetch_at: int = 0
    prefetch_node: int = -1
    needed_at: int = 0
    stall_ms: float = 0.0
    proto: Optional[types_pb2.Decision] = _PROTO

    @classmethod
    def from_proto(cls, d: types_pb2.Decision) -> "Decision":
        return cls(
            value_id=d.value_id,
            action=_enum_name(types_pb2.Decision.Action, d.action),
            module_path=d.module_path, op_kind=d.op_kind,
            output_index=d.output_index if d.op_kind else -1,
            producer_node=d.producer_node, size_bytes=d.size_bytes,
            segment=d.segment, recompute_nodes=tuple(d.recompute_nodes),
            recompute_module_paths=tuple(d.recompute_module_paths),
            recompute_ms=d.recompute_ms,
            offload_after=d.offload_after, prefetch_at=d.prefetch_at,
            prefetch_node=d.prefetch_node, needed_at=d.needed_at,
            stall_ms=d.stall_ms, proto=d)

    def __str__(self) -> str:
        where = self.module_path or "(model)"
        out = "-" if self.output_index < 0 else str(self.output_index)
        text = (f"{self.action:<9} {where} {self.op_kind or '?'} output {out} "
                f"({format_bytes(self.size_bytes)}; value {self.value_id}, "
                f"node {self.producer_node})")
        if self.action == "RECOMPUTE":
            text += f" segment {self.segment}, {self.recompute_ms:.3f} ms"
        elif self.action == "SWAP":
            text += f" stall {self.stall_ms:.3f} ms"
        return text


@dataclasses.dataclass(frozen=True)
class ParetoPoint:
    """One point of the budget -> predicted overhead curve."""
    budget_bytes: int
    predicted_peak_bytes: int
    predicted_iteration_ms: float
    recomputed: int
    swapped: int

    @classmethod
    def from_proto(cls, p: types_pb2.ParetoPoint) -> "ParetoPoint":
        return cls(p.budget_bytes, p.predicted_peak_bytes,
                   p.predicted_iteration_ms, p.recomputed, p.swapped)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A planned schedule for one model, batch size and budget.

    Read one from the server (`Client.schedule`) or from a file written by
    `mutwo plan ... --output json` / `mutwo schedule ... --output json`
    (`Schedule.from_json`). `mutwo.apply(model, schedule)` applies it to
    the eager model.
    """
    policy: str
    graph_fingerprint: str
    model_sha256: str
    batch_size: int
    budget: str
    budget_bytes: int
    feasible: bool
    floor_bytes: int
    predicted_peak_bytes: int
    predicted_iteration_ms: float
    baseline_peak_bytes: int
    baseline_iteration_ms: float
    measured_peak_bytes: int
    reason: str
    decisions: Tuple[Decision, ...]
    pareto: Tuple[ParetoPoint, ...] = ()
    proto: Optional[types_pb2.Schedule] = _PROTO

    @classmethod
    def from_proto(cls, s: types_pb2.Schedule) -> "Schedule":
        return cls(
            policy=_enum_name(types_pb2.Policy, s.policy),
            graph_fingerprint=s.graph_fingerprint,
            model_sha256=s.model_sha256, batch_size=s.batch_size,
            budget=s.budget.text, budget_bytes=s.budget_bytes,
            feasible=s.feasible, floor_bytes=s.floor_bytes,
            predicted_peak_bytes=s.predicted_peak_bytes,
            predicted_iteration_ms=s.predicted_iteration_ms,
            baseline_peak_bytes=s.baseline_peak_bytes,
            baseline_iteration_ms=s.baseline_iteration_ms,
            measured_peak_bytes=s.measured_peak_bytes, reason=s.reason,
            decisions=tuple(Decision.from_proto(d) for d in s.decisions),
            pareto=tuple(ParetoPoint.from_proto(p) for p in s.pareto),
            proto=s)

    @classmethod
    def from_json(cls, source: Union[str, Dict[str, Any]]) -> "Schedule":
        """From JSON text, a parsed dict, or the path of a JSON file (the
        CLI's `--output json`)."""
        if isinstance(source, dict):
            text = json.dumps(source)
        elif source.lstrip().startswith("{"):
            text = source
        else:
            with open(source, encoding="utf-8") as f:
                text = f.read()
        message = types_pb2.Schedule()
        json_format.Parse(text, message, ignore_unknown_fields=True)
        return cls.from_proto(message)

    def to_json(self) -> str:
        message = self.proto if self.proto is not None else types_pb2.Schedule()
        return json_format.MessageToJson(message,
                                         preserving_proto_field_name=True)

    def __repr__(self) -> str:
        return (f"Schedule(policy={self.policy!r}, batch_size="
                f"{self.batch_size}, budget={self.budget!r}, budget_bytes="
                f"{self.budget_bytes}, feasible={self.feasible}, "
                f"predicted_peak_bytes={self.predicted_peak_bytes}, "
                f"{len(self.recomputed)} recomputed, {len(self.swapped)} "
                f"swapped of {len(self.decisions)} decisions)")

    @property
    def recomputed(self) -> List[Decision]:
        return [d for d in self.decisions if d.action == "RECOMPUTE"]

    @property
    def swapped(self) -> List[Decision]:
        return [d for d in self.decisions if d.action == "SWAP"]

    def __str__(self) -> str:
        lines = [
            f"{self.policy} schedule, batch {self.batch_size}, budget "
            f"{self.budget or format_bytes(self.budget_bytes)} "
            f"({format_bytes(self.budget_bytes)}): "
            + ("feasible" if self.feasible else "INFEASIBLE"),
            f"  predicted peak {format_bytes(self.predicted_peak_bytes)} "
            f"(baseline {format_bytes(self.baseline_peak_bytes)}), "
            f"{self.predicted_iteration_ms:.2f} ms a step (baseline "
            f"{self.baseline_iteration_ms:.2f} ms)",
        ]
        if self.reason:
            lines.append(f"  {self.reason}")
        lines += [f"  {d}" for d in self.decisions if d.action != "RETAIN"]
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Validation:
    """A schedule run by a worker: measured against the unmodified step."""
    budget_bytes: int
    baseline_peak_bytes: int
    scheduled_peak_bytes: int
    predicted_peak_bytes: int
    baseline_iteration_ms: float
    scheduled_iteration_ms: float
    within_budget: bool
    gradients_match: bool
    max_abs_grad_diff: float
    oom: bool
    error: str
    round: int
    proto: Optional[types_pb2.Validation] = _PROTO

    @classmethod
    def from_proto(cls, v: types_pb2.Validation) -> "Validation":
        return cls(v.budget_bytes, v.baseline.peak_bytes,
                   v.scheduled.peak_bytes, v.predicted.peak_bytes,
                   v.baseline.iteration_ms, v.scheduled.iteration_ms,
                   v.within_budget, v.gradients_match, v.max_abs_grad_diff,
                   v.oom, v.error, v.round, proto=v)


@dataclasses.dataclass(frozen=True)
class BudgetOutcome:
    """Whether a requested budget is proved to fit (state FITS)."""
    budget: str
    budget_bytes: int
    state: str
    fits: bool
    rounds: int
    measured_peak_bytes: int
    predicted_peak_bytes: int
    reason: str
    # The schedule measured where the user trains (report_training_loop):
    # the newest report holds, its peak, and how many reports came in.
    validated_in_training_loop: bool = False
    training_loop_peak_bytes: int = 0
    training_loop_reports: int = 0
    proto: Optional[types_pb2.BudgetOutcome] = _PROTO

    def __str__(self) -> str:
        text = (f"budget {self.budget or format_bytes(self.budget_bytes)} "
                f"({format_bytes(self.budget_bytes)}): {self.state}")
        if self.predicted_peak_bytes:
            text += f", planned peak {format_bytes(self.predicted_peak_bytes)}"
        if self.measured_peak_bytes:
            text += f", measured {format_bytes(self.measured_peak_bytes)}"
        if self.rounds > 1:
            text += f" ({self.rounds} rounds)"
        if self.training_loop_reports:
            text += (", training loop "
                     + ("holds" if self.validated_in_training_loop
                        else "NOT HOLDING") + " "
                     + format_bytes(self.training_loop_peak_bytes))
        if self.reason:
            text += f": {self.reason}"
        return text

    @classmethod
    def from_proto(cls, o: types_pb2.BudgetOutcome) -> "BudgetOutcome":
        return cls(o.budget.text, o.budget_bytes,
                   _enum_name(types_pb2.BudgetOutcome.State, o.state), o.fits,
                   o.rounds, o.measured_peak_bytes, o.predicted_peak_bytes,
                   o.reason,
                   validated_in_training_loop=o.validated_in_training_loop,
                   training_loop_peak_bytes=o.training_loop_peak_bytes,
                   training_loop_reports=o.training_loop_reports, proto=o)


@dataclasses.dataclass(frozen=True)
class TrainingLoopReport:
    """A schedule measured in a training loop, as the server stored and
    judged it (`Client.report_training_loop`)."""
    path: str             # EAGER, COMPILE or LIBTORCH
    batch_size: int
    budget: str
    budget_bytes: int
    peak_bytes: int       # the scheduled step's, in the training loop
    iteration_ms: float
    holds: bool           # the server's verdict
    problem: str          # why not, when it does not hold
    reported_by: str
    proto: Optional[types_pb2.TrainingLoopValidation] = _PROTO

    @classmethod
    def from_proto(cls, t: types_pb2.TrainingLoopValidation
                   ) -> "TrainingLoopReport":
        v = t.validation
        return cls(_enum_name(types_pb2.TrainingLoopValidation.Path, t.path),
                   v.batch_size, t.budget.text, v.budget_bytes,
                   v.scheduled.peak_bytes, v.scheduled.iteration_ms, t.holds,
                   t.problem, t.reported_by, proto=t)


@dataclasses.dataclass(frozen=True)
class TrainingLoopAnswer:
    """The server's answer to `Client.report_training_loop`: the report as
    stored and judged, the budget's outcome after it, and, when the only
    problem was the peak over the budget, the budget planned again below it
    by what the loop measured over the prediction (`corrected`; `note`
    says why there is none otherwise)."""
    report: TrainingLoopReport
    outcome: BudgetOutcome
    corrected: Optional[Schedule]
    note: str


@dataclasses.dataclass(frozen=True)
class BatchResult:
    """Everything a job learned at one batch size."""
    batch_size: int
    baseline_peak_bytes: int
    baseline_iteration_ms: float
    schedules: Tuple[Schedule, ...]
    validations: Tuple[Validation, ...]
    outcomes: Tuple[BudgetOutcome, ...]
    oom: bool
    error: str
    # The memory question, with or without budgets: the lowest budget mutwo
    # fits, the non-dominated (peak, time) curve and its knee (`auto`).
    floor_bytes: int = 0
    pareto: Tuple[ParetoPoint, ...] = ()
    knee: Optional[ParetoPoint] = None
    # The floor a worker measured (the job asked for budget "floor"); 0:
    # not measured, floor_bytes is the planner's prediction.
    measured_floor_bytes: int = 0
    training_loop: Tuple[TrainingLoopReport, ...] = ()
    # The baseline step time the floor, curve and knee were planned
    # against: baseline_iteration_ms unless the schedule cache served plans
    # made from an earlier profile of the same model (0: an older server).
    plan_baseline_iteration_ms: float = 0.0
    proto: Optional[types_pb2.BatchResult] = _PROTO

    def __str__(self) -> str:
        """A few lines, as `mutwo job` shows one batch size (the schedules'
        decisions are left out: print a Schedule for them)."""
        lines = [f"batch {self.batch_size}: baseline peak "
                 f"{format_bytes(self.baseline_peak_bytes)}, "
                 f"{self.baseline_iteration_ms:.2f} ms a step"]
        if self.oom:
            lines.append("  out of memory at this batch size")
        if self.floor_bytes:
            floor = (f"{format_bytes(self.measured_floor_bytes)} measured"
                     if self.measured_floor_bytes else
                     f"{format_bytes(self.floor_bytes)} predicted")
            lines.append(f"  floor {floor} (the lowest budget that fits)")
        if self.knee is not None:
            k = self.knee
            # Against the baseline the knee was planned against.
            base = self.plan_baseline_iteration_ms or self.baseline_iteration_ms
            overhead = (f" ({k.predicted_iteration_ms / base - 1:+.1%})"
                        if base > 0 else "")
            lines.append(f"  knee (budget auto): budget "
                         f"{format_bytes(k.budget_bytes)}, planned peak "
                         f"{format_bytes(k.predicted_peak_bytes)}, "
                         f"{k.predicted_iteration_ms:.2f} ms{overhead}; "
                         f"pareto curve of {len(self.pareto)} points")
        for i, o in enumerate(self.outcomes):
            line = f"  {o}"
            if i < len(self.schedules):
                sched = self.schedules[i]
                line += (f"; {len(sched.recomputed)} recomputed, "
                         f"{len(sched.swapped)} swapped")
            lines.append(line)
        if not self.outcomes:
            for sched in self.schedules:
                lines.append(
                    f"  budget {sched.budget or format_bytes(sched.budget_bytes)}"
                    f": " + ("planned peak "
                             f"{format_bytes(sched.predicted_peak_bytes)}"
                             if sched.feasible else "INFEASIBLE"))
        if self.training_loop:
            lines.append(f"  {len(self.training_loop)} training-loop "
                         "report(s)")
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"BatchResult(batch_size={self.batch_size}, "
                f"baseline_peak_bytes={self.baseline_peak_bytes}, "
                f"floor_bytes={self.floor_bytes}, "
                f"{len(self.schedules)} schedules, "
                f"{len(self.outcomes)} outcomes, oom={self.oom})")

    @classmethod
    def from_proto(cls, r: types_pb2.BatchResult) -> "BatchResult":
        return cls(r.batch_size, r.baseline_peak_bytes,
                   r.baseline_iteration_ms,
                   tuple(Schedule.from_proto(s) for s in r.schedules),
                   tuple(Validation.from_proto(v) for v in r.validations),
                   tuple(BudgetOutcome.from_proto(o) for o in r.outcomes),
                   r.oom, r.error, floor_bytes=r.floor_bytes,
                   pareto=tuple(ParetoPoint.from_proto(p) for p in r.pareto),
                   knee=(ParetoPoint.from_proto(r.knee)
                         if r.HasField("knee") else None),
                   measured_floor_bytes=r.measured_floor_bytes,
                   training_loop=tuple(TrainingLoopReport.from_proto(t)
                                       for t in r.training_loop),
                   plan_baseline_iteration_ms=r.plan_baseline_iteration_ms,
                   proto=r)


@dataclasses.dataclass(frozen=True)
class MaxBatchCheck:
    """One max batch answer run on a worker: `state` NOT_VERIFIED,
    VERIFYING, VERIFIED or FAILED, the batch size run last and its peak."""
    state: str
    predicted_batch_size: int
    batch_size: int
    measured_peak_bytes: int
    capacity_bytes: int
    oom: bool
    rounds: int
    reason: str

    @property
    def verified(self) -> bool:
        return self.state == "VERIFIED"

    @classmethod
    def from_proto(cls, c: types_pb2.MaxBatchCheck) -> "MaxBatchCheck":
        return cls(types_pb2.MaxBatchCheck.State.Name(c.state),
                   c.predicted_batch_size, c.batch_size,
                   c.measured_peak_bytes, c.capacity_bytes, c.oom, c.rounds,
                   c.reason)


@dataclasses.dataclass(frozen=True)
class MaxBatch:
    """The largest batch that fits `capacity_bytes`: predicted, then (once
    the checks are VERIFIED) the batch sizes measured to fit."""
    capacity_bytes: int
    max_batch_without_checkpointing: int
    max_batch_with_schedule: int
    max_overhead: float
    profiled_batch_sizes: Tuple[int, ...]
    bytes_per_sample: float
    reason: str
    fragmentation_fraction: float = 0.0
    reserve_bytes: int = 0
    extrapolation: float = 0.0
    without_checkpointing_check: Optional[MaxBatchCheck] = None
    with_schedule_check: Optional[MaxBatchCheck] = None
    proto: Optional[types_pb2.MaxBatchPrediction] = _PROTO

    def __str__(self) -> str:
        def answer(batch: int, check: Optional[MaxBatchCheck]) -> str:
            if check is None:
                return f"{batch} (predicted)"
            return f"{batch} ({check.state.lower()}: {check.reason})" \
                if check.reason else f"{batch} ({check.state.lower()})"
        return "\n".join([
            f"max batch (capacity {format_bytes(self.capacity_bytes)}):",
            "  without checkpointing: " + answer(
                self.max_batch_without_checkpointing,
                self.without_checkpointing_check),
            f"  with a schedule (overhead <= {self.max_overhead:+.0%}): "
            + answer(self.max_batch_with_schedule,
                     self.with_schedule_check
                     or self.without_checkpointing_check),
            f"  prediction: {self.reason}"])

    @classmethod
    def from_proto(cls, m: types_pb2.MaxBatchPrediction) -> "MaxBatch":
        def check(name: str) -> Optional[MaxBatchCheck]:
            return (MaxBatchCheck.from_proto(getattr(m, name))
                    if m.HasField(name) else None)
        return cls(m.capacity_bytes, m.max_batch_without_checkpointing,
                   m.max_batch_with_schedule, m.max_overhead,
                   tuple(m.profiled_batch_sizes), m.bytes_per_sample,
                   m.reason, m.fragmentation_fraction, m.reserve_bytes,
                   m.extrapolation,
                   check("without_checkpointing_check"),
                   check("with_schedule_check"), proto=m)


@dataclasses.dataclass(frozen=True)
class Job:
    """A submitted job and what it has found so far."""
    job_id: str
    state: str
    error: str
    model_sha256: str
    model_name: str
    batch_sizes: Tuple[int, ...]
    tasks_total: int
    tasks_done: int
    waiting: str
    results: Tuple[BatchResult, ...]
    max_batch: Optional[MaxBatch]
    proto: Optional[types_pb2.Job] = _PROTO

    FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")

    @classmethod
    def from_proto(cls, j: types_pb2.Job) -> "Job":
        return cls(
            job_id=j.job_id, state=_enum_name(types_pb2.Job.State, j.state),
            error=j.error, model_sha256=j.spec.model_sha256,
            model_name=j.spec.model_name,
            batch_sizes=tuple(j.spec.batch_sizes), tasks_total=j.tasks_total,
            tasks_done=j.tasks_done, waiting=j.waiting,
            results=tuple(BatchResult.from_proto(r) for r in j.results),
            max_batch=(MaxBatch.from_proto(j.max_batch)
                       if j.HasField("max_batch") else None),
            proto=j)

    @property
    def done(self) -> bool:
        return self.state in self.FINAL_STATES

    def __str__(self) -> str:
        """A few lines per batch size, as `mutwo job` (without the
        schedules' decisions)."""
        lines = [f"job {self.job_id} {self.state}: model {self.model_name} "
                 f"({self.model_sha256[:12]}), batch sizes "
                 f"{', '.join(map(str, self.batch_sizes))}, tasks "
                 f"{self.tasks_done}/{self.tasks_total}"]
        if self.error:
            lines.append(f"  error: {self.error}")
        if self.waiting:
            lines.append(f"  waiting: {self.waiting}")
        lines += ["  " + line for r in self.results
                  for line in str(r).split("\n")]
        if self.max_batch is not None:
            lines += ["  " + line for line in str(self.max_batch).split("\n")]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Job(job_id={self.job_id!r}, state={self.state!r}, "
                f"model_name={self.model_name!r}, "
                f"batch_sizes={self.batch_sizes}, "
                f"tasks_done={self.tasks_done}, "
                f"tasks_total={self.tasks_total}, "
                f"{len(self.results)} results)")

    def result(self, batch_size: int) -> BatchResult:
        for r in self.results:
            if r.batch_size == batch_size:
                return r
        raise KeyError(f"job {self.job_id} has no result for batch size "
                       f"{batch_size}; it has "
                       f"{[r.batch_size for r in self.results]}")


@dataclasses.dataclass(frozen=True)
class JobProgress:
    """One event of `Client.watch`."""
    state: str
    tasks_total: int
    tasks_done: int
    message: str
    waiting: str
    running: str
    job: Optional[Job]

    @classmethod
    def from_proto(cls, e: planner_pb2.JobEvent) -> "JobProgress":
        return cls(_enum_name(types_pb2.Job.State, e.state), e.tasks_total,
                   e.tasks_done, e.message, e.waiting, e.running,
                   Job.from_proto(e.job) if e.HasField("job") else None)


@dataclasses.dataclass(frozen=True)
class Model:
    """An uploaded TorchScript model (content-addressed by sha256)."""
    sha256: str
    size_bytes: int
    already_stored: bool
    name: str
    # Module paths of the scripted model (when the client scripted or
    # loaded it), for checking a schedule against it.
    module_paths: Tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Worker:
    worker_id: str
    hostname: str
    device: str
    state: str
    current_task_id: str

    @classmethod
    def from_proto(cls, w: types_pb2.WorkerInfo) -> "Worker":
        return cls(w.worker_id, w.hostname, w.device.name,
                   _enum_name(types_pb2.WorkerInfo.State, w.state),
                   w.current_task_id)
