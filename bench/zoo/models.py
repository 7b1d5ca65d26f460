#!/usr/bin/env python3
"""mutwo's model-zoo conformance suite: scripts the suite's models.

    models.py --tier cpu|gpu --out DIR [--models a,b] [--cpu-max-params-m N]

Writes DIR/<name>.pt (torch.jit.script(model).save) and DIR/manifest.json:
one entry per model with its family, params, the `mutwo-worker` flags
(`--input` specs, `--loss`, batch size) and either the model path or the
one-line reason it has none (scripting error, or the CPU tier's size rule).

The suite:
  * every torchvision classification model (torchvision.models.list_models,
    or the public builders of torchvision.models where that does not exist)
    and every torchvision segmentation model, built with weights=None;
  * the families written here: GPT-style decoder, nn.TransformerEncoder
    encoder, 2-layer LSTM language model, U-Net (nearest interpolate in the
    decoder), mixture-of-experts MLP with top-1 routing.
All models are saved in train mode: the suite trains them.

Tiers:
  cpu  CI: batch 2, 10 classes, each torchvision model at the smallest
       square input (from CPU_SIZES) its eager forward accepts, small repo
       families. Size rule: a torchvision model is in the CPU tier when its
       parameter count (at 10 classes) is at most --cpu-max-params-m
       millions OR it is the smallest model of its family (the torchvision
       module its builder lives in), AND its train-mode forward accepts a
       square input of at most 128 px (CPU_SIZES; in its default config,
       else in a CPU_FALLBACK_CONFIGS config such as inception_v3's
       aux_logits=False, recorded as the entry's "config"). Every other one
       is listed with "cpu tier: excluded by size rule, covered on GPU".
  gpu  realistic: batch 32, 224x224 (inception_v3 299x299), 1000 classes;
       segmentation 21 classes at 256x256; repo families at realistic sizes.

Works with torch 1.13 / torchvision 0.14 and torch 2.x / torchvision 0.2x.
"""
import argparse
import inspect
import json
import os
import sys
import time
import warnings
import zlib
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

# CPU tier: candidate square input sizes; a torchvision model that accepts
# none of them (in its default config or a fallback config) is excluded by
# the size rule.
CPU_SIZES = [32, 48, 56, 64, 75, 80, 96, 112, 128]
# Tried in order when the default config accepts no CPU size: inception_v3's
# auxiliary head needs 299x299 in train mode, its trunk takes 75x75.
CPU_FALLBACK_CONFIGS = [{"aux_logits": False}]
DEFAULT_CPU_MAX_PARAMS_M = 5.0
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


# --------------------------------------------------------------------------
# Families written in the repo.

class CausalSelfAttentionSdpa(nn.Module):
    """Causal self-attention through F.scaled_dot_product_attention."""

    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.attn_dropout = dropout
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        p = self.attn_dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


class CausalSelfAttentionMasked(nn.Module):
    """The same attention with an explicit causal mask and softmax (torch
    without scaled_dot_product_attention, e.g. 1.13)."""

    def __init__(self, d: int, heads: int, dropout: float, max_t: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        self.register_buffer(
            "mask", torch.tril(torch.ones(max_t, max_t, dtype=torch.bool)),
            persistent=False)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        hd = c // self.heads
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / (hd ** 0.5))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


