"""mutwo: memory schedules (recompute / swap) for training, from the mutwo
service, applied in your own PyTorch training loop.

    import mutwo
    client = mutwo.Client("127.0.0.1:50051")        # MUTWO_TOKEN, MUTWO_TLS_CA
    job = client.wait(client.submit(model, inputs=["x:float32[B,3,224,224]"],
                                    batch_sizes=[64], budgets=["60%"]))
    schedule = client.schedule(job, 64, "60%")
    with mutwo.apply(model, schedule):
        ...  # forward, loss.backward(), optimizer.step() as usual

`mutwo.apply` needs torch and protobuf, not grpcio (a training node can apply
a schedule file); the client needs grpcio and protobuf.
"""
from typing import TYPE_CHECKING, Any

from mutwo._loss import chunked_cross_entropy
from mutwo._specs import (format_bytes, format_loss, make_job_spec,
                          parse_budget, parse_bytes, parse_loss,
                          parse_optimizer, parse_tensor_spec, read_token)
from mutwo._types import (BatchResult, BudgetOutcome, Decision, Job,
                          JobProgress, MaxBatch, MaxBatchCheck, Model,
                          ParetoPoint, Schedule, TrainingLoopAnswer,
                          TrainingLoopReport, Validation, Worker)

if TYPE_CHECKING:  # for type checkers; imported on first use (__getattr__)
    from mutwo._apply import (Applied, ApplyMeasurements, BudgetWarning,
                              InfeasibleScheduleError, ScheduleMismatchError,
                              apply)
    from mutwo._client import Client, JobFailedError, MutwoError

__version__ = "0.2.0"

__all__ = [
    "Client", "MutwoError", "JobFailedError", "apply", "Applied",
    "ApplyMeasurements", "BudgetWarning", "InfeasibleScheduleError",
    "ScheduleMismatchError", "Schedule", "Decision", "ParetoPoint", "Job",
    "JobProgress", "BatchResult", "BudgetOutcome", "Validation", "MaxBatch",
    "MaxBatchCheck", "Model", "Worker", "TrainingLoopReport", "TrainingLoopAnswer", "make_job_spec", "parse_budget", "parse_bytes",
    "parse_loss", "format_loss", "parse_optimizer", "parse_tensor_spec",
    "format_bytes",
    "read_token", "chunked_cross_entropy",
]


def __getattr__(name: str) -> Any:
    # torch is imported only when apply is used, grpcio only when the client
    # is.
    if name in ("apply", "Applied", "ApplyMeasurements", "BudgetWarning",
                "InfeasibleScheduleError", "ScheduleMismatchError"):
        from mutwo import _apply
        return getattr(_apply, name)
    if name in ("Client", "JobFailedError", "MutwoError"):
        from mutwo import _client
        return getattr(_client, name)
    raise AttributeError(f"module 'mutwo' has no attribute {name!r}")
