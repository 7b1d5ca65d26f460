"""The torch-free archive check of the Python client (mutwo/_model_archive,
a port of common/model_archive) over real archives torch wrote: the same
refusals with the same messages as the C++ tests
(tests/common/model_archive_test.cc, forward_binding_test.cc assert these
literal strings), and Client.submit refusing before any upload."""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
import torch

import mutwo
from mutwo import _model_archive as archive


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None,
                k: int = 3) -> torch.Tensor:
        y = self.fc(x)
        if mask is not None:
            y = y * mask
        return y * k


class TwoInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, image: torch.Tensor,
                text: torch.Tensor) -> torch.Tensor:
        return self.conv(image).mean(dim=(2, 3)) + self.fc(text)


class Scalars(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, steps: int, scale: float = 2.0,
                flag: bool = False) -> torch.Tensor:
        for _ in range(steps):
            x = self.fc(x)
        return x * scale if flag else x


@pytest.fixture(scope="module")
def files(tmp_path_factory: Any) -> Dict[str, bytes]:
    out = tmp_path_factory.mktemp("archives")
    torch.jit.script(Net()).save(str(out / "scripted.pt"))
    torch.jit.script(TwoInputs()).save(str(out / "two_inputs.pt"))
    torch.jit.script(Scalars()).save(str(out / "scalars.pt"))
    seq = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                              torch.nn.Linear(8, 2))
    torch.jit.trace(seq, torch.randn(2, 4)).save(str(out / "traced.pt"))
    torch.save(Net(), str(out / "pickle.pt"))
    torch.save(Net().state_dict(), str(out / "legacy_pickle.pt"),
               _use_new_zipfile_serialization=False)
    with zipfile.ZipFile(out / "odd.pt", "w") as z:
        z.writestr("odd/data.pkl", b"\x80\x02c__torch__\nOdd\nq\x00)\x81.")
        z.writestr("odd/code/__torch__.py",
                   "class Odd(Module):\n  def forward(self: __torch__.Odd,\n"
                   "    *args) -> Tensor:\n    return args[0]\n",
                   compress_type=zipfile.ZIP_DEFLATED)
    data = {p.name: p.read_bytes() for p in Path(out).iterdir()}
    data["truncated.pt"] = data["scripted.pt"][:len(data["scripted.pt"]) // 2]
    return data


def spec(name: str) -> Any:
    return mutwo.parse_tensor_spec(f"{name}:float32[B,4]")


def signature(data: bytes) -> str:
    schema = archive.read_forward_schema(data)
    assert schema.known, schema.unknown_reason
    return archive.forward_signature(schema.arguments)


def test_forward_is_read_from_scripted_and_traced_code(files: Any) -> None:
    assert signature(files["scripted.pt"]) == (
        "forward(x: Tensor, mask: Optional[Tensor] = None, k: int = 3)")
    assert archive.read_forward_schema(files["scripted.pt"]).class_name == \
        "__torch__.test_model_archive.Net"
    assert signature(files["two_inputs.pt"]) == \
        "forward(image: Tensor, text: Tensor)"
    assert signature(files["traced.pt"]) == "forward(input: Tensor)"
    assert signature(files["scalars.pt"]) == (
        "forward(x: Tensor, steps: int, scale: float = 2., flag: bool = "
        "False)")
    odd = archive.read_forward_schema(files["odd.pt"])
    assert not odd.known and "*args" in odd.unknown_reason
    # Not read: not refused (the server and the worker decide).
    archive.check_model_inputs(files["odd.pt"], "odd",
                               [spec("a"), spec("b"), spec("c")])


def test_the_servers_refusals_with_its_messages(files: Any) -> None:
    archive.check_model_inputs(files["two_inputs.pt"], "two_inputs",
                               [spec("text"), spec("image")])
    archive.check_model_inputs(files["scripted.pt"], "net", [spec("x")])
    with pytest.raises(archive.ArchiveError) as e:
        archive.check_model_inputs(files["two_inputs.pt"], "two_inputs",
                                   [spec("image")])
    assert str(e.value) == (
        "model two_inputs: forward's argument text (Tensor) has no --input "
        "spec and no default: give --input text:DTYPE[DIMS] "
        "(forward(image: Tensor, text: Tensor))")
    for name in ("pickle.pt", "legacy_pickle.pt"):
        with pytest.raises(archive.ArchiveError,
                           match=r"this is a torch.save pickle.*"
                           r"torch.jit.script\(model\).save\(path\)"):
            archive.check_model_archive(files[name], name)
    with pytest.raises(archive.ArchiveError) as e:
        archive.check_model_inputs(files["truncated.pt"], "cut", [spec("x")])
    assert str(e.value).startswith(
        "model cut: cannot load the TorchScript archive (truncated or "
        "corrupt?)")
    with pytest.raises(archive.ArchiveError, match="the file is empty"):
        archive.check_model_archive(b"", "empty")


def test_a_spec_for_an_int_float_or_bool_argument_is_refused(
        files: Any) -> None:
    with pytest.raises(archive.ArchiveError) as e:
        archive.check_model_inputs(files["scalars.pt"], "scalars",
                                   [spec("x"), spec("steps")])
    assert str(e.value) == (
        "model scalars: --input steps:float32[B,4] gives a tensor to "
        "forward's argument steps, declared int: an --input spec is always "
        "a tensor; give steps a default in forward, or declare it Tensor "
        "(forward(x: Tensor, steps: int, scale: float = 2., flag: bool = "
        "False))")
    with pytest.raises(archive.ArchiveError,
                       match="argument k, declared int: an --input spec is "
                       r"always a tensor; leave k out \(its default is 3\)"):
        archive.check_model_inputs(files["scripted.pt"], "net",
                                   [spec("x"), spec("k")])
    with pytest.raises(archive.ArchiveError,
                       match=r"forward's argument steps \(int\) has no "
                       "default, and an --input spec"):
        archive.check_model_inputs(files["scalars.pt"], "scalars",
                                   [spec("x")])
