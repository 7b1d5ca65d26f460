"""mutwo.Client against an in-process fake Planner service: uploads of an
nn.Module, a ScriptModule, a file and bytes; typed results; errors as
MutwoError with the gRPC code; credentials; the shipped stubs are fresh."""
from __future__ import annotations

import filecmp
import hashlib
import io
import os
import shutil
import subprocess
import tempfile
from concurrent import futures
from typing import Any, Dict, Iterator, List

import grpc
import pytest
import torch
from torch import nn

import mutwo
from mutwo.v1 import planner_pb2, planner_pb2_grpc, types_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT_DIR = os.path.dirname(HERE)


class FakePlanner(planner_pb2_grpc.PlannerServicer):
    def __init__(self) -> None:
        self.models: Dict[str, bytes] = {}
        self.upload_names: List[str] = []
        self.specs: List[types_pb2.JobSpec] = []
        self.metadata: List[Any] = []

    def UploadModel(self, requests: Iterator[Any], context: Any) -> Any:
        header, data = None, b""
        for r in requests:
            if r.HasField("header"):
                header = r.header
                self.upload_names.append(header.name)
            else:
                data += r.chunk
        sha = hashlib.sha256(data).hexdigest()
        if header is None or header.sha256 != sha:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sha256 differs")
        stored = sha in self.models
        self.models[sha] = data
        return planner_pb2.UploadModelResponse(sha256=sha,
                                               size_bytes=len(data),
                                               already_stored=stored)

    def SubmitJob(self, request: Any, context: Any) -> Any:
        self.metadata.append(dict(context.invocation_metadata()))
        if request.spec.model_sha256 not in self.models:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"model {request.spec.model_sha256} not uploaded")
        self.specs.append(request.spec)
        return planner_pb2.SubmitJobResponse(job=types_pb2.Job(
            job_id="j1", spec=request.spec, state=types_pb2.Job.QUEUED))

    def WatchJob(self, request: Any, context: Any) -> Iterator[Any]:
        for done in (0, 1):
            yield planner_pb2.JobEvent(state=types_pb2.Job.PROFILING,
                                       tasks_total=2, tasks_done=done)
        job = types_pb2.Job(job_id=request.job_id,
                            state=types_pb2.Job.SUCCEEDED)
        r = job.results.add(batch_size=8, baseline_peak_bytes=1000)
        s = r.schedules.add(batch_size=8, budget_bytes=600, feasible=True)
        s.decisions.add(value_id=1, action=types_pb2.Decision.RECOMPUTE,
                        module_path="layer1.0.conv1", op_kind="aten::conv2d",
                        output_index=0, segment=0)
        r.outcomes.add(state=types_pb2.BudgetOutcome.FITS, fits=True)
        r.floor_bytes = 400
        r.pareto.add(budget_bytes=400, predicted_peak_bytes=400,
                     predicted_iteration_ms=3.0)
        r.pareto.add(budget_bytes=1000, predicted_peak_bytes=1000,
                     predicted_iteration_ms=1.0)
        r.knee.predicted_peak_bytes = 400
        job.max_batch.max_batch_with_schedule = 64
        job.max_batch.extrapolation = 8.0
        job.max_batch.with_schedule_check.state = \
            types_pb2.MaxBatchCheck.VERIFIED
        job.max_batch.with_schedule_check.batch_size = 64
        yield planner_pb2.JobEvent(state=types_pb2.Job.SUCCEEDED,
                                   tasks_total=2, tasks_done=2, job=job)

    def ListJobs(self, request: Any, context: Any) -> Any:
        # Newest first, as the server lists them.
        jobs = [types_pb2.Job(job_id=f"j{i + 1}", spec=spec,
                              state=types_pb2.Job.QUEUED)
                for i, spec in enumerate(self.specs)][::-1]
        return planner_pb2.ListJobsResponse(
            jobs=jobs[:request.page_size or 50])

    def GetJob(self, request: Any, context: Any) -> Any:
        if request.job_id in ("j1", "j2"):
            return types_pb2.Job(job_id=request.job_id,
                                 state=types_pb2.Job.QUEUED)
        context.abort(grpc.StatusCode.NOT_FOUND,
                      f'job "{request.job_id}" not found')

    def GetSchedule(self, request: Any, context: Any) -> Any:
        s = types_pb2.Schedule(batch_size=request.batch_size,
                               budget=request.budget, feasible=True)
        if request.include_pareto:
            s.pareto.add(budget_bytes=100, predicted_peak_bytes=90)
            s.pareto.add(budget_bytes=200, predicted_peak_bytes=180)
        return s


