"""What can be known of a TorchScript archive without torch, so that
`Client.submit` refuses a job that cannot run before it uploads the model.

A port of the C++ check the server runs at submit and the CLI before its
upload (common/model_archive.cc, common/zip_archive.cc,
common/forward_binding.cc), with the same rules and the same messages:
- the file is a TorchScript archive at all (not empty, not a torch.save
  pickle, a readable zip directory, not a zip bomb);
- forward's arguments, read from the archive's code (the class data.pkl
  pickles first, its `def forward(self, ...)` in `code/__torch__/...py`);
  code that cannot be read this way leaves them unknown (never refused:
  the server and the worker decide);
- the input specs bound to those arguments: by name when any spec names
  one, else by position; Optional or defaulted arguments may be left out;
  a spec (always a tensor) is refused for an argument declared int, float,
  bool or another non-tensor type.
Pure functions over bytes; thread-safe. tests/test_model_archive.py checks
the messages against the C++ tests' literal strings.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Callable, List, Optional, Sequence, Tuple

from mutwo._specs import BATCH_DIM, _DTYPES, format_bytes

MAX_INFLATION_RATIO = 8
MIN_INFLATION_ALLOWANCE_BYTES = 64 << 20
_MAX_CODE_RECORD_BYTES = 64 << 20
_MAX_PICKLE_RECORD_BYTES = 256 << 20

_PICKLE_NOT_TORCHSCRIPT = (
    "this is a torch.save pickle (a pickled module or state dict), not "
    "TorchScript: save the model with torch.jit.script(model).save(path), "
    "or torch.jit.trace(model, example_inputs).save(path) when it does not "
    "script")

_END_OF_DIRECTORY = 0x06054b50
_ZIP64_END_OF_DIRECTORY = 0x06064b50
_ZIP64_LOCATOR = 0x07064b50
_DIRECTORY_ENTRY = 0x02014b50
_LOCAL_HEADER = 0x04034b50
_ZIP64_MARKER = 0xffffffff
_SPEC_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


class ArchiveError(ValueError):
    """The archive is refused; the message is the server's."""


@dataclasses.dataclass
class ForwardArgument:
    name: str
    type: str  # TorchScript's annotation: "Tensor", "Optional[Tensor]"
    default_value: Optional[str] = None  # as printed: "None", "3"


@dataclasses.dataclass
class ForwardSchema:
    known: bool = False
    unknown_reason: str = ""
    class_name: str = ""
    arguments: List[ForwardArgument] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Record:
    name: str
    method: int
    compressed_bytes: int
    uncompressed_bytes: int
    local_header_offset: int
    crc32: int


def _le(data: bytes, offset: int, width: int) -> int:
    return int.from_bytes(data[offset:offset + width], "little")


def _corrupt(what: str) -> ArchiveError:
    return ArchiveError("not a readable zip archive: " + what)


def _records(data: bytes) -> List[_Record]:
    if len(data) < 22:
        raise _corrupt("shorter than an end-of-central-directory record")
    lowest = max(0, len(data) - 22 - 0xffff)
    end = len(data) - 22
    while _le(data, end, 4) != _END_OF_DIRECTORY:
        if end == lowest:
            raise _corrupt("no end-of-central-directory record")
        end -= 1
    entries = _le(data, end + 10, 2)
    offset = _le(data, end + 16, 4)
    if end >= 20 and _le(data, end - 20, 4) == _ZIP64_LOCATOR:
        zip64_end = _le(data, end - 20 + 8, 8)
        if (zip64_end > len(data) or len(data) - zip64_end < 56 or
                _le(data, zip64_end, 4) != _ZIP64_END_OF_DIRECTORY):
            raise _corrupt("zip64 end record out of the archive")
        entries = _le(data, zip64_end + 32, 8)
        offset = _le(data, zip64_end + 48, 8)
    out: List[_Record] = []
    at = offset
    for i in range(entries):
        if (at > len(data) or len(data) - at < 46 or
                _le(data, at, 4) != _DIRECTORY_ENTRY):
            raise _corrupt(f"central directory entry {i} out of the archive")
        name_bytes = _le(data, at + 28, 2)
        extra_bytes = _le(data, at + 30, 2)
        comment_bytes = _le(data, at + 32, 2)
        if len(data) - at < 46 + name_bytes + extra_bytes + comment_bytes:
            raise _corrupt(f"central directory entry {i} out of the archive")
        sizes = [_le(data, at + 24, 4), _le(data, at + 20, 4),
                 _le(data, at + 42, 4)]
        extra = at + 46 + name_bytes
        field = extra
        while field + 4 <= extra + extra_bytes:
            field_bytes = _le(data, field + 2, 2)
            if _le(data, field, 2) == 0x0001:
                value = field + 4
                value_end = min(value + field_bytes, extra + extra_bytes)
                for k in range(3):
                    if sizes[k] == _ZIP64_MARKER and value + 8 <= value_end:
                        sizes[k] = _le(data, value, 8)
                        value += 8
            field += 4 + field_bytes
        out.append(_Record(
            name=data[at + 46:at + 46 + name_bytes].decode("utf-8",
                                                           "replace"),
            method=_le(data, at + 10, 2), compressed_bytes=sizes[1],
            uncompressed_bytes=sizes[0], local_header_offset=sizes[2],
            crc32=_le(data, at + 16, 4)))
        at += 46 + name_bytes + extra_bytes + comment_bytes
    return out


