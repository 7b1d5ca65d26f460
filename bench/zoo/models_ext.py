#!/usr/bin/env python3
"""The zoo's models from other libraries: timm and Hugging Face
`transformers`, made as users make them, into a manifest run_zoo.py runs.

    models_ext.py --out DIR [--models a,b] [--timm families|all] [--jobs N]

timm models are scripted (`timm.create_model(name, scriptable=True)`), and
traced when scripting fails. transformers models cannot be scripted: they
are traced on the CPU (`config.torchscript = True`, wrapped to return the
logits) at the batch and sequence length they are profiled at, as users
trace them, so the file carries the CPU device its trace met and the worker
retargets it (worker/device_constants.h). Every model is initialised from a
seed (no weights are downloaded: the GPU machine reaches no network).

Writes DIR/<name>.pt and DIR/manifest.json in models.py's format: a model
that neither scripts nor traces is listed with both errors (`script_error`),
never dropped. Neither library is in Debian, so this tier runs where they
are installed (the lent GPU machines: docs/gpu.md).
"""
import argparse
import json
import multiprocessing
import os
import sys
import time
import traceback
import warnings

import torch
import torch.nn as nn

# timm models at their default config, 224 px (eva02's patch 14 at 224),
# batch 32, 1000 classes. `--timm families` takes one model of every timm
# family instead (family_pick), `--timm all` every name timm.list_models()
# gives (hours on one card).
TIMM_MODELS = [
    "vit_small_patch16_224", "deit_small_patch16_224",
    "eva02_small_patch14_224", "convnext_small", "swin_tiny_patch4_window7_224",
    "efficientnet_b0", "resnet50d", "regnety_016",
]
TIMM_BATCH = 32

# transformers families at realistic sizes: (name, batch, sequence length).
HF_MODELS = [("hf_gpt2", 8, 512), ("hf_bert_mlm", 8, 512),
             ("hf_llama", 8, 512), ("hf_t5_small", 8, 256)]


# Torch threads per model being made (--jobs of them at once).
THREADS_PER_JOB = 2


def one_line(exc):
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:400] if text else type(exc).__name__


class Logits(nn.Module):
    """A causal or masked LM as users wrap it for tracing: logits only."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False,
                          return_dict=False)[0]


class Seq2SeqLogits(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, decoder_input_ids):
        return self.model(input_ids=input_ids,
                          decoder_input_ids=decoder_input_ids,
                          use_cache=False, return_dict=False)[0]


def hf_model(name):
    """(wrapped model, vocabulary, two inputs?) of a transformers family."""
    import transformers as tf
    if name == "hf_gpt2":
        cfg = tf.GPT2Config(n_layer=12, n_embd=768, n_head=12,
                            n_positions=1024, vocab_size=50257)
        cfg.torchscript = True
        return Logits(tf.GPT2LMHeadModel(cfg)), cfg.vocab_size, False
    if name == "hf_bert_mlm":
        cfg = tf.BertConfig()  # bert-base: 12 layers, 768, 512 positions
        cfg.torchscript = True
        return Logits(tf.BertForMaskedLM(cfg)), cfg.vocab_size, False
    if name == "hf_llama":
        cfg = tf.LlamaConfig(hidden_size=1024, intermediate_size=2816,
                             num_hidden_layers=8, num_attention_heads=16,
                             num_key_value_heads=16, vocab_size=32000,
                             max_position_embeddings=1024)
        cfg.torchscript = True
        return Logits(tf.LlamaForCausalLM(cfg)), cfg.vocab_size, False
    if name == "hf_t5_small":
        cfg = tf.T5Config()  # t5-small: 6+6 layers, 512
        cfg.torchscript = True
        return (Seq2SeqLogits(tf.T5ForConditionalGeneration(cfg)),
                cfg.vocab_size, True)
    raise ValueError(name)


def make_hf(name, batch, t, out):
    e = {"name": name, "family": "transformers", "source": "transformers",
         "batch": batch, "path": None, "script_error": None}
    try:
        model, vocab, two = hf_model(name)
    except Exception as exc:  # the library's version lacks the family
        e["script_error"] = f"build: {one_line(exc)}"
        return e
    model.train()
    e["params"] = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, vocab, (batch, t))
    args = (ids, torch.randint(0, vocab, (batch, t))) if two else (ids,)
    e["inputs"] = [f"input_ids:int64[B,{t}]{{0,{vocab}}}"]
    if two:
        e["inputs"].append(f"decoder_input_ids:int64[B,{t}]{{0,{vocab}}}")
    e["loss"] = f"cross_entropy:y:int64[B,{t}]{{0,{vocab}}}"
    e["made_by"] = "torch.jit.trace (CPU)"
    errors = []
    try:
        traced = torch.jit.trace(model, args, check_trace=False)
    except Exception as exc:
        errors.append(f"trace: {one_line(exc)}")
        traced = None
    if traced is None:
        e["script_error"] = "; ".join(errors)
        return e
    path = os.path.join(out, name + ".pt")
    traced.save(path)
    e["path"] = path
    return e


# Words in a timm name, smallest first: how a family's smallest member is
# recognised without building all of them (family_pick).
SIZE_WORDS = ["atto", "femto", "pico", "nano", "tiny", "xxs", "xs", "mini",
              "small", "lite", "s", "b0", "18", "base", "b"]


def size_rank(name):
    """(rank of the smallest size word in `name`, its length, name): the
    smaller, the more likely the family's smallest member."""
    words = set(name.replace("-", "_").split("_"))
    ranks = [i for i, w in enumerate(SIZE_WORDS)
             if w in words or any(x.startswith(w) and x[len(w):].isdigit()
                                  for x in words)]
    return (min(ranks) if ranks else len(SIZE_WORDS), len(name), name)