@pytest.fixture()
def fake() -> Iterator[Any]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    planner = FakePlanner()
    planner_pb2_grpc.add_PlannerServicer_to_server(planner, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    planner.target = f"127.0.0.1:{port}"
    yield planner
    server.stop(None)


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def test_upload_module_scripted_file_and_bytes(fake: Any,
                                               tmp_path: Any) -> None:
    with mutwo.Client(fake.target) as client:
        model = client.upload(Small())
        assert len(model.sha256) == 64 and model.name == "Small"
        assert "fc" in model.module_paths
        loaded = torch.jit.load(io.BytesIO(fake.models[model.sha256]))
        assert [n for n, _ in loaded.named_modules()] == ["", "fc"]
        scripted = torch.jit.script(Small())
        path = tmp_path / "small.pt"
        scripted.save(str(path))
        from_file = client.upload(str(path))
        assert from_file.name == "small"
        again = client.upload(path.read_bytes())
        assert again.already_stored and again.sha256 == from_file.sha256
        # A ScriptModule is saved as it is.
        assert client.upload(scripted).module_paths == ("", "fc")
        with pytest.raises(TypeError, match="nn.Module"):
            client.upload(42)


def test_submit_wait_and_typed_results(fake: Any) -> None:
    with mutwo.Client(fake.target) as client:
        job = client.submit(Small(), inputs=["x:float32[B,4]"],
                            batch_sizes=[8], budgets=["60%"],
                            optimizer="adamw:lr=0.01")
        assert isinstance(job, mutwo.Job) and job.state == "QUEUED"
        spec = fake.specs[-1]
        assert spec.inputs[0].dims == [-1, 4]
        assert spec.budgets[0].fraction_of_baseline == 0.6
        assert spec.optimizer.kind == types_pb2.OptimizerSpec.ADAMW
        final = client.wait(job, progress=False)
        assert final.state == "SUCCEEDED" and final.done
        result = final.result(8)
        assert isinstance(result, mutwo.BatchResult)
        d = result.schedules[0].decisions[0]
        assert (d.action, d.module_path, d.op_kind, d.output_index) == (
            "RECOMPUTE", "layer1.0.conv1", "aten::conv2d", 0)
        assert result.outcomes[0].state == "FITS"
        assert final.max_batch is not None
        assert final.max_batch.max_batch_with_schedule == 64
        # The memory question and the proof of the max batch, typed.
        assert result.floor_bytes == 400 and len(result.pareto) == 2
        assert result.knee is not None
        assert result.knee.predicted_peak_bytes == 400
        assert final.max_batch.extrapolation == 8.0
        check = final.max_batch.with_schedule_check
        assert check is not None and check.verified and check.batch_size == 64
        assert final.max_batch.without_checkpointing_check is None
        client.submit(Small(), inputs=["x:float32[B,4]"], batch_sizes=[8],
                      budgets=["auto"], capacity="2GiB")
        assert fake.specs[-1].budgets[0].knee
        assert fake.specs[-1].capacity.bytes == 2 << 30
        client.submit(Small(), inputs=["x:float32[B,4]"], batch_sizes=[8],
                      budgets=["floor"])
        assert fake.specs[-1].budgets[0].floor
        schedule = client.schedule(job, 8, "4GiB")
        assert isinstance(schedule, mutwo.Schedule)
        assert schedule.budget == "4GiB"
        pareto = client.pareto(job, 8)
        assert [p.budget_bytes for p in pareto] == [100, 200]
        assert all(isinstance(p, mutwo.ParetoPoint) for p in pareto)


def test_wait_without_a_terminal_logs_one_line_per_state(
        fake: Any, capsys: Any) -> None:
    with mutwo.Client(fake.target) as client:
        client.wait("j1")  # stderr is captured here: no terminal
    lines = capsys.readouterr().err.strip().split("\n")
    assert len(lines) == 2, lines
    assert "job j1: PROFILING (0/2 tasks)" in lines[0]
    assert "job j1: SUCCEEDED (2/2 tasks)" in lines[1]


def test_results_print_as_a_few_readable_lines() -> None:
    job = types_pb2.Job(job_id="j9", state=types_pb2.Job.SUCCEEDED)
    job.spec.model_name = "vit"
    job.spec.batch_sizes.append(32)
    r = job.results.add(batch_size=32, baseline_peak_bytes=3 << 30,
                        baseline_iteration_ms=100.0, floor_bytes=1 << 30)
    s = r.schedules.add(batch_size=32, budget_bytes=2 << 30, feasible=True,
                        predicted_peak_bytes=(2 << 30) - 1)
    s.budget.text = "60%"
    for i in range(2000):  # a large model's decisions
        s.decisions.add(value_id=i, action=types_pb2.Decision.RECOMPUTE,
                        module_path=f"blocks.{i}.mlp", op_kind="aten::gelu")
    o = r.outcomes.add(state=types_pb2.BudgetOutcome.FITS, fits=True,
                       budget_bytes=2 << 30, measured_peak_bytes=2 << 30)
    o.budget.text = "60%"
    r.knee.budget_bytes = 3 << 29
    r.knee.predicted_peak_bytes = 3 << 29
    r.knee.predicted_iteration_ms = 110.0
    r.pareto.add(budget_bytes=1 << 30)
    result = mutwo.Job.from_proto(job).result(32)
    text = str(result)
    assert len(text) < 1000 and text.count("\n") >= 3, text
    assert text.startswith("batch 32: baseline peak 3.00 GiB, 100.00 ms")
    assert "floor 1.00 GiB predicted" in text
    assert "knee (budget auto): budget 1.50 GiB" in text and "+10.0%" in text
    assert "budget 60% (2.00 GiB): FITS" in text
    assert "2000 recomputed" in text
    assert len(repr(result)) < 200 and len(repr(result.schedules[0])) < 300
    job_text = str(mutwo.Job.from_proto(job))
    assert job_text.startswith("job j9 SUCCEEDED: model vit")
    assert "  batch 32: baseline peak" in job_text and len(job_text) < 1200
    assert len(repr(mutwo.Job.from_proto(job))) < 200


def test_errors_carry_the_grpc_code_and_message(fake: Any) -> None:
    with mutwo.Client(fake.target) as client:
        with pytest.raises(mutwo.MutwoError) as e:
            client.job("nope")
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert e.value.details == 'job "nope" not found'
        assert "GetJob: NOT_FOUND" in str(e.value)
        with pytest.raises(mutwo.MutwoError) as e:
            client.submit("0" * 64, inputs=["x:float32[B,4]"],
                          batch_sizes=[8])
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(ValueError, match="x:float33"):
            client.submit("0" * 64, inputs=["x:float33[B]"], batch_sizes=[8])
    with mutwo.Client("127.0.0.1:1", timeout_s=2) as client:
        with pytest.raises(mutwo.MutwoError) as e:
            client.health()
        assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_server_from_mutwo_server_and_latest_job(fake: Any,
                                                monkeypatch: Any) -> None:
    monkeypatch.setenv("MUTWO_SERVER", fake.target)
    with mutwo.Client() as client:
        assert client.target == fake.target
        with pytest.raises(mutwo.MutwoError, match="has none yet"):
            client.job("latest")
        client.submit(Small(), inputs=["x:float32[B,4]"], batch_sizes=[8])
        client.submit(Small(), inputs=["x:float32[B,4]"], batch_sizes=[16])
        assert client.job("latest").job_id == "j2"
        assert client.job("-").job_id == "j2"
        with pytest.raises(ValueError, match="cancel needs the job's id"):
            client.cancel("latest")
    # An explicit target wins over the environment.
    with mutwo.Client("127.0.0.1:1", timeout_s=2) as client:
        assert client.target == "127.0.0.1:1"


def test_token_from_argument_environment_or_file(
        fake: Any, tmp_path: Any, monkeypatch: Any) -> None:
    assert mutwo.read_token("abc") == "abc"
    monkeypatch.setenv("MUTWO_TOKEN", "from-env")
    assert mutwo.read_token() == "from-env"
    token_file = tmp_path / "t"
    token_file.write_text("from-file\n")
    monkeypatch.setenv("MUTWO_TOKEN_FILE", str(token_file))
    assert mutwo.read_token() == "from-file"
    # Sent as a bearer token (to a loopback server without TLS: local
    # credentials).
    with mutwo.Client(fake.target) as client:
        client.submit(Small(), inputs=["x:float32[B,4]"], batch_sizes=[8])
    assert fake.metadata[-1]["authorization"] == "Bearer from-file"
    # Never in clear text to a remote server.
    with pytest.raises(ValueError, match="only over TLS"):
        mutwo.Client("192.0.2.1:50051", token="secret")


def test_shipped_stubs_are_fresh() -> None:
    """client/python/mutwo/v1 is what generate_stubs.sh --package makes from
    proto/ (run it after changing a .proto)."""
    if not shutil.which("protoc") or not shutil.which("grpc_python_plugin"):
        pytest.skip("protoc or grpc_python_plugin not installed")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([os.path.join(CLIENT_DIR, "generate_stubs.sh"),
                        "--package", tmp], check=True, capture_output=True)
        fresh = os.path.join(tmp, "mutwo", "v1")
        shipped = os.path.join(CLIENT_DIR, "mutwo", "v1")
        names = sorted(n for n in os.listdir(fresh) if n.endswith(".py")
                       and n != "__init__.py")
        assert names == sorted(n for n in os.listdir(shipped)
                               if n.endswith(".py") and n != "__init__.py")
        _, mismatch, errors = filecmp.cmpfiles(fresh, shipped, names,
                                               shallow=False)
        assert not mismatch and not errors, (
            f"stale stubs {mismatch + errors}: run "
            "client/python/generate_stubs.sh --package")


def test_model_file_is_named_as_the_cli_names_it(fake: Any,
                                                 tmp_path: Any) -> None:
    """`mutwo submit small.pt` names the model "small" (the server and the
    worker call it small.pt in their messages, `mutwo jobs` shows "small");
    the same file submitted from Python reads the same, not small.pt.pt."""
    path = tmp_path / "small.pt"
    torch.jit.script(Small()).save(str(path))
    with mutwo.Client(fake.target) as client:
        assert client.upload(path).name == "small"
        client.submit(str(path), inputs=["x:float32[B,4]"], batch_sizes=[2])
        assert fake.upload_names == ["small", "small"]
        assert fake.specs[-1].model_name == "small"
        assert client.jobs()[0].model_name == "small"
        # Bytes have no file name: "model", which the server calls model.pt.
        client.upload(path.read_bytes())
        assert fake.upload_names[-1] == "model"
        # A name given is kept as it is, as the CLI keeps --name.
        assert client.upload(path, name="small.pt").name == "small.pt"
        # Only ".pt" is the CLI's suffix.
        other = tmp_path / "small.pth"
        other.write_bytes(path.read_bytes())
        assert client.upload(other).name == "small.pth"


def test_submit_refuses_before_uploading(fake: Any, tmp_path: Any) -> None:
    """Client.submit checks the archive as the server would
    (mutwo/_model_archive.py; its messages are tested in
    test_model_archive.py) and uploads nothing for a job that cannot
    run."""
    two_inputs = tmp_path / "two_inputs.pt"
    torch.jit.script(TwoInputs()).save(str(two_inputs))
    pickle = tmp_path / "pickle.pt"
    torch.save(Small(), str(pickle))
    with mutwo.Client(fake.target) as client:
        with pytest.raises(ValueError,
                           match="model two_inputs.pt: forward's argument "
                           r"text \(Tensor\) has no --input spec"):
            client.submit(str(two_inputs), name="two_inputs",
                          inputs=["image:float32[B,3,8,8]"], batch_sizes=[2])
        with pytest.raises(ValueError, match="this is a torch.save pickle"):
            client.submit(str(pickle),
                          inputs=["x:float32[B,4]"], batch_sizes=[2])
        assert fake.models == {}  # nothing uploaded
        job = client.submit(str(two_inputs),
                            inputs=["text:float32[B,8]",
                                    "image:float32[B,3,8,8]"],
                            batch_sizes=[2])
        assert job.job_id == "j1" and len(fake.models) == 1


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(8, 4)

    def forward(self, image: torch.Tensor,
                text: torch.Tensor) -> torch.Tensor:
        return self.conv(image).mean(dim=(2, 3)) + self.fc(text)
