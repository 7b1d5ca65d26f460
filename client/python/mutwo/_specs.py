"""Text forms of job specs and credentials, as the mutwo CLI reads them.

The forms (`x:float32[B,3,224,224]`, `tokens:int64[B,128]{0,30000}`, `60%`,
`80%dev`, `4GiB`, `cross_entropy:y:int64[B]{0,10}`, `adam:lr=0.01`) are the
ones of common/parse.h; bad text raises ValueError naming the text.
"""
from __future__ import annotations

import os
import re
from typing import (TYPE_CHECKING, Any, Iterable, List, Optional, Sequence,
                    Union)


from mutwo.v1 import types_pb2

if TYPE_CHECKING:
    import grpc

CHUNK_BYTES = 1 << 20  # the server accepts chunks of at most 1 MiB
MAX_MESSAGE_BYTES = 64 << 20  # profiles and schedules can be large

_UNITS = {
    "": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
    "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4,
}
_DTYPES = {
    "float32": types_pb2.FLOAT32, "float64": types_pb2.FLOAT64,
    "float16": types_pb2.FLOAT16, "bfloat16": types_pb2.BFLOAT16,
    "int64": types_pb2.INT64, "int32": types_pb2.INT32,
    "int8": types_pb2.INT8, "uint8": types_pb2.UINT8, "bool": types_pb2.BOOL,
}
_FLOAT_DTYPES = {types_pb2.FLOAT32, types_pb2.FLOAT64, types_pb2.FLOAT16,
                 types_pb2.BFLOAT16}
_OPTIMIZERS = {
    "none": types_pb2.OptimizerSpec.NONE,
    "sgd": types_pb2.OptimizerSpec.SGD,
    "sgd_momentum": types_pb2.OptimizerSpec.SGD_MOMENTUM,
    "adam": types_pb2.OptimizerSpec.ADAM,
    "adamw": types_pb2.OptimizerSpec.ADAMW,
}
_FINAL_STATES = {types_pb2.Job.SUCCEEDED, types_pb2.Job.FAILED,
                 types_pb2.Job.CANCELLED}
BATCH_DIM = -1  # a TensorSpec dimension that stands for the batch size B
_MAX_BYTES = (2**63 - 1) // 2  # the largest size common/parse.cc accepts


def is_final(state: int) -> bool:
    """True for SUCCEEDED, FAILED and CANCELLED."""
    return state in _FINAL_STATES


def parse_bytes(text: Union[str, int]) -> int:
    """`123`, `4KB`, `1.5GiB` -> bytes (int). Raises ValueError."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2) not in _UNITS:
        raise ValueError(
            'size "%s": expected a number with an optional unit (B, KB, MB, '
            "GB, TB, KiB, MiB, GiB, TiB), like 4GiB or 123456" % text)
    try:
        value = float(m.group(1)) * _UNITS[m.group(2)]
    except ValueError:
        raise ValueError('size "%s": "%s" is not a number'
                         % (text, m.group(1))) from None
    if value > _MAX_BYTES:
        raise ValueError('size "%s": too large' % text)
    if value < 1:
        raise ValueError('size "%s": must be at least 1 byte' % text)
    return int(round(value))


def _number(text: str) -> float:
    """A number as common/parse.cc reads one (absl::SimpleAtod): Python's
    float() also takes `1_000`, which the CLI and the server refuse."""
    if "_" in text:
        raise ValueError("not a number: %r" % text)
    return float(text)


def format_bytes(n: float) -> str:
    """1.50 GiB, 12.00 MiB, 512 B."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= factor:
            return "%.2f %s" % (n / factor, unit)
    return "%d B" % n


