#!/usr/bin/python3
"""A traced T5-like model through `mutwo-worker profile`, `mutwo plan` and
`mutwo-worker execute` on the CPU, planned at its floor with recomputation
only: every layer norm returns a tuple (Hugging Face's traced T5 does) and
adds the same traced tensor constant (1e-6); the causal mask and the first
decoder layer replay as one segment. Its execute once never ended: the
segment returned the constant, autograd gave the graph's constant the
segment's history, and the replay's backward (which reads the same
constant) ran the segment's own node again inside its backward and waited
on its lock. Each command runs under a timeout; the step must finish with
the plain step's gradients.

    MUTWO_BIN=BUILD/bin /usr/bin/python3 -m pytest -q traced_t5_test.py
"""
import json
import os
import subprocess

import torch
import torch.nn as nn
import torch.nn.functional as F

BIN = os.environ.get("MUTWO_BIN", "build/bin")
SPECS = ["--input", "input_ids:int64[B,16]{0,128}",
         "--input", "decoder_input_ids:int64[B,16]{0,128}", "--batch", "4"]


class Rms(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))

    def forward(self, x):
        h = x.to(torch.float32)
        v = h.pow(2).mean(-1, keepdim=True)
        return h, self.w * (h * torch.rsqrt(v + 1e-6))


class Attn(nn.Module):
    def __init__(self, d, heads, relative):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.rel = nn.Embedding(16, heads) if relative else None

    def forward(self, x, kv, pb, mask):
        b, t, _ = x.shape
        tk = kv.shape[1]
        q = self.q(x).view(b, t, self.heads, -1).transpose(1, 2)
        k = self.k(kv).view(b, tk, self.heads, -1).transpose(1, 2)
        v = self.v(kv).view(b, tk, self.heads, -1).transpose(1, 2)
        scores = q @ k.transpose(3, 2)
        if pb is None:
            if self.rel is not None:
                ctx = torch.arange(t, dtype=torch.long)[:, None]
                mem = torch.arange(tk, dtype=torch.long)[None, :]
                rp = (mem - ctx).abs().clamp(max=15)
                pb = self.rel(rp).permute(2, 0, 1).unsqueeze(0)
            else:
                pb = torch.zeros((1, self.heads, t, tk), dtype=x.dtype)
            if mask is not None:
                pb = pb + mask
        w = F.dropout((scores + pb).float().softmax(-1), 0.1, self.training)
        a = (w @ v).transpose(1, 2).contiguous().view(b, t, -1)
        return self.o(a), pb


class Block(nn.Module):
    def __init__(self, d, heads, first, decoder):
        super().__init__()
        self.decoder = decoder
        self.ln1 = Rms(d)
        self.sa = Attn(d, heads, first)
        if decoder:
            self.ln2 = Rms(d)
            self.ca = Attn(d, heads, False)
        self.ln3 = Rms(d)
        self.wi = nn.Linear(d, 4 * d, bias=False)
        self.wo = nn.Linear(4 * d, d, bias=False)

    def forward(self, x, pb, enc, epb, mask):
        x, n1 = self.ln1(x)
        a, pb = self.sa(n1, n1, pb, mask)
        x = x + F.dropout(a, 0.1, self.training)
        if self.decoder:
            x, n2 = self.ln2(x)
            c, epb = self.ca(n2, enc, epb, None)
            x = x + F.dropout(c, 0.1, self.training)
        x, n3 = self.ln3(x)
        f = self.wo(F.dropout(F.relu(self.wi(n3)), 0.1, self.training))
        return x + F.dropout(f, 0.1, self.training), pb, epb


class T5Like(nn.Module):
    def __init__(self, vocab=128, d=32, heads=2, layers=2):
        super().__init__()
        self.shared = nn.Embedding(vocab, d)
        self.enc = nn.ModuleList(
            [Block(d, heads, i == 0, False) for i in range(layers)])
        self.dec = nn.ModuleList(
            [Block(d, heads, i == 0, True) for i in range(layers)])
        self.lne = Rms(d)
        self.lnd = Rms(d)
        self.lm = nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids, decoder_input_ids):
        x = F.dropout(self.shared(input_ids), 0.1, self.training)
        pb = None
        for blk in self.enc:
            x, pb, _ = blk(x, pb, x, None, None)
        enc = F.dropout(self.lne(x)[1], 0.1, self.training)
        y = F.dropout(self.shared(decoder_input_ids), 0.1, self.training)
        t = decoder_input_ids.shape[1]
        causal = torch.tril(torch.ones(t, t))
        mask = (1.0 - causal[None, None]) * torch.finfo(y.dtype).min
        pb = None
        epb = None
        for blk in self.dec:
            y, pb, epb = blk(y, pb, enc, epb, mask)
        return self.lm(F.dropout(self.lnd(y)[1], 0.1, self.training))


def run(*args, timeout=120):
    try:
        return subprocess.run([str(a) for a in args], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{args[1]} did not end within {timeout} s")


def test_traced_t5_like_model_executes_at_its_recompute_floor(tmp_path):
    torch.manual_seed(0)
    model = T5Like().train()
    ids = torch.randint(0, 128, (4, 16))
    path = tmp_path / "t5_like.pt"
    torch.jit.trace(model, (ids, ids), check_trace=False).save(str(path))
    worker, cli = os.path.join(BIN, "mutwo-worker"), os.path.join(BIN, "mutwo")
    p = run(worker, "profile", path, *SPECS, "--warmup", "1",
            "--iterations", "1", "--output", "json")
    assert p.returncode == 0, p.stderr
    (tmp_path / "p.json").write_text(p.stdout)
    p = run(cli, "plan", tmp_path / "p.json", "--budget", "floor",
            "--swap=false", "--output", "json")
    assert p.returncode == 0, p.stderr
    schedule = json.loads(p.stdout)
    actions = {d["action"] for d in schedule["decisions"]}
    assert "RECOMPUTE" in actions and "SWAP" not in actions, actions
    (tmp_path / "s.json").write_text(p.stdout)
    p = run(worker, "execute", path, "--schedule", tmp_path / "s.json",
            *SPECS, "--output", "json")
    assert p.returncode == 0, p.stderr
    v = json.loads(p.stdout)
    assert v["gradients_match"], v.get("max_abs_grad_diff")
    assert int(v["scheduled"]["peak_bytes"]) < \
        int(v["baseline"]["peak_bytes"])