def _read_record(data: bytes, record: _Record, max_bytes: int) -> bytes:
    at = record.local_header_offset
    if at > len(data) or len(data) - at < 30 or \
            _le(data, at, 4) != _LOCAL_HEADER:
        raise _corrupt(f"record {record.name}: local header out of the "
                       "archive")
    start = at + 30 + _le(data, at + 26, 2) + _le(data, at + 28, 2)
    if start > len(data) or len(data) - start < record.compressed_bytes:
        raise _corrupt(f"record {record.name}: data out of the archive")
    if record.uncompressed_bytes > max_bytes:
        raise ArchiveError(f"record {record.name} inflates to "
                           f"{record.uncompressed_bytes} bytes, over "
                           f"{max_bytes}")
    compressed = data[start:start + record.compressed_bytes]
    if record.method == 0:
        out = compressed
    elif record.method == 8:
        inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        try:
            out = inflater.decompress(compressed,
                                      record.uncompressed_bytes + 1)
        except zlib.error:
            out = b""
        if not inflater.eof or len(out) != record.uncompressed_bytes:
            raise _corrupt(f"record {record.name} does not inflate to its "
                           "stated size")
    else:
        raise _corrupt(f"record {record.name}: compression method "
                       f"{record.method} (only stored and deflated are read)")
    if len(out) != record.uncompressed_bytes:
        raise _corrupt(f"record {record.name}: size differs from the stated")
    if zlib.crc32(out) != record.crc32:
        raise _corrupt(f"record {record.name}: CRC-32 mismatch")
    return out


def _refuse(what: str, message: str) -> ArchiveError:
    return ArchiveError(f"model {what}: {message}")


def check_model_archive(data: bytes, what: str) -> None:
    """ArchiveError, naming `what`, for an empty file, a torch.save pickle,
    bytes that are no zip archive, a truncated or corrupt zip directory, or
    an archive that inflates beyond MAX_INFLATION_RATIO."""
    if not data:
        raise _refuse(what, "the file is empty")
    if len(data) >= 2 and data[0] == 0x80 and data[1] <= 5:
        raise _refuse(what, _PICKLE_NOT_TORCHSCRIPT)
    if len(data) < 22 or data[:4] != b"PK\x03\x04":
        raise _refuse(what, "not a TorchScript archive (not a zip file; save "
                      "it with torch.jit.script(model).save(path))")
    try:
        records = _records(data)
    except ArchiveError as e:
        raise _refuse(what, "cannot load the TorchScript archive (truncated "
                      f"or corrupt?): {e}") from None
    has_code = any("/code/" in r.name or r.name.startswith("code/")
                   for r in records)
    has_data_pickle = any(r.name.endswith("data.pkl") for r in records)
    if has_data_pickle and not has_code:
        raise _refuse(what, _PICKLE_NOT_TORCHSCRIPT)
    cap = 1 << 62
    inflated = 0
    for r in records:
        inflated = min(inflated + min(r.uncompressed_bytes, cap), cap)
    allowed = max(MAX_INFLATION_RATIO * len(data),
                  MIN_INFLATION_ALLOWANCE_BYTES)
    if inflated > allowed:
        raise _refuse(
            what, f"refused as a zip bomb: the archive inflates to "
            f"{format_bytes(inflated)} from {format_bytes(len(data))} "
            "(torch.jit.save stores tensors uncompressed, so a model "
            f"inflates to about its file size; at most {MAX_INFLATION_RATIO}"
            f"x or {format_bytes(MIN_INFLATION_ALLOWANCE_BYTES)} is loaded)")