def parse_budget(text: str) -> types_pb2.MemoryBudget:
    """`60%` (of the baseline peak), `80%dev` (of the device), bytes with
    a unit (`4GiB`, `512B`), `auto` (the knee of the Pareto curve) or
    `floor` (the lowest budget that fits; the service measures it); a bare
    number is ambiguous and refused, as in the mutwo CLI."""
    budget = types_pb2.MemoryBudget(text=str(text).strip())
    s = budget.text
    if s.lower() == "auto":
        return types_pb2.MemoryBudget(text="auto", knee=True)
    if s.lower() == "floor":
        return types_pb2.MemoryBudget(text="floor", floor=True)
    if re.fullmatch(r"[0-9.]+", s):
        raise ValueError('budget "%s": a bare number is ambiguous; say %s%% '
                         "or %sMiB or %sB" % (text, s, s, s))
    for suffix, field in (("%dev", "fraction_of_device"),
                          ("%", "fraction_of_baseline")):
        if s.lower().endswith(suffix):  # any case, as auto and floor
            try:
                percent = _number(s[:-len(suffix)])
            except ValueError:
                percent = float("nan")
            if not 0 < percent <= 100:
                raise ValueError('budget "%s": a percentage must be a number '
                                 "in (0, 100], like 60%%" % text)
            setattr(budget, field, percent / 100.0)
            return budget
    try:
        budget.bytes = parse_bytes(s)
    except ValueError:
        raise ValueError(
            'budget "%s": expected bytes (4GiB, 4000MB), a percentage of the '
            "baseline peak (60%%), of the device (80%%dev), auto or floor"
            % text
        ) from None
    return budget


def parse_tensor_spec(text: str) -> types_pb2.TensorSpec:
    """`x:float32[B,3,224,224]`, `tokens:int64[B,128]{0,30000}`."""
    m = re.fullmatch(
        r"\s*([A-Za-z0-9_.]+):([A-Za-z0-9]+)\[([^\]]*)\](?:\{([^}]*)\})?\s*",
        str(text))
    hint = ("expected NAME:DTYPE[DIMS]{LOW,HIGH}, like x:float32[B,3,224,224] "
            "or tokens:int64[B,128]{0,30000}")
    if not m:
        raise ValueError('input spec "%s": %s' % (text, hint))
    name, dtype, dims, value_range = m.groups()
    dtype = dtype.lower()
    if dtype not in _DTYPES:
        raise ValueError('input spec "%s": unknown dtype "%s"; use one of %s'
                         % (text, dtype, ", ".join(_DTYPES)))
    spec = types_pb2.TensorSpec(name=name, dtype=_DTYPES[dtype])
    for d in (x.strip() for x in dims.split(",") if dims.strip()):
        if d == "B":
            spec.dims.append(BATCH_DIM)
        elif d.isdigit() and int(d) > 0:
            spec.dims.append(int(d))
        else:
            raise ValueError('input spec "%s": dimension "%s" must be a '
                             "positive integer or B" % (text, d))
    if value_range is not None:
        parts = value_range.split(",")
        try:
            low, high = (_number(p) for p in parts)
        except ValueError:
            raise ValueError('input spec "%s": value range must be two '
                             "numbers, {LOW,HIGH}" % text) from None
        if not low < high:
            raise ValueError('input spec "%s": value range must have '
                             "LOW < HIGH" % text)
        spec.range.low, spec.range.high = low, high
    elif spec.dtype not in _FLOAT_DTYPES and spec.dtype != types_pb2.BOOL:
        raise ValueError('input spec "%s": integer input "%s" needs a value '
                         "range {LOW,HIGH}" % (text, name))
    return spec


_LOSS_KINDS = ("use mean, sum, model, cross_entropy:TARGET (like "
               "cross_entropy:y:int64[B]{0,1000}), chunked_cross_entropy:"
               "TARGET (the same without a whole log-softmax held) or "
               "mse:TARGET (like "
               "mse:z:float32[B,4]), optionally KIND@OUTPUT to read one dict "
               "entry or tuple element (like "
               "cross_entropy@logits:y:int64[B]{0,1000}), terms joined by + "
               "(like cross_entropy@logits:y:int64[B]{0,10}+mse@aux:z:"
               "float32[B,4])")


