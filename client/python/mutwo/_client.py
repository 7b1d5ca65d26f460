"""mutwo.Client: the mutwo.v1.Planner service from Python."""
from __future__ import annotations

import hashlib
import io
import os
import time
import uuid
from typing import (Any, Callable, Iterator, List, Optional, Sequence,
                    Tuple, Union)

import grpc

from mutwo._model_archive import check_model_inputs
from mutwo._specs import (channel_credentials, make_job_spec, parse_budget,
                          read_token)
from mutwo._types import (BatchResult, BudgetOutcome, Job, JobProgress,
                          MaxBatch, Model, ParetoPoint, Schedule,
                          TrainingLoopAnswer, TrainingLoopReport, Worker)
from mutwo.v1 import planner_pb2, planner_pb2_grpc, types_pb2

__all__ = ["Client", "MutwoError", "JobFailedError"]

DEFAULT_SERVER = "127.0.0.1:50051"
CHUNK_BYTES = 1 << 20  # the server accepts chunks of at most 1 MiB
MAX_MESSAGE_BYTES = 64 << 20  # profiles and schedules can be large


class MutwoError(Exception):
    """An RPC failed: `code` is the grpc.StatusCode, `details` the server's
    message (what was wrong and what to do)."""

    def __init__(self, code: grpc.StatusCode, details: str, method: str = ""):
        self.code = code
        self.details = details
        self.method = method
        name = code.name if isinstance(code, grpc.StatusCode) else str(code)
        where = f"{method}: " if method else ""
        super().__init__(f"{where}{name}: {details}")


class JobFailedError(MutwoError):
    """`Client.wait` on a job that ended FAILED or CANCELLED; `job` is it."""

    def __init__(self, job: Job):
        self.job = job
        super().__init__(grpc.StatusCode.ABORTED,
                         f"job {job.job_id} {job.state}: {job.error}",
                         "wait")


def _call(method: str, fn: Callable[..., Any], *args: Any,
          **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
        details = e.details() if hasattr(e, "details") else str(e)
        raise MutwoError(code, details or "", method) from None


def _health_request(_: Any) -> bytes:
    return b""  # grpc.health.v1.HealthCheckRequest{service: ""}


def _health_status(data: bytes) -> str:
    # HealthCheckResponse{status = 1 (enum)}: tag 0x08, one varint byte.
    status = data[1] if len(data) >= 2 and data[0] == 0x08 else 0
    return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING",
            3: "SERVICE_UNKNOWN"}.get(status, str(status))


def _model_name(path: str) -> str:
    """The name `mutwo submit PATH` gives a model file (client/
    rpc_commands.cc): its file name less a ".pt" suffix. The server and
    the worker add ".pt" when they name the model in messages, and
    `mutwo jobs` shows the name as it is, so a file uploaded from Python
    and from the CLI reads the same in both."""
    name = os.path.basename(path)
    return name[:-3] if len(name) > 3 and name.endswith(".pt") else name


def _script(model: Any, example_inputs: Optional[Sequence[Any]]) -> Any:
    import torch  # only when a module is uploaded

    if isinstance(model, torch.jit.ScriptModule):
        return model
    if not isinstance(model, torch.nn.Module):
        raise TypeError("upload: expected an nn.Module, a ScriptModule, a "
                        f"file path or bytes, got {type(model).__name__}")
    try:
        return torch.jit.script(model)
    except Exception as e:  # scripting errors are many types
        if example_inputs is None:
            raise ValueError(
                f"upload: torch.jit.script failed ({e}); fix the model for "
                "TorchScript, or pass example_inputs to trace it instead "
                "(tracing records one control-flow path)") from e
        return torch.jit.trace(model, tuple(example_inputs))


