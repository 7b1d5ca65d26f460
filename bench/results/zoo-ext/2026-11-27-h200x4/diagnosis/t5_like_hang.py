import math, sys, torch, torch.nn as nn, torch.nn.functional as F

class RMS(nn.Module):
    def __init__(s, d): super().__init__(); s.w = nn.Parameter(torch.ones(d))
    def forward(s, x):
        h = x.to(torch.float32)
        v = h.pow(2).mean(-1, keepdim=True)
        return h, s.w * (h * torch.rsqrt(v + 1e-6))

class Attn(nn.Module):
    def __init__(s, d, h, bias, causal):
        super().__init__(); s.h=h; s.d=d
        s.q=nn.Linear(d,d,bias=False); s.k=nn.Linear(d,d,bias=False); s.v=nn.Linear(d,d,bias=False); s.o=nn.Linear(d,d,bias=False)
        s.causal=causal
        s.rel = nn.Embedding(32, h) if bias else None
    def bias(s, q_len, k_len, device):
        ctx = torch.arange(q_len, dtype=torch.long, device=device)[:, None]
        mem = torch.arange(k_len, dtype=torch.long, device=device)[None, :]
        rp = (mem - ctx).abs().clamp(max=31)
        return s.rel(rp).permute(2, 0, 1).unsqueeze(0)
    def forward(s, x, kv, pb, mask):
        b, t, _ = x.shape; tk = kv.shape[1]
        q = s.q(x).view(b, t, s.h, -1).transpose(1, 2)
        k = s.k(kv).view(b, tk, s.h, -1).transpose(1, 2)
        v = s.v(kv).view(b, tk, s.h, -1).transpose(1, 2)
        sc = q @ k.transpose(3, 2)
        if pb is None:
            if s.rel is not None: pb = s.bias(t, tk, x.device)
            else: pb = torch.zeros((1, s.h, t, tk), device=x.device, dtype=x.dtype)
            if mask is not None: pb = pb + mask
        sc = sc + pb
        w = F.dropout(sc.float().softmax(-1).type_as(sc), 0.1, s.training)
        a = (w @ v).transpose(1, 2).contiguous().view(b, t, -1)
        return s.o(a), pb

class Block(nn.Module):
    def __init__(s, d, h, first, dec):
        super().__init__()
        s.ln1=RMS(d); s.sa=Attn(d,h,first,dec); s.dec=dec
        if dec: s.ln2=RMS(d); s.ca=Attn(d,h,False,False)
        s.ln3=RMS(d); s.wi=nn.Linear(d,4*d,bias=False); s.wo=nn.Linear(4*d,d,bias=False)
    def forward(s, x, pb, enc, epb, mask):
        x, n1 = s.ln1(x)
        a, pb = s.sa(n1, n1, pb, mask)
        x = x + F.dropout(a, 0.1, s.training)
        if s.dec:
            x, n2 = s.ln2(x)
            c, epb = s.ca(n2, enc, epb, None)
            x = x + F.dropout(c, 0.1, s.training)
        x, n3 = s.ln3(x)
        f = s.wo(F.dropout(F.relu(s.wi(n3)), 0.1, s.training))
        return x + F.dropout(f, 0.1, s.training), pb, epb

class T5Like(nn.Module):
    def __init__(s, vocab=512, d=64, h=4, layers=3):
        super().__init__()
        s.shared = nn.Embedding(vocab, d)
        s.enc = nn.ModuleList([Block(d,h,i==0,False) for i in range(layers)])
        s.dec = nn.ModuleList([Block(d,h,i==0,True) for i in range(layers)])
        s.lne = RMS(d); s.lnd = RMS(d)
        s.lm = nn.Linear(d, vocab, bias=False)
    def forward(s, input_ids, decoder_input_ids):
        x = F.dropout(s.shared(input_ids), 0.1, s.training)
        pb = None
        for blk in s.enc: x, pb, _ = blk(x, pb, x, None, None)
        enc = F.dropout(s.lne(x)[1], 0.1, s.training)
        y = F.dropout(s.shared(decoder_input_ids), 0.1, s.training)
        t = decoder_input_ids.shape[1]
        causal = torch.tril(torch.ones(t, t, device=y.device))
        mask = (1.0 - causal[None, None]) * torch.finfo(y.dtype).min
        pb = None; epb = None
        for blk in s.dec: y, pb, epb = blk(y, pb, enc, epb, mask)
        y = F.dropout(s.lnd(y)[1], 0.1, s.training) * (s.lm.in_features ** -0.5)
        return s.lm(y)

m = T5Like().train()
a = torch.randint(0, 512, (4, 32)); b = torch.randint(0, 512, (4, 32))
torch.jit.trace(m, (a, b), check_trace=False).save(sys.argv[1])