# The loss kinds that take a target, by name (common/parse.cc
# LossKindTakesTarget).
TARGET_LOSS_KINDS = {
    "cross_entropy": types_pb2.LossSpec.CROSS_ENTROPY,
    "chunked_cross_entropy": types_pb2.LossSpec.CHUNKED_CROSS_ENTROPY,
    "mse": types_pb2.LossSpec.MSE,
}


def _split_loss_terms(text: str) -> List[str]:
    """The `+`-separated terms; a `+` inside a target's brackets
    (`{0,1e+3}`) does not separate."""
    terms, depth, begin = [], 0, 0
    for i, c in enumerate(text):
        if c in "[{":
            depth += 1
        elif c in "]}" and depth > 0:
            depth -= 1
        elif c == "+" and depth == 0:
            terms.append(text[begin:i])
            begin = i + 1
    terms.append(text[begin:])
    return terms


def _parse_loss_term(text: str, term: str) -> types_pb2.LossSpec:
    s = term.strip()
    where = ('loss "%s"' % text if s == str(text).strip()
             else 'loss "%s", term "%s"' % (text, s))
    if not s:
        raise ValueError("%s: empty term; %s" % (where, _LOSS_KINDS))
    head, colon, rest = s.partition(":")
    kind_text, at, output = head.partition("@")
    if at and not output:
        raise ValueError("%s: expected a dict key or tuple index after "
                         "'@', like cross_entropy@out:y:int64[B,64,64]{0,21}"
                         % where)
    kinds = {"mean": types_pb2.LossSpec.MEAN, "sum": types_pb2.LossSpec.SUM,
             "model": types_pb2.LossSpec.MODEL}
    kind = kind_text.lower()
    if kind in kinds:
        if colon:
            raise ValueError("%s: %s takes no target (only cross_entropy, "
                             "chunked_cross_entropy and mse do)"
                             % (where, kind))
        return types_pb2.LossSpec(kind=kinds[kind], output=output)
    if kind in TARGET_LOSS_KINDS:
        example = kind + (":z:float32[B,4]" if kind == "mse"
                          else ":y:int64[B]{0,1000}")
        if not colon:
            raise ValueError("%s: %s needs a target spec after ':', like %s"
                             % (where, kind, example))
        try:
            target = parse_tensor_spec(rest)
        except ValueError as e:
            raise ValueError("%s: target %s" % (where, e)) from None
        if kind != "mse" and target.dtype != types_pb2.INT64:
            raise ValueError("%s: a %s target holds class "
                             "indices and must be int64, like "
                             "y:int64[B]{0,1000}" % (where, kind))
        if kind == "mse" and target.dtype not in _FLOAT_DTYPES:
            raise ValueError("%s: an mse target is compared with a "
                             "floating-point output and must be float32, "
                             "float64, float16 or bfloat16, like mse:%s:"
                             "float32[B,4]" % (where, target.name))
        return types_pb2.LossSpec(kind=TARGET_LOSS_KINDS[kind],
                                  target=target, output=output)
    raise ValueError('%s: unknown loss kind "%s"; %s'
                     % (where, kind_text, _LOSS_KINDS))