class GptBlock(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float, max_t: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        if HAS_SDPA:
            self.attn = CausalSelfAttentionSdpa(d, heads, dropout)
        else:
            self.attn = CausalSelfAttentionMasked(d, heads, dropout, max_t)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(),
                                 nn.Linear(4 * d, d), nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    """GPT-style decoder: token + position embedding, pre-LN blocks with
    causal self-attention, final LayerNorm, LM head tied to the embedding."""

    def __init__(self, vocab: int, max_t: int, d: int, layers: int,
                 heads: int, dropout: float = 0.1):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_t, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            [GptBlock(d, heads, dropout, max_t) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class Encoder(nn.Module):
    """nn.TransformerEncoder over float inputs [B, T, D] (batch_first)."""

    def __init__(self, d: int, heads: int, ff: int, layers: int):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.1,
                                           batch_first=True)
        kwargs = {}
        if "enable_nested_tensor" in inspect.signature(
                nn.TransformerEncoder.__init__).parameters:
            kwargs["enable_nested_tensor"] = False
        self.encoder = nn.TransformerEncoder(layer, layers, **kwargs)

    def forward(self, x):
        return self.encoder(x)


class LstmLm(nn.Module):
    """Embedding, 2-layer nn.LSTM (batch_first), dropout, linear head."""

    def __init__(self, vocab: int, d: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True,
                            dropout=0.2)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        out, _ = self.lstm(self.drop(self.embed(tokens)))
        return self.head(self.drop(out))


class UnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    def forward(self, x):
        return self.body(x)


class Unet(nn.Module):
    """U-Net: conv blocks and max-pool down, F.interpolate(scale_factor=2.0)
    (nearest) up, skip concatenation, 1x1 conv to the output channels."""

    def __init__(self, base: int, depth: int, out_channels: int = 2):
        super().__init__()
        chans = [base * 2 ** i for i in range(depth + 1)]
        self.down = nn.ModuleList(
            [UnetBlock(3 if i == 0 else chans[i - 1], chans[i])
             for i in range(depth)])
        self.bottom = UnetBlock(chans[depth - 1], chans[depth])
        self.up = nn.ModuleList(
            [UnetBlock(chans[i + 1] + chans[i], chans[i])
             for i in reversed(range(depth))])
        self.head = nn.Conv2d(base, out_channels, 1)

    def forward(self, x):
        skips: List[torch.Tensor] = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottom(x)
        i = len(skips) - 1
        for block in self.up:
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
            x = block(torch.cat([x, skips[i]], dim=1))
            i -= 1
        return self.head(x)


class Expert(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class MoeLayer(nn.Module):
    """Top-1 routed mixture of experts: router logits -> argmax; per expert
    nonzero/index_select its tokens, run it, scale by the gate probability,
    index_add back."""

    def __init__(self, d: int, hidden: int, experts: int):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(
            [Expert(d, hidden) for _ in range(experts)])

    def forward(self, x):
        b, t, d = x.size()
        tokens = self.ln(x).reshape(b * t, d)
        probs = F.softmax(self.router(tokens), dim=-1)
        choice = torch.argmax(probs, dim=-1)
        gate = probs.gather(1, choice.unsqueeze(1))
        out = torch.zeros_like(tokens)
        e = 0
        for expert in self.experts:
            idx = torch.nonzero(choice == e).squeeze(1)
            y = expert(torch.index_select(tokens, 0, idx))
            y = y * torch.index_select(gate, 0, idx)
            out = out.index_add(0, idx, y)
            e += 1
        return x + out.view(b, t, d)


class Moe(nn.Module):
    def __init__(self, d: int, hidden: int, experts: int, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(
            [MoeLayer(d, hidden, experts) for _ in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


# Repo families per tier: constructor, inputs, loss, batch.
def repo_models(tier):
    cpu = tier == "cpu"
    b = 2 if cpu else 32
    out = []
    v, t = (256, 32) if cpu else (50257, 512)
    out.append(dict(
        name="gpt", family="gpt",
        build=lambda: Gpt(v, t, *((64, 2, 2) if cpu else (768, 12, 12))),
        inputs=[f"idx:int64[B,{t}]{{0,{v}}}"],
        loss=f"cross_entropy:y:int64[B,{t}]{{0,{v}}}", batch=b))
    d, t2 = (32, 16) if cpu else (768, 512)
    out.append(dict(
        name="transformer_encoder", family="transformer_encoder",
        build=lambda: Encoder(d, *((4, 64, 2) if cpu else (12, 3072, 12))),
        inputs=[f"x:float32[B,{t2},{d}]"], loss="mean", batch=b))
    lv, lt = (256, 32) if cpu else (10000, 128)
    out.append(dict(
        name="lstm_lm", family="lstm",
        build=lambda: LstmLm(lv, *((32, 64) if cpu else (1024, 1024))),
        inputs=[f"tokens:int64[B,{lt}]{{0,{lv}}}"],
        loss=f"cross_entropy:y:int64[B,{lt}]{{0,{lv}}}", batch=b))
    us = 32 if cpu else 256
    out.append(dict(
        name="unet", family="unet",
        build=lambda: Unet(*((8, 3) if cpu else (64, 4))),
        inputs=[f"x:float32[B,3,{us},{us}]"], loss="mean", batch=b))
    md, mt = (32, 16) if cpu else (1024, 512)
    out.append(dict(
        name="moe", family="moe",
        build=lambda: Moe(md, *((64, 4, 2) if cpu else (4096, 8, 2))),
        inputs=[f"x:float32[B,{mt},{md}]"], loss="mean", batch=b))
    return out


# --------------------------------------------------------------------------
# torchvision.

def classification_builders():
    """name -> builder for every torchvision classification model."""
    m = torchvision.models
    if hasattr(m, "list_models"):
        names = m.list_models(module=m)
        return {n: m.get_model_builder(n) for n in names}
    return _public_builders(m)


def segmentation_builders():
    m = torchvision.models
    s = torchvision.models.segmentation
    if hasattr(m, "list_models"):
        return {n: m.get_model_builder(n) for n in m.list_models(module=s)}
    return _public_builders(s)


def _public_builders(module):
    """Public lowercase functions of the module that take `weights` (or, in
    older torchvision, `pretrained`): the model builders."""
    out = {}
    for n in sorted(dir(module)):
        f = getattr(module, n)
        if n.startswith("_") or not n[0].islower() or not inspect.isfunction(f):
            continue
        params = inspect.signature(f).parameters
        if "weights" in params or "pretrained" in params:
            out[n] = f
    return out


def family_of(builder):
    return builder.__module__.rsplit(".", 1)[-1]


class SkipInit:
    """Makes torch.nn.init's in-place initialisers no-ops (parameter
    counting only: a 600M-parameter model builds in a second)."""

    def __enter__(self):
        self.saved = {n: f for n, f in vars(torch.nn.init).items()
                      if n.endswith("_") and not n.startswith("_")
                      and callable(f)}
        for n in self.saved:
            setattr(torch.nn.init, n, lambda t, *a, **k: t)

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            setattr(torch.nn.init, n, f)


def count_params(model):
    unique = {id(p): p for p in model.parameters()}
    return int(sum(p.numel() for p in unique.values()))


_TAKES_IMAGE_SIZE = {}


def takes_image_size(builder):
    """Whether the builder takes image_size= (ViT), by trying it."""
    if builder not in _TAKES_IMAGE_SIZE:
        kw = {"weights": None, "image_size": 224}
        if "weights_backbone" in inspect.signature(builder).parameters:
            kw["weights_backbone"] = None
        try:
            with SkipInit():
                builder(**kw)
            _TAKES_IMAGE_SIZE[builder] = True
        except TypeError:
            _TAKES_IMAGE_SIZE[builder] = False
    return _TAKES_IMAGE_SIZE[builder]


def build_tv(builder, num_classes, size=None, extra=None):
    """Builds with weights=None (and weights_backbone=None); passes
    image_size when the builder takes it, and the extra config."""
    kw = {"weights": None, "num_classes": num_classes}
    if "weights_backbone" in inspect.signature(builder).parameters:
        kw["weights_backbone"] = None  # segmentation: no download
    kw.update(extra or {})
    if size is not None and takes_image_size(builder):
        kw["image_size"] = size
    return builder(**kw)


def output_selector(scripted, model, x):
    """'' for a Tensor output, '@out' for a dict, '@0' for a tuple: read from
    the scripted forward's return type, else from one eager forward."""
    try:
        ret = str(scripted.forward.schema.returns[0].type)
        if ret.startswith("Dict"):
            return "@out"
        if ret.startswith("Tuple") or "Outputs" in ret or "NamedTuple" in ret:
            return "@0"
        if ret == "Tensor":
            return ""
    except Exception:
        pass
    with torch.no_grad():
        y = model(x)
    if isinstance(y, dict):
        return "@out"
    if isinstance(y, tuple):
        return "@0"
    return ""


def one_line(exc):
    lines = [l.strip() for l in str(exc).splitlines() if l.strip()]
    msg = lines[0] if lines else type(exc).__name__
    return f"{type(exc).__name__}: {msg}"[:300]


def smallest_input(builder, num_classes, batch):
    """CPU tier: the smallest size in CPU_SIZES whose eager train-mode
    forward works, trying the default config first, then each of
    CPU_FALLBACK_CONFIGS the builder takes. Returns (size, config) or
    (None, the last error)."""
    last = None
    for extra in [{}] + CPU_FALLBACK_CONFIGS:
        try:
            model = build_tv(builder, num_classes, CPU_SIZES[0], extra)
        except TypeError:  # the builder does not take this config
            continue
        per_size = takes_image_size(builder)
        for s in CPU_SIZES:
            m = build_tv(builder, num_classes, s, extra) if per_size else model
            m.train()
            try:
                with torch.no_grad():
                    m(torch.randn(batch, 3, s, s))
                return s, extra
            except Exception as e:  # too small for this architecture
                last = e
    return None, last


def torchvision_entries(tier, cpu_max_params_m, only):
    cpu = tier == "cpu"
    entries = []
    for kind, builders in (("classification", classification_builders()),
                           ("segmentation", segmentation_builders())):
        # Parameter count at the tier's class count, and each family's
        # smallest model (for the CPU size rule).
        if kind == "classification":
            nc = 10 if cpu else 1000
        else:
            nc = 10 if cpu else 21
        info = {}
        for name, builder in builders.items():
            if only and name not in only and not cpu:
                continue
            with SkipInit():
                model = build_tv(builder, nc)
            info[name] = (family_of(builder), count_params(model))
            del model
        smallest = {}
        for name, (fam, p) in sorted(info.items(), key=lambda kv: (kv[1][1], kv[0])):
            smallest.setdefault(fam, name)
        for name, (fam, params) in sorted(info.items()):
            if only and name not in only:
                continue
            e = dict(name=name, family=fam, source="torchvision." + kind,
                     params=params, num_classes=nc, batch=2 if cpu else 32)
            if cpu and params > cpu_max_params_m * 1e6 and smallest[fam] != name:
                e["excluded"] = (
                    f"cpu tier: excluded by size rule ({params / 1e6:.1f}M "
                    f"params > {cpu_max_params_m:g}M and not the smallest "
                    f"{fam} model), covered on GPU")
            e["_builder"] = builders[name]
            entries.append(e)
    return entries


def script_torchvision(e, tier):
    """Builds and scripts one torchvision model at the tier's input; None
    when the CPU size rule excludes it (no CPU input size works)."""
    builder = e.pop("_builder")
    cpu = tier == "cpu"
    nc, batch = e["num_classes"], e["batch"]
    seg = e["source"].endswith("segmentation")
    extra = {}
    if cpu:
        size, extra = smallest_input(builder, nc, batch)
        if size is None:
            e["excluded"] = (
                f"cpu tier: excluded by size rule (accepts no input <= "
                f"{CPU_SIZES[-1]} px: {one_line(extra)}), covered on GPU")
            return None
    else:
        size = 256 if seg else (299 if e["name"] == "inception_v3" else 224)
    model = build_tv(builder, nc, size if takes_image_size(builder) else None,
                     extra)
    model.train()
    if extra:
        e["config"] = ",".join(f"{k}={v}" for k, v in extra.items())
    e["image_size"] = size
    e["inputs"] = [f"x:float32[B,3,{size},{size}]"]
    scripted = torch.jit.script(model)
    sel = output_selector(scripted, model, torch.randn(batch, 3, size, size))
    if seg:
        e["loss"] = f"cross_entropy{sel}:y:int64[B,{size},{size}]{{0,{nc}}}"
    else:
        e["loss"] = f"cross_entropy{sel}:y:int64[B]{{0,{nc}}}"
    return scripted


_ENTRIES = []
_ARGS = None


def _script_entry(i):
    """Scripts entry i of _ENTRIES into _ARGS.out and prints one line;
    returns the entry (what scripting filled in: input size, inputs, loss,
    path or script_error, params) without its builders, which do not
    cross a process boundary."""
    e, args = _ENTRIES[i], _ARGS
    path, error, params = _script_one(e, args)
    out = {k: v for k, v in e.items() if k not in ("build", "_builder")}
    out.update(path=path, script_error=error)
    if params is not None:
        out["params"] = params
    return out


def _script_one(e, args):
    t = time.time()
    if e.get("excluded"):
        print(f"{e['name']}: {e['excluded']}", file=sys.stderr, flush=True)
        return None, None, None
    if args.jobs > 1:
        torch.set_num_threads(1)
    # Weights from a seed of the model's own, whichever process scripts it.
    torch.manual_seed(zlib.crc32(e["name"].encode()))
    params, path, error = None, None, None
    try:
        if e["source"] == "repo":
            model = e["build"]()
            model.train()
            params = count_params(model)
            scripted = torch.jit.script(model)
        else:
            scripted = script_torchvision(e, args.tier)
            if scripted is None:
                print(f"{e['name']}: {e['excluded']}", file=sys.stderr, flush=True)
                return None, None, None
        path = os.path.abspath(os.path.join(args.out, e["name"] + ".pt"))
        scripted.save(path)
    except Exception as ex:  # recorded, never dropped
        path, error = None, one_line(ex)
    shown = params if params is not None else e.get("params", 0)
    print(f"{e['name']}: {e['family']} {shown / 1e6:.2f}M "
          f"{'scripted' if path else 'NOT scripted: ' + error}"
          f" ({time.time() - t:.1f}s)", file=sys.stderr, flush=True)
    return path, error, params


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="",
                    help="comma-separated names (default: the whole suite)")
    ap.add_argument("--batch", type=int, default=0,
                    help="batch size of every model (default: 2 on cpu, 32 on gpu)")
    ap.add_argument("--cpu-max-params-m", type=float,
                    default=DEFAULT_CPU_MAX_PARAMS_M,
                    help="CPU size rule: parameter bound in millions")
    ap.add_argument("--jobs", type=int, default=1,
                    help="models scripted at once (processes)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    only = set(filter(None, args.models.split(",")))
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    t0 = time.time()
    entries = torchvision_entries(args.tier, args.cpu_max_params_m, only)
    for spec in repo_models(args.tier):
        if only and spec["name"] not in only:
            continue
        entries.append(dict(spec, source="repo"))
    if args.batch:
        for e in entries:
            e["batch"] = args.batch
    global _ENTRIES, _ARGS
    _ENTRIES, _ARGS = entries, args
    if args.jobs > 1:
        # Scripting is Python-bound and per model: children forked with
        # the entries (builders are not picklable) script one model each.
        import multiprocessing
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            done = pool.map(_script_entry, range(len(entries)), chunksize=1)
    else:
        done = [_script_entry(i) for i in range(len(entries))]
    entries = done
    manifest = {
        "tier": args.tier,
        "command": " ".join(["bench/zoo/models.py"] + sys.argv[1:]),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "sdpa": HAS_SDPA,
        "size_rule": (f"cpu tier: a torchvision model is included when it has "
                      f"at most {args.cpu_max_params_m:g}M parameters (at 10 "
                      f"classes) or is the smallest model of its family, and "
                      f"accepts an input of at most {CPU_SIZES[-1]} px (default "
                      f"config, else " + " or ".join(
                          ",".join(f"{k}={v}" for k, v in c.items())
                          for c in CPU_FALLBACK_CONFIGS) + "); the others are "
                      "excluded by size rule, covered on GPU")
                     if args.tier == "cpu" else None,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "models": entries,
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    n_ok = sum(1 for e in entries if e["path"])
    print(f"manifest: {len(entries)} models, {n_ok} scripted, "
          f"{sum(1 for e in entries if e.get('excluded'))} excluded by size, "
          f"{sum(1 for e in entries if e['script_error'])} scripting errors "
          f"({time.time() - t0:.0f}s)", file=sys.stderr)


if __name__ == "__main__":
    main()