def _scan_code(text: str, start: int,
               visit: Callable[[int, str, int], bool]) -> int:
    """Calls visit(i, c, depth) for each character outside string literals
    from `start` on; the first i where it returns True, else -1."""
    depth = 0
    quote = ""
    i = start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
            i += 1
            continue
        if c in "\"'":
            quote = c
            i += 1
            continue
        if visit(i, c, depth):
            return i
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        i += 1
    return -1


def _split_parenthesised(text: str, open_at: int) -> Optional[List[str]]:
    parts: List[str] = []
    part_start = [open_at + 1]

    def visit(i: int, c: str, depth: int) -> bool:
        if depth != 1:
            return False
        if c in ")]}":
            return True
        if c == ",":
            parts.append(text[part_start[0]:i])
            part_start[0] = i + 1
        return False

    close = _scan_code(text, open_at, visit)
    if close < 0:
        return None
    parts.append(text[part_start[0]:close])
    return parts


def _find_top_level(text: str, target: str) -> int:
    return _scan_code(text, 0, lambda _, c, depth: c == target and depth == 0)


def _is_identifier(text: str) -> bool:
    return bool(text) and not text[0].isdigit() and all(
        c.isascii() and (c.isalnum() or c == "_") for c in text)


def _unknown(reason: str) -> ForwardSchema:
    return ForwardSchema(known=False, unknown_reason=reason)


def _forward_of_class(code: str, name: str) -> ForwardSchema:
    header = f"class {name}("
    if code.startswith(header):
        class_at = 0
    else:
        class_at = code.find("\n" + header)
        if class_at < 0:
            return _unknown(f"no `class {name}` in its code")
        class_at += 1
    class_end = class_at
    while True:
        class_end = code.find("\n", class_end)
        if class_end < 0:
            class_end = len(code)
            break
        class_end += 1
        if class_end < len(code) and code[class_end] not in " \n":
            break
    body = code[class_at:class_end]
    definition = "\n  def forward("
    at = body.find(definition)
    if at < 0:
        return _unknown(f"class {name} defines no forward")
    parts = _split_parenthesised(body, at + len(definition) - 1)
    if not parts:
        return _unknown("forward's parameter list does not close")
    schema = ForwardSchema(known=True)
    for i, raw in enumerate(parts):
        part = raw.strip()
        colon = _find_top_level(part, ":")
        argument_name = (part if colon < 0 else part[:colon]).strip()
        if i == 0:
            if argument_name != "self":
                return _unknown("forward's first parameter is not self")
            continue
        if colon < 0 or not _is_identifier(argument_name):
            return _unknown(f"forward's parameter `{part}` is not "
                            "`NAME: TYPE[=DEFAULT]`")
        rest = part[colon + 1:]
        equals = _find_top_level(rest, "=")
        type_text = (rest if equals < 0 else rest[:equals]).strip()
        if not type_text:
            return _unknown(f"forward's parameter {argument_name} has no "
                            "type")
        schema.arguments.append(ForwardArgument(
            argument_name, type_text,
            rest[equals + 1:].strip() if equals >= 0 else None))
    return schema


def _first_global(pickle: bytes) -> Tuple[str, str]:
    if len(pickle) < 3 or pickle[0] != 0x80 or pickle[2:3] != b"c":
        raise ArchiveError("data.pkl does not start with a GLOBAL")
    module_end = pickle.find(b"\n", 3)
    if module_end < 0:
        raise ArchiveError("data.pkl's GLOBAL has no module")
    name_end = pickle.find(b"\n", module_end + 1)
    if name_end < 0:
        raise ArchiveError("data.pkl's GLOBAL has no name")
    return (pickle[3:module_end].decode("utf-8", "replace"),
            pickle[module_end + 1:name_end].decode("utf-8", "replace"))


def read_forward_schema(data: bytes) -> ForwardSchema:
    """forward's arguments of the archive's top-level module; never raises
    (code that is not read gives known == False)."""
    try:
        records = _records(data)
        pickle_record = next(
            (r for r in records if len(r.name.split("/")) == 2 and
             r.name.split("/")[1] == "data.pkl"), None)
        if pickle_record is None:
            return _unknown("no ROOT/data.pkl record")
        root = pickle_record.name.split("/")[0]
        module, name = _first_global(_read_record(
            data, pickle_record, _MAX_PICKLE_RECORD_BYTES))
        if not module.startswith("__torch__"):
            return _unknown(f"data.pkl's class {module}.{name} is not "
                            "TorchScript's (__torch__)")
        code_name = f"{root}/code/{module.replace('.', '/')}.py"
        code = next((r for r in records if r.name == code_name), None)
        if code is None:
            return _unknown(f"no record {code_name}")
        text = _read_record(data, code, _MAX_CODE_RECORD_BYTES).decode(
            "utf-8", "replace")
    except ArchiveError as e:
        return _unknown(str(e))
    schema = _forward_of_class(text, name)
    schema.class_name = f"{module}.{name}"
    return schema