def parse_loss(text: Union[str, Sequence[str]]) -> types_pb2.LossSpec:
    """`KIND[@OUTPUT][:TARGET]`, as the CLI's --loss (docs/loss.md): `mean`,
    `sum`, `model`, `cross_entropy:y:int64[B]{0,1000}` (int64 class
    indices), `chunked_cross_entropy:y:int64[B,T]{0,V}` (the same, computed
    without a whole log-softmax: mutwo.chunked_cross_entropy) or
    `mse:z:float32[B,4]` (a float target of the output's shape); `KIND@OUTPUT` reads one dict entry or tuple element of the
    model's output (`cross_entropy@logits:y:int64[B]{0,1000}`, `mean@0`).
    Several terms, joined by `+` or given as a list, are summed
    (`LossSpec.terms`)."""
    if not isinstance(text, str):
        text = "+".join(text) if len(text) else "mean"
    texts = _split_loss_terms(str(text).strip())
    if len(texts) == 1:
        return _parse_loss_term(text, texts[0])
    loss = types_pb2.LossSpec(
        terms=[_parse_loss_term(text, t) for t in texts])
    names = [t.target.name for t in loss.terms if t.HasField("target")]
    for name in names:
        if names.count(name) > 1:
            raise ValueError('loss "%s": two loss terms name their target '
                             '"%s": give each term\'s target its own name'
                             % (text, name))
    return loss


def format_tensor_spec(spec: types_pb2.TensorSpec) -> str:
    """The text parse_tensor_spec reads back to `spec`."""
    dtype = {v: k for k, v in _DTYPES.items()}.get(spec.dtype, "?")
    dims = ",".join("B" if d == BATCH_DIM else str(d) for d in spec.dims)
    text = "%s:%s[%s]" % (spec.name, dtype, dims)
    if spec.HasField("range"):
        text += "{%g,%g}" % (spec.range.low, spec.range.high)
    return text


def format_loss(loss: types_pb2.LossSpec) -> str:
    """The text parse_loss reads back to `loss` (as the worker prints it)."""
    if len(loss.terms):
        return "+".join(format_loss(t) for t in loss.terms)
    kind = loss.kind if loss.kind != types_pb2.LossSpec.KIND_UNSPECIFIED \
        else types_pb2.LossSpec.MEAN
    text = types_pb2.LossSpec.Kind.Name(kind).lower()
    if loss.output:
        text += "@" + loss.output
    if kind in TARGET_LOSS_KINDS.values():
        text += ":" + format_tensor_spec(loss.target)
    return text


def parse_optimizer(text: str) -> types_pb2.OptimizerSpec:
    """`sgd`, `adam:lr=0.01`, `sgd_momentum:lr=0.1,momentum=0.9`,
    `adam:foreach` (the update's temporaries span all parameters at once,
    as torch.optim's foreach default on CUDA)."""
    kind, _, args = str(text).strip().partition(":")
    if kind not in _OPTIMIZERS:
        raise ValueError('optimizer "%s": use %s (optionally with '
                         ":lr=0.01,momentum=0.9,weight_decay=0.01,foreach)"
                         % (text, ", ".join(_OPTIMIZERS)))
    opt = types_pb2.OptimizerSpec(kind=_OPTIMIZERS[kind])
    fields = {"lr": "learning_rate", "momentum": "momentum",
              "weight_decay": "weight_decay"}
    for kv in filter(None, args.split(",")):
        if kv.strip() == "foreach":
            opt.foreach_update = True
            continue
        key, _, value = kv.partition("=")
        if key not in fields:
            raise ValueError('optimizer "%s": unknown setting "%s"; use lr, '
                             "momentum, weight_decay or foreach"
                             % (text, key))
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if number < 0:
            raise ValueError('optimizer "%s": "%s" must be '
                             "NAME=NON_NEGATIVE_NUMBER" % (text, kv))
        setattr(opt, fields[key], number)
    return opt