class Client:
    """The mutwo service, with a deadline on every call.

        client = mutwo.Client("127.0.0.1:50051")    # or $MUTWO_SERVER
        job = client.submit(model, inputs=["x:float32[B,3,224,224]"],
                            batch_sizes=[32], budgets=["60%"])
        job = client.wait(job)                      # progress bar
        schedule = client.schedule(job, 32, "60%")
        mutwo.apply(model, schedule)

    The server: `target`, else the environment variable MUTWO_SERVER, else
    127.0.0.1:50051 (as the `mutwo` CLI). Wherever a job is asked for, its
    id may be "latest" (or "-"): the newest job the server lists (not for
    `cancel`, which takes the id only).

    Credentials: `token`, else the first line of `token_file` or of the file
    named by MUTWO_TOKEN_FILE, else MUTWO_TOKEN; TLS verified with the PEM
    CA `tls_ca` (else MUTWO_TLS_CA). A token goes to a non-loopback server
    only over TLS (ValueError otherwise). RPC errors raise MutwoError with
    the gRPC code and the server's message.
    """

    def __init__(self, target: Optional[str] = None, *,
                 token: Optional[str] = None,
                 token_file: Optional[str] = None,
                 tls_ca: Optional[str] = None, timeout_s: float = 30.0,
                 channel: Optional[grpc.Channel] = None):
        target = target or os.environ.get("MUTWO_SERVER") or DEFAULT_SERVER
        self.target = target
        self.timeout_s = timeout_s
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        if channel is None:
            credentials = channel_credentials(
                target, read_token(token, token_file), tls_ca)
            channel = (grpc.secure_channel(target, credentials, options)
                       if credentials else
                       grpc.insecure_channel(target, options))
        self._channel = channel
        self._stub = planner_pb2_grpc.PlannerStub(channel)
        self._health = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=_health_request,
            response_deserializer=lambda data: data)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- service -----------------------------------------------------------
    def health(self) -> str:
        """"SERVING" or "NOT_SERVING" (grpc.health.v1, whole server)."""
        return _health_status(
            _call("Health.Check", self._health, None, timeout=self.timeout_s))

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Blocks until the channel connects; raises TimeoutError."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise TimeoutError(f"{self.target} not reachable after "
                               f"{timeout_s:.0f} s") from None

    def workers(self) -> List[Worker]:
        response = _call("ListWorkers", self._stub.ListWorkers,
                         planner_pb2.ListWorkersRequest(),
                         timeout=self.timeout_s)
        return [Worker.from_proto(w) for w in response.workers]

    # -- models and jobs ---------------------------------------------------
    def _id(self, job: Union[Job, str]) -> str:
        """The job's id; "latest" or "-": the newest job's."""
        job_id = _job_id(job)
        if job_id not in _LATEST:
            return job_id
        newest = self.jobs(page_size=1)
        if not newest:
            raise MutwoError(grpc.StatusCode.NOT_FOUND,
                             f'"{job_id}" names the newest job, and '
                             f"{self.target} has none yet", "ListJobs")
        return newest[0].job_id

    def upload(self, model: Any, *, name: Optional[str] = None,
               example_inputs: Optional[Sequence[Any]] = None,
               timeout_s: float = 600.0) -> Model:
        """Uploads a model: an nn.Module (scripted here with
        torch.jit.script; traced with `example_inputs` if scripting fails),
        a ScriptModule, a TorchScript file path or its bytes. Streams 1 MiB
        chunks after a header with the size and sha256."""
        data, name, paths = self._model_bytes(model, name, example_inputs)
        return self._upload_bytes(data, name, paths, timeout_s)

    @staticmethod
    def _model_bytes(model: Any, name: Optional[str],
                     example_inputs: Optional[Sequence[Any]]
                     ) -> Tuple[bytes, str, Tuple[str, ...]]:
        """The TorchScript archive upload() sends, its name and (for a
        module scripted here) its module paths."""
        paths: Tuple[str, ...] = ()
        if isinstance(model, (bytes, bytearray)):
            data = bytes(model)
            name = name or "model"
        elif isinstance(model, (str, os.PathLike)):
            with open(model, "rb") as f:
                data = f.read()
            name = name or _model_name(os.fspath(model))
        else:
            import torch

            scripted = _script(model, example_inputs)
            buffer = io.BytesIO()
            torch.jit.save(scripted, buffer)
            data = buffer.getvalue()
            name = name or type(model).__name__
            paths = tuple(p for p, _ in scripted.named_modules())
        return data, name, paths

    def _upload_bytes(self, data: bytes, name: str,
                      paths: Tuple[str, ...], timeout_s: float) -> Model:
        header = planner_pb2.UploadModelHeader(
            size_bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
            name=name)

        def requests() -> Iterator[planner_pb2.UploadModelRequest]:
            yield planner_pb2.UploadModelRequest(header=header)
            for start in range(0, len(data), CHUNK_BYTES):
                yield planner_pb2.UploadModelRequest(
                    chunk=data[start:start + CHUNK_BYTES])

        r = _call("UploadModel", self._stub.UploadModel, requests(),
                  timeout=timeout_s)
        return Model(r.sha256, r.size_bytes, r.already_stored, name, paths)

    def submit(self, model: Any, *, inputs: Sequence[Any],
               batch_sizes: Sequence[int], budgets: Sequence[Any] = (),
               loss: Any = "mean", optimizer: Any = "sgd",
               name: str = "", device_kind: str = "",
               max_overhead: float = 0.0, warmup_iterations: int = 0,
               measure_iterations: int = 0,
               client_request_id: Optional[str] = None,
               example_inputs: Optional[Sequence[Any]] = None,
               capacity: Optional[str] = None) -> Job:
        """Submits a job. `model` is a Model from upload(), a sha256, or
        anything upload() takes (uploaded first). `inputs` are text specs
        (`x:float32[B,3,224,224]`), budgets `60%`, `80%dev`, `4GiB` or
        `auto` (the knee of the Pareto curve), capacity (of the max batch,
        verified on a worker) `16GiB` or `95%dev`, loss
        `mean`/`sum`/`model`/`cross_entropy:y:int64[B]{0,1000}`/
        `mse:z:float32[B,4]`, `KIND@OUTPUT` for one output, several terms
        joined by `+` or as a list (docs/loss.md), optimizer
        `sgd`/`adam:lr=0.01`/... (the CLI's forms). A repeated
        client_request_id returns the first job.

        A model uploaded here is checked first, as the server checks it at
        submit (mutwo/_model_archive.py, a port of common/model_archive):
        a torch.save pickle, a truncated or corrupt file, or inputs that
        forward cannot take (missing, naming no argument, a tensor for an
        int argument) raise ValueError with the server's message, and
        nothing is uploaded."""
        data: Optional[bytes] = None
        paths: Tuple[str, ...] = ()
        if isinstance(model, Model):
            sha, name = model.sha256, name or model.name
        elif isinstance(model, str) and len(model) == 64 and all(
                c in "0123456789abcdef" for c in model):
            sha = model
        else:
            data, default_name, paths = self._model_bytes(
                model, name or None, example_inputs)
            sha, name = hashlib.sha256(data).hexdigest(), name or default_name
        spec = make_job_spec(
            sha, inputs=inputs, batch_sizes=batch_sizes, budgets=budgets,
            loss=loss, optimizer=optimizer, model_name=name,
            device_kind=device_kind, max_overhead=max_overhead,
            warmup_iterations=warmup_iterations,
            measure_iterations=measure_iterations, capacity=capacity)
        if data is not None:
            # The server names the model so (server/job_core.cc).
            check_model_inputs(data, f"{name}.pt" if name else sha,
                               spec.inputs)
            self._upload_bytes(data, name, paths, 600.0)
        request = planner_pb2.SubmitJobRequest(
            spec=spec, client_request_id=client_request_id or uuid.uuid4().hex)
        response = _call("SubmitJob", self._stub.SubmitJob, request,
                         timeout=self.timeout_s)
        return Job.from_proto(response.job)

    def job(self, job: Union[Job, str]) -> Job:
        return Job.from_proto(_call(
            "GetJob", self._stub.GetJob,
            planner_pb2.GetJobRequest(job_id=self._id(job)),
            timeout=self.timeout_s))

    def jobs(self, *, model_sha256: str = "", page_size: int = 0) -> List[Job]:
        response = _call("ListJobs", self._stub.ListJobs,
                         planner_pb2.ListJobsRequest(
                             model_sha256=model_sha256, page_size=page_size),
                         timeout=self.timeout_s)
        return [Job.from_proto(j) for j in response.jobs]

    def cancel(self, job: Union[Job, str]) -> Job:
        if _job_id(job) in _LATEST:
            # "The newest job" could be one submitted a moment ago by
            # someone else.
            raise ValueError("cancel needs the job's id, not "
                             f"{_job_id(job)!r}: Client.jobs() lists them")
        return Job.from_proto(_call(
            "CancelJob", self._stub.CancelJob,
            planner_pb2.CancelJobRequest(job_id=_job_id(job)),
            timeout=self.timeout_s))

    def watch(self, job: Union[Job, str],
              timeout_s: float = 3600.0) -> Iterator[JobProgress]:
        """Progress events until the job is final (the last has .job)."""
        stream = self._stub.WatchJob(
            planner_pb2.WatchJobRequest(job_id=self._id(job)),
            timeout=timeout_s)
        try:
            for event in stream:
                yield JobProgress.from_proto(event)
        except grpc.RpcError as e:
            raise MutwoError(e.code(), e.details() or "", "WatchJob") from None

    def wait(self, job: Union[Job, str], *, timeout_s: float = 3600.0,
             progress: Optional[bool] = None,
             raise_on_failure: bool = True) -> Job:
        """Waits until the job is final and returns it. Shows progress on
        stderr unless `progress` is False: a bar (tqdm if installed, else a
        line per change); with None (the default), the bar on a terminal
        and otherwise (a log file, a notebook's captured stderr) one line
        per change of state. A dropped stream is resumed while time is
        left; TimeoutError after `timeout_s`; JobFailedError for FAILED or
        CANCELLED unless raise_on_failure is False. Ctrl-C
        (KeyboardInterrupt) stops the waiting, not the job: a line says how
        to follow or cancel it."""
        import sys

        job_id = self._id(job)
        states_only = False
        if progress is None:
            progress, states_only = True, not sys.stderr.isatty()
        bar = _ProgressBar(job_id, states_only) if progress else None
        deadline = time.monotonic() + timeout_s
        final: Optional[Job] = None
        try:
            while final is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"job {job_id} not final after "
                                       f"{timeout_s:.0f} s")
                try:
                    for event in self.watch(job_id, timeout_s=left):
                        if bar is not None:
                            bar.update(event)
                        if event.state in Job.FINAL_STATES:
                            final = event.job or self.job(job_id)
                            break
                except MutwoError as e:
                    if e.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise TimeoutError(f"job {job_id} not final after "
                                           f"{timeout_s:.0f} s") from None
                    if e.code != grpc.StatusCode.UNAVAILABLE:
                        raise
                    time.sleep(min(1.0, max(0.0,
                                            deadline - time.monotonic())))
                if final is None:
                    current = self.job(job_id)
                    if current.done:
                        final = current
        except KeyboardInterrupt:
            print(f"\nmutwo: stopped waiting; job {job_id} keeps running on "
                  f"{self.target}: client.wait({job_id!r}) follows it again, "
                  f"client.cancel({job_id!r}) cancels it (CLI: mutwo watch "
                  f"{job_id} / mutwo cancel {job_id})", file=sys.stderr)
            raise
        finally:
            if bar is not None:
                bar.close()
        if raise_on_failure and final.state != "SUCCEEDED":
            raise JobFailedError(final)
        return final

    # -- results -----------------------------------------------------------
    def results(self, job: Union[Job, str]) -> List[BatchResult]:
        return list(self.job(job).results)

    def max_batch(self, job: Union[Job, str]) -> Optional[MaxBatch]:
        return self.job(job).max_batch

    def schedule(self, job: Union[Job, str], batch_size: int,
                 budget: Any, *, policy: Optional[str] = None,
                 include_pareto: bool = False) -> Schedule:
        """The schedule for one batch size and budget (`60%`, `4GiB`, ...);
        policy MUTWO (default), SQRT_N, PER_BLOCK or NONE."""
        if isinstance(budget, str):
            budget = parse_budget(budget)
        request = planner_pb2.GetScheduleRequest(
            job_id=self._id(job), batch_size=batch_size, budget=budget,
            policy=(types_pb2.Policy.Value(policy.upper()) if policy
                    else types_pb2.POLICY_UNSPECIFIED),
            include_pareto=include_pareto)
        return Schedule.from_proto(_call("GetSchedule", self._stub.GetSchedule,
                                         request, timeout=self.timeout_s))

    def pareto(self, job: Union[Job, str], batch_size: int,
               budget: Any = "100%") -> List[ParetoPoint]:
        """The budget -> predicted step time curve at one batch size."""
        return list(self.schedule(job, batch_size, budget,
                                  include_pareto=True).pareto)

    def report_training_loop(
            self, job: Union[Job, str],
            report: types_pb2.TrainingLoopValidation
    ) -> TrainingLoopAnswer:
        """Reports a schedule of the job measured in your training loop
        (`python3 -m mutwo verify --report JOB` builds `report` from its
        measurements: `mutwo._verify.training_loop_report`). The server
        checks it names the job's schedule (batch size, budget, graph,
        budget bytes), judges it (peak within the budget, gradients, loss
        and buffers equal, every decision applied), keeps it with the job
        and marks the budget's outcome validated_in_training_loop. Returns
        the stored report with the server's verdict, the outcome, and a
        corrected schedule when the peak alone was over the budget."""
        response = _call("ReportTrainingLoop", self._stub.ReportTrainingLoop,
                         planner_pb2.ReportTrainingLoopRequest(
                             job_id=self._id(job), report=report),
                         timeout=self.timeout_s)
        return TrainingLoopAnswer(
            TrainingLoopReport.from_proto(response.report),
            BudgetOutcome.from_proto(response.outcome),
            (Schedule.from_proto(response.corrected)
             if response.HasField("corrected") else None),
            response.note)

    def profile(self, job: Union[Job, str],
                batch_size: int) -> types_pb2.Profile:
        """The raw profile (a types_pb2.Profile message)."""
        return _call("GetProfile", self._stub.GetProfile,
                     planner_pb2.GetProfileRequest(job_id=self._id(job),
                                                   batch_size=batch_size),
                     timeout=self.timeout_s)