def can_be_left_out(argument: ForwardArgument) -> bool:
    return (argument.default_value is not None or
            argument.type.startswith("Optional["))


def _takes_tensor(type_text: str) -> bool:
    return type_text in ("Tensor", "Optional[Tensor]", "Any")


def forward_signature(arguments: Sequence[ForwardArgument]) -> str:
    parts = []
    for a in arguments:
        text = f"{a.name}: {a.type}"
        if a.default_value is not None:
            text += f" = {a.default_value}"
        parts.append(text)
    return f"forward({', '.join(parts)})"


def format_tensor_spec(spec: Any) -> str:
    dims = ",".join("B" if d == BATCH_DIM else str(d) for d in spec.dims)
    text = f"{spec.name}:{_SPEC_DTYPE_NAMES.get(spec.dtype, '?')}[{dims}]"
    if spec.HasField("range"):
        text += "{%g,%g}" % (spec.range.low, spec.range.high)
    return text


def bind_specs_to_arguments(arguments: Sequence[ForwardArgument],
                            specs: Sequence[Any]) -> List[int]:
    """For each argument, the index of its spec in `specs`, or -1 when it
    is left out; ArchiveError as common/forward_binding.cc refuses."""
    n = len(arguments)
    signature = forward_signature(arguments)
    if len(specs) > n:
        raise ArchiveError(f"forward takes {n} inputs, got {len(specs)} "
                           f"--input specs: {signature}")
    position_of = {a.name: i for i, a in enumerate(arguments)}
    spec_at = [-1] * n
    if not any(s.name in position_of for s in specs):
        for i in range(len(specs)):
            spec_at[i] = i
    else:
        for k, s in enumerate(specs):
            if s.name not in position_of:
                raise ArchiveError(
                    f"--input {s.name} names no argument of {signature} "
                    "(specs are matched by name when any names an argument)")
            if spec_at[position_of[s.name]] >= 0:
                raise ArchiveError(
                    f"two --input specs for forward's argument {s.name}")
            spec_at[position_of[s.name]] = k
    for i, a in enumerate(arguments):
        if spec_at[i] >= 0 and not _takes_tensor(a.type):
            if not can_be_left_out(a):
                what_to_do = f"give {a.name} a default in forward"
            elif a.default_value is not None:
                what_to_do = (f"leave {a.name} out (its default is "
                              f"{a.default_value})")
            else:
                what_to_do = f"leave {a.name} out (it is Optional: None)"
            raise ArchiveError(
                f"--input {format_tensor_spec(specs[spec_at[i]])} gives a "
                f"tensor to forward's argument {a.name}, declared {a.type}: "
                f"an --input spec is always a tensor; {what_to_do}, or "
                f"declare it Tensor ({signature})")
        if spec_at[i] < 0 and not can_be_left_out(a) and \
                not _takes_tensor(a.type):
            raise ArchiveError(
                f"forward's argument {a.name} ({a.type}) has no default, and "
                "an --input spec (always a tensor) cannot give it one: give "
                f"{a.name} a default in forward, or declare it Tensor "
                f"({signature})")
        if spec_at[i] < 0 and not can_be_left_out(a):
            raise ArchiveError(
                f"forward's argument {a.name} ({a.type}) has no --input spec "
                f"and no default: give --input {a.name}:DTYPE[DIMS] "
                f"({signature})")
    return spec_at


def check_model_inputs(data: bytes, what: str,
                       inputs: Sequence[Any]) -> ForwardSchema:
    """check_model_archive, then `inputs` (TensorSpec messages) bound to
    forward's arguments where they are known; ArchiveError prefixed
    `model WHAT: `. Returns the schema (known tells whether the binding was
    checked)."""
    check_model_archive(data, what)
    schema = read_forward_schema(data)
    if schema.known:
        try:
            bind_specs_to_arguments(schema.arguments, inputs)
        except ArchiveError as e:
            raise _refuse(what, str(e)) from None
    return schema