def family_pick(timm):
    """{architecture name: family}, one name per timm family (a module of
    timm.models, as timm.list_modules() names them): the one size_rank puts
    first."""
    picks = {}
    for module in timm.list_modules():
        names = timm.list_models(module=module)
        if names:
            picks[min(names, key=size_rank)] = module
    return dict(sorted(picks.items()))


def make_timm(name, out, family="timm"):
    import timm
    e = {"name": name, "family": family, "source": "timm",
         "batch": TIMM_BATCH, "path": None, "script_error": None}
    errors = []
    try:
        model = timm.create_model(name, pretrained=False, scriptable=True)
    except Exception as exc:
        e["script_error"] = f"create_model: {one_line(exc)}"
        return e
    model.train()
    e["params"] = sum(p.numel() for p in model.parameters())
    size = model.default_cfg.get("input_size", (3, 224, 224))[-1]
    # The classes the output has (a model pretrained as a feature extractor,
    # eva02's MIM config, has num_classes 0 and returns its features).
    with torch.no_grad():
        logits = model(torch.randn(2, 3, size, size))
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    nc = int(logits.shape[-1])
    e["image_size"] = size
    e["inputs"] = [f"x:float32[B,3,{size},{size}]"]
    e["loss"] = f"cross_entropy:y:int64[B]{{0,{nc}}}"
    saved = None
    try:
        saved = torch.jit.script(model)
        e["made_by"] = "torch.jit.script"
    except Exception as exc:
        errors.append(f"script: {one_line(exc)}")
        try:
            saved = torch.jit.trace(model, torch.randn(2, 3, size, size),
                                    check_trace=False)
            e["made_by"] = "torch.jit.trace (CPU)"
        except Exception as exc2:
            errors.append(f"trace: {one_line(exc2)}")
    if saved is None:
        e["script_error"] = "; ".join(errors)
        return e
    if errors:
        e["script_note"] = "; ".join(errors)
    path = os.path.join(out, name + ".pt")
    saved.save(path)
    e["path"] = path
    return e


def timm_entry(job):
    """make_timm's entry for (name, out, family), or the model listed with its
    error: a model that fails is never dropped."""
    name, out, family = job
    torch.manual_seed(0)
    t = time.time()
    try:
        e = make_timm(name, out, family)
    except Exception as exc:
        e = {"name": name, "family": family, "source": "timm",
             "path": None, "script_error": one_line(exc)}
    print(f"{name}: {e.get('made_by') or e['script_error']} "
          f"({time.time() - t:.0f}s)", file=sys.stderr, flush=True)
    return e


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="",
                    help="comma-separated names (default: all of the tier)")
    ap.add_argument("--timm", default="", choices=["", "families", "all"],
                    help="'families': one model per timm family; 'all': "
                    "every timm.list_models() name")
    ap.add_argument("--jobs", type=int, default=1,
                    help="timm models scripted at once (processes)")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: at least 1")
    warnings.filterwarnings("ignore")
    os.makedirs(args.out, exist_ok=True)
    only = set(filter(None, args.models.split(",")))
    t0 = time.time()
    timm_names = {n: "timm" for n in TIMM_MODELS}
    versions = {"torch": torch.__version__}
    try:
        import timm
        versions["timm"] = timm.__version__
        if args.timm == "all":
            timm_names = {n: "timm" for n in timm.list_models()}
        elif args.timm == "families":
            timm_names = family_pick(timm)
    except ImportError as exc:
        versions["timm"] = f"not installed: {exc}"
        timm_names = {}
    try:
        import transformers
        versions["transformers"] = transformers.__version__
        hf = HF_MODELS
    except ImportError as exc:
        versions["transformers"] = f"not installed: {exc}"
        hf = []
    entries = []
    todo = [(n, args.out, f) for n, f in timm_names.items()
            if not only or n in only]
    if args.jobs > 1 and len(todo) > 1:
        # fork: the children inherit the imports; each makes one model at a
        # time with THREADS_PER_JOB threads (one process alone keeps all).
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(args.jobs, initializer=torch.set_num_threads,
                      initargs=(THREADS_PER_JOB,),
                      maxtasksperchild=4) as pool:
            entries = pool.map(timm_entry, todo, chunksize=1)
    else:
        entries = [timm_entry(job) for job in todo]
    for name, batch, seq in hf:
        if only and name not in only:
            continue
        torch.manual_seed(0)
        t = time.time()
        try:
            e = make_hf(name, batch, seq, args.out)
        except Exception as exc:
            traceback.print_exc()
            e = {"name": name, "family": "transformers",
                 "source": "transformers", "path": None,
                 "script_error": one_line(exc)}
        print(f"{name}: {e.get('made_by') or e['script_error']} "
              f"({time.time() - t:.0f}s)", file=sys.stderr, flush=True)
        entries.append(e)
    manifest = dict(versions, tier="ext",
                    command=" ".join(["bench/zoo/models_ext.py"] + sys.argv[1:]),
                    created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    models=entries)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    n_ok = sum(1 for e in entries if e["path"])
    print(f"manifest: {len(entries)} models, {n_ok} scripted or traced, "
          f"{len(entries) - n_ok} errors ({time.time() - t0:.0f}s)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