def make_job_spec(model_sha256: str,
                  inputs: Sequence[Union[str, types_pb2.TensorSpec]],
                  batch_sizes: Iterable[int],
                  budgets: Iterable[Union[str, types_pb2.MemoryBudget]] = (),
                  loss: Union[str, Sequence[str],
                              types_pb2.LossSpec] = "mean",
                  optimizer: Union[str, types_pb2.OptimizerSpec] = "sgd",
                  model_name: str = "", device_kind: str = "",
                  max_overhead: float = 0.0, warmup_iterations: int = 0,
                  measure_iterations: int = 0,
                  capacity: Optional[Union[str, types_pb2.MemoryBudget]] = None
                  ) -> types_pb2.JobSpec:
    """A JobSpec from the text forms (or ready protos) of its parts.
    `capacity` (`16GiB` or `95%dev`): what the max batch is predicted and
    verified for."""
    def as_proto(value: Any, parse: Any) -> Any:
        return parse(value) if isinstance(value, str) else value

    extra = {}
    if capacity is not None:
        c = as_proto(capacity, parse_budget)
        if c.WhichOneof("kind") not in ("bytes", "fraction_of_device"):
            raise ValueError('capacity "%s": give bytes (16GiB) or a fraction '
                             "of the device (95%%dev)" % capacity)
        extra["capacity"] = c
    return types_pb2.JobSpec(
        **extra,
        model_sha256=model_sha256,
        model_name=model_name,
        inputs=[as_proto(i, parse_tensor_spec) for i in inputs],
        loss=(loss if isinstance(loss, types_pb2.LossSpec)
              else parse_loss(loss)),
        optimizer=as_proto(optimizer, parse_optimizer),
        batch_sizes=[int(b) for b in batch_sizes],
        budgets=[as_proto(b, parse_budget) for b in budgets],
        max_overhead=max_overhead,
        device_kind=device_kind,
        warmup_iterations=warmup_iterations,
        measure_iterations=measure_iterations,
    )



_LOOPBACK = re.compile(
    r"^(?:dns:///|ipv4:|ipv6:)?(?:localhost|127(?:\.\d{1,3}){3}|\[::1\])"
    r"(?::\d+)?$", re.IGNORECASE)


def is_loopback(target: str) -> bool:
    """True for HOST:PORT on 127.0.0.0/8, [::1] or localhost."""
    return bool(_LOOPBACK.match(target))


def read_token(token: Optional[str] = None,
               token_file: Optional[str] = None) -> Optional[str]:
    """The bearer token: `token`, else the first line of `token_file`, else
    of the file named by MUTWO_TOKEN_FILE, else MUTWO_TOKEN; None if none.
    Errors name the file, never the token."""
    if token:
        return token.strip()
    path = token_file or os.environ.get("MUTWO_TOKEN_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                value = f.readline().strip()
        except OSError as e:
            raise ValueError(f"token file {path!r} cannot be read: "
                             f"{e.strerror}") from None
        if not value:
            raise ValueError(f"token file {path!r} has no token on its "
                             "first line")
        return value
    value = os.environ.get("MUTWO_TOKEN", "").strip()
    return value or None


def channel_credentials(target: str, token: Optional[str] = None,
                        tls_ca: Optional[str] = None
                        ) -> Optional[grpc.ChannelCredentials]:
    """Channel credentials as the mutwo CLI makes them (common/credentials.h):
    TLS verified by the PEM CA file `tls_ca` (else MUTWO_TLS_CA); the token
    as `authorization: Bearer` on every call; a token without TLS only to a
    loopback server (gRPC local credentials), else ValueError. None: an
    insecure channel."""
    import grpc  # only the client needs grpcio; apply and the specs do not
    tls_ca = tls_ca or os.environ.get("MUTWO_TLS_CA")
    call = grpc.access_token_call_credentials(token) if token else None
    if tls_ca:
        try:
            with open(tls_ca, "rb") as f:
                ssl = grpc.ssl_channel_credentials(root_certificates=f.read())
        except OSError as e:
            raise ValueError(f"tls_ca {tls_ca!r} cannot be read: "
                             f"{e.strerror}") from None
        return grpc.composite_channel_credentials(ssl, call) if call else ssl
    if not call:
        return None
    if not is_loopback(target):
        raise ValueError(f"a token is sent to {target} only over TLS: give "
                         "tls_ca (or MUTWO_TLS_CA) with the CA that signed "
                         "the server's certificate")
    return grpc.composite_channel_credentials(
        grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP),
        call)