_LATEST = ("latest", "-")


def _job_id(job: Union[Job, str]) -> str:
    return job.job_id if isinstance(job, Job) else str(job)


class _ProgressBar:
    """tqdm over the job's tasks where tqdm is installed, else one stderr
    line per change; `states_only`: one line per change of state (stderr is
    no terminal: a bar would be noise, silence leaves people guessing)."""

    def __init__(self, job_id: str, states_only: bool = False):
        self._job_id = job_id
        self._states_only = states_only
        self._last = ""
        self._tqdm: Any = None
        if states_only:
            return
        try:
            from tqdm import tqdm  # type: ignore[import]
            self._tqdm = tqdm(total=0, desc=f"job {job_id[:8]}",
                              unit="task", leave=True)
        except ImportError:
            pass

    def update(self, event: JobProgress) -> None:
        text = event.running or event.waiting or event.message
        if self._tqdm is not None:
            self._tqdm.total = event.tasks_total
            self._tqdm.n = event.tasks_done
            self._tqdm.set_postfix_str(f"{event.state} {text}"[:60],
                                       refresh=False)
            self._tqdm.refresh()
            return
        if self._states_only:
            key = event.state
            line = (f"{time.strftime('%H:%M:%S')} job {self._job_id}: "
                    f"{event.state} ({event.tasks_done}/{event.tasks_total} "
                    "tasks)" + (f"; waiting: {event.waiting}"
                                if event.waiting else ""))
        else:
            line = key = (f"job {self._job_id[:8]}: {event.state} "
                          f"{event.tasks_done}/{event.tasks_total} {text}")
        if key != self._last:
            import sys
            print(line, file=sys.stderr, flush=True)
            self._last = key

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
